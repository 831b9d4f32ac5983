#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Filter, bind, preempt and cache semantics against the in-memory cluster.

use std::collections::BTreeMap;
use std::sync::Arc;

use vgpu_core::alloc::{NodeUsage, NodeView, PodRequest, order_nodes};
use vgpu_core::clock::ManualClock;
use vgpu_core::domain::ResourceDomain;
use vgpu_core::model::{NodeDeviceInventory, NodeVgpuConfig};
use vgpu_scheduler::cluster::EventType;
use vgpu_scheduler::extender::BindWrites;
use vgpu_scheduler::fixture::{vgpu_node, vgpu_pod};
use vgpu_scheduler::rank::{ResolveMemo, rank_candidates, sort_ranked};
use vgpu_scheduler::{CandidateNames, Extender, ExtenderConfig, MemoryCluster, Pod, PodPhase};

const T0: i64 = 1_700_000_000_000_000_000;

fn inventory(gpus: u32, mem: u64) -> NodeDeviceInventory {
    NodeDeviceInventory::uniform(gpus, mem, 4).with_type_name("A100")
}

struct Env {
    d: ResourceDomain,
    cluster: MemoryCluster,
    clock: Arc<ManualClock>,
    ext: Extender<MemoryCluster, ManualClock>,
    names: Vec<String>,
    rt: tokio::runtime::Runtime,
}

fn env(nodes: usize, gpus: u32) -> Env {
    env_with(nodes, gpus, ExtenderConfig::default())
}

fn env_with(nodes: usize, gpus: u32, config: ExtenderConfig) -> Env {
    let d = ResourceDomain::default();
    let cluster = MemoryCluster::new();
    let names: Vec<String> = (0..nodes).map(|i| format!("n{i}")).collect();
    for n in &names {
        cluster.upsert_node(
            vgpu_node(n, &inventory(gpus, 16384), &NodeVgpuConfig::default(), None, &d).unwrap(),
        );
    }
    let clock = Arc::new(ManualClock::new(T0));
    let ext = Extender::new(cluster.clone(), clock.clone(), config);
    ext.attach();
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    rt.block_on(ext.sync()).unwrap();
    Env { d, cluster, clock, ext, names, rt }
}

impl Env {
    fn pod(&self, uid: &str, n: u32, cores: u32, mem: u64, ann: &[(String, String)]) -> Pod {
        self.cluster.upsert_pod(vgpu_pod(uid, n, cores, mem, ann, &self.d))
    }
    fn filter(&self, pod: &Pod) -> vgpu_scheduler::FilterResult {
        self.rt.block_on(self.ext.filter(Some(pod), self.names.clone()))
    }
    fn bind(&self, pod: &Pod, node: &str) -> String {
        self.rt.block_on(self.ext.bind(&pod.namespace, &pod.name, &pod.uid, node)).error
    }
    fn used(&self, node: &str) -> (u32, u64, u64) {
        let slot = self.ext.cache().node(node).unwrap();
        let s = slot.lock().unwrap();
        (0..8)
            .map(|i| s.usage.device(i))
            .fold((0, 0, 0), |a, u| (a.0 + u.number, a.1 + u.cores, a.2 + u.memory_mib))
    }
}

