//! `vgpuctl` input limits: every input error exits 2 naming the input; files and stdin are capped (256 KiB
//! for annotation values, 4 MiB for documents, `--max-bytes N` for all) and read no further than the cap.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use assert_cmd::{Command, cargo::cargo_bin_cmd};
use predicates::prelude::*;

const KINDS: [&str; 4] = ["node-devices", "node-config", "node-topology", "pod-devices"];
const ANNOTATION_CAP: usize = 256 * 1024;
const DOCUMENT_CAP: usize = 4 * 1024 * 1024;

fn vgpuctl() -> Command {
    let mut cmd = cargo_bin_cmd!("vgpuctl");
    cmd.env_remove("FEATURE_GATES");
    cmd
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../vgpu-core/tests/fixtures/topology")
        .join(format!("{name}.json"))
}

fn mock_example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/mock/dgx-h100-8gpu.yaml")
}

/// A valid topology padded with JSON whitespace to `len` bytes.
fn padded_topology(dir: &Path, len: usize) -> PathBuf {
    let mut text = std::fs::read_to_string(fixture("dgx1-volta")).unwrap();
    assert!(text.len() < len);
    text.push_str(&" ".repeat(len - text.len()));
    let path = dir.join(format!("padded-{len}.json"));
    std::fs::write(&path, text).unwrap();
    path
}

/// A sparse file of `len` bytes: its size is in the metadata, no disk is spent.
fn sparse(dir: &Path, name: &str, len: u64) -> PathBuf {
    let path = dir.join(name);
    File::create(&path).unwrap().set_len(len).unwrap();
    path
}

fn score(topology: &Path) -> Command {
    let mut cmd = vgpuctl();
    cmd.args(["topology", "score", "--set", "0,3", "--topology"]).arg(topology);
    cmd
}

#[test]
fn non_utf8_stdin_exits_2_naming_stdin_and_the_byte_offset() {
    for kind in KINDS {
        vgpuctl()
            .args(["decode", kind, "-"])
            .write_stdin(b"[{\"index\":0}]\xff\xfe".to_vec())
            .assert()
            .code(2)
            .stdout("")
            .stderr(format!("error: stdin ({kind} value) is not valid UTF-8: byte 0xff at byte offset 13\n"));
    }
    // A multi-byte sequence cut short at the end.
    vgpuctl()
        .args(["decode", "pod-devices", "-"])
        .write_stdin("main[0_GPU-é".as_bytes()[..12].to_vec())
        .assert()
        .code(2)
        .stderr(predicate::str::contains("ends inside a multi-byte sequence at byte offset 11"));
}

#[test]
fn non_utf8_files_exit_2_naming_the_file_and_the_byte_offset() {
    let dir = tempfile::tempdir().unwrap();
    let topo = dir.path().join("topo.json");
    std::fs::write(&topo, b"[\xc3\x28]").unwrap();
    score(&topo).assert().code(2).stderr(format!(
        "error: topology file {} is not valid UTF-8: byte 0xc3 at byte offset 1\n",
        topo.display()
    ));
    let values = dir.path().join("values.yaml");
    std::fs::write(&values, b"MPSSupport: true\n# caf\xe9\n").unwrap();
    vgpuctl()
        .args(["gates", "render", "--component", "kubelet-plugin", "--values"])
        .arg(&values)
        .assert()
        .code(2)
        .stderr(predicate::str::contains(format!(
            "values file {} is not valid UTF-8: byte 0xe9 at byte offset 22",
            values.display()
        )));
    let mock = dir.path().join("mock.yaml");
    std::fs::write(&mock, b"gpus: []\xff").unwrap();
    vgpuctl()
        .args(["devices", "--backend", "mock", "--mock-config"])
        .arg(&mock)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("mock description").and(predicate::str::contains("byte offset 8")));
}

