//! AllocationFailureReschedule (contract §5.6, gate `AllocationFailureReschedule`, upstream controller
//! `Reschedule`): **watches** the pods on this node (a poll, see below), **reconciles** the vGPU pods whose
//! allocation failed here, and **writes** evictions, deletions, re-created pods, events and the recovery
//! checkpoint ([`checkpoint`]).
//!
//! # Reconcile (every [`RescheduleConfig::poll_interval`])
//!
//! A pod is acted on when it is on this node, requests `<domain>/vgpu-number`, is not being deleted, is
//! `Pending` or `Failed`, and its allocation failed ([`allocation_failed`]: a container waiting with a
//! message containing `Allocate check failed` or `PreStartContainer check failed`, `status.reason ==
//! UnexpectedAdmissionError`, or more than 300 000 container statuses). Then, by [`disposition`]:
//!
//! | pod | action | event (events.k8s.io/v1 `reason`/`action`) |
//! |---|---|---|
//! | critical ([`is_critical`]) | none | Warning `CriticalPod`/`Skipped`, once per pod UID |
//! | controlled (an ownerReference with `controller: true`, not a Pod) | eviction (policy/v1), grace = the pod's `terminationGracePeriodSeconds`; a 429 (PodDisruptionBudget) is retried next poll | Warning `Evict`/`Evicted` |
//! | bare (no ownerReferences) | checkpoint entry written, **then** delete with a UID precondition | Warning `Recovery`/`Deleted` |
//! | owned but not controlled | none (nobody would recreate it); logged once | none |
//!
//! # Recovery (each checkpoint entry, as soon as it is due)
//!
//! | the pod of that name | step |
//! |---|---|
//! | entry older than [`RescheduleConfig::recovery_window`] (24 h) | entry dropped, logged |
//! | absent | created from the entry ([`recreation_pod`]); entry removed; Normal `Recovery`/`Recovered` on the new pod |
//! | exists with another UID | someone recreated it: entry removed |
//! | the same pod, terminating | due again after its remaining grace period, at most [`RescheduleConfig::max_requeue`] (5 s) |
//! | the same pod, not terminating | its delete has not happened (a crash right after the entry was written, or a failed request): the reconcile pass deletes it while it still qualifies; otherwise the entry is dropped |
//! | an API error | due again after a doubling delay from [`RescheduleConfig::retry_after`] up to 5 min |
//!
//! Entries in the checkpoint at start are due at once, so a crash between delete and create recovers on
//! restart.
//!
//! # Poll, not watch
//!
//! The workspace's kube has no `runtime` feature (no `watcher`/`Controller`), and the condition is rare and
//! not urgent: the kubelet has already failed the pod. One list of this node's pods every 5 s, served from
//! the API server's watch cache (`resourceVersion=0`), costs less than keeping a watch open per node and has
//! no resync logic to get wrong; a reschedule waits at most one interval.
//!
//! # Metadata clean-up of a re-created pod
//!
//! Upstream's `CleanupMetadata` deletes the annotation keys from the labels map, so the scheduling
//! annotations survive into the new pod. Here labels and annotations are cleaned from their own maps; see
//! [`recreation_pod`].

pub mod checkpoint;

