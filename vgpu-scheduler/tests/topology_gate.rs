#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Gate `TopologyAwareGPUAllocation` of the extender: on, link-mode pods are placed by the node's published
//! `node-device-topology`; off, the same node is treated as if it published none (contract §3.2, §4.2).

use std::sync::Arc;

use vgpu_core::alloc::ReasonCode;
use vgpu_core::clock::ManualClock;
use vgpu_core::domain::ResourceDomain;
use vgpu_core::model::{NodeDeviceInventory, NodeVgpuConfig};
use vgpu_core::topology::DeviceTopology;
use vgpu_gates::CoreGate;
use vgpu_scheduler::cluster::EventType;
use vgpu_scheduler::fixture::{vgpu_node, vgpu_pod};
use vgpu_scheduler::{Extender, ExtenderConfig, FilterResult, MemoryCluster, Pod};

const T0: i64 = 1_700_000_000_000_000_000;

/// Four GPUs with NVLink (NV4) between 0-2 and 1-3 only; the other pairs cross the CPU interconnect. Without
/// topology the policy order (`none`: by index) would take 0 and 1, which share no NVLink.
fn crossed_pairs() -> DeviceTopology {
    let code = |i: usize, j: usize| if i % 2 == j % 2 { 10 } else { 1 };
    let gpus: Vec<String> = (0..4)
        .map(|i| {
            let peers: Vec<String> =
                (0..4).filter(|&j| j != i).map(|j| format!("\"{j}\":[{}]", code(i, j))).collect();
            format!("{{\"index\":{i},\"links\":{{{}}}}}", peers.join(","))
        })
        .collect();
    DeviceTopology::decode(&format!("[{}]", gpus.join(","))).unwrap()
}

struct Env {
    d: ResourceDomain,
    cluster: MemoryCluster,
    ext: Extender<MemoryCluster, ManualClock>,
    rt: tokio::runtime::Runtime,
}

/// One node `n` publishing [`crossed_pairs`], under an extender configured from `--feature-gates=<gates>`.
fn env(gates: &str) -> Env {
    let d = ResourceDomain::default();
    let cluster = MemoryCluster::new();
    let inv = NodeDeviceInventory::uniform(4, 16384, 4).with_type_name("H100");
    cluster
        .upsert_node(vgpu_node("n", &inv, &NodeVgpuConfig::default(), Some(&crossed_pairs()), &d).unwrap());
    let gates =
        vgpu_gates::scheduler_extender().configure(gates.split(',').filter(|g| !g.is_empty())).unwrap();
    let ext =
        Extender::new(cluster.clone(), Arc::new(ManualClock::new(T0)), ExtenderConfig::from_gates(&gates));
    ext.attach();
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    rt.block_on(ext.sync()).unwrap();
    Env { d, cluster, ext, rt }
}

impl Env {
    fn pod(&self, uid: &str, mode: &str) -> Pod {
        let ann = [
            (self.d.device_topology_mode(), mode.to_owned()),
            (self.d.device_scheduler_policy(), "none".to_owned()),
        ];
        self.cluster.upsert_pod(vgpu_pod(uid, 2, 100, 1024, &ann, &self.d))
    }

    fn filter(&self, pod: &Pod) -> FilterResult {
        self.rt.block_on(self.ext.filter(Some(pod), vec!["n".to_owned()]))
    }

    /// GPU indices of a pod's placement (its filter's reservation).
    fn gpus(&self, pod: &Pod) -> Vec<u32> {
        let claim = self.ext.placed_claim(&pod.uid).unwrap();
        claim.devices().map(|d| d.index).collect()
    }

    fn events(&self, pod: &Pod, reason: &str) -> Vec<String> {
        self.cluster
            .events()
            .into_iter()
            .filter(|e| e.pod == pod.name && e.reason == reason)
            .map(|e| {
                assert_eq!(
                    e.kind,
                    if reason == "FilteringSucceed" { EventType::Normal } else { EventType::Warning }
                );
                e.message
            })
            .collect()
    }
}