#[test]
fn over_cap_file_exits_2_naming_the_file_its_size_and_the_cap() {
    let dir = tempfile::tempdir().unwrap();
    let big = padded_topology(dir.path(), ANNOTATION_CAP + 1);
    score(&big).assert().code(2).stdout("").stderr(format!(
        "error: topology file {} is 262145 bytes, over the cap of 262144 bytes (256 KiB); raise the cap with \
         --max-bytes N\n",
        big.display()
    ));
    // Exactly at the cap is accepted.
    let at_cap = padded_topology(dir.path(), ANNOTATION_CAP);
    score(&at_cap).assert().success().stdout("{\"score\":230}\n");
    // allocate reads the same file the same way.
    vgpuctl()
        .args(["topology", "allocate", "--available", "0-7", "--size", "2", "--topology"])
        .arg(&big)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("is 262145 bytes, over the cap of 262144 bytes"));

    let values = sparse(dir.path(), "values.yaml", DOCUMENT_CAP as u64 + 1);
    vgpuctl()
        .args(["gates", "render", "--component", "device-plugin", "--values"])
        .arg(&values)
        .assert()
        .code(2)
        .stderr(format!(
            "values file {} is 4194305 bytes, over the cap of 4194304 bytes (4 MiB); raise the cap with \
             --max-bytes N\n",
            values.display()
        ));
    let mock = sparse(dir.path(), "mock.yaml", DOCUMENT_CAP as u64 + 1);
    vgpuctl()
        .args(["devices", "--backend", "mock", "--mock-config"])
        .arg(&mock)
        .assert()
        .code(2)
        .stderr(format!(
            "error: mock description {} is 4194305 bytes, over the cap of 4194304 bytes (4 MiB); raise the cap \
             with --max-bytes N\n",
            mock.display()
        ));
}

#[test]
fn over_cap_stdin_exits_2_naming_stdin_its_size_and_the_cap() {
    // A pipe: its size is unknown, reading stops one byte past the cap.
    vgpuctl()
        .args(["decode", "node-devices", "-"])
        .write_stdin(vec![b' '; 3 * ANNOTATION_CAP])
        .assert()
        .code(2)
        .stdout("")
        .stderr(
            "error: stdin (node-devices value) is larger than the cap of 262144 bytes (256 KiB): reading stopped \
             after 262145 bytes; raise the cap with --max-bytes N\n",
        );
    // A regular file redirected to stdin: refused from its size.
    let dir = tempfile::tempdir().unwrap();
    let big = sparse(dir.path(), "big", 52_000_000);
    let out = std::process::Command::new(assert_cmd::cargo::cargo_bin!("vgpuctl"))
        .args(["decode", "node-topology", "-"])
        .stdin(Stdio::from(File::open(&big).unwrap()))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        String::from_utf8(out.stderr).unwrap(),
        "error: stdin (node-topology value) is 52000000 bytes, over the cap of 262144 bytes (256 KiB); raise \
         the cap with --max-bytes N\n"
    );
}

#[test]
fn max_bytes_raises_and_lowers_the_cap() {
    let dir = tempfile::tempdir().unwrap();
    let big = padded_topology(dir.path(), 300_000);
    score(&big).assert().code(2);
    // After the subcommand or before it (the flag is global).
    score(&big).args(["--max-bytes", "300000"]).assert().success().stdout("{\"score\":230}\n");
    vgpuctl()
        .args(["--max-bytes", "512KiB", "topology", "score", "--set", "0,3", "--topology"])
        .arg(&big)
        .assert()
        .success();
    score(&big).args(["--max-bytes", "299999"]).assert().code(2).stderr(predicate::str::contains(
        "is 300000 bytes, over the cap of 299999 bytes; raise the cap with --max-bytes N",
    ));
    // Raising the cap on stdin.
    let text = std::fs::read_to_string(&big).unwrap();
    vgpuctl().args(["decode", "node-topology", "-"]).write_stdin(text.clone()).assert().code(2);
    vgpuctl()
        .args(["decode", "node-topology", "-", "--max-bytes", "1Mi"])
        .write_stdin(text)
        .assert()
        .success();
    // Lowering it applies to an inline value too.
    vgpuctl()
        .args(["--max-bytes", "10", "decode", "pod-devices", "main[0_GPU-aaa_50_4096]"])
        .assert()
        .code(2)
        .stderr("error: the pod-devices value argument is 23 bytes, over the cap of 10 bytes; raise the cap with --max-bytes N\n");
    // And to documents.
    vgpuctl()
        .args(["devices", "--backend", "mock", "--max-bytes", "1KiB", "--mock-config"])
        .arg(mock_example())
        .assert()
        .code(2)
        .stderr(predicate::str::contains("over the cap of 1024 bytes (1 KiB)"));
    vgpuctl()
        .args(["devices", "--backend", "mock", "--max-bytes", "1MiB", "--mock-config"])
        .arg(mock_example())
        .assert()
        .success();
}

