//! Opaque device configs (contract §9): the claim's `status.allocation.devices.config` entries for driver
//! `manager.nvidia.com`, decoded strictly into the upstream API `resource.nvidia.com/v1beta1` and resolved
//! to one [`DeviceConfig`] per allocation result.
//!
//! # The API (upstream `api/nvidia.com/resource/v1beta1`)
//!
//! | kind | fields | applies to |
//! |---|---|---|
//! | `GpuConfig` | `sharing: {strategy: TimeSlicing\|MPS, timeSlicingConfig: {interval: Default\|Short\|Medium\|Long}, mpsConfig: MpsConfig}` | `gpu`, `vgpu` devices |
//! | `MigDeviceConfig` | `sharing: {strategy: TimeSlicing\|MPS, mpsConfig: MpsConfig}` (no `timeSlicingConfig`: a MIG device has no time slice of its own) | `mig` devices |
//! | `VfioDeviceConfig` | `iommu: {backendPolicy: LegacyOnly\|PreferIommuFD, enableAPIDevice: bool}` | `vfio` devices |
//!
//! `MpsConfig`: `defaultActiveThreadPercentage` (integer 1–100), `defaultPinnedDeviceMemoryLimit` (quantity,
//! at least 1Mi), `defaultPerDevicePinnedMemoryLimit` (device UUID or index within the config's devices →
//! quantity, at least 1Mi; overrides the default for that device), `multiUser` (bool: clients of any UID
//! may connect to the daemon).
//!
//! # Rules
//!
//! | rule | as upstream (`GetOpaqueDeviceConfigs`, `prepareDevices`) |
//! |---|---|
//! | whose | configs of other drivers are skipped; a config without `opaque` is an error |
//! | strict | `apiVersion` must be `resource.nvidia.com/v1beta1`, `kind` one of the three; an unknown field anywhere is an error |
//! | gates | strategy `TimeSlicing` needs gate `TimeSlicingSettings`, `MPS` needs `MPSSupport`: otherwise an error naming the gate (never ignored) |
//! | consistency | `TimeSlicing` with `mpsConfig`, or `MPS` with `timeSlicingConfig`, is an error |
//! | precedence | class configs first, then claim configs, each in order; for each allocation result the last config that names its request (or its main request, for `main/sub`) wins, else the last config naming no requests whose kind fits the device |
//! | kind | a config that names the result's request must fit its device type (`GpuConfig` for `gpu`/`vgpu`, `MigDeviceConfig` for `mig`, `VfioDeviceConfig` for `vfio`), else an error; a config for all requests skips devices it does not fit |
//!
//! Errors name the config's index in `status.allocation.devices.config`, the JSON path and where the
//! config came from:
//! `config[1].opaque.parameters.sharing.timeSlicingConfig.interval: expected Default|Short|Medium|Long, got "Fast" (FromClaim config)`.
//!
//! Every bad config fails Prepare with nothing done: the [`OpaqueConfigCheck`] mode (always installed)
//! decodes them during planning, and the sharing modes ([`crate::sharing`], [`crate::mps`]) read their
//! settings through [`configs_for`].
//!
//! ```
//! use serde_json::json;
//! use vgpu_dra::opaque::{Accept, DeviceConfig, decode_parameters};
//!
//! let params = json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
//!     "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}}});
//! let config = decode_parameters(&params, Accept { time_slicing: true, mps: false }, "p")?;
//! assert!(matches!(config, DeviceConfig::Gpu(_)));
//! let off = decode_parameters(&params, Accept::default(), "p").unwrap_err();
//! assert!(off.to_string().contains("feature gate \"TimeSlicingSettings\" is not enabled"), "{off}");
//! # Ok::<(), vgpu_dra::opaque::FieldError>(())
//! ```

use std::{collections::BTreeMap, fmt};

use serde_json::{Map, Value, json};
use vgpu_core::backend::TimeSlice;
use vgpu_gates::DraGate;

use crate::modes::{ClaimContext, ClaimMode, ModeEdits, ModeError};
use vgpu_core::dra::DeviceType;

/// `apiVersion` of the accepted configs.
pub const API_VERSION: &str = "resource.nvidia.com/v1beta1";
/// Kind of [`GpuConfig`].
pub const GPU_CONFIG: &str = "GpuConfig";
/// Kind of [`MigDeviceConfig`].
pub const MIG_DEVICE_CONFIG: &str = "MigDeviceConfig";
/// Kind of [`VfioDeviceConfig`].
pub const VFIO_DEVICE_CONFIG: &str = "VfioDeviceConfig";

const MIB: u64 = 1 << 20;

/// A decoded opaque config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceConfig {
    /// `GpuConfig`.
    Gpu(GpuConfig),
    /// `MigDeviceConfig`.
    Mig(MigDeviceConfig),
    /// `VfioDeviceConfig`.
    Vfio(VfioDeviceConfig),
}

