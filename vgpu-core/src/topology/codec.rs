//! The `node-device-topology` node annotation: typed value and byte-compatible JSON codec.
//!
//! Wire form (contract §2): a JSON array with one object per GPU,
//! `[{"index":0,"links":{"1":[5,12],"2":[1]}}, …]`, mapping each peer index (a JSON object key) to the list of
//! [`P2PLinkType`] codes between the two GPUs. [`DeviceTopology::encode`] writes exactly what Go's
//! `encoding/json` writes for vgpu-manager's `[]TopologyInfo`: compact, fields `index` then `links`, peer keys
//! sorted as *strings* (so `"10"` sorts before `"2"`).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde_json::Value;

use super::link_type::P2PLinkType;

/// Annotation key suffix (the full key is `<domain>/node-device-topology`, e.g. `nvidia.com/node-device-topology`).
pub const ANNOTATION_SUFFIX: &str = "node-device-topology";

/// Longest prefix of the offending input quoted in a [`TopologyDecodeError`].
const QUOTE_LIMIT: usize = 96;

/// Links of one GPU to its peers, one entry of the annotation array.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GpuLinks {
    /// The GPU's index on the node.
    pub index: usize,
    /// Peer GPU index → link type codes between this GPU and the peer (PCIe level entry and/or NVLink entry).
    pub links: BTreeMap<usize, Vec<P2PLinkType>>,
}

/// The whole `node-device-topology` annotation value: per GPU, its links to every peer.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DeviceTopology {
    /// One entry per GPU, in annotation order.
    pub gpus: Vec<GpuLinks>,
}

/// Why a `node-device-topology` annotation value could not be decoded.
///
/// Every variant quotes the (possibly shortened) input and says what was expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopologyDecodeError {
    /// The input is not JSON at all.
    #[error(
        "invalid node-device-topology value {input}: not valid JSON at line {line} column {column}: {message}"
    )]
    Syntax {
        /// The offending input (shortened).
        input: String,
        /// 1-based line of the syntax error.
        line: usize,
        /// 1-based column of the syntax error.
        column: usize,
        /// The JSON parser's message.
        message: String,
    },
    /// A JSON value has the wrong shape.
    #[error("invalid node-device-topology value {input}: at {path}: expected {expected}, found {found}")]
    Shape {
        /// The offending input (shortened).
        input: String,
        /// Where in the document, e.g. `[1].links."3"[0]`.
        path: String,
        /// What the codec expected there.
        expected: &'static str,
        /// What it found (a JSON type or a short quote).
        found: String,
    },
}