#[test]
fn filter_reserves_and_bind_writes_the_pre_allocation() {
    let e = env(3, 2);
    let binpack = vec![(e.d.node_scheduler_policy(), "binpack".to_string())];
    let pod = e.pod("u1", 1, 50, 4096, &binpack);
    let r = e.filter(&pod);
    assert_eq!(r.error, "");
    assert_eq!(r.node_names(), ["n0"], "binpack ties break by name");
    assert_eq!(r.failed_nodes().len(), 2);
    assert!(r.failed_nodes().all(|f| f.reason == "pod already scheduled to another node"));
    // The filter wrote nothing: the GPUs are held by the cache's reservation until the bind.
    let p = e.cluster.pod("default", "pod-u1").unwrap();
    assert_eq!(p, pod, "the filter does not patch the pod");
    assert_eq!(e.used("n0"), (1, 50, 4096));
    assert_eq!((e.ext.cache().reservation_count(), e.ext.pending_count()), (1, 1));

    // A second filter of the same pod short-circuits to its node, reserving nothing more.
    let again = e.filter(&p);
    assert_eq!(again.node_names(), ["n0"]);
    assert_eq!(e.used("n0"), (1, 50, 4096));
    // Another pod sees the reserved capacity as taken.
    let other = e.pod("u2", 1, 60, 0, &binpack);
    assert_eq!(e.ext.filter_dry_run(Some(&other), vec!["n0"]).node_names(), ["n0"], "GPU 1 is free");

    e.clock.advance(1_000);
    assert_eq!(e.bind(&p, "n0"), "");
    let p = e.cluster.pod("default", "pod-u1").unwrap();
    assert_eq!(p.node_name.as_deref(), Some("n0"));
    assert_eq!(p.annotations[&e.d.pre_allocated()], "main[0_GPU-0_50_4096]");
    assert_eq!(p.annotations[&e.d.predicate_node()], "n0");
    assert_eq!(p.annotations[&e.d.real_allocated()], "");
    assert_eq!(p.annotations[&e.d.predicate_time()], (T0 + 1_000).to_string());
    assert_eq!(p.labels[&e.d.assigned_phase()], "allocating");
    assert_eq!(p.labels[&e.d.metrics_node()], "n0");
    assert_eq!(e.used("n0"), (1, 50, 4096));
    assert_eq!(
        (e.ext.cache().reservation_count(), e.ext.pending_count()),
        (0, 0),
        "the patched pod replaced the reservation"
    );
    // A repeated bind (kube-scheduler retrying) is a success and changes nothing.
    assert_eq!(e.bind(&p, "n0"), "");
    assert_eq!(e.cluster.pod("default", "pod-u1").unwrap(), p);
    let reasons: Vec<&str> = e.cluster.events().iter().map(|ev| ev.reason).collect();
    assert_eq!(reasons, ["FilteringSucceed", "BindingSucceed"]);

    // Bound pods cannot be filtered; succeeded pods release.
    assert_eq!(e.filter(&p).error, "pod has been bound to node \"n0\"");
    e.cluster.set_phase("default", "pod-u1", PodPhase::Succeeded);
    assert_eq!(e.used("n0"), (0, 0, 0));
}

#[test]
fn no_fit_reports_reasons_and_event_text() {
    let e = env(2, 1);
    let pod = e.pod("big", 2, 0, 0, &[]);
    let r = e.filter(&pod);
    assert!(r.node_names().is_empty() && r.error.is_empty());
    assert_eq!(r.failure("n0").unwrap(), "Insufficient GPU cards");
    let ev = e.cluster.events().pop().unwrap();
    assert_eq!(ev.reason, "FilteringFailed");
    assert_eq!(ev.message, "0/2 nodes are available: Insufficient GPU cards (n0, n1).");
    let bad = e.pod("bad", 17, 0, 0, &[]);
    assert!(e.filter(&bad).error.contains("exceeding limit"), "{}", e.filter(&bad).error);
    assert_eq!(e.rt.block_on(e.ext.filter(None, e.names.clone())).error, "extenderArgs.Pod cannot be empty");
    let p = e.pod("x", 1, 0, 0, &[]);
    assert_eq!(e.rt.block_on(e.ext.filter(Some(&p), CandidateNames::new())).error, "No schedulable nodes");
    let r = e.rt.block_on(e.ext.filter(Some(&p), vec!["ghost".to_string()]));
    assert_eq!(r.failure("ghost").unwrap(), "node missing from cache");
}

