//! The `--feature-gates` string syntax: `A=true,B=false`, as component-base's `Set` reads it.

use crate::error::GateError;

/// Parses a boolean exactly as Go's `strconv.ParseBool` does.
///
/// Accepts `1 t T TRUE true True` and `0 f F FALSE false False`; anything else is `None`.
///
/// ```
/// assert_eq!(vgpu_gates::parse_bool("T"), Some(true));
/// assert_eq!(vgpu_gates::parse_bool("False"), Some(false));
/// assert_eq!(vgpu_gates::parse_bool("yes"), None);
/// ```
pub fn parse_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// Splits a `--feature-gates` value into `(name, value)` pairs, in input order.
///
/// Tokens are separated by `,`; blank tokens are skipped (so `""` and `"A=true,"` are fine);
/// whitespace around names and values is trimmed. Stops at the first syntax error
/// ([`GateError::MissingValue`] or [`GateError::InvalidValue`]). Names are not checked here.
pub fn parse_entries(value: &str) -> Result<Vec<(&str, bool)>, GateError> {
    let mut entries = Vec::new();
    for token in value.split(',') {
        if token.trim().is_empty() {
            continue;
        }
        let Some((name, raw)) = token.split_once('=') else {
            return Err(GateError::MissingValue { name: token.trim().to_owned() });
        };
        let name = name.trim();
        let raw = raw.trim();
        match parse_bool(raw) {
            Some(v) => entries.push((name, v)),
            None => {
                return Err(GateError::InvalidValue { name: name.to_owned(), value: raw.to_owned() });
            }
        }
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_parse_bool_table() {
        for s in ["1", "t", "T", "TRUE", "true", "True"] {
            assert_eq!(parse_bool(s), Some(true), "{s}");
        }
        for s in ["0", "f", "F", "FALSE", "false", "False"] {
            assert_eq!(parse_bool(s), Some(false), "{s}");
        }
        for s in ["", "yes", "no", "tRUE", "on", "2", " true", "truee"] {
            assert_eq!(parse_bool(s), None, "{s:?}");
        }
    }

    #[test]
    fn entries_trim_and_skip_blanks() -> Result<(), GateError> {
        assert_eq!(parse_entries("")?, vec![]);
        assert_eq!(parse_entries(" , ,")?, vec![]);
        assert_eq!(parse_entries(" A = true ,B=0,")?, vec![("A", true), ("B", false)]);
        // `=` inside the value is part of the value, as with Go's SplitN(s, "=", 2).
        assert!(matches!(parse_entries("A=t=1"), Err(GateError::InvalidValue { .. })));
        Ok(())
    }

    #[test]
    fn syntax_errors_name_the_gate() {
        assert_eq!(
            parse_entries("A=true, B").map_err(|e| e.to_string()),
            Err("missing bool value for B".to_owned())
        );
        assert_eq!(
            parse_entries("A=yes").map_err(|e| e.to_string()),
            Err("invalid value of A=yes, err: strconv.ParseBool: parsing \"yes\": invalid syntax".to_owned())
        );
    }
}