use std::{
    collections::{HashMap, HashSet},
    future::Future,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use k8s_openapi::{api::core::v1::Pod, apimachinery::pkg::apis::meta::v1::ObjectMeta, jiff::Timestamp};
use tokio::time::Instant;
use vgpu_core::domain::{ORIGINAL_RESOURCES_ANNOTATION, ResourceDomain};

use self::checkpoint::{CheckpointError, RecoveryCheckpoint, pod_key};
use crate::cluster::{
    CreateOutcome, DeleteOutcome, EventType, EvictOutcome, PHASE_FAILED, PodEvent, RescheduleClient,
};

/// Waiting-message marker of a failed `Allocate` (the vnumber plugin's error prefix).
pub const ALLOCATE_FAILED: &str = "Allocate check failed";
/// Waiting-message marker of a failed `PreStartContainer`.
pub const PRESTART_FAILED: &str = "PreStartContainer check failed";
/// `status.reason` the kubelet sets when admission (device allocation) failed.
pub const UNEXPECTED_ADMISSION_ERROR: &str = "UnexpectedAdmissionError";
/// More container statuses than this marks a pod as broken (upstream's `MaxContainerLimit`).
pub const MAX_CONTAINER_STATUSES: usize = 300_000;
/// Priority from which the kubelet treats a pod as critical (`scheduling.SystemCriticalPriority`).
pub const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;
/// The built-in critical priority classes.
pub const CRITICAL_PRIORITY_CLASSES: [&str; 2] = ["system-node-critical", "system-cluster-critical"];
/// `Pending` phase.
pub const PHASE_PENDING: &str = "Pending";

/// Longest delay between retries of a failing recovery.
const MAX_RETRY: Duration = Duration::from_secs(300);
/// Shortest wait for a terminating pod.
const MIN_REQUEUE: Duration = Duration::from_millis(100);

/// Timing of the controller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RescheduleConfig {
    /// How often the node's pods are listed (default 5 s).
    pub poll_interval: Duration,
    /// Longest wait before looking again at a terminating pod that is to be recreated (default 5 s).
    pub max_requeue: Duration,
    /// Entries older than this are dropped instead of recreated (default 24 h).
    pub recovery_window: Duration,
    /// First delay after a failed recovery step, doubled per failure up to 5 min (default 5 s).
    pub retry_after: Duration,
}

impl Default for RescheduleConfig {
    fn default() -> Self {
        Self {
            poll_interval: Duration::from_secs(5),
            max_requeue: Duration::from_secs(5),
            recovery_window: Duration::from_secs(24 * 3600),
            retry_after: Duration::from_secs(5),
        }
    }
}

/// The controller could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RescheduleError {
    /// The recovery checkpoint could not be read or moved aside.
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
}

/// What the controller does with a pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// Not a pod to act on (not ours, not vGPU, terminating, or its allocation did not fail).
    Ignore,
    /// Critical: an event only.
    Critical,
    /// Controlled by a workload controller: evict with this grace period.
    Evict {
        /// `spec.terminationGracePeriodSeconds`.
        grace_period_seconds: Option<i64>,
    },
    /// Bare: checkpoint, delete, recreate.
    Recreate,
    /// Has ownerReferences but no controller: left alone.
    Unmanaged,
}

/// Whether any container (init or app) limits `<domain>/vgpu-number` to a positive integer.
pub fn is_vgpu_pod(pod: &Pod, domain: &ResourceDomain) -> bool {
    let key = domain.vgpu_number();
    let Some(spec) = pod.spec.as_ref() else { return false };
    spec.init_containers.iter().flatten().chain(&spec.containers).any(|c| {
        c.resources
            .as_ref()
            .and_then(|r| r.limits.as_ref())
            .and_then(|l| l.get(&key))
            .and_then(|q| vgpu_core::alloc::parse_quantity(&q.0))
            .is_some_and(|n| n > 0)
    })
}

/// Upstream's `IsShouldDeletePod` without its `deletionTimestamp` clause: a container waiting with a
/// message containing [`ALLOCATE_FAILED`] or [`PRESTART_FAILED`], `status.reason ==`
/// [`UNEXPECTED_ADMISSION_ERROR`], or more than [`MAX_CONTAINER_STATUSES`] container statuses.
pub fn allocation_failed(pod: &Pod) -> bool {
    let Some(status) = pod.status.as_ref() else { return false };
    let statuses = status.container_statuses.as_deref().unwrap_or_default();
    if statuses.len() > MAX_CONTAINER_STATUSES {
        return true;
    }
    let waiting_failed = statuses.iter().any(|s| {
        s.state
            .as_ref()
            .and_then(|st| st.waiting.as_ref())
            .and_then(|w| w.message.as_deref())
            .is_some_and(|m| m.contains(ALLOCATE_FAILED) || m.contains(PRESTART_FAILED))
    });
    waiting_failed || status.reason.as_deref() == Some(UNEXPECTED_ADMISSION_ERROR)
}

