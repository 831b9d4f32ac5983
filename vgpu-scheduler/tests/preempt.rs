#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Preempt (contract §3.4) against the in-memory cluster: PodDisruptionBudget-aware victim selection, the
//! contract's order of added victims, `NumPDBViolations`, and the events on the preemptor.

use std::collections::BTreeMap;
use std::sync::Arc;

use vgpu_core::clock::ManualClock;
use vgpu_core::domain::ResourceDomain;
use vgpu_core::model::{NodeDeviceInventory, NodeVgpuConfig};
use vgpu_core::topology::DeviceTopology;
use vgpu_scheduler::cluster::EventType;
use vgpu_scheduler::fixture::{vgpu_node, vgpu_pod};
use vgpu_scheduler::pdb::{LabelSelector, PodDisruptionBudget};
use vgpu_scheduler::wire::{ExtenderPreemptionArgs, ExtenderPreemptionResult, MetaPod, MetaVictims};
use vgpu_scheduler::{Extender, ExtenderConfig, MemoryCluster, Pod, PodPhase, PreemptResult};

const T0: i64 = 1_700_000_000_000_000_000;

struct Env {
    d: ResourceDomain,
    cluster: MemoryCluster,
    ext: Extender<MemoryCluster, ManualClock>,
    rt: tokio::runtime::Runtime,
}

/// One node `n0` with `gpus` whole-card GPUs (4 slots each), optionally publishing a topology.
fn env(gpus: u32, topology: Option<&DeviceTopology>) -> Env {
    let d = ResourceDomain::default();
    let cluster = MemoryCluster::new();
    let inv = NodeDeviceInventory::uniform(gpus, 16384, 4).with_type_name("A100");
    cluster.upsert_node(vgpu_node("n0", &inv, &NodeVgpuConfig::default(), topology, &d).unwrap());
    let ext = Extender::new(cluster.clone(), Arc::new(ManualClock::new(T0)), ExtenderConfig::default());
    ext.attach();
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    rt.block_on(ext.sync()).unwrap();
    Env { d, cluster, ext, rt }
}

/// A running pod bound to `n0` holding the whole GPU `gpu`.
struct Running<'a> {
    uid: &'a str,
    gpu: u32,
    priority: i32,
    created_ns: i64,
    labels: &'a [(&'a str, &'a str)],
    gang: Option<&'a str>,
}

impl Default for Running<'_> {
    fn default() -> Self {
        Self { uid: "", gpu: 0, priority: 1, created_ns: 0, labels: &[], gang: None }
    }
}

impl Env {
    fn run(&self, r: Running<'_>) -> Pod {
        let mut p = vgpu_pod(r.uid, 1, 100, 0, &[], &self.d);
        p.annotations.insert(self.d.pre_allocated(), format!("main[{0}_GPU-{0}_100_16384]", r.gpu));
        p.annotations.insert(self.d.predicate_node(), "n0".to_owned());
        p.node_name = Some("n0".to_owned());
        p.phase = PodPhase::Running;
        p.priority = r.priority;
        p.created_ns = r.created_ns;
        p.labels = r.labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        p.gang = r.gang.map(|g| format!("default/{g}"));
        self.cluster.upsert_pod(p)
    }

    /// A pending preemptor asking for `gpus` whole GPUs.
    fn preemptor(&self, gpus: u32, priority: i32, ann: &[(String, String)]) -> Pod {
        let mut p = vgpu_pod("hi", gpus, 100, 0, ann, &self.d);
        p.priority = priority;
        p
    }

    fn pdb(&self, name: &str, app: &str, allowed: i32) {
        self.cluster.upsert_pdb(PodDisruptionBudget {
            namespace: "default".into(),
            name: name.into(),
            selector: Some(LabelSelector {
                match_labels: [("app".to_owned(), app.to_owned())].into(),
                ..LabelSelector::default()
            }),
            disruptions_allowed: allowed,
            ..PodDisruptionBudget::default()
        });
    }

