//! Gate `FabricManagerPartitioning`: on NVSwitch systems (HGX/DGX) GPUs talk over NVLink only inside an
//! activated Fabric Manager (FM) partition. Prepare activates the partition whose GPU set is exactly the
//! claim's GPUs; Unprepare deactivates it.
//!
//! # Fabric Manager
//!
//! FM is reached through the [`FabricManager`] trait (list the supported partitions, activate, deactivate).
//! [`FakeFabricManager`] is the in-process fake the tests use; the real client is the FM SDK
//! (`libnvfm.so`: `fmConnect` / `fmGetSupportedFabricPartitions` / `fmActivateFabricPartition` /
//! `fmDeactivateFabricPartition` / `fmDisconnect`, one connection per call), loaded at run time by
//! `vgpu_nvml::fabric_ffi::NvFm` and adapted to this trait by the binary. Its address, as upstream
//! ([`FmAddress::from_env`]):
//!
//! | env | transport |
//! |---|---|
//! | `NVIDIA_FABRICMANAGER_ADDRESS` set | TCP to that host (empty: `127.0.0.1`) |
//! | otherwise | unix socket `NVIDIA_FABRICMANAGER_UNIX_SOCKET` (empty or unset: `/driver-root/run/nvidia-fabricmanager/socket`) |
//!
//! NVSwitch detection ([`has_nvswitch_fabric`], paths under `--host-root`): `/proc/driver/nvidia-nvswitch/devices`
//! is non-empty, or an InfiniBand device's `/sys/class/infiniband/*/device/vpd` contains `SW_MNG` (NVLink 5
//! switch trays managed through the CX7 bridge).
//!
//! # Attributes
//!
//! [`attach_partitions`] (start-up) matches each partition GPU to the `gpu`, `vgpu` and `vfio` devices on the
//! same PCI address (else the same UUID) and sets, as upstream (a `vgpu` device carries its GPU's attributes,
//! but only `gpu`/`vfio` claims activate partitions):
//!
//! | attribute | value |
//! |---|---|
//! | `gpuModuleID` (int) | the GPU's FM physical ID (module ID) |
//! | `partition<N>` (int) | the ID of the partition of `N` GPUs that holds this GPU (`partition1`, `partition2`, `partition4`, `partition8`) |
//!
//! A claim selects a partition with a CEL selector, e.g. every device with `partition4 == 2`.
//!
//! # Host action
//!
//! | step | what |
//! |---|---|
//! | plan | the `gpu`/`vfio` devices' module IDs; the FM partition whose module set equals them exactly → [`FabricAction`] `{partitionId, moduleIds, claimUid}`; none → [`ModeError::Claim`] listing every partition |
//! | apply | FM says the partition is active: nothing; else `activate` |
//! | revert | another completed claim recorded the same partition (shared GPUs): nothing; FM says inactive (or unknown): nothing; else `deactivate` |
//!
//! A claim without `gpu`/`vfio` devices (vGPU shares, MIG devices) plans nothing. Install the mode before the `vfio` one, so revert
//! (newest first) gives the GPUs back to their driver before the partition is deactivated, as upstream.
//!
//! ```
//! use vgpu_dra::fabric::{FabricManager, FakeFabricManager, Partition, PartitionGpu};
//!
//! let gpu = |id: u32| PartitionGpu { physical_id: id, uuid: String::new(), pci_bus_id: String::new() };
//! let fm = FakeFabricManager::new(vec![
//!     Partition { id: 0, active: false, gpus: vec![gpu(1), gpu(2)] },
//!     Partition { id: 1, active: false, gpus: vec![gpu(1)] },
//! ]);
//! fm.activate(0)?;
//! assert!(fm.activate(1).is_err(), "module 1 is in the active partition 0");
//! assert_eq!(fm.calls(), ["activate 0", "activate 1"]);
//! # Ok::<(), vgpu_dra::fabric::FabricError>(())
//! ```

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    path::{Path, PathBuf},
    sync::{Arc, Mutex, PoisonError},
};

use serde::{Deserialize, Serialize};

