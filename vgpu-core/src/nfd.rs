//! node-feature-discovery (NFD) local feature files: the `features.d/` format that `nfd-worker`'s `local`
//! source reads (NFD v0.17.3, `source/local/local.go`), so GPU feature labels reach the Node through NFD
//! instead of a direct Node patch (`vgpu-device-plugin --gfd-output=nfd-feature-file`).
//!
//! | line | meaning (NFD v0.17.3) |
//! |---|---|
//! | `key=value` | a feature `key` with `value`; exposed as the label `key` (a key without a `/` prefix gets `feature.node.kubernetes.io/`) |
//! | `key` | the same with the value `true` |
//! | `# +expiry-time=<RFC 3339>` | the entries after it are ignored once that time has passed |
//! | `# +no-label`, `# +no-feature` | the next entry is not a label, resp. not a raw feature |
//! | `# anything else` | a comment |
//!
//! Lines are trimmed; a key ends at the first `=`. Files whose name starts with `.` are ignored by the
//! worker, and files over [`MAX_FEATURE_FILE_SIZE`] bytes are refused. [`write()`] replaces the file
//! atomically through a hidden temporary sibling ([`crate::abi::atomic::write_atomic`]: temporary file,
//! `fsync`, `rename`), so the worker never reads a half-written file. An expiry makes the labels vanish
//! when the writer dies without removing its file.
//!
//! ```
//! use std::collections::BTreeMap;
//! use vgpu_core::nfd::{self, FeatureFile};
//!
//! let file = FeatureFile {
//!     labels: BTreeMap::from([("nvidia.com/gpu.count".to_owned(), "2".to_owned())]),
//!     expiry: Some(1_800_000_000),
//! };
//! let text = nfd::encode(&file)?;
//! assert!(text.contains("# +expiry-time=2027-01-15T08:00:00Z\nnvidia.com/gpu.count=2\n"));
//! let parsed = nfd::parse("features.d/gfd", &text)?;
//! assert_eq!(parsed.labels(1_700_000_000), file.labels);
//! assert!(parsed.labels(1_900_000_000).is_empty()); // expired
//!
//! // Errors name the input and the line.
//! let err = nfd::parse("features.d/gfd", "# +expiry-time=tomorrow\n").unwrap_err();
//! assert!(err.to_string().starts_with("features.d/gfd:1: "), "{err}");
//! # Ok::<(), nfd::NfdError>(())
//! ```

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

/// Where the GPU feature discovery writes its feature file for NFD (the path gpu-feature-discovery uses).
pub const DEFAULT_FEATURE_FILE: &str = "/etc/kubernetes/node-feature-discovery/features.d/gfd";

/// The largest feature file `nfd-worker` reads (`MaxFeatureFileSize`), bytes.
pub const MAX_FEATURE_FILE_SIZE: usize = 65536;

/// The directive prefix: a comment line starting with it is a directive.
pub const DIRECTIVE_PREFIX: &str = "# +";

/// The latest expiry [`encode`] can write: 9999-12-31T23:59:59Z, Unix seconds.
pub const MAX_EXPIRY: i64 = 253_402_300_799;

/// A feature file as we write it: labels, all with the same optional expiry.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FeatureFile {
    /// Label key → value (keys with their prefix, e.g. `nvidia.com/gpu.product`).
    pub labels: BTreeMap<String, String>,
    /// Unix seconds after which NFD ignores the labels (`# +expiry-time=`); `None`: never.
    pub expiry: Option<i64>,
}

/// One entry of a parsed feature file, with the directives in force on its line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The feature key.
    pub key: String,
    /// Its value (`true` for a line without `=`).
    pub value: String,
    /// The last `# +expiry-time=` before it, Unix seconds.
    pub expiry: Option<i64>,
    /// `# +no-label` stood right before it.
    pub no_label: bool,
    /// `# +no-feature` stood right before it.
    pub no_feature: bool,
}

/// A parsed feature file: its entries in file order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ParsedFile {
    /// The entries, in order (a later duplicate key overrides an earlier one, as in NFD).
    pub entries: Vec<Entry>,
}

