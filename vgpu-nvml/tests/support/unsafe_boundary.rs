//! The check behind each crate's `tests/unsafe_boundary.rs` (included with `#[path]`): `unsafe` appears only in
//! the allowed files under `src/`; each of them opens with `#![allow(unsafe_code)]`, has unsafe code, and one
//! `// SAFETY:` comment per `unsafe {` block.

use std::path::{Path, PathBuf};

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Checks the crate at `manifest_dir` (its `CARGO_MANIFEST_DIR`); `allowed` are paths relative to `src/`.
pub fn check(manifest_dir: &str, allowed: &[&str]) {
    let src = Path::new(manifest_dir).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let allowed: Vec<PathBuf> = allowed.iter().map(|a| src.join(a)).collect();
    let mut seen = 0;
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let has_unsafe = text.contains("allow(unsafe_code)")
            || text.contains("unsafe {")
            || text.contains("unsafe extern");
        if allowed.contains(&file) {
            seen += 1;
            assert!(
                text.contains("#![allow(unsafe_code)]"),
                "{} lacks #![allow(unsafe_code)]",
                file.display()
            );
            assert!(text.contains("unsafe {"), "{} is allowed unsafe but has none", file.display());
            assert_eq!(
                text.matches("unsafe {").count(),
                text.matches("// SAFETY:").count(),
                "{}: one SAFETY comment per unsafe block",
                file.display()
            );
        } else {
            assert!(!has_unsafe, "{} uses unsafe", file.display());
        }
    }
    assert_eq!(seen, allowed.len(), "every allowed file exists");
}
