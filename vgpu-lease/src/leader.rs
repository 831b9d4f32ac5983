//! Leader election on a `coordination.k8s.io/v1` Lease, and the `--watch-lease` mode (contract §1.2).
//!
//! Two modes, mutually exclusive ([`LeaderMode::from_flags`]):
//!
//! * **[`LeaderMode::Elect`]** (`--leader-elect`): replicas compete for the Lease `<lease_namespace>/<lease_name>`
//!   with client-go's algorithm. Every `retry_period` an [`Elector`] reads the Lease and
//!   - creates it when absent (holder = us, `leaseTransitions` 0);
//!   - takes it over when it is expired or released (no holder), incrementing `leaseTransitions` and setting
//!     `acquireTime`. Expiry is judged as client-go does ([`LeaseObservation`]): `leaseDurationSeconds` after
//!     *we first saw* the current record, by our own clock, never from the holder's `renewTime`, which another
//!     machine's clock wrote (a skewed clock must not make a live leader look expired, or a dead one live);
//!   - renews it (new `renewTime`) when we hold it;
//!   - otherwise follows.
//!
//!   Writes are replaces carrying the `resourceVersion` that was read, so of two replicas racing for the same
//!   Lease only one succeeds (the other gets 409 Conflict and stays a follower). A leader that fails to
//!   renew for longer than `renew_deadline` steps down (before the Lease can expire for the others, since the
//!   deadline is shorter than the lease duration); one that sees another holder steps down at once. On
//!   shutdown a leader releases the Lease (clears `holderIdentity`, duration 1 s) so a successor takes over
//!   without waiting for expiry.
//! * **[`LeaderMode::WatchLease`]** (`--watch-lease`): the co-located kube-scheduler runs its own election;
//!   this replica follows the Lease it holds (read every `retry_period`) and is the leader while
//!   `holderIdentity` starts with our identity prefix and the Lease has not expired (judged the same way).
//!
//! Both modes set [`Readiness::set_role`] (so `/readyz` fails on followers) and merge-patch our own pod's
//! label `vgpu-manager.io/scheduler-role` = `leader`/`follower` (on `POD_NAMESPACE`/`POD_NAME`; skipped
//! when those are unknown), retried with exponential backoff until it lands or the role changes again.
//!
//! Identity: the prefix (`--leader-identity-prefix`; default [`default_identity_prefix`]: env `POD_NAME`,
//! else `HOSTNAME`, else the host name) plus `_` and a random UUID-shaped suffix, as kube-scheduler names
//! itself (`<hostname>_<uuid>`).
//!
//! Requests of [`KubeLeaseApi`]:
//!
//! | call | request |
//! |---|---|
//! | read the Lease | `GET /apis/coordination.k8s.io/v1/namespaces/<ns>/leases/<name>` (404 = absent) |
//! | create it | `POST /apis/coordination.k8s.io/v1/namespaces/<ns>/leases?`, `application/json` |
//! | acquire, renew, release | `PUT /apis/coordination.k8s.io/v1/namespaces/<ns>/leases/<name>?`, `application/json`, the Lease with `metadata.resourceVersion` as read |
//! | role label | `PATCH /api/v1/namespaces/<pod-ns>/pods/<pod>?`, `application/merge-patch+json`, `{"metadata":{"labels":{"vgpu-manager.io/scheduler-role":"leader"}}}` |
//!
//! Differences from vgpu-manager (deliberate): a follower is not ready (upstream only logged leadership); in
//! watch mode the prefix must end at a separator (`sched-1` does not match `sched-10_…`).
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use vgpu_lease::leader::{LeaderConfig, LeaderConfigError, LeaderMode, LeaseTimings};
//!
//! // `--leader-elect --leader-elect-resource-namespace kube-system --leader-elect-resource-name vgpu-scheduler`
//! let mode = LeaderMode::from_flags(true, false)?;
//! let mut config = LeaderConfig::new(mode, "kube-system", "vgpu-scheduler");
//! config.identity_prefix = "vgpu-scheduler-0".into(); // default: POD_NAME, HOSTNAME or the host name
//! config.pod_namespace = Some("kube-system".into()); // default: POD_NAMESPACE
//! config.pod_name = Some("vgpu-scheduler-0".into()); // default: POD_NAME
//! config.timings = LeaseTimings { retry_period: Duration::from_secs(1), ..LeaseTimings::default() };
//! config.validate()?;
//!
//! assert_eq!(LeaderMode::from_flags(true, true), Err(LeaderConfigError::ConflictingModes));
//! let short = LeaseTimings { renew_deadline: Duration::from_secs(20), ..LeaseTimings::default() };
//! assert!(LeaderConfig { timings: short, ..config.clone() }.validate().is_err());
//!
//! // In the binary:
//! // let readiness = Readiness::new(config.initial_role());
//! // tokio::spawn(vgpu_lease::leader::run(client, config, readiness.clone(), shutdown));
//! # Ok::<(), LeaderConfigError>(())
//! ```

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};