#[test]
fn patch_conflicts_are_retried_then_reservation_released() {
    let config = ExtenderConfig { bind_writes: BindWrites::PatchThenBinding, ..ExtenderConfig::default() };
    let e = env_with(1, 1, config);
    e.cluster.fail_next_patches(2);
    let a = e.pod("a", 1, 50, 1024, &[]);
    assert_eq!(e.filter(&a).node_names(), ["n0"]);
    assert_eq!(e.bind(&a, "n0"), "", "two conflicts, third attempt wins");
    let b = e.pod("b", 1, 0, 1024, &[]);
    assert_eq!(e.filter(&b).node_names(), ["n0"]);
    e.cluster.fail_next_patches(3);
    let err = e.bind(&b, "n0");
    assert!(err.starts_with("failed to patch pod default/pod-b: conflict"), "{err}");
    assert_eq!(e.used("n0"), (1, 50, 1024), "b's reservation released, a kept");
    assert_eq!(e.ext.cache().reservation_count(), 0);
    let b = e.cluster.pod("default", "pod-b").unwrap();
    assert_eq!(b.labels[&e.d.assigned_phase()], "failed");
    assert_eq!(b.node_name, None);
}

#[test]
fn bind_checks_node_and_expiry_and_failure_cleans_up() {
    let e = env(2, 1);
    let a = e.pod("a", 1, 10, 0, &[]);
    assert_eq!(e.filter(&a).node_names(), ["n0"]);
    let a = e.cluster.pod("default", "pod-a").unwrap();
    assert_eq!(e.bind(&a, "n1"), "predicate node \"n0\" does not match the bound node \"n1\"");
    let a = e.cluster.pod("default", "pod-a").unwrap();
    assert_eq!(a.labels[&e.d.assigned_phase()], "failed");
    assert!(!a.labels.contains_key(&e.d.metrics_node()), "label removed from labels");
    assert_eq!(a.annotations[&e.d.predicate_time()], i64::MAX.to_string());
    assert_eq!(e.used("n0"), (0, 0, 0), "failed pre-allocation released");

    assert_eq!(e.bind(&a, ""), "ExtenderBindingArgs.Node cannot be empty");
    assert_eq!(
        e.rt.block_on(e.ext.bind("default", "pod-a", "other", "n0")).error,
        "different uid \"other\" from the target pod"
    );

    // Expired: unschedulable after the predicate, past the grace period.
    let b = e.pod("b", 1, 10, 0, &[]);
    assert_eq!(e.filter(&b).node_names(), ["n0"]);
    let mut b = e.cluster.pod("default", "pod-b").unwrap();
    b.unschedulable_since_ns = Some(T0 - 5_000_000_000);
    let b = e.cluster.upsert_pod(b);
    assert_eq!(e.used("n0").1, 10, "within grace");
    e.clock.advance(31_000_000_000);
    e.ext.cache().sweep(e.clock.now_ns_pub());
    assert_eq!(e.used("n0").1, 0, "grace period over");
    assert_eq!(e.bind(&b, "n0"), "device pre allocation check failed, unable to bind to node \"n0\"");

    // Binding API failure.
    let c = e.pod("c", 1, 10, 0, &[]);
    let node = e.filter(&c).node_names()[0].to_owned();
    e.cluster.fail_next_binds(1);
    let c = e.cluster.pod("default", "pod-c").unwrap();
    assert_eq!(e.bind(&c, &node), "injected binding failure");
    assert_eq!(e.used(&node), (0, 0, 0));
}

trait NowPub {
    fn now_ns_pub(&self) -> i64;
}
impl NowPub for Arc<ManualClock> {
    fn now_ns_pub(&self) -> i64 {
        vgpu_core::clock::Clock::now_ns(self)
    }
}

