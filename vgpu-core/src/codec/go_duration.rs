//! Go `time.ParseDuration` text (`300ms`, `1.5s`, `2m30s`, `1h`): the form of vgpu-manager's duration flags
//! and of the `stuck-grace-period` annotation.
//!
//! Exact integer arithmetic (no floating point), as Go does: `1.000000001s` is 1 000 000 001 ns, and digits
//! below a nanosecond are dropped. Units `ns`, `us`, `µs` (U+00B5), `μs` (U+03BC), `ms`, `s`, `m`, `h`; a unit
//! is required after every number except for the lone `0`. A leading `+` is accepted; negative durations and
//! values beyond `i64::MAX` nanoseconds (about 292 years) are refused, because nothing in vgpu takes one.

/// Nanoseconds in `text` (a Go duration); `None` when malformed, negative or overflowing.
///
/// ```
/// use vgpu_core::codec::go_duration::parse_nanos;
/// assert_eq!(parse_nanos("1m30.5s"), Some(90_500_000_000));
/// assert_eq!(parse_nanos("0"), Some(0));
/// assert_eq!(parse_nanos("10"), None, "a unit is required");
/// assert_eq!(parse_nanos("-1s"), None);
/// ```
pub fn parse_nanos(text: &str) -> Option<i64> {
    let mut rest = text.strip_prefix('+').unwrap_or(text);
    if rest == "0" {
        return Some(0);
    }
    if rest.is_empty() {
        return None;
    }
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let int_len = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        let (int_digits, after) = rest.split_at(int_len);
        let (frac_digits, after) = match after.strip_prefix('.') {
            Some(f) => {
                let n = f.find(|c: char| !c.is_ascii_digit()).unwrap_or(f.len());
                f.split_at(n)
            }
            None => ("", after),
        };
        if int_digits.is_empty() && frac_digits.is_empty() {
            return None;
        }
        let unit_len = after.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_len);
        let scale: u128 = match unit {
            "ns" => 1,
            "us" | "\u{b5}s" | "\u{3bc}s" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            _ => return None,
        };
        let mut int: u128 = 0;
        for d in int_digits.bytes() {
            int = int.checked_mul(10)?.checked_add(u128::from(d - b'0'))?;
            if int > i64::MAX as u128 {
                return None;
            }
        }
        total = total.checked_add(int.checked_mul(scale)?)?;
        // The fraction, truncated below a nanosecond: digits × scale / 10^len, kept exact with up to 30 digits.
        let mut frac: u128 = 0;
        let mut denom: u128 = 1;
        for d in frac_digits.bytes().take(30) {
            frac = frac * 10 + u128::from(d - b'0');
            denom *= 10;
        }
        total = total.checked_add(frac.checked_mul(scale)? / denom)?;
        if total > i64::MAX as u128 {
            return None;
        }
        rest = after;
    }
    i64::try_from(total).ok()
}

/// [`parse_nanos`] as a [`std::time::Duration`].
pub fn parse(text: &str) -> Option<std::time::Duration> {
    parse_nanos(text).and_then(|ns| u64::try_from(ns).ok()).map(std::time::Duration::from_nanos)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use proptest::prelude::*;

    #[test]
    fn go_examples() {
        for (text, ns) in [
            ("0", Some(0)),
            ("+5s", Some(5_000_000_000)),
            ("300ms", Some(300_000_000)),
            ("1.5s", Some(1_500_000_000)),
            ("2m30s", Some(150_000_000_000)),
            ("1h", Some(3_600_000_000_000)),
            ("1.000000001s", Some(1_000_000_001)),
            ("1.0000000019s", Some(1_000_000_001)),
            (".5s", Some(500_000_000)),
            ("5.s", Some(5_000_000_000)),
            ("1\u{b5}s", Some(1_000)),
            ("1\u{3bc}s", Some(1_000)),
            ("9223372036854775807ns", Some(i64::MAX)),
            ("9223372036854775808ns", None),
            ("2562048h", None),
            ("", None),
            ("+", None),
            ("s", None),
            (".s", None),
            ("1", None),
            ("1x", None),
            ("-1s", None),
            (" 1s", None),
            ("1s ", None),
        ] {
            assert_eq!(parse_nanos(text), ns, "{text:?}");
        }
        assert_eq!(parse("1.5s"), Some(std::time::Duration::from_millis(1500)));
    }

    proptest! {
        #[test]
        fn never_panics(text in "\\PC{0,24}") {
            let _ = parse_nanos(&text);
        }

        #[test]
        fn sums_of_whole_units_are_exact(h in 0u64..1000, m in 0u64..1000, s in 0u64..1000, ms in 0u64..1000) {
            let text = format!("{h}h{m}m{s}s{ms}ms");
            let want = ((h * 3600 + m * 60 + s) * 1000 + ms) * 1_000_000;
            prop_assert_eq!(parse_nanos(&text), Some(want as i64));
        }
    }
}
