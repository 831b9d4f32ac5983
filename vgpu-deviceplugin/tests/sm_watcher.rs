//! The shared SM-utilization producer (gate `SharedSMUtilizationWatcher`, contract §7.3) through the whole
//! daemon: `Daemon::run` with the gate on over a mock backend with processes and samples writes
//! `<manager-dir>/watcher/sm_util.config`; the file is read back with `vgpu_core::abi::sm_util::read` (the
//! monitor's reader) and its bytes are checked at the offsets the layout test pins. Gate off: no file.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::{sync::Arc, time::Duration};

use vgpu_core::{
    abi::sm_util,
    backend::{DeviceBackend, mock::MockBackend},
};
use vgpu_deviceplugin::{cluster::InMemoryCluster, config::PluginConfig, daemon::Daemon};

const MOCK: &str = "\
gpus:
  - uuid: GPU-a
    name: NVIDIA L4
    memoryMiB: 8192
    processes:
      - { pid: 4242, usedMemoryMiB: 1024, kind: compute }
      - { pid: 77, usedMemoryMiB: 16, kind: graphics }
  - uuid: GPU-b
    name: NVIDIA L4
    memoryMiB: 8192
    processes:
      - { pid: 5151, usedMemoryMiB: 2048 }
utilization:
  - { gpu: 0, pid: 4242, timestampUs: 1700000000000100, smPercent: 55, memoryPercent: 20, encoderPercent: 3, decoderPercent: 4 }
  - { gpu: 1, pid: 5151, timestampUs: 1700000000000200, smPercent: 30, memoryPercent: 10 }
";

struct Running {
    dir: tempfile::TempDir,
    stop: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<Result<(), vgpu_deviceplugin::error::ServerError>>,
}

fn start(gates: &[&str]) -> Running {
    let dir = tempfile::tempdir().unwrap();
    let backend: Arc<dyn DeviceBackend> = Arc::new(MockBackend::from_yaml_str(MOCK).unwrap());
    let cluster = Arc::new(InMemoryCluster::default());
    let mut config = PluginConfig::new("node-1");
    config.device_plugin_path = dir.path().join("kubelet");
    std::fs::create_dir_all(&config.device_plugin_path).unwrap();
    config.manager_dir = dir.path().join("manager");
    config.gates = vgpu_deviceplugin::feature_gates().configure(gates.iter().copied()).unwrap();
    let mut daemon = Daemon::new(config, backend, cluster.clone(), cluster).unwrap();
    // One pass at start (the interval's first tick), none after: the first pass consumes the samples.
    daemon.sm_watcher_period = Duration::from_secs(3600);
    let (stop, task) = support::spawn_daemon(daemon);
    Running { dir, stop, task }
}

#[tokio::test]
async fn gate_on_publishes_every_gpu_in_sm_util_config() {
    let run = start(&["SharedSMUtilizationWatcher=true"]);
    let path = run.dir.path().join("manager/watcher/sm_util.config");
    // Poll (bounded) until the first pass is published: both GPUs have their sample.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let util = loop {
        if let Ok(u) = sm_util::read(&path)
            && u.devices[0].samples.len() == 1
            && u.devices[1].compute.len() == 1
        {
            break u;
        }
        assert!(tokio::time::Instant::now() < deadline, "sm_util.config never got the samples");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let d0 = &util.devices[0];
    assert_eq!(d0.samples[0].pid, 4242);
    assert_eq!(d0.samples[0].sm_percent, 55);
    assert_eq!(d0.samples[0].encoder_percent, 3);
    assert_eq!(d0.last_seen_ts, 1_700_000_000_000_100);
    assert_eq!(d0.compute.len(), 1);
    assert_eq!(d0.compute[0].used_memory_bytes, Some(1024 << 20));
    assert_eq!(d0.graphics.len(), 1);
    assert_eq!(d0.graphics[0].pid, 77);
    assert_eq!(util.devices[1].samples[0].sm_percent, 30);
    assert!(util.devices[2..].iter().all(|d| *d == sm_util::DeviceProcesses::default()));

    // The raw bytes at the offsets pinned by vgpu-core/tests/sm_util_abi.rs.
    let b = std::fs::read(&path).unwrap();
    assert_eq!(b.len(), 1_311_232);
    let u32_at = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
    let u64_at = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
    assert_eq!(u32_at(0), 4242); // samples[0].pid
    assert_eq!(u64_at(8), 1_700_000_000_000_100); // samples[0].timeStamp
    assert_eq!(u32_at(16), 55); // smUtil
    assert_eq!(u32_at(20), 20); // memUtil
    assert_eq!(u32_at(24), 3); // encUtil
    assert_eq!(u32_at(28), 4); // decUtil
    assert_eq!(u32_at(32_768), 1); // samples_size
    assert_eq!(u64_at(32_776), 1_700_000_000_000_100); // last_seen_ts
    assert_eq!(u32_at(32_784), 4242); // compute[0].pid
    assert_eq!(u64_at(32_792), 1024 << 20); // compute[0].usedGpuMemory
    assert_eq!(u32_at(57_360), 1); // compute_size
    assert_eq!(u32_at(57_368), 77); // graphics[0].pid
    assert_eq!(u32_at(81_944), 1); // graphics_size
    assert_eq!(u32_at(81_952 + 32_784), 5151); // device 1: compute[0].pid
    assert_eq!(u32_at(81_952 + 16), 30); // device 1: samples[0].smUtil

    run.stop.cancel();
    run.task.await.unwrap().unwrap();
}

#[tokio::test]
async fn gate_off_writes_nothing_a_bad_file_is_replaced_and_later_passes_take_new_samples_only() {
    let run = start(&[]);
    run.stop.cancel();
    run.task.await.unwrap().unwrap();
    assert!(!run.dir.path().join("manager/watcher").exists());

    let dir = tempfile::tempdir().unwrap();
    let path = vgpu_node::sm_watcher::SmWatcher::file_path(dir.path());
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, b"garbage").unwrap();
    let backend = Arc::new(MockBackend::from_yaml_str(MOCK).unwrap());
    let mut watcher = vgpu_node::sm_watcher::SmWatcher::open(backend, dir.path()).unwrap();
    assert_eq!(std::fs::metadata(&path).unwrap().len(), 1_311_232);
    watcher.tick().unwrap();
    assert_eq!(sm_util::read(&path).unwrap().devices[1].samples[0].pid, 5151);
    // Later passes ask only for newer samples: the slot keeps its last_seen_ts and the processes.
    watcher.tick().unwrap();
    let u = sm_util::read(&path).unwrap();
    assert!(u.devices[0].samples.is_empty());
    assert_eq!(u.devices[0].last_seen_ts, 1_700_000_000_000_100);
    assert_eq!(u.devices[0].compute[0].pid, 4242);
}
