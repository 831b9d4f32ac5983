//! Device health for the DRA driver (gate `NVMLDeviceHealthCheck`): the backend's health events folded into
//! per-device health and the DeviceTaints the published devices carry.
//!
//! The source is the same [`DeviceBackend::health_events`] stream the device plugin's
//! `vgpu_deviceplugin::inventory::DeviceState::watch_backend` consumes; only the sink differs. The result is a
//! [`HealthSnapshot`] behind a [`tokio::sync::watch`] channel: the [`SlicePublisher`](crate::slices::publisher::SlicePublisher)
//! republishes the slices with the taints when it changes, and the kubelet's resource-health stream
//! (`DRAResourceHealth.NodeWatchResources`) reports each device's [`HealthStatus`] and last-updated time.
//!
//! Event → health (taint keys are `<driver>/<name>`, e.g. `manager.nvidia.com/xid`; contract §9):
//!
//! | event | taint key | value | effect | status |
//! |---|---|---|---|---|
//! | Xid in the ignore list (13, 31, 43, 45, 68, 109 + `--additional-xids-to-ignore`) | `xid` | the Xid | `None` (unless a `NoSchedule` Xid taint is already there) | unchanged |
//! | any other Xid | `xid` | the Xid | `NoSchedule` | Unhealthy |
//! | uncorrectable ECC error | `xid` | `48` (the double-bit ECC Xid) | `NoSchedule` | Unhealthy |
//! | device lost | `gpu-lost` | – | `NoSchedule` | Unhealthy |
//! | recovered | `xid` and `gpu-lost` removed | | | Healthy |
//! | no health stream (subscribe failed, stream ended) | `unmonitored` on every device | – | `None` | Unknown |
//!
//! One device carries at most three taints (the API allows 16). A taint's `timeAdded` is the time it was first
//! set with its current value and effect; its value or effect changing resets it. With the gate off there is
//! no health watch: [`HealthSnapshot::unmonitored_default`] has no devices and no taints, and the status of
//! every device reads [`HealthStatus::Unknown`].
//!
//! ```
//! use vgpu_core::backend::{HealthEvent, HealthEventKind, mock::MockBackend};
//! use vgpu_dra::{devices::{AllocatableDevices, DeviceConfig}, health::{HealthConfig, HealthMonitor, HealthStatus}};
//!
//! let backend = MockBackend::from_yaml_str("gpus:\n  - { uuid: GPU-A, name: A30, memoryMiB: 1024 }\n")?;
//! let devices = AllocatableDevices::from_backend(&backend, &DeviceConfig::default())?;
//! let monitor = HealthMonitor::new(HealthConfig::new("manager.nvidia.com", &[]), &devices);
//! let health = monitor.subscribe();
//! let xid = |code| HealthEvent { index: 0, uuid: "GPU-A".into(), kind: HealthEventKind::Xid { code }, message: String::new() };
//! assert!(monitor.apply(&xid(79)));
//! let snapshot = health.borrow();
//! let device = snapshot.get("vgpu-0").expect("tracked");
//! assert_eq!(device.status, HealthStatus::Unhealthy);
//! let taints = snapshot.device_taints("vgpu-0");
//! assert_eq!((taints[0].key.as_str(), taints[0].value.as_deref(), taints[0].effect.as_str()), ("manager.nvidia.com/xid", Some("79"), "NoSchedule"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    future::Future,
    sync::Arc,
};

use k8s_openapi::{api::resource::v1::DeviceTaint, apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};
use tokio::sync::watch;
use tokio_stream::StreamExt;
use vgpu_core::{
    backend::{DeviceBackend, HealthEvent, HealthEventKind, HealthEvents, health::APPLICATION_XIDS},
    clock::{Clock, SystemClock},
};

use crate::devices::AllocatableDevices;

/// Taint key name (after `<driver>/`) for Xid errors.
pub const TAINT_XID: &str = "xid";
/// Taint key name for lost GPUs.
pub const TAINT_GPU_LOST: &str = "gpu-lost";
/// Taint key name for devices whose health is not watched.
pub const TAINT_UNMONITORED: &str = "unmonitored";
/// The Xid an uncorrectable (double-bit) ECC error is reported as.
pub const XID_DOUBLE_BIT_ECC: u64 = 48;