use vgpu_core::clock::{Clock, SystemClock};
use vgpu_kube::error::{ClusterError, cluster_error};

use crate::readiness::{Readiness, Role};

/// The pod label naming a replica's role (`leader`/`follower`).
pub const ROLE_LABEL: &str = "vgpu-manager.io/scheduler-role";

const NS_PER_S: i64 = 1_000_000_000;

/// The identity prefix when neither `POD_NAME`, `HOSTNAME` nor the host name is known.
pub const FALLBACK_IDENTITY_PREFIX: &str = "vgpu-scheduler";

/// Which leader mode runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum LeaderMode {
    /// No leader election: every replica serves ([`Role::Standalone`]).
    #[default]
    Off,
    /// `--leader-elect`: compete for the Lease.
    Elect,
    /// `--watch-lease`: follow the co-located kube-scheduler's Lease.
    WatchLease,
}

impl LeaderMode {
    /// The mode from `--leader-elect` and `--watch-lease` (both on is an error).
    pub fn from_flags(leader_elect: bool, watch_lease: bool) -> Result<Self, LeaderConfigError> {
        match (leader_elect, watch_lease) {
            (true, true) => Err(LeaderConfigError::ConflictingModes),
            (true, false) => Ok(LeaderMode::Elect),
            (false, true) => Ok(LeaderMode::WatchLease),
            (false, false) => Ok(LeaderMode::Off),
        }
    }
}

/// Lease timings (client-go's defaults: 15 s, 10 s, 2 s).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LeaseTimings {
    /// `leaseDurationSeconds` written to the Lease: how long others wait before taking it over.
    pub lease_duration: Duration,
    /// How long a leader keeps trying to renew before it steps down.
    pub renew_deadline: Duration,
    /// Interval between attempts (acquire, renew, or reading the watched Lease).
    pub retry_period: Duration,
}

impl Default for LeaseTimings {
    fn default() -> Self {
        Self {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// A leader configuration that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LeaderConfigError {
    /// `--leader-elect` and `--watch-lease` were both given.
    #[error("--leader-elect and --watch-lease are mutually exclusive")]
    ConflictingModes,
    /// A lease mode without `--leader-elect-resource-name`.
    #[error("a lease mode needs --leader-elect-resource-name")]
    MissingLeaseName,
    /// A lease mode without `--leader-elect-resource-namespace`.
    #[error("a lease mode needs --leader-elect-resource-namespace")]
    MissingLeaseNamespace,
    /// The identity prefix is empty.
    #[error("the leader identity prefix is empty")]
    EmptyIdentityPrefix,
    /// Timings violate `lease_duration > renew_deadline > 1.2 × retry_period > 0` (client-go's rule).
    #[error("invalid lease timings: {0}")]
    Timings(&'static str),
}

/// Leader-election settings (the extender's `--leader-*` and `--watch-lease` flags).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderConfig {
    /// Off, elect or watch.
    pub mode: LeaderMode,
    /// `--leader-identity-prefix`.
    pub identity_prefix: String,
    /// `--leader-elect-resource-name`: the Lease.
    pub lease_name: String,
    /// `--leader-elect-resource-namespace`: the Lease's namespace.
    pub lease_namespace: String,
    /// Our pod (env `POD_NAME`), for the role label.
    pub pod_name: Option<String>,
    /// Our pod's namespace (env `POD_NAMESPACE`), for the role label.
    pub pod_namespace: Option<String>,
    /// Lease timings.
    pub timings: LeaseTimings,
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().map(|v| v.trim().to_owned()).filter(|v| !v.is_empty())
}

/// The default identity prefix: env `POD_NAME`, else `HOSTNAME`, else the kernel's host name, else
/// `vgpu-scheduler`.
pub fn default_identity_prefix() -> String {
    env("POD_NAME")
        .or_else(|| env("HOSTNAME"))
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
                .filter(|h| !h.is_empty())
        })
        .unwrap_or_else(|| FALLBACK_IDENTITY_PREFIX.to_owned())
}