#[test]
fn reservation_expires_and_delete_releases() {
    let e = env(1, 1);
    let slot = e.ext.cache().node("n0").unwrap();
    {
        let mut s = slot.lock().unwrap();
        let claim = vgpu_core::codec::pod_devices::decode_pre_allocated("m[0_GPU-0_30_100]").unwrap();
        e.ext.cache().reserve_locked(
            &mut s,
            "ghost",
            vgpu_core::alloc::PodFootprint::from_claim(&claim),
            T0 + 10,
        );
    }
    e.ext.cache().track_reservation("n0", "ghost", T0 + 10);
    assert_eq!(e.used("n0"), (1, 30, 100));
    e.ext.cache().sweep(T0 + 5);
    assert_eq!(e.used("n0"), (1, 30, 100));
    e.ext.cache().sweep(T0 + 11);
    assert_eq!(e.used("n0"), (0, 0, 0));

    let a = e.pod("a", 1, 20, 0, &[]);
    e.filter(&a);
    assert_eq!(e.used("n0").1, 20);
    e.cluster.delete_pod("default", "pod-a");
    assert_eq!(e.used("n0").1, 0);
}

#[test]
fn dry_run_has_no_side_effects_and_lists_every_feasible_node() {
    let e = env(3, 1);
    let a = e.pod("a", 1, 100, 0, &[]);
    e.filter(&a);
    let b = e.pod("b", 1, 100, 0, &[]);
    let r = e.ext.filter_dry_run(Some(&b), e.names.clone());
    assert_eq!(r.node_names().len(), 2);
    let failed = r.failed_nodes().next().unwrap().reason;
    assert!(failed.starts_with("Insufficient vGPU cores"), "{failed}");
    assert!(!e.cluster.pod("default", "pod-b").unwrap().annotations.contains_key(&e.d.pre_allocated()));
    assert_eq!(e.ext.cache().reservation_count(), 1, "a's only");
    assert_eq!(e.ext.pending_count(), 1, "a's only");
}

/// A pod whose pre-allocation another extender wrote (vgpu-manager's, or another replica's before a
/// failover) is bound from its annotations: the filter answers its node, the bind marks it allocating.
#[test]
fn bind_of_a_pod_pre_allocated_elsewhere_uses_its_annotations() {
    let e = env(2, 1);
    let d = &e.d;
    let ann = vec![
        (d.pre_allocated(), "main[0_GPU-0_40_1024]".to_string()),
        (d.predicate_node(), "n1".to_string()),
        (d.predicate_time(), T0.to_string()),
        (d.real_allocated(), String::new()),
    ];
    let p = e.pod("x", 1, 40, 1024, &ann);
    assert_eq!(e.used("n1"), (1, 40, 1024), "counted from its annotations");
    assert_eq!(e.filter(&p).node_names(), ["n1"]);
    assert_eq!(e.ext.pending_count(), 0);
    e.clock.advance(1_000);
    assert_eq!(e.bind(&p, "n1"), "");
    let p = e.cluster.pod("default", "pod-x").unwrap();
    assert_eq!(p.node_name.as_deref(), Some("n1"));
    assert_eq!(p.labels[&d.assigned_phase()], "allocating");
    assert_eq!(p.annotations[&d.predicate_time()], (T0 + 1_000).to_string());
    assert_eq!(e.used("n1"), (1, 40, 1024));
}

/// Pod "pod-old" (UID "old") filtered onto n0, then deleted and re-created under its name with UID "new":
/// (the old pod, the new one).
fn filtered_then_recreated(e: &Env) -> (Pod, Pod) {
    let old = e.pod("old", 1, 30, 0, &[]);
    assert_eq!(e.filter(&old).node_names(), ["n0"]);
    e.cluster.delete_pod("default", "pod-old");
    let mut new = vgpu_scheduler::fixture::vgpu_pod("new", 1, 30, 0, &[], &e.d);
    new.name = "pod-old".into();
    (old, e.cluster.upsert_pod(new))
}