impl ParsedFile {
    /// The labels `nfd-worker` takes from this file at `now` (Unix seconds): entries not expired and not
    /// `no-label`, a later duplicate overriding an earlier one. An entry expiring exactly at `now` is kept
    /// (NFD drops an entry only when its expiry is before now).
    pub fn labels(&self, now: i64) -> BTreeMap<String, String> {
        let mut labels = BTreeMap::new();
        for e in &self.entries {
            if e.expiry.is_some_and(|t| t < now) {
                continue;
            }
            if e.no_label {
                labels.remove(&e.key);
            } else {
                labels.insert(e.key.clone(), e.value.clone());
            }
        }
        labels
    }
}

/// A feature file could not be encoded, parsed, read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NfdError {
    /// A label key is not a Kubernetes label key (`[prefix/]name`).
    #[error("label key {key:?}: {reason}")]
    InvalidKey {
        /// The key.
        key: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// A label value is not a Kubernetes label value.
    #[error("label {key:?}: value {value:?}: {reason}")]
    InvalidValue {
        /// The key.
        key: String,
        /// The value.
        value: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// The expiry is outside what RFC 3339 can write (years 0000–9999).
    #[error("expiry {0} (Unix seconds) is outside 0000-01-01..9999-12-31")]
    ExpiryOutOfRange(i64),
    /// The file is larger than `nfd-worker` reads.
    #[error("{input}: {size} bytes, more than the 65536 nfd-worker reads")]
    TooLarge {
        /// The file (or the name given to [`parse`]).
        input: String,
        /// Its size.
        size: usize,
    },
    /// A line is not valid.
    #[error("{input}:{line}: {message}")]
    Syntax {
        /// The file (or the name given to [`parse`]).
        input: String,
        /// The line number, from 1.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// Reading or removing the file failed.
    #[error("{}: {action}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What was being done.
        action: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Writing the file failed (the previous content is untouched).
    #[error("writing the feature file {}: {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// The atomic write's error.
        #[source]
        source: crate::abi::AbiError,
    },
}

/// Whether `s` is a label name segment: 1–63 of `[A-Za-z0-9._-]`, alphanumeric at both ends.
fn is_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter().all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'))
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
}

/// Whether `s` is a DNS subdomain (the prefix of a label key): at most 253 characters, dot-separated
/// lower-case labels of `[a-z0-9-]`, alphanumeric at both ends.
fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|part| {
            let b = part.as_bytes();
            !b.is_empty()
                && b.len() <= 63
                && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
                && b[0] != b'-'
                && b[b.len() - 1] != b'-'
        })
}

/// Checks a label key (`[prefix/]name`, the Kubernetes rule).
pub fn validate_key(key: &str) -> Result<(), NfdError> {
    let invalid = |reason| Err(NfdError::InvalidKey { key: key.to_owned(), reason });
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix
        && !is_dns_subdomain(p)
    {
        return invalid("the prefix must be a DNS subdomain (lower-case, at most 253 characters)");
    }
    if !is_name(name) {
        return invalid("the name must be 1-63 of [A-Za-z0-9._-], alphanumeric at both ends");
    }
    Ok(())
}

/// Checks a label value (empty, or 1–63 of `[A-Za-z0-9._-]`, alphanumeric at both ends).
pub fn validate_value(key: &str, value: &str) -> Result<(), NfdError> {
    if value.is_empty() || is_name(value) {
        return Ok(());
    }
    Err(NfdError::InvalidValue {
        key: key.to_owned(),
        value: value.to_owned(),
        reason: "expected empty or 1-63 of [A-Za-z0-9._-], alphanumeric at both ends",
    })
}

/// The feature file text of `file`: a comment naming the writer, the expiry directive when set, then one
/// `key=value` line per label in key order. Fails on a key or value that is not a label key/value, an
/// expiry out of range, or a result over [`MAX_FEATURE_FILE_SIZE`].
pub fn encode(file: &FeatureFile) -> Result<String, NfdError> {
    let mut out = String::from("# GPU feature labels for node-feature-discovery, written by vgpu.\n");
    if let Some(expiry) = file.expiry {
        out.push_str(DIRECTIVE_PREFIX);
        out.push_str("expiry-time=");
        out.push_str(&format_rfc3339(expiry).ok_or(NfdError::ExpiryOutOfRange(expiry))?);
        out.push('\n');
    }
    for (key, value) in &file.labels {
        validate_key(key)?;
        validate_value(key, value)?;
        out.push_str(key);
        out.push('=');
        out.push_str(value);
        out.push('\n');
    }
    if out.len() > MAX_FEATURE_FILE_SIZE {
        return Err(NfdError::TooLarge { input: "the encoded feature file".to_owned(), size: out.len() });
    }
    Ok(out)
}