impl DeviceConfig {
    /// The `kind`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Gpu(_) => GPU_CONFIG,
            Self::Mig(_) => MIG_DEVICE_CONFIG,
            Self::Vfio(_) => VFIO_DEVICE_CONFIG,
        }
    }

    /// Whether the config fits a device of this type.
    pub fn fits(&self, device: DeviceType) -> bool {
        matches!(
            (self, device),
            (Self::Gpu(_), DeviceType::Gpu | DeviceType::Vgpu)
                | (Self::Mig(_), DeviceType::Mig)
                | (Self::Vfio(_), DeviceType::Vfio)
        )
    }

    /// The sharing settings (`GpuConfig` and `MigDeviceConfig`).
    pub fn sharing(&self) -> Option<&Sharing> {
        match self {
            Self::Gpu(c) => c.sharing.as_ref(),
            Self::Mig(c) => c.sharing.as_ref(),
            Self::Vfio(_) => None,
        }
    }

    /// The config as the API writes it (`apiVersion`, `kind` and the set fields).
    pub fn to_json(&self) -> Value {
        let mut out = Map::new();
        out.insert("apiVersion".into(), json!(API_VERSION));
        out.insert("kind".into(), json!(self.kind()));
        match self {
            Self::Gpu(GpuConfig { sharing }) | Self::Mig(MigDeviceConfig { sharing }) => {
                if let Some(s) = sharing {
                    out.insert("sharing".into(), s.to_json());
                }
            }
            Self::Vfio(VfioDeviceConfig { iommu }) => {
                if let Some(i) = iommu {
                    let mut m = Map::new();
                    if let Some(p) = i.backend_policy {
                        m.insert("backendPolicy".into(), json!(p.as_str()));
                    }
                    if let Some(e) = i.enable_api_device {
                        m.insert("enableAPIDevice".into(), json!(e));
                    }
                    out.insert("iommu".into(), Value::Object(m));
                }
            }
        }
        Value::Object(out)
    }
}

/// `GpuConfig`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GpuConfig {
    /// `sharing`.
    pub sharing: Option<Sharing>,
}

/// `MigDeviceConfig` (its sharing never has a time-slicing config).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MigDeviceConfig {
    /// `sharing`.
    pub sharing: Option<Sharing>,
}

/// `VfioDeviceConfig`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct VfioDeviceConfig {
    /// `iommu`.
    pub iommu: Option<IommuConfig>,
}

/// `iommu` of a [`VfioDeviceConfig`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct IommuConfig {
    /// `backendPolicy` (`None`: upstream's default, `LegacyOnly`).
    pub backend_policy: Option<IommuBackendPolicy>,
    /// `enableAPIDevice` (`None`: false).
    pub enable_api_device: Option<bool>,
}

/// `iommu.backendPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IommuBackendPolicy {
    /// `LegacyOnly`: `/dev/vfio/<group>` only.
    LegacyOnly,
    /// `PreferIommuFD`: the iommufd cdev when the host has it.
    PreferIommuFd,
}

impl IommuBackendPolicy {
    /// The API spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::LegacyOnly => "LegacyOnly",
            Self::PreferIommuFd => "PreferIommuFD",
        }
    }
}

/// `sharing` of a `GpuConfig` or `MigDeviceConfig`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sharing {
    /// `strategy: TimeSlicing` with the interval (`None`: no `timeSlicingConfig`, or no `interval`; both mean
    /// `Default`). Always `None` in a `MigDeviceConfig`.
    TimeSlicing(Option<TimeSlice>),
    /// `strategy: MPS` (`mpsConfig` absent = all defaults).
    Mps(MpsConfig),
}

impl Sharing {
    /// The interval a time-slicing config asks for (`Default` when not given); `None` for MPS.
    pub fn time_slice(&self) -> Option<TimeSlice> {
        match self {
            Self::TimeSlicing(t) => Some(t.unwrap_or_default()),
            Self::Mps(_) => None,
        }
    }

    fn to_json(&self) -> Value {
        match self {
            Self::TimeSlicing(None) => json!({"strategy": "TimeSlicing"}),
            Self::TimeSlicing(Some(t)) => {
                json!({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": t.as_str()}})
            }
            Self::Mps(m) => json!({"strategy": "MPS", "mpsConfig": m.to_json()}),
        }
    }
}

/// `mpsConfig`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MpsConfig {
    /// `defaultActiveThreadPercentage` (1–100).
    pub default_active_thread_percentage: Option<u8>,
    /// `defaultPinnedDeviceMemoryLimit`, bytes (at least 1 MiB).
    pub default_pinned_device_memory_limit: Option<u64>,
    /// `defaultPerDevicePinnedMemoryLimit`: device UUID or index → bytes (at least 1 MiB each).
    pub default_per_device_pinned_memory_limit: BTreeMap<String, u64>,
    /// `multiUser`: clients of any UID may use the daemon (its directories are world-writable).
    pub multi_user: bool,
}

impl MpsConfig {
    fn to_json(&self) -> Value {
        let mut m = Map::new();
        if let Some(p) = self.default_active_thread_percentage {
            m.insert("defaultActiveThreadPercentage".into(), json!(p));
        }
        if let Some(b) = self.default_pinned_device_memory_limit {
            m.insert("defaultPinnedDeviceMemoryLimit".into(), json!(b.to_string()));
        }
        if !self.default_per_device_pinned_memory_limit.is_empty() {
            let per: Map<String, Value> = self
                .default_per_device_pinned_memory_limit
                .iter()
                .map(|(k, v)| (k.clone(), json!(v.to_string())))
                .collect();
            m.insert("defaultPerDevicePinnedMemoryLimit".into(), Value::Object(per));
        }
        if self.multi_user {
            m.insert("multiUser".into(), json!(true));
        }
        Value::Object(m)
    }