/// The bind's patch carries the UID: a pod deleted and re-created under the same name between filter and
/// bind gets neither the old pod's pre-allocation nor its binding, and the reservation is released.
#[test]
fn bind_never_writes_onto_a_pod_recreated_under_the_same_name() {
    let e = env(1, 1);
    let (old, new) = filtered_then_recreated(&e);
    assert_eq!(e.bind(&old, "n0"), "different uid \"old\" from the target pod");
    let now = e.cluster.pod("default", "pod-old").unwrap();
    assert_eq!(now, new, "untouched");
    assert_eq!(e.used("n0"), (0, 0, 0));
    assert_eq!(e.ext.cache().reservation_count(), 0);

    // The patch itself refuses another UID (the cache may still hold the old pod when the bind runs).
    let patch = vgpu_scheduler::MetadataPatch::default().with_uid("old").label("x", "y");
    let err =
        e.rt.block_on(vgpu_scheduler::Cluster::patch_pod_metadata(&e.cluster, "default", "pod-old", &patch));
    assert!(err.unwrap_err().to_string().contains("metadata.uid: field is immutable"));
}

/// A failed bind marks only the pod it was for: while the cache still holds a pod that was deleted and re-created
/// under the same name (its watch lags), the bind fails on the UID and its failure mark (`assigned-phase=failed`,
/// `predicate-time`) does not land on the new pod.
#[test]
fn a_failed_bind_never_marks_a_pod_recreated_under_the_same_name() {
    let e = env(1, 1);
    let (old, new) = filtered_then_recreated(&e);
    e.ext.cache().upsert_pod(old.clone(), T0);
    assert_ne!(e.bind(&old, "n0"), "", "the write refuses the old UID");
    assert_eq!(e.cluster.pod("default", "pod-old").unwrap(), new, "untouched");
    assert_eq!(e.ext.cache().reservation_count(), 0);
}

#[test]
fn prioritize_and_rank_match_order_nodes() {
    let e = env(6, 2);
    for (i, cores) in [(0, 30), (1, 80), (2, 10), (3, 50)] {
        let p = e.pod(&format!("p{i}"), 1, cores, 1000 * (i + 1), &[]);
        let node = &e.names[i as usize];
        e.rt.block_on(e.ext.filter(Some(&p), vec![node.clone()]));
    }
    for policy in ["binpack", "spread", "none"] {
        let ann = vec![(e.d.node_scheduler_policy(), policy.to_string())];
        let pod = vgpu_pod("q", 1, 20, 2048, &ann, &e.d);
        let req = PodRequest::from_pod(&pod.request_spec(), &e.d).unwrap();
        let snap = e.ext.cache().usage_snapshot();
        let owned: Vec<(String, Arc<_>, NodeUsage)> =
            snap.into_iter().map(|(n, d, u)| (n, d.unwrap(), u)).collect();
        let views: Vec<NodeView<'_>> = owned
            .iter()
            .map(|(n, d, u)| NodeView {
                name: n,
                inventory: &d.inventory,
                config: &d.config,
                links: None,
                usage: u,
            })
            .collect();
        let expected: Vec<&str> = order_nodes(&req, &views).into_iter().map(|i| views[i].name).collect();
        let mut memo = ResolveMemo::default();
        let names: CandidateNames = owned.iter().map(|(n, _, _)| n).collect();
        let rows = e.ext.cache().candidate_rows(&names);
        let mut ranked = rank_candidates(e.ext.cache(), &req, &names, &rows, &mut memo, None, |pos, code| {
            panic!("{} rejected: {code:?}", &names[pos])
        });
        sort_ranked(req.node_policy, &mut ranked);
        let got: Vec<&str> = ranked.iter().map(|r| r.1).collect();
        assert_eq!(got, expected, "{policy}");
        let prio = e.ext.prioritize(&pod, e.names.clone()).unwrap();
        assert!(prio.iter().all(|h| (0..=10).contains(&h.score)));
    }
}