/// Parses a feature file; `input` names it in errors (a path, or e.g. `features.d/gfd`). Strict where
/// `nfd-worker` only logs and goes on: an unknown directive, an unreadable expiry, an empty key or a file
/// over [`MAX_FEATURE_FILE_SIZE`] are errors.
pub fn parse(input: &str, text: &str) -> Result<ParsedFile, NfdError> {
    if text.len() > MAX_FEATURE_FILE_SIZE {
        return Err(NfdError::TooLarge { input: input.to_owned(), size: text.len() });
    }
    let syntax = |line: usize, message: String| NfdError::Syntax { input: input.to_owned(), line, message };
    let mut parsed = ParsedFile::default();
    let (mut expiry, mut no_label, mut no_feature) = (None, false, false);
    for (i, raw) in text.split('\n').enumerate() {
        let line = raw.trim();
        if line.is_empty() {
            continue;
        }
        if let Some(directive) = line.strip_prefix(DIRECTIVE_PREFIX) {
            let (name, value) = match directive.split_once('=') {
                Some((n, v)) => (n, Some(v)),
                None => (directive, None),
            };
            match (name, value) {
                ("expiry-time", Some(v)) => {
                    let t = parse_rfc3339(v.trim()).ok_or_else(|| {
                        syntax(
                            i + 1,
                            format!("expiry-time {v:?} is not an RFC 3339 time (2006-01-02T15:04:05Z07:00)"),
                        )
                    })?;
                    expiry = Some(t);
                }
                ("expiry-time", None) => {
                    return Err(syntax(i + 1, "expected '# +expiry-time=<RFC 3339 time>'".to_owned()));
                }
                ("no-label", _) => no_label = true,
                ("no-feature", _) => no_feature = true,
                _ => {
                    return Err(syntax(
                        i + 1,
                        format!("unknown directive {name:?} (expected expiry-time, no-label or no-feature)"),
                    ));
                }
            }
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        let (key, value) = match line.split_once('=') {
            Some((k, v)) => (k, v),
            None => (line, "true"),
        };
        if key.is_empty() {
            return Err(syntax(i + 1, format!("{line:?} has an empty key")));
        }
        parsed.entries.push(Entry {
            key: key.to_owned(),
            value: value.to_owned(),
            expiry,
            no_label: std::mem::take(&mut no_label),
            no_feature: std::mem::take(&mut no_feature),
        });
    }
    Ok(parsed)
}

/// Reads and parses the feature file at `path`.
pub fn read(path: &Path) -> Result<ParsedFile, NfdError> {
    let text = std::fs::read_to_string(path).map_err(|source| NfdError::Io {
        path: path.to_path_buf(),
        action: "read",
        source,
    })?;
    parse(&path.display().to_string(), &text)
}

/// Writes `file` to `path` atomically (mode 0644); the directory must exist.
pub fn write(path: &Path, file: &FeatureFile) -> Result<(), NfdError> {
    let text = encode(file)?;
    crate::abi::atomic::write_atomic(path, text.as_bytes(), 0o644)
        .map_err(|source| NfdError::Write { path: path.to_path_buf(), source })
}

/// Removes the feature file (its labels leave the Node at NFD's next pass); a missing file is no error.
pub fn remove(path: &Path) -> Result<(), NfdError> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(NfdError::Io { path: path.to_path_buf(), action: "remove", source }),
    }
}

