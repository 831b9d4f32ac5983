//! `vgpuctl devices`: mock, MetaX on a fake sysfs tree, and NVML without a driver (exit 2, clear message).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};

use assert_cmd::{Command, cargo::cargo_bin_cmd};
use predicates::prelude::*;

fn vgpuctl() -> Command {
    let mut cmd = cargo_bin_cmd!("vgpuctl");
    cmd.env_remove("LD_LIBRARY_PATH");
    cmd
}

fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/mock").join(name)
}

fn metax_tree() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (address, vendor, class, numa) in [
        ("0000:3b:00.0", "0x9999", "0x030000", "0"),
        ("0000:86:00.0", "0x9999", "0x038000", "1"),
        ("0000:17:00.0", "0x15b3", "0x020000", "0"),
    ] {
        let d = dir.path().join("bus/pci/devices").join(address);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("vendor"), vendor).unwrap();
        std::fs::write(d.join("device"), "0x4000").unwrap();
        std::fs::write(d.join("class"), class).unwrap();
        std::fs::write(d.join("numa_node"), numa).unwrap();
    }
    dir
}

#[test]
fn nvml_without_a_driver_exits_2_with_what_to_check() {
    if Path::new("/dev/nvidiactl").exists() {
        eprintln!("skipped: this machine has an NVIDIA driver");
        return;
    }
    vgpuctl()
        .args(["devices", "--backend", "nvml"])
        .assert()
        .code(2)
        .stdout("")
        .stderr(predicate::str::starts_with("error: NVIDIA driver library libnvidia-ml.so.1 not found"))
        .stderr(predicate::str::contains("LD_LIBRARY_PATH"))
        .stderr(predicate::str::contains("container toolkit"));
}

#[test]
fn mock_lists_eight_gpus() {
    let out = vgpuctl()
        .args(["devices", "--backend", "mock", "--mock-config"])
        .arg(example("dgx-h100-8gpu.yaml"))
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let text = String::from_utf8(out).unwrap();
    assert!(text.starts_with("Backend: mock, 8 GPU(s)\n"), "{text}");
    assert_eq!(text.lines().filter(|l| l.contains("NVIDIA H100 80GB HBM3")).count(), 8);
    assert!(text.contains("Enabled (3)"));
}

#[test]
fn mock_json_with_topology() {
    let out = vgpuctl()
        .args(["devices", "--backend", "mock", "--json", "--topology", "--mock-config"])
        .arg(example("dgx-h100-8gpu.yaml"))
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["backend"], "mock");
    assert_eq!(v["devices"].as_array().unwrap().len(), 8);
    assert_eq!(v["devices"][0]["uuid"], "GPU-5d0c1a6e-0000-4000-8000-000000000000");
    assert_eq!(v["devices"][0]["busId"], "0000:18:00.0");
    assert_eq!(v["devices"][7]["mig"], "Enabled");
    assert_eq!(v["topology"]["matrix"][0][0], "X");
    assert_eq!(v["topology"]["matrix"][0][1], "NV18");
    assert_eq!(v["topology"]["matrix"].as_array().unwrap().len(), 8);
}

#[test]
fn mock_topology_letters_for_pcie_node() {
    vgpuctl()
        .args(["devices", "--backend", "mock", "--topology", "--mock-config"])
        .arg(example("pcie-l40s-4gpu.yaml"))
        .assert()
        .success()
        .stdout(predicate::str::is_match(r"\nGPU0 +X +\S+").unwrap());
}

#[test]
fn metax_lists_devices_from_a_fake_sysfs_tree() {
    let tree = metax_tree();
    let out = vgpuctl()
        .args(["devices", "--backend", "metax", "--json", "--topology", "--sysfs-root"])
        .arg(tree.path())
        .assert()
        .success()
        .stderr(predicate::str::contains("warning: libmxsml.so not found"))
        .get_output()
        .stdout
        .clone();
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["backend"], "metax");
    let devices = v["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 2);
    assert_eq!(devices[0]["busId"], "0000:3b:00.0");
    assert_eq!(devices[0]["vendor"], "metax");
    assert_eq!(devices[1]["numa"], 1);
    assert_eq!(v["topology"]["matrix"][0][1], "SYS");
}

#[test]
fn auto_picks_metax_and_errors_without_gpus() {
    let tree = metax_tree();
    vgpuctl()
        .args(["devices", "--sysfs-root"])
        .arg(tree.path())
        .assert()
        .success()
        .stdout(predicate::str::starts_with("Backend: metax, 2 GPU(s)"));
    let empty = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(empty.path().join("bus/pci/devices")).unwrap();
    vgpuctl()
        .args(["devices", "--backend", "auto", "--sysfs-root"])
        .arg(empty.path())
        .assert()
        .code(2)
        .stderr(predicate::str::starts_with("error: no NVIDIA (10de) or MetaX (9999) GPU found"));
}

#[test]
fn usage_errors() {
    vgpuctl()
        .args(["devices", "--backend", "mock"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("--mock-config FILE"));
    vgpuctl()
        .args(["devices", "--backend", "cuda"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("expected auto, nvml, metax or mock"));
}