#[test]
fn preempt_picks_unprotected_lower_priority_victims() {
    let e = env(2, 1);
    let mut low = vgpu_pod("low", 1, 100, 0, &[], &e.d);
    low.priority = 1;
    low.created_ns = 1;
    let low = e.cluster.upsert_pod(low);
    assert_eq!(e.rt.block_on(e.ext.filter(Some(&low), e.names[..1].to_vec())).node_names(), ["n0"]);
    let low = e.cluster.pod("default", "pod-low").unwrap();
    assert_eq!(e.bind(&low, "n0"), "");
    let mut ds = vgpu_pod("ds", 1, 0, 0, &[], &e.d);
    ds.owner_kind = Some("DaemonSet".into());
    ds.spec.containers[0].limits.insert(e.d.vgpu_cores(), "0".into());
    let mut hi = vgpu_pod("hi", 1, 100, 0, &[], &e.d);
    hi.priority = 100;
    let mut victims = BTreeMap::new();
    victims.insert("n0".to_string(), vec![]);
    victims.insert("n1".to_string(), vec![]);
    let r = e.rt.block_on(e.ext.preempt(Some(&hi), &victims));
    assert_eq!(r.node_victims["n0"], ["low"], "added lower-priority pod");
    assert_eq!(r.node_victims["n1"], Vec::<String>::new(), "fits without victims");
    hi.priority = 0;
    let r = e.rt.block_on(e.ext.preempt(Some(&hi), &victims));
    assert!(!r.node_victims.contains_key("n0"), "no lower-priority pod to evict");
    let plain = Pod { uid: "x".into(), ..Pod::default() };
    assert_eq!(e.rt.block_on(e.ext.preempt(Some(&plain), &victims)).node_victims, victims, "passthrough");
    let _ = ds;
}

/// Without success events only the warnings are sent; the pod is placed and bound all the same.
#[test]
fn success_events_can_be_left_out() {
    let d = ResourceDomain::default();
    let cluster = MemoryCluster::new();
    cluster.upsert_node(vgpu_node("n0", &inventory(1, 16384), &NodeVgpuConfig::default(), None, &d).unwrap());
    let config = ExtenderConfig { success_events: false, ..ExtenderConfig::default() };
    let ext = Extender::new(cluster.clone(), Arc::new(ManualClock::new(T0)), config);
    ext.attach();
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    rt.block_on(ext.sync()).unwrap();
    let pod = cluster.upsert_pod(vgpu_pod("ok", 1, 10, 0, &[], &d));
    assert_eq!(rt.block_on(ext.filter(Some(&pod), vec!["n0"])).node_names(), ["n0"]);
    assert_eq!(rt.block_on(ext.bind("default", "pod-ok", "ok", "n0")).error, "");
    let big = cluster.upsert_pod(vgpu_pod("big", 2, 0, 0, &[], &d));
    assert!(rt.block_on(ext.filter(Some(&big), vec!["n0"])).node_names().is_empty());
    let reasons: Vec<&str> = cluster.events().iter().map(|e| e.reason).collect();
    assert_eq!(reasons, ["FilteringFailed"]);
}

/// kube-scheduler may drop a pod's cycle after our filter (another plugin's Reserve or Permit failed) without
/// telling the extender: a later filter of the pod that no longer offers the reserved node gives that
/// placement up (nothing was written) and places the pod anew, instead of refusing it until it expires.
#[test]
fn a_pending_placement_off_the_candidates_is_given_up_and_the_pod_placed_again() {
    let e = env(2, 1);
    let pod = e.pod("p", 1, 60, 0, &[]);
    assert_eq!(e.filter(&pod).node_names(), ["n0"]);
    assert_eq!(e.used("n0").1, 60);
    let r = e.rt.block_on(e.ext.filter(Some(&pod), vec!["n1".to_owned()]));
    assert_eq!((r.error.as_str(), r.node_names().as_slice()), ("", ["n1"].as_slice()));
    assert_eq!((e.used("n0").1, e.used("n1").1), (0, 60), "n0's reservation released");
    assert_eq!((e.ext.cache().reservation_count(), e.ext.pending_count()), (1, 1));
    assert_eq!(e.bind(&pod, "n1"), "");
    // A pod whose pre-allocation is in its annotations (written by another extender) is still refused.
    let d = &e.d;
    let ann = vec![
        (d.pre_allocated(), "main[0_GPU-0_10_0]".to_string()),
        (d.predicate_node(), "n0".to_string()),
        (d.predicate_time(), T0.to_string()),
    ];
    let other = e.pod("q", 1, 10, 0, &ann);
    let r = e.rt.block_on(e.ext.filter(Some(&other), vec!["n1".to_owned()]));
    assert_eq!(r.error, "pod q had been predicated");
}