    /// The pinned-memory limit of each device, in MiB, as `set_default_device_pinned_mem_limit` takes it
    /// (`<uuid> <MiB>M`): the default for every device, then the per-device entries (by UUID, or by index
    /// into `uuids`). An entry naming no device of `uuids` is an error naming the key.
    pub fn pinned_limits_mib(&self, uuids: &[String]) -> Result<BTreeMap<String, u64>, String> {
        let mut out = BTreeMap::new();
        if let Some(bytes) = self.default_pinned_device_memory_limit {
            for uuid in uuids {
                out.insert(uuid.clone(), bytes / MIB);
            }
        }
        for (key, bytes) in &self.default_per_device_pinned_memory_limit {
            let uuid = if uuids.contains(key) {
                key.clone()
            } else {
                let index: usize = key.parse().map_err(|_| {
                    format!("defaultPerDevicePinnedMemoryLimit: {key:?} is neither the UUID nor the index of a device of this config ({uuids:?})")
                })?;
                uuids.get(index).cloned().ok_or_else(|| {
                    format!("defaultPerDevicePinnedMemoryLimit: device index {index} is out of range: the config has {} devices", uuids.len())
                })?
            };
            out.insert(uuid, bytes / MIB);
        }
        Ok(out)
    }
}

/// Which sharing strategies the gates allow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Accept {
    /// Gate `TimeSlicingSettings`.
    pub time_slicing: bool,
    /// Gate `MPSSupport`.
    pub mps: bool,
}

impl Accept {
    /// From the plugin's gates.
    pub fn from_gates(gates: &vgpu_gates::FeatureGates<'_, DraGate>) -> Self {
        Self {
            time_slicing: gates.enabled(DraGate::TimeSlicingSettings),
            mps: gates.enabled(DraGate::MPSSupport),
        }
    }
}

/// A field of a config is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct FieldError {
    /// The JSON path (`config[1].opaque.parameters.sharing.strategy`).
    pub path: String,
    /// What was expected and what was found.
    pub message: String,
}

fn field_error(path: &str, message: impl Into<String>) -> FieldError {
    FieldError { path: path.to_owned(), message: message.into() }
}

/// Where a config entry came from (`source`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ConfigSource {
    /// `FromClass`: the DeviceClass's config.
    FromClass,
    /// `FromClaim`: the claim's own config.
    FromClaim,
}

impl fmt::Display for ConfigSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::FromClass => "FromClass",
            Self::FromClaim => "FromClaim",
        })
    }
}

/// The claim's configs cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A config entry is malformed or not allowed (`source` is `None` when the source itself is wrong).
    #[error("{error}{}", source_note(*.origin))]
    Invalid {
        /// Where it came from.
        origin: Option<ConfigSource>,
        /// The field and what is wrong with it.
        error: FieldError,
    },
    /// A config names a request whose device it does not fit.
    #[error(
        "config[{index}] ({origin} config) is a {kind} for request {request:?}, but that request got device {device}, a {device_type} device (expected {expected})"
    )]
    WrongKind {
        /// The config's index.
        index: usize,
        /// Where it came from.
        origin: ConfigSource,
        /// Its kind.
        kind: &'static str,
        /// The request.
        request: String,
        /// The device.
        device: String,
        /// The device's type.
        device_type: &'static str,
        /// The kind that fits.
        expected: &'static str,
    },
}

fn source_note(source: Option<ConfigSource>) -> String {
    source.map(|s| format!(" ({s} config)")).unwrap_or_default()
}

/// One decoded config entry of this driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpaqueConfig {
    /// Index in `status.allocation.devices.config`.
    pub index: usize,
    /// Where it came from.
    pub source: ConfigSource,
    /// The requests it names (empty: all).
    pub requests: Vec<String>,
    /// The config.
    pub config: DeviceConfig,
}

/// The config that applies to one allocation result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppliedConfig {
    /// Index of the entry in `status.allocation.devices.config`.
    pub index: usize,
    /// Where it came from.
    pub source: ConfigSource,
    /// The config.
    pub config: DeviceConfig,
}

/// The kind that fits a device type.
pub fn kind_for(device: DeviceType) -> &'static str {
    match device {
        DeviceType::Gpu | DeviceType::Vgpu => GPU_CONFIG,
        DeviceType::Mig => MIG_DEVICE_CONFIG,
        DeviceType::Vfio => VFIO_DEVICE_CONFIG,
    }
}

/// Decodes the config entries of `driver` from a claim's `status.allocation.devices.config`, in precedence
/// order (class configs first, then claim configs; each in their order), pure.
pub fn decode_entries(
    entries: &[k8s_openapi::api::resource::v1::DeviceAllocationConfiguration],
    driver: &str,
    accept: Accept,
) -> Result<Vec<OpaqueConfig>, ConfigError> {
    let mut class = Vec::new();
    let mut claim = Vec::new();
    for (index, entry) in entries.iter().enumerate() {
        let source = match entry.source.as_str() {
            "FromClass" => ConfigSource::FromClass,
            "FromClaim" => ConfigSource::FromClaim,
            other => {
                return Err(ConfigError::Invalid {
                    origin: None,
                    error: field_error(
                        &format!("config[{index}].source"),
                        format!("expected FromClass|FromClaim, got {other:?}"),
                    ),
                });
            }
        };
        let invalid = |error| ConfigError::Invalid { origin: Some(source), error };
        let Some(opaque) = &entry.opaque else {
            return Err(invalid(field_error(
                &format!("config[{index}].opaque"),
                "missing: only opaque parameters are supported by this driver",
            )));
        };
        if opaque.driver != driver {
            continue;
        }
        let path = format!("config[{index}].opaque.parameters");
        let config = decode_parameters(&opaque.parameters.0, accept, &path).map_err(invalid)?;
        let decoded =
            OpaqueConfig { index, source, requests: entry.requests.clone().unwrap_or_default(), config };
        match source {
            ConfigSource::FromClass => class.push(decoded),
            ConfigSource::FromClaim => claim.push(decoded),
        }
    }
    class.extend(claim);
    Ok(class)
}

