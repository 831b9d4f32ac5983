//! Gate `TimeSlicingSettings`: [`TimeSlicingMode`] sets a GPU's CUDA time-slice length from the claim's
//! opaque config (`GpuConfig.sharing: {strategy: TimeSlicing, timeSlicingConfig: {interval: …}}`,
//! [`crate::opaque`]) on Prepare and sets it back to `Default` on Unprepare.
//!
//! | step | what |
//! |---|---|
//! | plan | one action per GPU of the claim's `gpu`/`vgpu` devices whose config is time-slicing: `{claim, index, uuid, interval}`; an interval another prepared claim holds differently on the same (shared) GPU fails the claim |
//! | apply | writes the hold `<manager>/timeslicing/<gpu uuid>/<claimUID>` (the interval), then the backend's compute mode `Default` and [`DeviceBackend::set_time_slice`] (NVML: `nvidia-smi compute-policy --set-timeslice`); no CDI edit |
//! | revert | removes the hold; when no other claim holds the GPU, sets the time slice back to `Default` |
//!
//! Devices without a time-slicing config are not touched (upstream also re-applies `Default` to every GPU
//! without a config; here a GPU only leaves `Default` while a claim holds it). A `MigDeviceConfig` with
//! strategy `TimeSlicing` is accepted and plans nothing: a MIG device has no time slice of its own (the API
//! has no `timeSlicingConfig` for it). With the gate off the mode is not installed and
//! [`crate::opaque::OpaqueConfigCheck`] rejects a time-slicing config naming the gate.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::Arc,
};

use serde::{Deserialize, Serialize};
use vgpu_core::backend::{ComputeMode, DeviceBackend, TimeSlice};

use crate::{
    config::DriverConfig,
    modes::{self, ClaimContext, ClaimMode, ModeEdits, ModeError},
    opaque::{self, DeviceConfig},
};
use vgpu_core::dra::DeviceType;

const MODE: &str = "timeSlicing";

/// One GPU's time slice for one claim (the recorded host action).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimeSliceAction {
    /// The claim's UID (the name of its hold).
    pub claim: String,
    /// The GPU's backend index when planned.
    pub index: u32,
    /// The GPU's UUID.
    pub uuid: String,
    /// The interval.
    pub interval: TimeSlice,
}

/// The `TimeSlicingSettings` mode (see the module docs).
#[derive(Clone)]
pub struct TimeSlicingMode {
    backend: Arc<dyn DeviceBackend>,
    holds: PathBuf,
}

impl std::fmt::Debug for TimeSlicingMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TimeSlicingMode").field("holds", &self.holds).finish_non_exhaustive()
    }
}

impl TimeSlicingMode {
    /// The mode over `backend`, its holds under `<config.manager_dir>/timeslicing`.
    pub fn new(backend: Arc<dyn DeviceBackend>, config: &DriverConfig) -> Self {
        Self { backend, holds: config.manager_dir.join("timeslicing") }
    }

    /// The holds of GPU `uuid`: claim UID → interval (a hold that cannot be read counts as `Default`).
    pub fn holds(&self, uuid: &str) -> BTreeMap<String, TimeSlice> {
        let dir = self.holds.join(uuid);
        let Ok(entries) = std::fs::read_dir(&dir) else { return BTreeMap::new() };
        entries
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_str()?.to_owned();
                if name.starts_with('.') {
                    return None;
                }
                let text = std::fs::read_to_string(e.path()).unwrap_or_default();
                Some((name, text.trim().parse().unwrap_or_default()))
            })
            .collect()
    }

    /// The GPU's index now (by UUID; the recorded one when the backend cannot say).
    fn index_of(&self, action: &TimeSliceAction) -> u32 {
        self.backend
            .devices()
            .ok()
            .and_then(|d| d.into_iter().find(|g| g.uuid == action.uuid).map(|g| g.index))
            .unwrap_or(action.index)
    }

    fn hold_path(&self, uuid: &str, claim: &str) -> Result<PathBuf, ModeError> {
        let safe = |s: &str| !s.is_empty() && !s.starts_with('.') && !s.contains('/');
        if !safe(uuid) || !safe(claim) {
            return Err(ModeError::claim(
                MODE,
                format!("cannot name a hold after GPU {uuid:?} and claim {claim:?}"),
            ));
        }
        Ok(self.holds.join(uuid).join(claim))
    }
}

