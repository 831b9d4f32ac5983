//! The committed gRPC code in `src/gen/` is exactly what protox + tonic-prost-build generate from
//! `proto/` (no system protoc anywhere). Regenerate with
//! `VGPU_REGEN=1 cargo test -p vgpu-node --test codegen`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;

const PROTOS: &[(&str, &str)] = &[("registry/api.proto", "registry.rs")];

#[test]
fn generated_code_is_up_to_date() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = tempfile::tempdir().unwrap();
    for (proto, _) in PROTOS {
        let fds = protox::compile([proto], [root.join("proto")]).unwrap();
        tonic_prost_build::configure()
            .out_dir(out.path())
            .build_client(true)
            .build_server(true)
            .compile_fds(fds)
            .unwrap();
    }
    let regen = std::env::var_os("VGPU_REGEN").is_some();
    let mut stale = Vec::new();
    for (_, file) in PROTOS {
        let fresh = std::fs::read_to_string(out.path().join(file)).unwrap();
        let committed_path = root.join("src/gen").join(file);
        if regen {
            std::fs::write(&committed_path, &fresh).unwrap();
            continue;
        }
        let committed = std::fs::read_to_string(&committed_path).unwrap_or_default();
        if committed != fresh {
            stale.push(committed_path.display().to_string());
        }
    }
    assert!(
        stale.is_empty(),
        "generated gRPC code is stale: {stale:?}; run `VGPU_REGEN=1 cargo test -p vgpu-node --test codegen` and commit"
    );
}
