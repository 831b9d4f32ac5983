//! Where the monitor learns which pods run on its node: a [`PodSource`] seam with a watch cache over the
//! API server ([`KubePods`]) and an in-memory table ([`InMemoryPods`]) for tests and examples.
//!
//! | impl | what it holds | synced (`/readyz`) |
//! |---|---|---|
//! | [`KubePods`] | a kube-runtime reflector of the pods labelled `<domain>/metrics-node=<node>` (the device plugin sets the label in `Allocate`; [`KubePods::start`]), or, on the DRA path, of the pods with field `spec.nodeName=<node>` ([`KubePods::start_on_node`]) | after the first full list |
//! | [`InMemoryPods`] | whatever [`InMemoryPods::set`] last stored | from construction |
//!
//! Both hand out `Arc<Pod>` snapshots: a scrape reads the cache without copying pods.

use std::{
    fmt,
    sync::{
        Arc, RwLock,
        atomic::{AtomicBool, Ordering},
    },
};

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::{WatchStreamExt, reflector, watcher};

/// The pods of this node the monitor collects from.
pub trait PodSource: Send + Sync + fmt::Debug {
    /// The current pods (a cheap snapshot).
    fn pods(&self) -> Vec<Arc<Pod>>;
    /// The cache has seen one full list (what `/readyz` reports).
    fn synced(&self) -> bool;
}

/// An in-memory [`PodSource`], always synced.
#[derive(Debug, Default)]
pub struct InMemoryPods {
    pods: RwLock<Vec<Arc<Pod>>>,
}

impl InMemoryPods {
    /// A source holding `pods`.
    pub fn new(pods: impl IntoIterator<Item = Pod>) -> Self {
        Self { pods: RwLock::new(pods.into_iter().map(Arc::new).collect()) }
    }

    /// Replaces the pods.
    pub fn set(&self, pods: impl IntoIterator<Item = Pod>) {
        let pods = pods.into_iter().map(Arc::new).collect();
        *self.pods.write().unwrap_or_else(std::sync::PoisonError::into_inner) = pods;
    }
}

impl PodSource for InMemoryPods {
    fn pods(&self) -> Vec<Arc<Pod>> {
        self.pods.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }
    fn synced(&self) -> bool {
        true
    }
}

/// A watch cache of the node's pods (label `<domain>/metrics-node=<node>`, or field `spec.nodeName=<node>`
/// on the DRA path), kept by a kube-runtime reflector that reconnects with backoff.
#[derive(Clone)]
pub struct KubePods {
    store: reflector::Store<Pod>,
    synced: Arc<AtomicBool>,
    selector: String,
}

impl fmt::Debug for KubePods {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KubePods")
            .field("selector", &self.selector)
            .field("pods", &self.store.len())
            .field("synced", &self.synced.load(Ordering::Relaxed))
            .finish()
    }
}

impl KubePods {
    /// The label selector for `node`: `<label_key>=<node>` (`label_key` is `ResourceDomain::metrics_node()`).
    pub fn selector(label_key: &str, node: &str) -> String {
        format!("{label_key}={node}")
    }

    /// The field selector of the DRA path: the pods bound to `node` (`spec.nodeName=<node>`).
    pub fn node_field_selector(node: &str) -> String {
        format!("spec.nodeName={node}")
    }

    /// Starts watching all namespaces' pods matching the label `selector` on the current tokio runtime; the
    /// watch runs until the runtime stops. Watch errors are logged and retried with backoff.
    pub fn start(client: kube::Client, selector: String) -> Self {
        let (store, synced) =
            watch(kube::Api::<Pod>::all(client), watcher::Config::default().labels(&selector), "pod");
        Self { store, synced, selector }
    }

    /// Starts watching the pods bound to `node` (field `spec.nodeName=<node>`, the DRA path: no label is set
    /// on DRA pods), as [`KubePods::start`] does.
    pub fn start_on_node(client: kube::Client, node: &str) -> Self {
        let selector = Self::node_field_selector(node);
        let (store, synced) =
            watch(kube::Api::<Pod>::all(client), watcher::Config::default().fields(&selector), "pod");
        Self { store, synced, selector }
    }
}

/// Runs a kube-runtime reflector of `api` under `config` on the current tokio runtime (errors logged as
/// `<what> watch failed`, retried with backoff) and returns its store and a flag set once the first full
/// list is in.
pub(crate) fn watch<K>(
    api: kube::Api<K>,
    config: watcher::Config,
    what: &'static str,
) -> (reflector::Store<K>, Arc<AtomicBool>)
where
    K: kube::Resource + Clone + fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
{
    let (store, writer) = reflector::store();
    let synced = Arc::new(AtomicBool::new(false));
    let stream = reflector(writer, watcher(api, config)).default_backoff();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(event) =
            std::future::poll_fn(|cx| futures_core::Stream::poll_next(stream.as_mut(), cx)).await
        {
            if let Err(err) = event {
                tracing::warn!(%err, "{what} watch failed; retrying");
            }
        }
    });
    {
        let (store, synced) = (store.clone(), Arc::clone(&synced));
        tokio::spawn(async move {
            if store.wait_until_ready().await.is_ok() {
                synced.store(true, Ordering::Release);
                tracing::info!(objects = store.len(), "{what} cache synced");
            }
        });
    }
    (store, synced)
}

impl PodSource for KubePods {
    fn pods(&self) -> Vec<Arc<Pod>> {
        self.store.state()
    }
    fn synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }
}
