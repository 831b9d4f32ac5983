//! `vgpuctl topology allocate|score` end to end.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use assert_cmd::Command;
use predicates::prelude::*;

fn fixture(name: &str) -> String {
    format!("{}/../vgpu-core/tests/fixtures/topology/{name}.json", env!("CARGO_MANIFEST_DIR"))
}

fn vgpuctl() -> Command {
    assert_cmd::cargo::cargo_bin_cmd!("vgpuctl")
}

fn allocate(file: &str, available: &str, required: Option<&str>, size: &str) -> assert_cmd::assert::Assert {
    let mut cmd = vgpuctl();
    cmd.args(["topology", "allocate", "--topology", file, "--available", available, "--size", size]);
    if let Some(r) = required {
        cmd.args(["--required", r]);
    }
    cmd.assert()
}

#[test]
fn allocate_prints_devices_and_score() {
    let volta = fixture("dgx1-volta");
    allocate(&volta, "0-7", None, "2").success().stdout("{\"devices\":[0,3],\"score\":230}\n");
    allocate(&volta, "0,2,4,5", None, "2").success().stdout("{\"devices\":[4,5],\"score\":150}\n");
    allocate(&volta, "0-7", Some("4"), "2").success().stdout("{\"devices\":[4,7],\"score\":230}\n");
    allocate(&volta, "7,6,5,4", None, "4").success().stdout("{\"devices\":[4,5,6,7],\"score\":1120}\n");
    allocate(&fixture("rtx8000-4x"), "0-3", None, "4")
        .success()
        .stdout("{\"devices\":[0,1,2,3],\"score\":460}\n");
}

#[test]
fn allocate_prints_empty_list_when_nothing_fits() {
    let volta = fixture("dgx1-volta");
    allocate(&volta, "0-2", None, "4").success().stdout("{\"devices\":[],\"score\":0}\n");
    allocate(&volta, "1-7", Some("0"), "2").success().stdout("{\"devices\":[],\"score\":0}\n");
    allocate(&volta, "0-7", None, "0").success().stdout("{\"devices\":[],\"score\":0}\n");
    allocate(&volta, "", None, "1").success().stdout("{\"devices\":[],\"score\":0}\n");
}

#[test]
fn score_prints_set_score() {
    let volta = fixture("dgx1-volta");
    vgpuctl()
        .args(["topology", "score", "--topology", &volta, "--set", "0-3"])
        .assert()
        .success()
        .stdout("{\"score\":1120}\n");
    vgpuctl()
        .args(["topology", "score", "--topology", &volta, "--set", "0,3"])
        .assert()
        .success()
        .stdout("{\"score\":230}\n");
}

#[test]
fn bad_files_exit_2_with_precise_errors() {
    let missing = "/nonexistent/topology.json";
    allocate(missing, "0", None, "1")
        .code(2)
        .stdout("")
        .stderr(predicate::str::contains("cannot read topology file /nonexistent/topology.json"));

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, r#"[{"index":0,"links":{"1":[99]}}]"#).unwrap();
    allocate(bad.to_str().unwrap(), "0", None, "1").code(2).stderr(
        predicate::str::contains("invalid topology file")
            .and(predicate::str::contains(r#"at [0].links."1"[0]: expected a P2P link type code"#)),
    );

    let asym = dir.path().join("asym.json");
    std::fs::write(&asym, r#"[{"index":0,"links":{"1":[7]}},{"index":1,"links":{"0":[8]}}]"#).unwrap();
    vgpuctl()
        .args(["topology", "score", "--topology", asym.to_str().unwrap(), "--set", "0,1"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("asymmetric links between GPU 0 and GPU 1"));

    let garbage = dir.path().join("garbage.json");
    std::fs::write(&garbage, "not json").unwrap();
    allocate(garbage.to_str().unwrap(), "0", None, "1")
        .code(2)
        .stderr(predicate::str::contains("not valid JSON at line 1"));
}

#[test]
fn bad_lists_exit_2_with_precise_errors() {
    let volta = fixture("dgx1-volta");
    allocate(&volta, "0,x", None, "1").code(2).stderr(predicate::str::contains(r#""x" is not a GPU index"#));
    allocate(&volta, "3-1", None, "1").code(2).stderr(predicate::str::contains("descending"));
    allocate(&volta, "0-8", None, "1").code(2).stderr(predicate::str::contains(
        "--available: GPU 8 is not in the topology (expected an index in 0..8)",
    ));
    allocate(&volta, "0-7", Some("9"), "1")
        .code(2)
        .stderr(predicate::str::contains("--required: GPU 9 is not in the topology"));
    vgpuctl()
        .args(["topology", "score", "--topology", &volta, "--set", "0,12"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("--set: GPU 12 is not in the topology"));
    allocate(&volta, "0-7", None, "-1").code(2);
}
