//! `unsafe` is allowed in exactly two files, `src/metax/ffi.rs` (MetaX `libmxsml.so`) and `src/nvml/mig_ffi.rs`
//! (the raw NVML MIG calls): the crate lints deny it everywhere else. Each of the two opens with
//! `#![allow(unsafe_code)]` and has one `// SAFETY:` comment per `unsafe {` block.
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
fn only_the_two_ffi_modules_allow_unsafe() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let allowed = [src.join("metax/ffi.rs"), src.join("nvml/mig_ffi.rs")];
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
    assert_eq!(seen, allowed.len(), "both allowed files exist");
}