#[test]
fn bad_max_bytes_is_a_usage_error() {
    for (value, message) in
        [("0", "at least 1 byte"), ("4MB", "unknown unit"), ("lots", "not a size"), ("2GiB", "largest cap")]
    {
        vgpuctl()
            .args(["decode", "pod-devices", "x", "--max-bytes", value])
            .assert()
            .code(2)
            .stderr(predicate::str::contains(message));
    }
}

#[test]
fn a_large_file_is_refused_without_reading_it_whole() {
    let dir = tempfile::tempdir().unwrap();
    // 52 MB (sparse): refused from its size, before any read.
    let big = sparse(dir.path(), "big.json", 52_000_000);
    score(&big)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("is 52000000 bytes, over the cap of 262144 bytes (256 KiB)"));
    // An endless input (no size in its metadata): reading stops one byte past the cap, so the command ends.
    let zero = Path::new("/dev/zero");
    if zero.exists() {
        score(zero).timeout(std::time::Duration::from_secs(60)).assert().code(2).stderr(
            "error: topology file /dev/zero is larger than the cap of 262144 bytes (256 KiB): reading stopped \
             after 262145 bytes; raise the cap with --max-bytes N\n",
        );
        vgpuctl()
            .args(["gates", "render", "--component", "device-plugin", "--values", "/dev/zero"])
            .timeout(std::time::Duration::from_secs(60))
            .assert()
            .code(2)
            .stderr(predicate::str::contains("reading stopped after 4194305 bytes"));
    }
}

#[test]
fn unreadable_inputs_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    // stdin that cannot be read (a directory): an input error, not exit 1.
    let out = std::process::Command::new(assert_cmd::cargo::cargo_bin!("vgpuctl"))
        .args(["decode", "node-config", "-"])
        .stdin(Stdio::from(File::open(dir.path()).unwrap()))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.starts_with("error: cannot read stdin (node-config value): "), "{stderr}");
    score(dir.path()).assert().code(2).stderr(predicate::str::starts_with(format!(
        "error: cannot read topology file {}: ",
        dir.path().display()
    )));
    vgpuctl()
        .args(["devices", "--backend", "mock", "--mock-config", "/nonexistent/mock.yaml"])
        .assert()
        .code(2)
        .stderr(predicate::str::starts_with("error: cannot read mock description /nonexistent/mock.yaml: "));
}

#[test]
fn mock_description_errors_still_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&bad, "gpus: 7\n").unwrap();
    vgpuctl().args(["devices", "--backend", "mock", "--mock-config"]).arg(&bad).assert().code(2).stderr(
        predicate::str::starts_with(format!("error: cannot parse the mock description {}: ", bad.display())),
    );
    let json = dir.path().join("bad.json");
    std::fs::write(&json, r#"{"gpus": [{"uuid": "GPU-a", "name": "L4", "memoryMiB": 0}]}"#).unwrap();
    vgpuctl()
        .args(["devices", "--backend", "mock", "--mock-config"])
        .arg(&json)
        .assert()
        .code(2)
        .stderr(predicate::str::contains(format!("mock description {}", json.display())));
}
