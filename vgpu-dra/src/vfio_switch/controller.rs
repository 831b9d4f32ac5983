//! The NVIDIA adapter's switch controller (gate `PassthroughSupport`; `vgpu-kubelet-plugin
//! --vfio-switch-namespace/--vfio-switch-image`): for each NVIDIA PhysicalGPU of this node whose
//! `spec.passthrough` asks for another driver than the one it is on, a `vfio-switch-<node>-<pci>` Job runs
//! `vgpu-node-agent vfio-switch` ([`super::Switcher`]) privileged on this node, and the outcome becomes the
//! PhysicalGPU's condition `VfioSwitch`.
//!
//! # Watches → reconcile → writes
//!
//! The controller watches ([`SwitchCluster::changes`]) this node's PhysicalGPUs
//! (`fieldSelector=spec.nodeName=<node>`) and its switch Jobs (`labelSelector=`[`NODE_LABEL`]`=<node>` in
//! [`SwitchConfig::namespace`]); each change (a burst folded over [`DEBOUNCE`]) runs a pass at once, and a
//! pass also runs every [`SwitchConfig::resync`] (60 s) without one, and every [`SwitchConfig::recheck`]
//! (5 s) while a GPU waits for its holders (claims and processes are not API objects this watch sees) or
//! after a failed pass. A watch that fails is retried by the watcher with backoff; the resync covers the
//! gap. A pass lists this node's PhysicalGPUs and, for each with `spec.vendor: nvidia` and a passthrough
//! wish ([`desired_target`]: `spec.passthrough`, else `status.classPassthrough`, which the GPU module's
//! controller writes from the GPUClasses with `spec.passthrough` that match the GPU and leaves unset when
//! they disagree; see `vgpu_api`, "Passthrough"), looks at its Job:
//!
//! | Job | GPU | action | `VfioSwitch` (status, reason) |
//! |---|---|---|---|
//! | none | on the target (`status.driver`), or switched there for this `metadata.generation` | nothing (the condition is written once when absent) | `True`, `SwitchedToVfioPci` / `SwitchedToNvidia` |
//! | none | elsewhere, to `vfio-pci`, held by a claim or process ([`GpuUsage`], when given) | wait | `False`, `InUse` (the holders) |
//! | none | elsewhere | create the Job | `Unknown`, `Switching` |
//! | running, same target | | wait | `Unknown`, `Switching` |
//! | succeeded, same target | | delete the Job | `True`, `SwitchedToVfioPci` / `SwitchedToNvidia` |
//! | failed, same target | | keep the Job (delete it to try again) | `False`, `SwitchFailed` (the container's termination message) |
//! | another target (`spec.passthrough` flipped) | | running: wait; finished: delete it (the next pass creates the new one) | |
//!
//! Conditions carry `observedGeneration`; `spec.passthrough` changes bump the generation, so a switch done
//! for an older spec never counts for a newer one (a class wish lives in `status` and bumps nothing: there
//! the condition's reason, `SwitchedToVfioPci` or `SwitchedToNvidia`, tells the target apart). `status.driver` is the node agent's (it may lag a switch
//! until its next scan), so a `SwitchedTo…` condition of the current generation counts as done too.
//!
//! Each pass also sends [`passthrough_gpus`] to the slice publisher
//! ([`SwitchController::with_passthrough_sink`]), which then publishes those GPUs only as VFIO devices.
//!
//! Writes: the Job (`batch/v1`, in [`SwitchConfig::namespace`], owned by the PhysicalGPU so it goes with
//! it), and the condition by server-side apply of `status.conditions` on `/status` with field manager
//! [`FIELD_MANAGER`] (its own manager: the adapter's [`crate::physical_gpu`] status sync applies its two
//! conditions under another one, so neither removes the other's).
//!
//! The Job's pod: `nodeName` this node, `restartPolicy: Never`, `backoffLimit: 0`, no service-account
//! token, tolerating every taint; one container `switch` running
//! `<binary> vfio-switch --pci <addr> --to <driver> --sysfs-root <container sys> [--host-root /host-root]`
//! privileged, with the host's sysfs ([`SwitchConfig::host_sys`]) mounted at
//! [`SwitchConfig::container_sys`] and the host's `/` read-only at `/host-root` (for `modprobe vfio-pci`).

use std::{collections::BTreeMap, future::Future, path::PathBuf, pin::Pin, sync::Arc, time::Duration};

use k8s_openapi::api::{batch::v1::Job, core::v1::Pod};
use kube::{
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, PropagationPolicy},
    runtime::{WatchStreamExt as _, watcher},
};
use serde_json::json;
use tokio_stream::{Stream, StreamExt as _};
use vgpu_api::{Condition, ConditionStatus, PhysicalGPU};
use vgpu_core::discovery::PciAddress;

use super::{SwitchTarget, job_name, usage::GpuUsage};

/// The PhysicalGPU condition this controller owns.
pub const CONDITION: &str = "VfioSwitch";
/// The field manager of the condition.
pub const FIELD_MANAGER: &str = "vgpu-vfio-switch";
/// Reason: a Job is switching the GPU.
pub const REASON_SWITCHING: &str = "Switching";
/// Reason: the GPU is on `vfio-pci`.
pub const REASON_SWITCHED_TO_VFIO_PCI: &str = "SwitchedToVfioPci";
/// Reason: the GPU is on `nvidia`.
pub const REASON_SWITCHED_TO_NVIDIA: &str = "SwitchedToNvidia";
/// Reason: the Job failed.
pub const REASON_SWITCH_FAILED: &str = "SwitchFailed";
/// Reason: a claim or a process holds the GPU; the switch to `vfio-pci` waits for it to go.
pub const REASON_IN_USE: &str = "InUse";
/// Annotation of the Job naming the driver it switches to.
pub const TARGET_ANNOTATION: &str = "gpu.deckhouse.io/vfio-switch-target";
/// The vendor whose GPUs are switched.
pub const VENDOR: &str = "nvidia";
/// The label of every switch Job naming its node ([`node_label_value`]); the controller watches its own.
pub const NODE_LABEL: &str = "gpu.deckhouse.io/node";
/// The default period of passes without a change ([`SwitchConfig::resync`]).
pub const DEFAULT_RESYNC: Duration = Duration::from_secs(60);
/// The default period of passes while a GPU waits for its holders or after a failed pass
/// ([`SwitchConfig::recheck`]).
pub const DEFAULT_RECHECK: Duration = Duration::from_secs(5);
/// Changes arriving within this window of each other are folded into one pass.
pub const DEBOUNCE: Duration = Duration::from_millis(100);
/// The longest a burst of changes delays a pass.
pub const MAX_DEBOUNCE: Duration = Duration::from_secs(1);
/// Where the binary is in the module's image.
pub const DEFAULT_BINARY: &str = "/usr/bin/vgpu-node-agent";

/// The reason of a finished switch to `target`.
pub fn switched_reason(target: SwitchTarget) -> &'static str {
    match target {
        SwitchTarget::VfioPci => REASON_SWITCHED_TO_VFIO_PCI,
        SwitchTarget::Nvidia => REASON_SWITCHED_TO_NVIDIA,
    }
}