#[test]
fn success_events_are_rate_limited_and_warnings_never() {
    let config = ExtenderConfig { success_event_qps: 1, success_event_burst: 2, ..ExtenderConfig::default() };
    let e = env_with(3, 2, config);
    let successes = |e: &Env| {
        e.cluster
            .events()
            .iter()
            .filter(|ev| matches!(ev.reason, "FilteringSucceed" | "BindingSucceed"))
            .count()
    };
    // Three pods scheduled at one instant: six success events, a burst of two is sent.
    for uid in ["a", "b", "c"] {
        let p = e.pod(uid, 1, 10, 0, &[]);
        let node = e.filter(&p).node_names()[0].to_owned();
        assert_eq!(e.bind(&p, &node), "");
    }
    assert_eq!(successes(&e), 2);
    assert_eq!(e.ext.stats().events_dropped.load(std::sync::atomic::Ordering::Relaxed), 4);
    // A warning is sent even with the bucket empty.
    let big = e.pod("big", 3, 0, 0, &[]);
    assert!(e.filter(&big).node_names().is_empty());
    assert_eq!(e.cluster.events().last().unwrap().reason, "FilteringFailed");
    // One second later one more token.
    e.clock.advance(1_000_000_000);
    let p = e.pod("d", 1, 10, 0, &[]);
    let node = e.filter(&p).node_names()[0].to_owned();
    assert_eq!(e.bind(&p, &node), "");
    assert_eq!(successes(&e), 3);
}

#[test]
fn deferred_success_events_wait_for_a_quiet_moment() {
    use vgpu_scheduler::event_queue::DeferConfig;
    const MS: i64 = 1_000_000;
    let defer = DeferConfig { quiet_ns: 250 * MS, max_delay_ns: 10_000 * MS, capacity: 5 };
    let config = ExtenderConfig {
        success_event_qps: 1,
        success_event_burst: 3,
        defer_success_events: Some(defer),
        ..ExtenderConfig::default()
    };
    let e = env_with(3, 2, config);
    let successes = |e: &Env| e.cluster.events().iter().filter(|ev| ev.kind == EventType::Normal).count();
    // Three pods scheduled 10 ms apart: six success events, five fit the queue, none sent while busy.
    for uid in ["a", "b", "c"] {
        let p = e.pod(uid, 1, 10, 0, &[]);
        let node = e.filter(&p).node_names()[0].to_owned();
        e.clock.advance(10 * MS);
        assert_eq!(e.bind(&p, &node), "");
    }
    assert_eq!((successes(&e), e.ext.deferred_events()), (0, 5));
    assert_eq!(e.ext.stats().events_dropped.load(std::sync::atomic::Ordering::Relaxed), 1);
    // A warning goes at once.
    let big = e.pod("big", 3, 0, 0, &[]);
    assert!(e.filter(&big).node_names().is_empty());
    assert_eq!(e.cluster.events().iter().map(|ev| ev.reason).collect::<Vec<_>>(), ["FilteringFailed"]);
    assert_eq!(e.rt.block_on(e.ext.flush_events(false)), 0, "a filter started just now");
    // Quiet for 250 ms: the burst of three tokens goes, oldest first, stamped when they happened.
    e.clock.advance(250 * MS);
    assert_eq!(e.rt.block_on(e.ext.flush_events(false)), 3);
    let sent: Vec<(&str, String, i64)> = e
        .cluster
        .events()
        .iter()
        .filter(|ev| ev.kind == EventType::Normal)
        .map(|ev| (ev.reason, ev.pod.clone(), ev.at_ns - T0))
        .collect();
    assert_eq!(
        sent,
        [
            ("FilteringSucceed", "pod-a".to_owned(), 0),
            ("BindingSucceed", "pod-a".to_owned(), 10 * MS),
            ("FilteringSucceed", "pod-b".to_owned(), 10 * MS),
        ]
    );
    // The rest go at the rate limit: one a second.
    e.clock.advance(1_000 * MS);
    assert_eq!(e.rt.block_on(e.ext.flush_events(false)), 1);
    assert_eq!(e.ext.deferred_events(), 1);
    // Draining (shutdown) ignores the quiet period but not the rate limit.
    e.rt.block_on(e.ext.filter(Some(&big), e.names.clone()));
    assert_eq!(e.rt.block_on(e.ext.flush_events(true)), 0);
    e.clock.advance(1_000 * MS);
    e.rt.block_on(e.ext.filter(Some(&big), e.names.clone()));
    assert_eq!(e.rt.block_on(e.ext.flush_events(true)), 1);
    assert_eq!((successes(&e), e.ext.deferred_events()), (5, 0));
}

