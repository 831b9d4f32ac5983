//! The node's GPUs as the plugins advertise them, and their health over time.
//!
//! [`node_devices`] applies the node settings to the backend's devices (split count, core and memory scaling,
//! exclusions). [`DeviceState`] holds the current list in a `tokio::sync::watch` channel; [`apply_health_event`]
//! folds backend [`HealthEvent`]s into it and [`DeviceState::watch_backend`] does so for a backend's stream.
//! [`DeviceState::reconfigure`] replaces the list when the node configuration changes while the plugin runs
//! ([`crate::node_config_watch`]).

use std::sync::{Arc, PoisonError, RwLock};

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

/// The indices of the GPUs `settings` excludes.
fn pinned(devices: &[GpuDevice], settings: &NodeSettings) -> Vec<u32> {
    devices.iter().filter(|d| settings.exclude_devices.contains(d.index, &d.uuid)).map(|d| d.index).collect()
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
    /// GPUs excluded by the settings: unhealthy whatever the backend reports.
    pinned: Arc<RwLock<Vec<u32>>>,
}

impl DeviceState {
    /// Starts from `devices`; those unhealthy now because of the settings' exclusions stay unhealthy.
    pub fn new(devices: Vec<GpuDevice>, settings: &NodeSettings) -> Self {
        let pinned = pinned(&devices, settings);
        Self { tx: Arc::new(watch::Sender::new(devices)), pinned: Arc::new(RwLock::new(pinned)) }
    }

    /// Replaces the list with `devices` (built by [`node_devices`] with the new `settings`) and notifies
    /// every subscriber, even when nothing changed: each `ListAndWatch` stream sends the list again and the
    /// publisher republishes. A GPU the backend's health stream made unhealthy stays unhealthy; one that
    /// was unhealthy only because the old settings excluded it comes back with the new ones.
    pub fn reconfigure(&self, devices: Vec<GpuDevice>, settings: &NodeSettings) {
        let mut pins = self.pinned.write().unwrap_or_else(PoisonError::into_inner);
        let next_pins = pinned(&devices, settings);
        self.tx.send_modify(|current| {
            let mut next = devices;
            for d in &mut next {
                let failed = current.iter().any(|old| {
                    old.index == d.index && !old.health.is_healthy() && !pins.contains(&old.index)
                });
                if failed {
                    d.health = DeviceHealth::Unhealthy;
                }
            }
            *current = next;
        });
        *pins = next_pins;
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
        let pinned = self.pinned.read().unwrap_or_else(PoisonError::into_inner);
        self.tx.send_if_modified(|devices| apply_health_event(devices, event, &pinned))
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

    #[test]
    fn reconfigure_notifies_and_keeps_failed_gpus_unhealthy() {
        let mut settings = NodeSettings { device_split_count: 2, ..NodeSettings::default() };
        settings.exclude_devices.push_entry("GPU-b").unwrap();
        let gpus = [gpu(0, "GPU-a"), gpu(1, "GPU-b"), gpu(2, "GPU-c")];
        let state = DeviceState::new(node_devices(&gpus, &settings), &settings);
        let ev = |index, kind| HealthEvent { index, uuid: String::new(), kind, message: String::new() };
        assert!(state.apply(&ev(2, HealthEventKind::DeviceLost)));
        let mut rx = state.subscribe();
        rx.borrow_and_update();

        // Split 2 → 5, GPU-b no longer excluded, GPU-a excluded now.
        let mut next = NodeSettings { device_split_count: 5, ..NodeSettings::default() };
        next.exclude_devices.push_entry("0").unwrap();
        state.reconfigure(node_devices(&gpus, &next), &next);
        assert!(rx.has_changed().unwrap(), "subscribers are told");
        let devices = state.devices();
        assert!(devices.iter().all(|d| d.split_count == 5));
        let healthy: Vec<bool> = devices.iter().map(|d| d.health.is_healthy()).collect();
        assert_eq!(healthy, [false, true, false], "excluded now, released, failed by the backend");
        // The new exclusion is pinned, the old one is not any more.
        assert!(!state.apply(&ev(0, HealthEventKind::Recovered)));
        assert!(!state.apply(&ev(1, HealthEventKind::Recovered)), "already healthy");
        assert!(state.apply(&ev(2, HealthEventKind::Recovered)));
        // The same settings again still notify (the plugins resend, the publisher republishes).
        rx.borrow_and_update();
        state.reconfigure(node_devices(&gpus, &next), &next);
        assert!(rx.has_changed().unwrap());
    }
}
