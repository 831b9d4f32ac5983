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
//!
//! # Files
//!
//! | file | role |
//! |---|---|
//! | `state.rs` | [`DeviceState`]: the order of Prepare / Unprepare, recovery, the stale-claim sweep, the modes' apply and revert |
//! | [`error`] | [`ClaimFailure`] (the kubelet's per-claim error) and [`StateError`] |
//! | [`fault`] | fault injection: [`FaultPoint`], [`FaultHook`], the binary's test-only pause |
//! | `plan.rs` | planning with no side effect: allocation results → devices and limits, overlap check, partitions, register UUIDs |
//! | `spec.rs` | the claim's CDI spec from the plan |

pub mod error;
pub mod fault;
mod plan;
mod spec;

use std::{collections::BTreeMap, path::Path, sync::Arc};

use k8s_openapi::api::resource::v1::ResourceClaim;
use tracing::Instrument;
use vgpu_core::{abi::runtime_files, backend::VendorAdapter};

use self::{
    error::{ClaimFailure, StateError},
    fault::{FaultHook, FaultPoint},
    plan::Planned,
};
use crate::{
    cdi,
    checkpoint::{Checkpoint, CheckpointError, ClaimState, PreparedClaim, PreparedDevice},
    claims::{ClaimRef, ClaimSource},
    client_mode::{self, RegisterTable},
    config::DriverConfig,
    devices::AllocatableDevices,
    lock::PuLock,
    modes::{ClaimContext, ClaimMode, HostAction, ModeEdits, ModeError},
};
use vgpu_core::dra::DeviceType;

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
        let mut planned = plan::plan(&self.config, &self.devices, claim, &object)?;
        if planned.is_empty() {
            return Ok(Vec::new());
        }
        plan::check_overlap(claim, &planned, &cp)?;
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
            plan::assign_partitions(self.claims.as_ref(), claim, &object, &mut planned).await;
            // With NRI the partitions are per container: the hook hands out their register UUIDs.
            if self.config.client_mode() && !self.config.nri() {
                register_uuids = plan::mint_register_uuids(&mut planned)?;
            }
        }
        let mut paths = Vec::new();
        if has_vgpu {
            paths.push(claim_dir.display().to_string());
        }
        paths.push(spec_path.display().to_string());
        let claim_devices = plan::claim_devices(&planned);
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
        let mut spec = spec::claim_spec(&self.config, self.vendor.as_ref(), claim, object, planned);
        crate::modes::append(&mut spec.container_edits, edits.common);
        for (name, device_edits) in edits.devices {
            if let Some(device) = spec.devices.iter_mut().find(|d| d.name == name) {
                crate::modes::append(&mut device.container_edits, device_edits);
            }
        }
        cdi::write_spec(spec_path, &claim.uid, &spec)?;
        Ok(())
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