impl DeviceTopology {
    /// Decodes an annotation value. Never panics; any input that is not the documented shape is an error.
    ///
    /// `null` (Go's nil slice) decodes to an empty topology; a `null` or missing `links` and a `null` link list
    /// decode as empty, as Go's decoder would leave them.
    pub fn decode(input: &str) -> Result<Self, TopologyDecodeError> {
        let value: Value = serde_json::from_str(input).map_err(|e| TopologyDecodeError::Syntax {
            input: quote(input),
            line: e.line(),
            column: e.column(),
            message: e.to_string(),
        })?;
        let shape = |path: String, expected: &'static str, found: &Value| TopologyDecodeError::Shape {
            input: quote(input),
            path,
            expected,
            found: describe(found),
        };
        let items = match &value {
            Value::Null => return Ok(Self::default()),
            Value::Array(items) => items,
            other => {
                return Err(shape(String::new(), "a JSON array of {\"index\",\"links\"} objects", other));
            }
        };
        let mut gpus = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            let Value::Object(fields) = item else {
                return Err(shape(format!("[{i}]"), "an object with \"index\" and \"links\"", item));
            };
            let index = match fields.get("index") {
                Some(v) => as_index(v)
                    .ok_or_else(|| shape(format!("[{i}].index"), "a non-negative integer GPU index", v))?,
                None => {
                    return Err(shape(format!("[{i}]"), "a field \"index\"", item));
                }
            };
            let mut links = BTreeMap::new();
            match fields.get("links") {
                None | Some(Value::Null) => {}
                Some(Value::Object(peers)) => {
                    for (key, list) in peers {
                        let peer = parse_key(key).ok_or_else(|| TopologyDecodeError::Shape {
                            input: quote(input),
                            path: format!("[{i}].links"),
                            expected: "peer keys that are non-negative decimal integers",
                            found: format!("key {key:?}"),
                        })?;
                        let codes = match list {
                            Value::Null => Vec::new(),
                            Value::Array(codes) => {
                                let mut out = Vec::with_capacity(codes.len());
                                for (j, code) in codes.iter().enumerate() {
                                    let t = code
                                        .as_i64()
                                        .and_then(|c| P2PLinkType::from_code(c).ok())
                                        .ok_or_else(|| {
                                            shape(
                                                format!("[{i}].links.{key:?}[{j}]"),
                                                "a P2P link type code (integer 0..=24)",
                                                code,
                                            )
                                        })?;
                                    out.push(t);
                                }
                                out
                            }
                            other => {
                                return Err(shape(
                                    format!("[{i}].links.{key:?}"),
                                    "an array of P2P link type codes",
                                    other,
                                ));
                            }
                        };
                        links.insert(peer, codes);
                    }
                }
                Some(other) => {
                    return Err(shape(
                        format!("[{i}].links"),
                        "an object mapping peer index to codes",
                        other,
                    ));
                }
            }
            gpus.push(GpuLinks { index, links });
        }
        Ok(Self { gpus })
    }

    /// Encodes the annotation value exactly as vgpu-manager (Go `encoding/json`) writes it.
    pub fn encode(&self) -> String {
        let mut out = String::from("[");
        for (i, gpu) in self.gpus.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            let _ = write!(out, "{{\"index\":{},\"links\":{{", gpu.index);
            // Go sorts map keys by their string form.
            let mut keys: Vec<(String, &Vec<P2PLinkType>)> =
                gpu.links.iter().map(|(k, v)| (k.to_string(), v)).collect();
            keys.sort_by(|a, b| a.0.cmp(&b.0));
            for (j, (key, codes)) in keys.iter().enumerate() {
                if j > 0 {
                    out.push(',');
                }
                let _ = write!(out, "\"{key}\":[");
                for (k, code) in codes.iter().enumerate() {
                    if k > 0 {
                        out.push(',');
                    }
                    let _ = write!(out, "{}", code.code());
                }
                out.push(']');
            }
            out.push_str("}}");
        }
        out.push(']');
        out
    }
}

impl std::str::FromStr for DeviceTopology {
    type Err = TopologyDecodeError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::decode(s)
    }
}

/// A JSON number that is a non-negative integer fitting `usize`.
fn as_index(v: &Value) -> Option<usize> {
    v.as_u64().and_then(|i| usize::try_from(i).ok())
}

/// A canonical non-negative decimal integer key (`"0"`, `"12"`; not `"01"`, `"+1"`, `" 1"`).
fn parse_key(key: &str) -> Option<usize> {
    if key.is_empty() || !key.bytes().all(|b| b.is_ascii_digit()) || (key.len() > 1 && key.starts_with('0')) {
        return None;
    }
    key.parse().ok()
}

/// Short description of a JSON value for error messages.
fn describe(v: &Value) -> String {
    match v {
        Value::Null => "null".to_owned(),
        Value::Bool(b) => format!("boolean {b}"),
        Value::Number(n) => format!("number {n}"),
        Value::String(s) => format!("string {}", quote(s)),
        Value::Array(a) => format!("an array of {} items", a.len()),
        Value::Object(o) => format!("an object with {} fields", o.len()),
    }
}

