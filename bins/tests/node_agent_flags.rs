//! `vgpu-node-agent` flag validation (every bad flag exits 2 naming it, before any cluster access) and
//! `vgpuctl crds` (the committed CRD files for the default group, another group on request, exit 2 on a bad
//! group), through the built binaries.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use assert_cmd::Command;
use predicates::prelude::*;

fn agent() -> Command {
    let mut cmd = Command::cargo_bin("vgpu-node-agent").unwrap();
    cmd.env_remove("KUBECONFIG").env_remove("NODE_NAME").env_remove("VENDORS_CONFIGMAP");
    cmd
}

#[test]
fn bad_flags_exit_2_naming_the_flag() {
    let cases: &[(&[&str], &str)] = &[
        (&[], "--node-name <NODE_NAME>"),
        (&["--node-name", " "], "invalid --node-name \"\" (NODE_NAME)"),
        (&["--node-name", "w1", "--scan-interval", "5x"], "\"5x\" is not a duration"),
        (&["--node-name", "w1", "--scan-interval", "0s"], "invalid --scan-interval 0s"),
        (&["--node-name", "w1", "--group", "nodots"], "invalid --group: invalid API group \"nodots\""),
        (&["--node-name", "w1", "--label-domain", "UPPER.io"], "invalid --label-domain \"UPPER.io\""),
        (
            &["--node-name", "w1", "--vendors-configmap", "gpu-supported-vendors"],
            "invalid --vendors-configmap",
        ),
    ];
    for (args, message) in cases {
        agent().args(*args).assert().code(2).stderr(predicate::str::contains(*message));
    }
}

#[test]
fn node_name_comes_from_the_environment_and_no_cluster_is_a_clear_error() {
    agent()
        .env("NODE_NAME", "w1")
        .env("HOME", "/nonexistent")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .args(["--kubeconfig", "/nonexistent/kubeconfig"])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("--kubeconfig /nonexistent/kubeconfig"));
}

#[test]
fn vgpuctl_crds_prints_the_committed_files() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/gpu-module/crds");
    let committed = ["physicalgpus.gpu.deckhouse.io.yaml", "gpuclasses.gpu.deckhouse.io.yaml"]
        .map(|f| std::fs::read_to_string(dir.join(f)).unwrap())
        .join("---\n");
    Command::cargo_bin("vgpuctl").unwrap().arg("crds").assert().success().stdout(committed);
    Command::cargo_bin("vgpuctl")
        .unwrap()
        .args(["crds", "--group", "gpu.example.com"])
        .assert()
        .success()
        .stdout(predicate::str::contains("name: gpuclasses.gpu.example.com"));
    Command::cargo_bin("vgpuctl")
        .unwrap()
        .args(["crds", "--group", "bad"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("invalid --group"));
}
