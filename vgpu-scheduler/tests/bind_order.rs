#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Gate `SerializedNodeBind` and [`BindWrites`] at the extender level, over a cluster whose patches and
//! bindings can be held back: with the pre-allocation patched before the binding, the patches of binds to one
//! node run concurrently, but the bindings are created in the order of the binds' `predicate-time` (the order
//! the device plugin matches Allocate calls in), even when a later bind's patch finishes first; with the
//! pre-allocation riding on the binding, a later binding waits for the earlier one. With the gate off, a later
//! bind does not wait. `BindWrites::BindingChecked` reads the first bound pod back: labels seen → one write per
//! bind from then on; labels dropped (a server before 1.35) → patched on at once, and patch-then-bind after.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use vgpu_core::clock::ManualClock;
use vgpu_core::domain::ResourceDomain;
use vgpu_core::model::{NodeDeviceInventory, NodeVgpuConfig};
use vgpu_kube::error::ClusterError;
use vgpu_scheduler::cluster::{Binding, Event};
use vgpu_scheduler::extender::BindWrites;
use vgpu_scheduler::fixture::{vgpu_node, vgpu_pod};
use vgpu_scheduler::{Cluster, Extender, ExtenderConfig, MemoryCluster, MetadataPatch};
use vgpu_scheduler::{Node, Pod};

/// A [`MemoryCluster`] whose next patch of a chosen pod waits for a signal, and which records the bindings in
/// the order they are created.
#[derive(Clone, Default)]
struct HeldCluster {
    inner: MemoryCluster,
    held: Arc<Mutex<HashMap<String, Arc<Notify>>>>,
    held_binds: Arc<Mutex<HashMap<String, Arc<Notify>>>>,
    bound: Arc<Mutex<Vec<String>>>,
    patched: Arc<Mutex<Vec<String>>>,
}

