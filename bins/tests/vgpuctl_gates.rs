//! The `vgpuctl gates` CLI contract.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use assert_cmd::Command;
use predicates::prelude::*;
use serde_json::Value;

fn vgpuctl() -> Command {
    let mut cmd = Command::cargo_bin("vgpuctl").unwrap();
    cmd.env_remove("FEATURE_GATES");
    cmd
}

fn check_json(args: &[&str]) -> serde_json::Map<String, Value> {
    let out = vgpuctl().args(["gates", "check"]).args(args).assert().success().get_output().stdout.clone();
    let text = String::from_utf8(out).unwrap();
    assert_eq!(text.lines().count(), 1, "one JSON object on one line: {text}");
    match serde_json::from_str(&text).unwrap() {
        Value::Object(m) => m,
        other => panic!("expected an object, got {other}"),
    }
}

#[test]
fn list_shows_every_gate_with_owners() {
    let out = vgpuctl().args(["gates", "list"]).assert().success().get_output().stdout.clone();
    let text = String::from_utf8(out).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("NAME") && lines[0].contains("DEFAULT") && lines[0].contains("COMPONENTS"));
    // 10 Core gates + 17 DRA gates (ConsumableShares and the three logging gates included).
    assert_eq!(lines.len(), 1 + 10 + 17, "{text}");
    let row = lines.iter().find(|l| l.starts_with("TopologyAwareGPUAllocation ")).unwrap();
    let cols: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(
        cols,
        ["TopologyAwareGPUAllocation", "false", "Alpha", "Core", "device-plugin,scheduler-extender"]
    );
    let row = lines.iter().find(|l| l.starts_with("IMEXDaemonsWithDNSNames ")).unwrap();
    assert_eq!(
        row.split_whitespace().collect::<Vec<_>>(),
        ["IMEXDaemonsWithDNSNames", "true", "Beta", "DRA", "kubelet-plugin"]
    );
    for (gate, default, stage) in [
        ("ContextualLogging", "true", "Beta"),
        ("LoggingAlphaOptions", "false", "Alpha"),
        ("LoggingBetaOptions", "true", "Beta"),
    ] {
        let row = lines.iter().find(|l| l.starts_with(&format!("{gate} "))).unwrap();
        assert_eq!(
            row.split_whitespace().collect::<Vec<_>>(),
            [gate, default, stage, "DRA", "kubelet-plugin"]
        );
    }
}

#[test]
fn list_for_one_component_and_as_json() {
    vgpuctl().args(["gates", "list", "--component", "scheduler-extender"]).assert().success().stdout(
        predicate::str::contains("SerializedNodeBind").and(predicate::str::contains("VGPUSupport").not()),
    );
    let out = vgpuctl().args(["gates", "list", "--component", "device-monitor", "--json"]).assert().success();
    let rows: Vec<Value> = serde_json::from_slice(&out.get_output().stdout).unwrap();
    let names: Vec<&str> = rows.iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["SharedSMUtilizationWatcher", "VirtualMemoryTracking"]);
}

#[test]
fn check_prints_every_gate_with_defaults_applied() {
    let m = check_json(&["--component", "scheduler-extender"]);
    assert_eq!(
        Value::Object(m),
        serde_json::json!({"SerializedNodeBind": true, "SerializedNodeFilter": true, "TopologyAwareGPUAllocation": false})
    );
    let m = check_json(&["--component", "device-plugin", "--feature-gates", " GPUCoreResourcePlugin = T ,"]);
    assert_eq!(m.len(), 8);
    assert_eq!(m["GPUCoreResourcePlugin"], true);
    assert_eq!(m["VirtualMemoryTracking"], false);
    let m = check_json(&[
        "--component",
        "kubelet-plugin",
        "--feature-gates",
        "MPSSupport=true,VGPUSupport=false",
    ]);
    assert_eq!(m.len(), 17);
    assert_eq!((m["MPSSupport"].clone(), m["VGPUSupport"].clone()), (Value::Bool(true), Value::Bool(false)));
    // Kubernetes' logging gates, with component-base's defaults.
    assert_eq!(
        (m["ContextualLogging"].clone(), m["LoggingAlphaOptions"].clone(), m["LoggingBetaOptions"].clone()),
        (Value::Bool(true), Value::Bool(false), Value::Bool(true))
    );
    let m = check_json(&[
        "--component",
        "kubelet-plugin",
        "--feature-gates",
        "ContextualLogging=false,AllAlpha=false",
    ]);
    assert_eq!(m["ContextualLogging"], false);
    // Only the kubelet-plugin has them.
    vgpuctl()
        .args([
            "gates",
            "check",
            "--component",
            "device-plugin",
            "--feature-gates",
            "ContextualLogging=false",
        ])
        .assert()
        .code(2)
        .stderr(predicate::str::starts_with("unrecognized feature gate: ContextualLogging"));
}

#[test]
fn repeated_flags_apply_in_order() {
    let m = check_json(&[
        "--component",
        "device-monitor",
        "--feature-gates",
        "VirtualMemoryTracking=true",
        "--feature-gates",
        "VirtualMemoryTracking=false,SharedSMUtilizationWatcher=true",
    ]);
    assert_eq!(m["VirtualMemoryTracking"], false);
    assert_eq!(m["SharedSMUtilizationWatcher"], true);
}