/// `<prefix>_<random UUID-shaped suffix>` (kube-scheduler's `<hostname>_<uuid>` form).
pub fn unique_identity(prefix: &str) -> String {
    use std::hash::{BuildHasher, Hasher};
    let random = |salt: u64| {
        // `RandomState` is seeded from the OS per instance: a dependency-free source of randomness.
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_i64(SystemClock.now_ns());
        h.write_u32(std::process::id());
        h.write_u64(salt);
        h.finish()
    };
    let (a, b) = (random(1), random(2));
    format!(
        "{prefix}_{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xffff,
        b >> 48,
        b & 0xffff_ffff_ffff
    )
}

impl LeaderConfig {
    /// A configuration for `mode` on the Lease `<lease_namespace>/<lease_name>`, with the identity prefix from
    /// [`default_identity_prefix`], the pod from env `POD_NAME`/`POD_NAMESPACE` and default timings.
    pub fn new(mode: LeaderMode, lease_namespace: impl Into<String>, lease_name: impl Into<String>) -> Self {
        Self {
            mode,
            identity_prefix: default_identity_prefix(),
            lease_name: lease_name.into(),
            lease_namespace: lease_namespace.into(),
            pod_name: env("POD_NAME"),
            pod_namespace: env("POD_NAMESPACE"),
            timings: LeaseTimings::default(),
        }
    }

    /// No leader election.
    pub fn off() -> Self {
        Self {
            mode: LeaderMode::Off,
            identity_prefix: String::new(),
            lease_name: String::new(),
            lease_namespace: String::new(),
            pod_name: None,
            pod_namespace: None,
            timings: LeaseTimings::default(),
        }
    }

    /// Checks the configuration (nothing to check when off).
    pub fn validate(&self) -> Result<(), LeaderConfigError> {
        if self.mode == LeaderMode::Off {
            return Ok(());
        }
        if self.lease_name.trim().is_empty() {
            return Err(LeaderConfigError::MissingLeaseName);
        }
        if self.lease_namespace.trim().is_empty() {
            return Err(LeaderConfigError::MissingLeaseNamespace);
        }
        if self.identity_prefix.trim().is_empty() {
            return Err(LeaderConfigError::EmptyIdentityPrefix);
        }
        let t = &self.timings;
        if t.retry_period.is_zero() {
            return Err(LeaderConfigError::Timings("retry period must be positive"));
        }
        if t.lease_duration <= t.renew_deadline {
            return Err(LeaderConfigError::Timings("lease duration must exceed the renew deadline"));
        }
        if t.renew_deadline.as_secs_f64() <= 1.2 * t.retry_period.as_secs_f64() {
            return Err(LeaderConfigError::Timings("renew deadline must exceed 1.2 × the retry period"));
        }
        if t.lease_duration.as_secs() < 1 || t.lease_duration.as_secs() > i32::MAX as u64 {
            return Err(LeaderConfigError::Timings("lease duration must be whole seconds ≥ 1"));
        }
        Ok(())
    }

    /// The role a replica starts with: `Follower` in a lease mode, else `Standalone`.
    pub fn initial_role(&self) -> Role {
        if self.mode == LeaderMode::Off { Role::Standalone } else { Role::Follower }
    }

    fn own_pod(&self) -> Option<(String, String)> {
        Some((self.pod_namespace.clone()?, self.pod_name.clone()?))
            .filter(|(n, p)| !n.is_empty() && !p.is_empty())
    }
}

