//! Generated object names: vgpu-manager's `GenerateK8sSafeResourceName` (parts joined by `-`, an 8-hex-digit
//! SHA-256 suffix, cut to 63 characters and made DNS-1123 safe), so a converted pod gets the same claim names
//! as under vgpu-manager.
//!
//! | input | name |
//! |---|---|
//! | `["pod", "main"]` | `pod-main-<sha256("pod-main")[..8]>` |
//! | a join longer than 54 characters | its first 54 characters, `-`, the hash |
//! | upper case, `_`, `.` | lower-cased; characters outside `[-a-z0-9]` dropped; leading/trailing non-alphanumerics trimmed |

/// Maximum length of a DNS-1123 label.
pub const MAX_NAME_LENGTH: usize = 63;
const HASH_LENGTH: usize = 8;

/// `parts` joined by `-` with a short hash suffix, safe as an object name (module docs). Empty input → `""`.
pub fn safe_resource_name(parts: &[&str]) -> String {
    let joined = parts.join("-");
    if joined.is_empty() {
        return String::new();
    }
    let hash = short_hash(&joined, HASH_LENGTH);
    let mut name = format!("{joined}-{hash}");
    if name.len() > MAX_NAME_LENGTH {
        let keep = MAX_NAME_LENGTH - HASH_LENGTH - 1;
        // Cut on a character boundary (non-ASCII input is dropped below anyway).
        let mut cut = keep;
        while !name.is_char_boundary(cut) {
            cut -= 1;
        }
        name = format!("{}-{hash}", &name[..cut]);
    }
    dns1123(&name)
}

/// Lower-cases, drops characters outside `[-a-z0-9]`, trims non-alphanumerics from the start, cuts to 63
/// characters and trims non-alphanumerics from the end.
fn dns1123(name: &str) -> String {
    let lowered: String = name
        .chars()
        .flat_map(char::to_lowercase)
        .filter(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-')
        .collect();
    let mut out = lowered.trim_start_matches(|c: char| !c.is_ascii_alphanumeric()).to_owned();
    out.truncate(MAX_NAME_LENGTH);
    out.trim_end_matches(|c: char| !c.is_ascii_alphanumeric()).to_owned()
}

/// The first `len` hex digits of SHA-256 of `input`.
pub fn short_hash(input: &str, len: usize) -> String {
    let digest = sha256(input.as_bytes());
    let mut hex = String::with_capacity(64);
    for b in digest {
        hex.push_str(&format!("{b:02x}"));
    }
    hex.truncate(len);
    hex
}

/// SHA-256 of `data`; names only, never security.
fn sha256(data: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(data).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_test_vectors() {
        // FIPS 180-4 examples.
        assert_eq!(short_hash("", 64), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
        assert_eq!(short_hash("abc", 64), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        assert_eq!(
            short_hash("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", 64),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"
        );
    }

    #[test]
    fn names() {
        let n = safe_resource_name(&["web", "main"]);
        assert_eq!(n, format!("web-main-{}", short_hash("web-main", 8)));
        assert_eq!(safe_resource_name(&[]), "");
        let long = "a".repeat(80);
        let n = safe_resource_name(&[&long, "main"]);
        assert_eq!(n.len(), 63);
        assert!(n.ends_with(&short_hash(&format!("{long}-main"), 8)));
        assert_eq!(
            safe_resource_name(&["_My.Pod", "C_1"]),
            format!("mypod-c1-{}", short_hash("_My.Pod-C_1", 8))
        );
    }
}