/// Errors of the health module.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HealthError {
    /// `--additional-xids-to-ignore` holds something that is not a list of non-negative integers.
    #[error(
        "invalid --additional-xids-to-ignore {input:?}: entry {entry:?} is not a non-negative integer (expected a comma-separated list of Xids, e.g. 48,79)"
    )]
    BadXidList {
        /// The whole flag value.
        input: String,
        /// The offending entry.
        entry: String,
    },
}

/// Parses `--additional-xids-to-ignore`: comma-separated Xids, blanks ignored (`""` is the empty list).
///
/// ```
/// assert_eq!(vgpu_dra::health::parse_xid_list(" 48, 79,")?, vec![48, 79]);
/// assert!(vgpu_dra::health::parse_xid_list("48;79").is_err());
/// # Ok::<(), vgpu_dra::health::HealthError>(())
/// ```
pub fn parse_xid_list(input: &str) -> Result<Vec<u64>, HealthError> {
    input
        .split(',')
        .map(str::trim)
        .filter(|entry| !entry.is_empty())
        .map(|entry| {
            entry
                .parse::<u64>()
                .map_err(|_| HealthError::BadXidList { input: input.to_owned(), entry: entry.to_owned() })
        })
        .collect()
}

/// What the health fold needs: the driver (taint key domain) and the Xids that only get an effect-`None` taint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthConfig {
    /// The driver name, the taint keys' prefix.
    pub driver: String,
    /// Application Xids plus `--additional-xids-to-ignore`.
    pub ignored_xids: BTreeSet<u64>,
}

impl HealthConfig {
    /// The application Xids (13, 31, 43, 45, 68, 109) plus `additional`.
    pub fn new(driver: &str, additional: &[u64]) -> Self {
        let ignored_xids = APPLICATION_XIDS.iter().chain(additional).copied().collect();
        Self { driver: driver.to_owned(), ignored_xids }
    }

    fn key(&self, name: &str) -> String {
        format!("{}/{name}", self.driver)
    }
}

/// A device's health as the kubelet's resource-health stream reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum HealthStatus {
    /// Usable.
    Healthy,
    /// A hardware error or a lost device.
    Unhealthy,
    /// Not watched (gate off, or the health stream is gone).
    #[default]
    Unknown,
}

impl HealthStatus {
    /// `Healthy`, `Unhealthy` or `Unknown` (the names of the DRA health API).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Healthy => "Healthy",
            Self::Unhealthy => "Unhealthy",
            Self::Unknown => "Unknown",
        }
    }

    /// `Some(true)` healthy, `Some(false)` unhealthy, `None` unknown.
    pub fn healthy(self) -> Option<bool> {
        match self {
            Self::Healthy => Some(true),
            Self::Unhealthy => Some(false),
            Self::Unknown => None,
        }
    }
}

impl fmt::Display for HealthStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A DeviceTaint effect this driver sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TaintEffect {
    /// `None`: informational, allocation goes on.
    None,
    /// `NoSchedule`: claims that do not tolerate it are not allocated this device.
    NoSchedule,
}

impl TaintEffect {
    /// The API value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "None",
            Self::NoSchedule => "NoSchedule",
        }
    }
}

/// One taint on one device.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HealthTaint {
    /// Full key, `<driver>/<name>`.
    pub key: String,
    /// Value (the Xid for `xid`).
    pub value: Option<String>,
    /// Effect.
    pub effect: TaintEffect,
    /// When it was set (Unix nanoseconds).
    pub added_ns: i64,
}

impl HealthTaint {
    /// The API form; `timeAdded` in whole seconds (the API's precision).
    pub fn to_device_taint(&self) -> DeviceTaint {
        DeviceTaint {
            key: self.key.clone(),
            value: self.value.clone(),
            effect: self.effect.as_str().to_owned(),
            time_added: Timestamp::from_second(self.added_ns.div_euclid(1_000_000_000)).ok().map(Time),
        }
    }
}

/// The health of one device.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct DeviceHealthState {
    /// Current status.
    pub status: HealthStatus,
    /// Current taints, ordered by key.
    pub taints: Vec<HealthTaint>,
    /// When the status or the taints last changed (Unix nanoseconds).
    pub updated_ns: i64,
    /// The last event that changed it, as text (empty at start).
    pub message: String,
}

