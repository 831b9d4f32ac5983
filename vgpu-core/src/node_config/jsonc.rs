//! Strips JSON-with-comments down to JSON: `//` and `/* */` comments and trailing commas become spaces
//! (newlines are kept, so serde_json's line/column positions still point into the original file).

/// Returns `input` with comments and trailing commas blanked out. Never fails; an unterminated block comment
/// or string is left for the JSON parser to report.
pub(crate) fn strip(input: &str) -> String {
    let chars: Vec<char> = input.chars().collect();
    let mut out: Vec<char> = Vec::with_capacity(chars.len());
    // Position in `out` of the last comma outside strings, cleared by any other significant character.
    let mut pending_comma: Option<usize> = None;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        match c {
            '"' => {
                pending_comma = None;
                out.push(c);
                i += 1;
                while i < chars.len() {
                    let s = chars[i];
                    out.push(s);
                    i += 1;
                    if s == '\\' {
                        if let Some(&e) = chars.get(i) {
                            out.push(e);
                            i += 1;
                        }
                    } else if s == '"' {
                        break;
                    }
                }
            }
            '/' if next == Some('/') => {
                while i < chars.len() && chars[i] != '\n' {
                    out.push(' ');
                    i += 1;
                }
            }
            '/' if next == Some('*') => {
                out.push_str_chars("  ");
                i += 2;
                while i < chars.len() && !(chars[i] == '*' && chars.get(i + 1) == Some(&'/')) {
                    out.push(if chars[i] == '\n' { '\n' } else { ' ' });
                    i += 1;
                }
                if i < chars.len() {
                    out.push_str_chars("  ");
                    i += 2;
                }
            }
            ',' => {
                pending_comma = Some(out.len());
                out.push(c);
                i += 1;
            }
            '}' | ']' => {
                if let Some(p) = pending_comma.take()
                    && let Some(slot) = out.get_mut(p)
                {
                    *slot = ' ';
                }
                out.push(c);
                i += 1;
            }
            c if c.is_whitespace() => {
                out.push(c);
                i += 1;
            }
            c => {
                pending_comma = None;
                out.push(c);
                i += 1;
            }
        }
    }
    out.into_iter().collect()
}

trait PushStrChars {
    fn push_str_chars(&mut self, s: &str);
}

impl PushStrChars for Vec<char> {
    fn push_str_chars(&mut self, s: &str) {
        self.extend(s.chars());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn strips_comments_and_trailing_commas() {
        let src = "[ // first\n {\"a\": \"x//y\", /* b */ \"c\": [1,2,],},\n]";
        let v: serde_json::Value = serde_json::from_str(&strip(src)).unwrap();
        assert_eq!(v, serde_json::json!([{"a": "x//y", "c": [1, 2]}]));
        assert_eq!(strip("\"a\\\"//\""), "\"a\\\"//\"");
        assert_eq!(strip("/* x\ny */1").lines().count(), 2);
    }

    proptest! {
        #[test]
        fn never_panics(s in ".*") {
            let _ = strip(&s);
        }
    }
}
