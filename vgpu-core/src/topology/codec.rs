//! The `node-device-topology` node annotation: typed value and byte-compatible JSON codec.
//!
//! Wire form (contract §2): a JSON array with one object per GPU,
//! `[{"index":0,"links":{"1":[5,12],"2":[1]}}, …]`, mapping each peer index (a JSON object key) to the list of
//! [`P2PLinkType`] codes between the two GPUs. [`DeviceTopology::encode`] writes exactly what Go's
//! `encoding/json` writes for vgpu-manager's `[]TopologyInfo`: compact, fields `index` then `links`, peer keys
//! sorted as *strings* (so `"10"` sorts before `"2"`).
//!
//! [`DeviceTopology::decode`] reads what upstream's `ParseNodeTopology` (`json.Unmarshal` into
//! `[]TopologyInfo{Index int; Links map[int][]P2PLinkType}`) reads, where the meaning is unambiguous:
//!
//! * keys `index` and `links` in any letter case (`Index`, `LINKS`; an exact match wins); unknown fields
//!   are skipped;
//! * a missing or `null` `index` is 0 (Go's zero value; a repeated index is then refused when the
//!   topology is validated, see [`super::Topology::new`]); a duplicate `index` key: the last wins;
//! * a missing or `null` `links` is empty; a duplicate `links` key *adds* its peers to those already read
//!   (Go decodes into the existing map), while a later `"links":null` empties it;
//! * peer keys as Go's `strconv.ParseInt` reads them: `"01"` and `"+1"` are peer 1, `"-0"` is peer 0; a
//!   peer given twice (`"1"` and `"01"`) keeps its last list; a `null` list is empty;
//! * `null` for the whole value (a nil slice) is an empty topology.
//!
//! It refuses what Go accepts but cannot mean anything: a negative index or peer, a link code outside
//! [`P2PLinkType`] (`0..=24`), and a `null` in place of a whole GPU entry or of a link code (Go would make
//! them an entry for GPU 0 and the code 0). Numbers must be JSON integers (`1.0` is an error, as in Go).
//! Every error quotes the input and says where and what was expected.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::link_type::P2PLinkType;
use crate::codec::goread::{FieldKey, set};

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
    /// Decodes an annotation value (Go's reading, see the module docs). Never panics; any input that is not
    /// the documented shape is an error.
    ///
    /// `null` (Go's nil slice) decodes to an empty topology; a `null` or missing `links` and a `null` link list
    /// decode as empty, as Go's decoder would leave them.
    pub fn decode(input: &str) -> Result<Self, TopologyDecodeError> {
        let cx = Cx { shape: Cell::new(None) };
        let mut de = serde_json::Deserializer::from_str(input);
        let read = Top { cx: &cx }.deserialize(&mut de).and_then(|gpus| de.end().map(|()| gpus));
        match read {
            Ok(gpus) => Ok(Self { gpus }),
            Err(e) => Err(match cx.shape.take() {
                Some((path, expected, found)) => {
                    TopologyDecodeError::Shape { input: quote(input), path, expected, found }
                }
                None => TopologyDecodeError::Syntax {
                    input: quote(input),
                    line: e.line(),
                    column: e.column(),
                    message: e.to_string(),
                },
            }),
        }
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

// === The streaming reader ===
//
// One visitor per level of the value. A shape problem is recorded in `Cx` (path, expectation, what was
// found) and surfaces as a serde error that stops the parse; `decode` then reports the recorded problem.

/// Where the first shape problem is recorded.
struct Cx {
    shape: Cell<Option<(String, &'static str, String)>>,
}

/// A visitor that can word a shape error at its own place.
trait Place {
    /// Path of the value the visitor reads, e.g. `[1].links."3"[0]`.
    fn path(&self) -> String;
    /// What the value should be.
    fn expected(&self) -> &'static str;
    /// The context to record into.
    fn cx(&self) -> &Cx;
    /// Records the problem and returns the error that stops the parse.
    fn reject<E: de::Error>(&self, found: String) -> E {
        self.cx().shape.set(Some((self.path(), self.expected(), found)));
        E::custom(format_args!("at {}: expected {}", self.path(), self.expected()))
    }
}

/// Visitor methods that reject the JSON kinds a visitor does not take, describing what was found.
macro_rules! reject {
    (bool) => {
        fn visit_bool<E: de::Error>(self, v: bool) -> Result<Self::Value, E> {
            Err(self.reject(format!("boolean {v}")))
        }
    };
    (i64) => {
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
            Err(self.reject(format!("number {v}")))
        }
    };
    (u64) => {
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
            Err(self.reject(format!("number {v}")))
        }
    };
    (f64) => {
        fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
            Err(self.reject(format!("number {v:?}")))
        }
    };
    (str) => {
        fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
            Err(self.reject(format!("string {}", quote(v))))
        }
    };
    (unit) => {
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Err(self.reject("null".to_owned()))
        }
    };
    (seq) => {
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let mut n = 0usize;
            while seq.next_element::<IgnoredAny>()?.is_some() {
                n += 1;
            }
            Err(self.reject(format!("an array of {n} items")))
        }
    };
    (map) => {
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut n = 0usize;
            while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {
                n += 1;
            }
            Err(self.reject(format!("an object with {n} fields")))
        }
    };
    ($($kind:ident),+) => {
        $(reject!($kind);)+
    };
}

