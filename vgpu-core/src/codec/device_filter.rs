//! `include-gpu-type`, `exclude-gpu-type`, `include-gpu-uuid`, `exclude-gpu-uuid`: comma lists matched as
//! case-insensitive substrings.
//!
//! Entries are trimmed and upper-cased; blank entries are ignored; a value with no usable entry means "unset".
//! A device passes when it matches some include entry (or there is none) and no exclude entry; the type and
//! UUID lists all apply together. Decoding cannot fail.

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
            value.split(',').map(str::trim).filter(|e| !e.is_empty()).map(str::to_uppercase).collect();
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

    /// Some entry is a substring of `value`, ignoring case.
    pub fn matches(&self, value: &str) -> bool {
        let value = value.to_uppercase();
        self.entries.iter().any(|e| value.contains(e.as_str()))
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

    proptest! {
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
