//! `Daemon::with_gfd_labels` (`vgpu-device-plugin --gfd-labels`): the GPU feature labels computed from the
//! backend, as gpu-feature-discovery writes them; the publisher sends them with every node patch
//! (`tests/publisher.rs`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use vgpu_core::backend::{DeviceBackend, mock::MockBackend};
use vgpu_deviceplugin::{cluster::InMemoryCluster, config::PluginConfig, daemon::Daemon};

const MOCK: &str = r#"
driver:
  version: 570.86.10
  cudaVersion: "12.8"
gpus:
  - uuid: GPU-a
    name: NVIDIA A100-SXM4-80GB
    memoryMiB: 81920
    computeCapability: "8.0"
  - uuid: GPU-b
    name: NVIDIA A100-SXM4-80GB
    memoryMiB: 81920
    computeCapability: "8.0"
"#;

#[test]
fn labels_come_from_the_backend_and_are_absent_unless_asked() {
    let backend: Arc<dyn DeviceBackend> = Arc::new(MockBackend::from_yaml_str(MOCK).unwrap());
    let cluster = Arc::new(InMemoryCluster::new(Vec::new()));
    let daemon = Daemon::new(PluginConfig::new("node-1"), backend, cluster.clone(), cluster).unwrap();
    assert!(daemon.gfd.is_empty(), "no GFD labels without --gfd-labels");
    let daemon = daemon.with_gfd_labels(Some("DGX A100".into())).unwrap();
    let labels = &daemon.gfd;
    assert_eq!(labels["nvidia.com/gpu.product"], "NVIDIA-A100-SXM4-80GB");
    assert_eq!(labels["nvidia.com/gpu.count"], "2");
    assert_eq!(labels["nvidia.com/gpu.memory"], "81920");
    assert_eq!(labels["nvidia.com/gpu.family"], "ampere");
    assert_eq!(labels["nvidia.com/gpu.machine"], "DGX-A100");
    assert_eq!(labels["nvidia.com/cuda.driver.major"], "570");
}