/// Whether a config naming `names` applies to allocation result `request` (`main` or `main/sub`).
fn names_request(names: &[String], request: &str) -> bool {
    let main = crate::partition::main_request(request);
    names.iter().any(|n| n == request || n == main)
}

/// Resolves the decoded configs (in precedence order) to the allocation results: `(request, device name,
/// device type)` each, keyed by `key`. A result no config applies to is absent.
pub fn resolve<K: Ord + Clone>(
    configs: &[OpaqueConfig],
    results: &[(K, &str, &str, DeviceType)],
) -> Result<BTreeMap<K, AppliedConfig>, ConfigError> {
    let mut out = BTreeMap::new();
    for (key, request, device, device_type) in results {
        for c in configs.iter().rev() {
            if names_request(&c.requests, request) {
                if !c.config.fits(*device_type) {
                    return Err(ConfigError::WrongKind {
                        index: c.index,
                        origin: c.source,
                        kind: c.config.kind(),
                        request: (*request).to_owned(),
                        device: (*device).to_owned(),
                        device_type: device_type.as_str(),
                        expected: kind_for(*device_type),
                    });
                }
            } else if !c.requests.is_empty() || !c.config.fits(*device_type) {
                continue;
            }
            out.insert(
                key.clone(),
                AppliedConfig { index: c.index, source: c.source, config: c.config.clone() },
            );
            break;
        }
    }
    Ok(out)
}

/// The config of each of the claim's devices of this driver, by [`crate::modes::ClaimDevice::cdi_name`]
/// (devices no config applies to are absent), checked against the plugin's gates.
pub fn configs_for(ctx: &ClaimContext<'_>) -> Result<BTreeMap<String, AppliedConfig>, ConfigError> {
    let entries = ctx
        .object
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.config.as_deref())
        .unwrap_or_default();
    let configs = decode_entries(entries, &ctx.config.driver_name, Accept::from_gates(&ctx.config.gates))?;
    let results: Vec<_> = ctx
        .devices
        .iter()
        .map(|d| (d.cdi_name.clone(), d.request.as_str(), d.device.name.as_str(), d.device.kind))
        .collect();
    resolve(&configs, &results)
}

// === decoding ===

fn object<'a>(value: &'a Value, path: &str) -> Result<&'a Map<String, Value>, FieldError> {
    value.as_object().ok_or_else(|| field_error(path, format!("expected an object, got {}", describe(value))))
}

/// Rejects fields not in `allowed`.
fn known(map: &Map<String, Value>, path: &str, allowed: &[&str]) -> Result<(), FieldError> {
    for key in map.keys() {
        if !allowed.contains(&key.as_str()) {
            return Err(field_error(
                &format!("{path}.{key}"),
                format!("unknown field (expected one of {})", allowed.join(", ")),
            ));
        }
    }
    Ok(())
}

/// A field that may be absent or `null`.
fn get<'a>(map: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    map.get(key).filter(|v| !v.is_null())
}

fn string<'a>(value: &'a Value, path: &str) -> Result<&'a str, FieldError> {
    value.as_str().ok_or_else(|| field_error(path, format!("expected a string, got {}", describe(value))))
}

fn describe(value: &Value) -> String {
    let text = value.to_string();
    let short: String = text.chars().take(60).collect();
    if short.len() < text.len() { format!("{short}…") } else { short }
}

/// A quantity (string such as `1Gi`, or a whole number) of at least 1 MiB, in bytes.
fn memory_limit(value: &Value, path: &str) -> Result<u64, FieldError> {
    let bytes = match value {
        Value::String(s) => vgpu_core::alloc::parse_quantity(s),
        Value::Number(n) => n.as_u64(),
        _ => None,
    }
    .ok_or_else(|| {
        field_error(path, format!("expected a memory quantity such as \"1Gi\", got {}", describe(value)))
    })?;
    if bytes < MIB {
        return Err(field_error(path, format!("{} is below the 1Mi minimum", describe(value))));
    }
    Ok(bytes)
}