use crate::{
    checkpoint::{Checkpoint, ClaimState},
    devices::AllocatableDevices,
    devices::ExtraAttribute,
    modes::{ClaimContext, ClaimMode, ModeEdits, ModeError, decode, encode},
    vfio::same_bus_id,
};
use vgpu_core::dra::DeviceType;

/// The mode's name in recorded actions.
pub const MODE: &str = "fabricManager";
/// The gate that enables the mode.
pub const GATE: &str = "FabricManagerPartitioning";
/// Env selecting TCP and the host (`NVIDIA_FABRICMANAGER_ADDRESS`).
pub const ADDRESS_ENV: &str = "NVIDIA_FABRICMANAGER_ADDRESS";
/// Env overriding the unix socket (`NVIDIA_FABRICMANAGER_UNIX_SOCKET`).
pub const UNIX_SOCKET_ENV: &str = "NVIDIA_FABRICMANAGER_UNIX_SOCKET";
/// Default TCP host.
pub const DEFAULT_ADDRESS: &str = "127.0.0.1";
/// Default unix socket.
pub const DEFAULT_UNIX_SOCKET: &str = "/driver-root/run/nvidia-fabricmanager/socket";
/// The attribute with the GPU's FM module ID.
pub const ATTRIBUTE_MODULE_ID: &str = "gpuModuleID";
/// The marker of an NVLink 5 switch-managed fabric in an InfiniBand device's VPD.
pub const SWITCH_MANAGED_MARKER: &[u8] = b"SW_MNG";

/// Errors of the Fabric Manager seam.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FabricError {
    /// An FM call failed.
    #[error("fabric manager: {op}: {message}")]
    Fm {
        /// The call (`fmActivateFabricPartition(3)`, …).
        op: String,
        /// FM's answer.
        message: String,
    },
    /// FM reported partitions that cannot be right.
    #[error("fabric manager: {0}")]
    Partitions(String),
    /// A detection file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// One GPU of a partition (`fmFabricPartitionGpuInfo_t`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PartitionGpu {
    /// The GPU's physical (module) ID.
    pub physical_id: u32,
    /// Its UUID as FM reports it (may be empty).
    pub uuid: String,
    /// Its PCI address as FM reports it (may be empty).
    pub pci_bus_id: String,
}

/// One supported partition (`fmFabricPartitionInfo_t`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Partition {
    /// Partition ID.
    pub id: u32,
    /// Whether it is active now.
    pub active: bool,
    /// Its GPUs.
    pub gpus: Vec<PartitionGpu>,
}

impl Partition {
    /// The module IDs of its GPUs, sorted.
    pub fn module_ids(&self) -> BTreeSet<u32> {
        self.gpus.iter().map(|g| g.physical_id).collect()
    }
}

/// Fabric Manager as the plugin uses it.
pub trait FabricManager: Send + Sync + fmt::Debug {
    /// Every partition FM supports on this node, with its state (`fmGetSupportedFabricPartitions`).
    fn partitions(&self) -> Result<Vec<Partition>, FabricError>;
    /// Activates a partition (`fmActivateFabricPartition`).
    fn activate(&self, id: u32) -> Result<(), FabricError>;
    /// Deactivates a partition (`fmDeactivateFabricPartition`).
    fn deactivate(&self, id: u32) -> Result<(), FabricError>;
}

/// Where FM listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FmAddress {
    /// TCP to this host (FM's port 6666 is the SDK's default).
    Tcp(String),
    /// This unix socket.
    Unix(PathBuf),
}

impl FmAddress {
    /// The address from the env (module table), `lookup` being `std::env::var` or a test map.
    pub fn from_env(lookup: impl Fn(&str) -> Option<String>) -> Self {
        match lookup(ADDRESS_ENV) {
            Some(addr) if addr.is_empty() => Self::Tcp(DEFAULT_ADDRESS.to_owned()),
            Some(addr) => Self::Tcp(addr),
            None => match lookup(UNIX_SOCKET_ENV) {
                Some(path) if !path.is_empty() => Self::Unix(PathBuf::from(path)),
                _ => Self::Unix(PathBuf::from(DEFAULT_UNIX_SOCKET)),
            },
        }
    }
}

