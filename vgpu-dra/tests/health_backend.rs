//! `HealthMonitor::spawn` on real backend streams: the mock backend's scripted and injected health events
//! reach the snapshot (taints, status, message) through `DeviceBackend::health_events`, and a backend that
//! cannot give a stream leaves every device unmonitored (taint effect None, status Unknown).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use vgpu_core::{
    backend::{
        BackendError, DeviceBackend, GpuProcess, HealthEvent, HealthEventKind, HealthEvents, LinkMatrix,
        MemoryUsage, MigLayout, ProcessUtilizationSample, mock::MockBackend,
    },
    model::GpuDevice,
};
use vgpu_dra::{
    devices::{AllocatableDevices, DeviceConfig},
    health::{HealthConfig, HealthMonitor, HealthStatus},
};

const MOCK: &str = "\
gpus:
  - { uuid: GPU-A, name: NVIDIA A30, memoryMiB: 24576 }
  - { uuid: GPU-B, name: NVIDIA A30, memoryMiB: 24576 }
healthEvents:
  - { gpu: 1, kind: xid, xid: 31, afterMs: 0, message: page fault }
";

fn taints(
    monitor_rx: &tokio::sync::watch::Receiver<vgpu_dra::health::HealthSnapshot>,
    device: &str,
) -> Vec<String> {
    monitor_rx
        .borrow()
        .device_taints(device)
        .into_iter()
        .map(|t| format!("{}={}:{}", t.key, t.value.unwrap_or_default(), t.effect))
        .collect()
}

#[tokio::test]
async fn mock_backend_events_reach_the_snapshot() {
    let backend = Arc::new(MockBackend::from_yaml_str(MOCK).unwrap());
    let devices = AllocatableDevices::from_backend(backend.as_ref(), &DeviceConfig::default()).unwrap();
    let monitor = HealthMonitor::new(HealthConfig::new("manager.nvidia.com", &[]), &devices);
    let mut rx = monitor.subscribe();
    let stop = tokio_util::sync::CancellationToken::new();
    let task = monitor.spawn(backend.as_ref(), stop.clone().cancelled_owned());

    // The scripted application Xid 31: an effect-None taint, the device stays healthy.
    rx.wait_for(|s| !s.device_taints("vgpu-1").is_empty()).await.unwrap();
    assert_eq!(taints(&rx, "vgpu-1"), ["manager.nvidia.com/xid=31:None"]);
    assert_eq!(rx.borrow().status("vgpu-1"), HealthStatus::Healthy);
    assert_eq!(rx.borrow().get("vgpu-1").unwrap().message, "Xid 31: page fault");

    // An injected lost GPU: NoSchedule, unhealthy; the other device is untouched.
    let lost = HealthEvent {
        index: 0,
        uuid: "GPU-A".into(),
        kind: HealthEventKind::DeviceLost,
        message: String::new(),
    };
    assert_eq!(backend.inject_health_event(lost), 1);
    rx.wait_for(|s| s.status("vgpu-0") == HealthStatus::Unhealthy).await.unwrap();
    assert_eq!(taints(&rx, "vgpu-0"), ["manager.nvidia.com/gpu-lost=:NoSchedule"]);
    assert_eq!(taints(&rx, "vgpu-1"), ["manager.nvidia.com/xid=31:None"]);

    stop.cancel();
    task.await.unwrap();
}

/// A backend whose health stream cannot be opened.
struct NoHealth(Vec<GpuDevice>);

impl DeviceBackend for NoHealth {
    fn name(&self) -> &'static str {
        "no-health"
    }
    fn devices(&self) -> Result<Vec<GpuDevice>, BackendError> {
        Ok(self.0.clone())
    }
    fn memory_usage(&self, _: u32) -> Result<MemoryUsage, BackendError> {
        Ok(MemoryUsage::default())
    }
    fn topology(&self) -> Result<LinkMatrix, BackendError> {
        Err(BackendError::NotSupported { backend: "no-health", operation: "topology" })
    }
    fn health_events(&self) -> Result<HealthEvents, BackendError> {
        Err(BackendError::NotSupported { backend: "no-health", operation: "health events" })
    }
    fn processes(&self, _: u32) -> Result<Vec<GpuProcess>, BackendError> {
        Ok(Vec::new())
    }
    fn process_utilization(&self, _: u32, _: u64) -> Result<Vec<ProcessUtilizationSample>, BackendError> {
        Ok(Vec::new())
    }
    fn mig_layout(&self, _: u32) -> Result<MigLayout, BackendError> {
        Ok(MigLayout::default())
    }
}

#[tokio::test]
async fn a_backend_without_health_events_leaves_devices_unmonitored() {
    let gpu = GpuDevice { index: 0, uuid: "GPU-A".into(), memory_mib: 1024, ..GpuDevice::default() };
    let backend = NoHealth(vec![gpu]);
    let devices = AllocatableDevices::from_backend(&backend, &DeviceConfig::default()).unwrap();
    let monitor = HealthMonitor::new(HealthConfig::new("manager.nvidia.com", &[]), &devices);
    let rx = monitor.subscribe();
    let task = monitor.spawn(&backend, async {});
    task.await.unwrap();
    let snapshot = rx.borrow();
    assert_eq!(snapshot.status("vgpu-0"), HealthStatus::Unknown);
    assert_eq!(
        snapshot.get("vgpu-0").unwrap().message,
        "cannot watch device health: health events is not supported by the no-health backend"
    );
    drop(snapshot);
    assert_eq!(taints(&rx, "vgpu-0"), ["manager.nvidia.com/unmonitored=:None"]);
}
