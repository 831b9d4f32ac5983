//! `excludeDevices` / `--exclude-devices`: GPU indices, inclusive index ranges and UUIDs.

use std::{fmt, ops::RangeInclusive, str::FromStr};

/// An `excludeDevices` entry that is neither an index, a range nor a UUID.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid excludeDevices entry {entry:?}: expected a GPU index (\"1\"), an inclusive range (\"0..2\" or \"0-2\") or a GPU UUID"
)]
pub struct InvalidExcludeEntry {
    /// The rejected entry.
    pub entry: String,
}

/// The GPUs a node config excludes. Excluded GPUs stay registered but are reported unhealthy.
///
/// ```
/// let ex: vgpu_core::node_config::ExcludeDevices = "0-1, 5..6, GPU-AbC".parse()?;
/// assert!(ex.contains(1, "GPU-x") && ex.contains(6, "") && !ex.contains(3, ""));
/// assert!(ex.contains(9, "gpu-abc"));
/// # Ok::<(), vgpu_core::node_config::InvalidExcludeEntry>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct ExcludeDevices {
    /// Inclusive index ranges (a single index `i` is `i..=i`).
    pub indices: Vec<RangeInclusive<u32>>,
    /// UUIDs, compared case-insensitively.
    pub uuids: Vec<String>,
}

impl ExcludeDevices {
    /// Nothing excluded.
    pub fn is_empty(&self) -> bool {
        self.indices.is_empty() && self.uuids.is_empty()
    }

    /// Whether the GPU with this index or UUID is excluded.
    pub fn contains(&self, index: u32, uuid: &str) -> bool {
        self.indices.iter().any(|r| r.contains(&index))
            || self.uuids.iter().any(|u| u.eq_ignore_ascii_case(uuid))
    }

    /// Adds one entry: `3`, `0..2`, `0-2` or a UUID. Blank entries are ignored. An entry holding commas (a
    /// list item such as `"GPU-a,GPU-b"` in a node config file) is read as the comma list it spells, as the
    /// string form is: no GPU UUID contains a comma, so keeping it whole would exclude nothing (upstream
    /// does that silently).
    pub fn push_entry(&mut self, entry: &str) -> Result<(), InvalidExcludeEntry> {
        if entry.contains(',') {
            return entry.split(',').try_for_each(|part| self.push_entry(part));
        }
        let e = entry.trim();
        if e.is_empty() {
            return Ok(());
        }
        let bad = || InvalidExcludeEntry { entry: entry.to_owned() };
        let numeric_like = e.starts_with(|c: char| c.is_ascii_digit())
            && e.chars().all(|c| c.is_ascii_digit() || c == '-' || c == '.');
        if !numeric_like {
            if e.starts_with('-') || e.contains("..") {
                return Err(bad());
            }
            self.uuids.push(e.to_owned());
            return Ok(());
        }
        if let Ok(i) = e.parse::<u32>() {
            self.indices.push(i..=i);
            return Ok(());
        }
        let (a, b) = e.split_once("..").or_else(|| e.split_once('-')).ok_or_else(bad)?;
        let (a, b) = (a.parse::<u32>().map_err(|_| bad())?, b.parse::<u32>().map_err(|_| bad())?);
        if a > b {
            return Err(bad());
        }
        self.indices.push(a..=b);
        Ok(())
    }
}

impl FromStr for ExcludeDevices {
    type Err = InvalidExcludeEntry;

    /// Parses a comma list (`"0,1,2"`, `"0..2,5..8"`, `"0-2"`, UUIDs).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut ex = ExcludeDevices::default();
        for entry in s.split(',') {
            ex.push_entry(entry)?;
        }
        Ok(ex)
    }
}

impl fmt::Display for ExcludeDevices {
    /// Canonical comma list (`0..2,5,GPU-…`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        let mut sep = |f: &mut fmt::Formatter<'_>| {
            if !std::mem::take(&mut first) { f.write_str(",") } else { Ok(()) }
        };
        for r in &self.indices {
            sep(f)?;
            if r.start() == r.end() {
                write!(f, "{}", r.start())?
            } else {
                write!(f, "{}..{}", r.start(), r.end())?
            }
        }
        for u in &self.uuids {
            sep(f)?;
            f.write_str(u)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_list_item_with_commas_is_the_list_it_spells() {
        let mut ex = ExcludeDevices::default();
        ex.push_entry("GPU-a, GPU-b,3").unwrap();
        assert_eq!(ex.uuids, ["GPU-a", "GPU-b"]);
        assert!(ex.contains(3, "") && ex.contains(0, "gpu-b"));
        assert_eq!(ex.to_string().parse::<ExcludeDevices>().unwrap(), ex);
        assert!(ExcludeDevices::default().push_entry("GPU-a,3..1").is_err());
    }

    #[test]
    fn forms() {
        let ex: ExcludeDevices = "0,1..2, 4-5,,GPU-49aa2e6a-33f3".parse().unwrap();
        assert_eq!(ex.indices, vec![0..=0, 1..=2, 4..=5]);
        assert_eq!(ex.uuids, vec!["GPU-49aa2e6a-33f3".to_owned()]);
        assert_eq!(ex.to_string(), "0,1..2,4..5,GPU-49aa2e6a-33f3");
        for bad in ["2..1", "1-", "1..x", "-1", "1-2-3", "99999999999"] {
            let e = bad.parse::<ExcludeDevices>().unwrap_err();
            assert_eq!(e.entry, bad);
        }
        assert!("".parse::<ExcludeDevices>().unwrap().is_empty());
    }

    proptest! {
        #[test]
        fn never_panics(s in ".*") {
            let _ = s.parse::<ExcludeDevices>();
        }

        #[test]
        fn display_round_trips(ranges in proptest::collection::vec((0u32..100, 0u32..5), 0..5),
                               uuids in proptest::collection::vec("GPU-[0-9a-f-]{1,12}", 0..3)) {
            let ex = ExcludeDevices { indices: ranges.into_iter().map(|(a, d)| a..=a + d).collect(), uuids };
            prop_assert_eq!(ex.to_string().parse::<ExcludeDevices>().unwrap(), ex);
        }
    }
}
