//! [`CandidateNames`]: a list of node names in one text buffer, the candidates of an extender call from the
//! request body to the answer.
//!
//! A filter over every node of a 50,000-node cluster receives 50,000 names and answers with each of them
//! (the chosen node in `NodeNames`, every other one in `FailedNodes`). Held as one heap `String` each, the
//! names cost 50,000 allocations on the way in and as many frees on the way out, and with glibc's default
//! allocator those small frees (fastbin consolidation, `unlink_chunk`) were about 40 % of the whole call.
//! Here the names are decoded from the JSON straight into one buffer with their end offsets, and the results
//! ([`FilterResult`](crate::FilterResult), [`ExtenderFilterResult`](crate::wire::ExtenderFilterResult)) refer
//! to them by position.
//!
//! | part | holds |
//! |---|---|
//! | `text` | the names, one after the other, without separator |
//! | `ends` | per name, the offset in `text` just past its last byte |
//!
//! JSON: written as an array of strings and read from one ([`serde`]), exactly like `Vec<String>`: the same
//! escapes, the same values, the same errors (`invalid type: null, expected a string` for a `null` element).

use std::fmt;
use std::ops::Index;

use serde::de::{DeserializeSeed, SeqAccess, Visitor};
use serde::ser::SerializeSeq;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Node names in one buffer (module docs): `push`, `get`, `iter`, `position`, and `names[i]` like a
/// `Vec<String>`, without a heap allocation per name.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct CandidateNames {
    text: String,
    ends: Vec<usize>,
}

impl CandidateNames {
    /// An empty list.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty list with room for `names` names of `bytes` bytes in all.
    pub fn with_capacity(names: usize, bytes: usize) -> Self {
        Self { text: String::with_capacity(bytes), ends: Vec::with_capacity(names) }
    }

    /// Appends a name.
    pub fn push(&mut self, name: &str) {
        self.text.push_str(name);
        self.ends.push(self.text.len());
    }

    /// Number of names.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// Whether the list is empty.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// The name at a position.
    pub fn get(&self, i: usize) -> Option<&str> {
        let end = *self.ends.get(i)?;
        let start = match i.checked_sub(1) {
            Some(p) => *self.ends.get(p)?,
            None => 0,
        };
        self.text.get(start..end)
    }

    /// The names in order.
    pub fn iter(&self) -> Iter<'_> {
        Iter { names: self, front: 0, back: self.ends.len() }
    }

    /// The position of the first occurrence of a name.
    pub fn position(&self, name: &str) -> Option<usize> {
        self.iter().position(|n| n == name)
    }

    /// Whether a name is listed.
    pub fn contains(&self, name: &str) -> bool {
        self.position(name).is_some()
    }

    /// Every name, concatenated (what a whole-list check such as "no name needs a JSON escape" scans once).
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The names whose position passes `keep`, in order (a new buffer).
    pub fn select(&self, mut keep: impl FnMut(usize) -> bool) -> Self {
        let mut out = Self::with_capacity(self.len(), self.text.len());
        for (i, name) in self.iter().enumerate() {
            if keep(i) {
                out.push(name);
            }
        }
        out
    }

    /// The names as owned strings.
    pub fn to_vec(&self) -> Vec<String> {
        self.iter().map(str::to_owned).collect()
    }
}

impl Index<usize> for CandidateNames {
    type Output = str;

    /// The name at a position; panics when out of range, like indexing a `Vec`.
    fn index(&self, i: usize) -> &str {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.text[start..self.ends[i]]
    }
}

impl fmt::Debug for CandidateNames {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// Iterator over [`CandidateNames`] ([`CandidateNames::iter`]).
#[derive(Debug, Clone)]
pub struct Iter<'a> {
    names: &'a CandidateNames,
    front: usize,
    back: usize,
}

impl<'a> Iterator for Iter<'a> {
    type Item = &'a str;

    fn next(&mut self) -> Option<&'a str> {
        if self.front >= self.back {
            return None;
        }
        self.front += 1;
        self.names.get(self.front - 1)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.back - self.front;
        (n, Some(n))
    }
}

impl DoubleEndedIterator for Iter<'_> {
    fn next_back(&mut self) -> Option<Self::Item> {
        if self.front >= self.back {
            return None;
        }
        self.back -= 1;
        self.names.get(self.back)
    }
}

impl ExactSizeIterator for Iter<'_> {}

impl<'a> IntoIterator for &'a CandidateNames {
    type Item = &'a str;
    type IntoIter = Iter<'a>;

    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}

