//! Bounded reading of every input `vgpuctl` takes (files, stdin, inline values).
//!
//! Each input has a size cap: [`ANNOTATION_CAP`] (256 KiB) for annotation values (`decode`, `topology
//! --topology`), [`DOCUMENT_CAP`] (4 MiB) for configuration documents (`gates render --values`, `devices
//! --mock-config`); `--max-bytes N` replaces the cap of every input of one invocation. At most `cap + 1`
//! bytes are ever read: a regular file (or a regular file redirected to stdin) whose size is over the cap is
//! refused from its metadata before any read; pipes, FIFOs and device files are read through a `cap + 1`
//! byte window, so a 52 MB file or an endless `/dev/zero` costs at most the cap in memory. The text must
//! then be UTF-8; the error names the byte offset of the first invalid byte.
//!
//! Every failure here is an input error: the subcommands exit 2 on it.

use std::fmt;
use std::fs::File;
use std::io::{self, Read, Seek};
use std::os::fd::AsFd;
use std::path::Path;

/// Cap of an annotation value: Kubernetes refuses an object whose annotations total more than 256 KiB, so no
/// single annotation value (`node-device-register`, `node-config-info`, `node-device-topology`,
/// `pre-allocated`, `real-allocated`) can be larger.
pub const ANNOTATION_CAP: u64 = 256 * 1024;

/// Cap of a configuration document (a Helm values file, a mock node description): such a file is not stored in
/// an annotation, and a whole chart's values file may be larger than 256 KiB; 4 MiB is far above any real
/// one and still bounds the parser's memory.
pub const DOCUMENT_CAP: u64 = 4 * 1024 * 1024;

/// Largest `--max-bytes` accepted (1 GiB): the cap is memory the tool may spend on one input.
pub const MAX_CAP: u64 = 1 << 30;

/// An input, as error messages name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputName(String);

impl InputName {
    /// A file: `{what} {path}`, e.g. `topology file /tmp/t.json`.
    pub fn file(what: &str, path: &Path) -> Self {
        Self(format!("{what} {}", path.display()))
    }

    /// Standard input carrying `what`, e.g. `stdin (node-devices value)`.
    pub fn stdin(what: &str) -> Self {
        Self(format!("stdin ({what})"))
    }

    /// A value given on the command line, e.g. `the node-devices value argument`.
    pub fn argument(what: &str) -> Self {
        Self(format!("the {what} argument"))
    }
}

impl fmt::Display for InputName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// How large an over-cap input is known to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Size {
    /// Its exact size (from the file's metadata, or an inline value's length).
    Exact(u64),
    /// At least this many bytes: reading stopped there (a pipe or device file).
    AtLeast(u64),
}

/// Why an input was refused.
#[derive(Debug)]
pub enum InputError {
    /// It could not be opened or read.
    Io {
        /// The input.
        input: InputName,
        /// The I/O error.
        source: io::Error,
    },
    /// It is larger than its cap.
    TooLarge {
        /// The input.
        input: InputName,
        /// Its size.
        size: Size,
        /// The cap in bytes.
        cap: u64,
    },
    /// It is not UTF-8.
    NotUtf8 {
        /// The input.
        input: InputName,
        /// Offset of the first byte that is not part of a valid UTF-8 sequence.
        offset: usize,
        /// That byte, or `None` when the input ends inside a sequence.
        byte: Option<u8>,
    },
}

impl fmt::Display for InputError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Io { input, source } => write!(f, "cannot read {input}: {source}"),
            Self::TooLarge { input, size, cap } => {
                let cap_text = match human(*cap) {
                    h if h.ends_with(" bytes") => format!("{cap} bytes"),
                    h => format!("{cap} bytes ({h})"),
                };
                match size {
                    Size::Exact(n) => write!(f, "{input} is {n} bytes, over the cap of {cap_text}")?,
                    Size::AtLeast(n) => write!(
                        f,
                        "{input} is larger than the cap of {cap_text}: reading stopped after {n} bytes"
                    )?,
                }
                f.write_str("; raise the cap with --max-bytes N")
            }
            Self::NotUtf8 { input, offset, byte: Some(b) } => {
                write!(f, "{input} is not valid UTF-8: byte 0x{b:02x} at byte offset {offset}")
            }
            Self::NotUtf8 { input, offset, byte: None } => {
                write!(
                    f,
                    "{input} is not valid UTF-8: it ends inside a multi-byte sequence at byte offset {offset}"
                )
            }
        }
    }
}