/// A negative zero (`-0`, which serde_json reports as the float `-0.0`) reads as the integer 0, as Go's
/// `strconv.ParseInt` reads `-0`.
fn negative_zero(v: f64) -> bool {
    v == 0.0 && v.is_sign_negative()
}

/// The whole value: `null` or an array of GPU entries.
struct Top<'c> {
    cx: &'c Cx,
}

impl Place for Top<'_> {
    fn path(&self) -> String {
        String::new()
    }
    fn expected(&self) -> &'static str {
        "a JSON array of {\"index\",\"links\"} objects"
    }
    fn cx(&self) -> &Cx {
        self.cx
    }
}

impl<'de> DeserializeSeed<'de> for Top<'_> {
    type Value = Vec<GpuLinks>;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Top<'_> {
    type Value = Vec<GpuLinks>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.expected())
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Vec::new())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut gpus = Vec::with_capacity(seq.size_hint().unwrap_or(8).min(64));
        while let Some(gpu) = seq.next_element_seed(Entry { cx: self.cx, i: gpus.len() })? {
            gpus.push(gpu);
        }
        Ok(gpus)
    }

    reject!(bool, i64, u64, f64, str, map);
}

/// GPU entry `i`: an object with `index` and `links`.
struct Entry<'c> {
    cx: &'c Cx,
    i: usize,
}

/// Field names of a GPU entry.
const ENTRY_FIELDS: &[&str] = &["index", "links"];

impl Place for Entry<'_> {
    fn path(&self) -> String {
        format!("[{}]", self.i)
    }
    fn expected(&self) -> &'static str {
        "an object with \"index\" and \"links\""
    }
    fn cx(&self) -> &Cx {
        self.cx
    }
}

impl<'de> DeserializeSeed<'de> for Entry<'_> {
    type Value = GpuLinks;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Entry<'_> {
    type Value = GpuLinks;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.expected())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut gpu = GpuLinks::default();
        while let Some(field) = map.next_key_seed(FieldKey(ENTRY_FIELDS))? {
            match field {
                Some(0) => set(&mut gpu.index, map.next_value_seed(Index { cx: self.cx, i: self.i })?),
                Some(1) => map.next_value_seed(Links { cx: self.cx, i: self.i, links: &mut gpu.links })?,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(gpu)
    }

    reject!(bool, i64, u64, f64, str, unit, seq);
}

/// The `index` of entry `i`: a non-negative integer, or `null` (no change).
struct Index<'c> {
    cx: &'c Cx,
    i: usize,
}

impl Place for Index<'_> {
    fn path(&self) -> String {
        format!("[{}].index", self.i)
    }
    fn expected(&self) -> &'static str {
        "a non-negative integer GPU index"
    }
    fn cx(&self) -> &Cx {
        self.cx
    }
}

impl<'de> DeserializeSeed<'de> for Index<'_> {
    type Value = Option<usize>;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Index<'_> {
    type Value = Option<usize>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.expected())
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        usize::try_from(v).map(Some).map_err(|_| self.reject(format!("number {v}")))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
        if negative_zero(v) { Ok(Some(0)) } else { Err(self.reject(format!("number {v:?}"))) }
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    reject!(bool, i64, str, seq, map);
}