/// Decodes one config's `parameters` (pure; `path` prefixes every error's field path).
pub fn decode_parameters(value: &Value, accept: Accept, path: &str) -> Result<DeviceConfig, FieldError> {
    let map = object(value, path)?;
    let api = get(map, "apiVersion").ok_or_else(|| field_error(&format!("{path}.apiVersion"), "missing"))?;
    let api = string(api, &format!("{path}.apiVersion"))?;
    if api != API_VERSION {
        return Err(field_error(
            &format!("{path}.apiVersion"),
            format!("expected {API_VERSION}, got {api:?}"),
        ));
    }
    let kind_path = format!("{path}.kind");
    let kind = string(get(map, "kind").ok_or_else(|| field_error(&kind_path, "missing"))?, &kind_path)?;
    match kind {
        GPU_CONFIG => {
            known(map, path, &["apiVersion", "kind", "sharing"])?;
            let sharing = get(map, "sharing")
                .map(|v| sharing(v, accept, true, &format!("{path}.sharing")))
                .transpose()?;
            Ok(DeviceConfig::Gpu(GpuConfig { sharing }))
        }
        MIG_DEVICE_CONFIG => {
            known(map, path, &["apiVersion", "kind", "sharing"])?;
            let sharing = get(map, "sharing")
                .map(|v| sharing(v, accept, false, &format!("{path}.sharing")))
                .transpose()?;
            Ok(DeviceConfig::Mig(MigDeviceConfig { sharing }))
        }
        VFIO_DEVICE_CONFIG => {
            known(map, path, &["apiVersion", "kind", "iommu"])?;
            let iommu = get(map, "iommu").map(|v| iommu(v, &format!("{path}.iommu"))).transpose()?;
            Ok(DeviceConfig::Vfio(VfioDeviceConfig { iommu }))
        }
        other => Err(field_error(
            &kind_path,
            format!("expected {GPU_CONFIG}|{MIG_DEVICE_CONFIG}|{VFIO_DEVICE_CONFIG}, got {other:?}"),
        )),
    }
}

fn sharing(value: &Value, accept: Accept, gpu: bool, path: &str) -> Result<Sharing, FieldError> {
    let map = object(value, path)?;
    let fields: &[&str] =
        if gpu { &["strategy", "timeSlicingConfig", "mpsConfig"] } else { &["strategy", "mpsConfig"] };
    known(map, path, fields)?;
    let strategy_path = format!("{path}.strategy");
    let strategy =
        string(get(map, "strategy").ok_or_else(|| field_error(&strategy_path, "missing"))?, &strategy_path)?;
    let gate = |name: &str, gate: &str| {
        field_error(
            &strategy_path,
            format!(
                "{name:?} is selected as the GPU sharing strategy, but the feature gate {gate:?} is not enabled"
            ),
        )
    };
    let ts = get(map, "timeSlicingConfig");
    let mps = get(map, "mpsConfig");
    match strategy {
        "TimeSlicing" => {
            if !accept.time_slicing {
                return Err(gate("TimeSlicing", "TimeSlicingSettings"));
            }
            if mps.is_some() {
                return Err(field_error(
                    &format!("{path}.mpsConfig"),
                    "cannot be used with the \"TimeSlicing\" strategy",
                ));
            }
            let interval = match ts {
                None => None,
                Some(v) => {
                    let tpath = format!("{path}.timeSlicingConfig");
                    let m = object(v, &tpath)?;
                    known(m, &tpath, &["interval"])?;
                    match get(m, "interval") {
                        None => None,
                        Some(i) => {
                            let ipath = format!("{tpath}.interval");
                            let text = string(i, &ipath)?;
                            Some(text.parse::<TimeSlice>().map_err(|e| field_error(&ipath, e.to_string()))?)
                        }
                    }
                }
            };
            Ok(Sharing::TimeSlicing(interval))
        }
        "MPS" => {
            if !accept.mps {
                return Err(gate("MPS", "MPSSupport"));
            }
            if ts.is_some() {
                return Err(field_error(
                    &format!("{path}.timeSlicingConfig"),
                    "cannot be used with the \"MPS\" strategy",
                ));
            }
            let config =
                mps.map(|v| mps_config(v, &format!("{path}.mpsConfig"))).transpose()?.unwrap_or_default();
            Ok(Sharing::Mps(config))
        }
        other => Err(field_error(&strategy_path, format!("expected TimeSlicing|MPS, got {other:?}"))),
    }
}

fn mps_config(value: &Value, path: &str) -> Result<MpsConfig, FieldError> {
    let map = object(value, path)?;
    known(
        map,
        path,
        &[
            "defaultActiveThreadPercentage",
            "defaultPinnedDeviceMemoryLimit",
            "defaultPerDevicePinnedMemoryLimit",
            "multiUser",
        ],
    )?;
    let mut out = MpsConfig::default();
    if let Some(v) = get(map, "defaultActiveThreadPercentage") {
        let p = format!("{path}.defaultActiveThreadPercentage");
        let n = v
            .as_i64()
            .filter(|n| (1..=100).contains(n))
            .and_then(|n| u8::try_from(n).ok())
            .ok_or_else(|| field_error(&p, format!("expected an integer 1..100, got {}", describe(v))))?;
        out.default_active_thread_percentage = Some(n);
    }
    if let Some(v) = get(map, "defaultPinnedDeviceMemoryLimit") {
        out.default_pinned_device_memory_limit =
            Some(memory_limit(v, &format!("{path}.defaultPinnedDeviceMemoryLimit"))?);
    }
    if let Some(v) = get(map, "defaultPerDevicePinnedMemoryLimit") {
        let p = format!("{path}.defaultPerDevicePinnedMemoryLimit");
        for (key, limit) in object(v, &p)? {
            if key.trim().is_empty() {
                return Err(field_error(&p, "a key is empty: expected a device UUID or index"));
            }
            out.default_per_device_pinned_memory_limit
                .insert(key.clone(), memory_limit(limit, &format!("{p}.{key}"))?);
        }
    }
    if let Some(v) = get(map, "multiUser") {
        out.multi_user = v.as_bool().ok_or_else(|| {
            field_error(&format!("{path}.multiUser"), format!("expected true or false, got {}", describe(v)))
        })?;
    }
    Ok(out)
}