impl<S: AsRef<str>> FromIterator<S> for CandidateNames {
    fn from_iter<I: IntoIterator<Item = S>>(iter: I) -> Self {
        let mut out = Self::new();
        out.extend(iter);
        out
    }
}

impl<S: AsRef<str>> Extend<S> for CandidateNames {
    fn extend<I: IntoIterator<Item = S>>(&mut self, iter: I) {
        for name in iter {
            self.push(name.as_ref());
        }
    }
}

impl<S: AsRef<str>> From<Vec<S>> for CandidateNames {
    fn from(names: Vec<S>) -> Self {
        Self::from(names.as_slice())
    }
}

impl<S: AsRef<str>> From<&[S]> for CandidateNames {
    fn from(names: &[S]) -> Self {
        let bytes = names.iter().map(|n| n.as_ref().len()).sum();
        let mut out = Self::with_capacity(names.len(), bytes);
        out.extend(names);
        out
    }
}

impl<S: AsRef<str>, const N: usize> From<[S; N]> for CandidateNames {
    fn from(names: [S; N]) -> Self {
        Self::from(&names[..])
    }
}

impl<S: AsRef<str>> PartialEq<[S]> for CandidateNames {
    fn eq(&self, other: &[S]) -> bool {
        self.len() == other.len() && self.iter().zip(other).all(|(a, b)| a == b.as_ref())
    }
}

impl<S: AsRef<str>, const N: usize> PartialEq<[S; N]> for CandidateNames {
    fn eq(&self, other: &[S; N]) -> bool {
        *self == other[..]
    }
}

impl<S: AsRef<str>> PartialEq<Vec<S>> for CandidateNames {
    fn eq(&self, other: &Vec<S>) -> bool {
        *self == other[..]
    }
}

impl Serialize for CandidateNames {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(self.len()))?;
        for name in self {
            seq.serialize_element(name)?;
        }
        seq.end()
    }
}

/// Names room is made for when a list's length is not known ([`CandidateNames`]' decoding).
const DECODE_NAMES: usize = 128;
/// Bytes per name room is made for (node names are mostly short host names).
const DECODE_NAME_BYTES: usize = 16;

/// Decodes one array element as a string and appends it to the buffer (no `String` per name: serde_json
/// hands an unescaped string over as a slice of the input, an escaped one from its scratch buffer).
struct PushName<'b>(&'b mut CandidateNames);

impl<'de> DeserializeSeed<'de> for PushName<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_string(self)
    }
}

impl<'de> Visitor<'de> for PushName<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `String`'s own wording, so errors read as they did for `Vec<String>`.
        f.write_str("a string")
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<(), E> {
        self.0.push(v);
        Ok(())
    }

    fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<(), E> {
        match std::str::from_utf8(v) {
            Ok(s) => self.visit_str(s),
            Err(_) => Err(E::invalid_value(serde::de::Unexpected::Bytes(v), &self)),
        }
    }
}