/// The API calls of leader election: one Lease, and our pod's role label.
pub trait LeaseApi: Send + Sync + 'static {
    /// Reads the Lease (`None` when absent).
    fn get(&self) -> impl Future<Output = Result<Option<Lease>, ClusterError>> + Send;
    /// Creates the Lease (`Conflict` when it already exists).
    fn create(&self, lease: &Lease) -> impl Future<Output = Result<Lease, ClusterError>> + Send;
    /// Replaces the Lease; `Conflict` when its `metadata.resourceVersion` is not the current one.
    fn replace(&self, lease: &Lease) -> impl Future<Output = Result<Lease, ClusterError>> + Send;
    /// Sets [`ROLE_LABEL`] on a pod.
    fn patch_role_label(
        &self,
        namespace: &str,
        pod: &str,
        role: &str,
    ) -> impl Future<Output = Result<(), ClusterError>> + Send;
}

/// [`LeaseApi`] over a `kube::Client` (requests in the module docs).
#[derive(Clone)]
pub struct KubeLeaseApi {
    client: Client,
    namespace: String,
    name: String,
}

impl std::fmt::Debug for KubeLeaseApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeLeaseApi").field("namespace", &self.namespace).field("name", &self.name).finish()
    }
}

impl KubeLeaseApi {
    /// The Lease `<namespace>/<name>` through `client`.
    pub fn new(client: Client, namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self { client, namespace: namespace.into(), name: name.into() }
    }

    fn api(&self) -> Api<Lease> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    fn object(&self) -> String {
        format!("lease {}/{}", self.namespace, self.name)
    }
}

impl LeaseApi for KubeLeaseApi {
    async fn get(&self) -> Result<Option<Lease>, ClusterError> {
        self.api().get_opt(&self.name).await.map_err(|e| cluster_error("get", &self.object(), &e))
    }

    async fn create(&self, lease: &Lease) -> Result<Lease, ClusterError> {
        self.api()
            .create(&PostParams::default(), lease)
            .await
            .map_err(|e| cluster_error("create", &self.object(), &e))
    }

    async fn replace(&self, lease: &Lease) -> Result<Lease, ClusterError> {
        self.api()
            .replace(&self.name, &PostParams::default(), lease)
            .await
            .map_err(|e| cluster_error("replace", &self.object(), &e))
    }

    async fn patch_role_label(&self, namespace: &str, pod: &str, role: &str) -> Result<(), ClusterError> {
        let object = format!("pod {namespace}/{pod}");
        let body: serde_json::Value = serde_json::json!({"metadata": {"labels": {ROLE_LABEL: role}}});
        let api: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(self.client.clone(), namespace);
        api.patch(pod, &PatchParams::default(), &Patch::Merge(body))
            .await
            .map(drop)
            .map_err(|e| cluster_error("patch", &object, &e))
    }
}

#[derive(Debug, Default)]
struct MemoryLeaseState {
    lease: Option<Lease>,
    version: u64,
    fail_next: u32,
    fail_labels: u32,
    down: bool,
    labels: Vec<(String, String, String)>,
}

/// An in-memory [`LeaseApi`] for tests: one Lease with resource versions and conflicts like the API server,
/// shared by every clone. Each call yields to the scheduler once before it runs, so concurrent electors
/// interleave their reads and writes.
#[derive(Debug, Clone)]
pub struct MemoryLeases {
    namespace: String,
    name: String,
    state: Arc<Mutex<MemoryLeaseState>>,
}

