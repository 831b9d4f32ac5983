//! Byte-exact helpers for writing JSON the way Go's `encoding/json` does (float, integer and string forms).

/// Whether byte `b` of a UTF-8 string starts something Go escapes (`"`, `\`, control characters, `<`, `>`,
/// `&`) or may start U+2028/U+2029 (`0xE2`, checked further by the caller).
const fn needs_escape(b: u8) -> bool {
    (b < 0x20) | (b == b'"') | (b == b'\\') | (b == b'<') | (b == b'>') | (b == b'&') | (b == 0xE2)
}

/// [`needs_escape`] for every byte value.
static ESCAPE: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        // `b < 256`, so the cast cannot truncate.
        table[b] = needs_escape(b as u8);
        b += 1;
    }
    table
};

/// Appends `\u00xx` for a code point below 0x10000.
fn push_unicode_escape(out: &mut String, c: u32) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push_str("\\u");
    for shift in [12u32, 8, 4, 0] {
        out.push(char::from(HEX[((c >> shift) & 0xf) as usize]));
    }
}

/// Appends a Go-`encoding/json` string literal: `"`, `\` and control characters escaped (`\n`, `\r`, `\t`,
/// `\b`, `\f`, else `\u00xx`), HTML-sensitive `<`, `>`, `&` and U+2028/U+2029 escaped as `\uXXXX`.
pub(crate) fn write_string(out: &mut String, s: &str) {
    out.push('"');
    let bytes = s.as_bytes();
    // Most strings need no escape: one table look-up per byte, without stopping early.
    if !bytes.iter().fold(false, |any, &b| any | ESCAPE[usize::from(b)]) {
        out.push_str(s);
        out.push('"');
        return;
    }
    // Copy maximal runs that need no escaping in one go; every run boundary is a char boundary because
    // the bytes that end a run are ASCII or the lead byte 0xE2.
    let mut start = 0;
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        if !needs_escape(b) {
            i += 1;
            continue;
        }
        let len = match b {
            0xE2 => match bytes.get(i + 1..i + 3) {
                Some([0x80, 0xA8]) | Some([0x80, 0xA9]) => 3,
                _ => {
                    i += 1;
                    continue;
                }
            },
            _ => 1,
        };
        out.push_str(s.get(start..i).unwrap_or_default());
        match b {
            b'"' => out.push_str("\\\""),
            b'\\' => out.push_str("\\\\"),
            b'\n' => out.push_str("\\n"),
            b'\r' => out.push_str("\\r"),
            b'\t' => out.push_str("\\t"),
            0x08 => out.push_str("\\b"),
            0x0c => out.push_str("\\f"),
            0xE2 => push_unicode_escape(out, if bytes.get(i + 2) == Some(&0xA8) { 0x2028 } else { 0x2029 }),
            b => push_unicode_escape(out, u32::from(b)),
        }
        i += len;
        start = i;
    }
    out.push_str(s.get(start..).unwrap_or_default());
    out.push('"');
}

/// `00`, `01`, ..., `99` back to back.
static PAIRS: [u8; 200] = {
    let mut table = [0u8; 200];
    let mut i = 0;
    while i < 100 {
        // `i < 100`, so both casts are single digits.
        table[2 * i] = b'0' + (i / 10) as u8;
        table[2 * i + 1] = b'0' + (i % 10) as u8;
        i += 1;
    }
    table
};

/// Appends the decimal form of `v` (what `{v}` writes), without going through `fmt`.
pub(crate) fn write_u64(out: &mut String, mut v: u64) {
    if v < 10 {
        // `v < 10`, so the cast cannot truncate.
        out.push(char::from(b'0' + v as u8));
        return;
    }
    // Two digits at a time from the right; a `u64` has at most 20 digits, so `i` never underflows.
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    while v >= 10 {
        // `v % 100 < 100`, so the cast cannot truncate and the index is below 200.
        let p = (v % 100) as usize * 2;
        i -= 2;
        buf[i] = PAIRS[p];
        buf[i + 1] = PAIRS[p + 1];
        v /= 100;
    }
    if v > 0 {
        i -= 1;
        // `v < 10` here.
        buf[i] = b'0' + v as u8;
    }
    out.reserve(buf.len() - i);
    for &d in &buf[i..] {
        out.push(char::from(d));
    }
}

/// Appends the decimal form of `v` (what `{v}` writes), without going through `fmt`.
pub(crate) fn write_i64(out: &mut String, v: i64) {
    if v < 0 {
        out.push('-');
    }
    write_u64(out, v.unsigned_abs());
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

    /// The straightforward per-character form of [`write_string`].
    fn write_string_reference(out: &mut String, s: &str) {
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
                    out.push_str(&format!("\\u{:04x}", u32::from(c)))
                }
                c if u32::from(c) < 0x20 => out.push_str(&format!("\\u{:04x}", u32::from(c))),
                c => out.push(c),
            }
        }
        out.push('"');
    }

    proptest::proptest! {
        #[test]
        fn string_matches_reference(s in "(.|[\"\\\\<>&\u{2000}-\u{2fff}\u{0}-\u{1f}\u{e000}])*") {
            let (mut fast, mut slow) = (String::new(), String::new());
            write_string(&mut fast, &s);
            write_string_reference(&mut slow, &s);
            proptest::prop_assert_eq!(fast, slow);
        }

        #[test]
        fn integers_match_display(u in proptest::prelude::any::<u64>(), i in proptest::prelude::any::<i64>()) {
            let mut out = String::new();
            write_u64(&mut out, u);
            out.push(' ');
            write_i64(&mut out, i);
            proptest::prop_assert_eq!(out, format!("{u} {i}"));
        }
    }

    #[test]
    fn integer_edges() {
        for (v, text) in [(0i64, "0"), (-1, "-1"), (9, "9"), (10, "10"), (i64::MIN, "-9223372036854775808")] {
            let mut out = String::new();
            write_i64(&mut out, v);
            assert_eq!(out, text);
        }
        let mut out = String::new();
        write_u64(&mut out, u64::MAX);
        assert_eq!(out, "18446744073709551615");
    }

    #[test]
    fn strings_match_go() {
        let mut s = String::new();
        write_string(&mut s, "a\"b\\c\n<&>\u{1}\u{2028}é");
        assert_eq!(s, r#""a\"b\\c\n\u003c\u0026\u003e\u0001\u2028é""#);
    }
}