impl ClaimMode for TimeSlicingMode {
    fn name(&self) -> &'static str {
        MODE
    }

    fn gate(&self) -> &'static str {
        "TimeSlicingSettings"
    }

    fn plan(&self, ctx: &ClaimContext<'_>) -> Result<Vec<serde_json::Value>, ModeError> {
        let configs = opaque::configs_for(ctx).map_err(|e| ModeError::claim(MODE, e.to_string()))?;
        let mut per_gpu: BTreeMap<u32, (TimeSliceAction, String)> = BTreeMap::new();
        for device in ctx.devices {
            let Some(applied) = configs.get(&device.cdi_name) else { continue };
            let DeviceConfig::Gpu(config) = &applied.config else { continue };
            let Some(interval) = config.sharing.as_ref().and_then(opaque::Sharing::time_slice) else {
                continue;
            };
            if !matches!(device.device.kind, DeviceType::Gpu | DeviceType::Vgpu) {
                continue;
            }
            let gpu = &device.device.gpu;
            let action = TimeSliceAction {
                claim: ctx.claim.uid.clone(),
                index: gpu.index,
                uuid: gpu.uuid.clone(),
                interval,
            };
            if let Some((other, name)) = per_gpu.get(&gpu.index)
                && other.interval != interval
            {
                return Err(ModeError::claim(
                    MODE,
                    format!(
                        "devices {name} and {} are on the same GPU {} but ask for time slices {} and {interval}",
                        device.device.name, gpu.uuid, other.interval
                    ),
                ));
            }
            per_gpu.insert(gpu.index, (action, device.device.name.clone()));
        }
        let mut out = Vec::new();
        for (action, device) in per_gpu.into_values() {
            if let Some((other, held)) = self
                .holds(&action.uuid)
                .into_iter()
                .find(|(c, t)| c != &action.claim && *t != action.interval)
            {
                return Err(ModeError::claim(
                    MODE,
                    format!(
                        "device {device}: GPU {} is time-sliced {held} for claim {other}; this claim asks for {} (one interval per GPU)",
                        action.uuid, action.interval
                    ),
                ));
            }
            out.push(modes::encode(MODE, &action)?);
        }
        Ok(out)
    }

    fn apply(&self, _ctx: &ClaimContext<'_>, action: &serde_json::Value) -> Result<ModeEdits, ModeError> {
        let action: TimeSliceAction = modes::decode(MODE, action)?;
        let hold = self.hold_path(&action.uuid, &action.claim)?;
        write_hold(&hold, action.interval)?;
        let index = self.index_of(&action);
        self.backend
            .set_compute_mode(index, ComputeMode::Default)
            .map_err(|e| ModeError::host(MODE, format!("set GPU {} compute mode DEFAULT", action.uuid), e))?;
        self.backend.set_time_slice(index, action.interval).map_err(|e| {
            ModeError::host(MODE, format!("set GPU {} time slice {}", action.uuid, action.interval), e)
        })?;
        Ok(ModeEdits::default())
    }

    fn revert(&self, action: &serde_json::Value) -> Result<(), ModeError> {
        let action: TimeSliceAction = modes::decode(MODE, action)?;
        let hold = self.hold_path(&action.uuid, &action.claim)?;
        match std::fs::remove_file(&hold) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(ModeError::host(MODE, format!("remove {}", hold.display()), e)),
        }
        let others = self.holds(&action.uuid);
        if let Some(interval) = others.values().next() {
            tracing::info!(gpu = %action.uuid, %interval, "time slice kept: other claims hold the GPU");
            return Ok(());
        }
        let index = self.index_of(&action);
        self.backend
            .set_time_slice(index, TimeSlice::Default)
            .map_err(|e| ModeError::host(MODE, format!("set GPU {} time slice Default", action.uuid), e))?;
        if let Some(dir) = hold.parent() {
            let _ = std::fs::remove_dir(dir);
        }
        Ok(())
    }
}

