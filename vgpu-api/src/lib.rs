//! Resource types of the vgpu GPU module: [`PhysicalGPU`] and [`GPUClass`] (group `gpu.deckhouse.io`,
//! version `v1alpha1`, both cluster-scoped). Types only, in the kube-core style: `kube` with `derive`, no client.
//!
//! | kind | plural | short name | spec written by | status written by |
//! |---|---|---|---|---|
//! | `PhysicalGPU` | `physicalgpus` | `pgpu` | node agent (server-side apply, manager `vgpu-node-agent`), except `passthrough` (the administrator) | node agent (`driver`, `DriverBound`), adapters (`driverVersion`, `memoryMiB`, `computeCapability`, `DriverReady`, `HardwareHealthy`; NVIDIA: `VfioSwitch`, manager `vgpu-vfio-switch`), controller (`state`, `occupancy`, `classPassthrough`, `PassthroughPolicy`) |
//! | `GPUClass` | `gpuclasses` | `gpuc` | the user | controller (`valid`, `message`, `deviceClassName`, conditions) |
//!
//! Status conditions are a list keyed by `type` (`x-kubernetes-list-type: map`), so each writer owns its own
//! conditions under server-side apply.
//!
//! # Passthrough: who decides, who acts
//!
//! Whether a GPU should be on `vfio-pci` (passed through whole, for a VM) has three inputs and one reader:
//!
//! | input | written by | meaning |
//! |---|---|---|
//! | `PhysicalGPU.spec.passthrough` | the administrator | `true`/`false` for this GPU; wins when set |
//! | `GPUClass.spec.passthrough` | the user | `true`/`false` for every GPU the class matches; absent: no wish |
//! | `PhysicalGPU.status.classPassthrough` | the controller | the matching classes' common wish; absent when none has one or they disagree (condition `PassthroughPolicy=False`, reason `ConflictingClasses`) |
//!
//! The NVIDIA adapter reads the wish as [`PhysicalGPU::passthrough_wish`] (`spec.passthrough`, else
//! `status.classPassthrough`, else none: the driver is left as it is) and reports its switch in condition
//! `VfioSwitch`. Each field keeps one writer: the controller, which already matches classes to GPUs, never
//! writes `spec`, and the adapter never reads GPUClasses.
//!
//! Single-object rules are CEL (`x-kubernetes-validations`) in the schema, so the API server enforces them
//! without a webhook:
//!
//! | object | rule |
//! |---|---|
//! | `PhysicalGPU.spec` | `nodeName` and `pciAddress` are immutable |
//! | `PhysicalGPU.status.occupancy` | `usedShares <= totalShares` |
//! | `GPUClass.spec` | `vendor` is immutable; `passthrough: true` needs `sharing.mode: Exclusive` |
//! | `GPUClass.spec.sharing` | `Shared` needs `shares >= 2`; `Exclusive` has no `shares` |
//!
//! Field formats (`pciAddress` `0000:3b:00.0`, 4-digit lower-case hex ids, label-safe vendor keys) are schema
//! patterns.
//!
//! Helpers over core objects, without a client, are in [`pod`] ([`pod::actual_claim_name`]: the
//! ResourceClaim behind a pod's claim entry).
//!
//! # Another API group
//!
//! `kube`'s derive fixes the group at compile time (`Resource::group` is a constant). A module installed under
//! another group uses [`crd_for_group`] (the same CRD with `spec.group` and `metadata.name` rewritten) and
//! [`api_resource_for_group`] (an [`ApiResource`] for `Api<DynamicObject>`); objects are then sent as JSON with
//! `apiVersion` set to `<group>/v1alpha1`, which is what the node agent does. This keeps one set of types and
//! one schema, instead of a macro per group or a hand-written `Resource` impl with a runtime group (which
//! `CustomResourceExt::crd` could not produce).
//!
//! ```
//! use kube::CustomResourceExt;
//! use vgpu_api::{GPUClass, PhysicalGPU, api_resource_for_group, crd_for_group};
//!
//! let crd = PhysicalGPU::crd();
//! assert_eq!(crd.metadata.name.as_deref(), Some("physicalgpus.gpu.deckhouse.io"));
//! let other = crd_for_group(PhysicalGPU::crd(), "gpu.example.com")?;
//! assert_eq!(other.metadata.name.as_deref(), Some("physicalgpus.gpu.example.com"));
//! assert_eq!(other.spec.group, "gpu.example.com");
//! let ar = api_resource_for_group::<GPUClass>("gpu.example.com")?;
//! assert_eq!(ar.api_version, "gpu.example.com/v1alpha1");
//! assert_eq!(ar.plural, "gpuclasses");
//! # Ok::<(), vgpu_api::GroupError>(())
//! ```
//!
//! # Object helpers (no client)
//!
//! | module | what it holds |
//! |---|---|
//! | [`pod`] | a Pod's containers with their field paths ([`pod::containers`]), the sides of a pod patch ([`pod::comparable`]), the owner key ([`pod::owner_key`]), the claim a pod's claim entry stands for ([`pod::actual_claim_name`]) |
//! | [`names`] | generated object names, vgpu-manager's `GenerateK8sSafeResourceName` ([`names::safe_resource_name`], [`names::short_hash`]) |
//! | [`cel`] | CEL string literals a value cannot break out of ([`cel::cel_string`]) |

