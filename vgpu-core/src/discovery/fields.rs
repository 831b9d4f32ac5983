//! Parsers for single-value sysfs attribute files (`vendor`, `class`, `numa_node`, ...).
//!
//! The kernel writes these as one line: hexadecimal ids with a `0x` prefix (`0x10de\n`), the class as a
//! 24-bit hexadecimal code (`0x030200\n`) and the NUMA node as a signed decimal (`-1\n` when the platform has no
//! NUMA information). The parsers accept surrounding whitespace and an optional `0x`/`0X` prefix, and reject
//! everything else with a [`FieldError`]; they never panic.

use std::num::IntErrorKind;

/// Why a sysfs attribute value could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FieldError {
    /// The file held nothing but whitespace.
    #[error("the value is empty")]
    Empty,
    /// A character outside the expected alphabet was found.
    #[error("{found:?} is not {expected}")]
    Invalid {
        /// What the value should look like, e.g. "a hexadecimal number of at most 4 digits".
        expected: &'static str,
        /// The offending value, trimmed and shortened to at most 64 characters.
        found: String,
    },
    /// The number does not fit the field.
    #[error("{found:?} is out of range for {expected}")]
    OutOfRange {
        /// What the value should look like.
        expected: &'static str,
        /// The offending value, trimmed and shortened to at most 64 characters.
        found: String,
    },
}

/// What a 16-bit PCI id file (`vendor`, `device`, `subsystem_*`) must hold.
pub const EXPECTED_ID: &str = "a hexadecimal 16-bit id such as 0x10de";
/// What a PCI `class` file must hold.
pub const EXPECTED_CLASS: &str = "a hexadecimal 24-bit class code such as 0x030200";
/// What a `numa_node` file must hold.
pub const EXPECTED_NUMA: &str = "a NUMA node number or -1";

/// Shortens `raw` (trimmed) to at most 64 characters for error messages.
pub(crate) fn excerpt(raw: &str) -> String {
    let trimmed = raw.trim();
    let mut out: String = trimmed.chars().take(64).collect();
    if trimmed.chars().nth(64).is_some() {
        out.push('…');
    }
    out
}

/// Parses a hexadecimal value of at most `max_digits` digits (after an optional `0x` prefix).
fn parse_hex(raw: &str, max_digits: usize, expected: &'static str) -> Result<u32, FieldError> {
    let value = raw.trim();
    if value.is_empty() {
        return Err(FieldError::Empty);
    }
    let digits = value.strip_prefix("0x").or_else(|| value.strip_prefix("0X")).unwrap_or(value);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(FieldError::Invalid { expected, found: excerpt(raw) });
    }
    let significant = digits.trim_start_matches('0');
    if significant.len() > max_digits {
        return Err(FieldError::OutOfRange { expected, found: excerpt(raw) });
    }
    if significant.is_empty() {
        return Ok(0);
    }
    u32::from_str_radix(significant, 16).map_err(|_| FieldError::OutOfRange { expected, found: excerpt(raw) })
}

/// Parses a 16-bit PCI id as written in sysfs `vendor`, `device`, `subsystem_vendor` and `subsystem_device`.
///
/// ```
/// use vgpu_core::discovery::fields::parse_pci_id;
/// assert_eq!(parse_pci_id("0x10de\n"), Ok(0x10de));
/// assert!(parse_pci_id("nvidia").is_err());
/// ```
pub fn parse_pci_id(raw: &str) -> Result<u16, FieldError> {
    let value = parse_hex(raw, 4, EXPECTED_ID)?;
    u16::try_from(value).map_err(|_| FieldError::OutOfRange { expected: EXPECTED_ID, found: excerpt(raw) })
}

/// Parses the 24-bit PCI class code written in sysfs `class` (`0xCCSSPP`: base class, subclass, prog-if).
///
/// ```
/// use vgpu_core::discovery::fields::parse_class_code;
/// assert_eq!(parse_class_code("0x030200\n"), Ok(0x030200));
/// ```
pub fn parse_class_code(raw: &str) -> Result<u32, FieldError> {
    parse_hex(raw, 6, EXPECTED_CLASS)
}

