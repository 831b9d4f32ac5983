#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Gate `SerializedNodeBind` at the extender level, over a cluster whose patches can be held back: the
//! pre-allocation patches of binds to one node run concurrently, but the bindings are created in the order of
//! the binds' `predicate-time` (the order the device plugin matches Allocate calls in), even when a later
//! bind's patch finishes first. With the gate off, a later bind does not wait.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use vgpu_core::domain::ResourceDomain;
use vgpu_core::model::{NodeDeviceInventory, NodeVgpuConfig};
use vgpu_scheduler::cluster::{Binding, Event};
use vgpu_scheduler::fixture::{vgpu_node, vgpu_pod};
use vgpu_scheduler::{
    Cluster, ClusterError, Extender, ExtenderConfig, ManualClock, MemoryCluster, MetadataPatch,
};
use vgpu_scheduler::{Node, Pod};

/// A [`MemoryCluster`] whose next patch of a chosen pod waits for a signal, and which records the bindings in
/// the order they are created.
#[derive(Clone, Default)]
struct HeldCluster {
    inner: MemoryCluster,
    held: Arc<Mutex<HashMap<String, Arc<Notify>>>>,
    bound: Arc<Mutex<Vec<String>>>,
}

impl HeldCluster {
    fn hold_patch(&self, name: &str) -> Arc<Notify> {
        let n = Arc::new(Notify::new());
        self.held.lock().unwrap().insert(name.to_owned(), n.clone());
        n
    }
    fn bound(&self) -> Vec<String> {
        self.bound.lock().unwrap().clone()
    }
}

impl Cluster for HeldCluster {
    async fn snapshot(&self) -> Result<(Vec<Node>, Vec<Pod>), ClusterError> {
        self.inner.snapshot().await
    }
    async fn get_pod(&self, namespace: &str, name: &str) -> Result<Pod, ClusterError> {
        self.inner.get_pod(namespace, name).await
    }
    async fn patch_pod_metadata(
        &self,
        namespace: &str,
        name: &str,
        patch: &MetadataPatch,
    ) -> Result<Pod, ClusterError> {
        // Held once: a second patch of the pod (marking it failed) goes through.
        let gate = self.held.lock().unwrap().remove(name);
        if let Some(gate) = gate {
            gate.notified().await;
        }
        self.inner.patch_pod_metadata(namespace, name, patch).await
    }
    async fn bind_pod(&self, binding: &Binding) -> Result<(), ClusterError> {
        self.inner.bind_pod(binding).await?;
        self.bound.lock().unwrap().push(binding.name.clone());
        Ok(())
    }
    async fn record_event(&self, event: Event) {
        self.inner.record_event(event).await;
    }
}

struct Env {
    cluster: HeldCluster,
    ext: Arc<Extender<HeldCluster, ManualClock>>,
    d: ResourceDomain,
}

async fn env(serialize_bind: bool) -> Env {
    let d = ResourceDomain::default();
    let cluster = HeldCluster::default();
    let inv = NodeDeviceInventory::uniform(2, 16384, 4);
    cluster.inner.upsert_node(vgpu_node("n0", &inv, &NodeVgpuConfig::default(), None, &d).unwrap());
    let config = ExtenderConfig { serialize_bind, emit_events: false, ..ExtenderConfig::default() };
    let ext = Arc::new(Extender::new(cluster.clone(), Arc::new(ManualClock::new(1_000_000_000)), config));
    ext.sync().await.unwrap();
    Env { cluster, ext, d }
}

impl Env {
    /// A pod filtered onto n0 (its placement pending).
    async fn filtered(&self, uid: &str) -> Pod {
        let pod = self.cluster.inner.upsert_pod(vgpu_pod(uid, 1, 10, 0, &[], &self.d));
        self.ext.cache().upsert_pod(pod.clone(), 1_000_000_000);
        let r = self.ext.filter(Some(&pod), vec!["n0".to_owned()]).await;
        assert_eq!(r.node_names(), ["n0"], "{r:?}");
        pod
    }
    fn bind(&self, pod: &Pod) -> tokio::task::JoinHandle<String> {
        let (ext, pod) = (self.ext.clone(), pod.clone());
        tokio::spawn(async move { ext.bind(&pod.namespace, &pod.name, &pod.uid, "n0").await.error })
    }
    fn predicate_time(&self, pod: &Pod) -> i64 {
        let p = self.cluster.inner.pod(&pod.namespace, &pod.name).unwrap();
        p.annotations[&self.d.predicate_time()].parse().unwrap()
    }
}

/// Yields until `cond` holds (the binds run on the same runtime), failing after a generous bound.
async fn until(what: &str, cond: impl Fn() -> bool) {
    for _ in 0..10_000 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("{what}: not reached");
}

type Bind = tokio::task::JoinHandle<String>;

/// Pods a and b filtered onto n0 (gate on); a's bind takes the first place in n0's queue with its patch held
/// back, b's bind patches meanwhile and waits for its turn.
async fn a_held_and_b_queued_behind() -> (Env, Pod, Pod, Arc<Notify>, Bind, Bind) {
    let e = env(true).await;
    let a = e.filtered("a").await;
    let b = e.filtered("b").await;
    let gate = e.cluster.hold_patch(&a.name);
    let bind_a = e.bind(&a);
    until("a queued", || e.ext.pending_count() == 1).await;
    let bind_b = e.bind(&b);
    until("b patched", || {
        e.cluster.inner.pod("default", &b.name).unwrap().annotations.contains_key(&e.d.pre_allocated())
    })
    .await;
    (e, a, b, gate, bind_a, bind_b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bindings_to_one_node_follow_predicate_time_when_a_later_patch_finishes_first() {
    let (e, a, b, gate, bind_a, bind_b) = a_held_and_b_queued_behind().await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(e.cluster.bound().is_empty(), "b's binding waits for a's: {:?}", e.cluster.bound());
    gate.notify_one();
    assert_eq!(bind_a.await.unwrap(), "");
    assert_eq!(bind_b.await.unwrap(), "");
    assert_eq!(e.cluster.bound(), [a.name.clone(), b.name.clone()]);
    assert!(e.predicate_time(&a) < e.predicate_time(&b), "times follow the queue");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_binding_lets_the_next_one_go() {
    let (e, _a, b, gate, bind_a, bind_b) = a_held_and_b_queued_behind().await;
    // a's binding fails: b, queued behind it, is bound all the same.
    e.cluster.inner.fail_next_binds(1);
    gate.notify_one();
    assert_eq!(bind_a.await.unwrap(), "injected binding failure");
    assert_eq!(bind_b.await.unwrap(), "");
    assert_eq!(e.cluster.bound(), std::slice::from_ref(&b.name));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_gate_a_later_bind_does_not_wait() {
    let e = env(false).await;
    let a = e.filtered("a").await;
    let b = e.filtered("b").await;
    let gate = e.cluster.hold_patch(&a.name);
    let bind_a = e.bind(&a);
    until("a started", || e.ext.pending_count() == 1).await;
    assert_eq!(e.bind(&b).await.unwrap(), "");
    assert_eq!(e.cluster.bound(), std::slice::from_ref(&b.name));
    gate.notify_one();
    assert_eq!(bind_a.await.unwrap(), "");
    assert_eq!(e.cluster.bound(), [b.name.clone(), a.name.clone()]);
}