/// Days since 1970-01-01 of a civil date (Howard Hinnant's `days_from_civil`).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The civil date of a day count since 1970-01-01 (`civil_from_days`).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// Unix seconds as RFC 3339 in UTC (`2027-01-15T08:00:00Z`); `None` outside years 0000–9999.
pub fn format_rfc3339(secs: i64) -> Option<String> {
    if !(-62_167_219_200..=MAX_EXPIRY).contains(&secs) {
        return None;
    }
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    Some(format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", rem / 3600, rem / 60 % 60, rem % 60))
}

/// Parses RFC 3339 as Go's `time.Parse(time.RFC3339, ..)` accepts it (`Z` or `±hh:mm`, optional
/// fractional seconds, which are dropped) into Unix seconds.
pub fn parse_rfc3339(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let part = b.get(r)?;
        if part.iter().all(u8::is_ascii_digit) { std::str::from_utf8(part).ok()?.parse().ok() } else { None }
    };
    if b.len() < 20
        || b[4] != b'-'
        || b[7] != b'-'
        || !matches!(b[10], b'T' | b't')
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    let (y, mo, d, h, mi, sec) =
        (num(0..4)?, num(5..7)?, num(8..10)?, num(11..13)?, num(14..16)?, num(17..19)?);
    let mut i = 19;
    if b[i] == b'.' {
        i += 1;
        let start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        if i == start {
            return None;
        }
    }
    let offset = match b.get(i..)? {
        [b'Z' | b'z'] => 0,
        [sign @ (b'+' | b'-'), ..] if b.len() == i + 6 && b[i + 3] == b':' => {
            let (oh, om) = (num(i + 1..i + 3)?, num(i + 4..i + 6)?);
            if oh > 23 || om > 59 {
                return None;
            }
            let o = oh * 3600 + om * 60;
            if *sign == b'+' { o } else { -o }
        }
        _ => return None,
    };
    let leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    let month_days = [31, if leap { 29 } else { 28 }, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31];
    let max_day = *month_days.get(usize::try_from(mo).ok()?.checked_sub(1)?)?;
    if d < 1 || d > max_day || h > 23 || mi > 59 || sec > 59 {
        return None;
    }
    Some(days_from_civil(y, mo, d) * 86_400 + h * 3600 + mi * 60 + sec - offset)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn reads_nfd_s_own_example() {
        // The feature file of NFD's documentation (docs/reference/feature-file.md style).
        let text = "# +expiry-time=2012-07-28T11:22:33Z\nfeature.node.kubernetes.io/my-feature.1\nmy-feature.2=myvalue\n\
                    # +no-label\nmy-feature.3=hidden\n# a comment\n  vendor.io/x = y \n";
        let parsed = parse("f", text).unwrap();
        assert_eq!(parsed.entries.len(), 4);
        assert_eq!(parsed.entries[0].value, "true");
        assert!(parsed.entries[2].no_label && !parsed.entries[3].no_label);
        let t = parse_rfc3339("2012-07-28T11:22:33Z").unwrap();
        assert_eq!(parsed.entries[0].expiry, Some(t));
        let labels = parsed.labels(t);
        assert_eq!(labels.get("my-feature.2").map(String::as_str), Some("myvalue"));
        assert!(!labels.contains_key("my-feature.3"));
        // Only the line is trimmed; the key ends at '='.
        assert_eq!(labels.get("vendor.io/x ").map(String::as_str), Some(" y"));
        assert!(parsed.labels(t + 1).is_empty());
    }

    #[test]
    fn errors_name_input_and_line() {
        let err = parse("/etc/f", "a=1\n# +expire=2020-01-01T00:00:00Z\n").unwrap_err();
        assert_eq!(
            err.to_string(),
            "/etc/f:2: unknown directive \"expire\" (expected expiry-time, no-label or no-feature)"
        );
        let err = parse("/etc/f", "=1\n").unwrap_err();
        assert!(err.to_string().starts_with("/etc/f:1: "), "{err}");
        let err = parse("/etc/f", "# +expiry-time\n").unwrap_err();
        assert!(matches!(err, NfdError::Syntax { line: 1, .. }), "{err}");
        let big = "a=b\n".repeat(MAX_FEATURE_FILE_SIZE / 4 + 1);
        assert!(matches!(parse("/etc/f", &big), Err(NfdError::TooLarge { .. })));
    }

    #[test]
    fn encode_refuses_what_nfd_would_misread() {
        for key in ["", "a b", "a=b", "#x", "Upper.Case/x", "x/", "nvidia.com/-x", "a\nb"] {
            let file =
                FeatureFile { labels: BTreeMap::from([(key.to_owned(), "v".to_owned())]), expiry: None };
            assert!(matches!(encode(&file), Err(NfdError::InvalidKey { .. })), "{key:?}");
        }
        for value in ["a b", "x\ny", "-x", "a=b", &"x".repeat(64)] {
            let file =
                FeatureFile { labels: BTreeMap::from([("k".to_owned(), value.to_owned())]), expiry: None };
            assert!(matches!(encode(&file), Err(NfdError::InvalidValue { .. })), "{value:?}");
        }
        let file = FeatureFile { labels: BTreeMap::new(), expiry: Some(MAX_EXPIRY + 1) };
        assert!(matches!(encode(&file), Err(NfdError::ExpiryOutOfRange(_))));
    }

    #[test]
    fn rfc3339_forms_go_accepts() {
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(parse_rfc3339("1970-01-01T01:00:00+01:00"), Some(0));
        assert_eq!(parse_rfc3339("1969-12-31T23:00:00.999-01:00"), Some(0));
        assert_eq!(parse_rfc3339("2024-02-29T00:00:00Z"), Some(1_709_164_800));
        for bad in [
            "2023-02-29T00:00:00Z",
            "2024-01-01 00:00:00Z",
            "2024-01-01T24:00:00Z",
            "2024-01-01T00:00:00",
            "2024-01-01T00:00:00.Z",
            "x",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
        assert_eq!(format_rfc3339(MAX_EXPIRY).as_deref(), Some("9999-12-31T23:59:59Z"));
        assert_eq!(format_rfc3339(-1).as_deref(), Some("1969-12-31T23:59:59Z"));
    }

    #[test]
    fn write_replaces_atomically_and_remove_is_idempotent() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gfd");
        let mut file = FeatureFile { labels: BTreeMap::from([("a".into(), "1".into())]), expiry: None };
        write(&path, &file).unwrap();
        file.labels.insert("nvidia.com/gpu.count".into(), "2".into());
        write(&path, &file).unwrap();
        assert_eq!(read(&path).unwrap().labels(0), file.labels);
        // Only the file itself: the temporary was renamed over it.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        remove(&path).unwrap();
        remove(&path).unwrap();
        let err = read(&path).unwrap_err();
        assert!(err.to_string().contains(&path.display().to_string()), "{err}");
        let err = write(&dir.path().join("missing/gfd"), &file).unwrap_err();
        assert!(matches!(err, NfdError::Write { .. }) && err.to_string().contains("missing"), "{err}");
    }

    fn label_name() -> impl Strategy<Value = String> {
        "[A-Za-z0-9]([A-Za-z0-9._-]{0,20}[A-Za-z0-9])?"
    }

    fn label_key() -> impl Strategy<Value = String> {
        (proptest::option::of("[a-z0-9]([a-z0-9-]{0,8}[a-z0-9])?(\\.[a-z0-9]{1,5}){0,2}"), label_name())
            .prop_map(|(p, n)| p.map_or(n.clone(), |p| format!("{p}/{n}")))
    }

    proptest! {
        #[test]
        fn round_trip(
            labels in proptest::collection::btree_map(label_key(), proptest::option::of(label_name()), 0..20),
            expiry in proptest::option::of(-62_167_219_200i64..=MAX_EXPIRY),
        ) {
            let labels: BTreeMap<String, String> =
                labels.into_iter().map(|(k, v)| (k, v.unwrap_or_default())).collect();
            let file = FeatureFile { labels, expiry };
            let text = encode(&file).unwrap();
            let parsed = parse("prop", &text).unwrap();
            prop_assert_eq!(parsed.entries.len(), file.labels.len());
            prop_assert!(parsed.entries.iter().all(|e| e.expiry == expiry && !e.no_label && !e.no_feature));
            let now = expiry.unwrap_or(0);
            prop_assert_eq!(parsed.labels(now), file.labels.clone());
            if let Some(t) = expiry {
                prop_assert!(parsed.labels(t + 1).is_empty());
            }
        }

        #[test]
        fn rfc3339_round_trip(secs in -62_167_219_200i64..=MAX_EXPIRY) {
            let text = format_rfc3339(secs).unwrap();
            prop_assert_eq!(parse_rfc3339(&text), Some(secs));
        }

        #[test]
        fn parse_never_panics(text in "(# \\+[a-z-]{0,12}=?[0-9TZ:.+-]{0,25}|[ #=a-z./]{0,20}|)(\n[ #=+a-z0-9./-]{0,30}){0,6}") {
            let _ = parse("prop", &text);
        }
    }
}
