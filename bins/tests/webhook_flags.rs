//! `vgpu-webhook` flag validation: every bad flag exits 2 with a message naming it, before any cluster or
//! file access; good flags get as far as the missing certificate files.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use assert_cmd::Command;
use predicates::prelude::*;

fn webhook() -> Command {
    let mut cmd = Command::cargo_bin("vgpu-webhook").unwrap();
    cmd.env_remove("KUBECONFIG");
    cmd
}

#[test]
fn bad_flags_exit_2_naming_the_flag() {
    let cases: &[(&[&str], &str)] = &[
        (&["--server-bind-port=0"], "invalid --server-bind-port 0: expected a port in 1..65535"),
        (
            &["--default-node-policy=packbin"],
            "invalid --default-node-policy \"packbin\": expected binpack or spread",
        ),
        (
            &["--default-device-policy=none"],
            "invalid --default-device-policy \"none\": expected binpack or spread",
        ),
        (
            &["--default-topology-mode=ring"],
            "invalid --default-topology-mode \"ring\": expected numa, numa-strict, link or link-strict",
        ),
        (&["--combined-resource-claim"], "--combined-resource-claim requires --default-convert2-dra"),
        (&["--vgpu-device-class-name=Bad_Class"], "invalid --vgpu-device-class-name \"Bad_Class\""),
        (&["--default-runtime-class=-x"], "invalid --default-runtime-class \"-x\""),
        (&["--domain=Nvidia.com"], "invalid --domain: invalid domain \"Nvidia.com\""),
        (&["--tls-cert-name="], "invalid --tls-cert-name \"\""),
    ];
    for (args, message) in cases {
        webhook()
            .args(*args)
            .assert()
            .code(2)
            .stderr(predicate::str::starts_with(format!("vgpu-webhook: {message}")));
    }
    // clap's own refusals (not a number, out of range) also exit 2 and name the flag.
    webhook()
        .arg("--server-bind-port=70000")
        .assert()
        .code(2)
        .stderr(predicate::str::contains("--server-bind-port"));
}

#[test]
fn good_flags_then_missing_certificate_fails_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\nusers: [{name: u, user: {token: t}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n",
    )
    .unwrap();
    webhook()
        .args(["--default-convert2-dra", "--combined-resource-claim", "--default-topology-mode=link"])
        .arg(format!("--cert-dir={}", dir.path().display()))
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .assert()
        .code(1)
        .stderr(predicate::str::contains("tls.crt"));
}
