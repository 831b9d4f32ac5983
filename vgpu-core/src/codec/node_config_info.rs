//! `node-config-info`: the node vGPU config JSON the device plugin writes on its Node.
//!
//! Wire form: `{"deviceSplit":10,"coresScaling":1,"memoryFactor":1,"memoryScaling":1}` (Go field order; floats
//! in Go's shortest form, so `1` not `1.0`). Every field is required; unknown fields are ignored.

use serde::Deserialize;

use super::{CodecError, NODE_CONFIG_INFO, gojson};
use crate::model::NodeVgpuConfig;

const ANNOTATION: &str = NODE_CONFIG_INFO;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct WireConfig {
    device_split: i64,
    cores_scaling: f64,
    memory_factor: i64,
    memory_scaling: f64,
}

fn field_err(field: &'static str, expected: &'static str, got: String) -> CodecError {
    CodecError::Field { annotation: ANNOTATION, location: "node config".to_owned(), field, expected, got }
}

/// Decodes a `node-config-info` value.
pub fn decode(value: &str) -> Result<NodeVgpuConfig, CodecError> {
    let w: WireConfig = serde_json::from_str(value).map_err(|source| CodecError::Json {
        annotation: ANNOTATION,
        expected: "a JSON object {deviceSplit,coresScaling,memoryFactor,memoryScaling}",
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
        let e = decode(r#"{"deviceSplit":10}"#).unwrap_err().to_string();
        assert!(e.starts_with("invalid node-config-info value: expected a JSON object"), "{e}");
        assert!(e.contains("missing field `coresScaling`"), "{e}");
        let c = NodeVgpuConfig { cores_scaling: f64::NAN, ..Default::default() };
        assert!(encode(&c).unwrap_err().to_string().contains("coresScaling"));
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
    }
}