impl std::error::Error for InputError {}

/// `262144` → `256 KiB`, `4194304` → `4 MiB`, otherwise `N bytes`.
fn human(bytes: u64) -> String {
    const KIB: u64 = 1024;
    for (unit, size) in [("GiB", KIB * KIB * KIB), ("MiB", KIB * KIB), ("KiB", KIB)] {
        if bytes >= size && bytes.is_multiple_of(size) {
            return format!("{} {unit}", bytes / size);
        }
    }
    format!("{bytes} bytes")
}

/// Parses `--max-bytes`: a byte count, optionally with a binary suffix (`Ki`, `KiB`, `Mi`, `MiB`, `Gi`,
/// `GiB`, case-insensitive), between 1 and [`MAX_CAP`].
pub fn parse_max_bytes(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (number, suffix) = t.split_at(digits);
    let expected = "expected a byte count like 524288, 512KiB or 4MiB";
    let number: u64 = number.parse().map_err(|_| format!("{text:?} is not a size ({expected})"))?;
    let unit: u64 = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "ki" | "kib" => 1 << 10,
        "mi" | "mib" => 1 << 20,
        "gi" | "gib" => 1 << 30,
        _ => return Err(format!("{text:?} has an unknown unit ({expected})")),
    };
    match number.checked_mul(unit) {
        Some(0) => Err(format!("{text:?}: the cap must be at least 1 byte")),
        Some(n) if n <= MAX_CAP => Ok(n),
        _ => Err(format!("{text:?} is over the largest cap, {MAX_CAP} bytes (1 GiB)")),
    }
}

/// The cap of one input: `--max-bytes` if given, else the input's default.
pub fn cap(max_bytes: Option<u64>, default: u64) -> u64 {
    max_bytes.unwrap_or(default)
}

/// Reads the file at `path` (named `what` in errors) if it holds at most `cap` bytes of UTF-8.
pub fn read_file(what: &str, path: &Path, cap: u64) -> Result<String, InputError> {
    let input = InputName::file(what, path);
    let file = match File::open(path) {
        Ok(f) => f,
        Err(source) => return Err(InputError::Io { input, source }),
    };
    let remaining = match file.metadata() {
        Ok(m) if m.is_file() => Some(m.len()),
        Ok(_) => None,
        Err(source) => return Err(InputError::Io { input, source }),
    };
    read_bounded(file, input, remaining, cap)
}

/// Reads standard input (carrying `what`) if it holds at most `cap` bytes of UTF-8.
pub fn read_stdin(what: &str, cap: u64) -> Result<String, InputError> {
    let input = InputName::stdin(what);
    let stdin = io::stdin();
    let remaining = stdin_remaining(&stdin);
    read_bounded(stdin.lock(), input, remaining, cap)
}

/// A value given inline on the command line: the same cap as on stdin (the argument is UTF-8 already).
pub fn check_argument(what: &str, value: &str, cap: u64) -> Result<(), InputError> {
    let len = value.len() as u64;
    if len > cap {
        return Err(InputError::TooLarge { input: InputName::argument(what), size: Size::Exact(len), cap });
    }
    Ok(())
}

/// What is left to read on stdin when it is a regular file (`< file`); `None` for pipes and terminals.
fn stdin_remaining(stdin: &io::Stdin) -> Option<u64> {
    // A duplicate of fd 0 shares its offset; `stream_position` only asks for it (lseek SEEK_CUR).
    let mut dup = File::from(stdin.as_fd().try_clone_to_owned().ok()?);
    let meta = dup.metadata().ok()?;
    if !meta.is_file() {
        return None;
    }
    let position = dup.stream_position().ok()?;
    Some(meta.len().saturating_sub(position))
}

