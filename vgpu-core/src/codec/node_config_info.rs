//! `node-config-info`: the node vGPU config JSON the device plugin writes on its Node.
//!
//! Wire form: `{"deviceSplit":10,"coresScaling":1,"memoryFactor":1,"memoryScaling":1}` (Go field order; floats
//! in Go's shortest form, so `1` not `1.0`).
//!
//! Decoding reads what upstream's `NodeConfigInfo.Decode` (`json.Unmarshal`) reads:
//!
//! * keys in any letter case (`DeviceSplit`, `MEMORYFACTOR`; an exact match wins), duplicate keys (the
//!   last wins), unknown fields ignored;
//! * a missing field, or a `null` one, is Go's zero value: `{}` and `null` decode as all zeros. The
//!   scheduler's node stage then refuses the node the way upstream's filter does (`deviceSplit` 0,
//!   `memoryFactor` 0), so those are not decode errors;
//! * `deviceSplit` and `memoryFactor` are integers (`10.0` is an error, as in Go); a negative one or one
//!   over 32 bits is refused here (Go would accept it and misbehave later);
//! * the scalings are any JSON number.

use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, Visitor};

use super::goread::{FieldKey, GoInt, set};
use super::{CodecError, NODE_CONFIG_INFO, gojson};
use crate::model::NodeVgpuConfig;

const ANNOTATION: &str = NODE_CONFIG_INFO;

/// The Go struct `NodeConfigInfo`, with Go's zero values for what is absent.
#[derive(Debug, Default)]
struct WireConfig {
    device_split: i64,
    cores_scaling: f64,
    memory_factor: i64,
    memory_scaling: f64,
}

/// Field names on the wire, in [`WireConfig`] order.
const FIELDS: &[&str] = &["deviceSplit", "coresScaling", "memoryFactor", "memoryScaling"];

impl<'de> Deserialize<'de> for WireConfig {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_option(ConfigVisitor)
    }
}

struct ConfigVisitor;

