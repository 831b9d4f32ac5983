//! Gate `SharedSMUtilizationWatcher` on the DRA path, at the driver layer ([`Driver`] serving its real
//! sockets over real files, mock backend with utilization samples): the device plugin's shared SM watcher
//! runs on the manager directory and `watcher/sm_util.config` gets the backend's samples (read back with
//! `vgpu_core::abi::sm_util::read`); a prepared vGPU claim's CDI spec carries `EXTERNAL_SM_WATCHER_ENABLED=TRUE`
//! and the read-only `watcher/` mount. Gate off: `EXTERNAL_SM_WATCHER_ENABLED=FALSE`, no mount, no file. Gate
//! on without a backend: serving fails naming the gate.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::{sync::Arc, time::Duration};

use support::TestNode;
use vgpu_core::{
    abi::sm_util,
    backend::{DeviceBackend, mock::MockBackend},
};
use vgpu_dra::claims::ClaimRef;
use vgpu_dra::driver::Driver;
use vgpu_gates::DraGate;

const MOCK: &str = "\
gpus:
  - { uuid: GPU-a, name: NVIDIA A30, memoryMiB: 24576, minor: 0, processes: [{ pid: 4242, usedMemoryMiB: 1024 }] }
  - { uuid: GPU-b, name: NVIDIA A30, memoryMiB: 24576, minor: 1 }
utilization:
  - { gpu: 0, pid: 4242, timestampUs: 1700000000000100, smPercent: 55, memoryPercent: 20 }
  - { gpu: 1, pid: 5151, timestampUs: 1700000000000200, smPercent: 30 }
";

fn node(gate: bool) -> TestNode {
    let mut node = TestNode::new();
    let mut config = (*node.config).clone();
    config.gates.set_gate(DraGate::SharedSMUtilizationWatcher, gate).unwrap();
    // One pass at start (the interval's first tick), none after: the first pass consumes the samples.
    config.sm_watcher_period = Duration::from_secs(3600);
    node.config = Arc::new(config);
    node.add_vgpu_claim("c1", "u1", "vgpu-0", "s1", "10", "1Gi");
    node
}

fn spec(node: &TestNode) -> vgpu_core::cdi::Spec {
    serde_json::from_slice(&std::fs::read(node.config.cdi_spec_path("u1")).unwrap()).unwrap()
}

fn backend() -> Arc<dyn DeviceBackend> {
    Arc::new(MockBackend::from_yaml_str(MOCK).unwrap())
}

#[tokio::test]
async fn gate_on_runs_the_watcher_and_claims_read_it() {
    let node = node(true);
    let state = node.state().await;
    let running =
        Driver::new(Arc::clone(&state), node.health.subscribe()).with_sm_watcher(backend()).serve().unwrap();
    let path = node.config.manager_dir.join("watcher/sm_util.config");
    assert_eq!(running.sm_watcher_file.as_deref(), Some(path.as_path()));

    let results = state.prepare(&[ClaimRef::new("ns", "c1", "u1")]).await;
    assert!(results["u1"].is_ok(), "{results:?}");
    let spec = spec(&node);
    let env = &spec.container_edits.env;
    assert!(env.iter().any(|e| e == "EXTERNAL_SM_WATCHER_ENABLED=TRUE"), "{env:?}");
    assert!(!env.iter().any(|e| e == "EXTERNAL_SM_WATCHER_ENABLED=FALSE"), "{env:?}");
    let watcher: Vec<_> = spec
        .container_edits
        .mounts
        .iter()
        .filter(|m| m.container_path == "/etc/vgpu-manager/watcher")
        .collect();
    assert_eq!(watcher.len(), 1, "{:?}", spec.container_edits.mounts);
    assert_eq!(watcher[0].host_path, node.config.host_manager_dir.join("watcher").display().to_string());
    assert_eq!(watcher[0].options, ["ro", "nosuid", "nodev", "bind"]);

    // Poll (bounded) until the first pass is published: both GPUs have their sample.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let util = loop {
        if let Ok(u) = sm_util::read(&path)
            && u.devices[0].samples.len() == 1
            && u.devices[1].samples.len() == 1
        {
            break u;
        }
        assert!(tokio::time::Instant::now() < deadline, "sm_util.config never got the samples");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(util.devices[0].samples[0].pid, 4242);
    assert_eq!(util.devices[0].samples[0].sm_percent, 55);
    assert_eq!(util.devices[0].compute[0].used_memory_bytes, Some(1024 << 20));
    assert_eq!(util.devices[1].samples[0].sm_percent, 30);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), sm_util::FILE_SIZE as u64);

    running.stop().await.unwrap();
    // The file stays (readers keep it open); Unprepare leaves it alone.
    assert!(path.exists());
}

#[tokio::test]
async fn gate_off_keeps_todays_edits_and_starts_no_watcher() {
    let node = node(false);
    let state = node.state().await;
    let running =
        Driver::new(Arc::clone(&state), node.health.subscribe()).with_sm_watcher(backend()).serve().unwrap();
    assert_eq!(running.sm_watcher_file, None);
    assert!(state.prepare(&[ClaimRef::new("ns", "c1", "u1")]).await["u1"].is_ok());
    let spec = spec(&node);
    assert!(spec.container_edits.env.iter().any(|e| e == "EXTERNAL_SM_WATCHER_ENABLED=FALSE"));
    assert!(spec.container_edits.mounts.iter().all(|m| !m.container_path.contains("watcher")));
    assert_eq!(
        spec.container_edits.mounts.iter().map(|m| m.container_path.as_str()).collect::<Vec<_>>(),
        ["/etc/vgpu-manager/driver/libvgpu-control.so", "/etc/ld.so.preload", "/etc/vgpu-manager/.host_proc"]
    );
    running.stop().await.unwrap();
    assert!(!node.config.manager_dir.join("watcher").exists());
}

#[tokio::test]
async fn gate_on_without_a_backend_fails_before_binding() {
    let node = node(true);
    let err = Driver::new(node.state().await, node.health.subscribe()).serve().unwrap_err().to_string();
    assert!(err.starts_with("SharedSMUtilizationWatcher=true: no device backend"), "{err}");
    assert!(!node.config.dra_socket().exists());
}

#[tokio::test]
async fn gate_on_with_an_unusable_manager_dir_fails_naming_the_file() {
    let mut node = node(true);
    let mut config = (*node.config).clone();
    // A regular file where the manager directory should be.
    let blocker = node.path("not-a-dir");
    std::fs::write(&blocker, "x").unwrap();
    config.manager_dir = blocker;
    node.config = Arc::new(config);
    let err = Driver::new(node.state().await, node.health.subscribe())
        .with_sm_watcher(backend())
        .serve()
        .unwrap_err()
        .to_string();
    assert!(err.contains("cannot set up the shared SM watcher file") && err.contains("not-a-dir"), "{err}");
}
