//! The committed message code in `src/gen/api.rs` is exactly what ttrpc-codegen (rust-protobuf's pure-Rust
//! parser, no system `protoc`) generates from `proto/api.proto`. Regenerate with
//! `VGPU_REGEN=1 cargo test -p vgpu-nri --test codegen`.
//!
//! ttrpc-codegen also writes `api_ttrpc.rs` (the service stubs); it is not committed: its server half
//! needs the `async-trait` crate, which the workspace does not depend on, so `src/service.rs` dispatches
//! the same methods by hand (the test checks that file still names every method of the proto).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;

#[test]
fn generated_code_is_up_to_date() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = tempfile::tempdir().unwrap();
    ttrpc_codegen::Codegen::new()
        .out_dir(out.path())
        .include(root.join("proto"))
        .input(root.join("proto/api.proto"))
        .rust_protobuf()
        .customize(ttrpc_codegen::Customize { async_all: true, ..Default::default() })
        .run()
        .unwrap();
    let fresh = std::fs::read_to_string(out.path().join("api.rs")).unwrap();
    let committed_path = root.join("src/gen/api.rs");
    if std::env::var_os("VGPU_REGEN").is_some() {
        std::fs::write(&committed_path, &fresh).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&committed_path).unwrap_or_default();
    assert!(
        committed == fresh,
        "generated NRI code is stale: {}; run `VGPU_REGEN=1 cargo test -p vgpu-nri --test codegen` and commit",
        committed_path.display()
    );
    // The hand-written dispatch covers every service method the generator sees.
    let stubs = std::fs::read_to_string(out.path().join("api_ttrpc.rs")).unwrap();
    let service = std::fs::read_to_string(root.join("src/service.rs")).unwrap();
    for method in [
        "RegisterPlugin",
        "UpdateContainers",
        "Configure",
        "Synchronize",
        "Shutdown",
        "CreateContainer",
        "UpdateContainer",
        "StopContainer",
        "RemoveContainer",
        "StateChange",
    ] {
        assert!(stubs.contains(&format!("\"{method}\"")), "the generated stubs lack {method}");
        assert!(service.contains(&format!("\"{method}\"")), "src/service.rs does not dispatch {method}");
    }
}
