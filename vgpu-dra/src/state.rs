//! [`DeviceState`]: NodePrepareResources / NodeUnprepareResources, one claim at a time, under the
//! `pu.lock` flock, recorded in the checkpoint.
//!
//! # States of a claim
//!
//! ```text
//!            Prepare                     side effects done
//!  (absent) ─────────► PrepareStarted ─────────────────────► PrepareCompleted
//!     ▲                    │  failure: rollback                    │ Unprepare / stale sweep
//!     │                    ▼  start-up or next Prepare: rollback   ▼
//!     └──────────────── (absent) ◄──────────────────────────── (absent)
//! ```
//!
//! # Order of side effects
//!
//! | step | Prepare | Unprepare (and rollback) |
//! |---|---|---|
//! | 1 | take `pu.lock` (10 s limit), read the checkpoint | take `pu.lock`, read the checkpoint |
//! | 2 | `PrepareCompleted` → return the recorded devices; `PrepareStarted` → roll it back first | absent → done (NotFound is success) |
//! | 3 | read the ResourceClaim (API), check UID, allocation, pool, the sharing rule; resolve devices and limits; reject devices prepared for another claim; with vGPU devices, check the runtime files their mounts name ([`runtime_files::check`]) — no side effect yet | remove the CDI spec (NotFound is fine) |
//! | 4 | write `PrepareStarted` with the paths it will create and the planned devices | remove `<manager>/claims/<uid>` (NotFound is fine) |
//! | 5 | create `<manager>/claims/<uid>/<partition>/{config,vgpu_lock,vmem_node,sm_node}`, `config/pids.config` (partition keys: [`crate::partition`], from the consumer pods read in step 3) | drop the entry, write the checkpoint |
//! | 6 | write the CDI spec atomically (checked against the CDI rules first: [`vgpu_core::cdi::validate`]) | client mode: remove the claim's `<driver>/<uuid>` annotations (best effort) |
//! | 6a | client mode (gate `DevicePluginClientMode`): annotate the claim `<driver>/<uuid>: <partition>` (UUIDs minted in step 3, recorded in step 4) | |
//! | 7 | write `PrepareCompleted` with the devices; a failure in 5–7 rolls the claim back and fails only its entry | |
//!
//! At start-up ([`DeviceState::new`]) every `PrepareStarted` entry is rolled back, and when the recorded boot
//! ID differs from this boot's every entry is (the node rebooted: nothing prepared before survives). A
//! fault-injection hook ([`FaultPoint`]) stops a Prepare after step 4 or 6 as a crash would, so tests can
//! prove the recovery.
//!
//! Rules (contract §9): a vGPU claim reserved for more than one consumer fails with `claim cannot be used for
//! multiple Pods simultaneously`; a device (or device share) prepared for another claim fails with the other
//! claim named; only paths named after the claim's UID are ever removed.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::Arc,
};

use k8s_openapi::api::resource::v1::ResourceClaim;
use tracing::Instrument;
use vgpu_core::{abi::runtime_files, backend::VendorAdapter, model::ComputePolicy};

use crate::{
    cdi,
    checkpoint::{Checkpoint, CheckpointError, ClaimState, PreparedClaim, PreparedDevice},
    claims::ClaimSource,
    client_mode::{self, RegisterTable},
    config::DriverConfig,
    devices::AllocatableDevice,
    devices::AllocatableDevices,
    devices::DeviceError,
    lock::{LockError, PuLock},
    modes::{ClaimContext, ClaimDevice, ClaimMode, HostAction, ModeEdits, ModeError},
};
use vgpu_core::cdi::{ContainerEdits, DeviceNode, Mount};
use vgpu_core::dra::DeviceType;

/// The error text of the claim-sharing rule (upstream's words).
pub const SHARED_CLAIM_ERROR: &str = "claim cannot be used for multiple Pods simultaneously";

/// A claim as the kubelet names it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct ClaimRef {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID.
    pub uid: String,
}

impl ClaimRef {
    /// `namespace/name` with `uid`.
    pub fn new(namespace: &str, name: &str, uid: &str) -> Self {
        Self { namespace: namespace.to_owned(), name: name.to_owned(), uid: uid.to_owned() }
    }
}