#[test]
fn without_deferral_flushing_sends_nothing() {
    let e = env(2, 2);
    let p = e.pod("a", 1, 10, 0, &[]);
    let node = e.filter(&p).node_names()[0].to_owned();
    assert_eq!(e.bind(&p, &node), "");
    assert_eq!(e.cluster.events().len(), 2, "sent when they happened");
    assert_eq!((e.rt.block_on(e.ext.flush_events(true)), e.ext.deferred_events()), (0, 0));
}

#[test]
fn success_event_counts_reach_the_metrics() {
    use vgpu_scheduler::event_queue::DeferConfig;
    use vgpu_scheduler::metrics::Metrics;
    let d = ResourceDomain::default();
    let cluster = MemoryCluster::new();
    cluster.upsert_node(vgpu_node("n0", &inventory(2, 16384), &NodeVgpuConfig::default(), None, &d).unwrap());
    let clock = Arc::new(ManualClock::new(T0));
    let metrics = Arc::new(Metrics::new());
    let config = ExtenderConfig {
        defer_success_events: Some(DeferConfig { quiet_ns: 1_000, max_delay_ns: i64::MAX, capacity: 1 }),
        ..ExtenderConfig::default()
    };
    let ext = Extender::new(cluster.clone(), clock.clone(), config).with_observer(metrics.clone());
    ext.attach();
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    rt.block_on(ext.sync()).unwrap();
    let pod = cluster.upsert_pod(vgpu_pod("a", 1, 10, 0, &[], &d));
    assert_eq!(rt.block_on(ext.filter(Some(&pod), vec!["n0".to_owned()])).node_names(), ["n0"]);
    // The queue holds one event: FilteringSucceed waits, BindingSucceed is refused.
    assert_eq!(rt.block_on(ext.bind(&pod.namespace, &pod.name, &pod.uid, "n0")).error, "");
    let text = metrics.encode().unwrap();
    assert!(text.contains("vgpu_scheduler_events_deferred 1\n"), "{text}");
    assert!(text.contains("vgpu_scheduler_success_events_total{result=\"dropped\"} 1\n"), "{text}");
    assert!(text.contains("vgpu_scheduler_success_events_total{result=\"sent\"} 0\n"), "{text}");
    clock.advance(1_000);
    assert_eq!(rt.block_on(ext.flush_events(false)), 1);
    let text = metrics.encode().unwrap();
    assert!(text.contains("vgpu_scheduler_events_deferred 0\n"), "{text}");
    assert!(text.contains("vgpu_scheduler_success_events_total{result=\"sent\"} 1\n"), "{text}");
}