/// The health of every device of this node, by device name.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HealthSnapshot {
    monitored: bool,
    devices: BTreeMap<String, DeviceHealthState>,
}

impl HealthSnapshot {
    /// The snapshot when health is not watched (gate `NVMLDeviceHealthCheck` off): no devices, no taints.
    pub fn unmonitored_default() -> Self {
        Self::default()
    }

    /// Whether a health stream feeds this snapshot.
    pub fn is_monitored(&self) -> bool {
        self.monitored
    }

    /// The health of one device.
    pub fn get(&self, device: &str) -> Option<&DeviceHealthState> {
        self.devices.get(device)
    }

    /// The status of one device ([`HealthStatus::Unknown`] when not tracked).
    pub fn status(&self, device: &str) -> HealthStatus {
        self.get(device).map_or(HealthStatus::Unknown, |d| d.status)
    }

    /// Every tracked device, by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &DeviceHealthState)> {
        self.devices.iter().map(|(name, state)| (name.as_str(), state))
    }

    /// The taints of one device in API form (empty when not tracked).
    pub fn device_taints(&self, device: &str) -> Vec<DeviceTaint> {
        self.get(device)
            .map(|d| d.taints.iter().map(HealthTaint::to_device_taint).collect())
            .unwrap_or_default()
    }
}

// === fold ===

#[derive(Debug, Clone)]
struct Target {
    index: u32,
    uuid: String,
    name: String,
}

fn set_taint(
    state: &mut DeviceHealthState,
    key: String,
    value: Option<String>,
    effect: TaintEffect,
    now: i64,
) -> bool {
    let taint = HealthTaint { key, value, effect, added_ns: now };
    match state.taints.iter_mut().find(|t| t.key == taint.key) {
        Some(old) if old.value == taint.value && old.effect == taint.effect => false,
        Some(old) => {
            *old = taint;
            true
        }
        None => {
            state.taints.push(taint);
            state.taints.sort_by(|a, b| a.key.cmp(&b.key));
            true
        }
    }
}

fn remove_taint(state: &mut DeviceHealthState, key: &str) -> bool {
    let before = state.taints.len();
    state.taints.retain(|t| t.key != key);
    state.taints.len() != before
}

/// Applies one event to one device's state; returns whether the status or the taints changed.
fn fold(config: &HealthConfig, state: &mut DeviceHealthState, kind: &HealthEventKind, now: i64) -> bool {
    let xid_key = config.key(TAINT_XID);
    let (taints_changed, status) = match kind {
        HealthEventKind::Xid { code } if config.ignored_xids.contains(code) => {
            let has_no_schedule =
                state.taints.iter().any(|t| t.key == xid_key && t.effect == TaintEffect::NoSchedule);
            let changed =
                !has_no_schedule && set_taint(state, xid_key, Some(code.to_string()), TaintEffect::None, now);
            (changed, state.status)
        }
        HealthEventKind::Xid { code } => (
            set_taint(state, xid_key, Some(code.to_string()), TaintEffect::NoSchedule, now),
            HealthStatus::Unhealthy,
        ),
        HealthEventKind::EccUncorrectable => (
            set_taint(state, xid_key, Some(XID_DOUBLE_BIT_ECC.to_string()), TaintEffect::NoSchedule, now),
            HealthStatus::Unhealthy,
        ),
        HealthEventKind::DeviceLost => (
            set_taint(state, config.key(TAINT_GPU_LOST), None, TaintEffect::NoSchedule, now),
            HealthStatus::Unhealthy,
        ),
        HealthEventKind::Recovered => {
            let xid = remove_taint(state, &xid_key);
            let lost = remove_taint(state, &config.key(TAINT_GPU_LOST));
            let unmonitored = state.taints.iter().any(|t| t.key == config.key(TAINT_UNMONITORED));
            (xid || lost, if unmonitored { HealthStatus::Unknown } else { HealthStatus::Healthy })
        }
        // A kind this version does not know: no change.
        _ => (false, state.status),
    };
    let changed = taints_changed || status != state.status;
    state.status = status;
    if changed {
        state.updated_ns = now;
    }
    changed
}

// === impl HealthMonitor ===