/// Why one claim could not be prepared or unprepared (the text the kubelet gets in the claim's `error`).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClaimFailure {
    /// `pu.lock` could not be taken.
    #[error(transparent)]
    Lock(#[from] LockError),
    /// The checkpoint could not be read or written.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    /// The API could not be read.
    #[error(transparent)]
    Api(#[from] crate::claims::ClaimError),
    /// The claim does not exist.
    #[error("ResourceClaim {0} not found")]
    NotFound(String),
    /// The claim exists with another UID (it was re-created).
    #[error("ResourceClaim {claim} has UID {found}, the kubelet asked for {expected}")]
    Uid {
        /// `namespace/name`.
        claim: String,
        /// The API's UID.
        found: String,
        /// The kubelet's UID.
        expected: String,
    },
    /// The claim has no allocation.
    #[error("ResourceClaim {0} is not allocated")]
    NotAllocated(String),
    /// An allocation result of this driver is in another pool.
    #[error("ResourceClaim {claim}: device {device} is in pool {pool:?}, not this node's pool {node:?}")]
    Pool {
        /// `namespace/name`.
        claim: String,
        /// The device.
        device: String,
        /// Its pool.
        pool: String,
        /// This node.
        node: String,
    },
    /// The claim-sharing rule.
    #[error("ResourceClaim {claim}: {SHARED_CLAIM_ERROR} (reserved for {consumers} consumers)")]
    Shared {
        /// `namespace/name`.
        claim: String,
        /// How many consumers it is reserved for.
        consumers: usize,
    },
    /// The claim has vGPU devices and the runtime files their containers mount are not installed.
    #[error("ResourceClaim {claim}: {source}")]
    RuntimeFiles {
        /// `namespace/name`.
        claim: String,
        /// Which file and why.
        #[source]
        source: vgpu_core::abi::runtime_files::RuntimeFileError,
    },
    /// A device (share) is already prepared for another claim, or twice in this one.
    #[error("ResourceClaim {claim}: device {device}{share} is already prepared for claim {other}")]
    Overlap {
        /// `namespace/name`.
        claim: String,
        /// The device.
        device: String,
        /// ` (share <id>)` or empty.
        share: String,
        /// The other claim (`namespace/name (uid)`).
        other: String,
    },
    /// A device or consumed capacity is wrong.
    #[error("ResourceClaim {claim}: {source}")]
    Device {
        /// `namespace/name`.
        claim: String,
        /// What is wrong.
        #[source]
        source: DeviceError,
    },
    /// A file system step failed.
    #[error("{path}: {action}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// What was being done.
        action: &'static str,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A claim directory's mode could not be set safely (e.g. a symbolic link was planted at its path).
    #[error(transparent)]
    Permissions(#[from] vgpu_core::abi::perms::PermsError),
    /// The CDI spec could not be written.
    #[error(transparent)]
    Cdi(#[from] cdi::CdiError),
    /// The whole call could not start (`pu.lock` not taken); the same text for every claim of the call.
    #[error("{0}")]
    Batch(String),
    /// A mode could not plan, apply or revert a host action ([`crate::modes`]).
    #[error("ResourceClaim {claim}: {source}")]
    Mode {
        /// `namespace/name` (or the UID when only that is known).
        claim: String,
        /// What failed.
        #[source]
        source: crate::modes::ModeError,
    },
    /// The fault-injection hook stopped Prepare (tests only).
    #[error("fault injected at {0:?}: stopped as a crash would")]
    Injected(FaultPoint),
}

/// Where the fault-injection hook is asked whether to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FaultPoint {
    /// `PrepareStarted` is written, nothing else is done.
    AfterPrepareStarted,
    /// The first host action of a mode ([`crate::modes`]) is applied, the others and the files are not.
    AfterHostAction,
    /// Directories and the CDI spec are written, `PrepareCompleted` is not.
    AfterSideEffects,
}

/// The fault-injection hook: called with the point and the claim UID; `true` stops Prepare there without
/// any cleanup, as a crash would.
pub type FaultHook = Arc<dyn Fn(FaultPoint, &str) -> bool + Send + Sync>;

/// **Test only.** The env variable that makes the `vgpu-kubelet-plugin` binary hang at a fault point so a
/// test can SIGKILL it there: `prepare-started` ([`FaultPoint::AfterPrepareStarted`]), `host-action`
/// ([`FaultPoint::AfterHostAction`]) or `side-effects`
/// ([`FaultPoint::AfterSideEffects`]). Never set it in a deployment: the first Prepare that reaches the
/// point blocks forever (its thread sleeps) and holds `pu.lock`.
pub const TEST_PAUSE_ENV: &str = "VGPU_DRA_TEST_PAUSE_AT";

/// **Test only.** The hook of [`TEST_PAUSE_ENV`] when it is set (`None` when unset or empty): at its point
/// it logs, then blocks the calling thread for good, as if the process had stopped there.
pub fn test_pause_hook_from_env() -> Result<Option<FaultHook>, String> {
    let value = std::env::var(TEST_PAUSE_ENV).unwrap_or_default();
    let point = match value.as_str() {
        "" => return Ok(None),
        "prepare-started" => FaultPoint::AfterPrepareStarted,
        "host-action" => FaultPoint::AfterHostAction,
        "side-effects" => FaultPoint::AfterSideEffects,
        other => {
            return Err(format!(
                "{TEST_PAUSE_ENV}={other:?}: expected prepare-started, host-action or side-effects (test only; unset it)"
            ));
        }
    };
    tracing::warn!(env = TEST_PAUSE_ENV, ?point, "test-only fault injection armed: Prepare will hang there");
    Ok(Some(Arc::new(move |at, uid| {
        if at == point {
            tracing::error!(
                ?point,
                claim = uid,
                "{TEST_PAUSE_ENV}: Prepare paused here for good (test only)"
            );
            loop {
                std::thread::sleep(std::time::Duration::from_secs(3600));
            }
        }
        false
    })))
}

/// Start-up recovery or the stale-claim sweep failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StateError {
    /// See [`ClaimFailure`].
    #[error(transparent)]
    Claim(#[from] ClaimFailure),
}

/// What one Prepare call returns per claim UID.
pub type PrepareResults = BTreeMap<String, Result<Vec<PreparedDevice>, ClaimFailure>>;
/// What one Unprepare call returns per claim UID.
pub type UnprepareResults = BTreeMap<String, Result<(), ClaimFailure>>;

/// Prepare/Unprepare state of the node (see the module docs).
pub struct DeviceState {
    config: Arc<DriverConfig>,
    devices: Arc<AllocatableDevices>,
    vendor: Arc<dyn VendorAdapter>,
    claims: Arc<dyn ClaimSource>,
    boot_id: String,
    serial: tokio::sync::Mutex<()>,
    fault: Option<FaultHook>,
    metrics: Option<Arc<crate::metrics::DriverMetrics>>,
    register: Arc<RegisterTable>,
    modes: Vec<Arc<dyn ClaimMode>>,
}

impl std::fmt::Debug for DeviceState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceState")
            .field("node", &self.config.node_name)
            .field("devices", &self.devices.len())
            .field("boot_id", &self.boot_id)
            .finish_non_exhaustive()
    }
}

/// One allocation result resolved to a GPU, before any side effect.
#[derive(Debug)]
struct Planned {
    device: PreparedDevice,
    partition: String,
    register_uuid: String,
    ordinal: usize,
    cores: Option<u64>,
    memory_mib: Option<u64>,
    cdi_name: String,
    /// The device the result names (its kind and GPU: index, minor).
    allocatable: AllocatableDevice,
}

