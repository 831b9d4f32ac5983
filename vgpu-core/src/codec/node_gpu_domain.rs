//! `node-gpu-domain`: the optional node annotation mapping each GPU UUID to its network rail (contract §2).
//!
//! Wire form: a JSON object `{"<gpu-uuid>":"<rail>",…}` with string values. Nothing in vgpu-manager writes
//! it; the scheduler only reads it for cross-node gang alignment, and trusts it only when every GPU of the
//! node has an entry (see [`crate::alloc::NodeDomains`]).

use std::collections::BTreeMap;

use super::{CodecError, NODE_GPU_DOMAIN};

/// GPU UUID → rail name.
pub type GpuRails = BTreeMap<String, String>;

/// Decodes a `node-gpu-domain` value.
pub fn decode(value: &str) -> Result<GpuRails, CodecError> {
    serde_json::from_str(value).map_err(|source| CodecError::Json {
        annotation: NODE_GPU_DOMAIN,
        expected: "a JSON object of GPU UUID to rail strings",
        source,
    })
}

/// Encodes a rail map (keys in UUID order).
pub fn encode(rails: &GpuRails) -> String {
    let mut out = String::from("{");
    for (i, (uuid, rail)) in rails.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        // Serializing a string cannot fail.
        out.push_str(&serde_json::to_string(uuid).unwrap_or_default());
        out.push(':');
        out.push_str(&serde_json::to_string(rail).unwrap_or_default());
    }
    out.push('}');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_errors() {
        let rails: GpuRails =
            [("GPU-0".to_owned(), "r0".to_owned()), ("GPU-1".to_owned(), "r\"1".to_owned())].into();
        let text = encode(&rails);
        assert_eq!(text, r#"{"GPU-0":"r0","GPU-1":"r\"1"}"#);
        assert_eq!(decode(&text).unwrap(), rails);
        assert_eq!(decode("{}").unwrap(), GpuRails::new());
        for bad in ["", "[]", r#"{"GPU-0":1}"#, r#"{"GPU-0":"r0""#, "null"] {
            let e = decode(bad).unwrap_err();
            assert!(e.to_string().contains("node-gpu-domain"), "{e}");
        }
    }
}
