//! The node's GPUs as the plugins advertise them, and their health over time.
//!
//! [`node_devices`] applies the node settings to the backend's devices (split count, core and memory scaling,
//! exclusions). [`DeviceState`] holds the current list in a `tokio::sync::watch` channel; [`apply_health_event`]
//! folds backend [`HealthEvent`]s into it and [`DeviceState::watch_backend`] does so for a backend's stream.

use std::sync::Arc;

use tokio::sync::watch;
use tokio_stream::StreamExt;
use vgpu_core::{
    backend::{HealthEvent, HealthEventKind, HealthEvents},
    model::{DeviceHealth, GpuDevice},
    node_config::NodeSettings,
};

/// The devices as published: `split_count` = settings split, `cores` = `coresScaling × 100`,
/// `memory_mib` = `memoryScaling × total`, excluded GPUs unhealthy.
pub fn node_devices(devices: &[GpuDevice], settings: &NodeSettings) -> Vec<GpuDevice> {
    devices
        .iter()
        .map(|d| {
            let mut d = d.clone();
            d.split_count = settings.device_split_count;
            // f64 → u64 `as` saturates (and maps NaN to 0); scaling is validated finite and ≥ 0.
            d.cores = (settings.device_cores_scaling * 100.0) as u64;
            d.memory_mib = (settings.device_memory_scaling * d.memory_mib as f64) as u64;
            if settings.exclude_devices.contains(d.index, &d.uuid) {
                d.health = DeviceHealth::Unhealthy;
            }
            d
        })
        .collect()
}

/// Applies one event: critical events make the device unhealthy, `Recovered` healthy again unless the GPU
/// is `pinned` (excluded by configuration). Returns whether anything changed.
pub fn apply_health_event(devices: &mut [GpuDevice], event: &HealthEvent, pinned: &[u32]) -> bool {
    let Some(device) = devices.iter_mut().find(|d| d.index == event.index || d.uuid == event.uuid) else {
        return false;
    };
    let health = if event.kind.is_critical() {
        DeviceHealth::Unhealthy
    } else if event.kind == HealthEventKind::Recovered && !pinned.contains(&device.index) {
        DeviceHealth::Healthy
    } else {
        return false;
    };
    let changed = device.health != health;
    device.health = health;
    changed
}

/// The current device list, shared by every plugin; cheap to clone.
#[derive(Debug, Clone)]
pub struct DeviceState {
    tx: Arc<watch::Sender<Vec<GpuDevice>>>,
    pinned: Arc<Vec<u32>>,
}

impl DeviceState {
    /// Starts from `devices`; those unhealthy now because of the settings' exclusions stay unhealthy.
    pub fn new(devices: Vec<GpuDevice>, settings: &NodeSettings) -> Self {
        let pinned = devices
            .iter()
            .filter(|d| settings.exclude_devices.contains(d.index, &d.uuid))
            .map(|d| d.index)
            .collect();
        Self { tx: Arc::new(watch::Sender::new(devices)), pinned: Arc::new(pinned) }
    }

    /// A receiver that sees the current list and every change.
    pub fn subscribe(&self) -> watch::Receiver<Vec<GpuDevice>> {
        self.tx.subscribe()
    }

    /// A copy of the current list.
    pub fn devices(&self) -> Vec<GpuDevice> {
        self.tx.borrow().clone()
    }

    /// Applies one event; subscribers are notified only when a device's health changed.
    pub fn apply(&self, event: &HealthEvent) -> bool {
        self.tx.send_if_modified(|devices| apply_health_event(devices, event, &self.pinned))
    }

    /// Folds a backend's health stream into the state until the stream ends.
    pub async fn watch_backend(self, mut events: HealthEvents) {
        while let Some(event) = StreamExt::next(&mut events).await {
            if self.apply(&event) {
                tracing::warn!(gpu = event.index, uuid = %event.uuid, kind = %event.kind, "device health changed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(index: u32, uuid: &str) -> GpuDevice {
        GpuDevice { index, uuid: uuid.into(), memory_mib: 1000, ..GpuDevice::default() }
    }

    #[test]
    fn settings_apply_and_exclusions_stay_unhealthy() {
        let mut settings =
            NodeSettings { device_split_count: 4, device_memory_scaling: 1.5, ..NodeSettings::default() };
        settings.device_cores_scaling = 2.0;
        settings.exclude_devices.push_entry("GPU-b").unwrap();
        let devices = node_devices(&[gpu(0, "GPU-a"), gpu(1, "GPU-b")], &settings);
        assert_eq!((devices[0].split_count, devices[0].cores, devices[0].memory_mib), (4, 200, 1500));
        assert!(devices[0].health.is_healthy() && !devices[1].health.is_healthy());

        let state = DeviceState::new(devices, &settings);
        let ev = |index, kind| HealthEvent { index, uuid: String::new(), kind, message: String::new() };
        assert!(!state.apply(&ev(1, HealthEventKind::Recovered)), "excluded GPUs stay unhealthy");
        assert!(!state.apply(&ev(0, HealthEventKind::Xid { code: 43 })), "application Xid");
        assert!(state.apply(&ev(0, HealthEventKind::DeviceLost)));
        assert!(!state.devices()[0].health.is_healthy());
        assert!(state.apply(&ev(0, HealthEventKind::Recovered)));
        assert!(!state.apply(&ev(7, HealthEventKind::DeviceLost)), "unknown GPU");
    }
}
