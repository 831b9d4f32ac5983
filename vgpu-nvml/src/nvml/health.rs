//! The NVML health thread: one event set per subscriber, `nvmlEventSetWait` in a loop, events turned into
//! [`HealthEvent`]s by [`crate::xid::classify_event`].
//!
//! As in the NVIDIA device plugin, the set watches critical Xids and single/double-bit ECC errors (as far as
//! each GPU supports them). A wait error other than a timeout marks the devices NVML can no longer reach as
//! lost (all of them when none can be singled out), each once. A device whose events cannot be registered
//! because it is too old is logged and left unwatched; one that is lost at registration is reported lost.

use std::{
    collections::BTreeSet,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use nvml_wrapper::{Nvml, bitmasks::event::EventTypes, enums::event::XidError, error::NvmlError};
use vgpu_core::backend::{HealthEvent, HealthEventKind, HealthEventSender};

use super::WatchedDevice;
use crate::xid::{RawEvent, UNKNOWN_XID, XidPolicy, classify_event};

pub(crate) struct Watcher {
    pub(crate) nvml: Arc<Nvml>,
    pub(crate) policy: XidPolicy,
    pub(crate) devices: Vec<WatchedDevice>,
    pub(crate) tx: HealthEventSender,
    pub(crate) stop: Arc<AtomicBool>,
    pub(crate) wait_ms: u32,
}

impl Watcher {
    fn running(&self) -> bool {
        !self.stop.load(Ordering::SeqCst) && self.tx.is_open()
    }

    fn send(&self, device: &WatchedDevice, kind: HealthEventKind, message: String) -> bool {
        self.tx.send(HealthEvent { index: device.index, uuid: device.uuid.clone(), kind, message })
    }

    fn lost(&self, device: &WatchedDevice, lost: &mut BTreeSet<u32>, message: &str) {
        if lost.insert(device.index) {
            self.send(device, HealthEventKind::DeviceLost, message.to_owned());
        }
    }

    pub(crate) fn run(self) {
        let nvml = Arc::clone(&self.nvml);
        let mask = EventTypes::CRITICAL_XID_ERROR
            | EventTypes::DOUBLE_BIT_ECC_ERROR
            | EventTypes::SINGLE_BIT_ECC_ERROR;
        let mut lost = BTreeSet::new();
        let Ok(mut set) = nvml.create_event_set() else {
            tracing::warn!("cannot create an NVML event set; GPU health is not watched");
            return;
        };
        let mut registered: Vec<usize> = Vec::new();
        for (pos, device) in self.devices.iter().enumerate() {
            let handle = match nvml.device_by_uuid(device.uuid.as_str()) {
                Ok(handle) => handle,
                Err(err) => {
                    self.lost(device, &mut lost, &format!("GPU lost: cannot get its handle: {err}"));
                    continue;
                }
            };
            let events = handle.supported_event_types().map(|s| s & mask).unwrap_or(mask);
            match handle.register_events(events, set) {
                Ok(s) => {
                    set = s;
                    registered.push(pos);
                }
                Err(err) => {
                    if matches!(err.error, NvmlError::GpuLost) {
                        self.lost(device, &mut lost, "GPU lost while registering health events");
                    } else {
                        tracing::warn!(uuid = %device.uuid, error = %err.error, "GPU health events not supported; not watched");
                    }
                    // The set was released by the failed call: rebuild it with the devices registered so far.
                    let Ok(fresh) = nvml.create_event_set() else { return };
                    set = fresh;
                    for &prev in &registered {
                        let Some(prev) = self.devices.get(prev) else { continue };
                        let Ok(handle) = nvml.device_by_uuid(prev.uuid.as_str()) else { continue };
                        let events = handle.supported_event_types().map(|s| s & mask).unwrap_or(mask);
                        match handle.register_events(events, set) {
                            Ok(s) => set = s,
                            Err(_) => match nvml.create_event_set() {
                                Ok(s) => set = s,
                                Err(_) => return,
                            },
                        }
                    }
                }
            }
        }

        while self.running() {
            match set.wait(self.wait_ms) {
                Ok(event) => {
                    let raw = RawEvent {
                        xid: event.event_data.map(|x| match x {
                            XidError::Value(v) => v,
                            XidError::Unknown => UNKNOWN_XID,
                        }),
                        double_bit_ecc: event.event_type.contains(EventTypes::DOUBLE_BIT_ECC_ERROR),
                    };
                    let Some(kind) = classify_event(raw, &self.policy) else { continue };
                    let uuid = event.device.uuid().ok();
                    let parent = if event.device.mig_is_mig_device_handle().unwrap_or(false) {
                        event.device.mig_parent_device().ok().and_then(|p| p.uuid().ok())
                    } else {
                        None
                    };
                    let target: Vec<&WatchedDevice> = match parent.or(uuid) {
                        Some(uuid) => self.devices.iter().filter(|d| d.uuid == uuid).collect(),
                        // Like the device plugin: an event whose device cannot be named hits every device.
                        None => self.devices.iter().collect(),
                    };
                    for device in target {
                        if !self.send(device, kind.clone(), format!("NVML event {kind}")) {
                            return;
                        }
                    }
                }
                Err(NvmlError::Timeout) => {}
                Err(err) => {
                    let message = format!("GPU lost: NVML event wait failed: {err}");
                    let unreachable: Vec<&WatchedDevice> = self
                        .devices
                        .iter()
                        .filter(|d| nvml.device_by_uuid(d.uuid.as_str()).and_then(|h| h.uuid()).is_err())
                        .collect();
                    let hit =
                        if unreachable.is_empty() { self.devices.iter().collect() } else { unreachable };
                    for device in hit {
                        self.lost(device, &mut lost, &message);
                    }
                    // Do not spin on a persistent error.
                    std::thread::sleep(Duration::from_millis(u64::from(self.wait_ms.min(1000))));
                }
            }
        }
    }
}
