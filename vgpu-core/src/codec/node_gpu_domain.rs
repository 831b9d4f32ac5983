//! `node-gpu-domain`: the optional node annotation mapping each GPU UUID to its network rail (contract §2).
//!
//! Wire form: a JSON object `{"<gpu-uuid>":"<rail>",…}` with string values. Nothing in vgpu-manager writes
//! it; the scheduler only reads it for cross-node gang alignment, and trusts it only when every GPU of the
//! node has an entry (see [`crate::alloc::NodeDomains`]).
//!
//! Decoding reads what upstream reads (`json.Unmarshal` into a `map[string]string`): keys are GPU UUIDs,
//! so they are data and matched exactly (no case folding); a duplicate UUID keeps its last rail; a `null`
//! rail is the empty rail `""` (Go stores the zero string); `null` for the whole value is an empty map
//! (as absent). A rail that is not a string is an error, as in Go.

use std::collections::BTreeMap;

use super::{CodecError, NODE_GPU_DOMAIN};

/// GPU UUID → rail name.
pub type GpuRails = BTreeMap<String, String>;

/// Decodes a `node-gpu-domain` value.
pub fn decode(value: &str) -> Result<GpuRails, CodecError> {
    let wire: Option<BTreeMap<String, Option<String>>> =
        serde_json::from_str(value).map_err(|source| CodecError::Json {
            annotation: NODE_GPU_DOMAIN,
            expected: "a JSON object of GPU UUID to rail strings",
            source,
        })?;
    Ok(wire.unwrap_or_default().into_iter().map(|(uuid, rail)| (uuid, rail.unwrap_or_default())).collect())
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
    use proptest::prelude::*;

    #[test]
    fn round_trip_and_errors() {
        let rails: GpuRails =
            [("GPU-0".to_owned(), "r0".to_owned()), ("GPU-1".to_owned(), "r\"1".to_owned())].into();
        let text = encode(&rails);
        assert_eq!(text, r#"{"GPU-0":"r0","GPU-1":"r\"1"}"#);
        assert_eq!(decode(&text).unwrap(), rails);
        assert_eq!(decode("{}").unwrap(), GpuRails::new());
        for bad in ["", "[]", r#"{"GPU-0":1}"#, r#"{"GPU-0":"r0""#, r#"{"GPU-0":["r0"]}"#] {
            let e = decode(bad).unwrap_err();
            assert!(e.to_string().contains("node-gpu-domain"), "{e}");
        }
    }

    /// Go's reading: `null` is an empty map, a `null` rail the empty rail, a duplicate UUID its last rail,
    /// and UUIDs are matched exactly.
    #[test]
    fn go_leniency() {
        assert_eq!(decode("null").unwrap(), GpuRails::new());
        let rails = decode(r#"{"GPU-a":"r0","GPU-b":null,"GPU-a":"r1","gpu-a":"r2"}"#).unwrap();
        let want: GpuRails = [("GPU-a", "r1"), ("GPU-b", ""), ("gpu-a", "r2")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        assert_eq!(rails, want);
    }

    proptest! {
        /// Entries in any order, each optionally preceded by a duplicate with another rail, decode to the map.
        #[test]
        fn go_equivalent_forms_decode_the_same(
            rails in proptest::collection::btree_map("[A-Za-z0-9-]{1,12}", ".{0,8}", 0..6),
            dup in proptest::collection::vec(any::<bool>(), 6),
            order in Just((0..6).collect::<Vec<usize>>()).prop_shuffle(),
        ) {
            let entries: Vec<(&String, &String)> = rails.iter().collect();
            let mut parts = Vec::new();
            for i in order.into_iter().filter(|&i| i < entries.len()) {
                let (k, v) = entries[i];
                let key = serde_json::to_string(k).unwrap();
                if dup[i] {
                    parts.push(format!("{key}:\"decoy\""));
                }
                parts.push(format!("{key}:{}", serde_json::to_string(v).unwrap()));
            }
            let text = format!("{{{}}}", parts.join(","));
            prop_assert_eq!(decode(&text).unwrap(), rails);
            prop_assert_eq!(decode(&encode(&decode(&text).unwrap())).unwrap(), decode(&text).unwrap());
        }
    }
}