impl<'de> Visitor<'de> for ConfigVisitor {
    type Value = WireConfig;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a node config object")
    }

    /// Top-level `null`: Go leaves the struct at its zero value.
    fn visit_none<E: de::Error>(self) -> Result<WireConfig, E> {
        Ok(WireConfig::default())
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<WireConfig, D::Error> {
        deserializer.deserialize_map(self)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<WireConfig, A::Error> {
        let mut w = WireConfig::default();
        while let Some(field) = map.next_key_seed(FieldKey(FIELDS))? {
            match field {
                Some(0) => set(&mut w.device_split, map.next_value::<Option<GoInt>>()?.map(|v| v.0)),
                Some(1) => set(&mut w.cores_scaling, map.next_value()?),
                Some(2) => set(&mut w.memory_factor, map.next_value::<Option<GoInt>>()?.map(|v| v.0)),
                Some(3) => set(&mut w.memory_scaling, map.next_value()?),
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(w)
    }
}

fn field_err(field: &'static str, expected: &'static str, got: String) -> CodecError {
    CodecError::Field { annotation: ANNOTATION, location: "node config".to_owned(), field, expected, got }
}

/// Decodes a `node-config-info` value.
pub fn decode(value: &str) -> Result<NodeVgpuConfig, CodecError> {
    let w: WireConfig = serde_json::from_str(value).map_err(|source| CodecError::Json {
        annotation: ANNOTATION,
        expected: "a JSON object {deviceSplit,coresScaling,memoryFactor,memoryScaling} (integers, numbers)",
        source,
    })?;
    let device_split = u32::try_from(w.device_split)
        .map_err(|_| field_err("deviceSplit", "a non-negative 32-bit integer", w.device_split.to_string()))?;
    let memory_factor = u32::try_from(w.memory_factor).map_err(|_| {
        field_err("memoryFactor", "a non-negative 32-bit integer", w.memory_factor.to_string())
    })?;
    Ok(NodeVgpuConfig {
        device_split,
        cores_scaling: w.cores_scaling,
        memory_scaling: w.memory_scaling,
        memory_factor,
    })
}

/// Encodes a node config exactly as Go's `json.Marshal` would; fails on a non-finite scaling factor.
pub fn encode(config: &NodeVgpuConfig) -> Result<String, CodecError> {
    let float = |field: &'static str, v: f64| {
        gojson::format_f64(v).ok_or_else(|| CodecError::Unencodable {
            annotation: ANNOTATION,
            location: "node config".to_owned(),
            field,
            problem: format!("is {v}, not a finite number"),
        })
    };
    let cores = float("coresScaling", config.cores_scaling)?;
    let memory = float("memoryScaling", config.memory_scaling)?;
    Ok(format!(
        "{{\"deviceSplit\":{},\"coresScaling\":{cores},\"memoryFactor\":{},\"memoryScaling\":{memory}}}",
        config.device_split, config.memory_factor
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const EXAMPLE: &str = r#"{"deviceSplit":10,"coresScaling":1,"memoryFactor":1,"memoryScaling":1}"#;

    #[test]
    fn contract_example() {
        let c = decode(EXAMPLE).unwrap();
        assert_eq!(c, NodeVgpuConfig::default());
        assert_eq!(c.device_split, 10);
        assert_eq!(c.cores_scaling, 1.0);
        assert_eq!(c.memory_factor, 1);
        assert_eq!(c.memory_scaling, 1.0);
        assert_eq!(encode(&c).unwrap(), EXAMPLE);
    }

    #[test]
    fn pinned_forms() {
        let c =
            NodeVgpuConfig { device_split: 4, cores_scaling: 1.5, memory_scaling: 2.0, memory_factor: 1024 };
        assert_eq!(
            encode(&c).unwrap(),
            r#"{"deviceSplit":4,"coresScaling":1.5,"memoryFactor":1024,"memoryScaling":2}"#
        );
        let c = decode(r#"{"memoryScaling":0.5,"memoryFactor":2,"coresScaling":1.0,"deviceSplit":3,"x":1}"#)
            .unwrap();
        assert_eq!(
            encode(&c).unwrap(),
            r#"{"deviceSplit":3,"coresScaling":1,"memoryFactor":2,"memoryScaling":0.5}"#
        );
    }

    #[test]
    fn errors() {
        let e =
            decode(r#"{"deviceSplit":-1,"coresScaling":1,"memoryFactor":1,"memoryScaling":1}"#).unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid node-config-info value: node config: field \"deviceSplit\" is -1, expected a non-negative 32-bit integer"
        );
        let e = decode(r#"{"memoryFactor":1,"MemoryFactor":-3}"#).unwrap_err().to_string();
        assert!(e.contains("field \"memoryFactor\" is -3"), "{e}");
        for bad in [
            r#"{"deviceSplit":10.0}"#,
            r#"{"deviceSplit":1e1}"#,
            r#"{"deviceSplit":"10"}"#,
            r#"{"coresScaling":"1"}"#,
            r#"{"memoryFactor":true}"#,
            r#"{"deviceSplit":99999999999999999999}"#,
            "[]",
            "1",
            "",
            "{",
        ] {
            let e = decode(bad).unwrap_err().to_string();
            assert!(e.starts_with("invalid node-config-info value: expected a JSON object"), "{bad}: {e}");
        }
        let c = NodeVgpuConfig { cores_scaling: f64::NAN, ..Default::default() };
        assert!(encode(&c).unwrap_err().to_string().contains("coresScaling"));
    }

    /// What Go's `json.Unmarshal` accepts and means unambiguously decodes the same here.
    #[test]
    fn go_leniency() {
        let all = |s: &str| {
            let c = decode(s).unwrap();
            (c.device_split, c.cores_scaling, c.memory_factor, c.memory_scaling)
        };
        // Keys in any case, exact match preferred only in the sense that the last occurrence wins.
        assert_eq!(
            all(r#"{"DEVICESPLIT":4,"coresscaling":1.5,"MemoryFactor":2,"memoryScaling":2}"#),
            (4, 1.5, 2, 2.0)
        );
        assert_eq!(all(r#"{"DeviceSplit":1,"deviceSplit":2}"#).0, 2);
        assert_eq!(all(r#"{"deviceSplit":2,"DeviceSplit":1}"#).0, 1);
        assert_eq!(all("{\"device\u{17f}plit\":7}").0, 7);
        assert_eq!(all(r#"{"device\u0053plit":7}"#).0, 7);
        // Duplicates: the last wins; null keeps the earlier value.
        assert_eq!(all(r#"{"deviceSplit":1,"deviceSplit":3,"deviceSplit":null}"#).0, 3);
        // Missing fields, `{}` and `null`: Go's zero values (the node stage refuses such a node later).
        assert_eq!(all("{}"), (0, 0.0, 0, 0.0));
        assert_eq!(all(" null "), (0, 0.0, 0, 0.0));
        assert_eq!(all(r#"{"deviceSplit":10}"#), (10, 0.0, 0, 0.0));
        // Go reads `-0` into an int as 0.
        assert_eq!(all(r#"{"deviceSplit":-0,"memoryFactor":1}"#), (0, 0.0, 1, 0.0));
        // Unknown fields of any shape are skipped.
        assert_eq!(all(r#"{"x":[{"deviceSplit":9}],"deviceSplit":5,"y":null}"#).0, 5);
    }

    proptest! {
        #[test]
        fn never_panics(s in ".*") {
            let _ = decode(&s);
        }

        #[test]
        fn round_trip(split in any::<u32>(), factor in any::<u32>(),
                      cores in proptest::num::f64::NORMAL | proptest::num::f64::ZERO | proptest::num::f64::SUBNORMAL,
                      memory in proptest::num::f64::NORMAL | proptest::num::f64::ZERO) {
            let c = NodeVgpuConfig { device_split: split, cores_scaling: cores, memory_scaling: memory, memory_factor: factor };
            let text = encode(&c).unwrap();
            let back = decode(&text).unwrap();
            prop_assert_eq!(back.device_split, split);
            prop_assert_eq!(back.memory_factor, factor);
            prop_assert_eq!(back.cores_scaling.to_bits(), cores.to_bits());
            prop_assert_eq!(back.memory_scaling.to_bits(), memory.to_bits());
            prop_assert_eq!(encode(&back).unwrap(), text);
        }

        /// Re-cased keys, shuffled members, duplicates (the last wins), `null` duplicates and unknown members
        /// decode to the same config.
        #[test]
        fn go_equivalent_forms_decode_the_same(
            (c, text) in (any::<u32>(), any::<u32>(), -1e6f64..1e6, 0f64..100.0).prop_flat_map(|(split, factor, cores, memory)| {
                let c = NodeVgpuConfig { device_split: split, cores_scaling: cores, memory_scaling: memory, memory_factor: factor };
                let members = [
                    ("deviceSplit", split.to_string(), "77", true),
                    ("coresScaling", gojson::format_f64(cores).unwrap_or_default(), "-0.5", true),
                    ("memoryFactor", factor.to_string(), "-1", true),
                    ("memoryScaling", gojson::format_f64(memory).unwrap_or_default(), "1e300", true),
                ];
                (Just(c), crate::codec::goread::testing::go_equivalent_object(&members))
            })
        ) {
            let back = decode(&text).unwrap();
            prop_assert_eq!(back.device_split, c.device_split, "{}", text);
            prop_assert_eq!(back.memory_factor, c.memory_factor);
            prop_assert_eq!(back.cores_scaling.to_bits(), c.cores_scaling.to_bits());
            prop_assert_eq!(back.memory_scaling.to_bits(), c.memory_scaling.to_bits());
        }
    }
}