/// Parses sysfs `numa_node`: a non-negative node number, or `-1` (no NUMA affinity, returned as `None`).
///
/// ```
/// use vgpu_core::discovery::fields::parse_numa_node;
/// assert_eq!(parse_numa_node("1\n"), Ok(Some(1)));
/// assert_eq!(parse_numa_node("-1\n"), Ok(None));
/// ```
pub fn parse_numa_node(raw: &str) -> Result<Option<u32>, FieldError> {
    let value = raw.trim();
    if value.is_empty() {
        return Err(FieldError::Empty);
    }
    if value == "-1" {
        return Ok(None);
    }
    match value.parse::<u32>() {
        Ok(node) => Ok(Some(node)),
        Err(err) => match err.kind() {
            IntErrorKind::PosOverflow => {
                Err(FieldError::OutOfRange { expected: EXPECTED_NUMA, found: excerpt(raw) })
            }
            _ => Err(FieldError::Invalid { expected: EXPECTED_NUMA, found: excerpt(raw) }),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn ids() {
        assert_eq!(parse_pci_id("0x10de\n"), Ok(0x10de));
        assert_eq!(parse_pci_id("  0X9999 "), Ok(0x9999));
        assert_eq!(parse_pci_id("10DE"), Ok(0x10de));
        assert_eq!(parse_pci_id("0x0000ffff"), Ok(0xffff));
        assert_eq!(parse_pci_id(""), Err(FieldError::Empty));
        assert_eq!(parse_pci_id(" \n"), Err(FieldError::Empty));
        assert!(matches!(parse_pci_id("0x"), Err(FieldError::Invalid { .. })));
        assert!(matches!(parse_pci_id("0xzz"), Err(FieldError::Invalid { .. })));
        assert!(matches!(parse_pci_id("+10de"), Err(FieldError::Invalid { .. })));
        assert!(matches!(parse_pci_id("0x10de0"), Err(FieldError::OutOfRange { .. })));
    }

    #[test]
    fn classes() {
        assert_eq!(parse_class_code("0x030000"), Ok(0x030000));
        assert_eq!(parse_class_code("0x0"), Ok(0));
        assert!(matches!(parse_class_code("0x1030000"), Err(FieldError::OutOfRange { .. })));
        assert_eq!(parse_class_code(""), Err(FieldError::Empty));
    }

    #[test]
    fn numa() {
        assert_eq!(parse_numa_node("0"), Ok(Some(0)));
        assert_eq!(parse_numa_node("-1\n"), Ok(None));
        assert!(matches!(parse_numa_node("-2"), Err(FieldError::Invalid { .. })));
        assert!(matches!(parse_numa_node("abc"), Err(FieldError::Invalid { .. })));
        assert!(matches!(parse_numa_node("99999999999"), Err(FieldError::OutOfRange { .. })));
        assert_eq!(parse_numa_node("\n"), Err(FieldError::Empty));
    }

    #[test]
    fn excerpt_is_bounded() {
        let long = "x".repeat(500);
        assert_eq!(excerpt(&long).chars().count(), 65);
    }

    proptest! {
        #[test]
        fn hex_parsers_never_panic(s in any::<String>()) {
            let _ = parse_pci_id(&s);
            let _ = parse_class_code(&s);
            let _ = parse_numa_node(&s);
        }

        #[test]
        fn pci_id_round_trips(id in any::<u16>()) {
            prop_assert_eq!(parse_pci_id(&format!("0x{id:04x}\n")), Ok(id));
        }

        #[test]
        fn class_round_trips(code in 0u32..=0xff_ffff) {
            prop_assert_eq!(parse_class_code(&format!("0x{code:06x}\n")), Ok(code));
        }
    }
}
