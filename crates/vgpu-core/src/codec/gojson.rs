//! Byte-exact helpers for writing JSON the way Go's `encoding/json` does (float and string forms).

/// Appends a Go-`encoding/json` string literal: `"`, `\` and control characters escaped (`\n`, `\r`, `\t`,
/// `\b`, `\f`, else `\u00xx`), HTML-sensitive `<`, `>`, `&` and U+2028/U+2029 escaped as `\uXXXX`.
pub(crate) fn write_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '<' | '>' | '&' | '\u{2028}' | '\u{2029}' => {
                out.push_str(&format!("\\u{:04x}", u32::from(c)));
            }
            c if u32::from(c) < 0x20 => out.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Go formats a float with `'f'` unless it is tiny or huge, then with `'e'` and a sign on the exponent
/// (`1e-7`, `1e+21`). `text_f` is Rust's shortest round-trip decimal (`Display`), `text_e` its `{:e}` form.
fn go_float(use_exp: bool, text_f: String, text_e: String) -> String {
    if !use_exp {
        return text_f;
    }
    match text_e.split_once('e') {
        Some((mantissa, exp)) if !exp.starts_with('-') => format!("{mantissa}e+{exp}"),
        _ => text_e,
    }
}

/// Go's `encoding/json` form of a finite `float64` (`1`, `0.5`, `1e-7`, `1e+21`); `None` if not finite.
pub(crate) fn format_f64(v: f64) -> Option<String> {
    if !v.is_finite() {
        return None;
    }
    let abs = v.abs();
    let use_exp = abs != 0.0 && !(1e-6..1e21).contains(&abs);
    Some(go_float(use_exp, format!("{v}"), format!("{v:e}")))
}

/// Go's `encoding/json` form of a finite `float32` (shortest form that round-trips as `f32`).
pub(crate) fn format_f32(v: f32) -> Option<String> {
    if !v.is_finite() {
        return None;
    }
    let abs = v.abs();
    let use_exp = abs != 0.0 && !(1e-6_f32..1e21_f32).contains(&abs);
    Some(go_float(use_exp, format!("{v}"), format!("{v:e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_match_go() {
        assert_eq!(format_f64(1.0).unwrap(), "1");
        assert_eq!(format_f64(0.5).unwrap(), "0.5");
        assert_eq!(format_f64(1.5).unwrap(), "1.5");
        assert_eq!(format_f64(0.0).unwrap(), "0");
        assert_eq!(format_f64(1e-7).unwrap(), "1e-7");
        assert_eq!(format_f64(1e21).unwrap(), "1e+21");
        assert_eq!(format_f64(1e20).unwrap(), "100000000000000000000");
        assert_eq!(format_f64(0.000001).unwrap(), "0.000001");
        assert_eq!(format_f64(f64::NAN), None);
        assert_eq!(format_f32(6.1).unwrap(), "6.1");
        assert_eq!(format_f32(8.0).unwrap(), "8");
        assert_eq!(format_f32(f32::INFINITY), None);
    }

    #[test]
    fn strings_match_go() {
        let mut s = String::new();
        write_string(&mut s, "a\"b\\c\n<&>\u{1}\u{2028}é");
        assert_eq!(s, r#""a\"b\\c\n\u003c\u0026\u003e\u0001\u2028é""#);
    }
}