fn write_hold(path: &Path, interval: TimeSlice) -> Result<(), ModeError> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| ModeError::host(MODE, format!("create {}", dir.display()), e))?;
    }
    vgpu_core::abi::atomic::write_atomic(path, interval.as_str().as_bytes(), 0o644)
        .map_err(|e| ModeError::host(MODE, format!("write {}", path.display()), e))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::collections::BTreeSet;

    use proptest::prelude::*;
    use vgpu_core::backend::mock::MockBackend;

    use super::*;
    use crate::claims::ClaimRef;

    const MOCK: &str = "gpus:\n  - { uuid: GPU-a, name: L4, memoryMiB: 23034 }\n  - { uuid: GPU-b, name: L4, memoryMiB: 23034 }\n";

    #[derive(Debug, Clone)]
    enum Op {
        Apply { claim: u8, gpu: u32 },
        Revert { claim: u8, gpu: u32 },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u8..4, 0u32..2).prop_map(|(claim, gpu)| Op::Apply { claim, gpu }),
            (0u8..4, 0u32..2).prop_map(|(claim, gpu)| Op::Revert { claim, gpu }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// Whatever the order of applies and reverts (repeated or never applied), a GPU is at its claims'
        /// interval exactly while some claim holds it, and back at `Default` once none does.
        #[test]
        fn the_time_slice_follows_the_holds(ops in prop::collection::vec(op(), 1..24)) {
            let dir = tempfile::tempdir().unwrap();
            let backend = Arc::new(MockBackend::from_yaml_str(MOCK).unwrap());
            let mode = TimeSlicingMode::new(backend.clone(), &DriverConfig::under("n", dir.path()));
            let wanted = [TimeSlice::Long, TimeSlice::Short];
            let claim = ClaimRef::new("ns", "c", "u");
            let object = crate::claims::claim("ns", "c", "u");
            let config = DriverConfig::under("n", dir.path());
            let ctx = ClaimContext { claim: &claim, object: &object, devices: &[], config: &config };
            let mut held: BTreeSet<(u8, u32)> = BTreeSet::new();
            for op in ops {
                let (claim, gpu, apply) = match op {
                    Op::Apply { claim, gpu } => (claim, gpu, true),
                    Op::Revert { claim, gpu } => (claim, gpu, false),
                };
                let uuid = ["GPU-a", "GPU-b"][gpu as usize];
                let action = serde_json::json!({"claim": format!("uid-{claim}"), "index": gpu, "uuid": uuid,
                                                "interval": wanted[gpu as usize]});
                if apply {
                    mode.apply(&ctx, &action).unwrap();
                    held.insert((claim, gpu));
                } else {
                    mode.revert(&action).unwrap();
                    held.remove(&(claim, gpu));
                }
                for g in 0..2u32 {
                    let holders: BTreeSet<String> =
                        held.iter().filter(|(_, h)| *h == g).map(|(c, _)| format!("uid-{c}")).collect();
                    let on_disk: BTreeSet<String> = mode.holds(["GPU-a", "GPU-b"][g as usize]).into_keys().collect();
                    prop_assert_eq!(&on_disk, &holders);
                    let expect = if holders.is_empty() { TimeSlice::Default } else { wanted[g as usize] };
                    prop_assert_eq!(backend.time_slice(g).unwrap(), expect);
                }
            }
        }
    }
}