/// The input, Debug-quoted and shortened to [`QUOTE_LIMIT`] characters.
fn quote(input: &str) -> String {
    if input.chars().count() <= QUOTE_LIMIT {
        format!("{input:?}")
    } else {
        let head: String = input.chars().take(QUOTE_LIMIT).collect();
        format!("{head:?}…")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const CONTRACT_EXAMPLE: &str = r#"[{"index":0,"links":{"1":[5,12],"2":[1]}}]"#;

    #[test]
    fn contract_example_round_trips_byte_for_byte() {
        let t = DeviceTopology::decode(CONTRACT_EXAMPLE).unwrap();
        assert_eq!(t.gpus.len(), 1);
        assert_eq!(t.gpus[0].links[&1], vec![P2PLinkType::SingleSwitch, P2PLinkType::SixNvLinks]);
        assert_eq!(t.gpus[0].links[&2], vec![P2PLinkType::CrossCpu]);
        assert_eq!(t.encode(), CONTRACT_EXAMPLE);
    }

    #[test]
    fn keys_sort_as_strings_like_go() {
        let mut links = BTreeMap::new();
        for peer in [1usize, 2, 10, 11] {
            links.insert(peer, vec![P2PLinkType::CrossCpu]);
        }
        let t = DeviceTopology { gpus: vec![GpuLinks { index: 0, links }] };
        assert_eq!(t.encode(), r#"[{"index":0,"links":{"1":[1],"10":[1],"11":[1],"2":[1]}}]"#);
        assert_eq!(DeviceTopology::decode(&t.encode()).unwrap(), t);
    }

    #[test]
    fn empty_forms() {
        assert_eq!(DeviceTopology::default().encode(), "[]");
        assert_eq!(DeviceTopology::decode("[]").unwrap(), DeviceTopology::default());
        assert_eq!(DeviceTopology::decode("null").unwrap(), DeviceTopology::default());
        let t = DeviceTopology::decode(r#"[{"index":3,"links":null},{"index":4}]"#).unwrap();
        assert_eq!(t.encode(), r#"[{"index":3,"links":{}},{"index":4,"links":{}}]"#);
        let t = DeviceTopology::decode(r#"[{"index":0,"links":{"1":null}}]"#).unwrap();
        assert_eq!(t.encode(), r#"[{"index":0,"links":{"1":[]}}]"#);
    }

    #[test]
    fn errors_name_input_and_expectation() {
        let e = DeviceTopology::decode("{").unwrap_err();
        assert!(matches!(e, TopologyDecodeError::Syntax { line: 1, .. }), "{e}");
        assert!(e.to_string().contains(r#""{""#), "{e}");

        let e = DeviceTopology::decode(r#"[{"index":0,"links":{"1":[25]}}]"#).unwrap_err();
        assert_eq!(
            e.to_string(),
            r#"invalid node-device-topology value "[{\"index\":0,\"links\":{\"1\":[25]}}]": at [0].links."1"[0]: expected a P2P link type code (integer 0..=24), found number 25"#
        );
        let e = DeviceTopology::decode(r#"[{"index":-1,"links":{}}]"#).unwrap_err();
        assert!(e.to_string().contains("at [0].index: expected a non-negative integer GPU index"), "{e}");
        let e = DeviceTopology::decode(r#"[{"index":0,"links":{"x":[1]}}]"#).unwrap_err();
        assert!(e.to_string().contains(r#"found key "x""#), "{e}");
        let e = DeviceTopology::decode(r#"[{"links":{}}]"#).unwrap_err();
        assert!(e.to_string().contains(r#"expected a field "index""#), "{e}");
        let e = DeviceTopology::decode(r#"{"index":0}"#).unwrap_err();
        assert!(e.to_string().contains("expected a JSON array"), "{e}");
        let long = "x".repeat(500);
        let e = DeviceTopology::decode(&long).unwrap_err();
        assert!(e.to_string().len() < 400, "{e}");
    }

    fn arb_topology() -> impl Strategy<Value = DeviceTopology> {
        let codes = proptest::collection::vec((0u8..25).prop_map(|c| P2PLinkType::ALL[c as usize]), 0..3);
        let links = proptest::collection::btree_map(0usize..40, codes, 0..6);
        proptest::collection::vec((0usize..40, links), 0..6).prop_map(|gpus| DeviceTopology {
            gpus: gpus.into_iter().map(|(index, links)| GpuLinks { index, links }).collect(),
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        #[test]
        fn arbitrary_strings_never_panic(s in ".{0,64}") {
            let _ = DeviceTopology::decode(&s);
        }

        #[test]
        fn json_like_strings_never_panic(s in r#"[\[\]{}",:0-9a-z\- ]{0,48}"#) {
            let _ = DeviceTopology::decode(&s);
        }

        #[test]
        fn encode_decode_round_trip(t in arb_topology()) {
            let text = t.encode();
            let back = DeviceTopology::decode(&text).unwrap();
            prop_assert_eq!(&back, &t);
            prop_assert_eq!(back.encode(), text);
        }
    }
}
