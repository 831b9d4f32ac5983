//! The committed gRPC code in `src/gen/` is exactly what protox + tonic-prost-build generate from
//! `proto/` (no system protoc anywhere). Regenerate with
//! `VGPU_REGEN=1 cargo test -p vgpu-kubelet --test codegen`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;

/// Each proto, the file prost writes for its package, and the committed name under `src/gen/`. One
/// invocation per proto: pod-resources `v1` and dra-health `v1` are both package `v1` and would otherwise
/// merge into one file; the committed names tell them apart.
const PROTOS: &[(&str, &str, &str)] = &[
    ("deviceplugin/v1beta1/api.proto", "v1beta1.rs", "deviceplugin.v1beta1.rs"),
    ("podresources/v1/api.proto", "v1.rs", "podresources.v1.rs"),
    ("pluginregistration/v1/api.proto", "pluginregistration.rs", "pluginregistration.rs"),
    ("dra/v1/api.proto", "k8s.io.kubelet.pkg.apis.dra.v1.rs", "k8s.io.kubelet.pkg.apis.dra.v1.rs"),
    (
        "dra/v1beta1/api.proto",
        "k8s.io.kubelet.pkg.apis.dra.v1beta1.rs",
        "k8s.io.kubelet.pkg.apis.dra.v1beta1.rs",
    ),
    ("dra-health/v1alpha1/api.proto", "v1alpha1.rs", "dra-health.v1alpha1.rs"),
    ("dra-health/v1/api.proto", "v1.rs", "dra-health.v1.rs"),
];

#[test]
fn generated_code_is_up_to_date() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let regen = std::env::var_os("VGPU_REGEN").is_some();
    let mut stale = Vec::new();
    for (proto, generated, committed) in PROTOS {
        let out = tempfile::tempdir().unwrap();
        let fds = protox::compile([proto], [root.join("proto")]).unwrap();
        tonic_prost_build::configure()
            .out_dir(out.path())
            .build_client(true)
            .build_server(true)
            .compile_fds(fds)
            .unwrap();
        let fresh = std::fs::read_to_string(out.path().join(generated)).unwrap();
        let committed_path = root.join("src/gen").join(committed);
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
        "generated gRPC code is stale: {stale:?}; run `VGPU_REGEN=1 cargo test -p vgpu-kubelet --test codegen` and commit"
    );
}