/// The kubelet's `IsCriticalPod` (static pod: `kubernetes.io/config.source` other than `api`; mirror pod:
/// `kubernetes.io/config.mirror`; `spec.priority >=` [`SYSTEM_CRITICAL_PRIORITY`]), plus two cases that
/// matter when `spec.priority` was not filled in: a [`CRITICAL_PRIORITY_CLASSES`] class name, and the legacy
/// `scheduler.alpha.kubernetes.io/critical-pod` annotation in `kube-system`. Never touching one of these is
/// the safe side.
pub fn is_critical(pod: &Pod) -> bool {
    let annotations = pod.metadata.annotations.as_ref();
    let has = |key: &str| annotations.is_some_and(|a| a.contains_key(key));
    let is_static =
        annotations.and_then(|a| a.get("kubernetes.io/config.source")).is_some_and(|s| s != "api");
    let spec = pod.spec.as_ref();
    let by_priority = spec.and_then(|s| s.priority).is_some_and(|p| p >= SYSTEM_CRITICAL_PRIORITY);
    let by_class = spec
        .and_then(|s| s.priority_class_name.as_deref())
        .is_some_and(|c| CRITICAL_PRIORITY_CLASSES.contains(&c));
    let legacy = pod.metadata.namespace.as_deref() == Some("kube-system")
        && has("scheduler.alpha.kubernetes.io/critical-pod");
    is_static || has("kubernetes.io/config.mirror") || by_priority || by_class || legacy
}

/// What to do with `pod` on `node` (see the module docs).
pub fn disposition(pod: &Pod, node: &str, domain: &ResourceDomain) -> Disposition {
    let spec = pod.spec.as_ref();
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or_default();
    let eligible = spec.and_then(|s| s.node_name.as_deref()) == Some(node)
        && pod.metadata.deletion_timestamp.is_none()
        && (phase == PHASE_FAILED || phase == PHASE_PENDING)
        && is_vgpu_pod(pod, domain)
        && allocation_failed(pod);
    if !eligible {
        return Disposition::Ignore;
    }
    if is_critical(pod) {
        return Disposition::Critical;
    }
    let owners = pod.metadata.owner_references.as_deref().unwrap_or_default();
    if owners.iter().any(|r| r.controller == Some(true) && r.kind != "Pod") {
        return Disposition::Evict {
            grace_period_seconds: spec.and_then(|s| s.termination_grace_period_seconds),
        };
    }
    if owners.is_empty() { Disposition::Recreate } else { Disposition::Unmanaged }
}

/// The pod to create in place of a deleted bare pod: same name, namespace, labels, annotations,
/// ownerReferences, finalizers and spec, with
/// - every other metadata field dropped (`uid`, `resourceVersion`, `creationTimestamp`,
///   `deletionTimestamp`, `deletionGracePeriodSeconds`, `generation`, `managedFields`, ...) and no status;
/// - `spec.nodeName` cleared so the scheduler places it again;
/// - `spec.priority` and `spec.preemptionPolicy` cleared: the Priority admission plugin fills them from
///   the priority class again, and refuses a pod whose values differ from the class's current ones;
/// - labels `<domain>/assigned-phase` and `<domain>/metrics-node` removed from the labels;
/// - annotations `<domain>/pre-allocated`, `real-allocated`, `predicate-node`, `predicate-time` (and
///   `vgpu-manager.io/original-resources`, as upstream's DRA clean-up) removed from the annotations.
pub fn recreation_pod(pod: &Pod, domain: &ResourceDomain) -> Pod {
    let old = &pod.metadata;
    let mut labels = old.labels.clone().unwrap_or_default();
    for key in [domain.assigned_phase(), domain.metrics_node()] {
        labels.remove(&key);
    }
    let mut annotations = old.annotations.clone().unwrap_or_default();
    for key in [
        domain.pre_allocated(),
        domain.real_allocated(),
        domain.predicate_node(),
        domain.predicate_time(),
        ORIGINAL_RESOURCES_ANNOTATION.to_owned(),
    ] {
        annotations.remove(&key);
    }
    let mut spec = pod.spec.clone();
    if let Some(s) = spec.as_mut() {
        s.node_name = None;
        s.priority = None;
        s.preemption_policy = None;
    }
    Pod {
        metadata: ObjectMeta {
            name: old.name.clone(),
            generate_name: old.generate_name.clone(),
            namespace: old.namespace.clone(),
            labels: Some(labels).filter(|m| !m.is_empty()),
            annotations: Some(annotations).filter(|m| !m.is_empty()),
            owner_references: old.owner_references.clone(),
            finalizers: old.finalizers.clone(),
            ..ObjectMeta::default()
        },
        spec,
        status: None,
    }
}