impl MemoryLeases {
    /// An absent Lease `<namespace>/<name>`.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        Self { namespace: namespace.into(), name: name.into(), state: Arc::default() }
    }

    fn lock(&self) -> MutexGuard<'_, MemoryLeaseState> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The Lease as stored.
    pub fn lease(&self) -> Option<Lease> {
        self.lock().lease.clone()
    }

    /// The holder, if any.
    pub fn holder(&self) -> Option<String> {
        self.lease().and_then(|l| l.spec).and_then(|s| s.holder_identity).filter(|h| !h.is_empty())
    }

    /// Stores a Lease as another writer would (bumping the resource version).
    pub fn put(&self, mut lease: Lease) {
        let mut s = self.lock();
        s.version += 1;
        lease.metadata.resource_version = Some(s.version.to_string());
        lease.metadata.name = Some(self.name.clone());
        lease.metadata.namespace = Some(self.namespace.clone());
        s.lease = Some(lease);
    }

    /// The next `n` calls (any kind) fail as unavailable.
    pub fn fail_next(&self, n: u32) {
        self.lock().fail_next = n;
    }

    /// The next `n` role-label patches fail as unavailable.
    pub fn fail_label_patches(&self, n: u32) {
        self.lock().fail_labels = n;
    }

    /// While down, every call fails as unavailable (an API server outage).
    pub fn set_down(&self, down: bool) {
        self.lock().down = down;
    }

    /// Role labels patched so far: (namespace, pod, value).
    pub fn labels(&self) -> Vec<(String, String, String)> {
        self.lock().labels.clone()
    }

    fn check(&self, s: &mut MemoryLeaseState) -> Result<(), ClusterError> {
        if s.down {
            return Err(ClusterError::Unavailable("injected outage".into()));
        }
        if s.fail_next > 0 {
            s.fail_next -= 1;
            return Err(ClusterError::Unavailable("injected failure".into()));
        }
        Ok(())
    }
}

impl LeaseApi for MemoryLeases {
    async fn get(&self) -> Result<Option<Lease>, ClusterError> {
        tokio::task::yield_now().await;
        let mut s = self.lock();
        self.check(&mut s)?;
        Ok(s.lease.clone())
    }

    async fn create(&self, lease: &Lease) -> Result<Lease, ClusterError> {
        tokio::task::yield_now().await;
        let mut s = self.lock();
        self.check(&mut s)?;
        if s.lease.is_some() {
            return Err(ClusterError::Conflict(format!(
                "lease {}/{} already exists",
                self.namespace, self.name
            )));
        }
        s.version += 1;
        let mut stored = lease.clone();
        stored.metadata.resource_version = Some(s.version.to_string());
        s.lease = Some(stored.clone());
        Ok(stored)
    }

    async fn replace(&self, lease: &Lease) -> Result<Lease, ClusterError> {
        tokio::task::yield_now().await;
        let mut s = self.lock();
        self.check(&mut s)?;
        let current = s.lease.as_ref().and_then(|l| l.metadata.resource_version.clone());
        let Some(current) = current else {
            return Err(ClusterError::NotFound(format!("lease {}/{}", self.namespace, self.name)));
        };
        if lease.metadata.resource_version.as_deref() != Some(current.as_str()) {
            return Err(ClusterError::Conflict(format!(
                "lease {}/{} was modified",
                self.namespace, self.name
            )));
        }
        s.version += 1;
        let mut stored = lease.clone();
        stored.metadata.resource_version = Some(s.version.to_string());
        s.lease = Some(stored.clone());
        Ok(stored)
    }

    async fn patch_role_label(&self, namespace: &str, pod: &str, role: &str) -> Result<(), ClusterError> {
        tokio::task::yield_now().await;
        let mut s = self.lock();
        self.check(&mut s)?;
        if s.fail_labels > 0 {
            s.fail_labels -= 1;
            return Err(ClusterError::Unavailable("injected label failure".into()));
        }
        s.labels.push((namespace.to_owned(), pod.to_owned(), role.to_owned()));
        Ok(())
    }
}

fn micro_time(ns: i64) -> MicroTime {
    // Whole microseconds, as the API server stores them.
    let us = ns.div_euclid(1_000);
    MicroTime(Timestamp::from_microsecond(us).unwrap_or(Timestamp::UNIX_EPOCH))
}

/// Lease expiry as client-go's leader election judges it: a holder's term runs `leaseDurationSeconds` from the
/// local time at which this observer first saw the current record (holder, times, transitions), so only our own
/// clock is compared with itself. A record that keeps changing (a leader renewing) never expires; one that stops
/// changing expires one lease duration after it was first seen, even when its `renewTime` is older.
#[derive(Debug, Clone, Default)]
pub struct LeaseObservation {
    record: Option<LeaseSpec>,
    observed_ns: i64,
}

