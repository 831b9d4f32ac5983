//! CEL text built from values: string literals that a value cannot break out of ([`cel_string`]). Used by
//! the DeviceClass and claim selectors of the webhook and the GPU module controller.

/// `value` as a CEL double-quoted string literal: `\\`, `"`, line feed and carriage return escaped, so the value
/// cannot end the literal or change the expression.
pub fn cel_string(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_and_escapes() {
        assert_eq!(cel_string("a100"), r#""a100""#);
        assert_eq!(cel_string("a\\\"b\nc\rd"), r#""a\\\"b\nc\rd""#);
        assert_eq!(cel_string(""), r#""""#);
    }
}
