//! The cache driver: list+watch of Nodes and Pods feeding the [`ClusterCache`] incrementally.
//!
//! Each kind runs its own reflector loop, client-go style:
//!
//! 1. **List** (paged, `limit=<page_size>` and continue tokens, from the most recent state) and apply every
//!    object; objects the cache holds but the list does not are deleted (see below).
//! 2. **Watch** from the list's `resourceVersion` with bookmarks; `ADDED`/`MODIFIED` upsert, `DELETED`
//!    deletes, `BOOKMARK` only advances the resource version. The events one read of the stream brings (the
//!    API server writes every event queued for a watch before it flushes) are applied together, in order:
//!    pods added or changed in a row under one lock of the cache (at most 64 at a time,
//!    [`ClusterCache::upsert_pods`]), not one lock round each.
//! 3. When a watch ends (server timeout, idle connection, stream error) it is re-opened from the last
//!    resource version seen; when the API server answers `410 Gone` (the version is too old) the loop goes
//!    back to 1 — a **re-list**.
//!
//! Requests (all namespaces; `<rv>` is the last resource version seen):
//!
//! | step | request |
//! |---|---|
//! | list nodes | `GET /api/v1/nodes?&limit=500`, then `…&limit=500&continue=<token>` |
//! | watch nodes | `GET /api/v1/nodes?&watch=true&timeoutSeconds=290&allowWatchBookmarks=true&resourceVersion=<rv>` |
//! | list pods | `GET /api/v1/pods?&limit=500`, then `…&limit=500&continue=<token>` |
//! | watch pods | `GET /api/v1/pods?&watch=true&timeoutSeconds=290&allowWatchBookmarks=true&resourceVersion=<rv>` |
//!
//! **Re-lists delete what vanished.** After a re-list, a node not in the list is deleted from the cache, and so
//! is a pod not in the list unless the cache holds it at a resource version newer than the list's (the
//! extender itself writes pods it has just patched into the cache; such a pod changed after the list was
//! taken, so the watch that follows reports what becomes of it). Resource versions are compared as integers,
//! as everywhere in the cache; a version that is not an integer counts as older.
//!
//! **Readiness.** [`Readiness::set_synced(true)`](Readiness::set_synced) is called once both initial lists
//! are in the cache and stays set across later re-lists and watch failures: the cache keeps serving the last
//! known state, which is what client-go informers do too.
//!
//! **Expiry.** Every `sweep_interval` the driver calls [`ClusterCache::sweep`] so in-flight reservations and
//! stuck pre-allocations expire even when no event arrives.
//!
//! Failed lists and watches are retried with exponential backoff (`backoff_min` doubling up to
//! `backoff_max`), logged with `tracing`; nothing here panics or gives up.
//!
//! # Example
//!
//! ```no_run
//! use std::sync::Arc;
//! use vgpu_scheduler::watch::CacheDriver;
//! use vgpu_lease::{Readiness, Role};
//! use vgpu_scheduler::ClusterCache;
//! # async fn run(client: kube::Client) {
//! let cache = Arc::new(ClusterCache::new(Default::default(), 30_000_000_000));
//! let readiness = Readiness::new(Role::Standalone);
//! let stop = tokio_util::sync::CancellationToken::new();
//! let driver =
//!     CacheDriver::new(client, cache.clone(), readiness.clone()).spawn(stop.clone().cancelled_owned());
//! readiness.wait_synced().await;
//! // … serve the extender over `cache` …
//! stop.cancel();
//! let _ = driver.await;
//! # }
//! ```

use std::collections::HashSet;
use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1 as corev1;
use k8s_openapi::serde::de::DeserializeOwned;
use kube::api::{ListParams, WatchEvent, WatchParams};
use kube::{Api, Client, Resource};
use tokio_stream::StreamExt;

use crate::api_pod::ApiPod;
use crate::cache::ClusterCache;
use crate::convert::node_from_k8s;
use vgpu_core::clock::{Clock, SystemClock};
use vgpu_lease::Readiness;

/// Settings of the cache driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchConfig {
    /// Objects per list page (client-go's pager default: 500).
    pub page_size: u32,
    /// `timeoutSeconds` of each watch (default 290, as kube-rs); the client gives up on a watch that stays
    /// silent 5 s longer than this and re-opens it.
    pub watch_timeout_s: u32,
    /// How often reservations and stuck pre-allocations are expired (default 1 s).
    pub sweep_interval: Duration,
    /// First retry delay after a failed list or watch (default 800 ms).
    pub backoff_min: Duration,
    /// Longest retry delay (default 30 s).
    pub backoff_max: Duration,
}

