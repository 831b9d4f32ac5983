//! Every binary validates its gates first (exit 2 on error) and says plainly what is not built yet.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use assert_cmd::Command;
use predicates::prelude::*;

const BINARIES: &[(&str, &str, &str)] = &[
    ("vgpu-device-plugin", "GPUCoreResourcePlugin=true", "VGPUSupport=true"),
    ("vgpu-scheduler-extender", "SerializedNodeBind=false", "GPUCoreResourcePlugin=true"),
    ("vgpu-device-monitor", "VirtualMemoryTracking=true", "SerializedNodeBind=true"),
    ("vgpu-kubelet-plugin", "MPSSupport=true,VGPUSupport=false", "MPSSupport=true"),
];

fn bin(name: &str) -> Command {
    let mut cmd = Command::cargo_bin(name).unwrap();
    cmd.env_remove("FEATURE_GATES");
    cmd
}

#[test]
fn bad_gates_exit_2_before_anything_else() {
    for (name, _, bad) in BINARIES {
        bin(name)
            .arg(format!("--feature-gates={bad}"))
            .assert()
            .code(2)
            .stderr(predicate::str::contains("not implemented").not());
    }
}

#[test]
fn good_gates_then_not_implemented_yet() {
    for (name, good, _) in BINARIES {
        bin(name)
            .args(["--feature-gates", good])
            .assert()
            .code(1)
            .stderr(predicate::str::contains(format!("{name}: not implemented yet")));
    }
}

#[test]
fn kubelet_plugin_reads_feature_gates_env_and_the_flag_wins() {
    bin("vgpu-kubelet-plugin")
        .env("FEATURE_GATES", "MPSSupport=true")
        .assert()
        .code(2)
        .stderr(predicate::str::starts_with("feature gate validation failed for kubelet-plugin:"));
    bin("vgpu-kubelet-plugin")
        .env("FEATURE_GATES", "MPSSupport=true")
        .args(["--feature-gates", "TimeSlicingSettings=true"])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("not implemented yet"));
    // Core binaries do not read FEATURE_GATES.
    bin("vgpu-device-plugin").env("FEATURE_GATES", "Nope=true").assert().code(1);
}