/// Reads at most `cap + 1` bytes from `reader`; refuses more than `cap` and non-UTF-8 text.
///
/// `known_size` (a regular file's size) lets an over-cap input be refused before any read, with its size.
pub fn read_bounded(
    reader: impl Read,
    input: InputName,
    known_size: Option<u64>,
    cap: u64,
) -> Result<String, InputError> {
    if let Some(size) = known_size.filter(|&n| n > cap) {
        return Err(InputError::TooLarge { input, size: Size::Exact(size), cap });
    }
    let window = cap.saturating_add(1);
    // Reserve what a regular file announces (never more than the cap); grow as read otherwise.
    let reserve = known_size.map_or(8 * 1024, |n| n.saturating_add(1)).min(window);
    let mut buf = Vec::with_capacity(usize::try_from(reserve).unwrap_or(0));
    if let Err(source) = reader.take(window).read_to_end(&mut buf) {
        return Err(InputError::Io { input, source });
    }
    let read = buf.len() as u64;
    if read > cap {
        return Err(InputError::TooLarge { input, size: Size::AtLeast(read), cap });
    }
    String::from_utf8(buf).map_err(|e| {
        let err = e.utf8_error();
        let offset = err.valid_up_to();
        let byte = err.error_len().and_then(|_| e.as_bytes().get(offset).copied());
        InputError::NotUtf8 { input, offset, byte }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(bytes: &[u8], known: Option<u64>, cap: u64) -> Result<String, String> {
        read_bounded(bytes, InputName::stdin("test value"), known, cap).map_err(|e| e.to_string())
    }

    #[test]
    fn caps_and_utf8() {
        assert_eq!(read(b"abc", None, 3).unwrap(), "abc");
        assert_eq!(read(b"", None, 1).unwrap(), "");
        assert_eq!(
            read(b"abcd", None, 3).unwrap_err(),
            "stdin (test value) is larger than the cap of 3 bytes: reading stopped after 4 bytes; \
             raise the cap with --max-bytes N"
        );
        assert_eq!(
            read(b"", Some(300_000), ANNOTATION_CAP).unwrap_err(),
            "stdin (test value) is 300000 bytes, over the cap of 262144 bytes (256 KiB); \
             raise the cap with --max-bytes N"
        );
        assert_eq!(
            read(b"ab\xffcd", None, 10).unwrap_err(),
            "stdin (test value) is not valid UTF-8: byte 0xff at byte offset 2"
        );
        assert_eq!(
            read("é".as_bytes().get(..1).unwrap(), None, 10).unwrap_err(),
            "stdin (test value) is not valid UTF-8: it ends inside a multi-byte sequence at byte offset 0"
        );
    }

    #[test]
    fn endless_input_stops_after_the_window() {
        let mut zeros = io::repeat(b'0');
        let err = read_bounded(&mut zeros, InputName::stdin("x"), None, 1024).unwrap_err();
        assert!(matches!(err, InputError::TooLarge { size: Size::AtLeast(1025), cap: 1024, .. }), "{err}");
    }

    #[test]
    fn max_bytes_forms() {
        assert_eq!(parse_max_bytes("524288"), Ok(524_288));
        assert_eq!(parse_max_bytes("512KiB"), Ok(512 * 1024));
        assert_eq!(parse_max_bytes("4mi"), Ok(4 << 20));
        assert_eq!(parse_max_bytes("1GiB"), Ok(MAX_CAP));
        assert!(parse_max_bytes("0").unwrap_err().contains("at least 1 byte"));
        assert!(parse_max_bytes("2GiB").unwrap_err().contains("largest cap"));
        assert!(parse_max_bytes("4MB").unwrap_err().contains("unknown unit"));
        assert!(parse_max_bytes("-1").unwrap_err().contains("not a size"));
        assert!(parse_max_bytes("99999999999999999999").unwrap_err().contains("not a size"));
        assert_eq!(human(ANNOTATION_CAP), "256 KiB");
        assert_eq!(human(DOCUMENT_CAP), "4 MiB");
        assert_eq!(human(1000), "1000 bytes");
    }
}
