//! A [`DeviceBackend`] driven by a YAML or JSON description, for running every binary without GPUs.
//!
//! The description (all keys camelCase; only `gpus[].uuid`, `name` and `memoryMiB` are required):
//!
//! ```yaml
//! name: my-node                    # free text
//! driver:                          # default: no driver versions reported
//!   version: 570.86.10             # driver version string
//!   cudaVersion: "12.8"            # CUDA driver API version major.minor (optional)
//! gpus:
//!   - uuid: GPU-0000               # unique
//!     name: NVIDIA H100 80GB HBM3  # GpuDevice::type_name
//!     vendor: nvidia               # nvidia | metax | other (default nvidia)
//!     memoryMiB: 81559
//!     usedMemoryMiB: 512           # default: sum of the processes' memory
//!     busId: "0000:18:00.0"        # default 0000:<index+1>:00.0
//!     numaNode: 0                  # default none
//!     minor: 0                     # /dev/nvidia<minor>; default: the index
//!     pciDeviceId: "0x233010DE"    # NVML pciDeviceId (device << 16 | vendor, hex); default: not reported
//!     computeCapability: "9.0"     # default 0.0
//!     cores: 100                   # default 100
//!     splitCount: 10               # default 10
//!     healthy: true                # default true
//!     mig:                         # default: MIG not supported
//!       mode: Enabled              # NotSupported | Disabled | Enabled (MIG control needs a known model,
//!                                  #   see backend::mig: A100, H100 80GB, H200, A30 by name and memory)
//!       modeChange: Immediate      # Immediate (default) | Pending: a mode change waits for a GPU reset
//!       reset: Succeeds            # Succeeds (default; refused while processes run) | InUse | NotSupported
//!       pending: Disabled          # a mode change already waiting for a reset (default none)
//!       instances:
//!         - { uuid: MIG-0, profile: 3g.40gb, gpuInstanceId: 1, computeInstanceId: 0,
//!             placementStart: 0, placementSize: 4, memoryMiB: 40320,
//!             usedMemoryMiB: 1024 }   # memory in use inside the instance; default: not reported
//!     processes:
//!       - { pid: 4242, usedMemoryMiB: 20480, kind: compute }
//! topology:                        # default: every pair UNKNOWN
//!   default: [SYS]                 # links of every pair not named by a rule
//!   rules:                         # every pair within `gpus` gets `links`; later rules win
//!     - { gpus: [0, 1, 2, 3], links: [NV18, NODE] }
//! healthEvents:                    # sent to each subscriber, in afterMs order
//!   - { gpu: 5, kind: xid, xid: 79, afterMs: 30000, message: fell off the bus }
//!   # kinds: xid | eccUncorrectable | deviceLost | recovered
//! utilization:
//!   - { gpu: 0, pid: 4242, timestampUs: 1700000000000000, smPercent: 50, memoryPercent: 20 }
//! migStateFile: /run/mock-mig.json # default none: MIG changes live in this process only
//! liveFile: /run/mock-live.yaml    # default none: see "Live file" below
//! ```
//!
//! ## MIG state machine
//!
//! [`DeviceBackend::set_mig_mode`], [`DeviceBackend::create_mig_device`] and
//! [`DeviceBackend::destroy_mig_device`] change the MIG layout by the rules of [`super::mig`]: creating needs
//! mode `Enabled` and a known model, a profile of that model at one of its allowed starts, and no overlap
//! with an existing instance; the mode cannot change while instances exist; every refusal is a
//! [`BackendError::Mig`] naming the rule. New instances get the lowest free GPU instance id (from 1),
//! compute instance 0 and the UUID `MIG-<gpu uuid without GPU->-<gi>`.
//!
//! With `modeChange: Pending`, [`DeviceBackend::set_mig_mode`] records the wanted mode as pending and
//! answers [`MigError::ResetRequired`] (as NVML does on GPUs that need a reset); setting the current mode
//! again cancels it. [`DeviceBackend::reset_gpu`] applies a pending mode when `reset` is `Succeeds` and no
//! process runs on the GPU (description or live file); otherwise it answers [`BackendError::ResetRefused`]
//! (`InUse`, or processes) or [`BackendError::NotSupported`] (`NotSupported`). A node reboot is simulated
//! by writing the state file with the pending mode applied (or by [`MockBackend::reboot`]).
//!
//! With `migStateFile`, the layouts are shared between processes (the MIG manager changes them, the device
//! plugin reads them): each MIG read loads the file when it exists (it overrides the description's `mig`
//! for the GPUs it names, by UUID) and each change rewrites it atomically, as JSON:
//!
//! ```json
//! {"gpus": {"GPU-0": {"mode": "Enabled", "instances": [{"uuid": "MIG-0-1", "profile": "1g.10gb",
//!   "gpuInstanceId": 1, "computeInstanceId": 0, "placementStart": 0, "placementSize": 1, "memoryMiB": 9856}]},
//!   "GPU-1": {"mode": "Disabled", "pending": "Enabled"}}}
//! ```
//!
//! (`modeChange` and `reset` describe the GPU and belong to the description only; the state file refuses
//! them.)
//!
//! ## Live file
//!
//! With `liveFile`, another process (a test, a demo) changes what the GPUs report while the backend runs. The
//! file is YAML or JSON with any of three keys, in the description's own shapes:
//!
//! ```yaml
//! processes:                       # by GPU index: replaces that GPU's `processes`, and its used memory
//!   0: [{ pid: 31337, usedMemoryMiB: 1024 }]   #   becomes their sum
//! utilization:                     # when present, replaces every `utilization` sample
//!   - { gpu: 0, pid: 31337, timestampUs: 1700000000000000, smPercent: 40 }
//! healthEvents:                    # append-only: each entry is sent once to every health subscriber,
//!   - { gpu: 0, kind: xid, xid: 79 }  #   within about 100 ms of being written (`afterMs` is not allowed)
//! ```
//!
//! The file is read again on each call (write it atomically: temporary file, then rename); while it does not
//! exist the description answers. A file that does not parse or names a GPU the description lacks makes
//! [`DeviceBackend::processes`], [`DeviceBackend::memory_usage`] and [`DeviceBackend::process_utilization`]
//! fail with the file and the field; the health thread skips it until it is valid again.
//!
//! ## Sharing settings
//!
//! [`DeviceBackend::set_compute_mode`] and [`DeviceBackend::set_time_slice`] record the GPU's setting in
//! this process (every GPU starts `Default`/`Default`); [`DeviceBackend::compute_mode`],
//! [`MockBackend::time_slice`] and [`MockBackend::sharing_changes`] read them back for tests.
//!
//! Ready descriptions live in `examples/mock/` at the workspace root.