pub mod cel;
pub mod names;
pub mod pod;

use std::collections::BTreeMap;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{CustomResource, CustomResourceExt, KubeSchema, Resource, core::ApiResource};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The default API group.
pub const DEFAULT_GROUP: &str = "gpu.deckhouse.io";
/// The API version of both kinds.
pub const VERSION: &str = "v1alpha1";

/// A rejected API group name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GroupError {
    /// The group is not a DNS subdomain with at least one dot (`gpu.example.com`).
    #[error(
        "invalid API group {0:?}: expected a lower-case DNS subdomain with at least one dot, such as gpu.example.com"
    )]
    Invalid(String),
}

/// Whether `name` is an RFC 1123 DNS label, as Kubernetes wants namespaces and label-like names: 1–63
/// lower-case letters, digits and `-`, starting and ending with a letter or digit.
///
/// ```
/// assert!(vgpu_api::is_dns_label("d8-gpu"));
/// assert!(!vgpu_api::is_dns_label("D8_gpu") && !vgpu_api::is_dns_label("-x") && !vgpu_api::is_dns_label(""));
/// ```
pub fn is_dns_label(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

/// Checks an API group name: lower-case DNS labels, at least two of them, at most 253 characters.
pub fn validate_group(group: &str) -> Result<(), GroupError> {
    let labels: Vec<&str> = group.split('.').collect();
    if group.len() > 253 || labels.len() < 2 || !labels.iter().all(|l| is_dns_label(l)) {
        return Err(GroupError::Invalid(group.to_owned()));
    }
    Ok(())
}

/// The CRD of `crd` moved to `group`: `spec.group` and `metadata.name` (`<plural>.<group>`) rewritten.
pub fn crd_for_group(
    mut crd: CustomResourceDefinition,
    group: &str,
) -> Result<CustomResourceDefinition, GroupError> {
    validate_group(group)?;
    crd.metadata.name = Some(format!("{}.{group}", crd.spec.names.plural));
    crd.spec.group = group.to_owned();
    Ok(crd)
}

/// Both CRDs for `group`, PhysicalGPU first.
pub fn crds(group: &str) -> Result<Vec<CustomResourceDefinition>, GroupError> {
    Ok(vec![crd_for_group(PhysicalGPU::crd(), group)?, crd_for_group(GPUClass::crd(), group)?])
}

/// The header line of every generated CRD file.
pub const CRD_YAML_HEADER: &str = "# Generated from the vgpu-api types (`VGPU_REGEN=1 cargo test -p vgpu-api --test crds`, `vgpuctl crds`); do not edit.\n";

/// A CRD that could not be printed as YAML.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CrdYamlError {
    /// The group is invalid.
    #[error(transparent)]
    Group(#[from] GroupError),
    /// The YAML serializer failed.
    #[error("cannot print the CRD as YAML: {0}")]
    Yaml(String),
}

/// One CRD as YAML, with [`CRD_YAML_HEADER`] first: the text of the committed files under
/// `deploy/gpu-module/crds/`.
pub fn crd_yaml(crd: &CustomResourceDefinition) -> Result<String, CrdYamlError> {
    let yaml = serde_saphyr::to_string(crd).map_err(|e| CrdYamlError::Yaml(e.to_string()))?;
    Ok(format!("{CRD_YAML_HEADER}{yaml}"))
}

/// Both CRDs for `group` as one multi-document YAML stream (`---` between), for `kubectl apply -f -`.
pub fn crds_yaml(group: &str) -> Result<String, CrdYamlError> {
    let docs = crds(group)?.iter().map(crd_yaml).collect::<Result<Vec<_>, _>>()?;
    Ok(docs.join("---\n"))
}

/// The [`ApiResource`] of `K` (one of this crate's kinds) under `group`, for `Api<DynamicObject>`.
pub fn api_resource_for_group<K>(group: &str) -> Result<ApiResource, GroupError>
where
    K: Resource<DynamicType = ()>,
{
    validate_group(group)?;
    let mut ar = ApiResource::erase::<K>(&());
    ar.group = group.to_owned();
    ar.api_version = format!("{group}/{}", ar.version);
    Ok(ar)
}

// === Shared types ===

/// One status condition (the shape of `metav1.Condition`; `lastTransitionTime` is optional here).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// The condition type, unique in the list (`DriverReady`, `HardwareHealthy`, `DriverBound`, `Valid`).
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: ConditionStatus,
    /// A CamelCase machine-readable reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// A human-readable message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// RFC 3339 time of the last status change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
    /// The `metadata.generation` the condition was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// The status of a [`Condition`].
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, JsonSchema)]
pub enum ConditionStatus {
    /// The condition holds.
    True,
    /// The condition does not hold.
    False,
    /// Not known.
    Unknown,
}

