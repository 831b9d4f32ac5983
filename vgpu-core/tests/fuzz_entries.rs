//! The cargo-fuzz entries for the `vgpu-core` decoders (`fuzz/src/decoders.rs`), run on stable: every seed in
//! `fuzz/seeds/<target>/`, then mutated seeds and arbitrary bytes for a bounded number of cases per target
//! (`fuzz/stable/harness.rs`: `VGPU_FUZZ_CASES`, `VGPU_FUZZ_SECONDS`, `PROPTEST_RNG_SEED`). The same entry
//! functions are the libFuzzer targets (`fuzz/fuzz_targets/*.rs`), so the two cannot drift.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../../fuzz/src/corpus.rs"]
mod corpus;
#[path = "../../fuzz/src/decoders.rs"]
mod decoders;
#[path = "../../fuzz/stable/harness.rs"]
mod harness;

fn run(target: &str) {
    let (_, entry) = decoders::TARGETS.iter().find(|(name, _)| *name == target).expect("a known target");
    harness::run(&corpus::seeds_root(env!("CARGO_MANIFEST_DIR")), target, *entry, harness::cases(2000));
}

/// Every entry has a test below (a new entry without one fails here).
#[test]
fn every_entry_has_a_test() {
    let tested = [
        "node_device_register",
        "node_config_info",
        "node_device_topology",
        "node_gpu_domain",
        "pod_devices",
        "device_filter",
        "node_config_json",
        "node_config_yaml",
        "exclude_devices",
        "vgpu_config",
        "devices_json",
        "quantity",
    ];
    let names: Vec<&str> = decoders::TARGETS.iter().map(|(n, _)| *n).collect();
    assert_eq!(names, tested);
}

#[test]
fn node_device_register() {
    run("node_device_register");
}

#[test]
fn node_config_info() {
    run("node_config_info");
}

#[test]
fn node_device_topology() {
    run("node_device_topology");
}

#[test]
fn node_gpu_domain() {
    run("node_gpu_domain");
}

#[test]
fn pod_devices() {
    run("pod_devices");
}

#[test]
fn device_filter() {
    run("device_filter");
}

#[test]
fn node_config_json() {
    run("node_config_json");
}

#[test]
fn node_config_yaml() {
    run("node_config_yaml");
}

#[test]
fn exclude_devices() {
    run("exclude_devices");
}

#[test]
fn vgpu_config() {
    run("vgpu_config");
}

#[test]
fn devices_json() {
    run("devices_json");
}

#[test]
fn quantity() {
    run("quantity");
}