/// Whether the node has an NVSwitch fabric that needs FM (module docs), paths under `host_root`.
pub fn has_nvswitch_fabric(host_root: &Path) -> Result<bool, FabricError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| FabricError::Io { path, source }
    };
    let nvswitch = host_root.join("proc/driver/nvidia-nvswitch/devices");
    match std::fs::read_dir(&nvswitch) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Ok(true);
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(&nvswitch)(e)),
    }
    let ib = host_root.join("sys/class/infiniband");
    let entries = match std::fs::read_dir(&ib) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(io(&ib)(e)),
    };
    for entry in entries {
        let vpd = entry.map_err(io(&ib))?.path().join("device/vpd");
        match std::fs::read(&vpd) {
            Ok(bytes) if bytes.windows(SWITCH_MANAGED_MARKER.len()).any(|w| w == SWITCH_MANAGED_MARKER) => {
                return Ok(true);
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(&vpd)(e)),
        }
    }
    Ok(false)
}

/// Checks FM's partitions as upstream does: unique IDs, no empty partition, no module twice in one, and at
/// most one partition of each size per module.
pub fn validate_partitions(partitions: &[Partition]) -> Result<(), FabricError> {
    let mut ids = BTreeSet::new();
    let mut by_size_module: BTreeMap<(usize, u32), u32> = BTreeMap::new();
    for p in partitions {
        if !ids.insert(p.id) {
            return Err(FabricError::Partitions(format!("FM returned partition {} twice", p.id)));
        }
        if p.gpus.is_empty() {
            return Err(FabricError::Partitions(format!("partition {} has no GPUs", p.id)));
        }
        if p.module_ids().len() != p.gpus.len() {
            return Err(FabricError::Partitions(format!("partition {} names a GPU module twice", p.id)));
        }
        for g in &p.gpus {
            if let Some(other) = by_size_module.insert((p.gpus.len(), g.physical_id), p.id) {
                return Err(FabricError::Partitions(format!(
                    "gpuModuleID {} is in two partitions of size {} ({other} and {})",
                    g.physical_id,
                    p.gpus.len(),
                    p.id
                )));
            }
        }
    }
    Ok(())
}

/// Start-up: reads FM's partitions, checks them and sets `gpuModuleID` and `partition<N>` on every `gpu`,
/// `vgpu` and `vfio` device whose GPU FM names (by PCI address, else UUID). Returns the partitions.
pub fn attach_partitions(
    fm: &dyn FabricManager,
    devices: &mut AllocatableDevices,
) -> Result<Vec<Partition>, FabricError> {
    let partitions = fm.partitions()?;
    validate_partitions(&partitions)?;
    let targets: Vec<(String, String, String)> = devices
        .iter()
        .filter(|d| matches!(d.kind, DeviceType::Gpu | DeviceType::Vgpu | DeviceType::Vfio))
        .map(|d| (d.name.clone(), d.gpu.bus_id.clone(), d.gpu.uuid.clone()))
        .collect();
    for p in &partitions {
        for g in &p.gpus {
            let matching = targets.iter().filter(|(_, bus, uuid)| {
                (!g.pci_bus_id.is_empty() && same_bus_id(&g.pci_bus_id, bus))
                    || (!g.uuid.is_empty() && g.uuid.eq_ignore_ascii_case(uuid))
            });
            for (name, _, _) in matching {
                if let Some(extra) = devices.extras_mut(name) {
                    extra.attributes.insert(
                        ATTRIBUTE_MODULE_ID.to_owned(),
                        ExtraAttribute::Int(i64::from(g.physical_id)),
                    );
                    extra
                        .attributes
                        .insert(format!("partition{}", p.gpus.len()), ExtraAttribute::Int(i64::from(p.id)));
                }
            }
        }
    }
    Ok(partitions)
}

// === fake ===

/// An in-process Fabric Manager: a partition table with FM's rules (activation fails when a GPU is in
/// another active partition; deactivating an inactive partition fails), every call recorded.
#[derive(Debug, Default)]
pub struct FakeFabricManager {
    partitions: Mutex<Vec<Partition>>,
    calls: Mutex<Vec<String>>,
    fail: Mutex<Option<String>>,
}