/// What the Jobs look like and where they go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SwitchConfig {
    /// This node (`NODE_NAME`): its GPUs only, and the Jobs' `nodeName`.
    pub node_name: String,
    /// `--vfio-switch-namespace`: where the Jobs are created.
    pub namespace: String,
    /// `--vfio-switch-image`: the image holding [`SwitchConfig::binary`].
    pub image: String,
    /// The image pull policy of the Jobs.
    pub image_pull_policy: String,
    /// The node agent binary in the image.
    pub binary: String,
    /// The host's sysfs (hostPath).
    pub host_sys: PathBuf,
    /// Where the Job's container sees it (`--sysfs-root`).
    pub container_sys: PathBuf,
    /// Mount the host's `/` read-only at `/host-root` (`modprobe vfio-pci` chroot'ed there).
    pub mount_host_root: bool,
    /// More host paths mounted read-only at the same path in the container (tests: a binary and its
    /// libraries in an image that lacks them).
    pub extra_host_paths: Vec<PathBuf>,
    /// The period of passes when nothing changed (the watch covers changes; this repairs a missed one).
    pub resync: Duration,
    /// The period of passes while a GPU waits for its holders (`InUse`) or after a failed pass.
    pub recheck: Duration,
}

impl SwitchConfig {
    /// The defaults for `node`, `namespace` and `image`.
    pub fn new(node: impl Into<String>, namespace: impl Into<String>, image: impl Into<String>) -> Self {
        Self {
            node_name: node.into(),
            namespace: namespace.into(),
            image: image.into(),
            image_pull_policy: "IfNotPresent".into(),
            binary: DEFAULT_BINARY.into(),
            host_sys: PathBuf::from("/sys"),
            container_sys: PathBuf::from("/host-sys"),
            mount_host_root: true,
            extra_host_paths: Vec::new(),
            resync: DEFAULT_RESYNC,
            recheck: DEFAULT_RECHECK,
        }
    }

    /// Checks what the API server would refuse in the Jobs, so that a bad setting stops the plugin at start
    /// instead of failing every Job creation later: the namespace is a DNS label, the image is set, and
    /// every path ([`Self::binary`], [`Self::host_sys`], [`Self::container_sys`], [`Self::extra_host_paths`])
    /// is absolute with no `.` or `..` component (hostPath and mountPath rules).
    pub fn validate(&self) -> Result<(), SwitchConfigError> {
        let bad = |field: &'static str, value: String, expected: &'static str| {
            Err(SwitchConfigError { field, value, expected })
        };
        if !vgpu_api::is_dns_label(&self.namespace) {
            return bad(
                "namespace",
                self.namespace.clone(),
                "a DNS label (lowercase letters, digits, '-', at most 63)",
            );
        }
        if self.image.trim().is_empty() {
            return bad("image", self.image.clone(), "an image reference");
        }
        let paths = [
            ("binary", PathBuf::from(&self.binary)),
            ("host sysfs", self.host_sys.clone()),
            ("container sysfs", self.container_sys.clone()),
        ];
        let extra = self.extra_host_paths.iter().map(|p| ("extra host path", p.clone()));
        for (field, path) in paths.into_iter().chain(extra) {
            // Textually: `Path::components` drops interior `.` components the API server still sees.
            let text = path.to_string_lossy();
            let clean = path.is_absolute() && !text.split('/').any(|c| c == "." || c == "..");
            if !clean {
                return bad(
                    field,
                    path.display().to_string(),
                    "an absolute path without '.' or '..' components",
                );
            }
        }
        Ok(())
    }
}

/// A [`SwitchConfig`] setting the API server would refuse in a Job.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("vfio-switch {field} {value:?}: expected {expected}")]
pub struct SwitchConfigError {
    /// The setting.
    pub field: &'static str,
    /// Its value.
    pub value: String,
    /// What it should be.
    pub expected: &'static str,
}

/// A call to the API server failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ControllerError {
    /// Listing this node's PhysicalGPUs failed.
    #[error("list the PhysicalGPUs of node {node}: {message}")]
    List {
        /// The node.
        node: String,
        /// Why.
        message: String,
    },
    /// A Job call failed.
    #[error("{action} Job {namespace}/{name}: {message}")]
    Job {
        /// `get`, `create`, `delete`.
        action: &'static str,
        /// The namespace.
        namespace: String,
        /// The Job.
        name: String,
        /// Why.
        message: String,
    },
    /// Applying the condition failed.
    #[error("apply condition VfioSwitch of PhysicalGPU {name}: {message}")]
    Condition {
        /// The PhysicalGPU.
        name: String,
        /// Why.
        message: String,
    },
}

/// Where a Job is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobPhase {
    /// Not finished.
    Active,
    /// Its pod exited 0.
    Succeeded,
    /// It failed, with the best message found (the container's termination message, else the Job's).
    Failed(String),
}

/// A switch Job as the controller sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobInfo {
    /// The driver it switches to ([`TARGET_ANNOTATION`]); `None` when unreadable.
    pub target: Option<SwitchTarget>,
    /// Where it is.
    pub phase: JobPhase,
}

/// A stream of triggers: each item says "something this controller looks at may have changed".
pub type Changes = Pin<Box<dyn Stream<Item = ()> + Send>>;

/// The API calls of the controller.
#[tonic::async_trait]
pub trait SwitchCluster: Send + Sync + std::fmt::Debug + 'static {
    /// Changes of `node`'s PhysicalGPUs and of its switch Jobs in `namespace`, for as long as the controller
    /// runs (a stream that ends leaves the controller on its resync). The default never yields.
    fn changes(&self, node: &str, namespace: &str) -> Changes {
        let _ = (node, namespace);
        Box::pin(tokio_stream::pending())
    }
    /// The PhysicalGPUs of `node`; `None` when the API has no PhysicalGPU resource.
    async fn list_gpus(&self, node: &str) -> Result<Option<Vec<PhysicalGPU>>, ControllerError>;
    /// Job `name` in `namespace`, if any.
    async fn get_job(&self, namespace: &str, name: &str) -> Result<Option<JobInfo>, ControllerError>;
    /// Creates a Job (one that exists already counts as created).
    async fn create_job(&self, job: &Job) -> Result<(), ControllerError>;
    /// Deletes a Job and its pods (one that is gone counts as deleted).
    async fn delete_job(&self, namespace: &str, name: &str) -> Result<(), ControllerError>;
    /// Applies condition [`CONDITION`] of PhysicalGPU `gpu`.
    async fn apply_condition(&self, gpu: &str, condition: &Condition) -> Result<(), ControllerError>;
}

/// The driver a PhysicalGPU should be on, when this controller switches it: NVIDIA, with a passthrough wish
/// ([`PhysicalGPU::passthrough_wish`]: `spec.passthrough`, else the controller's `status.classPassthrough`).
pub fn desired_target(gpu: &PhysicalGPU) -> Option<SwitchTarget> {
    (gpu.spec.vendor == VENDOR).then_some(())?;
    gpu.passthrough_wish().map(SwitchTarget::for_passthrough)
}