use std::{
    collections::{BTreeMap, HashSet},
    path::{Path, PathBuf},
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use serde::{Deserialize, Serialize};

use super::{
    BackendError, ComputeMode, DeviceBackend, DriverVersions, GpuProcess, HealthEvent, HealthEventKind,
    HealthEventSender, HealthEvents, LinkMatrix, MemoryUsage, MigInstance, MigLayout, MigMode, MigProfile,
    MigProfileInfo, MockConfigError, ProcessKind, ProcessUtilizationSample, TimeSlice, health_channel,
    links::parse_link,
    mig::{MigError, MigModel},
    vendor::{MetaxAdapter, NvidiaAdapter, VendorAdapter},
};
use crate::{
    discovery::PciAddress,
    model::{ComputeCapability, DeviceHealth, GpuDevice, Vendor},
};

const MIB: u64 = 1 << 20;

// === description (serde) ===

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Description {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    driver: Option<DriverSpec>,
    #[serde(default)]
    gpus: Vec<GpuSpec>,
    #[serde(default)]
    topology: Option<TopologySpec>,
    #[serde(default)]
    health_events: Vec<HealthSpec>,
    #[serde(default)]
    utilization: Vec<SampleSpec>,
    #[serde(default)]
    mig_state_file: Option<PathBuf>,
    #[serde(default)]
    live_file: Option<PathBuf>,
}

/// The live file (module docs, "Live file").
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct LiveSpec {
    #[serde(default)]
    processes: BTreeMap<u32, Vec<ProcessSpec>>,
    #[serde(default)]
    utilization: Option<Vec<SampleSpec>>,
    #[serde(default)]
    health_events: Vec<HealthSpec>,
}

/// The live file, validated against the description.
#[derive(Debug, Default)]
struct LiveState {
    /// Processes by GPU index, for the GPUs the file names.
    processes: BTreeMap<usize, Vec<GpuProcess>>,
    /// Samples by GPU index, sorted by time, when the file has `utilization`.
    samples: Option<Vec<Vec<ProcessUtilizationSample>>>,
    /// Every health event of the file, in file order.
    events: Vec<HealthEvent>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct DriverSpec {
    version: String,
    #[serde(default)]
    cuda_version: Option<String>,
}

#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
enum VendorSpec {
    #[default]
    Nvidia,
    Metax,
    Other,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct GpuSpec {
    uuid: String,
    name: String,
    #[serde(default)]
    vendor: VendorSpec,
    #[serde(rename = "memoryMiB")]
    memory_mib: u64,
    #[serde(default, rename = "usedMemoryMiB")]
    used_memory_mib: Option<u64>,
    #[serde(default)]
    bus_id: Option<String>,
    #[serde(default)]
    numa_node: Option<u32>,
    #[serde(default)]
    minor: Option<u32>,
    #[serde(default)]
    pci_device_id: Option<String>,
    #[serde(default)]
    compute_capability: Option<String>,
    #[serde(default)]
    cores: Option<u64>,
    #[serde(default)]
    split_count: Option<u32>,
    #[serde(default = "yes")]
    healthy: bool,
    #[serde(default)]
    mig: Option<MigSpec>,
    #[serde(default)]
    processes: Vec<ProcessSpec>,
}

fn yes() -> bool {
    true
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct MigSpec {
    mode: MigModeSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pending: Option<MigModeSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    mode_change: Option<ModeChangeSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    reset: Option<ResetSpec>,
    #[serde(default)]
    instances: Vec<MigInstanceSpec>,
}

#[derive(Debug, Clone, Copy, Deserialize, Serialize)]
enum MigModeSpec {
    NotSupported,
    Disabled,
    Enabled,
}

impl MigModeSpec {
    fn mode(self) -> MigMode {
        match self {
            Self::NotSupported => MigMode::NotSupported,
            Self::Disabled => MigMode::Disabled,
            Self::Enabled => MigMode::Enabled,
        }
    }

    fn of(mode: MigMode) -> Self {
        match mode {
            MigMode::NotSupported => Self::NotSupported,
            MigMode::Disabled => Self::Disabled,
            MigMode::Enabled => Self::Enabled,
        }
    }
}

/// `mig.modeChange`: whether a mode change applies at once or waits for a GPU reset.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
enum ModeChangeSpec {
    #[default]
    Immediate,
    Pending,
}

/// `mig.reset`: how [`DeviceBackend::reset_gpu`] answers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
enum ResetSpec {
    #[default]
    Succeeds,
    InUse,
    NotSupported,
}

/// How one GPU's MIG mode changes and resets behave (the description's `modeChange` and `reset`).
#[derive(Debug, Clone, Copy, Default)]
struct MigBehaviour {
    mode_change: ModeChangeSpec,
    reset: ResetSpec,
}

/// The MIG state machine's state: layouts and pending modes, by index.
#[derive(Debug, Default)]
struct MigStore {
    layouts: Vec<MigLayout>,
    pending: Vec<Option<MigMode>>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct MigInstanceSpec {
    uuid: String,
    profile: String,
    gpu_instance_id: u32,
    #[serde(default)]
    compute_instance_id: u32,
    placement_start: u32,
    placement_size: u32,
    #[serde(rename = "memoryMiB")]
    memory_mib: u64,
    #[serde(default, rename = "usedMemoryMiB", skip_serializing_if = "Option::is_none")]
    used_memory_mib: Option<u64>,
}

/// The `migStateFile` document.
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct MigStateFile {
    #[serde(default)]
    gpus: BTreeMap<String, MigSpec>,
}

impl MigSpec {
    fn from_layout(layout: &MigLayout, pending: Option<MigMode>) -> Self {
        Self {
            mode: MigModeSpec::of(layout.mode),
            pending: pending.map(MigModeSpec::of),
            mode_change: None,
            reset: None,
            instances: layout
                .instances
                .iter()
                .map(|i| MigInstanceSpec {
                    uuid: i.uuid.clone(),
                    profile: i.profile.to_string(),
                    gpu_instance_id: i.gpu_instance_id,
                    compute_instance_id: i.compute_instance_id,
                    placement_start: i.placement_start,
                    placement_size: i.placement_size,
                    memory_mib: i.memory_mib,
                    used_memory_mib: i.memory_used_bytes.map(|b| b / MIB),
                })
                .collect(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ProcessSpec {
    pid: u32,
    #[serde(default, rename = "usedMemoryMiB")]
    used_memory_mib: Option<u64>,
    #[serde(default)]
    kind: ProcessKindSpec,
}

impl ProcessSpec {
    fn process(&self) -> GpuProcess {
        GpuProcess {
            pid: self.pid,
            used_memory_bytes: self.used_memory_mib.map(|m| m.saturating_mul(MIB)),
            kind: match self.kind {
                ProcessKindSpec::Compute => ProcessKind::Compute,
                ProcessKindSpec::Graphics => ProcessKind::Graphics,
            },
        }
    }
}

#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
enum ProcessKindSpec {
    #[default]
    Compute,
    Graphics,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct TopologySpec {
    #[serde(default)]
    default: Vec<String>,
    #[serde(default)]
    rules: Vec<LinkRuleSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct LinkRuleSpec {
    gpus: Vec<u32>,
    links: Vec<String>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "camelCase")]
enum HealthKindSpec {
    Xid,
    EccUncorrectable,
    DeviceLost,
    Recovered,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct HealthSpec {
    gpu: u32,
    kind: HealthKindSpec,
    #[serde(default)]
    xid: Option<u64>,
    #[serde(default)]
    message: Option<String>,
    #[serde(default)]
    after_ms: u64,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct SampleSpec {
    gpu: u32,
    pid: u32,
    timestamp_us: u64,
    #[serde(default)]
    sm_percent: u32,
    #[serde(default)]
    memory_percent: u32,
    #[serde(default)]
    encoder_percent: u32,
    #[serde(default)]
    decoder_percent: u32,
}

// === validation ===

struct Validator<'a> {
    source_name: &'a str,
}

impl Validator<'_> {
    fn invalid(&self, field: impl Into<String>, message: impl Into<String>) -> MockConfigError {
        MockConfigError::Invalid {
            source_name: self.source_name.to_owned(),
            field: field.into(),
            message: message.into(),
        }
    }

    fn gpu_index(&self, field: String, gpu: u32, count: usize) -> Result<usize, MockConfigError> {
        usize::try_from(gpu)
            .ok()
            .filter(|i| *i < count)
            .ok_or_else(|| self.invalid(field, format!("no GPU with index {gpu} (there are {count})")))
    }

    /// One health event of `healthEvents` (description or live file), `field` being its path.
    fn health_event(
        &self,
        field: &str,
        spec: &HealthSpec,
        devices: &[GpuDevice],
    ) -> Result<HealthEvent, MockConfigError> {
        let index = self.gpu_index(format!("{field}.gpu"), spec.gpu, devices.len())?;
        let kind = match (spec.kind, spec.xid) {
            (HealthKindSpec::Xid, Some(code)) => HealthEventKind::Xid { code },
            (HealthKindSpec::Xid, None) => {
                return Err(self.invalid(format!("{field}.xid"), "required when kind is xid"));
            }
            (_, Some(_)) => return Err(self.invalid(format!("{field}.xid"), "only allowed when kind is xid")),
            (HealthKindSpec::EccUncorrectable, None) => HealthEventKind::EccUncorrectable,
            (HealthKindSpec::DeviceLost, None) => HealthEventKind::DeviceLost,
            (HealthKindSpec::Recovered, None) => HealthEventKind::Recovered,
        };
        Ok(HealthEvent {
            index: spec.gpu,
            uuid: devices.get(index).map(|d| d.uuid.clone()).unwrap_or_default(),
            kind,
            message: spec.message.clone().unwrap_or_default(),
        })
    }

    /// `utilization` (description or live file) as samples per GPU index, each sorted by time.
    fn samples(
        &self,
        specs: &[SampleSpec],
        count: usize,
    ) -> Result<Vec<Vec<ProcessUtilizationSample>>, MockConfigError> {
        let mut per_gpu = vec![Vec::new(); count];
        for (s, spec) in specs.iter().enumerate() {
            let index = self.gpu_index(format!("utilization[{s}].gpu"), spec.gpu, count)?;
            for (name, value) in [
                ("smPercent", spec.sm_percent),
                ("memoryPercent", spec.memory_percent),
                ("encoderPercent", spec.encoder_percent),
                ("decoderPercent", spec.decoder_percent),
            ] {
                if value > 100 {
                    return Err(self.invalid(format!("utilization[{s}].{name}"), "must be at most 100"));
                }
            }
            if let Some(gpu) = per_gpu.get_mut(index) {
                gpu.push(ProcessUtilizationSample {
                    pid: spec.pid,
                    timestamp_us: spec.timestamp_us,
                    sm_percent: spec.sm_percent,
                    memory_percent: spec.memory_percent,
                    encoder_percent: spec.encoder_percent,
                    decoder_percent: spec.decoder_percent,
                });
            }
        }
        for gpu in &mut per_gpu {
            gpu.sort_by_key(|s| s.timestamp_us);
        }
        Ok(per_gpu)
    }

    /// The live file's content checked against the description's `devices`.
    fn live(&self, spec: LiveSpec, devices: &[GpuDevice]) -> Result<LiveState, MockConfigError> {
        let count = devices.len();
        let mut processes = BTreeMap::new();
        for (gpu, list) in &spec.processes {
            let index = self.gpu_index(format!("processes.{gpu}"), *gpu, count)?;
            processes.insert(index, list.iter().map(ProcessSpec::process).collect());
        }
        let samples = spec.utilization.as_deref().map(|u| self.samples(u, count)).transpose()?;
        let mut events = Vec::with_capacity(spec.health_events.len());
        for (e, event) in spec.health_events.iter().enumerate() {
            if event.after_ms != 0 {
                return Err(self.invalid(
                    format!("healthEvents[{e}].afterMs"),
                    "not allowed in the live file (an event is sent when it is written)",
                ));
            }
            events.push(self.health_event(&format!("healthEvents[{e}]"), event, devices)?);
        }
        Ok(LiveState { processes, samples, events })
    }

    fn links(&self, field: &str, names: &[String]) -> Result<Vec<u8>, MockConfigError> {
        names
            .iter()
            .enumerate()
            .map(|(i, name)| {
                parse_link(name).ok_or_else(|| {
                    self.invalid(
                        format!("{field}[{i}]"),
                        format!(
                            "{name:?} is not a link (SYS, NODE, PHB, PXB, PIX, BOARD, NV1..NV18, UNKNOWN)"
                        ),
                    )
                })
            })
            .collect()
    }

    fn build(&self, description: Description) -> Result<MockBackend, MockConfigError> {
        let count = description.gpus.len();
        let index_of = |i: usize| u32::try_from(i).map_err(|_| self.invalid("gpus", "too many GPUs"));
        let mut devices = Vec::with_capacity(count);
        let mut gpus = Vec::with_capacity(count);
        let mut uuids = HashSet::new();
        let mut bus_ids = HashSet::new();
        let mut mig_models = Vec::with_capacity(count);
        let mut behaviours = Vec::with_capacity(count);
        let mut pendings = Vec::with_capacity(count);
        for (i, spec) in description.gpus.into_iter().enumerate() {
            let field = |name: &str| format!("gpus[{i}].{name}");
            if spec.uuid.trim().is_empty() {
                return Err(self.invalid(field("uuid"), "must not be empty"));
            }
            if !uuids.insert(spec.uuid.clone()) {
                return Err(self.invalid(field("uuid"), format!("{:?} is used twice", spec.uuid)));
            }
            if spec.name.trim().is_empty() {
                return Err(self.invalid(field("name"), "must not be empty"));
            }
            if spec.memory_mib == 0 {
                return Err(self.invalid(field("memoryMiB"), "must be positive"));
            }
            let bus_id = match &spec.bus_id {
                Some(text) => {
                    text.parse::<PciAddress>().map_err(|err| self.invalid(field("busId"), err.to_string()))?
                }
                None => {
                    let n =
                        u32::try_from(i + 1).map_err(|_| self.invalid(field("busId"), "too many GPUs"))?;
                    PciAddress {
                        domain: n >> 8,
                        bus: u8::try_from(n & 0xff).unwrap_or(0),
                        device: 0,
                        function: 0,
                    }
                }
            };
            if !bus_ids.insert(bus_id) {
                return Err(self.invalid(field("busId"), format!("{bus_id} is used twice")));
            }
            let capability = match &spec.compute_capability {
                Some(text) => text
                    .trim()
                    .split_once('.')
                    .and_then(|(major, minor)| {
                        ComputeCapability::new(major.parse().ok()?, minor.parse().ok()?)
                    })
                    .ok_or_else(|| {
                        self.invalid(
                            field("computeCapability"),
                            format!("{text:?} is not major.minor (minor 0..9)"),
                        )
                    })?,
                None => ComputeCapability::default(),
            };
            let split_count = spec.split_count.unwrap_or(10);
            if split_count == 0 {
                return Err(self.invalid(field("splitCount"), "must be at least 1"));
            }

            let behaviour = spec.mig.as_ref().map_or_else(MigBehaviour::default, |mig| MigBehaviour {
                mode_change: mig.mode_change.unwrap_or_default(),
                reset: mig.reset.unwrap_or_default(),
            });
            let (mig, pending) = match spec.mig {
                None => (MigLayout::default(), None),
                Some(mig) => self.mig(i, mig, spec.memory_mib)?,
            };
            behaviours.push(behaviour);
            pendings.push(pending);
            let processes: Vec<GpuProcess> = spec.processes.iter().map(ProcessSpec::process).collect();
            let used_mib = spec.used_memory_mib.unwrap_or_else(|| {
                spec.processes.iter().filter_map(|p| p.used_memory_mib).fold(0u64, u64::saturating_add)
            });
            if used_mib > spec.memory_mib {
                return Err(self.invalid(
                    field("usedMemoryMiB"),
                    format!("{used_mib} MiB used is more than the {} MiB of the GPU", spec.memory_mib),
                ));
            }

            mig_models.push(MigModel::detect(&spec.name, spec.memory_mib));
            devices.push(GpuDevice {
                index: index_of(i)?,
                uuid: spec.uuid.clone(),
                type_name: spec.name.clone(),
                vendor: match spec.vendor {
                    VendorSpec::Nvidia => Vendor::Nvidia,
                    VendorSpec::Metax => Vendor::MetaX,
                    VendorSpec::Other => Vendor::Other,
                },
                memory_mib: spec.memory_mib,
                cores: spec.cores.unwrap_or(100),
                split_count,
                numa_node: spec.numa_node,
                mig_enabled: mig.mode == MigMode::Enabled,
                bus_id: bus_id.to_string(),
                capability,
                health: DeviceHealth::from_bool(spec.healthy),
            });
            let pci_device_id = match &spec.pci_device_id {
                None => None,
                Some(text) => Some(crate::backend::parse_pci_device_id(text).ok_or_else(|| {
                    self.invalid(
                        field("pciDeviceId"),
                        format!("{text:?} is not a 32-bit hex id such as 0x20B010DE"),
                    )
                })?),
            };
            gpus.push(GpuState {
                minor: spec.minor.unwrap_or(index_of(i)?),
                pci_device_id,
                memory: MemoryUsage {
                    total_bytes: spec.memory_mib.saturating_mul(MIB),
                    used_bytes: used_mib.saturating_mul(MIB),
                },
                processes,
                samples: Vec::new(),
                mig,
            });
        }

        let mut topology = LinkMatrix::new(count);
        if let Some(spec) = description.topology {
            let default = self.links("topology.default", &spec.default)?;
            for i in 0..count {
                for j in (i + 1)..count {
                    topology.set_pair(i, j, default.clone());
                }
            }
            for (r, rule) in spec.rules.iter().enumerate() {
                let links = self.links(&format!("topology.rules[{r}].links"), &rule.links)?;
                let mut members = Vec::with_capacity(rule.gpus.len());
                for (k, gpu) in rule.gpus.iter().enumerate() {
                    let index = self.gpu_index(format!("topology.rules[{r}].gpus[{k}]"), *gpu, count)?;
                    if members.contains(&index) {
                        return Err(self.invalid(format!("topology.rules[{r}].gpus[{k}]"), "listed twice"));
                    }
                    members.push(index);
                }
                if members.len() < 2 {
                    return Err(self.invalid(format!("topology.rules[{r}].gpus"), "needs at least two GPUs"));
                }
                for (a, &i) in members.iter().enumerate() {
                    for &j in members.iter().skip(a + 1) {
                        topology.set_pair(i, j, links.clone());
                    }
                }
            }
        }

        let mut scripted = Vec::with_capacity(description.health_events.len());
        for (e, spec) in description.health_events.iter().enumerate() {
            let event = self.health_event(&format!("healthEvents[{e}]"), spec, &devices)?;
            scripted.push((Duration::from_millis(spec.after_ms), event));
        }
        // Stable: events with the same delay keep their order.
        scripted.sort_by_key(|(delay, _)| *delay);

        for (index, samples) in self.samples(&description.utilization, count)?.into_iter().enumerate() {
            if let Some(gpu) = gpus.get_mut(index) {
                gpu.samples = samples;
            }
        }

        let driver = match description.driver {
            None => None,
            Some(spec) => {
                if spec.version.trim().is_empty() {
                    return Err(self.invalid("driver.version", "must not be empty"));
                }
                let cuda_version = match &spec.cuda_version {
                    None => None,
                    Some(text) => Some(
                        text.trim()
                            .split_once('.')
                            .and_then(|(major, minor)| Some((major.parse().ok()?, minor.parse().ok()?)))
                            .ok_or_else(|| {
                                self.invalid("driver.cudaVersion", format!("{text:?} is not major.minor"))
                            })?,
                    ),
                };
                Some(DriverVersions { driver_version: spec.version.trim().to_owned(), cuda_version })
            }
        };

        let layouts = gpus.iter().map(|g| g.mig.clone()).collect();
        let gpus_len = gpus.len();
        let store = MigStore { layouts, pending: pendings };
        let backend = MockBackend {
            node_name: description.name,
            driver,
            devices,
            gpus,
            topology,
            scripted,
            subscribers: Mutex::new(Vec::new()),
            mig: Mutex::new(store),
            mig_behaviours: behaviours,
            sharing: Mutex::new(SharingState::new(gpus_len)),
            mig_models,
            mig_state_file: description.mig_state_file,
            live_file: description.live_file,
        };
        if let Some(path) = &backend.mig_state_file {
            let mut store = backend.mig.lock().unwrap_or_else(PoisonError::into_inner);
            backend.load_mig_state(path, &mut store)?;
            drop(store);
        }
        Ok(backend)
    }

    /// The layout and the pending mode of `gpus[gpu].mig`.
    fn mig(
        &self,
        gpu: usize,
        spec: MigSpec,
        memory_mib: u64,
    ) -> Result<(MigLayout, Option<MigMode>), MockConfigError> {
        let mode = spec.mode.mode();
        let pending = match spec.pending.map(MigModeSpec::mode) {
            None => None,
            Some(MigMode::NotSupported) => {
                return Err(self.invalid(format!("gpus[{gpu}].mig.pending"), "must be Disabled or Enabled"));
            }
            Some(_) if mode == MigMode::NotSupported => {
                return Err(self.invalid(
                    format!("gpus[{gpu}].mig.pending"),
                    "not allowed on a GPU whose mode is NotSupported",
                ));
            }
            Some(p) if p == mode => {
                return Err(self.invalid(
                    format!("gpus[{gpu}].mig.pending"),
                    format!("{p:?} is already the current mode; leave pending out"),
                ));
            }
            Some(p) => Some(p),
        };
        if mode != MigMode::Enabled && !spec.instances.is_empty() {
            return Err(
                self.invalid(format!("gpus[{gpu}].mig.instances"), "only allowed when mode is Enabled")
            );
        }
        let mut instances = Vec::with_capacity(spec.instances.len());
        let mut total = 0u64;
        for (k, inst) in spec.instances.into_iter().enumerate() {
            let field = |name: &str| format!("gpus[{gpu}].mig.instances[{k}].{name}");
            if inst.uuid.trim().is_empty() {
                return Err(self.invalid(field("uuid"), "must not be empty"));
            }
            let profile = inst
                .profile
                .parse::<MigProfile>()
                .map_err(|err| self.invalid(field("profile"), err.to_string()))?;
            if inst.placement_size == 0 {
                return Err(self.invalid(field("placementSize"), "must be at least 1"));
            }
            if inst.used_memory_mib.is_some_and(|used| used > inst.memory_mib) {
                return Err(
                    self.invalid(field("usedMemoryMiB"), "must not be more than the instance's memoryMiB")
                );
            }
            total = total.saturating_add(inst.memory_mib);
            instances.push(MigInstance {
                uuid: inst.uuid,
                profile,
                gpu_instance_id: inst.gpu_instance_id,
                compute_instance_id: inst.compute_instance_id,
                placement_start: inst.placement_start,
                placement_size: inst.placement_size,
                memory_mib: inst.memory_mib,
                memory_used_bytes: inst.used_memory_mib.map(|mib| mib.saturating_mul(MIB)),
            });
        }
        if total > memory_mib {
            return Err(self.invalid(
                format!("gpus[{gpu}].mig.instances"),
                format!("{total} MiB of instances is more than the {memory_mib} MiB of the GPU"),
            ));
        }
        Ok((MigLayout { mode, instances }, pending))
    }
}

// === impl MockBackend ===

fn pending_at(pending: &mut [Option<MigMode>], index: u32) -> Result<&mut Option<MigMode>, BackendError> {
    let count = pending.len();
    usize::try_from(index)
        .ok()
        .and_then(|i| pending.get_mut(i))
        .ok_or(BackendError::NoSuchDevice { index, count })
}

fn layout_at(layouts: &mut [MigLayout], index: u32) -> Result<&mut MigLayout, BackendError> {
    let count = layouts.len();
    usize::try_from(index)
        .ok()
        .and_then(|i| layouts.get_mut(i))
        .ok_or(BackendError::NoSuchDevice { index, count })
}

#[derive(Debug)]
struct GpuState {
    minor: u32,
    pci_device_id: Option<u32>,
    memory: MemoryUsage,
    processes: Vec<GpuProcess>,
    samples: Vec<ProcessUtilizationSample>,
    mig: MigLayout,
}

/// A [`DeviceBackend`] that answers from a description (see the module docs).
///
/// ```
/// use vgpu_core::backend::{DeviceBackend, mock::MockBackend};
///
/// let backend = MockBackend::from_yaml_str(
///     "gpus:\n  - { uuid: GPU-a, name: L4, memoryMiB: 23034 }\n  - { uuid: GPU-b, name: L4, memoryMiB: 23034 }\ntopology:\n  default: [PIX]\n",
/// )?;
/// assert_eq!(backend.topology()?.links(0, 1), &[5]);
/// # Ok::<(), vgpu_core::backend::BackendError>(())
/// ```
#[derive(Debug)]
pub struct MockBackend {
    node_name: Option<String>,
    driver: Option<DriverVersions>,
    devices: Vec<GpuDevice>,
    gpus: Vec<GpuState>,
    topology: LinkMatrix,
    scripted: Vec<(Duration, HealthEvent)>,
    subscribers: Mutex<Vec<HealthEventSender>>,
    /// The current MIG layouts and pending modes, by index (the state machine).
    mig: Mutex<MigStore>,
    /// How each GPU's mode changes and resets behave.
    mig_behaviours: Vec<MigBehaviour>,
    mig_models: Vec<Option<&'static MigModel>>,
    mig_state_file: Option<PathBuf>,
    /// The live file (module docs), read on each call.
    live_file: Option<PathBuf>,
    /// Compute mode and time slice per GPU, and how many calls changed one (in this process only).
    sharing: Mutex<SharingState>,
}

/// The mock's sharing settings ([`DeviceBackend::set_compute_mode`], [`DeviceBackend::set_time_slice`]).
#[derive(Debug)]
struct SharingState {
    settings: Vec<(ComputeMode, TimeSlice)>,
    changes: usize,
}

impl SharingState {
    fn new(gpus: usize) -> Self {
        Self { settings: vec![(ComputeMode::Default, TimeSlice::Default); gpus], changes: 0 }
    }
}

impl MockBackend {
    /// Parses a YAML description (JSON is accepted as well).
    pub fn from_yaml_str(text: &str) -> Result<Self, MockConfigError> {
        Self::from_yaml_named(text, "<string>")
    }

    fn from_yaml_named(text: &str, source_name: &str) -> Result<Self, MockConfigError> {
        let description: Description = serde_saphyr::from_str(text).map_err(|err| {
            MockConfigError::Parse { source_name: source_name.to_owned(), message: err.to_string() }
        })?;
        Validator { source_name }.build(description)
    }

    /// Parses a JSON description.
    pub fn from_json_str(text: &str) -> Result<Self, MockConfigError> {
        let description: Description = serde_json::from_str(text).map_err(|err| MockConfigError::Parse {
            source_name: "<string>".to_owned(),
            message: err.to_string(),
        })?;
        Validator { source_name: "<string>" }.build(description)
    }

    /// Reads a description file: `.json` as JSON, anything else as YAML.
    pub fn from_path(path: &Path) -> Result<Self, MockConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| MockConfigError::Read { path: path.to_path_buf(), source })?;
        let source_name = path.display().to_string();
        if path.extension().is_some_and(|ext| ext.eq_ignore_ascii_case("json")) {
            let description: Description = serde_json::from_str(&text).map_err(|err| {
                MockConfigError::Parse { source_name: source_name.clone(), message: err.to_string() }
            })?;
            Validator { source_name: &source_name }.build(description)
        } else {
            Self::from_yaml_named(&text, &source_name)
        }
    }

    /// The `name` of the description.
    pub fn node_name(&self) -> Option<&str> {
        self.node_name.as_deref()
    }

    /// Sends `event` to every current subscriber; returns how many received it.
    pub fn inject_health_event(&self, event: HealthEvent) -> usize {
        let mut subscribers = self.subscribers.lock().unwrap_or_else(PoisonError::into_inner);
        subscribers.retain(HealthEventSender::is_open);
        subscribers.iter().filter(|tx| tx.send(event.clone())).count()
    }

    /// The time slice last set on GPU `index` ([`DeviceBackend::set_time_slice`]; `Default` at start).
    pub fn time_slice(&self, index: u32) -> Result<TimeSlice, BackendError> {
        self.with_sharing(index, |s| Ok(s.1))
    }

    /// How many [`DeviceBackend::set_compute_mode`] / [`DeviceBackend::set_time_slice`] calls changed a
    /// setting so far (a call that sets the current value again does not count): tests see idempotence.
    pub fn sharing_changes(&self) -> usize {
        self.sharing.lock().unwrap_or_else(PoisonError::into_inner).changes
    }

    fn with_sharing<R>(
        &self,
        index: u32,
        f: impl FnOnce(&mut (ComputeMode, TimeSlice)) -> Result<R, BackendError>,
    ) -> Result<R, BackendError> {
        let mut state = self.sharing.lock().unwrap_or_else(PoisonError::into_inner);
        let count = state.settings.len();
        let slot = usize::try_from(index)
            .ok()
            .and_then(|i| state.settings.get_mut(i))
            .ok_or(BackendError::NoSuchDevice { index, count })?;
        let before = *slot;
        let result = f(slot)?;
        let changed = *slot != before;
        if changed {
            state.changes += 1;
        }
        Ok(result)
    }

    /// Replaces `layouts` entries with those the state file names (a missing file changes nothing).
    fn load_mig_state(&self, path: &Path, store: &mut MigStore) -> Result<(), MockConfigError> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(source) => return Err(MockConfigError::Read { path: path.to_path_buf(), source }),
        };
        let source_name = path.display().to_string();
        let state: MigStateFile = serde_json::from_str(&text).map_err(|err| MockConfigError::Parse {
            source_name: source_name.clone(),
            message: err.to_string(),
        })?;
        let validator = Validator { source_name: &source_name };
        for (uuid, spec) in state.gpus {
            let Some(i) = self.devices.iter().position(|d| d.uuid == uuid) else {
                return Err(
                    validator.invalid(format!("gpus.{uuid}"), "no GPU of the description has this UUID")
                );
            };
            if spec.mode_change.is_some() || spec.reset.is_some() {
                return Err(validator.invalid(
                    format!("gpus.{uuid}"),
                    "modeChange and reset belong to the description, not the state file",
                ));
            }
            let memory = self.devices.get(i).map_or(0, |d| d.memory_mib);
            let (layout, pending) = validator.mig(i, spec, memory)?;
            if let (Some(slot), Some(p)) = (store.layouts.get_mut(i), store.pending.get_mut(i)) {
                *slot = layout;
                *p = pending;
            }
        }
        Ok(())
    }

    fn save_mig_state(&self, path: &Path, store: &MigStore) -> Result<(), BackendError> {
        let state = MigStateFile {
            gpus: self
                .devices
                .iter()
                .zip(store.layouts.iter().zip(&store.pending))
                .map(|(d, (l, p))| (d.uuid.clone(), MigSpec::from_layout(l, *p)))
                .collect(),
        };
        let text = serde_json::to_vec_pretty(&state).map_err(|err| BackendError::Library {
            operation: "writing the mock MIG state",
            source: Box::new(err),
        })?;
        crate::abi::atomic::write_atomic(path, &text, 0o644).map_err(|err| BackendError::Library {
            operation: "writing the mock MIG state",
            source: Box::new(err),
        })
    }

    /// Runs `f` on the current MIG state (re-read from the state file first, if any); with `write`, saves
    /// it afterwards when `f` succeeded.
    fn with_mig<R>(
        &self,
        write: bool,
        f: impl FnOnce(&mut MigStore) -> Result<R, BackendError>,
    ) -> Result<R, BackendError> {
        self.with_mig_saving(write, |store| f(store).map(|r| (r, true)))
    }

    /// As [`Self::with_mig`], where `f` also says whether to save (`write` and `f`'s answer): a refusal that
    /// still changed the state (a mode left pending) is saved too.
    fn with_mig_saving<R>(
        &self,
        write: bool,
        f: impl FnOnce(&mut MigStore) -> Result<(R, bool), BackendError>,
    ) -> Result<R, BackendError> {
        let mut store = self.mig.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(path) = &self.mig_state_file {
            self.load_mig_state(path, &mut store)?;
        }
        let result = f(&mut store);
        let save = match &result {
            Ok((_, save)) => *save,
            Err(_) => false,
        };
        if write
            && save
            && let Some(path) = &self.mig_state_file
        {
            self.save_mig_state(path, &store)?;
        }
        result.map(|(r, _)| r)
    }

    /// The pending MIG mode of GPU `index`, if a mode change waits for a reset.
    pub fn pending_mig_mode(&self, index: u32) -> Result<Option<MigMode>, BackendError> {
        self.gpu(index)?;
        self.with_mig(false, |store| Ok(pending_at(&mut store.pending, index)?.as_ref().copied()))
    }

    /// Simulates a node reboot: every pending MIG mode takes effect (written to the state file, if any).
    pub fn reboot(&self) -> Result<(), BackendError> {
        self.with_mig(true, |store| {
            for (layout, pending) in store.layouts.iter_mut().zip(store.pending.iter_mut()) {
                if let Some(mode) = pending.take() {
                    layout.mode = mode;
                    layout.instances.clear();
                }
            }
            Ok(())
        })
    }

    /// The MIG model of a MIG-capable GPU, or the refusal.
    fn mig_model(&self, index: u32, layout: &MigLayout) -> Result<&'static MigModel, BackendError> {
        let mig = |source| BackendError::Mig { index, source };
        if layout.mode == MigMode::NotSupported {
            return Err(mig(MigError::NotCapable));
        }
        let device = self.device(index)?;
        self.mig_models.get(usize::try_from(index).unwrap_or(usize::MAX)).copied().flatten().ok_or_else(
            || mig(MigError::UnknownModel { name: device.type_name.clone(), memory_mib: device.memory_mib }),
        )
    }

    fn device(&self, index: u32) -> Result<&GpuDevice, BackendError> {
        usize::try_from(index)
            .ok()
            .and_then(|i| self.devices.get(i))
            .ok_or(BackendError::NoSuchDevice { index, count: self.devices.len() })
    }

    /// The live file's state: `None` without a live file or while it does not exist.
    fn live_state(&self) -> Result<Option<LiveState>, MockConfigError> {
        let Some(path) = &self.live_file else { return Ok(None) };
        read_live(path, &self.devices)
    }

    fn behaviour(&self, index: u32) -> MigBehaviour {
        usize::try_from(index).ok().and_then(|i| self.mig_behaviours.get(i)).copied().unwrap_or_default()
    }

    fn gpu(&self, index: u32) -> Result<&GpuState, BackendError> {
        usize::try_from(index)
            .ok()
            .and_then(|i| self.gpus.get(i))
            .ok_or(BackendError::NoSuchDevice { index, count: self.gpus.len() })
    }
}

/// Reads and checks the live file at `path`; `None` while it does not exist.
fn read_live(path: &Path, devices: &[GpuDevice]) -> Result<Option<LiveState>, MockConfigError> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(MockConfigError::Read { path: path.to_path_buf(), source }),
    };
    let source_name = path.display().to_string();
    let spec: LiveSpec = if text.trim().is_empty() {
        LiveSpec::default()
    } else {
        serde_saphyr::from_str(&text).map_err(|err| MockConfigError::Parse {
            source_name: source_name.clone(),
            message: err.to_string(),
        })?
    };
    Validator { source_name: &source_name }.live(spec, devices).map(Some)
}

/// Sends each health event the live file gains to `tx`, polling every 100 ms, until the receiver goes away.
/// Events already in the file when the subscription starts are sent too (each subscriber gets them all, as
/// with the description's); a file that does not parse is skipped until it does.
fn deliver_live(tx: HealthEventSender, path: PathBuf, devices: Vec<GpuDevice>) {
    const POLL: Duration = Duration::from_millis(100);
    let mut sent = 0;
    while tx.is_open() {
        if let Ok(Some(live)) = read_live(&path, &devices) {
            for event in live.events.into_iter().skip(sent) {
                if !tx.send(event) {
                    return;
                }
                sent += 1;
            }
        }
        std::thread::sleep(POLL);
    }
}

/// Sends the delayed scripted events from a thread, stopping early when the receiver goes away.
fn deliver_later(tx: HealthEventSender, events: Vec<(Duration, HealthEvent)>) {
    const SLICE: Duration = Duration::from_millis(50);
    let mut elapsed = Duration::ZERO;
    for (at, event) in events {
        while elapsed < at {
            if !tx.is_open() {
                return;
            }
            let step = (at - elapsed).min(SLICE);
            std::thread::sleep(step);
            elapsed += step;
        }
        if !tx.send(event) {
            return;
        }
    }
}

impl DeviceBackend for MockBackend {
    fn name(&self) -> &'static str {
        "mock"
    }

    fn devices(&self) -> Result<Vec<GpuDevice>, BackendError> {
        self.with_mig(false, |store| {
            let mut devices = self.devices.clone();
            for (device, layout) in devices.iter_mut().zip(store.layouts.iter()) {
                device.mig_enabled = layout.mode == MigMode::Enabled;
            }
            Ok(devices)
        })
    }

    fn minor_number(&self, index: u32) -> Result<u32, BackendError> {
        self.gpu(index).map(|g| g.minor)
    }

    fn pci_device_id(&self, index: u32) -> Result<u32, BackendError> {
        self.gpu(index)?
            .pci_device_id
            .ok_or(BackendError::NotSupported { backend: "mock", operation: "reading the PCI device id" })
    }

    /// With a live file naming the GPU's processes, the used memory is their sum.
    fn memory_usage(&self, index: u32) -> Result<MemoryUsage, BackendError> {
        let gpu = self.gpu(index)?;
        let live = self.live_state()?;
        let used = live.and_then(|l| {
            let processes = l.processes.get(&usize::try_from(index).unwrap_or(usize::MAX))?;
            Some(processes.iter().filter_map(|p| p.used_memory_bytes).fold(0u64, u64::saturating_add))
        });
        Ok(used.map_or(gpu.memory, |used_bytes| MemoryUsage { used_bytes, ..gpu.memory }))
    }

    fn topology(&self) -> Result<LinkMatrix, BackendError> {
        Ok(self.topology.clone())
    }

    /// Immediate scripted events (`afterMs: 0`) are queued at once; later ones come from a thread. The stream
    /// stays open while the backend lives ([`MockBackend::inject_health_event`] can add more).
    fn health_events(&self) -> Result<HealthEvents, BackendError> {
        let (tx, rx) = health_channel();
        let (now, later): (Vec<_>, Vec<_>) = self.scripted.iter().cloned().partition(|(d, _)| d.is_zero());
        for (_, event) in now {
            tx.send(event);
        }
        if !later.is_empty() {
            let thread_tx = tx.clone();
            std::thread::Builder::new()
                .name("mock-health".to_owned())
                .spawn(move || deliver_later(thread_tx, later))
                .map_err(|err| BackendError::Unavailable { backend: "mock", message: err.to_string() })?;
        }
        if let Some(path) = &self.live_file {
            let (thread_tx, path, devices) = (tx.clone(), path.clone(), self.devices.clone());
            std::thread::Builder::new()
                .name("mock-live-health".to_owned())
                .spawn(move || deliver_live(thread_tx, path, devices))
                .map_err(|err| BackendError::Unavailable { backend: "mock", message: err.to_string() })?;
        }
        self.subscribers.lock().unwrap_or_else(PoisonError::into_inner).push(tx);
        Ok(rx)
    }

    fn processes(&self, index: u32) -> Result<Vec<GpuProcess>, BackendError> {
        let gpu = self.gpu(index)?;
        let live = self.live_state()?;
        let from_file =
            live.and_then(|mut l| l.processes.remove(&usize::try_from(index).unwrap_or(usize::MAX)));
        Ok(from_file.unwrap_or_else(|| gpu.processes.clone()))
    }

    fn process_utilization(
        &self,
        index: u32,
        since_timestamp_us: u64,
    ) -> Result<Vec<ProcessUtilizationSample>, BackendError> {
        let gpu = self.gpu(index)?;
        let live = self.live_state()?.and_then(|l| l.samples);
        let samples = match &live {
            Some(per_gpu) => {
                per_gpu.get(usize::try_from(index).unwrap_or(usize::MAX)).map_or(&[][..], Vec::as_slice)
            }
            None => gpu.samples.as_slice(),
        };
        Ok(samples.iter().filter(|s| s.timestamp_us > since_timestamp_us).copied().collect())
    }

    fn compute_mode(&self, index: u32) -> Result<ComputeMode, BackendError> {
        self.with_sharing(index, |s| Ok(s.0))
    }

    fn set_compute_mode(&self, index: u32, mode: ComputeMode) -> Result<(), BackendError> {
        self.with_sharing(index, |s| {
            s.0 = mode;
            Ok(())
        })
    }

    fn set_time_slice(&self, index: u32, slice: TimeSlice) -> Result<(), BackendError> {
        self.with_sharing(index, |s| {
            s.1 = slice;
            Ok(())
        })
    }

    fn mig_layout(&self, index: u32) -> Result<MigLayout, BackendError> {
        self.gpu(index)?;
        self.with_mig(false, |store| Ok(layout_at(&mut store.layouts, index)?.clone()))
    }

    fn mig_profiles(&self, index: u32) -> Result<Vec<MigProfileInfo>, BackendError> {
        let layout = self.mig_layout(index)?;
        Ok(self.mig_model(index, &layout)?.profile_infos())
    }

    fn set_mig_mode(&self, index: u32, enabled: bool) -> Result<(), BackendError> {
        self.gpu(index)?;
        let behaviour = self.behaviour(index);
        self.with_mig_saving(true, |store| {
            let layout = layout_at(&mut store.layouts, index)?;
            if layout.mode == MigMode::NotSupported {
                return Err(BackendError::Mig { index, source: MigError::NotCapable });
            }
            let wanted = if enabled { MigMode::Enabled } else { MigMode::Disabled };
            if layout.mode != wanted && !layout.instances.is_empty() {
                return Err(BackendError::Mig {
                    index,
                    source: MigError::InstancesExist { count: layout.instances.len() },
                });
            }
            let current = layout.mode;
            let pending = pending_at(&mut store.pending, index)?;
            if current == wanted {
                // Asking for the current mode cancels a pending change (as NVML does).
                let changed = pending.take().is_some();
                return Ok((Ok(()), changed));
            }
            if behaviour.mode_change == ModeChangeSpec::Pending {
                *pending = Some(wanted);
                // Saved: the pending mode outlives this refusal, as the driver's does.
                return Ok((
                    Err(BackendError::Mig { index, source: MigError::ResetRequired { enabled } }),
                    true,
                ));
            }
            *pending = None;
            layout_at(&mut store.layouts, index)?.mode = wanted;
            Ok((Ok(()), true))
        })
        .and_then(|r| r)
    }

    fn reset_gpu(&self, index: u32) -> Result<(), BackendError> {
        self.gpu(index)?;
        match self.behaviour(index).reset {
            ResetSpec::NotSupported => {
                return Err(BackendError::NotSupported { backend: "mock", operation: "resetting the GPU" });
            }
            ResetSpec::InUse => {
                return Err(BackendError::ResetRefused {
                    index,
                    reason: "the GPU is in use (mock description: reset: InUse)".to_owned(),
                });
            }
            ResetSpec::Succeeds => {}
        }
        let running = self.processes(index)?.len();
        if running > 0 {
            return Err(BackendError::ResetRefused {
                index,
                reason: format!("in use by {running} process(es)"),
            });
        }
        self.with_mig(true, |store| {
            if let Some(mode) = pending_at(&mut store.pending, index)?.take() {
                let layout = layout_at(&mut store.layouts, index)?;
                layout.mode = mode;
                layout.instances.clear();
            }
            Ok(())
        })
    }

    fn create_mig_device(
        &self,
        index: u32,
        profile: &MigProfile,
        placement_start: u32,
    ) -> Result<MigInstance, BackendError> {
        let gpu_uuid = self.device(index)?.uuid.clone();
        self.with_mig(true, |store| {
            let layout = layout_at(&mut store.layouts, index)?;
            let model = self.mig_model(index, layout)?;
            if layout.mode != MigMode::Enabled {
                return Err(BackendError::Mig { index, source: MigError::NotEnabled });
            }
            let rule = model
                .check_create(&layout.instances, profile, placement_start)
                .map_err(|source| BackendError::Mig { index, source })?;
            let gpu_instance_id =
                (1..).find(|id| layout.instances.iter().all(|i| i.gpu_instance_id != *id)).unwrap_or(0);
            let instance = MigInstance {
                uuid: format!("MIG-{}-{gpu_instance_id}", gpu_uuid.strip_prefix("GPU-").unwrap_or(&gpu_uuid)),
                profile: profile.clone(),
                gpu_instance_id,
                compute_instance_id: 0,
                placement_start,
                placement_size: rule.memory_slices,
                memory_mib: model.instance_memory_mib(rule),
                memory_used_bytes: Some(0),
            };
            layout.instances.push(instance.clone());
            layout.instances.sort_by_key(|i| (i.placement_start, i.gpu_instance_id));
            Ok(instance)
        })
    }

    fn destroy_mig_device(&self, index: u32, gpu_instance_id: u32) -> Result<(), BackendError> {
        self.gpu(index)?;
        self.with_mig(true, |store| {
            let layout = layout_at(&mut store.layouts, index)?;
            let before = layout.instances.len();
            layout.instances.retain(|i| i.gpu_instance_id != gpu_instance_id);
            if layout.instances.len() == before {
                return Err(BackendError::Mig { index, source: MigError::NoSuchInstance(gpu_instance_id) });
            }
            Ok(())
        })
    }

    fn driver_versions(&self) -> Result<Option<DriverVersions>, BackendError> {
        Ok(self.driver.clone())
    }

    /// The adapter of the GPUs' vendor: [`MetaxAdapter`] when every GPU is a MetaX one (DRM nodes
    /// `/dev/dri/card<index+1>` and `/dev/dri/renderD<129+index>`, as on a MetaX host whose `card0` is the
    /// board's VGA), else [`NvidiaAdapter`]. A node mixing MetaX with other GPUs has no single adapter.
    fn vendor_adapter(&self) -> Result<Arc<dyn VendorAdapter>, BackendError> {
        let metax = self.devices.iter().filter(|d| d.vendor == Vendor::MetaX).count();
        if metax == 0 {
            return Ok(Arc::new(NvidiaAdapter));
        }
        if metax < self.devices.len() {
            return Err(BackendError::NotSupported {
                backend: "mock",
                operation: "one vendor adapter for a node mixing MetaX and other GPUs",
            });
        }
        let nodes = self
            .devices
            .iter()
            .map(|d| {
                let paths = vec![
                    format!("/dev/dri/card{}", d.index + 1),
                    format!("/dev/dri/renderD{}", 129 + d.index),
                ];
                (d.index, paths)
            })
            .collect();
        Ok(Arc::new(MetaxAdapter::new(nodes)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::links::{LINK_CROSS_CPU, LINK_SAME_CPU, nvlinks};

    const TWO: &str = "\
name: test
gpus:
  - uuid: GPU-a
    name: NVIDIA A100-SXM4-80GB
    memoryMiB: 81920
    numaNode: 0
    computeCapability: '8.0'
    processes:
      - { pid: 10, usedMemoryMiB: 1000 }
      - { pid: 11, usedMemoryMiB: 24, kind: graphics }
    mig:
      mode: Enabled
      instances:
        - { uuid: MIG-a, profile: 3g.40gb, gpuInstanceId: 2, placementStart: 0, placementSize: 4, memoryMiB: 40320,
            usedMemoryMiB: 2048 }
        - { uuid: MIG-b, profile: 1g.10gb, gpuInstanceId: 9, placementStart: 6, placementSize: 1, memoryMiB: 9856 }
  - uuid: GPU-b
    name: NVIDIA A100-SXM4-80GB
    vendor: nvidia
    memoryMiB: 81920
    usedMemoryMiB: 4096
    busId: '0000:90:00.0'
    healthy: false
topology:
  default: [SYS]
  rules:
    - { gpus: [0, 1], links: [NV12, NODE] }
healthEvents:
  - { gpu: 1, kind: xid, xid: 79, message: gone }
  - { gpu: 0, kind: recovered, afterMs: 20 }
utilization:
  - { gpu: 0, pid: 10, timestampUs: 200, smPercent: 90 }
  - { gpu: 0, pid: 10, timestampUs: 100, smPercent: 40 }
";

    #[test]
    fn answers_from_description() {
        let backend = MockBackend::from_yaml_str(TWO).unwrap();
        assert_eq!(backend.name(), "mock");
        assert_eq!(backend.node_name(), Some("test"));
        let devices = backend.devices().unwrap();
        assert_eq!(devices.len(), 2);
        assert_eq!(devices[0].bus_id, "0000:01:00.0");
        assert_eq!(devices[1].bus_id, "0000:90:00.0");
        assert_eq!(devices[0].capability, ComputeCapability::new(8, 0).unwrap());
        assert!(devices[0].mig_enabled);
        assert_eq!((devices[0].cores, devices[0].split_count), (100, 10));
        assert_eq!(devices[1].health, DeviceHealth::Unhealthy);
        assert_eq!(backend.memory_usage(0).unwrap().used_bytes, 1024 * MIB);
        assert_eq!(backend.memory_usage(1).unwrap().free_bytes(), (81920 - 4096) * MIB);
        assert!(matches!(backend.memory_usage(2), Err(BackendError::NoSuchDevice { index: 2, count: 2 })));
        let topo = backend.topology().unwrap();
        assert_eq!(topo.links(1, 0), &[nvlinks(12).unwrap(), LINK_SAME_CPU]);
        assert_ne!(topo.links(0, 1), &[LINK_CROSS_CPU]);
        assert_eq!(backend.processes(0).unwrap()[1].kind, ProcessKind::Graphics);
        let samples = backend.process_utilization(0, 150).unwrap();
        assert_eq!(samples.len(), 1);
        assert_eq!(samples[0].sm_percent, 90);
        assert_eq!(backend.process_utilization(0, 0).unwrap()[0].timestamp_us, 100);
        let mig = backend.mig_layout(0).unwrap();
        assert_eq!(mig.instances[0].profile.to_string(), "3g.40gb");
        assert_eq!(mig.instances[0].memory_used_bytes, Some(2048 * MIB));
        assert_eq!(mig.instances[1].memory_used_bytes, None, "not scripted: not reported");
        assert_eq!(backend.mig_layout(1).unwrap().mode, MigMode::NotSupported);
        assert_eq!(backend.inventory().unwrap().by_uuid("GPU-b").map(|d| d.index), Some(1));
        assert_eq!(backend.driver_versions().unwrap(), None);
    }

    #[test]
    fn driver_versions_from_description() {
        let text = "driver: { version: 570.86.10, cudaVersion: '12.8' }\ngpus:\n  - { uuid: a, name: x, memoryMiB: 1 }\n";
        let backend = MockBackend::from_yaml_str(text).unwrap();
        let expected = DriverVersions { driver_version: "570.86.10".into(), cuda_version: Some((12, 8)) };
        assert_eq!(backend.driver_versions().unwrap(), Some(expected));
        let boxed: Box<dyn DeviceBackend> = Box::new(backend);
        assert_eq!(boxed.driver_versions().unwrap().unwrap().cuda_version, Some((12, 8)));
        let text = "driver: { version: '550.1' }\ngpus: []\n";
        let versions = MockBackend::from_yaml_str(text).unwrap().driver_versions().unwrap().unwrap();
        assert_eq!(versions.cuda_version, None);
    }

    #[test]
    fn pci_device_id_from_description() {
        let text = "gpus:\n  - { uuid: a, name: x, memoryMiB: 1, pciDeviceId: '0x20B010DE' }\n  - { uuid: b, name: x, memoryMiB: 1 }\n";
        let backend = MockBackend::from_yaml_str(text).unwrap();
        assert_eq!(backend.pci_device_id(0).unwrap(), 0x20B0_10DE);
        let boxed: Box<dyn DeviceBackend> = Box::new(backend);
        assert_eq!(boxed.pci_device_id(0).unwrap(), 0x20B0_10DE);
        assert!(matches!(boxed.pci_device_id(1), Err(BackendError::NotSupported { .. })));
        assert!(matches!(boxed.pci_device_id(2), Err(BackendError::NoSuchDevice { .. })));
        let bad = "gpus:\n  - { uuid: a, name: x, memoryMiB: 1, pciDeviceId: 20B010DE }\n";
        let err = MockBackend::from_yaml_str(bad).unwrap_err().to_string();
        assert!(err.contains("gpus[0].pciDeviceId") && err.contains("0x20B010DE"), "{err}");
    }

    /// Writes `text` to `path` atomically, as the live file must be written.
    fn write_live(path: &Path, text: &str) {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, path).unwrap();
    }

    #[test]
    fn live_file_replaces_processes_memory_and_samples() {
        let dir = tempfile::tempdir().unwrap();
        let live = dir.path().join("live.yaml");
        let text = format!(
            "gpus:\n  - {{ uuid: GPU-a, name: L4, memoryMiB: 1000, processes: [{{ pid: 1, usedMemoryMiB: 10 }}] }}\n  - {{ uuid: GPU-b, name: L4, memoryMiB: 1000 }}\nutilization:\n  - {{ gpu: 0, pid: 1, timestampUs: 5, smPercent: 7 }}\nliveFile: {}\n",
            live.display()
        );
        let backend = MockBackend::from_yaml_str(&text).unwrap();
        // No file yet: the description answers.
        assert_eq!(backend.processes(0).unwrap()[0].pid, 1);
        assert_eq!(backend.memory_usage(0).unwrap().used_bytes, 10 * MIB);
        assert_eq!(backend.process_utilization(0, 0).unwrap()[0].sm_percent, 7);

        write_live(
            &live,
            "processes:\n  0: [{ pid: 42, usedMemoryMiB: 300 }, { pid: 43, usedMemoryMiB: 20 }]\n",
        );
        let procs = backend.processes(0).unwrap();
        assert_eq!(procs.iter().map(|p| p.pid).collect::<Vec<_>>(), [42, 43]);
        let memory = backend.memory_usage(0).unwrap();
        assert_eq!((memory.used_bytes, memory.total_bytes), (320 * MIB, 1000 * MIB));
        // GPUs and fields the file does not name keep the description's values.
        assert!(backend.processes(1).unwrap().is_empty());
        assert_eq!(backend.memory_usage(1).unwrap().used_bytes, 0);
        assert_eq!(backend.process_utilization(0, 0).unwrap()[0].sm_percent, 7);

        write_live(
            &live,
            "utilization:\n  - { gpu: 1, pid: 9, timestampUs: 20, smPercent: 60 }\n  - { gpu: 1, pid: 9, timestampUs: 10, smPercent: 50 }\n",
        );
        assert!(backend.process_utilization(0, 0).unwrap().is_empty(), "replaced, and GPU 0 has none");
        let samples = backend.process_utilization(1, 0).unwrap();
        assert_eq!(samples.iter().map(|s| s.sm_percent).collect::<Vec<_>>(), [50, 60], "sorted by time");
        assert_eq!(backend.process_utilization(1, 10).unwrap().len(), 1);
        assert_eq!(backend.processes(0).unwrap()[0].pid, 1, "processes back to the description's");

        // A bad file fails the calls, naming the file and the field.
        for (bad, field) in [
            ("processes:\n  2: []\n", "processes.2"),
            (
                "utilization:\n  - { gpu: 0, pid: 1, timestampUs: 1, smPercent: 101 }\n",
                "utilization[0].smPercent",
            ),
            ("healthEvents:\n  - { gpu: 0, kind: recovered, afterMs: 5 }\n", "healthEvents[0].afterMs"),
            ("healthEvents:\n  - { gpu: 0, kind: xid }\n", "healthEvents[0].xid"),
            ("procesess: {}\n", "procesess"),
        ] {
            write_live(&live, bad);
            let err = backend.processes(0).unwrap_err().to_string();
            assert!(err.contains("live.yaml") && err.contains(field), "{bad}: {err}");
            assert!(backend.memory_usage(0).is_err() && backend.process_utilization(0, 0).is_err());
        }
    }

    #[test]
    fn live_file_health_events_are_sent_once_each_as_they_are_written() {
        let dir = tempfile::tempdir().unwrap();
        let live = dir.path().join("live.json");
        let text = format!(
            "gpus:\n  - {{ uuid: GPU-a, name: L4, memoryMiB: 1000 }}\n  - {{ uuid: GPU-b, name: L4, memoryMiB: 1000 }}\nliveFile: {}\n",
            live.display()
        );
        let backend = MockBackend::from_yaml_str(&text).unwrap();
        let rx = backend.health_events().unwrap();
        assert_eq!(
            rx.recv_timeout(Duration::from_millis(300)),
            Err(crate::backend::health::RecvError::Empty),
            "no file, no event"
        );

        write_live(
            &live,
            r#"{"healthEvents": [{"gpu": 1, "kind": "xid", "xid": 79, "message": "fell off"}]}"#,
        );
        let first = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!((first.index, first.uuid.as_str()), (1, "GPU-b"));
        assert_eq!((first.kind, first.message.as_str()), (HealthEventKind::Xid { code: 79 }, "fell off"));

        // Not valid for a moment: skipped, nothing sent twice.
        write_live(&live, "{ not json");
        std::thread::sleep(Duration::from_millis(300));
        write_live(
            &live,
            r#"{"healthEvents": [{"gpu": 1, "kind": "xid", "xid": 79}, {"gpu": 1, "kind": "recovered"}]}"#,
        );
        let second = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!((second.index, second.kind), (1, HealthEventKind::Recovered));
        assert_eq!(
            rx.recv_timeout(Duration::from_millis(300)),
            Err(crate::backend::health::RecvError::Empty)
        );

        // A later subscriber gets what the file holds.
        let late = backend.health_events().unwrap();
        assert_eq!(
            late.recv_timeout(Duration::from_secs(10)).unwrap().kind,
            HealthEventKind::Xid { code: 79 }
        );
        assert_eq!(late.recv_timeout(Duration::from_secs(10)).unwrap().kind, HealthEventKind::Recovered);
    }

    #[test]
    fn health_script_then_injection_then_close() {
        let backend = MockBackend::from_yaml_str(TWO).unwrap();
        let rx = backend.health_events().unwrap();
        let first = rx.try_recv().unwrap();
        assert_eq!((first.index, first.uuid.as_str(), first.kind.is_critical()), (1, "GPU-b", true));
        let later = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        assert_eq!(later.kind, HealthEventKind::Recovered);
        let injected = HealthEvent {
            index: 0,
            uuid: "GPU-a".into(),
            kind: HealthEventKind::DeviceLost,
            message: String::new(),
        };
        assert_eq!(backend.inject_health_event(injected.clone()), 1);
        assert_eq!(rx.try_recv(), Ok(injected));
        drop(backend);
        assert_eq!(rx.recv(), None);
    }

    #[test]
    fn invalid_descriptions_name_the_field() {
        let cases = [
            (
                "gpus:\n  - { uuid: a, name: x, memoryMiB: 1 }\n  - { uuid: a, name: x, memoryMiB: 1 }\n",
                "gpus[1].uuid",
            ),
            ("gpus:\n  - { uuid: a, name: x, memoryMiB: 0 }\n", "gpus[0].memoryMiB"),
            ("gpus:\n  - { uuid: a, name: x, memoryMiB: 1, busId: nope }\n", "gpus[0].busId"),
            (
                "gpus:\n  - { uuid: a, name: x, memoryMiB: 1, computeCapability: '8.10' }\n",
                "gpus[0].computeCapability",
            ),
            ("gpus:\n  - { uuid: a, name: x, memoryMiB: 1, usedMemoryMiB: 2 }\n", "gpus[0].usedMemoryMiB"),
            (
                "gpus:\n  - { uuid: a, name: x, memoryMiB: 1 }\ntopology: { rules: [ { gpus: [0, 3], links: [SYS] } ] }\n",
                "topology.rules[0].gpus[1]",
            ),
            (
                "gpus:\n  - { uuid: a, name: x, memoryMiB: 1 }\ntopology: { default: [NV99] }\n",
                "topology.default[0]",
            ),
            (
                "gpus:\n  - { uuid: a, name: x, memoryMiB: 1 }\nhealthEvents: [ { gpu: 0, kind: xid } ]\n",
                "healthEvents[0].xid",
            ),
            (
                "gpus:\n  - { uuid: a, name: x, memoryMiB: 1 }\nutilization: [ { gpu: 0, pid: 1, timestampUs: 1, smPercent: 101 } ]\n",
                "utilization[0].smPercent",
            ),
            (
                "gpus:\n  - { uuid: a, name: x, memoryMiB: 1, mig: { mode: Disabled, instances: [ { uuid: m, profile: 1g.5gb, gpuInstanceId: 1, placementStart: 0, placementSize: 1, memoryMiB: 1 } ] } }\n",
                "gpus[0].mig.instances",
            ),
            (
                "gpus:\n  - { uuid: a, name: x, memoryMiB: 4, mig: { mode: Enabled, instances: [ { uuid: m, profile: 1g.5gb, gpuInstanceId: 1, placementStart: 0, placementSize: 1, memoryMiB: 2, usedMemoryMiB: 3 } ] } }\n",
                "gpus[0].mig.instances[0].usedMemoryMiB",
            ),
            ("driver: { version: '570', cudaVersion: twelve }\ngpus: []\n", "driver.cudaVersion"),
            ("driver: { version: ' ' }\ngpus: []\n", "driver.version"),
        ];
        for (text, field) in cases {
            match MockBackend::from_yaml_str(text) {
                Err(MockConfigError::Invalid { field: f, .. }) => assert_eq!(f, field, "{text}"),
                other => panic!("{text}: {other:?}"),
            }
        }
        assert!(matches!(
            MockBackend::from_yaml_str("gpus: [ { uuid: a } ]"),
            Err(MockConfigError::Parse { .. })
        ));
        assert!(matches!(MockBackend::from_yaml_str("gpu: []"), Err(MockConfigError::Parse { .. })));
        assert!(matches!(MockBackend::from_json_str("{"), Err(MockConfigError::Parse { .. })));
        assert!(matches!(
            MockBackend::from_path(Path::new("/nonexistent/mock.yaml")),
            Err(MockConfigError::Read { .. })
        ));
    }

    proptest::proptest! {
        #[test]
        fn loading_never_panics(text in proptest::prelude::any::<String>()) {
            let _ = MockBackend::from_yaml_str(&text);
            let _ = MockBackend::from_json_str(&text);
        }

        #[test]
        fn loading_never_panics_on_plausible_yaml(
            memory in proptest::prelude::any::<u64>(),
            used in proptest::prelude::any::<u64>(),
            gpu in 0u32..4,
            link in "(NV[0-9]{1,2}|SYS|PIX|[A-Z]{0,4})",
            cap in "[0-9]{0,3}\\.?[0-9]{0,3}",
        ) {
            let text = format!(
                "gpus:\n  - {{ uuid: a, name: x, memoryMiB: {memory}, usedMemoryMiB: {used}, computeCapability: '{cap}' }}\n  - {{ uuid: b, name: x, memoryMiB: 1 }}\ntopology: {{ rules: [ {{ gpus: [0, {gpu}], links: [{link}] }} ] }}\nhealthEvents: [ {{ gpu: {gpu}, kind: deviceLost }} ]\n"
            );
            let _ = MockBackend::from_yaml_str(&text);
        }
    }

    const A100: &str = "\
gpus:
  - { uuid: GPU-a, name: NVIDIA A100-SXM4-80GB, memoryMiB: 81920, mig: { mode: Disabled } }
  - { uuid: GPU-t, name: Tesla T4, memoryMiB: 15360, mig: { mode: Disabled } }
  - { uuid: GPU-n, name: NVIDIA A100-SXM4-80GB, memoryMiB: 81920 }
";

    fn profile(name: &str) -> MigProfile {
        name.parse().unwrap()
    }

    #[test]
    fn sharing_settings_are_recorded_and_only_changes_count() {
        let backend = MockBackend::from_yaml_str(
            "gpus:\n  - { uuid: GPU-a, name: L4, memoryMiB: 23034 }\n  - { uuid: GPU-b, name: L4, memoryMiB: 23034 }\n",
        )
        .unwrap();
        assert_eq!(backend.compute_mode(1).unwrap(), ComputeMode::Default);
        assert_eq!(backend.time_slice(1).unwrap(), TimeSlice::Default);
        backend.set_time_slice(1, TimeSlice::Long).unwrap();
        backend.set_time_slice(1, TimeSlice::Long).unwrap();
        backend.set_compute_mode(0, ComputeMode::ExclusiveProcess).unwrap();
        assert_eq!(backend.time_slice(1).unwrap(), TimeSlice::Long);
        assert_eq!(backend.time_slice(0).unwrap(), TimeSlice::Default);
        assert_eq!(backend.compute_mode(0).unwrap(), ComputeMode::ExclusiveProcess);
        assert_eq!(backend.sharing_changes(), 2, "setting the same value again is not a change");
        assert!(matches!(
            backend.set_time_slice(2, TimeSlice::Short),
            Err(BackendError::NoSuchDevice { .. })
        ));
    }

    #[test]
    fn mig_state_machine_follows_the_rules() {
        let backend = MockBackend::from_yaml_str(A100).unwrap();
        let refusal = |r: Result<MigInstance, BackendError>| match r {
            Err(BackendError::Mig { source, .. }) => source,
            other => panic!("{other:?}"),
        };
        assert_eq!(refusal(backend.create_mig_device(0, &profile("1g.10gb"), 0)), MigError::NotEnabled);
        backend.set_mig_mode(0, true).unwrap();
        assert!(backend.devices().unwrap()[0].mig_enabled);
        let a = backend.create_mig_device(0, &profile("3g.40gb"), 4).unwrap();
        assert_eq!((a.gpu_instance_id, a.placement_size, a.uuid.as_str()), (1, 4, "MIG-a-1"));
        let b = backend.create_mig_device(0, &profile("1g.10gb"), 0).unwrap();
        assert_eq!(b.gpu_instance_id, 2);
        assert!(matches!(
            refusal(backend.create_mig_device(0, &profile("2g.20gb"), 4)),
            MigError::Overlap { other_id: 1, .. }
        ));
        assert!(matches!(
            refusal(backend.create_mig_device(0, &profile("3g.40gb"), 2)),
            MigError::BadPlacement { .. }
        ));
        assert!(matches!(
            refusal(backend.create_mig_device(0, &profile("1g.5gb"), 1)),
            MigError::UnknownProfile { .. }
        ));
        let layout = backend.mig_layout(0).unwrap();
        assert_eq!(layout.instances.iter().map(|i| i.placement_start).collect::<Vec<_>>(), vec![0, 4]);
        match backend.set_mig_mode(0, false) {
            Err(err @ BackendError::Mig { source: MigError::InstancesExist { count: 2 }, .. }) => {
                assert_eq!(
                    err.to_string(),
                    "GPU 0: cannot change the MIG mode while 2 MIG instance(s) exist; destroy them first"
                )
            }
            other => panic!("{other:?}"),
        }
        backend.destroy_mig_device(0, 1).unwrap();
        assert!(matches!(
            backend.destroy_mig_device(0, 1),
            Err(BackendError::Mig { source: MigError::NoSuchInstance(1), .. })
        ));
        backend.destroy_mig_device(0, 2).unwrap();
        backend.set_mig_mode(0, false).unwrap();
        assert!(!backend.devices().unwrap()[0].mig_enabled);
        assert_eq!(backend.mig_profiles(0).unwrap().len(), 7);
        // Unknown model: mode may change, nothing can be created; no MIG at all: refused.
        backend.set_mig_mode(1, true).unwrap();
        assert!(matches!(
            refusal(backend.create_mig_device(1, &profile("1g.5gb"), 0)),
            MigError::UnknownModel { .. }
        ));
        assert!(matches!(
            backend.set_mig_mode(2, true),
            Err(BackendError::Mig { source: MigError::NotCapable, .. })
        ));
        assert!(matches!(backend.set_mig_mode(3, true), Err(BackendError::NoSuchDevice { .. })));
        let boxed: Box<dyn DeviceBackend> = Box::new(backend);
        assert_eq!(boxed.mig_profiles(0).unwrap()[0].placements.len(), 7, "Box forwards MIG control");
    }

    #[test]
    fn mig_state_file_is_shared_between_backends() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("mig.json");
        let text = format!("{A100}migStateFile: {}\n", state.display());
        let writer = MockBackend::from_yaml_str(&text).unwrap();
        let reader = MockBackend::from_yaml_str(&text).unwrap();
        writer.set_mig_mode(0, true).unwrap();
        writer.create_mig_device(0, &profile("7g.80gb"), 0).unwrap();
        let seen = reader.mig_layout(0).unwrap();
        assert_eq!((seen.mode, seen.instances.len()), (MigMode::Enabled, 1));
        assert!(reader.devices().unwrap()[0].mig_enabled);
        assert!(matches!(reader.create_mig_device(0, &profile("1g.10gb"), 0), Err(BackendError::Mig { .. })));
        let fresh = MockBackend::from_yaml_str(&text).unwrap();
        assert_eq!(fresh.mig_layout(0).unwrap().instances[0].profile.to_string(), "7g.80gb");
        std::fs::write(&state, r#"{"gpus": {"GPU-zz": {"mode": "Disabled"}}}"#).unwrap();
        assert!(matches!(MockBackend::from_yaml_str(&text), Err(MockConfigError::Invalid { .. })));
        std::fs::write(&state, "not json").unwrap();
        assert!(matches!(reader.mig_layout(0), Err(BackendError::Mock(MockConfigError::Parse { .. }))));
    }

    const PENDING: &str = "\
gpus:
  - { uuid: GPU-a, name: NVIDIA A100-SXM4-80GB, memoryMiB: 81920, mig: { mode: Disabled, modeChange: Pending } }
  - { uuid: GPU-b, name: NVIDIA A100-SXM4-80GB, memoryMiB: 81920, mig: { mode: Disabled, modeChange: Pending, reset: InUse } }
  - { uuid: GPU-c, name: NVIDIA A100-SXM4-80GB, memoryMiB: 81920, mig: { mode: Disabled, modeChange: Pending, reset: NotSupported } }
  - { uuid: GPU-d, name: NVIDIA A100-SXM4-80GB, memoryMiB: 81920, mig: { mode: Disabled, modeChange: Pending },
      processes: [ { pid: 7, usedMemoryMiB: 10 } ] }
";

    #[test]
    fn a_pending_mode_waits_for_a_reset() {
        let backend = MockBackend::from_yaml_str(PENDING).unwrap();
        match backend.set_mig_mode(0, true) {
            Err(err @ BackendError::Mig { source: MigError::ResetRequired { enabled: true }, .. }) => {
                assert_eq!(
                    err.to_string(),
                    "GPU 0: MIG mode enabled is pending: it takes effect after a GPU reset or a node reboot"
                )
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(backend.mig_layout(0).unwrap().mode, MigMode::Disabled, "still the current mode");
        assert_eq!(backend.pending_mig_mode(0).unwrap(), Some(MigMode::Enabled));
        // Asking for the current mode cancels the pending change.
        backend.set_mig_mode(0, false).unwrap();
        assert_eq!(backend.pending_mig_mode(0).unwrap(), None);
        assert!(backend.set_mig_mode(0, true).is_err());
        backend.reset_gpu(0).unwrap();
        assert_eq!(backend.mig_layout(0).unwrap().mode, MigMode::Enabled);
        assert_eq!(backend.pending_mig_mode(0).unwrap(), None);
        backend.create_mig_device(0, &profile("7g.80gb"), 0).unwrap();
        backend.reset_gpu(0).unwrap();
        assert_eq!(
            backend.mig_layout(0).unwrap().instances.len(),
            1,
            "a reset without a pending mode keeps the layout"
        );
    }

    #[test]
    fn impossible_resets_are_refused_naming_why() {
        let backend = MockBackend::from_yaml_str(PENDING).unwrap();
        for gpu in 1..4 {
            assert!(backend.set_mig_mode(gpu, true).is_err());
        }
        let refusals: Vec<String> =
            (1..4).map(|gpu| backend.reset_gpu(gpu).unwrap_err().to_string()).collect();
        assert_eq!(
            refusals,
            [
                "GPU 1 cannot be reset: the GPU is in use (mock description: reset: InUse)",
                "resetting the GPU is not supported by the mock backend",
                "GPU 3 cannot be reset: in use by 1 process(es)",
            ]
        );
        for gpu in 1..4 {
            assert_eq!(backend.pending_mig_mode(gpu).unwrap(), Some(MigMode::Enabled), "GPU {gpu}");
        }
        // The trait's default: no reset.
        assert!(matches!(
            MockBackend::from_yaml_str(A100)
                .map(|b| Box::new(b) as Box<dyn DeviceBackend>)
                .unwrap()
                .reset_gpu(9),
            Err(BackendError::NoSuchDevice { .. })
        ));
        // A reboot applies every pending mode.
        backend.reboot().unwrap();
        assert!((0..4).all(|gpu| backend.pending_mig_mode(gpu).unwrap().is_none()));
        assert_eq!(
            (1..4).map(|gpu| backend.mig_layout(gpu).unwrap().mode).collect::<Vec<_>>(),
            [MigMode::Enabled; 3]
        );
    }

    #[test]
    fn pending_modes_live_in_the_state_file() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("mig.json");
        let text = format!("{PENDING}migStateFile: {}\n", state.display());
        let manager = MockBackend::from_yaml_str(&text).unwrap();
        assert!(manager.set_mig_mode(1, true).is_err());
        let saved = std::fs::read_to_string(&state).unwrap();
        assert!(saved.contains(r#""pending": "Enabled""#), "{saved}");
        assert!(!saved.contains("modeChange") && !saved.contains("reset"), "{saved}");
        let restarted = MockBackend::from_yaml_str(&text).unwrap();
        assert_eq!(restarted.pending_mig_mode(1).unwrap(), Some(MigMode::Enabled), "survives a restart");
        assert!(restarted.reset_gpu(1).is_err(), "the description's reset behaviour, not the state file's");
        // A reboot, as a test writes it: the pending mode applied.
        std::fs::write(&state, r#"{"gpus": {"GPU-b": {"mode": "Enabled"}}}"#).unwrap();
        assert_eq!(manager.mig_layout(1).unwrap().mode, MigMode::Enabled);
        assert_eq!(manager.pending_mig_mode(1).unwrap(), None);
        for (file, field) in [
            (r#"{"gpus": {"GPU-b": {"mode": "Enabled", "reset": "InUse"}}}"#, "gpus.GPU-b"),
            (r#"{"gpus": {"GPU-b": {"mode": "Enabled", "pending": "Enabled"}}}"#, "gpus[1].mig.pending"),
            (
                r#"{"gpus": {"GPU-b": {"mode": "Disabled", "pending": "NotSupported"}}}"#,
                "gpus[1].mig.pending",
            ),
        ] {
            std::fs::write(&state, file).unwrap();
            match manager.mig_layout(1) {
                Err(BackendError::Mock(MockConfigError::Invalid { field: f, .. })) => {
                    assert_eq!(f, field, "{file}")
                }
                other => panic!("{file}: {other:?}"),
            }
        }
        let bad =
            "gpus:\n  - { uuid: a, name: T4, memoryMiB: 1, mig: { mode: NotSupported, pending: Enabled } }\n";
        assert!(MockBackend::from_yaml_str(bad).unwrap_err().to_string().contains("gpus[0].mig.pending"));
        let bad = "gpus:\n  - { uuid: a, name: T4, memoryMiB: 1, mig: { mode: Disabled, reset: Maybe } }\n";
        assert!(matches!(MockBackend::from_yaml_str(bad), Err(MockConfigError::Parse { .. })));
    }

    #[derive(Debug, Clone)]
    enum Op {
        Create(usize, u32),
        Destroy(u32),
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![(0usize..7, 0u32..8).prop_map(|(p, s)| Op::Create(p, s)), (1u32..9).prop_map(Op::Destroy)]
    }

    proptest::proptest! {
        /// Random create/destroy sequences on an A100 80GB: instances never overlap, stay at allowed starts,
        /// and free + occupied memory slices always add up to 8 (compute slices never exceed 7).
        #[test]
        fn mig_sequences_keep_the_invariants(ops in proptest::collection::vec(op(), 0..40)) {
            let backend = MockBackend::from_yaml_str(A100).unwrap();
            backend.set_mig_mode(0, true).unwrap();
            let model = &crate::backend::mig::A100_80GB;
            for op in ops {
                let before = backend.mig_layout(0).unwrap();
                let result = match op {
                    Op::Create(p, start) => {
                        let rule = model.profiles[p];
                        let expected = model.check_create(&before.instances, &profile(rule.name), start);
                        let got = backend.create_mig_device(0, &profile(rule.name), start);
                        proptest::prop_assert_eq!(expected.is_ok(), got.is_ok());
                        got.map(|_| ())
                    }
                    Op::Destroy(gi) => backend.destroy_mig_device(0, gi),
                };
                let after = backend.mig_layout(0).unwrap();
                if result.is_err() {
                    proptest::prop_assert_eq!(&before, &after);
                }
                let mut occupied = 0u64;
                let mut used_slices = 0;
                for i in &after.instances {
                    let rule = model.rule(&i.profile).unwrap();
                    proptest::prop_assert!(rule.starts.contains(&i.placement_start));
                    proptest::prop_assert_eq!(rule.mask(i.placement_start) & occupied, 0);
                    occupied |= rule.mask(i.placement_start);
                    used_slices += i.placement_size;
                }
                proptest::prop_assert_eq!(model.free_memory_slices(&after.instances) + used_slices, 8);
                proptest::prop_assert!(model.free_compute_slices(&after.instances) <= 7);
                proptest::prop_assert!(after.instances.iter().map(|i| i.profile.compute_slices).sum::<u32>() <= 7);
            }
        }
    }

    #[test]
    fn json_description() {
        let backend = MockBackend::from_json_str(
            r#"{"gpus":[{"uuid":"GPU-x","name":"MXC500","vendor":"metax","memoryMiB":65536}]}"#,
        )
        .unwrap();
        assert_eq!(backend.devices().unwrap()[0].vendor, Vendor::MetaX);
        let adapter = backend.vendor_adapter().unwrap();
        assert_eq!(adapter.vendor(), Vendor::MetaX);
        assert_eq!(adapter.gpu_device_nodes(0, 0), ["/dev/dri/card1", "/dev/dri/renderD129"]);
        assert_eq!(backend.topology().unwrap().links(0, 0), &[] as &[u8]);
    }
}