/// The `links` of entry `i`, merged into `links` as Go merges into an existing map; `null` empties it.
struct Links<'c, 'l> {
    cx: &'c Cx,
    i: usize,
    links: &'l mut BTreeMap<usize, Vec<P2PLinkType>>,
}

impl Place for Links<'_, '_> {
    fn path(&self) -> String {
        format!("[{}].links", self.i)
    }
    fn expected(&self) -> &'static str {
        "an object mapping peer index to codes"
    }
    fn cx(&self) -> &Cx {
        self.cx
    }
}

impl<'de> DeserializeSeed<'de> for Links<'_, '_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Links<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.expected())
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.links.clear();
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some((peer, key)) = map.next_key_seed(PeerKey { cx: self.cx, i: self.i })? {
            let codes = map.next_value_seed(Codes { cx: self.cx, i: self.i, key: &key })?;
            self.links.insert(peer, codes);
        }
        Ok(())
    }

    reject!(bool, i64, u64, f64, str, seq);
}

/// A peer key of entry `i`'s links, read as Go's `strconv.ParseInt(key, 10, 64)`; the key's text is kept
/// for error paths.
struct PeerKey<'c> {
    cx: &'c Cx,
    i: usize,
}

impl Place for PeerKey<'_> {
    fn path(&self) -> String {
        format!("[{}].links", self.i)
    }
    fn expected(&self) -> &'static str {
        "peer keys that are non-negative decimal integers"
    }
    fn cx(&self) -> &Cx {
        self.cx
    }
}

impl<'de> DeserializeSeed<'de> for PeerKey<'_> {
    type Value = (usize, String);
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for PeerKey<'_> {
    type Value = (usize, String);

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.expected())
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<Self::Value, E> {
        parse_key(key).map(|peer| (peer, key.to_owned())).ok_or_else(|| self.reject(format!("key {key:?}")))
    }
}

/// The link list of entry `i` for the peer spelled `key`: an array of codes, or `null` (empty).
struct Codes<'c, 'k> {
    cx: &'c Cx,
    i: usize,
    key: &'k str,
}

impl Place for Codes<'_, '_> {
    fn path(&self) -> String {
        format!("[{}].links.{:?}", self.i, self.key)
    }
    fn expected(&self) -> &'static str {
        "an array of P2P link type codes"
    }
    fn cx(&self) -> &Cx {
        self.cx
    }
}

impl<'de> DeserializeSeed<'de> for Codes<'_, '_> {
    type Value = Vec<P2PLinkType>;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Codes<'_, '_> {
    type Value = Vec<P2PLinkType>;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.expected())
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Vec::new())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut codes = Vec::with_capacity(seq.size_hint().unwrap_or(2).min(8));
        while let Some(code) =
            seq.next_element_seed(Code { cx: self.cx, i: self.i, key: self.key, j: codes.len() })?
        {
            codes.push(code);
        }
        Ok(codes)
    }

    reject!(bool, i64, u64, f64, str, map);
}

/// Code `j` of the list of entry `i` for peer `key`.
struct Code<'c, 'k> {
    cx: &'c Cx,
    i: usize,
    key: &'k str,
    j: usize,
}

impl Place for Code<'_, '_> {
    fn path(&self) -> String {
        format!("[{}].links.{:?}[{}]", self.i, self.key, self.j)
    }
    fn expected(&self) -> &'static str {
        "a P2P link type code (integer 0..=24)"
    }
    fn cx(&self) -> &Cx {
        self.cx
    }
}

impl<'de> DeserializeSeed<'de> for Code<'_, '_> {
    type Value = P2PLinkType;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Code<'_, '_> {
    type Value = P2PLinkType;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.expected())
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        i64::try_from(v)
            .ok()
            .and_then(|c| P2PLinkType::from_code(c).ok())
            .ok_or_else(|| self.reject(format!("number {v}")))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
        P2PLinkType::from_code(v).map_err(|_| self.reject(format!("number {v}")))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
        if negative_zero(v) {
            P2PLinkType::from_code(0).map_err(|_| self.reject(format!("number {v:?}")))
        } else {
            Err(self.reject(format!("number {v:?}")))
        }
    }

    reject!(bool, str, unit, seq, map);
}