/// The GPUs of `node` the slices must publish only as VFIO devices
/// ([`crate::slices::publisher::SlicePublisher::with_passthrough`]): NVIDIA GPUs wished for passthrough
/// ([`desired_target`] `vfio-pci`, switched or not yet) or bound to `vfio-pci` now (`status.driver`, e.g. by
/// a VFIO claim, or still there on the way back to `nvidia`).
pub fn passthrough_gpus(gpus: &[PhysicalGPU], node: &str) -> crate::slices::publisher::PassthroughGpus {
    gpus.iter()
        .filter(|g| g.spec.node_name == node && g.spec.vendor == VENDOR)
        .filter(|g| {
            desired_target(g) == Some(SwitchTarget::VfioPci)
                || g.status.as_ref().and_then(|s| s.driver.as_deref()) == Some(SwitchTarget::VfioPci.driver())
        })
        .filter_map(|g| g.spec.pci_address.parse().ok())
        .collect()
}

/// The [`NODE_LABEL`] value of `node`'s Jobs: the node name when it is a valid label value (at most 63
/// characters), else its first 52 characters, `-` and 10 hex digits of its SHA-256 (a node name may have
/// 253).
pub fn node_label_value(node: &str) -> String {
    if node.len() <= 63 {
        return node.to_owned();
    }
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(node.as_bytes());
    let hash: String = digest.iter().take(5).map(|b| format!("{b:02x}")).collect();
    let head = node[..52].trim_end_matches(['-', '.', '_']);
    format!("{head}-{hash}")
}

/// The PhysicalGPU's [`CONDITION`].
pub fn condition_of(gpu: &PhysicalGPU) -> Option<&Condition> {
    gpu.status.as_ref()?.conditions.iter().find(|c| c.type_ == CONDITION)
}

/// Whether `gpu` is on `target` (its `status.driver`, or a `SwitchedTo…` condition of its generation).
pub fn is_done(gpu: &PhysicalGPU, target: SwitchTarget) -> bool {
    let driver = gpu.status.as_ref().and_then(|s| s.driver.as_deref());
    driver == Some(target.driver())
        || condition_of(gpu).is_some_and(|c| {
            c.status == ConditionStatus::True
                && c.reason.as_deref() == Some(switched_reason(target))
                && c.observed_generation == gpu.metadata.generation
        })
}

/// The Job that switches `gpu` (at `pci`) to `target` (module docs).
pub fn job(config: &SwitchConfig, gpu: &PhysicalGPU, pci: &PciAddress, target: SwitchTarget) -> Job {
    let name = job_name(&config.node_name, pci);
    let labels = json!({
        "app.kubernetes.io/name": "vfio-switch",
        "app.kubernetes.io/component": "vfio-switch",
        NODE_LABEL: node_label_value(&config.node_name),
    });
    let mut args = vec![
        config.binary.clone(),
        "vfio-switch".to_owned(),
        "--pci".to_owned(),
        pci.to_string(),
        "--to".to_owned(),
        target.to_string(),
        "--sysfs-root".to_owned(),
        config.container_sys.display().to_string(),
    ];
    let mut mounts = vec![json!({"name": "host-sys", "mountPath": config.container_sys})];
    let mut volumes =
        vec![json!({"name": "host-sys", "hostPath": {"path": config.host_sys, "type": "Directory"}})];
    if config.mount_host_root {
        args.extend(["--host-root".to_owned(), "/host-root".to_owned()]);
        mounts.push(json!({"name": "host-root", "mountPath": "/host-root", "readOnly": true}));
        volumes.push(json!({"name": "host-root", "hostPath": {"path": "/"}}));
    }
    for (i, path) in config.extra_host_paths.iter().enumerate() {
        mounts.push(json!({"name": format!("extra-{i}"), "mountPath": path, "readOnly": true}));
        volumes.push(json!({"name": format!("extra-{i}"), "hostPath": {"path": path}}));
    }
    let mut metadata = json!({
        "name": name,
        "namespace": config.namespace,
        "labels": labels,
        "annotations": {
            TARGET_ANNOTATION: target.to_string(),
            "gpu.deckhouse.io/physicalgpu": gpu.metadata.name,
            "gpu.deckhouse.io/pci-address": pci.to_string(),
        },
    });
    if let Some(uid) = &gpu.metadata.uid {
        metadata["ownerReferences"] = json!([{
            "apiVersion": format!("{}/{}", vgpu_api::DEFAULT_GROUP, vgpu_api::VERSION),
            "kind": "PhysicalGPU",
            "name": gpu.metadata.name,
            "uid": uid,
        }]);
    }
    let value = json!({
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata,
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeName": config.node_name,
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": false,
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [{
                        "name": "switch",
                        "image": config.image,
                        "imagePullPolicy": config.image_pull_policy,
                        "command": args,
                        "securityContext": {"privileged": true},
                        "terminationMessagePolicy": "FallbackToLogsOnError",
                        "volumeMounts": mounts,
                    }],
                    "volumes": volumes,
                },
            },
        },
    });
    // The value is built from typed parts above; a failure here is a bug in this function.
    serde_json::from_value(value).unwrap_or_default()
}

fn condition(status: ConditionStatus, reason: &str, message: String, generation: Option<i64>) -> Condition {
    Condition {
        type_: CONDITION.into(),
        status,
        reason: Some(reason.into()),
        message: Some(message),
        last_transition_time: None,
        observed_generation: generation,
    }
}

/// What one pass did for one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Nothing to do (no passthrough wish, not NVIDIA, or already there).
    Idle,
    /// A Job was created.
    Created(String),
    /// A Job is running.
    Waiting(String),
    /// The Job succeeded (and was deleted).
    Succeeded(String),
    /// The Job failed (kept).
    Failed(String),
    /// A Job for another target was deleted.
    Replaced(String),
    /// The switch waits: these hold the GPU (or the usage could not be told).
    Held(Vec<String>),
}

/// Creates and watches the switch Jobs of one node (module docs).
#[derive(Debug)]
pub struct SwitchController {
    cluster: Arc<dyn SwitchCluster>,
    config: SwitchConfig,
    usage: Option<Arc<dyn GpuUsage>>,
    passthrough: Option<tokio::sync::watch::Sender<crate::slices::publisher::PassthroughGpus>>,
    /// Whether a pass has sent the set yet (the first is sent even when empty: the publisher waits for it).
    passthrough_sent: std::sync::atomic::AtomicBool,
}