impl<'de> Deserialize<'de> for CandidateNames {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ListVisitor;
        impl<'de> Visitor<'de> for ListVisitor {
            type Value = CandidateNames;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a sequence")
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                // serde_json does not tell the length: start with room for a typical list (kube-scheduler
                // sends some hundreds of candidates) instead of growing from nothing (about 14 reallocations
                // for 100 names).
                let names = seq.size_hint().unwrap_or(DECODE_NAMES).min(1 << 16);
                let mut out = CandidateNames::with_capacity(names, names * DECODE_NAME_BYTES);
                while seq.next_element_seed(PushName(&mut out))?.is_some() {}
                Ok(out)
            }
        }
        deserializer.deserialize_seq(ListVisitor)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use proptest::prelude::*;

    use super::*;

    #[test]
    fn push_get_iter_position() {
        let mut names = CandidateNames::new();
        assert!(names.is_empty());
        assert_eq!(names.get(0), None);
        for n in ["a", "", "bc", "é", "bc"] {
            names.push(n);
        }
        assert_eq!(names.len(), 5);
        assert_eq!(names, ["a", "", "bc", "é", "bc"]);
        assert_eq!(names.get(1), Some(""));
        assert_eq!(&names[3], "é");
        assert_eq!(names.get(5), None);
        assert_eq!(names.position("bc"), Some(2));
        assert_eq!(names.position("x"), None);
        assert!(names.contains(""));
        assert_eq!(names.iter().rev().collect::<Vec<_>>(), ["bc", "é", "bc", "", "a"]);
        assert_eq!(names.iter().len(), 5);
        assert_eq!(names.text(), "abcébc");
        assert_eq!(names.select(|i| i % 2 == 0), ["a", "bc", "bc"]);
        assert_eq!(names.to_vec(), ["a", "", "bc", "é", "bc"]);
        assert_eq!(format!("{names:?}"), r#"["a", "", "bc", "é", "bc"]"#);
        assert_eq!(CandidateNames::from(vec!["a".to_owned()]), CandidateNames::from(["a"]));
    }

    #[test]
    fn json_errors_read_as_vec_string() {
        for body in
            [r#"["a",null]"#, r#"["a",1]"#, r#"{"a":1}"#, r#""a""#, r#"["a""#, r#"["\ud800"]"#, "null"]
        {
            let ours = serde_json::from_str::<CandidateNames>(body).unwrap_err().to_string();
            let theirs = serde_json::from_str::<Vec<String>>(body).unwrap_err().to_string();
            assert_eq!(ours, theirs, "{body}");
        }
        let v: Option<CandidateNames> = serde_json::from_str("null").unwrap();
        assert_eq!(v, None);
        let v: CandidateNames = serde_json::from_value(serde_json::json!(["x", "y\"z"])).unwrap();
        assert_eq!(v, ["x", "y\"z"]);
    }

    /// A JSON string for `s`, each character written plainly or escaped as `\uXXXX` (surrogate pairs
    /// beyond the basic plane) as `escape` says, with the short escapes where JSON has them.
    fn encode(s: &str, escape: &[bool]) -> String {
        let mut out = String::from("\"");
        for (i, c) in s.chars().enumerate() {
            let esc = escape.get(i % escape.len().max(1)).copied().unwrap_or(false);
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' if esc => out.push_str("\\n"),
                '/' if esc => out.push_str("\\/"),
                c if esc || (c as u32) < 0x20 => {
                    let mut buf = [0u16; 2];
                    for unit in c.encode_utf16(&mut buf) {
                        out.push_str(&format!("\\u{unit:04x}"));
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
        out
    }

    proptest! {
        /// Any array of strings, escaped any way and spaced any way, decodes to serde_json's `Vec<String>`;
        /// and the list writes serde_json's bytes of that `Vec<String>`.
        #[test]
        fn decodes_and_encodes_as_vec_string(
            names in proptest::collection::vec(".{0,10}", 0..12),
            escape in proptest::collection::vec(any::<bool>(), 1..5),
            space in prop_oneof![Just(""), Just(" "), Just("\n\t ")],
        ) {
            let items: Vec<String> = names.iter().map(|n| encode(n, &escape)).collect();
            let body = format!("[{space}{}{space}]", items.join(&format!("{space},{space}")));
            let theirs: Vec<String> = serde_json::from_str(&body).unwrap();
            prop_assert_eq!(&theirs, &names);
            let ours: CandidateNames = serde_json::from_str(&body).unwrap();
            prop_assert_eq!(&ours, &theirs);
            let ours_bytes: CandidateNames = serde_json::from_slice(body.as_bytes()).unwrap();
            prop_assert_eq!(&ours_bytes, &ours);
            prop_assert_eq!(serde_json::to_vec(&ours).unwrap(), serde_json::to_vec(&theirs).unwrap());
            prop_assert_eq!(ours.iter().len(), names.len());
            for (i, n) in names.iter().enumerate() {
                prop_assert_eq!(ours.get(i), Some(n.as_str()));
            }
        }

        /// Any JSON value decodes to a list exactly when it decodes to a `Vec<String>`, with the same names or
        /// the same error text.
        #[test]
        fn any_json_agrees_with_vec_string(
            parts in proptest::collection::vec(
                prop_oneof![
                    ".{0,6}".prop_map(|s| serde_json::to_string(&s).unwrap()),
                    Just("null".to_owned()),
                    Just("1".to_owned()),
                    Just("[]".to_owned()),
                    Just("\"\\ud800\"".to_owned()),
                    Just("\"\\x\"".to_owned()),
                ],
                0..6,
            ),
            close in any::<bool>(),
        ) {
            let body = format!("[{}{}", parts.join(","), if close { "]" } else { "" });
            let theirs = serde_json::from_str::<Vec<String>>(&body).map_err(|e| e.to_string());
            let ours = serde_json::from_str::<CandidateNames>(&body).map(|n| n.to_vec()).map_err(|e| e.to_string());
            prop_assert_eq!(ours, theirs);
        }
    }
}