    fn preempt(&self, pod: &Pod, sent: &[&str]) -> PreemptResult {
        let victims: BTreeMap<String, Vec<String>> =
            [("n0".to_owned(), sent.iter().map(|s| (*s).to_owned()).collect())].into();
        self.rt.block_on(self.ext.preempt(Some(pod), &victims))
    }

    fn events(&self, reason: &str) -> Vec<String> {
        self.cluster
            .events()
            .into_iter()
            .filter(|e| e.pod == "pod-hi" && e.reason == reason)
            .map(|e| {
                assert_eq!(e.kind, EventType::Warning, "{reason}");
                e.message
            })
            .collect()
    }
}

fn uids(r: &PreemptResult) -> Vec<&str> {
    r.node_victims["n0"].iter().map(String::as_str).collect()
}

#[test]
fn preempt_takes_a_pdb_protected_victim_last() {
    let e = env(2, None);
    // By the contract's order alone `guarded` (lower priority) goes first.
    e.run(Running { uid: "guarded", gpu: 0, priority: 1, labels: &[("app", "web")], ..Running::default() });
    e.run(Running { uid: "free", gpu: 1, priority: 2, labels: &[("app", "batch")], ..Running::default() });
    let hi = e.preemptor(1, 100, &[]);
    assert_eq!(uids(&e.preempt(&hi, &[])), ["guarded"], "no budget: lower priority first");

    // A budget with no disruption left: the other victim is taken instead.
    e.pdb("web", "web", 0);
    let r = e.preempt(&hi, &[]);
    assert_eq!(uids(&r), ["free"]);
    assert_eq!(r.pdb_violations["n0"], 0);

    // Needing both GPUs, the protected pod is added after the other one and counted as a violation.
    let both = e.preempt(&e.preemptor(2, 100, &[]), &[]);
    assert_eq!(uids(&both), ["free", "guarded"]);
    assert_eq!(both.pdb_violations["n0"], 1);

    // A budget that still allows one disruption does not protect.
    e.pdb("web", "web", 1);
    let r = e.preempt(&hi, &[]);
    assert_eq!(uids(&r), ["guarded"]);
    assert_eq!(r.pdb_violations["n0"], 0);

    // A pod already listed as disrupted does not spend the budget again.
    e.cluster.upsert_pdb(PodDisruptionBudget {
        namespace: "default".into(),
        name: "web".into(),
        selector: Some(LabelSelector {
            match_labels: [("app".into(), "web".into())].into(),
            ..Default::default()
        }),
        disruptions_allowed: 0,
        disrupted_pods: ["pod-guarded".to_owned()].into(),
    });
    assert_eq!(uids(&e.preempt(&hi, &[])), ["guarded"]);
}

#[test]
fn preempt_counts_violations_of_the_schedulers_victims_and_reports_them_on_the_wire() {
    let e = env(2, None);
    e.run(Running { uid: "a", gpu: 0, labels: &[("app", "web")], ..Running::default() });
    e.run(Running { uid: "b", gpu: 1, labels: &[("app", "web")], ..Running::default() });
    e.pdb("web", "web", 1);
    // The scheduler sent both (and claimed 0 violations): the second eviction of `web` violates its budget.
    let hi = e.preemptor(2, 100, &[]);
    let r = e.preempt(&hi, &["a", "b"]);
    assert_eq!(uids(&r), ["a", "b"]);
    assert_eq!(r.pdb_violations["n0"], 1);
    let args = ExtenderPreemptionArgs {
        node_name_to_meta_victims: [(
            "n0".to_owned(),
            MetaVictims {
                pods: vec![MetaPod { uid: "a".into() }, MetaPod { uid: "b".into() }],
                num_pdb_violations: 0,
            },
        )]
        .into(),
        ..ExtenderPreemptionArgs::default()
    };
    let out = ExtenderPreemptionResult::from_result(&args, r);
    assert_eq!(out.node_name_to_meta_victims["n0"].num_pdb_violations, 1, "counted, not the bound");

    // When the budgets cannot be listed, victims are still chosen and the count is left to the bound.
    e.cluster.fail_next_pdb_lists(1);
    let r = e.preempt(&hi, &["a", "b"]);
    assert_eq!(uids(&r), ["a", "b"]);
    assert!(r.pdb_violations.is_empty());
}