impl SwitchController {
    /// A controller over `cluster`, switching without asking who holds a GPU (see [`Self::with_usage`]).
    pub fn new(cluster: Arc<dyn SwitchCluster>, config: SwitchConfig) -> Self {
        Self {
            cluster,
            config,
            usage: None,
            passthrough: None,
            passthrough_sent: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Asks `usage` before each switch to `vfio-pci` and waits while anything holds the GPU.
    #[must_use]
    pub fn with_usage(mut self, usage: Arc<dyn GpuUsage>) -> Self {
        self.usage = Some(usage);
        self
    }

    /// Sends [`passthrough_gpus`] of every pass's GPU list on `sink` (the first pass's always, later ones
    /// when the set changed), for the slice publisher.
    #[must_use]
    pub fn with_passthrough_sink(
        mut self,
        sink: tokio::sync::watch::Sender<crate::slices::publisher::PassthroughGpus>,
    ) -> Self {
        self.passthrough = Some(sink);
        self
    }

    /// The configuration.
    pub fn config(&self) -> &SwitchConfig {
        &self.config
    }

    /// One pass over this node's PhysicalGPUs: the step of each that has a passthrough wish, by name.
    pub async fn reconcile_once(&self) -> Result<BTreeMap<String, Step>, ControllerError> {
        let gpus = self.cluster.list_gpus(&self.config.node_name).await?.unwrap_or_default();
        if let Some(sink) = &self.passthrough {
            let set = passthrough_gpus(&gpus, &self.config.node_name);
            let first = !self.passthrough_sent.swap(true, std::sync::atomic::Ordering::SeqCst);
            sink.send_if_modified(|current| {
                let changed = *current != set;
                if changed {
                    tracing::info!(gpus = ?set.iter().map(ToString::to_string).collect::<Vec<_>>(), "passthrough GPUs (published as VFIO devices only)");
                    *current = set;
                }
                changed || first
            });
        }
        let mut steps = BTreeMap::new();
        let mut first_error = None;
        for gpu in gpus.iter().filter(|g| g.spec.node_name == self.config.node_name) {
            let name = gpu.metadata.name.clone().unwrap_or_default();
            match self.reconcile(gpu).await {
                Ok(Step::Idle) => {}
                Ok(step) => {
                    steps.insert(name, step);
                }
                Err(error) => {
                    tracing::warn!(gpu = %name, %error, "vfio-switch");
                    first_error.get_or_insert(error);
                }
            }
        }
        match first_error {
            Some(error) if steps.is_empty() => Err(error),
            _ => Ok(steps),
        }
    }

    async fn set_condition(&self, gpu: &PhysicalGPU, wanted: Condition) -> Result<(), ControllerError> {
        let current = condition_of(gpu);
        if current == Some(&wanted) {
            return Ok(());
        }
        let name = gpu.metadata.name.clone().unwrap_or_default();
        self.cluster.apply_condition(&name, &wanted).await
    }

    async fn reconcile(&self, gpu: &PhysicalGPU) -> Result<Step, ControllerError> {
        let Some(target) = desired_target(gpu) else { return Ok(Step::Idle) };
        let Ok(pci) = gpu.spec.pci_address.parse::<PciAddress>() else {
            tracing::warn!(gpu = ?gpu.metadata.name, address = %gpu.spec.pci_address, "not a PCI address; not switched");
            return Ok(Step::Idle);
        };
        let generation = gpu.metadata.generation;
        let name = job_name(&self.config.node_name, &pci);
        let namespace = &self.config.namespace;
        let existing = self.cluster.get_job(namespace, &name).await?;
        match existing {
            Some(info) if info.target != Some(target) => {
                if info.phase == JobPhase::Active {
                    return Ok(Step::Waiting(name));
                }
                self.cluster.delete_job(namespace, &name).await?;
                Ok(Step::Replaced(name))
            }
            Some(info) => match info.phase {
                JobPhase::Active => {
                    // The condition written when the Job was created says more (the driver it comes from):
                    // keep it; write one only when another is there (a restart, a condition lost).
                    let switching = condition_of(gpu).is_some_and(|c| {
                        c.reason.as_deref() == Some(REASON_SWITCHING) && c.observed_generation == generation
                    });
                    if !switching {
                        let message = format!("Job {namespace}/{name} is switching {pci} to {target}");
                        self.set_condition(
                            gpu,
                            condition(ConditionStatus::Unknown, REASON_SWITCHING, message, generation),
                        )
                        .await?;
                    }
                    Ok(Step::Waiting(name))
                }
                JobPhase::Succeeded => {
                    let message = format!("{pci} is on {target} (Job {namespace}/{name})");
                    let done = condition(ConditionStatus::True, switched_reason(target), message, generation);
                    self.set_condition(gpu, done).await?;
                    self.cluster.delete_job(namespace, &name).await?;
                    tracing::info!(gpu = ?gpu.metadata.name, %pci, %target, "vfio-switch Job succeeded");
                    Ok(Step::Succeeded(name))
                }
                JobPhase::Failed(why) => {
                    let message = format!(
                        "Job {namespace}/{name} failed to switch {pci} to {target}: {why} (delete the Job to try again)"
                    );
                    self.set_condition(
                        gpu,
                        condition(ConditionStatus::False, REASON_SWITCH_FAILED, message, generation),
                    )
                    .await?;
                    Ok(Step::Failed(name))
                }
            },
            None if is_done(gpu, target) => {
                let switched = condition_of(gpu).is_some_and(|c| {
                    c.status == ConditionStatus::True && c.reason.as_deref() == Some(switched_reason(target))
                });
                if !switched {
                    let message = format!("{pci} is on {target}");
                    self.set_condition(
                        gpu,
                        condition(ConditionStatus::True, switched_reason(target), message, generation),
                    )
                    .await?;
                }
                Ok(Step::Idle)
            }
            None => {
                if target == SwitchTarget::VfioPci
                    && let Some(usage) = &self.usage
                {
                    let holders = match usage.holders(&pci).await {
                        Ok(holders) => holders,
                        Err(why) => vec![format!("usage unknown ({why})")],
                    };
                    if !holders.is_empty() {
                        let message =
                            format!("{pci} waits to be switched to {target}: held by {}", holders.join(", "));
                        self.set_condition(
                            gpu,
                            condition(ConditionStatus::False, REASON_IN_USE, message, generation),
                        )
                        .await?;
                        return Ok(Step::Held(holders));
                    }
                }
                let from =
                    gpu.status.as_ref().and_then(|s| s.driver.clone()).unwrap_or_else(|| "no driver".into());
                self.cluster.create_job(&job(&self.config, gpu, &pci, target)).await?;
                let message = format!("Job {namespace}/{name} is switching {pci} from {from} to {target}");
                self.set_condition(
                    gpu,
                    condition(ConditionStatus::Unknown, REASON_SWITCHING, message, generation),
                )
                .await?;
                tracing::info!(gpu = ?gpu.metadata.name, %pci, %from, %target, job = %name, "vfio-switch Job created");
                Ok(Step::Created(name))
            }
        }
    }

    /// Runs passes until `stop` resolves: at once, after each change [`SwitchCluster::changes`] reports
    /// (a burst folded over [`DEBOUNCE`], at most [`MAX_DEBOUNCE`]), every [`SwitchConfig::resync`], and every
    /// [`SwitchConfig::recheck`] while a GPU is held or after a failed pass (module docs).
    pub async fn run<F>(self, stop: F)
    where
        F: Future<Output = ()> + Send,
    {
        tokio::pin!(stop);
        let mut changes = Some(self.cluster.changes(&self.config.node_name, &self.config.namespace));
        loop {
            let wait = match self.reconcile_once().await {
                Ok(steps) if steps.values().any(|s| matches!(s, Step::Held(_))) => self.config.recheck,
                Ok(_) => self.config.resync,
                Err(error) => {
                    tracing::warn!(%error, "vfio-switch controller pass");
                    self.config.recheck
                }
            };
            tokio::select! {
                () = &mut stop => return,
                () = tokio::time::sleep(wait) => continue,
                () = next_change(&mut changes) => {}
            }
            // Fold a burst (a Job's status, its pod, the condition just written) into one pass.
            let burst = tokio::time::sleep(MAX_DEBOUNCE);
            tokio::pin!(burst);
            loop {
                tokio::select! {
                    () = &mut stop => return,
                    () = &mut burst => break,
                    () = tokio::time::sleep(DEBOUNCE) => break,
                    () = next_change(&mut changes) => {}
                }
            }
        }
    }

    /// [`Self::run`] on a task.
    pub fn spawn<F>(self, stop: F) -> tokio::task::JoinHandle<()>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        tokio::spawn(self.run(stop))
    }
}

/// The next trigger of `changes`; once the stream has ended, never (the resync is left).
async fn next_change(changes: &mut Option<Changes>) {
    if let Some(stream) = changes {
        if stream.next().await.is_some() {
            return;
        }
        tracing::warn!("vfio-switch: the change stream ended; passes run on the resync period only");
        *changes = None;
    }
    std::future::pending().await
}

// === the API server ===

/// [`SwitchCluster`] over the API server.
#[derive(Clone)]
pub struct KubeSwitchCluster {
    client: kube::Client,
}

impl std::fmt::Debug for KubeSwitchCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeSwitchCluster").finish_non_exhaustive()
    }
}

