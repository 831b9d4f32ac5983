//! `unsafe` is allowed in `src/mapped.rs` only (the crate's lints deny it everywhere else), with one
//! `// SAFETY:` comment per `unsafe` block. A source-level check over the crate's files.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

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

#[test]
fn only_the_mapping_module_allows_unsafe() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let allowed = src.join("mapped.rs");
    assert!(files.contains(&allowed));
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let has_unsafe = text.contains("allow(unsafe_code)")
            || text.contains("unsafe {")
            || text.contains("unsafe extern");
        if file == allowed {
            assert!(text.contains("#![allow(unsafe_code)]"));
            let blocks = text.matches("unsafe {").count();
            assert!(blocks >= 1);
            assert_eq!(blocks, text.matches("// SAFETY:").count(), "one SAFETY comment per unsafe block");
        } else {
            assert!(!has_unsafe, "{} uses unsafe", file.display());
        }
    }
}
