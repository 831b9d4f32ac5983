//! Reading JSON the way Go's `encoding/json` reads it into a struct, for the annotation decoders.
//!
//! What `json.Unmarshal` does, and what these helpers reproduce:
//!
//! * **Keys** name a field exactly, or else case-insensitively: Go (≥ 1.21) folds both sides with
//!   `foldName` (ASCII letters to upper case, any other character `c` to `ToUpper(ToLower(c))`) and
//!   prefers the exact match. Our field names are ASCII, so a key matches when its characters fold, one by
//!   one, to the name's upper-cased letters; besides ASCII letters only four characters fold into ASCII:
//!   `K` (U+212A KELVIN SIGN) to `K`, `ſ` (U+017F) to `S`, `ı` (U+0131) and `İ` (U+0130) to `I`.
//!   See [`FieldKey`].
//! * **Duplicate keys**: each occurrence is decoded into the field in turn, so the last one wins.
//! * **`null`** as a member value leaves a scalar field as it was (its zero value, or an earlier
//!   duplicate's value) and resets a map or slice field to empty. See [`set`].
//! * **Missing fields** keep their zero value; **unknown fields** are skipped.
//! * A Go `int` takes only JSON integers in range (`1.0`, `1e2` are errors); see [`GoInt`].

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, Unexpected, Visitor};

/// The ASCII byte Go's key folding maps `c` to, or `None` when `c` folds to a non-ASCII character (which
/// can never match an ASCII field name).
fn fold_ascii(c: char) -> Option<u8> {
    match c {
        // `is_ascii` makes the cast exact.
        c if c.is_ascii() => Some((c as u8).to_ascii_uppercase()),
        // KELVIN SIGN: ToLower → 'k'.
        '\u{212A}' => Some(b'K'),
        // LATIN SMALL LETTER LONG S: ToUpper → 'S'.
        '\u{017F}' => Some(b'S'),
        // LATIN CAPITAL LETTER I WITH DOT ABOVE: ToLower → 'i'; DOTLESS I: ToUpper → 'I'.
        '\u{0130}' | '\u{0131}' => Some(b'I'),
        _ => None,
    }
}

/// Whether Go's `encoding/json` matches object key `key` to the ASCII field name `name` case-insensitively.
pub(crate) fn fold_eq(key: &str, name: &str) -> bool {
    let mut chars = key.chars();
    for b in name.bytes() {
        match chars.next().and_then(fold_ascii) {
            Some(f) if f == b.to_ascii_uppercase() => {}
            _ => return false,
        }
    }
    chars.next().is_none()
}

/// The position in `names` of the field `key` names: an exact match first, else Go's case-insensitive one.
pub(crate) fn field_index(key: &str, names: &[&str]) -> Option<usize> {
    names.iter().position(|n| *n == key).or_else(|| names.iter().position(|n| fold_eq(key, n)))
}

/// Reads an object key as the position of the field it names in the given list (`None`: an unknown field,
/// to be skipped). Keys without escapes are matched where they lie in the input, without a copy.
pub(crate) struct FieldKey(pub(crate) &'static [&'static str]);

impl<'de> DeserializeSeed<'de> for FieldKey {
    type Value = Option<usize>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for FieldKey {
    type Value = Option<usize>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object key")
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<Self::Value, E> {
        Ok(field_index(key, self.0))
    }
}

/// A Go `int` (64 bits): a JSON integer that fits `i64`. Go also reads `-0` as 0; serde_json reports `-0`
/// as the float `-0.0`, so a negative zero written as `-0.0` is read as 0 as well (Go refuses that one).
/// Any other fraction or exponent form is an error, as in Go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GoInt(pub(crate) i64);

impl<'de> serde::Deserialize<'de> for GoInt {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_i64(GoIntVisitor)
    }
}

/// Visitor of [`GoInt`]; also used by the topology reader, which words its own errors.
pub(crate) struct GoIntVisitor;

