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

#[test]
fn json_reports_per_stage_latency_histograms() {
    let out = Command::cargo_bin("vgpuctl")
        .unwrap()
        .args(["simulate", "--nodes", "10", "--pods", "60", "--seed", "3", "--json"])
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    let stages = v["stages"].as_object().unwrap();
    for stage in ["filter", "rank", "allocation", "patch", "cache_update", "lock_wait", "bind"] {
        let s = &stages[stage];
        assert!(s["count"].as_u64().unwrap() > 0, "{stage}: {s}");
        let (p50, p99, max) =
            (s["p50_us"].as_f64().unwrap(), s["p99_us"].as_f64().unwrap(), s["max_us"].as_f64().unwrap());
        assert!(p50 <= p99 && p99 <= max, "{stage}: {s}");
    }
    // One filter per pod; the pre-allocation is written once per placed pod (on its binding).
    assert_eq!(stages["filter"]["count"], 60);
    assert_eq!(stages["rank"]["count"], 60);
    assert_eq!(stages["patch"]["count"], v["placed"]);
    assert_eq!(stages["bind"]["count"], v["placed"]);
}

#[test]
fn from_cluster_flags_are_checked_before_any_connection() {
    // --pod without --from-cluster, and --from-cluster without --pod: usage errors (exit 2).
    Command::cargo_bin("vgpuctl")
        .unwrap()
        .args(["simulate", "--pod", "gpus=1"])
        .assert()
        .code(2)
        .stderr(predicates::str::contains("--from-cluster"));
    Command::cargo_bin("vgpuctl")
        .unwrap()
        .args(["simulate", "--from-cluster"])
        .assert()
        .code(2)
        .stderr(predicates::str::contains("--pod"));
    // A bad shape names the pair and what was expected.
    Command::cargo_bin("vgpuctl")
        .unwrap()
        .args(["simulate", "--from-cluster", "--pod", "gpus=2,memory=8G"])
        .assert()
        .code(2)
        .stderr(predicates::str::contains("memory: expected <n>Mi, <n>Gi, <n>Ti or a MiB count, got \"8G\""));
    // A kubeconfig that does not exist: exit 2 naming it, nothing else tried.
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("absent.kubeconfig");
    Command::cargo_bin("vgpuctl")
        .unwrap()
        .args(["simulate", "--from-cluster", "--pod", "gpus=1", "--kubeconfig"])
        .arg(&missing)
        .assert()
        .code(2)
        .stderr(predicates::str::contains("absent.kubeconfig"));
}