impl KubeSwitchCluster {
    /// Wraps a client.
    pub fn new(client: kube::Client) -> Self {
        Self { client }
    }

    fn jobs(&self, namespace: &str) -> kube::Api<Job> {
        kube::Api::namespaced(self.client.clone(), namespace)
    }

    /// The termination message (else the exit reason) of a failed pod of Job `name`.
    async fn pod_message(&self, namespace: &str, name: &str) -> Option<String> {
        let pods: kube::Api<Pod> = kube::Api::namespaced(self.client.clone(), namespace);
        let list =
            pods.list(&ListParams::default().labels(&format!("batch.kubernetes.io/job-name={name}"))).await;
        list.ok()?.items.iter().find_map(|pod| {
            let statuses = pod.status.as_ref()?.container_statuses.as_ref()?;
            statuses.iter().find_map(|s| {
                let terminated = s.state.as_ref()?.terminated.as_ref()?;
                let text = terminated
                    .message
                    .clone()
                    .or_else(|| terminated.reason.clone())
                    .map(|m| m.trim().to_owned())
                    .filter(|m| !m.is_empty())?;
                Some(format!("exit code {}: {text}", terminated.exit_code))
            })
        })
    }
}

/// Where a Job is, from its status.
pub fn job_phase(job: &Job) -> JobPhase {
    let Some(status) = &job.status else { return JobPhase::Active };
    let conditions = status.conditions.as_deref().unwrap_or_default();
    let holds = |t: &str| conditions.iter().find(|c| c.type_ == t && c.status == "True");
    if holds("Complete").is_some() || status.succeeded.unwrap_or(0) > 0 {
        return JobPhase::Succeeded;
    }
    if let Some(failed) = holds("Failed") {
        let reason = failed.reason.clone().unwrap_or_default();
        let message = failed.message.clone().unwrap_or_default();
        return JobPhase::Failed(format!("{reason}: {message}").trim_matches([' ', ':']).to_owned());
    }
    if status.failed.unwrap_or(0) > 0 {
        return JobPhase::Failed("its pod failed".into());
    }
    JobPhase::Active
}

/// A watcher event as a trigger: every event counts (the pass reads the current state); errors are logged
/// and dropped (the watcher retries with backoff).
fn trigger<K>(what: &'static str) -> impl FnMut(Result<watcher::Event<K>, watcher::Error>) -> Option<()> {
    move |event| match event {
        Ok(_) => Some(()),
        Err(error) => {
            tracing::warn!(%error, "vfio-switch: watch of {what}");
            None
        }
    }
}

#[tonic::async_trait]
impl SwitchCluster for KubeSwitchCluster {
    fn changes(&self, node: &str, namespace: &str) -> Changes {
        let jobs = watcher(
            self.jobs(namespace),
            watcher::Config::default().labels(&format!("{NODE_LABEL}={}", node_label_value(node))),
        )
        .default_backoff()
        .filter_map(trigger("switch Jobs"));
        let gpus: kube::Api<PhysicalGPU> = kube::Api::all(self.client.clone());
        let gpus = watcher(gpus, watcher::Config::default().fields(&format!("spec.nodeName={node}")))
            .default_backoff()
            .filter_map(trigger("PhysicalGPUs"));
        Box::pin(jobs.merge(gpus))
    }

    async fn list_gpus(&self, node: &str) -> Result<Option<Vec<PhysicalGPU>>, ControllerError> {
        let api: kube::Api<PhysicalGPU> = kube::Api::all(self.client.clone());
        match api.list(&ListParams::default().fields(&format!("spec.nodeName={node}"))).await {
            Ok(list) => Ok(Some(list.items)),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(None),
            Err(e) => Err(ControllerError::List { node: node.to_owned(), message: e.to_string() }),
        }
    }

    async fn get_job(&self, namespace: &str, name: &str) -> Result<Option<JobInfo>, ControllerError> {
        let err = |e: kube::Error| ControllerError::Job {
            action: "get",
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            message: e.to_string(),
        };
        let Some(job) = self.jobs(namespace).get_opt(name).await.map_err(err)? else { return Ok(None) };
        let target = job
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(TARGET_ANNOTATION))
            .and_then(|t| t.parse().ok());
        let phase = match job_phase(&job) {
            JobPhase::Failed(why) => match self.pod_message(namespace, name).await {
                Some(message) => JobPhase::Failed(message),
                None => JobPhase::Failed(why),
            },
            phase => phase,
        };
        Ok(Some(JobInfo { target, phase }))
    }

    async fn create_job(&self, job: &Job) -> Result<(), ControllerError> {
        let namespace = job.metadata.namespace.clone().unwrap_or_default();
        let name = job.metadata.name.clone().unwrap_or_default();
        match self.jobs(&namespace).create(&PostParams::default(), job).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
            Err(e) => Err(ControllerError::Job { action: "create", namespace, name, message: e.to_string() }),
        }
    }

    async fn delete_job(&self, namespace: &str, name: &str) -> Result<(), ControllerError> {
        let params = DeleteParams {
            propagation_policy: Some(PropagationPolicy::Background),
            ..DeleteParams::default()
        };
        match self.jobs(namespace).delete(name, &params).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            Err(e) => Err(ControllerError::Job {
                action: "delete",
                namespace: namespace.to_owned(),
                name: name.to_owned(),
                message: e.to_string(),
            }),
        }
    }

    async fn apply_condition(&self, gpu: &str, condition: &Condition) -> Result<(), ControllerError> {
        let api: kube::Api<PhysicalGPU> = kube::Api::all(self.client.clone());
        let body = json!({
            "apiVersion": format!("{}/{}", vgpu_api::DEFAULT_GROUP, vgpu_api::VERSION),
            "kind": "PhysicalGPU",
            "metadata": {"name": gpu},
            "status": {"conditions": [condition]},
        });
        api.patch_status(gpu, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&body))
            .await
            .map(drop)
            .map_err(|e| ControllerError::Condition { name: gpu.to_owned(), message: e.to_string() })
    }
}

