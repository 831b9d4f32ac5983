#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! `vgpuctl simulate` end to end with small flags.

use assert_cmd::Command;

#[test]
fn small_simulation_places_pods_without_overcommit() {
    let out = Command::cargo_bin("vgpuctl")
        .unwrap()
        .args(["simulate", "--nodes", "20", "--pods", "300", "--seed", "7", "--json"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert!(v["placed"].as_u64().unwrap() > 0, "{v}");
    assert_eq!(v["overcommitted_gpus"], 0);
    assert_eq!(v["overcommit_ok"], true);
    assert_eq!(v["placed"].as_u64().unwrap() + v["rejected"].as_u64().unwrap(), 300);
}

#[test]
fn fixed_policies_and_bad_flags() {
    Command::cargo_bin("vgpuctl")
        .unwrap()
        .args([
            "simulate",
            "--nodes",
            "4",
            "--pods",
            "50",
            "--node-policy",
            "spread",
            "--topology-mode",
            "link",
        ])
        .assert()
        .success()
        .stdout(predicates::str::contains("over-commit check: ok"));
    Command::cargo_bin("vgpuctl").unwrap().args(["simulate", "--node-policy", "tight"]).assert().failure();
}