impl FakeFabricManager {
    /// FM with these partitions.
    pub fn new(partitions: Vec<Partition>) -> Self {
        Self { partitions: Mutex::new(partitions), ..Self::default() }
    }

    /// The `activate <id>` / `deactivate <id>` calls so far.
    pub fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// The IDs of the active partitions.
    pub fn active(&self) -> Vec<u32> {
        self.partitions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|p| p.active)
            .map(|p| p.id)
            .collect()
    }

    /// Makes the next call starting with `op` (`activate`, `deactivate`, `partitions`) fail once.
    pub fn fail_next(&self, op: &str) {
        *self.fail.lock().unwrap_or_else(PoisonError::into_inner) = Some(op.to_owned());
    }

    fn failing(&self, op: &str) -> Result<(), FabricError> {
        let mut fail = self.fail.lock().unwrap_or_else(PoisonError::into_inner);
        if fail.as_deref() == Some(op) {
            *fail = None;
            return Err(FabricError::Fm { op: op.to_owned(), message: "injected failure".to_owned() });
        }
        Ok(())
    }

    fn set(&self, id: u32, active: bool) -> Result<(), FabricError> {
        let op = if active { "activate" } else { "deactivate" };
        self.calls.lock().unwrap_or_else(PoisonError::into_inner).push(format!("{op} {id}"));
        self.failing(op)?;
        let mut partitions = self.partitions.lock().unwrap_or_else(PoisonError::into_inner);
        let err = |message: String| FabricError::Fm { op: format!("{op}({id})"), message };
        let modules = partitions
            .iter()
            .find(|p| p.id == id)
            .map(Partition::module_ids)
            .ok_or_else(|| err("FM_ST_BADPARAM: no such partition".to_owned()))?;
        let busy = partitions.iter().find(|p| active && p.active && !p.module_ids().is_disjoint(&modules));
        if let Some(busy) = busy {
            return Err(err(format!("FM_ST_IN_USE: GPUs are in active partition {}", busy.id)));
        }
        for p in partitions.iter_mut().filter(|p| p.id == id) {
            if p.active == active {
                return Err(err(format!(
                    "FM_ST_BADPARAM: partition is already {}",
                    if active { "active" } else { "inactive" }
                )));
            }
            p.active = active;
        }
        Ok(())
    }
}

impl FabricManager for FakeFabricManager {
    fn partitions(&self) -> Result<Vec<Partition>, FabricError> {
        self.failing("partitions")?;
        Ok(self.partitions.lock().unwrap_or_else(PoisonError::into_inner).clone())
    }

    fn activate(&self, id: u32) -> Result<(), FabricError> {
        self.set(id, true)
    }

    fn deactivate(&self, id: u32) -> Result<(), FabricError> {
        self.set(id, false)
    }
}

// === mode ===

/// One recorded Fabric Manager action: the claim's partition is active.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FabricAction {
    /// The partition.
    pub partition_id: u32,
    /// The claim's GPU module IDs (sorted).
    pub module_ids: Vec<u32>,
    /// The claim (revert leaves a partition another claim still uses).
    pub claim_uid: String,
}

/// The `fabricManager` claim mode (gate `FabricManagerPartitioning`; module docs).
#[derive(Debug)]
pub struct FabricMode {
    fm: Arc<dyn FabricManager>,
    checkpoint: PathBuf,
}

impl FabricMode {
    /// The mode over `fm`; `checkpoint` is the plugin's checkpoint (`DriverConfig::checkpoint_path`), read on
    /// revert to leave partitions other claims still use.
    pub fn new(fm: Arc<dyn FabricManager>, checkpoint: PathBuf) -> Self {
        Self { fm, checkpoint }
    }

    fn host(step: impl Into<String>, e: FabricError) -> ModeError {
        ModeError::host(MODE, step, e)
    }

    fn is_active(&self, id: u32, step: &str) -> Result<Option<bool>, ModeError> {
        let partitions = self.fm.partitions().map_err(|e| Self::host(step, e))?;
        Ok(partitions.iter().find(|p| p.id == id).map(|p| p.active))
    }
}