#[test]
fn preempt_adds_victims_in_the_contract_order() {
    let e = env(4, None);
    e.run(Running { uid: "gang", gpu: 0, priority: 1, gang: Some("g"), ..Running::default() });
    e.run(Running { uid: "older", gpu: 1, priority: 5, created_ns: 10, ..Running::default() });
    e.run(Running { uid: "newer", gpu: 2, priority: 5, created_ns: 20, ..Running::default() });
    e.run(Running { uid: "lowest", gpu: 3, priority: 3, created_ns: 0, ..Running::default() });
    // Non-gang first, then lower priority first, then newer first: lowest, newer, older, gang.
    for (need, want) in [
        (1, vec!["lowest"]),
        (2, vec!["lowest", "newer"]),
        (3, vec!["lowest", "newer", "older"]),
        (4, vec!["lowest", "newer", "older", "gang"]),
    ] {
        assert_eq!(uids(&e.preempt(&e.preemptor(need, 100, &[]), &[])), want, "need {need}");
    }
    // Only lower-priority pods are added.
    let r = e.preempt(&e.preemptor(1, 2, &[]), &[]);
    assert_eq!(uids(&r), ["gang"]);
    let r = e.preempt(&e.preemptor(2, 2, &[]), &[]);
    assert!(r.node_victims.is_empty(), "only one pod has a lower priority");
}

#[test]
fn preempt_takes_victims_on_the_gang_anchor_component_first() {
    // NVLink inside 0-1 and inside 2-3; the preemptor's gang sibling holds GPU 0, so its anchor is {0, 1}.
    let topo = DeviceTopology::decode(
        r#"[{"index":0,"links":{"1":[8],"2":[1],"3":[1]}},{"index":1,"links":{"0":[8],"2":[1],"3":[1]}},
            {"index":2,"links":{"3":[8],"0":[1],"1":[1]}},{"index":3,"links":{"2":[8],"0":[1],"1":[1]}}]"#,
    )
    .unwrap();
    let e = env(4, Some(&topo));
    e.run(Running { uid: "sibling", gpu: 0, priority: 50, gang: Some("train"), ..Running::default() });
    e.run(Running { uid: "on-anchor", gpu: 1, priority: 9, ..Running::default() });
    e.run(Running { uid: "off-a", gpu: 2, priority: 1, ..Running::default() });
    e.run(Running { uid: "off-b", gpu: 3, priority: 1, ..Running::default() });
    let ann =
        [(e.d.device_topology_mode(), "link".to_owned()), (e.d.cross_pod_topology(), "true".to_owned())];
    let mut hi = e.preemptor(1, 100, &ann);
    hi.gang = Some("default/train".into());
    let r = e.preempt(&hi, &["sibling"]);
    assert_eq!(uids(&r), ["on-anchor"], "the anchor component first; the gang sibling is protected");
    // Without cross-pod alignment there is no anchor: lower priority first (then by UID on a full tie).
    let plain = e.preemptor(1, 100, &ann[..1]);
    assert_eq!(uids(&e.preempt(&plain, &[])), ["off-a"]);
}