impl DeviceState {
    /// Opens the state: reads the checkpoint under `pu.lock`, rolls back every `PrepareStarted` claim (and
    /// every claim when the node rebooted since the last write), records this boot's ID.
    pub async fn new(
        config: Arc<DriverConfig>,
        devices: Arc<AllocatableDevices>,
        vendor: Arc<dyn VendorAdapter>,
        claims: Arc<dyn ClaimSource>,
    ) -> Result<Self, StateError> {
        Self::with_modes(config, devices, vendor, claims, Vec::new()).await
    }

    /// Opens the state with claim modes installed ([`crate::modes`]), in the order their actions are planned
    /// and applied; start-up recovery (as [`DeviceState::new`]) can then revert their recorded actions.
    pub async fn with_modes(
        config: Arc<DriverConfig>,
        devices: Arc<AllocatableDevices>,
        vendor: Arc<dyn VendorAdapter>,
        claims: Arc<dyn ClaimSource>,
        modes: Vec<Arc<dyn ClaimMode>>,
    ) -> Result<Self, StateError> {
        let boot_id = crate::checkpoint::read_boot_id(&config.boot_id_path);
        let state = Self {
            config,
            devices,
            vendor,
            claims,
            boot_id,
            serial: tokio::sync::Mutex::new(()),
            fault: None,
            metrics: None,
            register: Arc::new(RegisterTable::default()),
            modes,
        };
        state.recover().await?;
        state.refresh();
        Ok(state)
    }