// === in memory ===

/// An in-memory [`SwitchCluster`]: PhysicalGPUs, Jobs whose phase the test sets, applied conditions. Every
/// change (a GPU put, a Job created, deleted or moved to another phase, a condition that changed) is
/// reported on [`SwitchCluster::changes`], as the API server's watches would, unless
/// [`Self::silence`] turned that off.
#[derive(Debug)]
pub struct MemorySwitchCluster {
    inner: std::sync::Mutex<MemoryInner>,
    changed: tokio::sync::watch::Sender<u64>,
    silent: std::sync::atomic::AtomicBool,
}

impl Default for MemorySwitchCluster {
    fn default() -> Self {
        Self {
            inner: std::sync::Mutex::default(),
            changed: tokio::sync::watch::Sender::new(0),
            silent: std::sync::atomic::AtomicBool::new(false),
        }
    }
}

#[derive(Debug, Default)]
struct MemoryInner {
    gpus: BTreeMap<String, PhysicalGPU>,
    jobs: BTreeMap<(String, String), (Job, JobPhase)>,
    deleted: Vec<String>,
}

impl MemorySwitchCluster {
    fn lock(&self) -> std::sync::MutexGuard<'_, MemoryInner> {
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn notify(&self) {
        if !self.silent.load(std::sync::atomic::Ordering::SeqCst) {
            self.changed.send_modify(|n| *n += 1);
        }
    }

    /// Stops (`true`) or resumes reporting changes: a watch that misses events, which only the resync repairs.
    pub fn silence(&self, silent: bool) {
        self.silent.store(silent, std::sync::atomic::Ordering::SeqCst);
    }

    /// Adds or replaces a PhysicalGPU.
    pub fn put_gpu(&self, gpu: PhysicalGPU) {
        let name = gpu.metadata.name.clone().unwrap_or_default();
        self.lock().gpus.insert(name, gpu);
        self.notify();
    }

    /// PhysicalGPU `name`.
    pub fn gpu(&self, name: &str) -> Option<PhysicalGPU> {
        self.lock().gpus.get(name).cloned()
    }

    /// The Jobs, by namespace and name.
    pub fn jobs(&self) -> Vec<Job> {
        self.lock().jobs.values().map(|(j, _)| j.clone()).collect()
    }

    /// Sets the phase of Job `name` (as the Job controller would).
    pub fn set_job_phase(&self, namespace: &str, name: &str, phase: JobPhase) {
        if let Some(entry) = self.lock().jobs.get_mut(&(namespace.to_owned(), name.to_owned())) {
            entry.1 = phase;
        }
        self.notify();
    }

    /// The Jobs deleted so far, by name.
    pub fn deleted(&self) -> Vec<String> {
        self.lock().deleted.clone()
    }
}

#[tonic::async_trait]
impl SwitchCluster for MemorySwitchCluster {
    fn changes(&self, _node: &str, _namespace: &str) -> Changes {
        Box::pin(tokio_stream::wrappers::WatchStream::from_changes(self.changed.subscribe()).map(drop))
    }

    async fn list_gpus(&self, node: &str) -> Result<Option<Vec<PhysicalGPU>>, ControllerError> {
        Ok(Some(self.lock().gpus.values().filter(|g| g.spec.node_name == node).cloned().collect()))
    }