/// Folds health events into a [`HealthSnapshot`] published on a watch channel.
pub struct HealthMonitor {
    config: HealthConfig,
    targets: Vec<Target>,
    tx: watch::Sender<HealthSnapshot>,
    clock: Arc<dyn Clock>,
}

impl fmt::Debug for HealthMonitor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HealthMonitor")
            .field("config", &self.config)
            .field("targets", &self.targets)
            .finish_non_exhaustive()
    }
}

impl HealthMonitor {
    /// Tracks every device of `devices`, all healthy now.
    pub fn new(config: HealthConfig, devices: &AllocatableDevices) -> Self {
        Self::with_clock(config, devices, Arc::new(SystemClock))
    }

    /// As [`HealthMonitor::new`] with a clock (tests).
    pub fn with_clock(config: HealthConfig, devices: &AllocatableDevices, clock: Arc<dyn Clock>) -> Self {
        let now = clock.now_ns();
        let targets: Vec<Target> = devices
            .iter()
            .map(|d| Target { index: d.gpu.index, uuid: d.gpu.uuid.clone(), name: d.name.clone() })
            .collect();
        let snapshot = HealthSnapshot {
            monitored: true,
            devices: targets
                .iter()
                .map(|t| {
                    let state = DeviceHealthState {
                        status: HealthStatus::Healthy,
                        taints: Vec::new(),
                        updated_ns: now,
                        message: String::new(),
                    };
                    (t.name.clone(), state)
                })
                .collect(),
        };
        let (tx, _) = watch::channel(snapshot);
        Self { config, targets, tx, clock }
    }

    /// A receiver of the snapshot; it sees every change (coalesced) until the monitor is dropped.
    pub fn subscribe(&self) -> watch::Receiver<HealthSnapshot> {
        self.tx.subscribe()
    }

    /// The snapshot now.
    pub fn snapshot(&self) -> HealthSnapshot {
        self.tx.borrow().clone()
    }

    /// Applies one backend event (matched by index, else UUID); returns whether the snapshot changed.
    pub fn apply(&self, event: &HealthEvent) -> bool {
        let Some(target) = self
            .targets
            .iter()
            .find(|t| t.index == event.index)
            .or_else(|| self.targets.iter().find(|t| t.uuid.eq_ignore_ascii_case(&event.uuid)))
        else {
            return false;
        };
        let now = self.clock.now_ns();
        let config = &self.config;
        self.tx.send_if_modified(|snapshot| {
            let Some(state) = snapshot.devices.get_mut(&target.name) else { return false };
            let changed = fold(config, state, &event.kind, now);
            if changed {
                state.message = if event.message.is_empty() {
                    event.kind.to_string()
                } else {
                    format!("{}: {}", event.kind, event.message)
                };
            }
            changed
        })
    }

    /// Marks every device unmonitored (taint `unmonitored`, status Unknown); returns whether anything changed.
    pub fn mark_unmonitored(&self, reason: &str) -> bool {
        let now = self.clock.now_ns();
        let key = self.config.key(TAINT_UNMONITORED);
        self.tx.send_if_modified(|snapshot| {
            let mut changed = false;
            for state in snapshot.devices.values_mut() {
                let taint = set_taint(state, key.clone(), None, TaintEffect::None, now);
                if taint || state.status != HealthStatus::Unknown {
                    state.status = HealthStatus::Unknown;
                    state.updated_ns = now;
                    state.message = reason.to_owned();
                    changed = true;
                }
            }
            changed
        })
    }