impl ClaimMode for FabricMode {
    fn name(&self) -> &'static str {
        MODE
    }

    fn gate(&self) -> &'static str {
        GATE
    }

    fn plan(&self, ctx: &ClaimContext<'_>) -> Result<Vec<serde_json::Value>, ModeError> {
        let mut modules = BTreeSet::new();
        let mut names = Vec::new();
        for d in ctx.devices.iter().filter(|d| matches!(d.device.kind, DeviceType::Gpu | DeviceType::Vfio)) {
            match d.device.extra.attributes.get(ATTRIBUTE_MODULE_ID) {
                Some(ExtraAttribute::Int(id)) => {
                    modules.insert(u32::try_from(*id).unwrap_or(u32::MAX));
                    names.push(d.device.name.as_str());
                }
                _ => {
                    return Err(ModeError::claim(
                        MODE,
                        format!(
                            "device {} has no {ATTRIBUTE_MODULE_ID}: Fabric Manager does not list its GPU in any partition",
                            d.device.name
                        ),
                    ));
                }
            }
        }
        if modules.is_empty() {
            return Ok(Vec::new());
        }
        let partitions = self.fm.partitions().map_err(|e| Self::host("list the partitions", e))?;
        let Some(partition) = partitions.iter().find(|p| p.module_ids() == modules) else {
            let list = |set: &BTreeSet<u32>| set.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
            let existing: Vec<String> =
                partitions.iter().map(|p| format!("{} [{}]", p.id, list(&p.module_ids()))).collect();
            return Err(ModeError::claim(
                MODE,
                format!(
                    "no Fabric Manager partition has exactly GPU modules [{}] (devices {}); partitions: {}",
                    list(&modules),
                    names.join(", "),
                    if existing.is_empty() { "none".to_owned() } else { existing.join(", ") }
                ),
            ));
        };
        let action = FabricAction {
            partition_id: partition.id,
            module_ids: modules.into_iter().collect(),
            claim_uid: ctx.claim.uid.clone(),
        };
        Ok(vec![encode(MODE, &action)?])
    }

    fn apply(&self, _ctx: &ClaimContext<'_>, action: &serde_json::Value) -> Result<ModeEdits, ModeError> {
        let action: FabricAction = decode(MODE, action)?;
        let id = action.partition_id;
        let step = format!("activate partition {id}");
        match self.is_active(id, &step)? {
            Some(true) => {}
            Some(false) => {
                self.fm.activate(id).map_err(|e| Self::host(step, e))?;
                tracing::info!(partition = id, modules = ?action.module_ids, "fabric partition activated");
            }
            None => {
                return Err(ModeError::claim(MODE, format!("Fabric Manager no longer lists partition {id}")));
            }
        }
        Ok(ModeEdits::default())
    }

    fn revert(&self, action: &serde_json::Value) -> Result<(), ModeError> {
        let action: FabricAction = decode(MODE, action)?;
        let id = action.partition_id;
        let step = format!("deactivate partition {id}");
        let cp = Checkpoint::load(&self.checkpoint)
            .map_err(|e| ModeError::host(MODE, format!("{step}: read the checkpoint"), e))?;
        let shared = cp.claims().iter().any(|(uid, c)| {
            uid != &action.claim_uid
                && c.checkpoint_state == ClaimState::PrepareCompleted
                && c.host_actions.iter().any(|h| {
                    h.mode == MODE
                        && decode::<FabricAction>(MODE, &h.action).is_ok_and(|a| a.partition_id == id)
                })
        });
        if shared {
            tracing::info!(partition = id, "fabric partition still used by another claim; left active");
            return Ok(());
        }
        if self.is_active(id, &step)? == Some(true) {
            self.fm.deactivate(id).map_err(|e| Self::host(step, e))?;
            tracing::info!(partition = id, "fabric partition deactivated");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn gpu(id: u32) -> PartitionGpu {
        PartitionGpu { physical_id: id, uuid: String::new(), pci_bus_id: String::new() }
    }

    #[test]
    fn address_from_env() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| (*v).to_owned())
        };
        assert_eq!(FmAddress::from_env(env(&[])), FmAddress::Unix(DEFAULT_UNIX_SOCKET.into()));
        assert_eq!(FmAddress::from_env(env(&[(ADDRESS_ENV, "")])), FmAddress::Tcp("127.0.0.1".into()));
        assert_eq!(
            FmAddress::from_env(env(&[(ADDRESS_ENV, "10.0.0.2"), (UNIX_SOCKET_ENV, "/x")])),
            FmAddress::Tcp("10.0.0.2".into())
        );
        assert_eq!(
            FmAddress::from_env(env(&[(UNIX_SOCKET_ENV, "/run/fm.sock")])),
            FmAddress::Unix("/run/fm.sock".into())
        );
        assert_eq!(
            FmAddress::from_env(env(&[(UNIX_SOCKET_ENV, "")])),
            FmAddress::Unix(DEFAULT_UNIX_SOCKET.into())
        );
    }

    #[test]
    fn nvswitch_detection() {
        let root = tempfile::tempdir().unwrap();
        assert!(!has_nvswitch_fabric(root.path()).unwrap(), "nothing there");
        let devices = root.path().join("proc/driver/nvidia-nvswitch/devices");
        std::fs::create_dir_all(&devices).unwrap();
        assert!(!has_nvswitch_fabric(root.path()).unwrap(), "empty directory");
        let ib = root.path().join("sys/class/infiniband/mlx5_0/device");
        std::fs::create_dir_all(&ib).unwrap();
        std::fs::write(ib.join("vpd"), b"\x82\x10PN MCX750500B-0D00").unwrap();
        assert!(!has_nvswitch_fabric(root.path()).unwrap(), "a VPD without the marker");
        std::fs::write(ib.join("vpd"), b"\x82\x10V3 SW_MNG;x").unwrap();
        assert!(has_nvswitch_fabric(root.path()).unwrap(), "switch-managed CX7");
        std::fs::remove_file(ib.join("vpd")).unwrap();
        std::fs::write(devices.join("0000:05:00.0"), "").unwrap();
        assert!(has_nvswitch_fabric(root.path()).unwrap(), "an NVSwitch device");
    }

    #[test]
    fn partitions_are_validated() {
        let p = |id, gpus: Vec<PartitionGpu>| Partition { id, active: false, gpus };
        assert!(validate_partitions(&[p(0, vec![gpu(1), gpu(2)]), p(1, vec![gpu(1)])]).is_ok());
        let err = |ps: &[Partition]| validate_partitions(ps).unwrap_err().to_string();
        assert_eq!(
            err(&[p(0, vec![gpu(1)]), p(0, vec![gpu(2)])]),
            "fabric manager: FM returned partition 0 twice"
        );
        assert_eq!(err(&[p(3, vec![])]), "fabric manager: partition 3 has no GPUs");
        assert_eq!(
            err(&[p(3, vec![gpu(1), gpu(1)])]),
            "fabric manager: partition 3 names a GPU module twice"
        );
        assert_eq!(
            err(&[p(1, vec![gpu(1)]), p(2, vec![gpu(1)])]),
            "fabric manager: gpuModuleID 1 is in two partitions of size 1 (1 and 2)"
        );
    }

    #[test]
    fn the_fake_follows_fm_rules() {
        let fm = FakeFabricManager::new(vec![
            Partition { id: 0, active: false, gpus: vec![gpu(1), gpu(2)] },
            Partition { id: 1, active: false, gpus: vec![gpu(1)] },
            Partition { id: 2, active: false, gpus: vec![gpu(2)] },
        ]);
        fm.activate(1).unwrap();
        fm.activate(2).unwrap();
        assert!(fm.activate(0).unwrap_err().to_string().contains("FM_ST_IN_USE"));
        assert!(fm.activate(1).is_err(), "already active");
        fm.deactivate(1).unwrap();
        assert!(fm.deactivate(1).is_err(), "already inactive");
        assert!(fm.activate(9).is_err());
        assert_eq!(fm.active(), [2]);
        fm.fail_next("partitions");
        assert!(fm.partitions().is_err());
        assert!(fm.partitions().is_ok());
    }
}