fn iommu(value: &Value, path: &str) -> Result<IommuConfig, FieldError> {
    let map = object(value, path)?;
    known(map, path, &["backendPolicy", "enableAPIDevice"])?;
    let mut out = IommuConfig::default();
    if let Some(v) = get(map, "backendPolicy") {
        let p = format!("{path}.backendPolicy");
        out.backend_policy = Some(match string(v, &p)? {
            "LegacyOnly" => IommuBackendPolicy::LegacyOnly,
            "PreferIommuFD" => IommuBackendPolicy::PreferIommuFd,
            other => {
                return Err(field_error(&p, format!("expected LegacyOnly|PreferIommuFD, got {other:?}")));
            }
        });
    }
    if let Some(v) = get(map, "enableAPIDevice") {
        out.enable_api_device = Some(v.as_bool().ok_or_else(|| {
            field_error(
                &format!("{path}.enableAPIDevice"),
                format!("expected true or false, got {}", describe(v)),
            )
        })?);
    }
    Ok(out)
}

// === the check mode ===

/// A claim mode with no host action: it decodes and resolves the claim's opaque configs while Prepare plans
/// ([`configs_for`]), so a malformed config, a strategy whose gate is off or a config of the wrong kind
/// fails the claim before anything is done, whatever other modes are installed. Install it always, first.
#[derive(Debug, Clone, Copy, Default)]
pub struct OpaqueConfigCheck;