impl LeaseObservation {
    /// Notes the Lease's current record at `now_ns` (our clock) and says whether it is held: it has a holder
    /// and `observed + leaseDurationSeconds ≥ now`.
    pub fn held(&mut self, lease: &Lease, now_ns: i64) -> bool {
        let default = LeaseSpec::default();
        let spec = lease.spec.as_ref().unwrap_or(&default);
        if self.record.as_ref() != Some(spec) {
            self.record = Some(spec.clone());
            self.observed_ns = now_ns;
        }
        let Some(spec) = self.record.as_ref() else { return false };
        if spec.holder_identity.as_deref().is_none_or(str::is_empty) {
            return false;
        }
        let duration = i64::from(spec.lease_duration_seconds.unwrap_or(0)).saturating_mul(NS_PER_S);
        self.observed_ns.saturating_add(duration) >= now_ns
    }

    /// Records a record we just wrote ourselves at `now_ns`.
    pub fn wrote(&mut self, spec: LeaseSpec, now_ns: i64) {
        self.record = Some(spec);
        self.observed_ns = now_ns;
    }
}

/// Whether `holder` is an identity made from `prefix`: it starts with the prefix and the prefix ends at a
/// separator (`sched-1` matches `sched-1_abc` and `sched-1`, not `sched-10_abc`).
pub fn holder_has_prefix(holder: &str, prefix: &str) -> bool {
    if prefix.is_empty() {
        return false;
    }
    let Some(rest) = holder.strip_prefix(prefix) else { return false };
    rest.is_empty()
        || !prefix.ends_with(|c: char| c.is_ascii_alphanumeric())
        || rest.starts_with(|c: char| !c.is_ascii_alphanumeric())
}

/// One replica's side of the election (the state machine; [`run_with`] drives it every `retry_period`).
pub struct Elector<A> {
    api: A,
    identity: String,
    lease_namespace: String,
    lease_name: String,
    timings: LeaseTimings,
    clock: Arc<dyn Clock>,
    leading: bool,
    last_renew_ns: i64,
    observed: LeaseObservation,
}

impl<A> std::fmt::Debug for Elector<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Elector")
            .field("identity", &self.identity)
            .field("lease", &format_args!("{}/{}", self.lease_namespace, self.lease_name))
            .field("leading", &self.leading)
            .finish_non_exhaustive()
    }
}

impl<A: LeaseApi> Elector<A> {
    /// An elector named `identity` competing for the Lease of `config`.
    pub fn new(api: A, identity: impl Into<String>, config: &LeaderConfig, clock: Arc<dyn Clock>) -> Self {
        Self {
            api,
            identity: identity.into(),
            lease_namespace: config.lease_namespace.clone(),
            lease_name: config.lease_name.clone(),
            timings: config.timings,
            clock,
            leading: false,
            last_renew_ns: 0,
            observed: LeaseObservation::default(),
        }
    }

    /// Our identity.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// Whether we lead (as of the last [`tick`](Self::tick)).
    pub fn is_leader(&self) -> bool {
        self.leading
    }

    fn duration_s(&self) -> i32 {
        i32::try_from(self.timings.lease_duration.as_secs()).unwrap_or(i32::MAX).max(1)
    }

    fn deadline_passed(&self, now_ns: i64) -> bool {
        let deadline = i64::try_from(self.timings.renew_deadline.as_nanos()).unwrap_or(i64::MAX);
        now_ns.saturating_sub(self.last_renew_ns) > deadline
    }

    /// One acquire-or-renew attempt at the clock's now; returns the role after it.
    pub async fn tick(&mut self) -> Role {
        let now = self.clock.now_ns();
        match self.try_acquire_or_renew(now).await {
            Ok(true) => {
                if !self.leading {
                    tracing::info!(identity = %self.identity, lease = %self.lease_name, "became the leader");
                }
                self.leading = true;
                self.last_renew_ns = now;
            }
            Ok(false) => {
                if self.leading {
                    tracing::warn!(identity = %self.identity, "another replica holds the lease; stepping down");
                }
                self.leading = false;
            }
            Err(e) => {
                if self.leading && self.deadline_passed(now) {
                    tracing::warn!(identity = %self.identity, error = %e, "could not renew the lease before the deadline; stepping down");
                    self.leading = false;
                } else {
                    tracing::debug!(identity = %self.identity, error = %e, "lease attempt failed");
                }
            }
        }
        if self.leading { Role::Leader } else { Role::Follower }
    }