    /// The installed claim modes' names, in order.
    pub fn mode_names(&self) -> Vec<&'static str> {
        self.modes.iter().map(|m| m.name()).collect()
    }

    /// Installs the fault-injection hook (tests).
    #[must_use]
    pub fn with_fault_hook(mut self, hook: FaultHook) -> Self {
        self.fault = Some(hook);
        self
    }

    /// Records every Prepare/Unprepare in `metrics` ([`crate::metrics`]) and sets its prepared-claims gauge
    /// from the checkpoint now.
    #[must_use]
    pub fn with_metrics(mut self, metrics: Arc<crate::metrics::DriverMetrics>) -> Self {
        self.metrics = Some(metrics);
        self.refresh();
        self
    }

    /// The register UUIDs of the prepared claims (client mode): the resolver the registry server uses.
    pub fn register_table(&self) -> Arc<RegisterTable> {
        Arc::clone(&self.register)
    }

    /// Sets the prepared-claims gauge and rebuilds the register table from the checkpoint (completed
    /// entries); the caller holds `serial` or nothing else runs yet.
    fn refresh(&self) {
        match Checkpoint::load(&self.config.checkpoint_path()) {
            Ok(cp) => {
                if let Some(metrics) = &self.metrics {
                    metrics.set_prepared_claims(
                        cp.claims()
                            .values()
                            .filter(|c| c.checkpoint_state == ClaimState::PrepareCompleted)
                            .count(),
                    );
                }
                self.register.rebuild(&cp, &self.config);
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the checkpoint to count prepared claims and register UUIDs")
            }
        }
    }

    /// Counts one request's results and duration.
    fn record<T>(
        &self,
        operation: crate::metrics::Operation,
        out: &BTreeMap<String, Result<T, ClaimFailure>>,
        timer: &crate::metrics::Timer,
    ) {
        if let Some(metrics) = &self.metrics {
            let ok = out.values().filter(|r| r.is_ok()).count();
            metrics.request(operation, ok, out.len() - ok, timer.elapsed());
        }
        self.refresh();
    }

    /// The configuration.
    pub fn config(&self) -> &DriverConfig {
        &self.config
    }

    /// The devices claims are resolved against.
    pub fn devices(&self) -> &AllocatableDevices {
        &self.devices
    }

    async fn recover(&self) -> Result<(), StateError> {
        let _serial = self.serial.lock().await;
        let _lock = PuLock::acquire(&self.config.lock_path(), self.config.lock_timeout)
            .await
            .map_err(ClaimFailure::from)?;
        let mut cp = Checkpoint::load(&self.config.checkpoint_path()).map_err(ClaimFailure::from)?;
        let rebooted = cp.rebooted(&self.boot_id);
        if rebooted {
            tracing::warn!(recorded = cp.boot_id(), current = %self.boot_id, "node rebooted since the checkpoint was written: dropping every prepared claim");
        }
        let doomed: Vec<String> = cp
            .claims()
            .iter()
            .filter(|(_, c)| rebooted || c.checkpoint_state == ClaimState::PrepareStarted)
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in &doomed {
            if let Some(claim) = cp.claims_mut().remove(uid) {
                tracing::info!(claim = %uid, state = ?claim.checkpoint_state, "rolling back");
                self.undo(uid, &claim).await?;
            }
        }
        cp.set_boot_id(&self.boot_id);
        cp.store(&self.config.checkpoint_path()).map_err(ClaimFailure::from)?;
        Ok(())
    }

    /// The checkpoint as it is on disk now.
    pub async fn checkpoint(&self) -> Result<Checkpoint, CheckpointError> {
        let _serial = self.serial.lock().await;
        Checkpoint::load(&self.config.checkpoint_path())
    }

    /// Prepares every claim; each gets its own result (one failing claim fails only its entry).
    pub async fn prepare(&self, claims: &[ClaimRef]) -> PrepareResults {
        let timer = crate::metrics::Timer::start();
        let mut out = BTreeMap::new();
        let _serial = self.serial.lock().await;
        let _lock = match PuLock::acquire(&self.config.lock_path(), self.config.lock_timeout).await {
            Ok(lock) => lock,
            Err(e) => {
                let text = e.to_string();
                for c in claims {
                    out.insert(c.uid.clone(), Err(ClaimFailure::Batch(text.clone())));
                }
                self.record(crate::metrics::Operation::Prepare, &out, &timer);
                return out;
            }
        };
        for claim in claims {
            // Gate ContextualLogging: every line logged while preparing the claim names it.
            let span = self.config.claim_span(
                crate::metrics::Operation::Prepare,
                &claim.uid,
                &claim.namespace,
                &claim.name,
            );
            let result = self.prepare_one(claim).instrument(span).await;
            let injected = matches!(result, Err(ClaimFailure::Injected(_)));
            out.insert(claim.uid.clone(), result);
            if injected {
                // A crash stops everything: the remaining claims are not touched.
                break;
            }
        }
        self.record(crate::metrics::Operation::Prepare, &out, &timer);
        out
    }

    async fn prepare_one(&self, claim: &ClaimRef) -> Result<Vec<PreparedDevice>, ClaimFailure> {
        let path = self.config.checkpoint_path();
        let mut cp = Checkpoint::load(&path)?;
        match cp.claims().get(&claim.uid) {
            Some(c) if c.checkpoint_state == ClaimState::PrepareCompleted => {
                return Ok(c.prepared_devices.clone());
            }
            Some(_) => {
                tracing::info!(claim = %claim.uid, "rolling back a Prepare that did not complete");
                if let Some(started) = cp.claims_mut().remove(&claim.uid) {
                    self.undo(&claim.uid, &started).await?;
                }
                cp.store(&path)?;
            }
            None => {}
        }
        let object = self.fetch(claim).await?;
        let mut planned = self.plan(claim, &object)?;
        if planned.is_empty() {
            return Ok(Vec::new());
        }
        self.check_overlap(claim, &planned, &cp)?;
        let claim_dir = self.config.claim_dir(&claim.uid);
        let spec_path = self.config.cdi_spec_path(&claim.uid);
        let has_vgpu = planned.iter().any(|p| p.allocatable.kind == DeviceType::Vgpu);
        if has_vgpu {
            // The CDI spec mounts them: missing, the runtime would create directories in their place.
            runtime_files::check(&self.config.manager_dir, &self.config.library_version, true).map_err(
                |source| ClaimFailure::RuntimeFiles {
                    claim: format!("{}/{}", claim.namespace, claim.name),
                    source,
                },
            )?;
        }
        let mut register_uuids = BTreeMap::new();
        if has_vgpu {
            self.assign_partitions(claim, &object, &mut planned).await;
            if self.config.client_mode() {
                register_uuids = self.mint_register_uuids(&mut planned)?;
            }
        }
        let mut paths = Vec::new();
        if has_vgpu {
            paths.push(claim_dir.display().to_string());
        }
        paths.push(spec_path.display().to_string());
        let claim_devices = Self::claim_devices(&planned);
        let ctx = ClaimContext { claim, object: &object, devices: &claim_devices, config: &self.config };
        let host_actions = self.plan_modes(&ctx)?;
        let mut entry = PreparedClaim::started(&claim.namespace, &claim.name, paths);
        entry.prepared_devices = planned.iter().map(|p| p.device.clone()).collect();
        entry.status = object.status.as_ref().and_then(|s| serde_json::to_value(s).ok());
        entry.register_uuids = register_uuids;
        entry.host_actions = host_actions;
        cp.claims_mut().insert(claim.uid.clone(), entry.clone());
        cp.store(&path)?;
        self.fault_point(FaultPoint::AfterPrepareStarted, &claim.uid)?;

        let mut done = match self.apply_modes(&ctx, &entry.host_actions) {
            Ok(edits) => self.side_effects(claim, &object, &planned, &claim_dir, &spec_path, edits),
            Err(ClaimFailure::Injected(point)) => return Err(ClaimFailure::Injected(point)),
            Err(e) => Err(e),
        };
        if done.is_ok() && !entry.register_uuids.is_empty() {
            let driver = &self.config.driver_name;
            let changes = entry
                .register_uuids
                .iter()
                .map(|(uuid, key)| (client_mode::annotation_key(driver, uuid), Some(key.clone())))
                .collect();
            done = self
                .claims
                .annotate(&claim.namespace, &claim.name, &claim.uid, &changes)
                .await
                .map_err(ClaimFailure::from);
        }
        if let Err(e) = done {
            tracing::warn!(claim = %claim.uid, error = %e, "prepare failed; rolling back");
            self.undo(&claim.uid, &entry).await?;
            cp.claims_mut().remove(&claim.uid);
            cp.store(&path)?;
            return Err(e);
        }
        self.fault_point(FaultPoint::AfterSideEffects, &claim.uid)?;
        entry.checkpoint_state = ClaimState::PrepareCompleted;
        let devices = entry.prepared_devices.clone();
        cp.claims_mut().insert(claim.uid.clone(), entry);
        cp.store(&path)?;
        Ok(devices)
    }

    /// The modes' view of the planned devices.
    fn claim_devices(planned: &[Planned]) -> Vec<ClaimDevice> {
        planned
            .iter()
            .map(|p| ClaimDevice {
                request: p.device.request_names.first().cloned().unwrap_or_default(),
                device: p.allocatable.clone(),
                share_id: p.device.share_id.clone(),
                cdi_name: p.cdi_name.clone(),
            })
            .collect()
    }

    /// Every installed mode's actions for the claim, in mode order (no side effect).
    fn plan_modes(&self, ctx: &ClaimContext<'_>) -> Result<Vec<HostAction>, ClaimFailure> {
        let mut actions = Vec::new();
        for mode in &self.modes {
            let planned = mode.plan(ctx).map_err(|source| ClaimFailure::Mode {
                claim: format!("{}/{}", ctx.claim.namespace, ctx.claim.name),
                source,
            })?;
            actions.extend(
                planned.into_iter().map(|action| HostAction { mode: mode.name().to_owned(), action }),
            );
        }
        Ok(actions)
    }

    fn mode(&self, name: &str) -> Option<&Arc<dyn ClaimMode>> {
        self.modes.iter().find(|m| m.name() == name)
    }

    /// Applies the recorded actions in order; the fault point [`FaultPoint::AfterHostAction`] follows the
    /// first one.
    fn apply_modes(&self, ctx: &ClaimContext<'_>, actions: &[HostAction]) -> Result<ModeEdits, ClaimFailure> {
        let name = format!("{}/{}", ctx.claim.namespace, ctx.claim.name);
        let mut edits = ModeEdits::default();
        for (i, recorded) in actions.iter().enumerate() {
            let mode = self.mode(&recorded.mode).ok_or_else(|| ClaimFailure::Mode {
                claim: name.clone(),
                source: not_installed(&recorded.mode),
            })?;
            let applied = mode
                .apply(ctx, &recorded.action)
                .map_err(|source| ClaimFailure::Mode { claim: name.clone(), source })?;
            edits.merge(applied);
            if i == 0 {
                self.fault_point(FaultPoint::AfterHostAction, &ctx.claim.uid)?;
            }
        }
        Ok(edits)
    }

    /// Reverts recorded actions newest first; the first failure stops (the entry is kept for a retry).
    fn revert_modes(&self, uid: &str, entry: &PreparedClaim) -> Result<(), ClaimFailure> {
        let name = if entry.name.is_empty() {
            uid.to_owned()
        } else {
            format!("{}/{}", entry.namespace, entry.name)
        };
        for recorded in entry.host_actions.iter().rev() {
            let mode = self.mode(&recorded.mode).ok_or_else(|| ClaimFailure::Mode {
                claim: name.clone(),
                source: not_installed(&recorded.mode),
            })?;
            mode.revert(&recorded.action)
                .map_err(|source| ClaimFailure::Mode { claim: name.clone(), source })?;
        }
        Ok(())
    }

    /// Sets each vGPU device's partition from the claim's consumer pods ([`crate::partition`]); a consumer
    /// that cannot be read is left out (its requests get their fallback partition).
    async fn assign_partitions(&self, claim: &ClaimRef, object: &ResourceClaim, planned: &mut [Planned]) {
        let requests: std::collections::BTreeSet<String> = planned
            .iter()
            .filter(|p| p.allocatable.kind == DeviceType::Vgpu)
            .filter_map(|p| p.device.request_names.first())
            .map(|r| crate::partition::main_request(r).to_owned())
            .collect();
        let consumers = object.status.as_ref().and_then(|s| s.reserved_for.as_ref());
        let mut pods = Vec::new();
        for consumer in consumers.into_iter().flatten().filter(|c| c.resource == "pods") {
            match self.claims.pod(&claim.namespace, &consumer.name).await {
                Ok(Some(pod)) if pod.metadata.uid.as_deref() == Some(consumer.uid.as_str()) => pods.push(pod),
                Ok(_) => {
                    tracing::warn!(claim = %claim.uid, pod = %consumer.name, "consumer pod not found (or re-created): its containers get per-request partitions")
                }
                Err(e) => {
                    tracing::warn!(claim = %claim.uid, pod = %consumer.name, error = %e, "cannot read the consumer pod: its containers get per-request partitions")
                }
            }
        }
        let partitions = crate::partition::resolve(object, &requests, &pods);
        for p in planned.iter_mut().filter(|p| p.allocatable.kind == DeviceType::Vgpu) {
            let main =
                p.device.request_names.first().map(|r| crate::partition::main_request(r)).unwrap_or_default();
            if let Some(key) = partitions.by_request.get(main) {
                p.partition.clone_from(key);
            }
        }
    }

    /// Client mode: one fresh register UUID per vGPU partition, set on its devices; returns UUID → key.
    fn mint_register_uuids(&self, planned: &mut [Planned]) -> Result<BTreeMap<String, String>, ClaimFailure> {
        let mut by_key: BTreeMap<String, String> = BTreeMap::new();
        for p in planned.iter_mut().filter(|p| p.allocatable.kind == DeviceType::Vgpu) {
            if !by_key.contains_key(&p.partition) {
                let source = Path::new(client_mode::KERNEL_UUID);
                let uuid = client_mode::mint_uuid(source).map_err(|source_err| ClaimFailure::Io {
                    path: source.to_path_buf(),
                    action: "mint a register UUID",
                    source: source_err,
                })?;
                by_key.insert(p.partition.clone(), uuid);
            }
            p.register_uuid.clone_from(&by_key[&p.partition]);
        }
        Ok(by_key.into_iter().map(|(key, uuid)| (uuid, key)).collect())
    }

    /// Undoes a claim's Prepare: removes its recorded paths, then (client mode) its register-UUID
    /// annotations, best effort (the claim may be gone; a stale annotation names a UUID nobody resolves).
    async fn undo(&self, uid: &str, entry: &PreparedClaim) -> Result<(), ClaimFailure> {
        self.revert_modes(uid, entry)?;
        self.remove_paths(uid, entry)?;
        if !entry.register_uuids.is_empty() && !entry.name.is_empty() {
            let changes = entry
                .register_uuids
                .keys()
                .map(|uuid| (client_mode::annotation_key(&self.config.driver_name, uuid), None))
                .collect();
            if let Err(e) = self.claims.annotate(&entry.namespace, &entry.name, uid, &changes).await {
                tracing::warn!(claim = %uid, error = %e, "cannot remove the register-UUID annotations");
            }
        }
        Ok(())
    }

    fn fault_point(&self, point: FaultPoint, uid: &str) -> Result<(), ClaimFailure> {
        match &self.fault {
            Some(hook) if hook(point, uid) => Err(ClaimFailure::Injected(point)),
            _ => Ok(()),
        }
    }

    async fn fetch(&self, claim: &ClaimRef) -> Result<ResourceClaim, ClaimFailure> {
        let name = format!("{}/{}", claim.namespace, claim.name);
        let object = self
            .claims
            .get(&claim.namespace, &claim.name)
            .await?
            .ok_or_else(|| ClaimFailure::NotFound(name.clone()))?;
        let found = object.metadata.uid.clone().unwrap_or_default();
        if found != claim.uid {
            return Err(ClaimFailure::Uid { claim: name, found, expected: claim.uid.clone() });
        }
        Ok(object)
    }

    /// Resolves this driver's allocation results (pure: no side effect).
    fn plan(&self, claim: &ClaimRef, object: &ResourceClaim) -> Result<Vec<Planned>, ClaimFailure> {
        let name = format!("{}/{}", claim.namespace, claim.name);
        let status = object.status.as_ref();
        let results = status
            .and_then(|s| s.allocation.as_ref())
            .ok_or_else(|| ClaimFailure::NotAllocated(name.clone()))?
            .devices
            .as_ref()
            .and_then(|d| d.results.as_deref())
            .unwrap_or_default();
        let mut planned = Vec::new();
        let mut ordinals: BTreeMap<&str, usize> = BTreeMap::new();
        for (position, result) in results.iter().enumerate() {
            if result.driver != self.config.driver_name {
                continue;
            }
            if result.pool != self.config.node_name {
                return Err(ClaimFailure::Pool {
                    claim: name,
                    device: result.device.clone(),
                    pool: result.pool.clone(),
                    node: self.config.node_name.clone(),
                });
            }
            let device = self.devices.get(&result.device).ok_or_else(|| ClaimFailure::Device {
                claim: name.clone(),
                source: DeviceError::UnknownDevice(result.device.clone()),
            })?;
            let consumed = result.consumed_capacity.iter().flatten().map(|(k, v)| (k.as_str(), v.0.as_str()));
            let limits = self
                .devices
                .limits(&result.device, consumed)
                .map_err(|source| ClaimFailure::Device { claim: name.clone(), source })?;
            let ordinal = ordinals.entry(result.request.as_str()).or_insert(0);
            let id = cdi::device_id(&result.request, &result.device, result.share_id.as_deref(), position);
            let cdi_name = cdi::device_name(&claim.uid, &id);
            planned.push(Planned {
                device: PreparedDevice {
                    request_names: vec![result.request.clone()],
                    pool_name: result.pool.clone(),
                    device_name: result.device.clone(),
                    share_id: result.share_id.clone(),
                    cdi_device_ids: vec![cdi::qualified(&cdi_name)],
                    uuid: device.gpu.uuid.clone(),
                },
                partition: crate::partition::fallback_key(crate::partition::main_request(&result.request)),
                register_uuid: String::new(),
                ordinal: *ordinal,
                cores: limits.cores,
                memory_mib: limits.memory_mib,
                cdi_name,
                allocatable: device.clone(),
            });
            *ordinal += 1;
        }
        let consumers = status.and_then(|s| s.reserved_for.as_ref()).map_or(0, Vec::len);
        // With NRI the partitions are per container (made at CreateContainer), so several pods may share.
        if consumers > 1
            && !self.config.nri()
            && planned.iter().any(|p| p.allocatable.kind == DeviceType::Vgpu)
        {
            return Err(ClaimFailure::Shared { claim: name, consumers });
        }
        Ok(planned)
    }

    fn check_overlap(
        &self,
        claim: &ClaimRef,
        planned: &[Planned],
        cp: &Checkpoint,
    ) -> Result<(), ClaimFailure> {
        let name = format!("{}/{}", claim.namespace, claim.name);
        let clash = |a: &PreparedDevice, b: &PreparedDevice| {
            a.device_name == b.device_name
                && (a.share_id.is_none() || b.share_id.is_none() || a.share_id == b.share_id)
        };
        let overlap = |device: &PreparedDevice, other: String| ClaimFailure::Overlap {
            claim: name.clone(),
            device: device.device_name.clone(),
            share: device.share_id.as_ref().map(|s| format!(" (share {s})")).unwrap_or_default(),
            other,
        };
        for (i, p) in planned.iter().enumerate() {
            if planned[..i].iter().any(|q| clash(&p.device, &q.device)) {
                return Err(overlap(&p.device, format!("{name} ({}) itself", claim.uid)));
            }
            for (uid, other) in cp.claims() {
                if uid != &claim.uid && other.prepared_devices.iter().any(|d| clash(&p.device, d)) {
                    return Err(overlap(&p.device, format!("{}/{} ({uid})", other.namespace, other.name)));
                }
            }
        }
        Ok(())
    }

    fn side_effects(
        &self,
        claim: &ClaimRef,
        object: &ResourceClaim,
        planned: &[Planned],
        claim_dir: &Path,
        spec_path: &Path,
        edits: ModeEdits,
    ) -> Result<(), ClaimFailure> {
        let mut vgpus = planned.iter().filter(|p| p.allocatable.kind == DeviceType::Vgpu).peekable();
        if self.config.nri() {
            // The NRI hook makes each container's partition under the claim directory at CreateContainer.
            if vgpus.peek().is_some() {
                make_dir(claim_dir)?;
            }
        } else {
            for p in vgpus {
                crate::partition::create(&claim_dir.join(&p.partition)).map_err(|e| ClaimFailure::Io {
                    path: e.path,
                    action: e.action,
                    source: e.source,
                })?;
            }
        }
        let mut spec = self.claim_spec(claim, object, planned);
        crate::modes::append(&mut spec.container_edits, edits.common);
        for (name, device_edits) in edits.devices {
            if let Some(device) = spec.devices.iter_mut().find(|d| d.name == name) {
                crate::modes::append(&mut device.container_edits, device_edits);
            }
        }
        cdi::write_spec(spec_path, &claim.uid, &spec)?;
        Ok(())
    }

    /// The claim's CDI spec (see [`crate::cdi`] for the edits).
    fn claim_spec(
        &self,
        claim: &ClaimRef,
        object: &ResourceClaim,
        planned: &[Planned],
    ) -> vgpu_core::cdi::Spec {
        let cfg = &self.config;
        let host = &cfg.host_manager_dir;
        let ratio = format!("{:.2}", f64::from(cfg.memory_ratio) / 100.0);
        let oversold = if cfg.memory_oversold() { "TRUE" } else { "FALSE" };
        let policy: ComputePolicy = object
            .metadata
            .annotations
            .iter()
            .flatten()
            .find(|(k, _)| k.ends_with("/vgpu-compute-policy"))
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or_default();
        let mut common = ContainerEdits { device_nodes: self.control_nodes(), ..ContainerEdits::default() };
        if planned.iter().any(|p| p.allocatable.kind == DeviceType::Vgpu) {
            common.env = [
                ("LD_PRELOAD", cdi::CONTROL_LIBRARY.to_owned()),
                ("MANAGER_COMPATIBILITY_MODE", cfg.compatibility_mode.to_string()),
                ("MANAGER_VISIBLE_DEVICES", String::new()),
                ("CUDA_MEM_RATIO", ratio.clone()),
                ("CUDA_CORE_LIMIT", String::new()),
                ("CUDA_CORE_SOFT_LIMIT", String::new()),
                ("CUDA_MEM_LIMIT", String::new()),
                ("CUDA_MEM_OVERSOLD", oversold.to_owned()),
                ("VMEMORY_NODE_ENABLED", "TRUE".to_owned()),
                ("CUDA_SM_SHARED_BUCKET", "TRUE".to_owned()),
                ("MANAGER_VGPU_CLAIM_UID", claim.uid.clone()),
                ("EXTERNAL_SM_WATCHER_ENABLED", if cfg.sm_watcher() { "TRUE" } else { "FALSE" }.to_owned()),
            ]
            .into_iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
            common.mounts = vec![
                Mount::bind(
                    cdi::CONTROL_LIBRARY,
                    &host.join(runtime_files::library_file_name(&cfg.library_version)),
                    true,
                ),
                Mount::bind("/etc/ld.so.preload", &host.join(runtime_files::PRELOAD_FILE), true),
            ];
            if cfg.client_mode() {
                common.mounts.push(Mount::bind(
                    client_mode::CONTAINER_REGISTRY_DIR,
                    &host.join("registry"),
                    true,
                ));
            } else {
                common.mounts.push(Mount::bind("/etc/vgpu-manager/.host_proc", Path::new("/proc"), true));
            }
            if cfg.sm_watcher() {
                common.mounts.push(Mount::bind(cdi::CONTAINER_WATCHER_DIR, &host.join("watcher"), true));
            }
            if cfg.nri() {
                // A container the NRI hook did not adjust (our plugin not connected to the runtime then) must
                // not run without its partition: this mount's source never exists, so the runtime refuses to
                // create it and the kubelet retries; the hook's own mount on the same path replaces it.
                common.mounts.push(crate::nri::guard_mount(&cfg.host_claim_dir(&claim.uid)));
            }
        }
        let host_claim = cfg.host_claim_dir(&claim.uid);
        let devices = planned
            .iter()
            .map(|p| {
                // A MIG or VFIO device's nodes come from its mode (the MIG caps, `/dev/vfio/<group>`).
                let nodes = match p.allocatable.kind {
                    DeviceType::Gpu | DeviceType::Vgpu => self
                        .vendor
                        .gpu_device_nodes(p.allocatable.gpu.index, p.allocatable.gpu.minor)
                        .iter()
                        .map(|n| DeviceNode::under(n, &cfg.host_driver_root))
                        .collect(),
                    DeviceType::Mig | DeviceType::Vfio => Vec::new(),
                };
                let mut edits = ContainerEdits { device_nodes: nodes, ..ContainerEdits::default() };
                if p.allocatable.kind == DeviceType::Vgpu {
                    let i = p.ordinal;
                    let (hard, soft) = match p.cores {
                        Some(cores) => policy.core_limits(cores),
                        None => (String::new(), String::new()),
                    };
                    edits.env = vec![
                        format!("MANAGER_VISIBLE_DEVICE_{i}={}", p.device.uuid),
                        format!("CUDA_MEM_RATIO_{i}={ratio}"),
                        format!("CUDA_MEM_OVERSOLD_{i}={oversold}"),
                        format!(
                            "CUDA_MEM_LIMIT_{i}={}",
                            p.memory_mib.map(|m| format!("{m}m")).unwrap_or_default()
                        ),
                        format!("CUDA_CORE_LIMIT_{i}={hard}"),
                        format!("CUDA_CORE_SOFT_LIMIT_{i}={soft}"),
                    ];
                    if cfg.client_mode() {
                        edits.env.push(format!("{}={}", client_mode::ENV, p.register_uuid));
                    }
                    let part = host_claim.join(&p.partition);
                    // With NRI the partition mounts are per container, injected at CreateContainer.
                    edits.mounts = if cfg.nri() { Vec::new() } else { crate::nri::partition_mounts(&part) };
                }
                vgpu_core::cdi::Device {
                    name: p.cdi_name.clone(),
                    container_edits: edits,
                    ..Default::default()
                }
            })
            .collect();
        vgpu_core::cdi::Spec {
            cdi_version: vgpu_core::cdi::SPEC_VERSION.to_owned(),
            kind: cdi::KIND.to_owned(),
            devices,
            container_edits: common,
            ..Default::default()
        }
    }

    /// The vendor's control nodes present under the container driver root.
    fn control_nodes(&self) -> Vec<DeviceNode> {
        self.vendor
            .control_device_nodes()
            .iter()
            .filter(|n| self.config.container_driver_root.join(n.trim_start_matches('/')).exists())
            .map(|n| DeviceNode::under(n, &self.config.host_driver_root))
            .collect()
    }

    /// Removes the claim's recorded paths, newest first; only paths named after the claim (its directory
    /// `<uid>` or its spec file) are touched, NotFound is fine.
    fn remove_paths(&self, uid: &str, claim: &PreparedClaim) -> Result<(), ClaimFailure> {
        let spec_name = cdi::spec_file_name(uid);
        for recorded in claim.paths.iter().rev() {
            let path = Path::new(recorded);
            let ours = path.file_name().is_some_and(|n| n == uid || n == spec_name.as_str());
            if !ours {
                tracing::warn!(claim = uid, path = %path.display(), "not removing a recorded path that is not named after the claim");
                continue;
            }
            let result = match std::fs::symlink_metadata(path) {
                Ok(meta) if meta.is_dir() => std::fs::remove_dir_all(path),
                Ok(_) => std::fs::remove_file(path),
                Err(e) => Err(e),
            };
            match result {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(source) => {
                    return Err(ClaimFailure::Io { path: path.to_path_buf(), action: "remove", source });
                }
            }
        }
        Ok(())
    }

    /// Unprepares every claim: removes what Prepare made (the CDI spec, the claim directory) and the
    /// checkpoint entry; a claim that is not prepared is already done.
    pub async fn unprepare(&self, claims: &[ClaimRef]) -> UnprepareResults {
        let timer = crate::metrics::Timer::start();
        let mut out = BTreeMap::new();
        let _serial = self.serial.lock().await;
        let lock = PuLock::acquire(&self.config.lock_path(), self.config.lock_timeout).await;
        let _lock = match lock {
            Ok(lock) => lock,
            Err(e) => {
                let text = e.to_string();
                for c in claims {
                    out.insert(c.uid.clone(), Err(ClaimFailure::Batch(text.clone())));
                }
                self.record(crate::metrics::Operation::Unprepare, &out, &timer);
                return out;
            }
        };
        for claim in claims {
            let span = self.config.claim_span(
                crate::metrics::Operation::Unprepare,
                &claim.uid,
                &claim.namespace,
                &claim.name,
            );
            out.insert(claim.uid.clone(), self.unprepare_one(&claim.uid).instrument(span).await);
        }
        self.record(crate::metrics::Operation::Unprepare, &out, &timer);
        out
    }

    async fn unprepare_one(&self, uid: &str) -> Result<(), ClaimFailure> {
        let path = self.config.checkpoint_path();
        let mut cp = Checkpoint::load(&path)?;
        let Some(entry) = cp.claims().get(uid).cloned() else {
            return Ok(());
        };
        self.undo(uid, &entry).await?;
        cp.claims_mut().remove(uid);
        cp.store(&path)?;
        Ok(())
    }

    /// The stale-claim sweep: unprepares every checkpointed claim whose ResourceClaim is gone from the API
    /// (absent, or re-created with another UID). Claims the API cannot be asked about now, and entries
    /// without a name (upgraded from v1), are kept. Returns the UIDs unprepared.
    pub async fn sweep_stale(&self) -> Result<Vec<String>, StateError> {
        let entries = self.checkpoint().await.map_err(ClaimFailure::from)?;
        let mut stale = Vec::new();
        for (uid, entry) in entries.claims() {
            if entry.name.is_empty() || entry.checkpoint_state != ClaimState::PrepareCompleted {
                continue;
            }
            match self.claims.get(&entry.namespace, &entry.name).await {
                Ok(Some(c)) if c.metadata.uid.as_deref() == Some(uid.as_str()) => {}
                Ok(_) => stale.push(ClaimRef::new(&entry.namespace, &entry.name, uid)),
                Err(e) => {
                    tracing::warn!(claim = %uid, error = %e, "stale-claim sweep: cannot check the claim; keeping it")
                }
            }
        }
        let mut done = Vec::new();
        for (uid, result) in self.unprepare(&stale).await {
            match result {
                Ok(()) => {
                    tracing::info!(claim = %uid, "unprepared a claim that no longer exists in the API");
                    done.push(uid);
                }
                Err(e) => tracing::warn!(claim = %uid, error = %e, "stale-claim sweep: unprepare failed"),
            }
        }
        Ok(done)
    }

    /// Runs [`sweep_stale`](Self::sweep_stale) every `config.stale_sweep_interval` until `shutdown`.
    pub async fn run_sweeper(self: Arc<Self>, shutdown: impl std::future::Future<Output = ()>) {
        tokio::pin!(shutdown);
        let mut tick = tokio::time::interval(self.config.stale_sweep_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tokio::select! {
                () = &mut shutdown => return,
                _ = tick.tick() => {
                    if let Err(e) = self.sweep_stale().await {
                        tracing::warn!(error = %e, "stale-claim sweep failed");
                    }
                }
            }
        }
    }
}

/// The error for a recorded action whose mode is not installed; the gate is guessed from the mode's name.
fn not_installed(mode: &str) -> ModeError {
    let gate = match mode {
        "timeSlicing" => "TimeSlicingSettings",
        "mps" => "MPSSupport",
        "mig" => "DynamicMIG",
        "vfio" => "PassthroughSupport",
        "deviceMetadata" => "DeviceMetadata",
        "fabricManager" => "FabricManagerPartitioning",
        _ => "(unknown: this build has no such mode)",
    };
    ModeError::NotInstalled { mode: mode.to_owned(), gate: gate.to_owned() }
}

/// Creates a claim directory with mode 0777, refusing a symbolic link planted at `path`
/// ([`ClaimFailure::Permissions`]) rather than widening its target's mode.
fn make_dir(path: &Path) -> Result<(), ClaimFailure> {
    Ok(vgpu_core::abi::perms::create_dir_all_mode(path, 0o777)?)
}
