//! [`ClaimsAndProcesses`], the kubelet plugin's answer to "who holds this GPU" before a vfio-switch Job takes
//! it off `nvidia`: a claim prepared on the GPU (the plugin's real checkpoint in a temporary node) and the
//! driver's processes on it (mock backend) hold it; Unprepare releases it; another GPU and a GPU the driver
//! no longer shows are free.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::Arc;

use support::TestNode;
use vgpu_core::{
    backend::{DeviceBackend, mock::MockBackend},
    discovery::PciAddress,
};
use vgpu_dra::claims::ClaimRef;
use vgpu_dra::vfio_switch::usage::{ClaimsAndProcesses, GpuUsage};

/// The test node's two GPUs (mock default bus IDs 0000:01:00.0 and 0000:02:00.0), a process on the second.
const MOCK: &str = "gpus:
  - { uuid: GPU-a, name: NVIDIA A30, memoryMiB: 24576, minor: 0 }
  - { uuid: GPU-b, name: NVIDIA A30, memoryMiB: 24576, minor: 1,
      processes: [{ pid: 4242, usedMemoryMiB: 1024, kind: compute }] }
";

fn pci(text: &str) -> PciAddress {
    text.parse().unwrap()
}

#[tokio::test]
async fn prepared_claims_and_processes_hold_a_gpu() {
    let node = TestNode::new();
    node.add_vgpu_claim("c", "u-c", "vgpu-0", "s1", "30", "2Gi");
    let state = node.state().await;
    let backend: Arc<dyn DeviceBackend> = Arc::new(MockBackend::from_yaml_str(MOCK).unwrap());
    let usage = ClaimsAndProcesses::new(Arc::clone(&state), backend);
    let (first, second) = (pci("0000:01:00.0"), pci("0000:02:00.0"));

    assert_eq!(usage.holders(&first).await.unwrap(), Vec::<String>::new(), "nothing prepared yet");
    assert_eq!(usage.holders(&second).await.unwrap(), ["process 4242"]);

    assert!(state.prepare(&[ClaimRef::new("ns", "c", "u-c")]).await["u-c"].is_ok());
    assert_eq!(usage.holders(&first).await.unwrap(), ["claim ns/c"]);
    assert_eq!(usage.holders(&second).await.unwrap(), ["process 4242"], "the claim is on the other GPU");

    assert!(state.unprepare(&[ClaimRef::new("ns", "c", "u-c")]).await["u-c"].is_ok());
    assert_eq!(usage.holders(&first).await.unwrap(), Vec::<String>::new(), "released by Unprepare");
    // A GPU the driver does not show (already on vfio-pci) has no holders of ours.
    assert_eq!(usage.holders(&pci("0000:86:00.0")).await.unwrap(), Vec::<String>::new());
}
