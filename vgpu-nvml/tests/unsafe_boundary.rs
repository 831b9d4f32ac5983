//! `unsafe` is allowed in `src/metax/ffi.rs` only (the crate lints deny it everywhere else).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;

fn sources(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
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
fn only_the_ffi_module_allows_unsafe() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let allowed = src.join("metax/ffi.rs");
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let has_unsafe = text.contains("allow(unsafe_code)")
            || text.contains("unsafe {")
            || text.contains("unsafe extern");
        if file == allowed {
            assert!(text.contains("#![allow(unsafe_code)]"));
            assert_eq!(
                text.matches("unsafe {").count(),
                text.matches("// SAFETY:").count(),
                "one SAFETY comment per call"
            );
        } else {
            assert!(!has_unsafe, "{} uses unsafe", file.display());
        }
    }
}
