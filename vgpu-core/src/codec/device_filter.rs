//! `include-gpu-type`, `exclude-gpu-type`, `include-gpu-uuid`, `exclude-gpu-uuid`: comma lists matched as
//! case-insensitive substrings.
//!
//! Entries are trimmed and upper-cased; blank entries are ignored; a value with no usable entry means "unset".
//! A device passes when it matches some include entry (or there is none) and no exclude entry; the type and
//! UUID lists all apply together. Decoding cannot fail.
//!
//! Upper-casing follows Go's `strings.ToUpper` (what upstream's `util.CheckDeviceType/Uuid` use): rune by
//! rune with the *simple* case mapping of `unicode.ToUpper`, one character in, one out. Rust's
//! [`str::to_uppercase`] applies the full mapping instead, which expands some characters (`ß` → `SS`,
//! `ﬁ` → `FI`, `ᾳ` → `ΑΙ`) and would make `SS` match `Straße`. [`go_to_upper`] keeps Go's behaviour: a
//! character whose full upper case is one character maps to it (the two mappings agree there); a character
//! whose full upper case expands keeps itself (its simple mapping is the identity), except the Greek
//! lower-case letters with *ypogegrammeni* (iota subscript, U+1F80–1F87, U+1F90–1F97, U+1FA0–1FA7, U+1FB3,
//! U+1FC3, U+1FF3), whose simple mapping is the matching *prosgegrammeni* capital (`ᾳ` → `ᾼ`); those are
//! mapped explicitly. Turkish `ı` → `I` and `i` → `I` as in Go (no locale rules). The residual difference is
//! the Unicode version: characters whose case mapping appears in Rust's tables but not in the Go
//! toolchain's (or the reverse) can still differ.

use crate::model::GpuDevice;

/// One comma list of upper-cased substrings.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct SubstringList {
    entries: Vec<String>,
}

impl SubstringList {
    /// Parses a comma list; `None` when it holds no usable (non-blank) entry.
    pub fn decode(value: &str) -> Option<Self> {
        let entries: Vec<String> =
            value.split(',').map(str::trim).filter(|e| !e.is_empty()).map(go_to_upper).collect();
        (!entries.is_empty()).then_some(Self { entries })
    }

    /// Builds a list from entries, normalising them like [`SubstringList::decode`] (commas split entries).
    pub fn new<I: IntoIterator<Item = S>, S: AsRef<str>>(entries: I) -> Option<Self> {
        let joined: Vec<String> = entries.into_iter().map(|s| s.as_ref().to_owned()).collect();
        Self::decode(&joined.join(","))
    }

    /// The normalised entries.
    pub fn entries(&self) -> &[String] {
        &self.entries
    }

    /// The canonical comma-joined form.
    pub fn encode(&self) -> String {
        self.entries.join(",")
    }

    /// Some entry is a substring of `value`, ignoring case (upper-cased by [`go_to_upper`]).
    pub fn matches(&self, value: &str) -> bool {
        let value = go_to_upper(value);
        self.entries.iter().any(|e| value.contains(e.as_str()))
    }
}

/// Upper-cases `s` as Go's `strings.ToUpper` does: each character to its simple upper-case mapping, never
/// more than one character out for one in (see the module docs).
///
/// ```
/// use vgpu_core::codec::device_filter::go_to_upper;
/// assert_eq!(go_to_upper("Straße ﬁ ı"), "STRAßE ﬁ I");
/// assert_eq!(go_to_upper("ᾳ σς"), "ᾼ ΣΣ");
/// ```
pub fn go_to_upper(s: &str) -> String {
    if s.is_ascii() {
        return s.to_ascii_uppercase();
    }
    s.chars().map(go_upper_char).collect()
}

/// One character's simple upper-case mapping (Go's `unicode.ToUpper`).
fn go_upper_char(c: char) -> char {
    let mut full = c.to_uppercase();
    match (full.next(), full.next()) {
        (Some(upper), None) => upper,
        _ => iota_subscript_upper(c).unwrap_or(c),
    }
}

