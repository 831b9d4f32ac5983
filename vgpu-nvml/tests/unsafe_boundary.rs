//! `unsafe` is allowed in exactly three files, `src/metax/ffi.rs` (MetaX `libmxsml.so`), `src/nvml/mig_ffi.rs`
//! (the raw NVML MIG calls) and `src/fabric_ffi.rs` (Fabric Manager's `libnvfm.so`): the crate lints deny it
//! everywhere else. Each of them opens with
//! `#![allow(unsafe_code)]` and has one `// SAFETY:` comment per `unsafe {` block.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/unsafe_boundary.rs"]
mod unsafe_boundary;

#[test]
fn only_the_ffi_modules_allow_unsafe() {
    unsafe_boundary::check(env!("CARGO_MANIFEST_DIR"), &["metax/ffi.rs", "nvml/mig_ffi.rs", "fabric_ffi.rs"]);
}