impl<'de> Visitor<'de> for GoIntVisitor {
    type Value = GoInt;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an integer")
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<GoInt, E> {
        Ok(GoInt(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<GoInt, E> {
        i64::try_from(v)
            .map(GoInt)
            .map_err(|_| E::invalid_value(Unexpected::Unsigned(v), &"a 64-bit integer"))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<GoInt, E> {
        if v == 0.0 && v.is_sign_negative() {
            return Ok(GoInt(0));
        }
        Err(E::invalid_type(Unexpected::Float(v), &self))
    }
}

/// Stores a member value the way Go does for a scalar field: `null` (`None`) leaves the field as it was.
pub(crate) fn set<T>(slot: &mut T, value: Option<T>) {
    if let Some(v) = value {
        *slot = v;
    }
}

/// Helpers for the decoders' leniency properties.
#[cfg(test)]
pub(crate) mod testing {
    use proptest::prelude::*;

    /// `name` as an operator might spell it: each character's case flipped where `flip` has its bit set,
    /// and `k`, `s`, `i` replaced by a character Go folds the same way (`K`, `ſ`, `ı`) where `exotic` has.
    pub(crate) fn recase(name: &str, flip: u64, exotic: u64) -> String {
        name.chars()
            .enumerate()
            .map(|(i, c)| {
                let bit = |m: u64| (m >> (i % 64)) & 1 == 1;
                match c.to_ascii_lowercase() {
                    'k' if bit(exotic) => '\u{212A}',
                    's' if bit(exotic) => '\u{17F}',
                    'i' if bit(exotic) => '\u{131}',
                    _ if bit(flip) && c.is_ascii_lowercase() => c.to_ascii_uppercase(),
                    _ if bit(flip) => c.to_ascii_lowercase(),
                    _ => c,
                }
            })
            .collect()
    }

    /// Members `(key, value text, decoy text, null is a no-op)` rewritten the ways Go reads the same: keys
    /// re-cased, members shuffled, each member optionally preceded by a duplicate holding its decoy (a
    /// value of the same JSON type; the later one wins) and followed by a `null` duplicate where `null` is
    /// a no-op (scalars; not maps or lists, which `null` empties), and unknown members added.
    pub(crate) fn go_equivalent_object(
        members: &[(&str, String, &str, bool)],
    ) -> impl Strategy<Value = String> + use<> {
        let members: Vec<(String, String, String, bool)> = members
            .iter()
            .map(|(k, v, decoy, null_ok)| ((*k).to_owned(), v.clone(), (*decoy).to_owned(), *null_ok))
            .collect();
        let n = members.len();
        (
            proptest::collection::vec((any::<u64>(), any::<u64>(), any::<bool>(), any::<bool>()), n),
            Just((0..n).collect::<Vec<usize>>()).prop_shuffle(),
            any::<bool>(),
        )
            .prop_map(move |(shapes, order, unknown)| {
                let mut parts = Vec::new();
                if unknown {
                    parts.push(r#""unknownField":{"x":[1,null]}"#.to_owned());
                }
                for i in order {
                    let ((key, value, decoy, null_ok), (flip, exotic, decoy_first, null_after)) =
                        (&members[i], shapes[i]);
                    let spelled = recase(key, flip, exotic);
                    let json_key = serde_json::to_string(&spelled).unwrap_or_default();
                    if decoy_first {
                        parts.push(format!("{}:{decoy}", serde_json::to_string(key).unwrap_or_default()));
                    }
                    parts.push(format!("{json_key}:{value}"));
                    if null_after && *null_ok {
                        parts.push(format!("{json_key}:null"));
                    }
                }
                format!("{{{}}}", parts.join(","))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_fold_like_go() {
        let names = &["id", "busId", "links", "deviceSplit"];
        assert_eq!(field_index("id", names), Some(0));
        assert_eq!(field_index("ID", names), Some(0));
        assert_eq!(field_index("Id", names), Some(0));
        assert_eq!(field_index("BUSID", names), Some(1));
        assert_eq!(field_index("busid", names), Some(1));
        assert_eq!(field_index("bus_id", names), None);
        assert_eq!(field_index("LIN\u{212A}S", names), Some(2));
        assert_eq!(field_index("device\u{17F}plit", names), Some(3));
        assert_eq!(field_index("\u{131}d", names), Some(0));
        assert_eq!(field_index("\u{130}D", names), Some(0));
        assert_eq!(field_index("ïd", names), None);
        assert_eq!(field_index("i", names), None);
        assert_eq!(field_index("idx", names), None);
        assert_eq!(field_index("", names), None);
    }

    /// The four characters above are exactly the non-ASCII ones whose Go fold (`ToUpper(ToLower(c))`, simple
    /// mappings) is ASCII. Rust's mappings are full ones; where they expand, the simple mapping is the
    /// identity except for `İ` (simple lower case `i`) and the Greek iota-subscript letters (non-ASCII
    /// results either way).
    #[test]
    fn only_four_non_ascii_characters_fold_into_ascii() {
        let simple_lower = |c: char| {
            let mut l = c.to_lowercase();
            match (l.next(), l.next()) {
                (Some(x), None) => x,
                _ if c == '\u{130}' => 'i',
                _ => c,
            }
        };
        let simple_upper = |c: char| {
            let mut u = c.to_uppercase();
            match (u.next(), u.next()) {
                (Some(x), None) => x,
                _ => c,
            }
        };
        let found: Vec<char> = (0x80..=u32::from(char::MAX))
            .filter_map(char::from_u32)
            .filter(|&c| simple_upper(simple_lower(c)).is_ascii())
            .collect();
        assert_eq!(found, ['\u{130}', '\u{131}', '\u{17F}', '\u{212A}']);
        for c in found {
            assert_eq!(fold_ascii(c), Some(simple_upper(simple_lower(c)) as u8));
        }
    }

    #[test]
    fn go_int_takes_integers_and_negative_zero() {
        let read = |s: &str| serde_json::from_str::<GoInt>(s).map(|g| g.0);
        assert_eq!(read("5").unwrap(), 5);
        assert_eq!(read("-7").unwrap(), -7);
        assert_eq!(read("-0").unwrap(), 0);
        assert_eq!(read("9223372036854775807").unwrap(), i64::MAX);
        assert!(read("9223372036854775808").is_err());
        assert!(read("1.0").is_err());
        assert!(read("1e2").is_err());
        assert!(read("0.0").is_err());
        assert!(read("\"1\"").is_err());
        assert!(read("null").is_err());
    }
}