    fn spec(&self, now: i64, acquire: MicroTime, transitions: i32, base: Option<&LeaseSpec>) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(self.duration_s()),
            acquire_time: Some(acquire),
            renew_time: Some(micro_time(now)),
            lease_transitions: Some(transitions),
            ..base.cloned().unwrap_or_default()
        }
    }

    /// `Ok(true)`: we hold the Lease now; `Ok(false)`: someone else does.
    async fn try_acquire_or_renew(&mut self, now: i64) -> Result<bool, ClusterError> {
        let Some(current) = self.api.get().await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.lease_name.clone()),
                    namespace: Some(self.lease_namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(self.spec(now, micro_time(now), 0, None)),
            };
            self.api.create(&lease).await?;
            self.observed.wrote(lease.spec.unwrap_or_default(), now);
            return Ok(true);
        };
        let spec = current.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.as_deref().unwrap_or_default();
        let ours = holder == self.identity;
        // Observe on every read, so the expiry clock restarts whenever the record changes.
        let held = self.observed.held(&current, now);
        if !ours && held {
            return Ok(false);
        }
        let (acquire, transitions) = if ours {
            (
                spec.acquire_time.clone().unwrap_or_else(|| micro_time(now)),
                spec.lease_transitions.unwrap_or(0),
            )
        } else {
            (micro_time(now), spec.lease_transitions.unwrap_or(0).saturating_add(1))
        };
        let lease = Lease {
            metadata: current.metadata.clone(),
            spec: Some(self.spec(now, acquire, transitions, Some(&spec))),
        };
        self.api.replace(&lease).await?;
        self.observed.wrote(lease.spec.unwrap_or_default(), now);
        Ok(true)
    }

    /// Gives the Lease up if we hold it (holder cleared, duration 1 s); returns whether it was released.
    pub async fn release(&mut self) -> bool {
        if !self.leading {
            return false;
        }
        self.leading = false;
        let now = self.clock.now_ns();
        let current = match self.api.get().await {
            Ok(Some(l)) => l,
            Ok(None) => return false,
            Err(e) => {
                tracing::warn!(error = %e, "could not read the lease to release it");
                return false;
            }
        };
        let spec = current.spec.clone().unwrap_or_default();
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return false;
        }
        let released = LeaseSpec {
            holder_identity: None,
            lease_duration_seconds: Some(1),
            acquire_time: Some(micro_time(now)),
            renew_time: Some(micro_time(now)),
            ..spec
        };
        match self.api.replace(&Lease { metadata: current.metadata, spec: Some(released) }).await {
            Ok(_) => {
                tracing::info!(identity = %self.identity, "released the lease");
                true
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not release the lease");
                false
            }
        }
    }
}

/// `--watch-lease`: the role from another component's Lease.
pub struct LeaseWatcher<A> {
    api: A,
    prefix: String,
    clock: Arc<dyn Clock>,
    role: Role,
    observed: LeaseObservation,
}

impl<A> std::fmt::Debug for LeaseWatcher<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseWatcher")
            .field("prefix", &self.prefix)
            .field("role", &self.role)
            .finish_non_exhaustive()
    }
}

impl<A: LeaseApi> LeaseWatcher<A> {
    /// Follows the Lease behind `api`; leader while its holder has `prefix` (see [`holder_has_prefix`]).
    pub fn new(api: A, prefix: impl Into<String>, clock: Arc<dyn Clock>) -> Self {
        Self {
            api,
            prefix: prefix.into(),
            clock,
            role: Role::Follower,
            observed: LeaseObservation::default(),
        }
    }

    /// Reads the Lease once; returns the role (unchanged when the read fails).
    pub async fn tick(&mut self) -> Role {
        match self.api.get().await {
            Ok(lease) => {
                let now = self.clock.now_ns();
                let leading = lease.as_ref().is_some_and(|l| {
                    self.observed.held(l, now)
                        && l.spec
                            .as_ref()
                            .and_then(|s| s.holder_identity.as_deref())
                            .is_some_and(|h| holder_has_prefix(h, &self.prefix))
                });
                let role = if leading { Role::Leader } else { Role::Follower };
                if role != self.role {
                    tracing::info!(?role, prefix = %self.prefix, "watched lease changed our role");
                }
                self.role = role;
            }
            Err(e) => tracing::warn!(error = %e, "could not read the watched lease"),
        }
        self.role
    }
}