fn split_key(key: &str) -> (&str, &str) {
    key.split_once('/').unwrap_or(("", key))
}

fn uid_of(pod: &Pod) -> &str {
    pod.metadata.uid.as_deref().unwrap_or_default()
}

/// The AllocationFailureReschedule controller of one node (see the module docs).
pub struct RescheduleController {
    node: String,
    domain: ResourceDomain,
    client: Arc<dyn RescheduleClient>,
    checkpoint_path: PathBuf,
    config: RescheduleConfig,
}

impl std::fmt::Debug for RescheduleController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RescheduleController")
            .field("node", &self.node)
            .field("checkpoint", &self.checkpoint_path)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl RescheduleController {
    /// The controller of `node`, keeping its checkpoint under `manager_dir` (see
    /// [`RecoveryCheckpoint::path_in`]).
    pub fn new(
        node: impl Into<String>,
        domain: ResourceDomain,
        manager_dir: &Path,
        client: Arc<dyn RescheduleClient>,
    ) -> Self {
        Self {
            node: node.into(),
            domain,
            client,
            checkpoint_path: RecoveryCheckpoint::path_in(manager_dir),
            config: RescheduleConfig::default(),
        }
    }

    /// Replaces the timing.
    pub fn with_config(mut self, config: RescheduleConfig) -> Self {
        self.config = config;
        self
    }

    /// The checkpoint file.
    pub fn checkpoint_path(&self) -> &Path {
        &self.checkpoint_path
    }

    /// Opens the checkpoint (moving an unreadable one aside), then reconciles and recovers until `shutdown`
    /// completes. Fails only when the checkpoint cannot be read or moved aside; API errors are logged and
    /// retried.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<(), RescheduleError> {
        let opened = RecoveryCheckpoint::open(self.checkpoint_path.clone())?;
        if let Some((aside, err)) = &opened.set_aside {
            tracing::error!(%err, moved_to = %aside.display(), "recovery checkpoint unreadable; moved aside, starting with an empty one");
        }
        let checkpoint = opened.checkpoint;
        let now = Instant::now();
        let due: HashMap<String, Instant> = checkpoint.entries().keys().map(|k| (k.clone(), now)).collect();
        if !due.is_empty() {
            tracing::info!(pods = due.len(), "recovering bare pods from the checkpoint");
        }
        tracing::info!(node = %self.node, checkpoint = %self.checkpoint_path.display(), "reschedule controller started");
        let mut worker = Worker {
            ctl: self,
            checkpoint,
            due,
            failures: HashMap::new(),
            noted: HashSet::new(),
            next_list: now,
        };
        let mut shutdown = std::pin::pin!(shutdown);
        loop {
            worker.step().await;
            let wake = worker.next_wake();
            tokio::select! {
                () = &mut shutdown => break,
                () = tokio::time::sleep_until(wake) => {}
            }
        }
        tracing::info!("reschedule controller stopped");
        Ok(())
    }

    /// [`RescheduleController::run`] on a new task.
    pub fn spawn(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> tokio::task::JoinHandle<Result<(), RescheduleError>> {
        tokio::spawn(self.run(shutdown))
    }
}

struct Worker {
    ctl: RescheduleController,
    checkpoint: RecoveryCheckpoint,
    /// When each checkpoint entry is next looked at.
    due: HashMap<String, Instant>,
    /// Consecutive failed recovery steps per entry.
    failures: HashMap<String, u32>,
    /// UIDs of pods already reported as critical or unmanaged (one event/log per pod).
    noted: HashSet<String>,
    next_list: Instant,
}