impl Default for WatchConfig {
    fn default() -> Self {
        Self {
            page_size: crate::kube_cluster::LIST_PAGE_SIZE,
            watch_timeout_s: 290,
            sweep_interval: Duration::from_secs(1),
            backoff_min: Duration::from_millis(800),
            backoff_max: Duration::from_secs(30),
        }
    }
}

/// Watches Nodes and Pods and keeps a [`ClusterCache`] up to date (see the module docs).
pub struct CacheDriver {
    client: Client,
    cache: Arc<ClusterCache>,
    clock: Arc<dyn Clock>,
    readiness: Readiness,
    config: WatchConfig,
}

impl Debug for CacheDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CacheDriver").field("config", &self.config).finish_non_exhaustive()
    }
}

impl CacheDriver {
    /// A driver feeding `cache` from the API server behind `client`, reporting sync on `readiness`; wall
    /// clock, default [`WatchConfig`].
    pub fn new(client: Client, cache: Arc<ClusterCache>, readiness: Readiness) -> Self {
        Self { client, cache, clock: Arc::new(SystemClock), readiness, config: WatchConfig::default() }
    }

    /// Uses another clock (the extender's, so predicate times and expiry agree).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// Uses other settings.
    pub fn with_config(mut self, config: WatchConfig) -> Self {
        self.config = config;
        self
    }

    /// Runs until `shutdown` completes.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) {
        let gate = SyncGate { readiness: self.readiness.clone(), pending: Arc::new(AtomicU8::new(2)) };
        let mut nodes = NodeSink { cache: self.cache.clone(), gate: gate.clone(), listed: false };
        let mut pods = PodSink { cache: self.cache.clone(), clock: self.clock.clone(), gate, listed: false };
        let node_api: Api<corev1::Node> = Api::all(self.client.clone());
        // Pods are decoded into only the fields the extender reads (`api_pod` module docs): every pod passes
        // through several watch events, and most of each object (managed fields, env, volumes, status) is unused.
        let pod_api: Api<ApiPod> = Api::all(self.client.clone());
        let sweeper = async {
            let mut tick = tokio::time::interval(self.config.sweep_interval.max(Duration::from_millis(1)));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                self.cache.sweep(self.clock.now_ns());
            }
        };
        tokio::select! {
            biased;
            () = shutdown => tracing::info!("cache driver stopping"),
            () = reflect(node_api, &self.config, &mut nodes, "nodes") => {}
            () = reflect(pod_api, &self.config, &mut pods, "pods") => {}
            () = sweeper => {}
        }
    }

    /// Runs on a new task until `shutdown` completes.
    pub fn spawn(self, shutdown: impl Future<Output = ()> + Send + 'static) -> tokio::task::JoinHandle<()> {
        tokio::spawn(self.run(shutdown))
    }
}

/// Runs a [`CacheDriver`] with default settings until `shutdown` completes.
pub async fn run_cache(
    client: Client,
    cache: Arc<ClusterCache>,
    clock: Arc<dyn Clock>,
    readiness: Readiness,
    shutdown: impl Future<Output = ()> + Send,
) {
    CacheDriver::new(client, cache, readiness).with_clock(clock).run(shutdown).await;
}

/// Marks the readiness synced when both kinds have been listed once.
#[derive(Clone)]
struct SyncGate {
    readiness: Readiness,
    pending: Arc<AtomicU8>,
}

impl SyncGate {
    fn listed(&self) {
        if self.pending.fetch_sub(1, Ordering::AcqRel) == 1 {
            tracing::info!("initial node and pod lists are in the cache");
            self.readiness.set_synced(true);
        }
    }
}

/// Where a reflector delivers what it sees.
trait Sink<K> {
    /// A complete list at `version` (0 if not an integer).
    fn relisted(&mut self, items: Vec<K>, version: u64);
    /// An object was added or changed.
    fn applied(&mut self, object: K);
    /// Objects were added or changed, in this order (taken out of `objects`).
    fn applied_all(&mut self, objects: &mut Vec<K>) {
        for o in objects.drain(..) {
            self.applied(o);
        }
    }
    /// An object was deleted.
    fn deleted(&mut self, object: K);
}

struct NodeSink {
    cache: Arc<ClusterCache>,
    gate: SyncGate,
    listed: bool,
}