#[test]
fn preempt_gives_back_victims_the_pod_fits_without() {
    // GPU 0: a small free pod and a protected big one; GPU 1: the same. The free pods go first, and are not
    // enough; one protected pod then frees a GPU, and the free pod on the other GPU is given back.
    let e = env(2, None);
    let half = |uid: &str, gpu: u32, cores: u32, labels: &[(&str, &str)], prio: i32| {
        let mut p = vgpu_pod(uid, 1, cores, 0, &[], &e.d);
        p.annotations.insert(e.d.pre_allocated(), format!("main[{gpu}_GPU-{gpu}_{cores}_1024]"));
        p.annotations.insert(e.d.predicate_node(), "n0".to_owned());
        p.node_name = Some("n0".to_owned());
        p.phase = PodPhase::Running;
        p.priority = prio;
        p.labels = labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        e.cluster.upsert_pod(p);
    };
    half("small0", 0, 30, &[], 2);
    half("big0", 0, 70, &[("app", "web")], 1);
    half("small1", 1, 30, &[], 3);
    half("big1", 1, 70, &[("app", "web")], 4);
    e.pdb("web", "web", 0);
    let r = e.preempt(&e.preemptor(1, 100, &[]), &[]);
    assert_eq!(uids(&r), ["small0", "big0"], "small1 was given back");
    assert_eq!(r.pdb_violations["n0"], 1);
}

#[test]
fn preempt_records_events_on_the_preemptor() {
    let e = env(2, None);
    e.run(Running { uid: "member", gpu: 0, priority: 1, gang: Some("g"), ..Running::default() });
    e.run(Running { uid: "other", gpu: 1, priority: 1, gang: Some("g"), ..Running::default() });
    let r = e.preempt(&e.preemptor(2, 100, &[]), &[]);
    assert_eq!(r.node_victims["n0"].len(), 2);
    let gang = e.events("GangDisruptedByPreemption");
    assert_eq!(gang.len(), 1, "one event per gang: {gang:?}");
    assert!(gang[0].contains("\"default/g\""), "{}", gang[0]);
    assert!(gang[0].contains("default/pod-member on node \"n0\""), "{}", gang[0]);
    assert!(e.events("PreemptionFailed").is_empty());

    // Nothing of lower priority: every candidate is dropped, and the preemptor is told why.
    let r = e.preempt(&e.preemptor(1, 0, &[]), &[]);
    assert!(r.node_victims.is_empty());
    let failed = e.events("PreemptionFailed");
    assert_eq!(failed.len(), 1);
    assert!(failed[0].starts_with("preemption: 0/1 nodes are available: "), "{}", failed[0]);
    assert!(failed[0].ends_with("(n0)."), "{}", failed[0]);

    // A pod without vGPUs passes through silently.
    let before = e.cluster.events().len();
    let plain = Pod { uid: "x".into(), name: "pod-hi".into(), ..Pod::default() };
    let victims: BTreeMap<String, Vec<String>> = [("n0".to_owned(), vec!["member".to_owned()])].into();
    assert_eq!(e.rt.block_on(e.ext.preempt(Some(&plain), &victims)).node_victims, victims);
    assert_eq!(e.cluster.events().len(), before);
}

mod invariants {
    use super::*;
    use proptest::prelude::*;
    use vgpu_core::alloc::{NodeView, PodRequest, allocate};
    use vgpu_scheduler::Cluster;
    use vgpu_scheduler::budgets::Budgets;

    /// A running pod: (GPU, half or whole card, priority, app label 0 none / 1 a / 2 b).
    type Spec = (u32, bool, i32, u8);