impl ClaimMode for OpaqueConfigCheck {
    fn name(&self) -> &'static str {
        "opaqueConfig"
    }

    fn gate(&self) -> &'static str {
        "none (always on)"
    }

    fn plan(&self, ctx: &ClaimContext<'_>) -> Result<Vec<Value>, ModeError> {
        configs_for(ctx).map_err(|e| ModeError::claim("opaqueConfig", e.to_string()))?;
        Ok(Vec::new())
    }

    fn apply(&self, _ctx: &ClaimContext<'_>, _action: &Value) -> Result<ModeEdits, ModeError> {
        Ok(ModeEdits::default())
    }

    fn revert(&self, _action: &Value) -> Result<(), ModeError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use k8s_openapi::api::resource::v1::{DeviceAllocationConfiguration, OpaqueDeviceConfiguration};
    use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
    use proptest::prelude::*;

    use super::*;

    const ALL: Accept = Accept { time_slicing: true, mps: true };

    fn entry(source: &str, driver: &str, requests: &[&str], params: Value) -> DeviceAllocationConfiguration {
        DeviceAllocationConfiguration {
            source: source.to_owned(),
            requests: (!requests.is_empty()).then(|| requests.iter().map(|r| (*r).to_owned()).collect()),
            opaque: Some(OpaqueDeviceConfiguration {
                driver: driver.to_owned(),
                parameters: RawExtension(params),
            }),
        }
    }

    fn gpu_ts(interval: &str) -> Value {
        json!({"apiVersion": API_VERSION, "kind": "GpuConfig",
               "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": interval}}})
    }

    #[test]
    fn errors_name_index_path_and_source() {
        let entries = [
            entry("FromClaim", "manager.nvidia.com", &[], gpu_ts("Short")),
            entry("FromClaim", "manager.nvidia.com", &["gpu"], gpu_ts("Fast")),
        ];
        let err = decode_entries(&entries, "manager.nvidia.com", ALL).unwrap_err().to_string();
        assert_eq!(
            err,
            "config[1].opaque.parameters.sharing.timeSlicingConfig.interval: expected Default|Short|Medium|Long, got \"Fast\" (FromClaim config)"
        );
        let cases = [
            (
                json!({"apiVersion": API_VERSION, "kind": "GpuConfig", "extra": 1}),
                "config[0].opaque.parameters.extra: unknown field",
            ),
            (
                json!({"apiVersion": "v1", "kind": "GpuConfig"}),
                "config[0].opaque.parameters.apiVersion: expected resource.nvidia.com/v1beta1, got \"v1\"",
            ),
            (
                json!({"apiVersion": API_VERSION, "kind": "ComputeDomainChannelConfig"}),
                "config[0].opaque.parameters.kind: expected GpuConfig|MigDeviceConfig|VfioDeviceConfig",
            ),
            (
                json!({"apiVersion": API_VERSION, "kind": "MigDeviceConfig", "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {}}}),
                "config[0].opaque.parameters.sharing.timeSlicingConfig: unknown field",
            ),
            (
                json!({"apiVersion": API_VERSION, "kind": "GpuConfig", "sharing": {"strategy": "Exclusive"}}),
                "config[0].opaque.parameters.sharing.strategy: expected TimeSlicing|MPS, got \"Exclusive\"",
            ),
            (
                json!({"apiVersion": API_VERSION, "kind": "GpuConfig", "sharing": {"strategy": "MPS", "timeSlicingConfig": {}}}),
                "config[0].opaque.parameters.sharing.timeSlicingConfig: cannot be used with the \"MPS\" strategy",
            ),
            (
                json!({"apiVersion": API_VERSION, "kind": "GpuConfig", "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 101}}}),
                "sharing.mpsConfig.defaultActiveThreadPercentage: expected an integer 1..100, got 101",
            ),
            (
                json!({"apiVersion": API_VERSION, "kind": "GpuConfig", "sharing": {"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "512Ki"}}}),
                "defaultPinnedDeviceMemoryLimit: \"512Ki\" is below the 1Mi minimum",
            ),
            (
                json!({"apiVersion": API_VERSION, "kind": "GpuConfig", "sharing": {"strategy": "MPS", "mpsConfig": {"defaultPerDevicePinnedMemoryLimit": {"0": "lots"}}}}),
                "defaultPerDevicePinnedMemoryLimit.0: expected a memory quantity",
            ),
            (
                json!({"apiVersion": API_VERSION, "kind": "VfioDeviceConfig", "iommu": {"backendPolicy": "Any"}}),
                "config[0].opaque.parameters.iommu.backendPolicy: expected LegacyOnly|PreferIommuFD, got \"Any\"",
            ),
            (json!([1]), "config[0].opaque.parameters: expected an object, got [1]"),
        ];
        for (params, want) in cases {
            let err = decode_entries(
                &[entry("FromClass", "manager.nvidia.com", &[], params)],
                "manager.nvidia.com",
                ALL,
            )
            .unwrap_err()
            .to_string();
            assert!(err.contains(want) && err.ends_with("(FromClass config)"), "{err}\n  wanted {want}");
        }
        let bad_source = entry("FromSomewhere", "other.driver", &[], json!({}));
        assert_eq!(
            decode_entries(&[bad_source], "manager.nvidia.com", ALL).unwrap_err().to_string(),
            "config[0].source: expected FromClass|FromClaim, got \"FromSomewhere\""
        );
        let mut no_opaque = entry("FromClaim", "x", &[], json!({}));
        no_opaque.opaque = None;
        assert!(
            decode_entries(&[no_opaque], "manager.nvidia.com", ALL)
                .unwrap_err()
                .to_string()
                .contains("only opaque parameters")
        );
    }

    #[test]
    fn gates_off_reject_their_strategy_by_name() {
        let ts =
            decode_parameters(&gpu_ts("Long"), Accept { time_slicing: false, mps: true }, "p").unwrap_err();
        assert_eq!(
            ts.to_string(),
            "p.sharing.strategy: \"TimeSlicing\" is selected as the GPU sharing strategy, but the feature gate \"TimeSlicingSettings\" is not enabled"
        );
        let mps =
            json!({"apiVersion": API_VERSION, "kind": "MigDeviceConfig", "sharing": {"strategy": "MPS"}});
        let err = decode_parameters(&mps, Accept { time_slicing: true, mps: false }, "p").unwrap_err();
        assert!(err.to_string().contains("feature gate \"MPSSupport\" is not enabled"), "{err}");
        assert_eq!(
            decode_parameters(&mps, ALL, "p").unwrap(),
            DeviceConfig::Mig(MigDeviceConfig { sharing: Some(Sharing::Mps(MpsConfig::default())) })
        );
        // No sharing at all needs no gate.
        let plain = json!({"apiVersion": API_VERSION, "kind": "GpuConfig", "sharing": null});
        assert_eq!(
            decode_parameters(&plain, Accept::default(), "p").unwrap(),
            DeviceConfig::Gpu(GpuConfig::default())
        );
    }

    #[test]
    fn other_drivers_are_skipped_and_claim_configs_win() {
        let entries = [
            entry("FromClaim", "manager.nvidia.com", &[], gpu_ts("Long")),
            entry("FromClass", "manager.nvidia.com", &[], gpu_ts("Short")),
            entry("FromClaim", "gpu.example.com", &[], json!("not even an object")),
            entry("FromClass", "manager.nvidia.com", &["b"], gpu_ts("Medium")),
        ];
        let configs = decode_entries(&entries, "manager.nvidia.com", ALL).unwrap();
        assert_eq!(configs.iter().map(|c| c.index).collect::<Vec<_>>(), [1, 3, 0], "class first, then claim");
        let results = [
            (0, "a", "gpu-0", DeviceType::Gpu),
            (1, "b/sub", "gpu-1", DeviceType::Gpu),
            (2, "c", "gpu-vfio-0", DeviceType::Vfio),
        ];
        let applied = resolve(&configs, &results).unwrap();
        // The claim's all-requests config beats the class's, even the class config naming request b.
        assert_eq!(applied[&0].index, 0);
        assert_eq!(applied[&1].index, 0);
        assert!(!applied.contains_key(&2), "no config fits a vfio device");
        assert_eq!(applied[&0].source, ConfigSource::FromClaim);
        // A claim config naming b/sub's main request wins over the general one for it only.
        let mut more = entries.to_vec();
        more.push(entry("FromClaim", "manager.nvidia.com", &["b"], gpu_ts("Default")));
        let configs = decode_entries(&more, "manager.nvidia.com", ALL).unwrap();
        let applied = resolve(&configs, &results).unwrap();
        assert_eq!((applied[&0].index, applied[&1].index), (0, 4));
    }

    #[test]
    fn a_named_request_of_the_wrong_kind_is_an_error_a_general_one_is_skipped() {
        let vfio = json!({"apiVersion": API_VERSION, "kind": "VfioDeviceConfig"});
        let configs = decode_entries(
            &[entry("FromClaim", "manager.nvidia.com", &[], vfio.clone())],
            "manager.nvidia.com",
            ALL,
        )
        .unwrap();
        assert!(resolve(&configs, &[(0, "gpu", "gpu-0", DeviceType::Gpu)]).unwrap().is_empty());
        let configs = decode_entries(
            &[entry("FromClaim", "manager.nvidia.com", &["gpu"], vfio)],
            "manager.nvidia.com",
            ALL,
        )
        .unwrap();
        assert_eq!(
            resolve(&configs, &[(0, "gpu", "vgpu-0", DeviceType::Vgpu)]).unwrap_err().to_string(),
            "config[0] (FromClaim config) is a VfioDeviceConfig for request \"gpu\", but that request got device vgpu-0, a vgpu device (expected GpuConfig)"
        );
    }

    #[test]
    fn pinned_limits_by_uuid_and_index() {
        let mut m = MpsConfig { default_pinned_device_memory_limit: Some(2 << 30), ..MpsConfig::default() };
        m.default_per_device_pinned_memory_limit.insert("1".into(), 512 << 20);
        m.default_per_device_pinned_memory_limit.insert("GPU-a".into(), 1 << 30);
        let uuids = vec!["GPU-a".to_owned(), "GPU-b".to_owned()];
        let limits = m.pinned_limits_mib(&uuids).unwrap();
        assert_eq!(limits, BTreeMap::from([("GPU-a".to_owned(), 1024), ("GPU-b".to_owned(), 512)]));
        m.default_per_device_pinned_memory_limit.insert("2".into(), 1 << 30);
        assert!(m.pinned_limits_mib(&uuids).unwrap_err().contains("device index 2 is out of range"));
    }

    fn arb_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            "[A-Za-z0-9./]{0,12}".prop_map(Value::String),
            prop::sample::select(vec![
                "resource.nvidia.com/v1beta1",
                "GpuConfig",
                "MigDeviceConfig",
                "VfioDeviceConfig",
                "TimeSlicing",
                "MPS",
                "Long",
                "1Gi"
            ])
            .prop_map(|s| json!(s)),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            let keys = prop::sample::select(vec![
                "apiVersion",
                "kind",
                "sharing",
                "strategy",
                "timeSlicingConfig",
                "interval",
                "mpsConfig",
                "defaultActiveThreadPercentage",
                "defaultPinnedDeviceMemoryLimit",
                "defaultPerDevicePinnedMemoryLimit",
                "multiUser",
                "iommu",
                "backendPolicy",
                "enableAPIDevice",
                "0",
                "x",
            ]);
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::btree_map(keys, inner, 0..5)
                    .prop_map(|m| Value::Object(m.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())),
            ]
        })
    }

    fn arb_mps() -> impl Strategy<Value = MpsConfig> {
        (
            prop::option::of(1u8..=100),
            prop::option::of((1u64..1 << 20).prop_map(|m| m * MIB)),
            prop::collection::btree_map(
                "(GPU-[a-f0-9]{4}|[0-7])",
                (1u64..1 << 30).prop_map(|b| b + MIB),
                0..3,
            ),
            any::<bool>(),
        )
            .prop_map(|(p, d, per, multi_user)| MpsConfig {
                default_active_thread_percentage: p,
                default_pinned_device_memory_limit: d,
                default_per_device_pinned_memory_limit: per,
                multi_user,
            })
    }

    fn arb_config() -> impl Strategy<Value = DeviceConfig> {
        let ts = prop::option::of(prop::sample::select(TimeSlice::ALL.to_vec()));
        let gpu_sharing = prop_oneof![
            Just(None),
            ts.prop_map(|t| Some(Sharing::TimeSlicing(t))),
            arb_mps().prop_map(|m| Some(Sharing::Mps(m))),
        ];
        let mig_sharing = prop_oneof![
            Just(None),
            Just(Some(Sharing::TimeSlicing(None))),
            arb_mps().prop_map(|m| Some(Sharing::Mps(m))),
        ];
        let policy = prop::option::of(prop::sample::select(vec![
            IommuBackendPolicy::LegacyOnly,
            IommuBackendPolicy::PreferIommuFd,
        ]));
        prop_oneof![
            gpu_sharing.prop_map(|sharing| DeviceConfig::Gpu(GpuConfig { sharing })),
            mig_sharing.prop_map(|sharing| DeviceConfig::Mig(MigDeviceConfig { sharing })),
            prop::option::of((policy, prop::option::of(any::<bool>()))).prop_map(|i| DeviceConfig::Vfio(
                VfioDeviceConfig {
                    iommu: i.map(|(backend_policy, enable_api_device)| IommuConfig {
                        backend_policy,
                        enable_api_device
                    }),
                }
            )),
        ]
    }

    proptest! {
        #[test]
        fn decoding_never_panics(value in arb_json(), ts in any::<bool>(), mps in any::<bool>()) {
            let _ = decode_parameters(&value, Accept { time_slicing: ts, mps }, "p");
            let entries = [entry("FromClaim", "manager.nvidia.com", &["r"], value)];
            if let Ok(configs) = decode_entries(&entries, "manager.nvidia.com", Accept { time_slicing: ts, mps }) {
                let _ = resolve(&configs, &[(0, "r", "gpu-0", DeviceType::Gpu), (1, "r/s", "gpu-1-mig-19-0-1", DeviceType::Mig)]);
            }
        }

        #[test]
        fn valid_configs_round_trip(config in arb_config()) {
            let back = decode_parameters(&config.to_json(), ALL, "p").map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(back, config);
        }
    }
}