impl Sink<corev1::Node> for NodeSink {
    fn relisted(&mut self, items: Vec<corev1::Node>, _version: u64) {
        let domain = self.cache.domain().clone();
        let mut seen = HashSet::with_capacity(items.len());
        for n in &items {
            let node = node_from_k8s(n, &domain);
            seen.insert(node.name.clone());
            self.cache.upsert_node(&node);
        }
        let gone: Vec<String> = self.cache.node_names().into_iter().filter(|n| !seen.contains(n)).collect();
        for name in &gone {
            self.cache.delete_node(name);
        }
        tracing::info!(nodes = seen.len(), deleted = gone.len(), "listed nodes");
        if !std::mem::replace(&mut self.listed, true) {
            self.gate.listed();
        }
    }

    fn applied(&mut self, object: corev1::Node) {
        self.cache.upsert_node(&node_from_k8s(&object, self.cache.domain()));
    }

    fn deleted(&mut self, object: corev1::Node) {
        if let Some(name) = object.metadata.name.as_deref() {
            self.cache.delete_node(name);
        }
    }
}

struct PodSink {
    cache: Arc<ClusterCache>,
    clock: Arc<dyn Clock>,
    gate: SyncGate,
    listed: bool,
}

impl Sink<ApiPod> for PodSink {
    fn relisted(&mut self, items: Vec<ApiPod>, version: u64) {
        let now = self.clock.now_ns();
        let mut seen = HashSet::with_capacity(items.len());
        for p in items {
            let pod = p.into_pod();
            if pod.uid.is_empty() {
                continue;
            }
            seen.insert(pod.uid.clone());
            self.cache.upsert_pod(pod, now);
        }
        // A pod the cache holds at a newer version than the list changed after the list was taken: the watch
        // from `version` tells what becomes of it.
        let gone: Vec<String> = self
            .cache
            .pods()
            .iter()
            .filter(|p| !seen.contains(&p.uid))
            .filter(|p| version == 0 || p.resource_version <= version)
            .map(|p| p.uid.clone())
            .collect();
        for uid in &gone {
            self.cache.delete_pod(uid);
        }
        tracing::info!(pods = seen.len(), deleted = gone.len(), version, "listed pods");
        if !std::mem::replace(&mut self.listed, true) {
            self.gate.listed();
        }
    }

    fn applied(&mut self, object: ApiPod) {
        let pod = object.into_pod();
        if !pod.uid.is_empty() {
            self.cache.upsert_pod(pod, self.clock.now_ns());
        }
    }

    fn applied_all(&mut self, objects: &mut Vec<ApiPod>) {
        let pods = objects.drain(..).map(ApiPod::into_pod).filter(|p| !p.uid.is_empty());
        self.cache.upsert_pods(pods, self.clock.now_ns());
    }

    fn deleted(&mut self, object: ApiPod) {
        if let Some(uid) = object.metadata.uid.as_deref() {
            self.cache.delete_pod(uid);
        }
    }
}

/// Exponential retry delay.
struct Backoff {
    min: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    fn new(config: &WatchConfig) -> Self {
        Self { min: config.backoff_min, max: config.backoff_max, next: config.backoff_min }
    }

    async fn wait(&mut self) {
        let d = self.next;
        self.next = (self.next * 2).min(self.max).max(self.min);
        tokio::time::sleep(d).await;
    }

    fn reset(&mut self) {
        self.next = self.min;
    }
}

fn version_of<K: Resource>(object: &K) -> Option<String> {
    object.meta().resource_version.clone().filter(|v| !v.is_empty())
}

/// One complete paged list and its resource version.
async fn list_all<K>(api: &Api<K>, page_size: u32) -> Result<(Vec<K>, String), kube::Error>
where
    K: Clone + DeserializeOwned + Debug,
{
    let mut items = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let mut params = ListParams::default().limit(page_size.max(1));
        if let Some(t) = &token {
            params = params.continue_token(t);
        }
        let page = api.list(&params).await?;
        items.extend(page.items);
        token = page.metadata.continue_.filter(|t| !t.is_empty());
        if token.is_none() {
            return Ok((items, page.metadata.resource_version.unwrap_or_default()));
        }
    }
}

fn is_gone(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(s) if s.code == 410)
}

/// What ended one watch request.
enum WatchEnd {
    /// Closed or idle: re-open from the last version.
    Closed,
    /// Failed: back off, then re-open from the last version.
    Failed,
    /// 410 Gone: re-list.
    Gone,
}