/// The simple upper-case mapping of the Greek small letters with ypogegrammeni, the only characters whose
/// full mapping expands while their simple mapping is not the identity: the capital with prosgegrammeni.
fn iota_subscript_upper(c: char) -> Option<char> {
    match c {
        '\u{1F80}'..='\u{1F87}' | '\u{1F90}'..='\u{1F97}' | '\u{1FA0}'..='\u{1FA7}' => {
            char::from_u32(u32::from(c) + 8)
        }
        '\u{1FB3}' => Some('\u{1FBC}'),
        '\u{1FC3}' => Some('\u{1FCC}'),
        '\u{1FF3}' => Some('\u{1FFC}'),
        _ => None,
    }
}

/// Include/exclude lists for one attribute: passes when included (or no include list) and not excluded.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct IncludeExclude {
    /// Include list (unset = everything included).
    pub include: Option<SubstringList>,
    /// Exclude list (unset = nothing excluded).
    pub exclude: Option<SubstringList>,
}

impl IncludeExclude {
    /// Parses the two annotation values (absent = unset).
    pub fn decode(include: Option<&str>, exclude: Option<&str>) -> Self {
        Self {
            include: include.and_then(SubstringList::decode),
            exclude: exclude.and_then(SubstringList::decode),
        }
    }

    /// Neither list is set.
    pub fn is_unset(&self) -> bool {
        self.include.is_none() && self.exclude.is_none()
    }

    /// Whether `value` passes both lists.
    pub fn admits(&self, value: &str) -> bool {
        self.include.as_ref().is_none_or(|l| l.matches(value))
            && !self.exclude.as_ref().is_some_and(|l| l.matches(value))
    }
}

/// The four GPU filter annotations of a pod.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct DeviceFilter {
    /// `include-gpu-type` / `exclude-gpu-type`, matched against the product name.
    pub types: IncludeExclude,
    /// `include-gpu-uuid` / `exclude-gpu-uuid`, matched against the UUID.
    pub uuids: IncludeExclude,
}