    fn cluster_state() -> impl Strategy<Value = (Vec<Spec>, [i32; 2], u32, i32, Vec<bool>)> {
        (
            proptest::collection::vec((0..4u32, any::<bool>(), 0..6i32, 0..3u8), 0..8),
            [0..3i32, 0..3i32],
            1..=4u32,
            2..7i32,
            proptest::collection::vec(any::<bool>(), 8),
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// Whatever the pods and budgets: the pod fits once a node's victims are gone, added victims have a
        /// lower priority, each added victim is needed, `NumPDBViolations` is the count over the victims, and
        /// no violating pod is taken while the non-violating ones suffice.
        #[test]
        fn preempt_answers_are_sound((pods, allowed, need, prio, sent_mask) in cluster_state()) {
            let e = env(4, None);
            let mut used = [0u32; 4];
            let mut placed: Vec<Pod> = Vec::new();
            for (i, (gpu, whole, priority, app)) in pods.into_iter().enumerate() {
                let cores = if whole { 100 } else { 50 };
                if used[gpu as usize] + cores > 100 {
                    continue;
                }
                used[gpu as usize] += cores;
                let mut p = vgpu_pod(&format!("p{i}"), 1, cores, 0, &[], &e.d);
                p.annotations.insert(e.d.pre_allocated(), format!("main[{gpu}_GPU-{gpu}_{cores}_1024]"));
                p.annotations.insert(e.d.predicate_node(), "n0".to_owned());
                p.node_name = Some("n0".to_owned());
                p.phase = PodPhase::Running;
                p.priority = priority;
                p.created_ns = i as i64;
                if app > 0 {
                    p.labels.insert("app".into(), if app == 1 { "a".into() } else { "b".into() });
                }
                placed.push(e.cluster.upsert_pod(p));
            }
            e.pdb("a", "a", allowed[0]);
            e.pdb("b", "b", allowed[1]);
            let hi = e.preemptor(need, prio, &[]);
            let sent: Vec<&str> = placed
                .iter()
                .zip(&sent_mask)
                .filter(|(p, m)| **m && p.priority < prio)
                .map(|(p, _)| p.uid.as_str())
                .collect();
            let r = e.preempt(&hi, &sent);
            let Some(chosen) = r.node_victims.get("n0") else { return Ok(()) };
            let by_uid = |u: &str| placed.iter().find(|p| p.uid == u).unwrap();
            let decoded = e.ext.cache().decoded("n0").unwrap();
            let base = e.ext.cache().node("n0").unwrap().lock().unwrap().usage.clone();
            let request = PodRequest::from_pod(&hi.request_spec(), &e.d).unwrap();
            let fits = |victims: &[&str]| {
                let mut usage = base.clone();
                for v in victims {
                    usage.remove_pod(v);
                }
                let view = NodeView {
                    name: "n0", inventory: &decoded.inventory, config: &decoded.config, links: None, usage: &usage,
                };
                allocate(&request, &view).is_ok()
            };
            let victims: Vec<&str> = chosen.iter().map(String::as_str).collect();
            prop_assert!(fits(&victims), "does not fit after evicting {victims:?}");
            prop_assert_eq!(&victims[..sent.len()], &sent[..], "the scheduler's victims come first, in order");
            let added = &victims[sent.len()..];
            for (i, v) in added.iter().enumerate() {
                prop_assert!(by_uid(v).priority < prio);
                let without: Vec<&str> = victims.iter().filter(|u| *u != v).copied().collect();
                prop_assert!(!fits(&without), "added victim {i} ({v}) is not needed");
            }
            let pdbs = e.rt.block_on(e.cluster.list_pod_disruption_budgets()).unwrap();
            let pods: Vec<&Pod> = victims.iter().map(|u| by_uid(u)).collect();
            prop_assert_eq!(r.pdb_violations["n0"], Budgets::count_violations(&pdbs, pods.iter().copied()));
            // If every lower-priority pod that does not spend an exhausted budget suffices, nothing added
            // violates one.
            let mut probe = Budgets::new(&pdbs);
            for v in &sent {
                probe.evict(by_uid(v));
            }
            let mut candidates: Vec<&Pod> = placed
                .iter()
                .filter(|p| p.priority < prio && !sent.contains(&p.uid.as_str()))
                .collect();
            candidates.sort_by(|a, b| {
                a.priority.cmp(&b.priority).then(b.created_ns.cmp(&a.created_ns)).then(a.uid.cmp(&b.uid))
            });
            let clean: Vec<&str> = candidates
                .into_iter()
                .filter(|p| !probe.evict(p))
                .map(|p| p.uid.as_str())
                .collect();
            let all_clean: Vec<&str> = sent.iter().chain(&clean).copied().collect();
            if fits(&all_clean) {
                let sent_pods: Vec<&Pod> = sent.iter().map(|u| by_uid(u)).collect();
                prop_assert_eq!(
                    r.pdb_violations["n0"],
                    Budgets::count_violations(&pdbs, sent_pods.iter().copied()),
                    "a violating victim was added although the others suffice"
                );
            }
        }
    }
}