impl Worker {
    async fn step(&mut self) {
        let now = Instant::now();
        if now >= self.next_list {
            self.next_list = now + self.ctl.config.poll_interval;
            self.reconcile().await;
        }
        self.recover_due().await;
    }

    fn next_wake(&self) -> Instant {
        self.due.values().copied().fold(self.next_list, Instant::min)
    }

    async fn event(&self, pod: &Pod, uid: &str, type_: EventType, reason: &str, action: &str, note: String) {
        let event = PodEvent {
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            name: pod.metadata.name.clone().unwrap_or_default(),
            uid: uid.to_owned(),
            type_,
            reason: reason.to_owned(),
            action: action.to_owned(),
            note,
        };
        if let Err(err) = self.ctl.client.record_event(&event).await {
            tracing::warn!(%err, "could not record an event");
        }
    }

    async fn reconcile(&mut self) {
        let pods = match self.ctl.client.list_node_pod_objects(&self.ctl.node).await {
            Ok(p) => p,
            Err(err) => {
                tracing::warn!(%err, "listing this node's pods failed; retrying next poll");
                return;
            }
        };
        let present: HashSet<&str> = pods.iter().map(uid_of).collect();
        self.noted.retain(|uid| present.contains(uid.as_str()));
        for pod in &pods {
            let key = pod_key(pod);
            let uid = uid_of(pod).to_owned();
            match disposition(pod, &self.ctl.node, &self.ctl.domain) {
                Disposition::Ignore => {}
                Disposition::Critical => {
                    if self.noted.insert(uid.clone()) {
                        tracing::warn!(pod = %key, "allocation failed for a critical pod; not evicting or deleting it");
                        let note = format!(
                            "vGPU allocation failed on node {}; critical pods are never evicted or deleted by the reschedule controller",
                            self.ctl.node
                        );
                        self.event(pod, &uid, EventType::Warning, "CriticalPod", "Skipped", note).await;
                    }
                }
                Disposition::Unmanaged => {
                    if self.noted.insert(uid) {
                        tracing::info!(pod = %key, "allocation failed for a pod with owners but no controller; leaving it");
                    }
                }
                Disposition::Evict { grace_period_seconds } => {
                    self.evict(pod, &key, &uid, grace_period_seconds).await
                }
                Disposition::Recreate => self.delete_bare(pod, &key, &uid).await,
            }
        }
    }

    async fn evict(&self, pod: &Pod, key: &str, uid: &str, grace: Option<i64>) {
        let (namespace, name) = split_key(key);
        match self.ctl.client.evict_pod(namespace, name, grace).await {
            Ok(EvictOutcome::Evicted) => {
                tracing::info!(pod = %key, "evicted after a failed allocation");
                let note = "Evicting pod to trigger controller reconciliation and rescheduling.".to_owned();
                self.event(pod, uid, EventType::Warning, "Evict", "Evicted", note).await;
            }
            Ok(EvictOutcome::NotFound) => {}
            Ok(EvictOutcome::Refused(message)) => {
                tracing::info!(pod = %key, %message, "eviction refused for now; retrying next poll");
            }
            Err(err) => tracing::warn!(%err, "eviction failed; retrying next poll"),
        }
    }

    async fn delete_bare(&mut self, pod: &Pod, key: &str, uid: &str) {
        if let Err(err) = self.checkpoint.record(pod, Timestamp::now()) {
            tracing::error!(%err, pod = %key, "could not record the pod for recovery; not deleting it");
            return;
        }
        let (namespace, name) = split_key(key);
        match self.ctl.client.delete_pod(namespace, name, uid).await {
            Ok(DeleteOutcome::Deleted) => {
                tracing::info!(pod = %key, "deleted after a failed allocation; it will be recreated");
                let note = "Pod has been deleted, the controller will recreate and reschedule it".to_owned();
                self.event(pod, uid, EventType::Warning, "Recovery", "Deleted", note).await;
            }
            Ok(DeleteOutcome::NotFound | DeleteOutcome::UidMismatch) => {}
            Err(err) => tracing::warn!(%err, "delete failed; retrying next poll"),
        }
        self.due.insert(key.to_owned(), Instant::now());
    }