#[test]
fn topology_gate_on_places_by_links_off_as_if_unpublished() {
    // On (today's behaviour): link-strict lands on an NVLink pair, and the node's topology is decoded.
    let on = env("TopologyAwareGPUAllocation=true");
    assert!(on.ext.config().link_topology);
    assert!(on.ext.cache().decoded("n").unwrap().links.is_some());
    let strict = on.pod("strict", "link-strict");
    assert_eq!(on.filter(&strict).node_names(), ["n"]);
    assert_eq!(on.gpus(&strict), [0, 2], "the NVLink pair, not the policy-order prefix 0,1");
    assert!(on.events(&strict, "TopologyFallback").is_empty());

    // Off (the gate's default): the same node, the same annotation, never decoded.
    let off = env("");
    assert!(
        !vgpu_gates::scheduler_extender()
            .configure(Vec::<&str>::new())
            .unwrap()
            .enabled(CoreGate::TopologyAwareGPUAllocation)
    );
    assert!(!off.ext.config().link_topology);
    assert!(off.ext.cache().decoded("n").unwrap().links.is_none(), "topology ignored when the gate is off");
    assert!(off.ext.cache().decoded("n").unwrap().domains.components().is_empty(), "nothing to align to");

    // link-strict: rejected as on a node without topology.
    let strict = off.pod("strict", "link-strict");
    let r = off.filter(&strict);
    assert!(r.node_names().is_empty());
    assert_eq!(r.failed_nodes().len(), 1);
    assert_eq!(r.failed_nodes().next().unwrap().code, ReasonCode::LinkTopologyUnsatisfied);
    let dry = off.ext.filter_dry_run(Some(&strict), vec!["n".to_owned()]);
    let detail = dry.failure("n").unwrap();
    assert!(detail.contains("node has no GPU link topology"), "{detail}");
    let failed = off.events(&strict, "FilteringFailed");
    assert_eq!(failed, ["0/1 nodes are available: GPU link topology unsatisfied (n)."]);

    // link (non-strict): placed on the first GPUs of the policy order, with a TopologyFallback warning.
    let loose = off.pod("loose", "link");
    assert_eq!(off.filter(&loose).node_names(), ["n"]);
    assert_eq!(off.gpus(&loose), [0, 1], "policy-order prefix");
    let fallback = off.events(&loose, "TopologyFallback");
    assert_eq!(fallback.len(), 1, "{fallback:?}");
    assert!(fallback[0].contains("node has no GPU link topology"), "{}", fallback[0]);

    // With the gate on, the non-strict pod gets the NVLink pair and no warning.
    let loose = on.pod("loose", "link");
    assert_eq!(on.filter(&loose).node_names(), ["n"]);
    assert_eq!(on.gpus(&loose), [1, 3], "the other NVLink pair (0 and 2 are taken by the strict pod)");
    assert!(on.events(&loose, "TopologyFallback").is_empty());
}

#[test]
fn topology_gate_off_ranks_link_pods_without_fitness() {
    // Two nodes: `a` publishes NVLink pairs, `b` publishes nothing. On, link fitness puts `a` first although
    // `b` sorts first by name under binpack ties; off, both have fitness 0 and the name decides.
    let run = |gates: &str| -> String {
        let e = env(gates);
        let inv = NodeDeviceInventory::uniform(4, 16384, 4).with_type_name("H100");
        let mut a = vgpu_node("a", &inv, &NodeVgpuConfig::default(), Some(&crossed_pairs()), &e.d).unwrap();
        a.name = "b-linked".into();
        e.cluster.upsert_node(a);
        e.cluster.upsert_node(vgpu_node("a-plain", &inv, &NodeVgpuConfig::default(), None, &e.d).unwrap());
        let ann = [
            (e.d.device_topology_mode(), "link".to_owned()),
            (e.d.node_scheduler_policy(), "binpack".to_owned()),
        ];
        let pod = e.cluster.upsert_pod(vgpu_pod("p", 2, 10, 1024, &ann, &e.d));
        let r = e.rt.block_on(e.ext.filter(Some(&pod), vec!["a-plain".to_owned(), "b-linked".to_owned()]));
        r.node_names().concat()
    };
    assert_eq!(run("TopologyAwareGPUAllocation=true"), "b-linked");
    assert_eq!(run("TopologyAwareGPUAllocation=false"), "a-plain");
}