#[test]
fn check_errors_exit_2_with_exact_first_line() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["--component", "device-monitor", "--feature-gates", "VGPUSupport=true"],
            "unrecognized feature gate: VGPUSupport",
        ),
        (
            &["--component", "device-plugin", "--feature-gates", "CorePlugin=true"],
            "unrecognized feature gate: CorePlugin",
        ),
        (
            &["--component", "device-plugin", "--feature-gates", "GPUCoreResourcePlugin"],
            "missing bool value for GPUCoreResourcePlugin",
        ),
        (
            &["--component", "device-plugin", "--feature-gates", "GPUCoreResourcePlugin=yes"],
            "invalid value of GPUCoreResourcePlugin=yes, err: strconv.ParseBool: parsing \"yes\": invalid syntax",
        ),
        (
            &["--component", "kubelet-plugin", "--feature-gates", "MPSSupport=true"],
            "feature gate validation failed for kubelet-plugin:",
        ),
    ];
    for (args, first) in cases {
        let out = vgpuctl()
            .args(["gates", "check"])
            .args(*args)
            .assert()
            .code(2)
            .stdout("")
            .get_output()
            .stderr
            .clone();
        let text = String::from_utf8(out).unwrap();
        assert_eq!(text.lines().next(), Some(*first), "{args:?}: {text}");
    }
    vgpuctl()
        .args(["gates", "check", "--component", "device-plugin", "--feature-gates", "CorePlugin=true"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("CorePlugin was renamed to GPUCoreResourcePlugin"));
    vgpuctl()
        .args(["gates", "check", "--component", "kubelet-plugin", "--feature-gates", "MPSSupport=true"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("fix: set VGPUSupport=false"));
    vgpuctl().args(["gates", "check", "--component", "scheduler"]).assert().code(2);
}

#[test]
fn from_env_reads_feature_gates_for_the_kubelet_plugin_only() {
    let out = vgpuctl()
        .args(["gates", "check", "--component", "kubelet-plugin", "--from-env"])
        .env("FEATURE_GATES", "TimeSlicingSettings=true")
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let m: serde_json::Map<String, Value> = serde_json::from_slice(&out).unwrap();
    assert_eq!(m["TimeSlicingSettings"], true);
    // The flag wins over the environment.
    let out = vgpuctl()
        .args([
            "gates",
            "check",
            "--component",
            "kubelet-plugin",
            "--from-env",
            "--feature-gates",
            "NRISupport=true",
        ])
        .env("FEATURE_GATES", "MPSSupport=true")
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let m: serde_json::Map<String, Value> = serde_json::from_slice(&out).unwrap();
    assert_eq!((m["NRISupport"].clone(), m["MPSSupport"].clone()), (Value::Bool(true), Value::Bool(false)));
    // Invalid env is an error like an invalid flag.
    vgpuctl()
        .args(["gates", "check", "--component", "kubelet-plugin", "--from-env"])
        .env("FEATURE_GATES", "MPSSupport=true")
        .assert()
        .code(2)
        .stderr(predicate::str::contains("mutually exclusive"));
    vgpuctl()
        .args(["gates", "check", "--component", "device-plugin", "--from-env"])
        .env("FEATURE_GATES", "GPUCoreResourcePlugin=true")
        .assert()
        .code(2)
        .stderr(predicate::str::contains("--from-env applies only to kubelet-plugin"));
}

#[test]
fn render_turns_a_values_map_into_a_validated_string() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = dir.path().join("gates.yaml");
    std::fs::write(&yaml, "VGPUSupport: false\nMPSSupport: true\nTimeSlicingSettings: \"true\"\n").unwrap();
    vgpuctl()
        .args(["gates", "render", "--component", "kubelet-plugin", "--values"])
        .arg(&yaml)
        .assert()
        .success()
        .stdout("MPSSupport=true,TimeSlicingSettings=true,VGPUSupport=false\n");

    let chart = dir.path().join("values.yaml");
    std::fs::write(
        &chart,
        "devicePlugin:\n  devicePlugin:\n    commands:\n      featureGates:\n        TopologyAwareGPUAllocation: true\n        SharedSMUtilizationWatcher: true\n",
    )
    .unwrap();
    vgpuctl()
        .args(["gates", "render", "--component", "device-plugin", "--values"])
        .arg(&chart)
        .assert()
        .success()
        .stdout("SharedSMUtilizationWatcher=true,TopologyAwareGPUAllocation=true\n");

    let json = dir.path().join("gates.json");
    std::fs::write(&json, r#"{"MPSSupport": true}"#).unwrap();
    vgpuctl()
        .args(["gates", "render", "--component", "kubelet-plugin", "--values"])
        .arg(&json)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("VGPUSupport is currently mutually exclusive with MPSSupport"));

    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "SerializedNodeBind: maybe\n").unwrap();
    vgpuctl()
        .args(["gates", "render", "--component", "scheduler-extender", "--values"])
        .arg(&bad)
        .assert()
        .code(2)
        .stderr(
            predicate::str::contains("bad.yaml")
                .and(predicate::str::contains("SerializedNodeBind=\"maybe\"")),
        );

    vgpuctl()
        .args(["gates", "render", "--component", "scheduler-extender", "--values"])
        .arg(dir.path().join("missing.yaml"))
        .assert()
        .code(2)
        .stderr(predicate::str::contains("cannot read values file"));
}
