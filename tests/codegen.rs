//! The committed protobuf code under each crate's `src/gen/` is exactly what protox + tonic-prost-build
//! generate from that crate's `proto/` (no system `protoc` anywhere). One test for the whole workspace;
//! regenerate everything with `VGPU_REGEN=1 cargo test -p vgpu --test codegen` and commit.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};

/// The protos of one crate.
struct Protos {
    /// The crate's folder under the workspace root.
    krate: &'static str,
    /// Whether tonic's client and server are generated (else plain prost messages).
    services: bool,
    /// (proto under `proto/`, the file prost names after its package, the committed name under `src/gen/`).
    /// One invocation per proto: pod-resources `v1` and dra-health `v1` are both package `v1` and would
    /// otherwise merge into one file; the committed names tell them apart.
    files: &'static [(&'static str, &'static str, &'static str)],
}

const PROTOS: &[Protos] = &[
    Protos {
        krate: "vgpu-kubelet",
        services: true,
        files: &[
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
        ],
    },
    Protos {
        krate: "vgpu-node",
        services: true,
        files: &[("registry/api.proto", "registry.rs", "registry.rs")],
    },
    Protos {
        krate: "vgpu-dra",
        services: true,
        files: &[("grpc/health/v1/health.proto", "grpc.health.v1.rs", "grpc.health.v1.rs")],
    },
    Protos {
        krate: "vgpu-serve",
        services: false,
        files: &[("perftools/profiles/profile.proto", "perftools.profiles.rs", "perftools.profiles.rs")],
    },
];

/// What protox + tonic-prost-build write for `proto` of the crate at `root`.
fn generate(root: &Path, services: bool, proto: &str, generated: &str) -> String {
    let out = tempfile::tempdir().unwrap();
    let fds = protox::compile([proto], [root.join("proto")])
        .unwrap_or_else(|e| panic!("{}: compiling {proto}: {e}", root.display()));
    tonic_prost_build::configure()
        .out_dir(out.path())
        .build_client(services)
        .build_server(services)
        .compile_fds(fds)
        .unwrap();
    std::fs::read_to_string(out.path().join(generated)).unwrap()
}

#[test]
fn generated_code_is_up_to_date() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"));
    let regen = std::env::var_os("VGPU_REGEN").is_some();
    let mut stale: Vec<PathBuf> = Vec::new();
    for set in PROTOS {
        let root = workspace.join(set.krate);
        for (proto, generated, committed) in set.files {
            let fresh = generate(&root, set.services, proto, generated);
            let committed_path = root.join("src/gen").join(committed);
            if regen {
                std::fs::write(&committed_path, &fresh).unwrap();
            } else if std::fs::read_to_string(&committed_path).unwrap_or_default() != fresh {
                stale.push(committed_path);
            }
        }
    }
    assert!(
        stale.is_empty(),
        "generated protobuf code is stale: {stale:?}; run `VGPU_REGEN=1 cargo test -p vgpu --test codegen` and commit"
    );
}

/// Crates whose protos another generator checks in their own `tests/codegen.rs` (NRI: ttrpc-codegen).
const OTHER_GENERATORS: &[&str] = &["vgpu-nri"];

/// Every `.proto` under a crate's `proto/` is in [`PROTOS`] (or its crate in [`OTHER_GENERATORS`]), so
/// none is left without its check.
#[test]
fn every_proto_is_checked() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut found = Vec::new();
    for entry in std::fs::read_dir(workspace).unwrap() {
        let dir = entry.unwrap().path().join("proto");
        let other = OTHER_GENERATORS.iter().any(|c| dir.parent().is_some_and(|p| p.ends_with(c)));
        if dir.is_dir() && !other {
            collect(&dir, &dir, &mut found);
        }
    }
    let listed: Vec<String> = PROTOS
        .iter()
        .flat_map(|set| set.files.iter().map(move |(proto, _, _)| format!("{}/proto/{proto}", set.krate)))
        .collect();
    let missing: Vec<&String> = found.iter().filter(|f| !listed.contains(f)).collect();
    assert!(missing.is_empty(), "protos without a codegen check (add them to PROTOS): {missing:?}");

    fn collect(base: &Path, dir: &Path, found: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                collect(base, &path, found);
            } else if path.extension().is_some_and(|e| e == "proto") {
                let krate = base.parent().unwrap().file_name().unwrap().to_string_lossy();
                let rel = path.strip_prefix(base).unwrap().display();
                found.push(format!("{krate}/proto/{rel}"));
            }
        }
    }
}