/// Keeps our pod's [`ROLE_LABEL`] equal to the readiness role, retrying with backoff; never returns.
async fn label_loop<A: LeaseApi>(
    api: &A,
    namespace: &str,
    pod: &str,
    readiness: &Readiness,
    retry: Duration,
) {
    let mut rx = readiness.subscribe();
    let mut patched: Option<Role> = None;
    let min = retry.clamp(Duration::from_millis(100), Duration::from_secs(1));
    let max = Duration::from_secs(30);
    let mut delay = min;
    loop {
        let role = rx.borrow_and_update().1;
        if let Some(value) = role.label_value()
            && patched != Some(role)
        {
            match api.patch_role_label(namespace, pod, value).await {
                Ok(()) => {
                    tracing::info!(namespace, pod, role = value, "patched the role label");
                    patched = Some(role);
                    delay = min;
                }
                Err(e) => {
                    tracing::warn!(namespace, pod, role = value, error = %e, "patching the role label failed; retrying");
                    tokio::select! {
                        () = tokio::time::sleep(delay) => {}
                        r = rx.changed() => if r.is_err() { std::future::pending::<()>().await },
                    }
                    delay = (delay * 2).min(max);
                    continue;
                }
            }
        }
        if rx.changed().await.is_err() {
            // The sender lives in `readiness`, which we hold: unreachable, but never spin.
            std::future::pending::<()>().await;
        }
    }
}

/// Runs leader election (or lease watching) over the API server behind `client` until `shutdown` completes,
/// with a fresh [`unique_identity`] and the wall clock. Returns at once when the mode is off.
pub async fn run(
    client: Client,
    config: LeaderConfig,
    readiness: Readiness,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), LeaderConfigError> {
    config.validate()?;
    let api = KubeLeaseApi::new(client, config.lease_namespace.clone(), config.lease_name.clone());
    let identity = unique_identity(&config.identity_prefix);
    run_with(api, config, identity, Arc::new(SystemClock), readiness, shutdown).await
}

/// [`run`] over any [`LeaseApi`], identity and clock (tests, other lease stores).
pub async fn run_with<A: LeaseApi + Clone>(
    api: A,
    config: LeaderConfig,
    identity: String,
    clock: Arc<dyn Clock>,
    readiness: Readiness,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), LeaderConfigError> {
    config.validate()?;
    if config.mode == LeaderMode::Off {
        readiness.set_role(Role::Standalone);
        return Ok(());
    }
    readiness.set_role(Role::Follower);
    let retry = config.timings.retry_period;
    let own_pod = config.own_pod();
    if own_pod.is_none() {
        tracing::info!("POD_NAMESPACE/POD_NAME unknown: the role label is not maintained");
    }
    tracing::info!(identity = %identity, mode = ?config.mode, lease = %config.lease_name, "leader election starting");
    let mut elector = Elector::new(api.clone(), identity.clone(), &config, clock.clone());
    let mut watcher = LeaseWatcher::new(api.clone(), config.identity_prefix.clone(), clock);
    {
        let decide = async {
            loop {
                let role = match config.mode {
                    LeaderMode::Elect => elector.tick().await,
                    _ => watcher.tick().await,
                };
                if readiness.role() != role {
                    readiness.set_role(role);
                }
                tokio::time::sleep(retry).await;
            }
        };
        let labels = async {
            match &own_pod {
                Some((ns, pod)) => label_loop(&api, ns, pod, &readiness, retry).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            biased;
            () = shutdown => {}
            () = decide => {}
            () = labels => {}
        }
    }
    let was_leader = readiness.role() == Role::Leader;
    if config.mode == LeaderMode::Elect {
        elector.release().await;
    }
    readiness.set_role(Role::Follower);
    if was_leader && let Some((ns, pod)) = &own_pod {
        // Best effort: the pod is going away.
        if let Err(e) = api.patch_role_label(ns, pod, "follower").await {
            tracing::debug!(error = %e, "could not reset the role label on shutdown");
        }
    }
    tracing::info!(identity = %identity, "leader election stopped");
    Ok(())
}