/// The list+watch loop of one kind; never returns.
async fn reflect<K, S>(api: Api<K>, config: &WatchConfig, sink: &mut S, what: &'static str)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    S: Sink<K>,
{
    let mut backoff = Backoff::new(config);
    loop {
        let (items, mut version) = match list_all(&api, config.page_size).await {
            Ok(list) => list,
            Err(e) => {
                tracing::warn!(kind = what, error = %e, "list failed; retrying");
                backoff.wait().await;
                continue;
            }
        };
        backoff.reset();
        sink.relisted(items, version.parse().unwrap_or(0));
        loop {
            match watch_once(&api, config, sink, what, &mut version).await {
                WatchEnd::Closed => {}
                WatchEnd::Failed => backoff.wait().await,
                WatchEnd::Gone => {
                    tracing::info!(kind = what, version = %version, "resource version expired; re-listing");
                    break;
                }
            }
        }
    }
}

/// Opens one watch from `version` and applies its events until it ends.
async fn watch_once<K, S>(
    api: &Api<K>,
    config: &WatchConfig,
    sink: &mut S,
    what: &'static str,
    version: &mut String,
) -> WatchEnd
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    S: Sink<K>,
{
    let params = WatchParams::default().timeout(config.watch_timeout_s);
    let stream = match api.watch(&params, version.as_str()).await {
        Ok(s) => s,
        Err(e) if is_gone(&e) => return WatchEnd::Gone,
        Err(e) => {
            tracing::warn!(kind = what, error = %e, "watch failed to start; retrying");
            return WatchEnd::Failed;
        }
    };
    let mut stream = std::pin::pin!(stream);
    let idle = Duration::from_secs(u64::from(config.watch_timeout_s) + 5);
    let mut batch = Vec::with_capacity(MAX_BATCH);
    let mut applied = Vec::with_capacity(MAX_BATCH);
    loop {
        let item = match tokio::time::timeout(idle, stream.next()).await {
            Ok(Some(item)) => item,
            Ok(None) => return WatchEnd::Closed,
            Err(_) => {
                tracing::debug!(kind = what, "watch idle; re-opening");
                return WatchEnd::Closed;
            }
        };
        batch.push(item);
        let ended = take_ready(stream.as_mut(), &mut batch);
        // Added and modified objects in a row go to the sink together (the cache takes its lock once for them);
        // anything else first flushes them, so the order of events is kept.
        for item in batch.drain(..) {
            if !matches!(item, Ok(WatchEvent::Added(_) | WatchEvent::Modified(_))) && !applied.is_empty() {
                sink.applied_all(&mut applied);
            }
            match item {
                Ok(WatchEvent::Added(o) | WatchEvent::Modified(o)) => {
                    if let Some(v) = version_of(&o) {
                        *version = v;
                    }
                    applied.push(o);
                }
                Ok(WatchEvent::Deleted(o)) => {
                    if let Some(v) = version_of(&o) {
                        *version = v;
                    }
                    sink.deleted(o);
                }
                Ok(WatchEvent::Bookmark(b)) => {
                    if !b.metadata.resource_version.is_empty() {
                        *version = b.metadata.resource_version;
                    }
                }
                Ok(WatchEvent::Error(status)) if status.code == 410 => return WatchEnd::Gone,
                Ok(WatchEvent::Error(status)) => {
                    tracing::warn!(kind = what, code = status.code, message = %status.message, "watch error");
                    return WatchEnd::Failed;
                }
                Err(e) => {
                    tracing::warn!(kind = what, error = %e, "watch stream failed; re-opening");
                    return WatchEnd::Failed;
                }
            }
        }
        if !applied.is_empty() {
            sink.applied_all(&mut applied);
        }
        if ended {
            return WatchEnd::Closed;
        }
    }
}

/// Most watch events applied as one batch: a burst of pod events (kube-apiserver writes the events queued for a
/// watch before it flushes, so one read brings many) is applied under one cache lock in rounds of this many, so
/// that a filter waiting for the lock waits no longer than 64 single updates take.
const MAX_BATCH: usize = 64;

/// Moves the items `stream` has ready without waiting into `batch` (up to [`MAX_BATCH`]): the rest of what the
/// read that produced the first one brought. True when the stream ended.
fn take_ready<S: tokio_stream::Stream + ?Sized>(
    mut stream: std::pin::Pin<&mut S>,
    batch: &mut Vec<S::Item>,
) -> bool {
    // A no-op waker: when nothing is ready, the next `stream.next().await` polls again with the task's own
    // waker (what a stream was last polled with is what it wakes).
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    while batch.len() < MAX_BATCH {
        match stream.as_mut().poll_next(&mut cx) {
            std::task::Poll::Ready(Some(item)) => batch.push(item),
            std::task::Poll::Ready(None) => return true,
            std::task::Poll::Pending => break,
        }
    }
    false
}
