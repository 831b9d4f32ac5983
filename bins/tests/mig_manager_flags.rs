//! `vgpu-mig-manager` flag validation, at the binary layer: every bad flag exits 2 with a message naming the
//! flag and what was expected, before the device backend or the cluster is touched.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use assert_cmd::Command;
use predicates::prelude::*;

fn manager() -> Command {
    let mut cmd = Command::cargo_bin("vgpu-mig-manager").unwrap();
    for var in ["KUBECONFIG", "NODE_NAME", "MIG_CONFIGMAP", "MIG_STRATEGY"] {
        cmd.env_remove(var);
    }
    cmd
}

#[test]
fn bad_flags_exit_2_naming_the_flag() {
    let cases: &[(&[&str], &str)] = &[
        (&["--mig-strategy=both"], "invalid --mig-strategy \"both\": "),
        (&["--mig-strategy="], "invalid --mig-strategy \"\": "),
        (
            &["--config-map=no-namespace"],
            "invalid --config-map \"no-namespace\": expected <namespace>/<name>",
        ),
        (&["--config-map=ns/"], "invalid --config-map \"ns/\": expected <namespace>/<name>"),
        (&["--max-retry-interval=0s"], "invalid --max-retry-interval 0s: expected a positive duration"),
        (
            &["--retry-interval=5s", "--max-retry-interval=1s"],
            "invalid --max-retry-interval 1s: expected at least --retry-interval (5s)",
        ),
        (&["--config-map=a/b/c"], "invalid --config-map \"a/b/c\": expected <namespace>/<name>"),
        (
            &["--device-plugin-selector=app"],
            "invalid --device-plugin-selector \"app\": expected key=value[,key=value]",
        ),
        (
            &["--device-plugin-selector=a=b,=c"],
            "invalid --device-plugin-selector \"a=b,=c\": expected key=value[,key=value]",
        ),
    ];
    for (args, message) in cases {
        manager()
            .arg("--node-name=node-1")
            .args(*args)
            .assert()
            .code(2)
            .stderr(predicate::str::starts_with(format!("vgpu-mig-manager: {message}")));
    }
    // Go-style booleans: clap refuses anything else, naming the flag.
    for (arg, flag) in [("--drain=maybe", "--drain"), ("--gpu-reset=sometimes", "--gpu-reset")] {
        manager()
            .args(["--node-name=node-1", arg])
            .assert()
            .code(2)
            .stderr(predicate::str::contains("invalid value").and(predicate::str::contains(flag)));
    }
    // The strategy message lists the accepted values.
    manager()
        .args(["--node-name=node-1", "--mig-strategy=both"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("none, single or mixed"));
    // The environment variables are validated the same way and named by their flag.
    manager()
        .args(["--node-name=node-1"])
        .env("MIG_STRATEGY", "dual")
        .assert()
        .code(2)
        .stderr(predicate::str::starts_with("vgpu-mig-manager: invalid --mig-strategy \"dual\""));
    manager()
        .args(["--node-name=node-1"])
        .env("MIG_CONFIGMAP", "plain")
        .assert()
        .code(2)
        .stderr(predicate::str::starts_with("vgpu-mig-manager: invalid --config-map \"plain\""));
}

#[test]
fn missing_or_empty_node_name_exits_2() {
    manager().assert().code(2).stderr(predicate::str::contains("--node-name"));
    manager()
        .arg("--node-name= ")
        .assert()
        .code(2)
        .stderr(predicate::str::starts_with("vgpu-mig-manager: invalid --node-name \"\""));
}