impl DeviceFilter {
    /// Reads the four annotations through `get`, which maps a full key to its value.
    ///
    /// ```
    /// use std::collections::BTreeMap;
    /// use vgpu_core::{codec::device_filter::DeviceFilter, domain::ResourceDomain};
    /// let ann = BTreeMap::from([("nvidia.com/include-gpu-type".to_owned(), "a100, ,h100".to_owned())]);
    /// let f = DeviceFilter::from_annotations(&ResourceDomain::default(), |k| ann.get(k).map(String::as_str));
    /// assert!(f.types.admits("NVIDIA A100-SXM4-80GB"));
    /// assert!(!f.types.admits("Tesla T4"));
    /// ```
    pub fn from_annotations<'a>(
        domain: &crate::domain::ResourceDomain,
        get: impl Fn(&str) -> Option<&'a str>,
    ) -> Self {
        Self {
            types: IncludeExclude::decode(get(&domain.include_gpu_type()), get(&domain.exclude_gpu_type())),
            uuids: IncludeExclude::decode(get(&domain.include_gpu_uuid()), get(&domain.exclude_gpu_uuid())),
        }
    }

    /// No list is set.
    pub fn is_unset(&self) -> bool {
        self.types.is_unset() && self.uuids.is_unset()
    }

    /// Whether a device passes all four lists.
    pub fn admits(&self, device: &GpuDevice) -> bool {
        self.types.admits(&device.type_name) && self.uuids.admits(&device.uuid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parse_and_match() {
        assert_eq!(SubstringList::decode(" , ,"), None);
        assert_eq!(SubstringList::decode(""), None);
        let l = SubstringList::decode(" a100 ,,H100,").unwrap();
        assert_eq!(l.entries(), ["A100", "H100"]);
        assert_eq!(l.encode(), "A100,H100");
        assert!(l.matches("NVIDIA a100-PCIE"));
        assert!(!l.matches("Tesla T4"));
    }

    #[test]
    fn include_and_exclude_both_apply() {
        let f = IncludeExclude::decode(Some("A100"), Some("80GB"));
        assert!(f.admits("NVIDIA A100-SXM4-40GB"));
        assert!(!f.admits("NVIDIA A100-SXM4-80GB"));
        assert!(!f.admits("Tesla T4"));
        let only_ex = IncludeExclude::decode(Some(" "), Some("t4"));
        assert!(only_ex.include.is_none());
        assert!(only_ex.admits("A10") && !only_ex.admits("Tesla T4"));
        let dev = GpuDevice { type_name: "NVIDIA A10".into(), uuid: "GPU-abc".into(), ..Default::default() };
        let df = DeviceFilter {
            types: IncludeExclude::decode(Some("a10"), None),
            uuids: IncludeExclude::decode(None, Some("gpu-ABC")),
        };
        assert!(!df.admits(&dev));
        assert!(DeviceFilter::default().admits(&dev) && DeviceFilter::default().is_unset());
    }

    #[test]
    fn upper_case_is_go_simple_mapping() {
        // German sharp s and ligatures stay (Go: one rune in, one out); Rust's full mapping would expand them.
        assert_eq!(go_to_upper("straße"), "STRAßE");
        assert_eq!(go_to_upper("ﬁﬂ ŉ ǰ"), "ﬁﬂ ŉ ǰ");
        // Turkish dotless and dotted i: no locale rules.
        assert_eq!(go_to_upper("ıi İ"), "II İ");
        // Greek: final sigma, tonos, diaeresis with tonos (no simple upper case), iota subscript.
        assert_eq!(go_to_upper("σςάΐ"), "ΣΣΆΐ");
        assert_eq!(go_to_upper("ᾀᾗᾧᾳῃῳ"), "ᾈᾟᾯᾼῌῼ");
        assert_eq!(go_to_upper("ᾈᾼᾲᾴᾷ"), "ᾈᾼᾲᾴᾷ");
        assert_eq!(go_to_upper("\u{345}"), "\u{399}");
        // Title-case digraph → upper-case digraph (one char either way).
        assert_eq!(go_to_upper("ǅǆ"), "ǄǄ");
        assert_eq!(go_to_upper("nvidia a100"), "NVIDIA A100");
    }

    #[test]
    fn upper_case_is_idempotent_for_every_char() {
        let chars = (0..=u32::from(char::MAX)).filter_map(char::from_u32);
        for c in chars {
            let u = go_upper_char(c);
            assert_eq!(go_upper_char(u), u, "{c:?} → {u:?}");
        }
    }

    #[test]
    fn sharp_s_matches_like_go() {
        // Go: "STRAßE" does not contain "SS", and "ß" is not in "STRASSE".
        let ss = SubstringList::decode("ss").unwrap();
        assert_eq!(ss.entries(), ["SS"]);
        assert!(!ss.matches("Straße"));
        let sharp = SubstringList::decode("ß").unwrap();
        assert_eq!(sharp.entries(), ["ß"]);
        assert!(sharp.matches("STRAßE") && sharp.matches("straße"));
        assert!(!sharp.matches("STRASSE"));
        let lig = SubstringList::decode("ﬁ").unwrap();
        assert!(!lig.matches("FI") && lig.matches("ﬁ"));
        assert!(SubstringList::decode("ı").unwrap().matches("gpu-I"));
        assert!(SubstringList::decode("ᾳ").unwrap().matches("ᾼ"));
    }

    proptest! {
        /// One character in, one out; the same as Rust's mapping wherever that is one character.
        #[test]
        fn upper_case_keeps_char_count(s in ".{0,32}") {
            let up = go_to_upper(&s);
            prop_assert_eq!(up.chars().count(), s.chars().count());
            for (c, u) in s.chars().zip(up.chars()) {
                let full: Vec<char> = c.to_uppercase().collect();
                if full.len() == 1 {
                    prop_assert_eq!(u, full[0]);
                }
            }
            prop_assert_eq!(go_to_upper(&up), up.clone());
        }

        #[test]
        fn never_panics(s in ".*", v in ".*") {
            if let Some(l) = SubstringList::decode(&s) {
                let _ = l.matches(&v);
            }
        }

        #[test]
        fn round_trip(entries in proptest::collection::vec("[A-Z0-9][A-Z0-9 -]{0,10}[A-Z0-9]", 1..6)) {
            let list = SubstringList::new(&entries).unwrap();
            prop_assert_eq!(list.entries(), entries.as_slice());
            prop_assert_eq!(SubstringList::decode(&list.encode()), Some(list.clone()));
        }
    }
}