    async fn recover_due(&mut self) {
        let now = Instant::now();
        let mut keys: Vec<String> =
            self.due.iter().filter(|(_, t)| **t <= now).map(|(k, _)| k.clone()).collect();
        keys.sort();
        for key in keys {
            match self.recover(&key).await {
                Ok(Some(wait)) => {
                    self.failures.remove(&key);
                    self.due.insert(key, Instant::now() + wait);
                }
                Ok(None) => {
                    self.failures.remove(&key);
                    self.due.remove(&key);
                }
                Err(err) => {
                    let n = self.failures.entry(key.clone()).or_insert(0);
                    let wait = self.ctl.config.retry_after.saturating_mul(1 << (*n).min(16)).min(MAX_RETRY);
                    *n = n.saturating_add(1);
                    tracing::warn!(pod = %key, %err, retry_in = ?wait, "recovery step failed");
                    self.due.insert(key, Instant::now() + wait);
                }
            }
        }
    }

    /// One recovery step: `Ok(None)` when the entry is settled (and removed), `Ok(Some(wait))` to look again.
    async fn recover(&mut self, key: &str) -> Result<Option<Duration>, String> {
        let Some(entry) = self.checkpoint.entries().get(key).cloned() else { return Ok(None) };
        let now = Timestamp::now();
        let age = now.as_second().saturating_sub(entry.recorded_at.0.as_second());
        let window = i64::try_from(self.ctl.config.recovery_window.as_secs()).unwrap_or(i64::MAX);
        if age > window {
            tracing::warn!(pod = %key, age_s = age, "pod waiting for recovery was deleted too long ago; not recreating it");
            return self.settle(key);
        }
        let (namespace, name) = split_key(key);
        let current = self.ctl.client.get_pod(namespace, name).await.map_err(|e| e.to_string())?;
        match current {
            None => {
                let new = recreation_pod(&entry.pod, &self.ctl.domain);
                match self.ctl.client.create_pod(&new).await.map_err(|e| e.to_string())? {
                    CreateOutcome::Created { uid } => {
                        tracing::info!(pod = %key, %uid, "recreated");
                        self.event(
                            &new,
                            &uid,
                            EventType::Normal,
                            "Recovery",
                            "Recovered",
                            "Pod has been successfully recovered".to_owned(),
                        )
                        .await;
                    }
                    CreateOutcome::AlreadyExists => {
                        tracing::info!(pod = %key, "a pod of that name exists again")
                    }
                }
                self.settle(key)
            }
            Some(pod) if uid_of(&pod) != uid_of(&entry.pod) => {
                tracing::info!(pod = %key, "a pod of that name exists again");
                self.settle(key)
            }
            Some(pod) if pod.metadata.deletion_timestamp.is_some() => {
                Ok(Some(self.remaining_grace(&pod, now)))
            }
            Some(pod) => {
                if disposition(&pod, &self.ctl.node, &self.ctl.domain) == Disposition::Recreate {
                    // Not deleted yet: the reconcile pass deletes it; look again after that.
                    Ok(Some(self.ctl.config.poll_interval))
                } else {
                    tracing::info!(pod = %key, "pod no longer needs recovery");
                    self.settle(key)
                }
            }
        }
    }

    fn settle(&mut self, key: &str) -> Result<Option<Duration>, String> {
        self.checkpoint.remove(key).map_err(|e| e.to_string())?;
        Ok(None)
    }

    /// Time until a terminating pod's grace period ends, within [100 ms, `max_requeue`].
    fn remaining_grace(&self, pod: &Pod, now: Timestamp) -> Duration {
        let max = self.ctl.config.max_requeue;
        let Some(deleted) = pod.metadata.deletion_timestamp.as_ref() else { return max };
        let grace = pod.metadata.deletion_grace_period_seconds.unwrap_or(0).max(0);
        let end_ms = deleted.0.as_millisecond().saturating_add(grace.saturating_mul(1000));
        let remaining = end_ms.saturating_sub(now.as_millisecond());
        let remaining = Duration::from_millis(u64::try_from(remaining).unwrap_or(0));
        remaining.clamp(MIN_REQUEUE.min(max), max)
    }
}