impl HeldCluster {
    fn hold_patch(&self, name: &str) -> Arc<Notify> {
        let n = Arc::new(Notify::new());
        self.held.lock().unwrap().insert(name.to_owned(), n.clone());
        n
    }
    fn hold_bind(&self, name: &str) -> Arc<Notify> {
        let n = Arc::new(Notify::new());
        self.held_binds.lock().unwrap().insert(name.to_owned(), n.clone());
        n
    }
    fn bound(&self) -> Vec<String> {
        self.bound.lock().unwrap().clone()
    }
    fn patched(&self) -> Vec<String> {
        self.patched.lock().unwrap().clone()
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
        self.patched.lock().unwrap().push(name.to_owned());
        self.inner.patch_pod_metadata(namespace, name, patch).await
    }
    async fn bind_pod(&self, binding: &Binding) -> Result<(), ClusterError> {
        let gate = self.held_binds.lock().unwrap().remove(&binding.name);
        if let Some(gate) = gate {
            gate.notified().await;
        }
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

async fn env(serialize_bind: bool, bind_writes: BindWrites) -> Env {
    let d = ResourceDomain::default();
    let cluster = HeldCluster::default();
    let inv = NodeDeviceInventory::uniform(2, 16384, 4);
    cluster.inner.upsert_node(vgpu_node("n0", &inv, &NodeVgpuConfig::default(), None, &d).unwrap());
    let config =
        ExtenderConfig { serialize_bind, bind_writes, emit_events: false, ..ExtenderConfig::default() };
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
    /// Pods a and b filtered onto n0, and a's bind started with its patch or its binding held back (the gate
    /// is returned), once it counts as pending.
    async fn a_held(&self, hold: Hold) -> (Pod, Pod, Arc<Notify>, Bind) {
        let a = self.filtered("a").await;
        let b = self.filtered("b").await;
        let gate = match hold {
            Hold::Patch => self.cluster.hold_patch(&a.name),
            Hold::Binding => self.cluster.hold_bind(&a.name),
        };
        let bind_a = self.bind(&a);
        until("a started", || self.ext.pending_count() == 1).await;
        (a, b, gate, bind_a)
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

/// Which write of a bind [`Env::a_held`] holds back.
#[derive(Clone, Copy)]
enum Hold {
    /// The pre-allocation patch (`BindWrites::PatchThenBinding`).
    Patch,
    /// The binding itself.
    Binding,
}

/// Pods a and b filtered onto n0 (gate on); a's bind takes the first place in n0's queue with its patch held
/// back, b's bind patches meanwhile and waits for its turn.
async fn a_held_and_b_queued_behind() -> (Env, Pod, Pod, Arc<Notify>, Bind, Bind) {
    let e = env(true, BindWrites::PatchThenBinding).await;
    let (a, b, gate, bind_a) = e.a_held(Hold::Patch).await;
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
    let e = env(false, BindWrites::PatchThenBinding).await;
    let (a, b, gate, bind_a) = e.a_held(Hold::Patch).await;
    assert_eq!(e.bind(&b).await.unwrap(), "");
    assert_eq!(e.cluster.bound(), std::slice::from_ref(&b.name));
    gate.notify_one();
    assert_eq!(bind_a.await.unwrap(), "");
    assert_eq!(e.cluster.bound(), [b.name.clone(), a.name.clone()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_pre_allocation_on_the_binding_a_later_binding_waits_its_turn() {
    let e = env(true, BindWrites::Binding).await;
    let (a, b, gate, bind_a) = e.a_held(Hold::Binding).await;
    let bind_b = e.bind(&b);
    until("b queued", || e.ext.pending_count() == 0).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(e.cluster.bound().is_empty(), "b's binding waits for a's: {:?}", e.cluster.bound());
    gate.notify_one();
    assert_eq!(bind_a.await.unwrap(), "");
    assert_eq!(bind_b.await.unwrap(), "");
    assert_eq!(e.cluster.bound(), [a.name.clone(), b.name.clone()]);
    assert!(e.cluster.patched().is_empty(), "one write per bind: {:?}", e.cluster.patched());
    assert!(e.predicate_time(&a) < e.predicate_time(&b), "times follow the queue");
    for p in [&a, &b] {
        let live = e.cluster.inner.pod(&p.namespace, &p.name).unwrap();
        assert_eq!(live.node_name.as_deref(), Some("n0"));
        assert_eq!(live.labels[&e.d.assigned_phase()], "allocating");
        assert_eq!(live.labels[&e.d.metrics_node()], "n0");
        assert_eq!(live.annotations[&e.d.predicate_node()], "n0");
        assert!(live.annotations.contains_key(&e.d.pre_allocated()));
        assert_eq!(live.annotations[&e.d.real_allocated()], "");
    }
    // Both pods counted on n0 from their bound objects, the reservations gone.
    assert_eq!(e.ext.cache().reservation_count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_carrying_binding_releases_the_gpus() {
    let e = env(true, BindWrites::Binding).await;
    let a = e.filtered("a").await;
    e.cluster.inner.fail_next_binds(1);
    assert_eq!(e.bind(&a).await.unwrap(), "injected binding failure");
    assert_eq!(e.ext.cache().reservation_count(), 0, "the reservation is released");
    let live = e.cluster.inner.pod(&a.namespace, &a.name).unwrap();
    assert_eq!(live.labels[&e.d.assigned_phase()], "failed");
    assert!(!live.annotations.contains_key(&e.d.pre_allocated()), "nothing was written but the failure");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checked_binding_is_trusted_once_its_labels_are_seen() {
    let e = env(true, BindWrites::BindingChecked).await;
    assert_eq!(e.ext.bind_writes(), BindWrites::BindingChecked);
    let a = e.filtered("a").await;
    assert_eq!(e.bind(&a).await.unwrap(), "");
    assert_eq!(e.ext.bind_writes(), BindWrites::Binding);
    let b = e.filtered("b").await;
    assert_eq!(e.bind(&b).await.unwrap(), "");
    assert!(e.cluster.patched().is_empty(), "{:?}", e.cluster.patched());
    let live = e.cluster.inner.pod(&b.namespace, &b.name).unwrap();
    assert_eq!(live.labels[&e.d.assigned_phase()], "allocating");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checked_binding_on_a_server_that_drops_labels_repairs_and_patches_from_then_on() {
    let e = env(true, BindWrites::BindingChecked).await;
    e.cluster.inner.drop_binding_labels(true);
    let a = e.filtered("a").await;
    assert_eq!(e.bind(&a).await.unwrap(), "");
    assert_eq!(e.ext.bind_writes(), BindWrites::PatchThenBinding);
    // The dropped labels were patched on before the bind answered.
    let live = e.cluster.inner.pod(&a.namespace, &a.name).unwrap();
    assert_eq!(live.labels[&e.d.assigned_phase()], "allocating");
    assert_eq!(live.labels[&e.d.metrics_node()], "n0");
    assert!(live.annotations.contains_key(&e.d.pre_allocated()), "annotations rode on the binding");
    assert_eq!(e.cluster.patched(), std::slice::from_ref(&a.name));
    // The next bind patches first, then binds.
    let b = e.filtered("b").await;
    assert_eq!(e.bind(&b).await.unwrap(), "");
    assert_eq!(e.cluster.patched(), [a.name.clone(), b.name.clone()]);
    let live = e.cluster.inner.pod(&b.namespace, &b.name).unwrap();
    assert_eq!(live.labels[&e.d.assigned_phase()], "allocating");
    assert_eq!(live.node_name.as_deref(), Some("n0"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_binding_sent_before_the_check_is_repaired() {
    // Gate off: a's binding is held while b's is written and checked; a's, sent before b's check found the
    // labels dropped, is checked and repaired too.
    let e = env(false, BindWrites::BindingChecked).await;
    e.cluster.inner.drop_binding_labels(true);
    let (a, b, gate, bind_a) = e.a_held(Hold::Binding).await;
    assert_eq!(e.bind(&b).await.unwrap(), "");
    assert_eq!(e.ext.bind_writes(), BindWrites::PatchThenBinding);
    gate.notify_one();
    assert_eq!(bind_a.await.unwrap(), "");
    for p in [&a, &b] {
        let live = e.cluster.inner.pod(&p.namespace, &p.name).unwrap();
        assert_eq!(live.labels[&e.d.assigned_phase()], "allocating", "{}", p.name);
        assert_eq!(live.labels[&e.d.metrics_node()], "n0", "{}", p.name);
    }
    assert_eq!(e.cluster.patched(), [b.name.clone(), a.name.clone()]);
}
