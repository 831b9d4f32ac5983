//! `unsafe` is allowed in `src/mapped.rs` only (the crate's lints deny it everywhere else), with one
//! `// SAFETY:` comment per `unsafe` block. A source-level check over the crate's files.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../../vgpu-nvml/tests/support/unsafe_boundary.rs"]
mod unsafe_boundary;

#[test]
fn only_the_mapping_module_allows_unsafe() {
    unsafe_boundary::check(env!("CARGO_MANIFEST_DIR"), &["mapped.rs"]);
}