    /// Folds `events` until the stream ends (then marks every device unmonitored) or `shutdown` resolves.
    pub async fn run(self, mut events: HealthEvents, shutdown: impl Future<Output = ()> + Send) {
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                () = &mut shutdown => return,
                event = StreamExt::next(&mut events) => match event {
                    Some(event) => {
                        if self.apply(&event) {
                            tracing::warn!(gpu = event.index, uuid = %event.uuid, kind = %event.kind, "device health changed");
                        }
                    }
                    None => {
                        tracing::warn!("the backend's health event stream ended; devices are now unmonitored");
                        self.mark_unmonitored("health event stream ended");
                        // Keep the sender alive so receivers keep the last snapshot until shutdown.
                        shutdown.await;
                        return;
                    }
                },
            }
        }
    }

    /// Subscribes to `backend`'s health events and runs [`HealthMonitor::run`] on a task; when the backend
    /// cannot give a stream the devices are marked unmonitored and the task only waits for `shutdown`.
    pub fn spawn(
        self,
        backend: &dyn DeviceBackend,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> tokio::task::JoinHandle<()> {
        match backend.health_events() {
            Ok(events) => tokio::spawn(self.run(events, shutdown)),
            Err(error) => {
                tracing::warn!(%error, "cannot watch device health; devices are unmonitored");
                self.mark_unmonitored(&format!("cannot watch device health: {error}"));
                tokio::spawn(async move {
                    let _keep = self;
                    shutdown.await;
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::devices::DeviceConfig;
    use proptest::prelude::*;
    use vgpu_core::{clock::ManualClock, model::GpuDevice};

    fn devices(n: u32) -> AllocatableDevices {
        let gpus = (0..n)
            .map(|i| {
                (
                    GpuDevice {
                        index: i,
                        uuid: format!("GPU-{i}"),
                        memory_mib: 1024,
                        ..GpuDevice::default()
                    },
                    i,
                )
            })
            .collect();
        AllocatableDevices::new(&DeviceConfig::default(), gpus, None).unwrap()
    }

    fn event(index: u32, kind: HealthEventKind) -> HealthEvent {
        HealthEvent { index, uuid: format!("GPU-{index}"), kind, message: String::new() }
    }

    fn monitor(additional: &[u64]) -> (HealthMonitor, Arc<ManualClock>) {
        let clock = Arc::new(ManualClock::new(1_000_000_000_000));
        let monitor = HealthMonitor::with_clock(
            HealthConfig::new("d.example.com", additional),
            &devices(2),
            clock.clone(),
        );
        (monitor, clock)
    }

    fn keys(snapshot: &HealthSnapshot, device: &str) -> Vec<(String, Option<String>, &'static str)> {
        snapshot
            .get(device)
            .unwrap()
            .taints
            .iter()
            .map(|t| (t.key.clone(), t.value.clone(), t.effect.as_str()))
            .collect()
    }

    #[test]
    fn taint_table() {
        let (monitor, clock) = monitor(&[79]);
        let rx = monitor.subscribe();
        assert_eq!(rx.borrow().status("vgpu-0"), HealthStatus::Healthy);
        assert!(monitor.apply(&event(0, HealthEventKind::Xid { code: 13 })), "ignored Xid: a None taint");
        assert_eq!(keys(&rx.borrow(), "vgpu-0"), [("d.example.com/xid".into(), Some("13".into()), "None")]);
        assert_eq!(rx.borrow().status("vgpu-0"), HealthStatus::Healthy);
        assert!(monitor.apply(&event(0, HealthEventKind::Xid { code: 79 })), "additional ignored Xid");
        assert_eq!(rx.borrow().status("vgpu-0"), HealthStatus::Healthy);

        clock.advance(5_000_000_000);
        assert!(monitor.apply(&event(0, HealthEventKind::Xid { code: 94 })));
        assert_eq!(
            keys(&rx.borrow(), "vgpu-0"),
            [("d.example.com/xid".into(), Some("94".into()), "NoSchedule")]
        );
        assert_eq!(rx.borrow().get("vgpu-0").unwrap().updated_ns, 1_005_000_000_000);
        assert_eq!(rx.borrow().get("vgpu-0").unwrap().message, "Xid 94");
        assert!(
            !monitor.apply(&event(0, HealthEventKind::Xid { code: 13 })),
            "ignored Xid never weakens NoSchedule"
        );
        assert!(!monitor.apply(&event(0, HealthEventKind::Xid { code: 94 })), "same taint: no change");

        assert!(monitor.apply(&event(1, HealthEventKind::DeviceLost)));
        assert!(monitor.apply(&event(1, HealthEventKind::EccUncorrectable)));
        assert_eq!(
            keys(&rx.borrow(), "vgpu-1"),
            [
                ("d.example.com/gpu-lost".into(), None, "NoSchedule"),
                ("d.example.com/xid".into(), Some("48".into()), "NoSchedule")
            ]
        );
        assert!(monitor.apply(&event(1, HealthEventKind::Recovered)));
        assert!(keys(&rx.borrow(), "vgpu-1").is_empty());
        assert_eq!(rx.borrow().status("vgpu-1"), HealthStatus::Healthy);
        assert!(!monitor.apply(&event(7, HealthEventKind::DeviceLost)), "unknown GPU");

        let taint = rx.borrow().device_taints("vgpu-0").remove(0);
        assert_eq!(taint.time_added.unwrap().0.as_second(), 1005);
    }

    #[test]
    fn unmonitored_marks_every_device() {
        let (monitor, _) = monitor(&[]);
        assert!(monitor.mark_unmonitored("gone"));
        assert!(!monitor.mark_unmonitored("gone"), "idempotent");
        let snapshot = monitor.snapshot();
        for device in ["vgpu-0", "vgpu-1"] {
            assert_eq!(snapshot.status(device), HealthStatus::Unknown);
            assert_eq!(keys(&snapshot, device), [("d.example.com/unmonitored".into(), None, "None")]);
        }
        assert!(
            !monitor.apply(&event(0, HealthEventKind::Recovered)),
            "recovery keeps an unmonitored device Unknown"
        );
        assert_eq!(HealthSnapshot::unmonitored_default().status("vgpu-0"), HealthStatus::Unknown);
        assert_eq!(
            [HealthStatus::Healthy, HealthStatus::Unhealthy, HealthStatus::Unknown]
                .map(HealthStatus::healthy),
            [Some(true), Some(false), None]
        );
        assert!(HealthSnapshot::unmonitored_default().device_taints("vgpu-0").is_empty());
    }

    #[test]
    fn xid_list_flag() {
        assert_eq!(parse_xid_list("").unwrap(), Vec::<u64>::new());
        assert_eq!(parse_xid_list("48,79").unwrap(), vec![48, 79]);
        let err = parse_xid_list("48,x").unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid --additional-xids-to-ignore \"48,x\": entry \"x\" is not a non-negative integer (expected a comma-separated list of Xids, e.g. 48,79)"
        );
    }

    #[tokio::test]
    async fn run_folds_the_stream_and_ends_unmonitored() {
        let (monitor, _) = monitor(&[]);
        let mut rx = monitor.subscribe();
        let (tx, events) = vgpu_core::backend::health_channel();
        let stop = tokio_util::sync::CancellationToken::new();
        let task = tokio::spawn(monitor.run(events, stop.clone().cancelled_owned()));
        tx.send(event(1, HealthEventKind::Xid { code: 79 }));
        rx.changed().await.unwrap();
        assert_eq!(rx.borrow_and_update().status("vgpu-1"), HealthStatus::Unhealthy);
        drop(tx);
        rx.changed().await.unwrap();
        assert_eq!(rx.borrow_and_update().status("vgpu-0"), HealthStatus::Unknown);
        stop.cancel();
        task.await.unwrap();
    }

    proptest! {
        /// Whatever the event sequence, a device has at most one taint per key, a NoSchedule taint iff it is
        /// Unhealthy (before any unmonitored marking), and `Recovered` clears every fault.
        #[test]
        fn fold_invariants(events in proptest::collection::vec((0u32..2, 0u8..5, 0u64..120), 0..40)) {
            let (monitor, clock) = monitor(&[]);
            for (index, kind, code) in events {
                clock.advance(1);
                let kind = match kind {
                    0 => HealthEventKind::Xid { code },
                    1 => HealthEventKind::EccUncorrectable,
                    2 => HealthEventKind::DeviceLost,
                    _ => HealthEventKind::Recovered,
                };
                let recovered = kind == HealthEventKind::Recovered;
                monitor.apply(&event(index, kind));
                let snapshot = monitor.snapshot();
                let name = format!("vgpu-{index}");
                let state = snapshot.get(&name).unwrap();
                let keys: BTreeSet<_> = state.taints.iter().map(|t| t.key.clone()).collect();
                prop_assert_eq!(keys.len(), state.taints.len());
                let no_schedule = state.taints.iter().any(|t| t.effect == TaintEffect::NoSchedule);
                prop_assert_eq!(no_schedule, state.status == HealthStatus::Unhealthy);
                if recovered {
                    prop_assert!(state.taints.is_empty());
                }
            }
        }
    }
}
