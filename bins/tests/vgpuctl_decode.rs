//! `vgpuctl decode`: each kind decodes to normalized JSON; malformed input exits 2 with the precise error.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use assert_cmd::{Command, cargo::cargo_bin_cmd};
use predicates::prelude::*;

fn vgpuctl() -> Command {
    cargo_bin_cmd!("vgpuctl")
}

const DEVICES: &str = r#"[{"id":0,"type":"NVIDIA GeForce GTX 1050 Ti","uuid":"GPU-49aa2e6a-33f3-99dd-e08b-ea4beb0e0d28","core":100,"memory":8192,"number":10,"numa":0,"mig":false,"busId":"0000:01:00.0","capability":6.1,"healthy":true}]"#;

fn stdout_json(cmd: &mut Command) -> serde_json::Value {
    let out = cmd.assert().success().get_output().stdout.clone();
    serde_json::from_slice(&out).unwrap()
}

#[test]
fn node_devices_ok() {
    let v = stdout_json(vgpuctl().args(["decode", "node-devices", DEVICES]));
    assert_eq!(v[0]["uuid"], "GPU-49aa2e6a-33f3-99dd-e08b-ea4beb0e0d28");
    assert_eq!(v[0]["memory"], 8192);
    assert_eq!(v[0]["capability"].to_string(), "6.1");
    assert_eq!(v[0]["numa"], 0);
}

#[test]
fn node_devices_from_stdin() {
    let v = stdout_json(vgpuctl().args(["decode", "node-devices", "-"]).write_stdin(DEVICES));
    assert_eq!(v[0]["type"], "NVIDIA GeForce GTX 1050 Ti");
}

#[test]
fn node_devices_malformed() {
    vgpuctl()
        .args(["decode", "node-devices", &DEVICES.replace("\"id\":0", "\"id\":2")])
        .assert()
        .code(2)
        .stdout("")
        .stderr(predicate::str::contains(
            "invalid node-device-register value: device at position 0: field \"id\" is 2",
        ));
}

#[test]
fn node_config_ok_and_malformed() {
    let v = stdout_json(vgpuctl().args([
        "decode",
        "node-config",
        r#"{"deviceSplit":10,"coresScaling":1,"memoryFactor":1,"memoryScaling":1.5}"#,
    ]));
    assert_eq!(v["deviceSplit"], 10);
    assert_eq!(v["memoryScaling"], 1.5);
    vgpuctl().args(["decode", "node-config", r#"{"deviceSplit":-1}"#]).assert().code(2).stderr(
        predicate::str::contains("invalid node-config-info value")
            .and(predicate::str::contains("field \"deviceSplit\" is -1")),
    );
}

#[test]
fn node_topology_ok_and_malformed() {
    let v = stdout_json(vgpuctl().args(["decode", "node-topology", r#"[{"index":0,"links":{"1":[5,12]}}]"#]));
    assert_eq!(v[0]["links"]["1"][1], 12);
    assert_eq!(v[0]["linkNames"]["1"], serde_json::json!(["PIX", "NV6"]));
    vgpuctl().args(["decode", "node-topology", "42"]).assert().code(2).stderr(
        predicate::str::contains("invalid node-device-topology value")
            .and(predicate::str::contains("expected")),
    );
    vgpuctl()
        .args(["decode", "node-topology", r#"[{"index":0,"links":{"1":[99]}}]"#])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("invalid node-device-topology value"));
    vgpuctl()
        .args(["decode", "node-topology", "[{"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("invalid node-device-topology value"));
}

#[test]
fn pod_devices_ok_and_malformed() {
    let v = stdout_json(vgpuctl().args([
        "decode",
        "pod-devices",
        "main[0_GPU-aaa_50_4096,1_GPU-bbb_50_4096];side[2_GPU-ccc_100_8192]",
    ]));
    assert_eq!(v[0]["name"], "main");
    assert_eq!(v[0]["devices"][1]["uuid"], "GPU-bbb");
    assert_eq!(v[1]["devices"][0]["memoryMiB"], 8192);
    vgpuctl()
        .args(["decode", "pod-devices", "main[0_GPU-aaa_50]"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "invalid pre-allocated/real-allocated value: container \"main\" claim 0: expected index_uuid_cores_memory, found \"0_GPU-aaa_50\"",
        ));
}