// === PhysicalGPU ===

/// One physical GPU on one node, as the node agent found it in sysfs and `pci.ids`.
#[allow(clippy::duplicated_attributes)] // several printcolumns share `type_ = "string"`
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[kube(
    group = "gpu.deckhouse.io",
    version = "v1alpha1",
    kind = "PhysicalGPU",
    plural = "physicalgpus",
    shortname = "pgpu",
    category = "gpu",
    status = "PhysicalGPUStatus",
    derive = "PartialEq",
    doc = "A physical GPU on a node, found by the GPU module's node agent",
    printcolumn(name = "Node", type_ = "string", json_path = ".spec.nodeName"),
    printcolumn(name = "Vendor", type_ = "string", json_path = ".spec.vendor"),
    printcolumn(name = "Device", type_ = "string", json_path = ".spec.deviceName"),
    printcolumn(name = "Address", type_ = "string", json_path = ".spec.pciAddress"),
    printcolumn(name = "State", type_ = "string", json_path = ".status.state"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    selectable = ".spec.nodeName"
)]
#[x_kube(validation = Rule::new("self.nodeName == oldSelf.nodeName && self.pciAddress == oldSelf.pciAddress").message("nodeName and pciAddress are immutable"))]
#[serde(rename_all = "camelCase")]
pub struct PhysicalGPUSpec {
    /// The node the GPU is installed in.
    #[schemars(length(min = 1, max = 253))]
    pub node_name: String,
    /// Position among the node's supported GPUs in PCI address order, from 0 (changes when a GPU is removed).
    pub index: u32,
    /// PCI address, `dddd:bb:dd.f`, lower-case hex (the domain has 4 to 8 digits).
    #[schemars(regex(pattern = r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-1][0-9a-f]\.[0-7]$"))]
    pub pci_address: String,
    /// Vendor key from the vendor table (`nvidia`, `metax`), the `gpu.deckhouse.io/vendor` label value.
    #[schemars(regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"), length(max = 63))]
    pub vendor: String,
    /// PCI vendor id, 4 lower-case hex digits (`10de`).
    #[schemars(regex(pattern = r"^[0-9a-f]{4}$"))]
    pub vendor_id: String,
    /// Vendor name from `pci.ids`, else the id.
    pub vendor_name: String,
    /// PCI device id, 4 lower-case hex digits (`20b0`).
    #[schemars(regex(pattern = r"^[0-9a-f]{4}$"))]
    pub device_id: String,
    /// Device name from `pci.ids`, else the id.
    pub device_name: String,
    /// A label-safe model name derived from the device name (`a100-sxm4-40gb`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub model: String,
    /// Board (subsystem) ids and name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subsystem: Option<PciSubsystem>,
    /// 24-bit PCI class code, 6 lower-case hex digits (`030200`).
    #[schemars(regex(pattern = r"^[0-9a-f]{6}$"))]
    pub class_code: String,
    /// NUMA node, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa_node: Option<u32>,
    /// IOMMU group, when the IOMMU is on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iommu_group: Option<u32>,
    /// Whether the GPU is passed through whole (bound to `vfio-pci`, for a VM) instead of used through its
    /// vendor driver (`false`: `nvidia`). Set by the cluster administrator; the node agent never writes it.
    /// Absent: the driver is left as it is. The NVIDIA adapter (gate `PassthroughSupport`) switches the GPU
    /// with a `vfio-switch-<node>-<pci>` Job and reports the result in condition `VfioSwitch`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub passthrough: Option<bool>,
}

impl PhysicalGPU {
    /// Whether the GPU should be passed through (crate docs, "Passthrough"): `spec.passthrough` when set,
    /// else `status.classPassthrough`, else `None` (leave the driver as it is).
    ///
    /// ```
    /// use vgpu_api::{PhysicalGPU, PhysicalGPUStatus};
    /// let mut gpu: PhysicalGPU = serde_json::from_value(serde_json::json!({
    ///     "metadata": {"name": "g"},
    ///     "spec": {"nodeName": "w1", "index": 0, "pciAddress": "0000:3b:00.0", "vendor": "nvidia",
    ///              "vendorId": "10de", "vendorName": "NVIDIA", "deviceId": "2330", "deviceName": "H100",
    ///              "classCode": "030200"},
    /// }))?;
    /// assert_eq!(gpu.passthrough_wish(), None);
    /// gpu.status = Some(PhysicalGPUStatus { class_passthrough: Some(true), ..Default::default() });
    /// assert_eq!(gpu.passthrough_wish(), Some(true));
    /// gpu.spec.passthrough = Some(false);
    /// assert_eq!(gpu.passthrough_wish(), Some(false), "the GPU's own spec wins");
    /// # Ok::<(), serde_json::Error>(())
    /// ```
    pub fn passthrough_wish(&self) -> Option<bool> {
        self.spec.passthrough.or_else(|| self.status.as_ref()?.class_passthrough)
    }
}

/// The subsystem (board) of a GPU.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PciSubsystem {
    /// Subsystem vendor id, 4 lower-case hex digits.
    #[schemars(regex(pattern = r"^[0-9a-f]{4}$"))]
    pub vendor_id: String,
    /// Subsystem device id, 4 lower-case hex digits.
    #[schemars(regex(pattern = r"^[0-9a-f]{4}$"))]
    pub device_id: String,
    /// Name from `pci.ids`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// What is known about a GPU now; each field group has one writer (see the crate docs).
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PhysicalGPUStatus {
    /// The kernel driver bound to the device (`nvidia`, `vfio-pci`, `metax`); absent when unbound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
    /// The vendor driver's version (adapter).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_version: Option<String>,
    /// Device memory in MiB (adapter).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(rename = "memoryMiB")]
    pub memory_mib: Option<u64>,
    /// Compute capability (`8.0` for NVIDIA) or the vendor's equivalent (adapter).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_capability: Option<String>,
    /// Current state (controller).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<GpuState>,
    /// Occupancy by allocated claims (controller).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub occupancy: Option<Occupancy>,
    /// The passthrough wish of the GPUClasses that match this GPU (controller): `true`/`false` when every
    /// matching class with a `spec.passthrough` says the same, absent when none has one or they disagree
    /// (then condition `PassthroughPolicy` is `False`, reason `ConflictingClasses`). `spec.passthrough`, when
    /// set, wins over it ([`PhysicalGPU::passthrough_wish`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class_passthrough: Option<bool>,
    /// Conditions, keyed by `type`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// The state of a PhysicalGPU.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, JsonSchema)]
pub enum GpuState {
    /// Usable and not allocated.
    Available,
    /// Allocated, wholly or in part.
    Allocated,
    /// Not usable (no driver, unhealthy, switching to vfio-pci).
    Unavailable,
}

/// Which claims use a GPU and how much of it.
#[derive(KubeSchema, Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq)]
#[x_kube(validation = Rule::new("self.usedShares <= self.totalShares").message("usedShares must not exceed totalShares"))]
#[serde(rename_all = "camelCase")]
pub struct Occupancy {
    /// Shares the GPU offers (1 for exclusive use).
    pub total_shares: u32,
    /// Shares allocated.
    pub used_shares: u32,
    /// The allocated ResourceClaims, `namespace/name`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub claims: Vec<String>,
}

// === GPUClass ===

/// What a workload may use: a vendor, a device type, requirements and a sharing policy. The controller turns
/// each GPUClass into a DeviceClass.
#[allow(clippy::duplicated_attributes)] // several printcolumns share `type_ = "string"`
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[kube(
    group = "gpu.deckhouse.io",
    version = "v1alpha1",
    kind = "GPUClass",
    plural = "gpuclasses",
    shortname = "gpuc",
    category = "gpu",
    status = "GPUClassStatus",
    derive = "PartialEq",
    doc = "A class of GPUs workloads may request; the GPU module's controller makes a DeviceClass of it",
    printcolumn(name = "Vendor", type_ = "string", json_path = ".spec.vendor"),
    printcolumn(name = "Device", type_ = "string", json_path = ".spec.deviceType"),
    printcolumn(name = "Sharing", type_ = "string", json_path = ".spec.sharing.mode"),
    printcolumn(name = "Valid", type_ = "boolean", json_path = ".status.valid"),
    printcolumn(name = "DeviceClass", type_ = "string", json_path = ".status.deviceClassName"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[x_kube(
    validation = Rule::new("self.vendor == oldSelf.vendor").message("vendor is immutable"),
    validation = Rule::new("!has(self.passthrough) || !self.passthrough || self.sharing.mode == 'Exclusive'").message("passthrough: true needs sharing.mode Exclusive (a passed-through GPU is one VM's)")
)]
#[serde(rename_all = "camelCase")]
pub struct GPUClassSpec {
    /// Vendor key (`nvidia`, `metax`), as in `PhysicalGPU.spec.vendor`.
    #[schemars(regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"), length(max = 63))]
    pub vendor: String,
    /// Device type: a `PhysicalGPU.spec.model` (`a100-sxm4-40gb`); absent means any device of the vendor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_type: Option<String>,
    /// What each device must offer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requirements: Option<Requirements>,
    /// Exclusive or shared use.
    pub sharing: SharingPolicy,
    /// Nodes whose GPUs the class may use (label equality); absent means all nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,
    /// Whether the class's GPUs are passed through whole (bound to `vfio-pci`, for VMs): `true` asks for
    /// every matching GPU to be switched to `vfio-pci` (and the DeviceClass selects the `vfio` devices),
    /// `false` for them to stay on (or go back to) the vendor driver; absent: no wish. A GPU's own
    /// `spec.passthrough` wins; matching classes that disagree switch nothing (crate docs, "Passthrough").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub passthrough: Option<bool>,
}

/// What each device of a class must offer.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Requirements {
    /// Minimum device memory in MiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[serde(rename = "minMemoryMiB")]
    #[schemars(range(min = 1))]
    pub min_memory_mib: Option<u64>,
    /// Minimum compute capability (`8.0`) or the vendor's equivalent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_compute_capability: Option<String>,
    /// Named capabilities each device must have (`mig`, `nvlink`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    pub capabilities: Vec<String>,
}

/// Exclusive or shared use of a device.
#[derive(KubeSchema, Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[x_kube(validation = Rule::new("self.mode == 'Shared' ? (has(self.shares) && self.shares >= 2) : !has(self.shares)").message("Shared needs shares >= 2; Exclusive takes no shares"))]
#[serde(rename_all = "camelCase")]
pub struct SharingPolicy {
    /// `Exclusive` (one claim per device) or `Shared` (vGPU shares).
    pub mode: SharingMode,
    /// How many vGPU shares one device is split into (only with `Shared`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shares: Option<u32>,
}

/// The sharing mode of a [`SharingPolicy`].
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, JsonSchema)]
pub enum SharingMode {
    /// One claim per device.
    Exclusive,
    /// Several claims per device, as vGPU shares.
    Shared,
}

/// The controller's verdict on a GPUClass.
#[derive(Serialize, Deserialize, Debug, Clone, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GPUClassStatus {
    /// Whether the class matches at least one PhysicalGPU and is consistent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub valid: Option<bool>,
    /// Why the class is invalid, or a summary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The generated DeviceClass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_class_name: Option<String>,
    /// Conditions, keyed by `type`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn groups_are_checked() {
        assert!(validate_group("gpu.deckhouse.io").is_ok());
        for bad in ["", "gpu", "GPU.example.com", "a..b", "-a.b", "a.b-", &"a.".repeat(130)] {
            assert_eq!(validate_group(bad), Err(GroupError::Invalid(bad.to_owned())), "{bad}");
        }
        assert!(crd_for_group(GPUClass::crd(), "nodots").is_err());
    }

    #[test]
    fn crds_are_cluster_scoped_with_status() {
        for crd in crds(DEFAULT_GROUP).unwrap() {
            assert_eq!(crd.spec.scope, "Cluster");
            let version = &crd.spec.versions[0];
            assert_eq!(version.name, VERSION);
            assert!(version.subresources.as_ref().unwrap().status.is_some());
        }
    }
}