/// A peer key as Go's `strconv.ParseInt(key, 10, 64)` reads it (optional sign, decimal digits, leading
/// zeros allowed), when it is a non-negative index: `"1"`, `"01"`, `"+1"`, `"-0"`; not `"-1"`, `" 1"`, `"1.0"`.
fn parse_key(key: &str) -> Option<usize> {
    let (negative, digits) = match key.strip_prefix('-') {
        Some(digits) => (true, digits),
        None => (false, key.strip_prefix('+').unwrap_or(key)),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // Go refuses what overflows int64 (and then int); the index must also fit usize.
    let v: i64 = digits.parse().ok()?;
    if negative && v != 0 {
        return None;
    }
    usize::try_from(v).ok()
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
        let e = DeviceTopology::decode(r#"[{"index":0,"links":{"-1":[1]}}]"#).unwrap_err();
        assert!(
            e.to_string().contains(
                r#"at [0].links: expected peer keys that are non-negative decimal integers, found key "-1""#
            ),
            "{e}"
        );
        for (bad, at) in [
            ("[null]", "at [0]: expected an object with \"index\" and \"links\", found null"),
            (
                r#"[{"index":0,"links":{"1":[null]}}]"#,
                r#"at [0].links."1"[0]: expected a P2P link type code (integer 0..=24), found null"#,
            ),
            (
                r#"[{"index":1.0}]"#,
                "at [0].index: expected a non-negative integer GPU index, found number 1.0",
            ),
            (r#"[{"index":0,"links":{"1":[1.5]}}]"#, "found number 1.5"),
            (r#"[{"index":0,"links":{"1":[-1]}}]"#, "found number -1"),
            (
                r#"[{"index":0,"links":{"1":{"a":1}}}]"#,
                r#"at [0].links."1": expected an array of P2P link type codes, found an object with 1 fields"#,
            ),
            (
                r#"[{"index":0,"links":[1,2]}]"#,
                "at [0].links: expected an object mapping peer index to codes, found an array of 2 items",
            ),
            (r#"[{"index":"0"}]"#, "found string \"0\""),
            (r#"[true]"#, "found boolean true"),
            (r#"[{"index":0,"links":{"1.0":[1]}}]"#, "found key \"1.0\""),
            (r#"[{"index":0,"links":{" 1":[1]}}]"#, "found key \" 1\""),
            (r#"[{"index":0,"links":{"99999999999999999999":[1]}}]"#, "found key"),
        ] {
            let e = DeviceTopology::decode(bad).unwrap_err();
            assert!(matches!(e, TopologyDecodeError::Shape { .. }), "{bad}: {e}");
            assert!(e.to_string().contains(at), "{bad}: {e}");
        }
        for bad in ["[{\"index\":0}", "[1e400]", "[] []", "[{\"index\":0,}]"] {
            let e = DeviceTopology::decode(bad).unwrap_err();
            assert!(matches!(e, TopologyDecodeError::Syntax { .. }), "{bad}: {e}");
        }
        let e = DeviceTopology::decode(r#"{"index":0}"#).unwrap_err();
        assert!(e.to_string().contains("expected a JSON array"), "{e}");
        let long = "x".repeat(500);
        let e = DeviceTopology::decode(&long).unwrap_err();
        assert!(e.to_string().len() < 400, "{e}");
    }

    /// What Go's `json.Unmarshal` into `[]TopologyInfo` accepts and means unambiguously decodes here.
    #[test]
    fn go_leniency() {
        let one = |index: usize, links: &[(usize, &[u8])]| GpuLinks {
            index,
            links: links
                .iter()
                .map(|(p, codes)| (*p, codes.iter().map(|&c| P2PLinkType::ALL[usize::from(c)]).collect()))
                .collect(),
        };
        let read = |s: &str| DeviceTopology::decode(s).unwrap().gpus;
        // Keys in any letter case (also the Kelvin sign for k); unknown fields skipped.
        assert_eq!(read(r#"[{"Index":2,"LINKS":{"1":[5]},"x":[{}]}]"#), [one(2, &[(1, &[5])])]);
        assert_eq!(read("[{\"INDEX\":1,\"lin\u{212A}s\":{\"0\":[1]}}]"), [one(1, &[(0, &[1])])]);
        // Missing or null index: 0; duplicate index: the last; null keeps the earlier one.
        assert_eq!(read(r#"[{"links":{"1":[1]}}]"#), [one(0, &[(1, &[1])])]);
        assert_eq!(read(r#"[{"index":1,"Index":3,"index":null}]"#), [one(3, &[])]);
        assert_eq!(read(r#"[{"index":-0}]"#), [one(0, &[])]);
        // Duplicate links merge (Go decodes into the existing map); a later null empties.
        assert_eq!(
            read(r#"[{"index":0,"links":{"1":[1],"2":[2]},"Links":{"2":[3],"3":[4]}}]"#),
            [one(0, &[(1, &[1]), (2, &[3]), (3, &[4])])]
        );
        assert_eq!(read(r#"[{"index":0,"links":{"1":[1]},"links":null}]"#), [one(0, &[])]);
        assert_eq!(read(r#"[{"index":0,"links":null,"links":{"1":[1]}}]"#), [one(0, &[(1, &[1])])]);
        // Peer keys as strconv.ParseInt reads them; a peer given twice keeps its last list.
        assert_eq!(
            read(r#"[{"index":0,"links":{"01":[5],"+2":[6],"-0":[],"0002":[7]}}]"#),
            [one(0, &[(0, &[]), (1, &[5]), (2, &[7])])]
        );
        assert_eq!(read(r#"[{"index":0,"links":{"1":[5],"01":[6]}}]"#), [one(0, &[(1, &[6])])]);
        assert_eq!(read(r#"[{"index":0,"links":{"01":[6],"1":[5]}}]"#), [one(0, &[(1, &[5])])]);
        assert_eq!(read(r#"[{"index":0,"links":{"1":[-0]}}]"#), [one(0, &[(1, &[0])])]);
        assert_eq!(read(" null "), []);
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

        /// Re-cased keys, shuffled members, duplicates (a later `index` wins, an earlier empty `links`
        /// merges to nothing), `null` index duplicates and unknown members decode to the same topology.
        #[test]
        fn go_equivalent_forms_decode_the_same(
            (t, text) in arb_topology().prop_flat_map(|t| {
                let entries: Vec<_> = t.gpus.iter().map(|g| {
                    let one = DeviceTopology { gpus: vec![g.clone()] }.encode();
                    // `[{"index":N,"links":{…}}]` → the links object.
                    let links = one
                        .split_once(",\"links\":")
                        .and_then(|(_, rest)| rest.strip_suffix("}]"))
                        .map(str::to_owned)
                        .unwrap_or_default();
                    let members = [
                        ("index", g.index.to_string(), "7", true),
                        ("links", links, "{}", false),
                    ];
                    crate::codec::goread::testing::go_equivalent_object(&members)
                }).collect();
                (Just(t), entries)
            }).prop_map(|(t, entries)| (t, format!("[{}]", entries.join(","))))
        ) {
            prop_assert_eq!(DeviceTopology::decode(&text).unwrap(), t, "{}", text);
        }

        /// A GPU's links split over duplicate `links` members (merged, as Go does) and peer keys spelled with
        /// leading zeros or a plus sign decode to the same topology.
        #[test]
        fn split_links_and_respelled_peers_decode_the_same(
            t in arb_topology(),
            spell in proptest::collection::vec(0u8..3, 64),
            split in proptest::collection::vec(any::<bool>(), 64),
        ) {
            let mut k = 0;
            let entries: Vec<String> = t.gpus.iter().map(|g| {
                let mut parts = [String::new(), String::new()];
                for (peer, codes) in &g.links {
                    let key = match spell[k % spell.len()] {
                        0 => peer.to_string(),
                        1 => format!("0{peer}"),
                        _ => format!("+{peer}"),
                    };
                    let codes: Vec<String> = codes.iter().map(|c| c.code().to_string()).collect();
                    let part = &mut parts[usize::from(split[k % split.len()])];
                    if !part.is_empty() {
                        part.push(',');
                    }
                    let _ = write!(part, "\"{key}\":[{}]", codes.join(","));
                    k += 1;
                }
                format!(r#"{{"links":{{{}}},"index":{},"links":{{{}}}}}"#, parts[0], g.index, parts[1])
            }).collect();
            let text = format!("[{}]", entries.join(","));
            prop_assert_eq!(DeviceTopology::decode(&text).unwrap(), t, "{}", text);
        }
    }
}