    async fn get_job(&self, namespace: &str, name: &str) -> Result<Option<JobInfo>, ControllerError> {
        Ok(self.lock().jobs.get(&(namespace.to_owned(), name.to_owned())).map(|(job, phase)| JobInfo {
            target: job
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(TARGET_ANNOTATION))
                .and_then(|t| t.parse().ok()),
            phase: phase.clone(),
        }))
    }

    async fn create_job(&self, job: &Job) -> Result<(), ControllerError> {
        let key = (
            job.metadata.namespace.clone().unwrap_or_default(),
            job.metadata.name.clone().unwrap_or_default(),
        );
        self.lock().jobs.entry(key).or_insert_with(|| (job.clone(), JobPhase::Active));
        self.notify();
        Ok(())
    }

    async fn delete_job(&self, namespace: &str, name: &str) -> Result<(), ControllerError> {
        let removed = {
            let mut inner = self.lock();
            let removed = inner.jobs.remove(&(namespace.to_owned(), name.to_owned())).is_some();
            if removed {
                inner.deleted.push(name.to_owned());
            }
            removed
        };
        if removed {
            self.notify();
        }
        Ok(())
    }

    async fn apply_condition(&self, gpu: &str, condition: &Condition) -> Result<(), ControllerError> {
        let mut inner = self.lock();
        let Some(object) = inner.gpus.get_mut(gpu) else {
            return Err(ControllerError::Condition { name: gpu.to_owned(), message: "not found".into() });
        };
        let status = object.status.get_or_insert_with(Default::default);
        let before = status.conditions.clone();
        status.conditions.retain(|c| c.type_ != condition.type_);
        status.conditions.push(condition.clone());
        let changed = before != status.conditions;
        drop(inner);
        if changed {
            self.notify();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use vgpu_api::{PhysicalGPUSpec, PhysicalGPUStatus};

    use super::*;

    const NODE: &str = "w1";
    const NS: &str = "d8-gpu";
    const JOB: &str = "vfio-switch-w1-0000-3b-00-0";

    fn gpu(passthrough: Option<bool>, driver: &str) -> PhysicalGPU {
        let mut gpu = PhysicalGPU::new(
            "w1-nvidia-2330-0000-3b-00-0",
            PhysicalGPUSpec {
                node_name: NODE.into(),
                index: 0,
                pci_address: "0000:3b:00.0".into(),
                vendor: "nvidia".into(),
                vendor_id: "10de".into(),
                vendor_name: "NVIDIA".into(),
                device_id: "2330".into(),
                device_name: "H100".into(),
                model: "h100".into(),
                subsystem: None,
                class_code: "030200".into(),
                numa_node: None,
                iommu_group: Some(7),
                passthrough,
            },
        );
        gpu.metadata.generation = Some(2);
        gpu.metadata.uid = Some("uid-1".into());
        gpu.status = Some(PhysicalGPUStatus { driver: Some(driver.into()), ..Default::default() });
        gpu
    }

    fn setup(g: PhysicalGPU) -> (Arc<MemorySwitchCluster>, SwitchController) {
        let cluster = Arc::new(MemorySwitchCluster::default());
        cluster.put_gpu(g);
        let controller =
            SwitchController::new(cluster.clone(), SwitchConfig::new(NODE, NS, "registry.local/vgpu:1"));
        (cluster, controller)
    }

    fn reason(cluster: &MemorySwitchCluster) -> Option<(ConditionStatus, String)> {
        let g = cluster.gpu("w1-nvidia-2330-0000-3b-00-0").unwrap();
        condition_of(&g).map(|c| (c.status, c.reason.clone().unwrap()))
    }

    #[tokio::test]
    async fn a_passthrough_wish_creates_a_job_and_success_becomes_the_condition() {
        let (cluster, controller) = setup(gpu(Some(true), "nvidia"));
        let steps = controller.reconcile_once().await.unwrap();
        assert_eq!(steps.values().collect::<Vec<_>>(), [&Step::Created(JOB.into())]);
        assert_eq!(reason(&cluster), Some((ConditionStatus::Unknown, "Switching".into())));
        let job = &cluster.jobs()[0];
        let spec = job.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
        assert_eq!(spec.node_name.as_deref(), Some(NODE));
        let container = &spec.containers[0];
        assert_eq!(container.name, "switch");
        assert_eq!(
            container.command.as_deref().unwrap(),
            [
                "/usr/bin/vgpu-node-agent",
                "vfio-switch",
                "--pci",
                "0000:3b:00.0",
                "--to",
                "vfio-pci",
                "--sysfs-root",
                "/host-sys",
                "--host-root",
                "/host-root"
            ]
        );
        assert_eq!(container.security_context.as_ref().unwrap().privileged, Some(true));
        assert_eq!(job.metadata.owner_references.as_ref().unwrap()[0].uid, "uid-1");

        let created = condition_of(&cluster.gpu("w1-nvidia-2330-0000-3b-00-0").unwrap()).cloned().unwrap();
        assert!(created.message.as_deref().unwrap().ends_with("from nvidia to vfio-pci"), "{created:?}");
        // Running: still switching, no second Job, the condition as written at creation.
        assert_eq!(
            controller.reconcile_once().await.unwrap()[&"w1-nvidia-2330-0000-3b-00-0".to_owned()],
            Step::Waiting(JOB.into())
        );
        assert_eq!(condition_of(&cluster.gpu("w1-nvidia-2330-0000-3b-00-0").unwrap()), Some(&created));
        assert_eq!(cluster.jobs().len(), 1);
        cluster.set_job_phase(NS, JOB, JobPhase::Succeeded);
        let steps = controller.reconcile_once().await.unwrap();
        assert_eq!(steps.values().collect::<Vec<_>>(), [&Step::Succeeded(JOB.into())]);
        assert_eq!(reason(&cluster), Some((ConditionStatus::True, "SwitchedToVfioPci".into())));
        assert_eq!(cluster.deleted(), [JOB]);
        // status.driver still says nvidia (the node agent has not scanned yet): the condition counts.
        assert!(controller.reconcile_once().await.unwrap().is_empty());
        assert!(cluster.jobs().is_empty());
    }

    #[derive(Debug)]
    struct FakeUsage(std::sync::Mutex<Result<Vec<String>, String>>);

    #[tonic::async_trait]
    impl GpuUsage for FakeUsage {
        async fn holders(&self, pci: &PciAddress) -> Result<Vec<String>, String> {
            assert_eq!(pci.to_string(), "0000:3b:00.0");
            self.0.lock().unwrap().clone()
        }
    }

    #[tokio::test]
    async fn a_held_gpu_waits_for_its_holders_before_going_to_vfio_pci() {
        let (cluster, controller) = setup(gpu(Some(true), "nvidia"));
        let usage =
            Arc::new(FakeUsage(std::sync::Mutex::new(Ok(vec!["claim ns/c".into(), "process 7".into()]))));
        let controller = controller.with_usage(usage.clone());
        let name = "w1-nvidia-2330-0000-3b-00-0".to_owned();
        let held = vec!["claim ns/c".to_owned(), "process 7".to_owned()];
        assert_eq!(controller.reconcile_once().await.unwrap()[&name], Step::Held(held));
        assert!(cluster.jobs().is_empty(), "a Job for a GPU in use");
        let g = cluster.gpu(&name).unwrap();
        let c = condition_of(&g).unwrap();
        assert_eq!((c.status, c.reason.as_deref()), (ConditionStatus::False, Some(REASON_IN_USE)));
        assert_eq!(
            c.message.as_deref(),
            Some("0000:3b:00.0 waits to be switched to vfio-pci: held by claim ns/c, process 7")
        );

        // Usage that cannot be told: still waiting.
        *usage.0.lock().unwrap() = Err("checkpoint unreadable".into());
        assert!(matches!(controller.reconcile_once().await.unwrap()[&name], Step::Held(_)));
        assert!(cluster.jobs().is_empty());

        // Released: the Job goes ahead.
        *usage.0.lock().unwrap() = Ok(Vec::new());
        assert_eq!(controller.reconcile_once().await.unwrap()[&name], Step::Created(JOB.into()));
        assert_eq!(reason(&cluster), Some((ConditionStatus::Unknown, "Switching".into())));

        // Back to nvidia is not held: a vfio-pci GPU has no claims or CUDA processes of ours.
        let (cluster, controller) = setup(gpu(Some(false), "vfio-pci"));
        *usage.0.lock().unwrap() = Ok(vec!["process 9".into()]);
        let controller = controller.with_usage(usage);
        assert_eq!(controller.reconcile_once().await.unwrap()[&name], Step::Created(JOB.into()));
        assert_eq!(cluster.jobs().len(), 1);
    }

    #[test]
    fn the_passthrough_set_has_this_nodes_nvidia_gpus_wished_for_or_on_vfio_pci() {
        let named = |name: &str, pci: &str, passthrough: Option<bool>, driver: &str| {
            let mut g = gpu(passthrough, driver);
            g.metadata.name = Some(name.into());
            g.spec.pci_address = pci.into();
            g
        };
        let mut other_node = named("o", "0000:05:00.0", Some(true), "nvidia");
        other_node.spec.node_name = "w2".into();
        let mut metax = named("m", "0000:06:00.0", Some(true), "metax");
        metax.spec.vendor = "metax".into();
        let gpus = [
            named("wished", "0000:01:00.0", Some(true), "nvidia"),
            named("bound", "0000:02:00.0", None, "vfio-pci"),
            named("back", "0000:03:00.0", Some(false), "vfio-pci"),
            named("plain", "0000:04:00.0", Some(false), "nvidia"),
            other_node,
            metax,
        ];
        let set: Vec<String> = passthrough_gpus(&gpus, NODE).iter().map(ToString::to_string).collect();
        assert_eq!(set, ["0000:01:00.0", "0000:02:00.0", "0000:03:00.0"]);
    }

    #[test]
    fn settings_the_api_server_would_refuse_are_refused_at_start() {
        let good = SwitchConfig::new(NODE, NS, "registry.local/vgpu:1");
        assert_eq!(good.validate(), Ok(()));
        let mut c = good.clone();
        c.binary = "/work/e2e/../target/debug/vgpu-node-agent".into();
        let err = c.validate().unwrap_err();
        assert_eq!(err.field, "binary");
        assert!(err.to_string().contains("without '.' or '..'"), "{err}");
        let mut c = good.clone();
        c.host_sys = PathBuf::from("sys");
        assert_eq!(c.validate().unwrap_err().field, "host sysfs");
        let mut c = good.clone();
        c.extra_host_paths = vec![PathBuf::from("/lib64"), PathBuf::from("/a/./b")];
        assert_eq!(c.validate().unwrap_err().field, "extra host path");
        let mut c = good.clone();
        c.namespace = "Bad_NS".into();
        assert_eq!(c.validate().unwrap_err().field, "namespace");
        let mut c = good;
        c.image = " ".into();
        assert_eq!(c.validate().unwrap_err().field, "image");
    }

    #[tokio::test]
    async fn a_failed_job_is_reported_and_kept_until_deleted() {
        let (cluster, controller) = setup(gpu(Some(true), "nvidia"));
        controller.reconcile_once().await.unwrap();
        cluster.set_job_phase(NS, JOB, JobPhase::Failed("exit code 1: no such PCI device".into()));
        let steps = controller.reconcile_once().await.unwrap();
        assert_eq!(steps.values().collect::<Vec<_>>(), [&Step::Failed(JOB.into())]);
        let g = cluster.gpu("w1-nvidia-2330-0000-3b-00-0").unwrap();
        let c = condition_of(&g).unwrap();
        assert_eq!((c.status, c.reason.as_deref()), (ConditionStatus::False, Some("SwitchFailed")));
        assert!(c.message.as_deref().unwrap().contains("no such PCI device"), "{c:?}");
        controller.reconcile_once().await.unwrap();
        assert_eq!(cluster.jobs().len(), 1, "kept, not retried");
        assert!(cluster.deleted().is_empty());
    }

    #[tokio::test]
    async fn a_class_wish_switches_unless_the_gpus_own_spec_says_otherwise() {
        let mut g = gpu(None, "nvidia");
        g.status.as_mut().unwrap().class_passthrough = Some(true);
        let (cluster, controller) = setup(g.clone());
        let steps = controller.reconcile_once().await.unwrap();
        assert_eq!(steps.values().collect::<Vec<_>>(), [&Step::Created(JOB.into())]);
        assert_eq!(cluster.jobs()[0].metadata.annotations.as_ref().unwrap()[TARGET_ANNOTATION], "vfio-pci");
        // spec.passthrough: false wins over the class wish: the GPU stays on nvidia.
        g.spec.passthrough = Some(false);
        let (cluster, controller) = setup(g);
        controller.reconcile_once().await.unwrap();
        assert!(cluster.jobs().is_empty());
        assert_eq!(reason(&cluster), Some((ConditionStatus::True, "SwitchedToNvidia".into())));
    }

    #[tokio::test]
    async fn nothing_happens_without_a_wish_for_other_vendors_or_when_already_there() {
        for g in [gpu(None, "nvidia"), gpu(Some(false), "nvidia"), gpu(Some(true), "vfio-pci")] {
            let (cluster, controller) = setup(g);
            assert!(controller.reconcile_once().await.unwrap().is_empty());
            assert!(cluster.jobs().is_empty());
        }
        let mut metax = gpu(Some(true), "metax");
        metax.spec.vendor = "metax".into();
        let (cluster, controller) = setup(metax);
        controller.reconcile_once().await.unwrap();
        assert!(cluster.jobs().is_empty());
        // Already on the target: the condition says so once.
        let (cluster, controller) = setup(gpu(Some(false), "nvidia"));
        controller.reconcile_once().await.unwrap();
        assert_eq!(reason(&cluster), Some((ConditionStatus::True, "SwitchedToNvidia".into())));
    }

    #[tokio::test]
    async fn a_flipped_wish_replaces_a_finished_job_and_waits_for_a_running_one() {
        let (cluster, controller) = setup(gpu(Some(true), "nvidia"));
        controller.reconcile_once().await.unwrap();
        let mut back = gpu(Some(false), "nvidia");
        back.metadata.generation = Some(3);
        back.status = cluster.gpu("w1-nvidia-2330-0000-3b-00-0").unwrap().status;
        back.status.as_mut().unwrap().driver = Some("vfio-pci".into());
        cluster.put_gpu(back);
        assert_eq!(
            controller.reconcile_once().await.unwrap().values().next(),
            Some(&Step::Waiting(JOB.into()))
        );
        cluster.set_job_phase(NS, JOB, JobPhase::Succeeded);
        assert_eq!(
            controller.reconcile_once().await.unwrap().values().next(),
            Some(&Step::Replaced(JOB.into()))
        );
        assert_eq!(
            controller.reconcile_once().await.unwrap().values().next(),
            Some(&Step::Created(JOB.into()))
        );
        let job = &cluster.jobs()[0];
        assert_eq!(job.metadata.annotations.as_ref().unwrap()[TARGET_ANNOTATION], "nvidia");
    }

    #[test]
    fn job_phases_follow_the_job_status() {
        let job = |status: serde_json::Value| -> Job {
            serde_json::from_value(json!({"metadata": {"name": "j"}, "status": status})).unwrap()
        };
        assert_eq!(job_phase(&job(json!({"active": 1}))), JobPhase::Active);
        assert_eq!(
            job_phase(&job(json!({"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}))),
            JobPhase::Succeeded
        );
        assert_eq!(
            job_phase(&job(
                json!({"failed": 1, "conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "message": "Job has reached the specified backoff limit"}]})
            )),
            JobPhase::Failed("BackoffLimitExceeded: Job has reached the specified backoff limit".into())
        );
        assert_eq!(job_phase(&job(json!({"failed": 1}))), JobPhase::Failed("its pod failed".into()));
    }

    #[test]
    fn extra_paths_and_no_host_root() {
        let mut config = SwitchConfig::new(NODE, NS, "busybox");
        config.mount_host_root = false;
        config.extra_host_paths = vec![PathBuf::from("/lib64")];
        config.host_sys = PathBuf::from("/tmp/fake/sys");
        config.container_sys = PathBuf::from("/tmp/fake/sys");
        let g = gpu(Some(true), "nvidia");
        let j = job(&config, &g, &"0000:3b:00.0".parse().unwrap(), SwitchTarget::VfioPci);
        let value = serde_json::to_value(&j).unwrap();
        let pod = &value["spec"]["template"]["spec"];
        assert_eq!(pod["volumes"][0]["hostPath"]["path"], "/tmp/fake/sys");
        assert_eq!(pod["volumes"][1]["hostPath"]["path"], "/lib64");
        assert_eq!(
            pod["containers"][0]["volumeMounts"][1],
            json!({"name": "extra-0", "mountPath": "/lib64", "readOnly": true})
        );
        let command = pod["containers"][0]["command"].as_array().unwrap();
        assert!(!command.iter().any(|a| a == "--host-root"), "{command:?}");
        assert_eq!(value["metadata"]["name"], JOB);
    }
}
