#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Cross-pod / cross-node gang alignment through the live filter (contract §4.5): siblings' NVLink island on
//! the same node, siblings' rails on another node, controller siblings, strict anchors, and the
//! `crosspod_alignment_total` counter; link subset searches reaching `link_search_*`.

use std::sync::Arc;

use vgpu_core::clock::ManualClock;
use vgpu_core::codec::node_gpu_domain::{self, GpuRails};
use vgpu_core::domain::ResourceDomain;
use vgpu_core::model::{NodeDeviceInventory, NodeVgpuConfig};
use vgpu_core::topology::DeviceTopology;
use vgpu_scheduler::fixture::{vgpu_node, vgpu_pod};
use vgpu_scheduler::{Extender, ExtenderConfig, FilterResult, MemoryCluster, Metrics, Pod};

const T0: i64 = 1_700_000_000_000_000_000;

fn inventory(node: &str) -> NodeDeviceInventory {
    let mut inv = NodeDeviceInventory::uniform(8, 16384, 4)
        .with_type_name("H100")
        .with_uuids(|i| format!("GPU-{node}-{i}"));
    for d in &mut inv.devices {
        d.numa_node = Some(0);
    }
    inv
}

/// Eight GPUs where every pair is joined by one link of `code(i, j)`.
fn fabric(code: impl Fn(usize, usize) -> u8) -> DeviceTopology {
    let gpus: Vec<String> = (0..8)
        .map(|i| {
            let peers: Vec<String> =
                (0..8).filter(|&j| j != i).map(|j| format!("\"{j}\":[{}]", code(i, j))).collect();
            format!("{{\"index\":{i},\"links\":{{{}}}}}", peers.join(","))
        })
        .collect();
    DeviceTopology::decode(&format!("[{}]", gpus.join(","))).unwrap()
}

/// Eight GPUs with NVLink (NV12) only inside 0-3 and inside 4-7; same-CPU PCIe across the islands.
fn two_islands() -> DeviceTopology {
    fabric(|i, j| if i / 4 == j / 4 { 18 } else { 2 })
}

/// Eight GPUs, all pairs NVLink (one component).
fn nvswitch() -> DeviceTopology {
    fabric(|_, _| 24)
}

struct Env {
    d: ResourceDomain,
    cluster: MemoryCluster,
    ext: Extender<MemoryCluster, ManualClock>,
    metrics: Arc<Metrics>,
    rt: tokio::runtime::Runtime,
}

/// Nodes `(name, topology, rail map)`.
fn env(nodes: &[(&str, DeviceTopology, Option<String>)]) -> Env {
    let d = ResourceDomain::default();
    let cluster = MemoryCluster::new();
    for (name, topo, rails) in nodes {
        let mut node = vgpu_node(name, &inventory(name), &NodeVgpuConfig::default(), Some(topo), &d).unwrap();
        if let Some(r) = rails {
            node.annotations.insert(d.node_gpu_domain(), r.clone());
        }
        cluster.upsert_node(node);
    }
    let metrics = Arc::new(Metrics::new());
    let ext = Extender::new(cluster.clone(), Arc::new(ManualClock::new(T0)), ExtenderConfig::default())
        .with_observer(metrics.clone());
    ext.attach();
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    rt.block_on(ext.sync()).unwrap();
    Env { d, cluster, ext, metrics, rt }
}

#[derive(Clone, Copy)]
enum Sibling<'a> {
    Gang(&'a str),
    Owner(&'a str),
    Alone,
}

impl Env {
    /// A pod asking for `n` vGPUs in `mode`, opted into cross-pod alignment unless `cross_pod` is false, and
    /// restricted to `include` GPU UUIDs when given.
    fn pod(
        &self,
        uid: &str,
        n: u32,
        mode: &str,
        sib: Sibling<'_>,
        cross_pod: bool,
        include: &[String],
    ) -> Pod {
        let mut ann = vec![
            (self.d.device_topology_mode(), mode.to_owned()),
            (self.d.device_scheduler_policy(), "none".to_owned()),
        ];
        if cross_pod {
            ann.push((self.d.cross_pod_topology(), "true".to_owned()));
        }
        if !include.is_empty() {
            ann.push((self.d.include_gpu_uuid(), include.join(",")));
        }
        let mut pod = vgpu_pod(uid, n, 10, 1024, &ann, &self.d);
        match sib {
            Sibling::Gang(g) => pod.gang = Some(format!("default/{g}")),
            Sibling::Owner(o) => pod.owner_uid = Some(o.to_owned()),
            Sibling::Alone => {}
        }
        self.cluster.upsert_pod(pod)
    }

    fn filter(&self, pod: &Pod, nodes: &[&str]) -> FilterResult {
        let names: Vec<String> = nodes.iter().map(|n| (*n).to_owned()).collect();
        self.rt.block_on(self.ext.filter(Some(pod), names))
    }

    /// Filters and returns (node, GPU indices of the placement). The pod stays unbound: its siblings align
    /// with the filter's reservation, before any pre-allocation is written.
    fn place(&self, pod: &Pod, nodes: &[&str]) -> (String, Vec<u32>) {
        let r = self.filter(pod, nodes);
        assert_eq!(r.error, "", "{r:?}");
        assert_eq!(r.node_names().len(), 1, "{r:?}");
        let claim = self.ext.placed_claim(&pod.uid).unwrap();
        (r.node_names()[0].to_owned(), claim.devices().map(|d| d.index).collect())
    }

    fn alignment_count(&self, result: &str) -> u64 {
        self.sample(&format!("vgpu_scheduler_crosspod_alignment_total{{result=\"{result}\"}}")) as u64
    }

    /// The value of one exposed sample (`name{labels}`).
    fn sample(&self, series: &str) -> f64 {
        let text = self.metrics.encode().unwrap();
        let key = format!("{series} ");
        let line = text.lines().find(|l| l.starts_with(&key)).unwrap_or_else(|| panic!("{key} in {text}"));
        line[key.len()..].parse().unwrap()
    }
}

fn uuids(node: &str, gpus: &[u32]) -> Vec<String> {
    gpus.iter().map(|i| format!("GPU-{node}-{i}")).collect()
}

#[test]
fn gang_sibling_lands_on_the_siblings_nvlink_island() {
    let e = env(&[("n0", two_islands(), None)]);
    // A first gang member pinned to the second island.
    let first = e.pod("g1", 2, "link", Sibling::Gang("train"), true, &uuids("n0", &[4, 5]));
    assert_eq!(e.place(&first, &["n0"]), ("n0".to_owned(), vec![4, 5]));
    assert_eq!(e.alignment_count("component"), 0, "the first member has no placed sibling");
    // A pod outside the gang takes the first island (policy none: lowest component first).
    let other = e.pod("x1", 2, "link", Sibling::Alone, true, &[]);
    assert_eq!(e.place(&other, &["n0"]).1, [0, 1]);
    // The next member joins its siblings' island, though both islands are equally used. (It needs 3 GPUs, so
    // the rail window — the sibling's GPUs 4 and 5, the device index being the rail without a rail map — is
    // too small and the anchor component is used.)
    let second = e.pod("g2", 3, "link", Sibling::Gang("train"), true, &[]);
    assert_eq!(e.place(&second, &["n0"]).1, [4, 5, 6]);
    assert_eq!(e.alignment_count("component"), 1);
    assert_eq!((e.alignment_count("rail"), e.alignment_count("none")), (0, 0));
    // Without the cross-pod opt-in a gang member is placed as before.
    let plain = e.pod("g3", 2, "link", Sibling::Gang("train"), false, &[]);
    assert_eq!(e.place(&plain, &["n0"]).1, [0, 1]);
    assert_eq!(e.alignment_count("component"), 1);
    // Another gang's member is not anchored there.
    let stranger = e.pod("h1", 2, "link", Sibling::Gang("other"), true, &[]);
    assert_eq!(e.place(&stranger, &["n0"]).1, [0, 1]);
    assert_eq!(e.alignment_count("component"), 1);
}

#[test]
fn controller_siblings_align_without_a_gang() {
    let e = env(&[("n0", two_islands(), None)]);
    let first = e.pod("r1", 1, "link", Sibling::Owner("rs-uid"), true, &uuids("n0", &[6]));
    assert_eq!(e.place(&first, &["n0"]).1, [6]);
    let second = e.pod("r2", 2, "link-strict", Sibling::Owner("rs-uid"), true, &[]);
    let (_, got) = e.place(&second, &["n0"]);
    assert!(got.iter().all(|i| (4..8).contains(i)), "{got:?}");
    assert_eq!(e.alignment_count("component"), 1);
}

#[test]
fn strict_member_is_rejected_when_its_island_cannot_take_it() {
    let e = env(&[("n0", two_islands(), None), ("n1", two_islands(), None)]);
    // The gang's island on n0 is 4-7; fill 6 and 7 with another pod.
    let first = e.pod("g1", 2, "link", Sibling::Gang("train"), true, &uuids("n0", &[4, 5]));
    assert_eq!(e.place(&first, &["n0"]).1, [4, 5]);
    for uid in ["f1", "f2", "f3", "f4"] {
        let filler = e.pod(uid, 2, "none", Sibling::Alone, false, &uuids("n0", &[6, 7]));
        assert_eq!(e.place(&filler, &["n0"]).1, [6, 7]);
    }
    // 4 GPUs strict: the island has only 4-5 free; island 0-3 is free but off-anchor → n0 rejected. n1 has no
    // sibling, but the gang's domain signature (ord:1) anchors the member to n1's island 4-7.
    let second = e.pod("g2", 4, "link-strict", Sibling::Gang("train"), true, &[]);
    let r = e.filter(&second, &["n0", "n1"]);
    assert_eq!(r.node_names(), ["n1"], "{r:?}");
    assert_eq!(r.failure("n0"), Some("GPU link topology unsatisfied"));
    assert_eq!(e.rt.block_on(e.ext.bind("default", "pod-g2", &second.uid, "n1")).error, "");
    let p = e.cluster.pod("default", "pod-g2").unwrap();
    assert_eq!(
        p.annotations[&e.d.pre_allocated()],
        "main[4_GPU-n1-4_10_1024,5_GPU-n1-5_10_1024,6_GPU-n1-6_10_1024,7_GPU-n1-7_10_1024]"
    );
    assert_eq!(e.alignment_count("component"), 1);
}

#[test]
fn rails_of_siblings_on_another_node_pick_the_rail_window() {
    // Both nodes publish rails; on n1 the rails are rotated, so rail r3 is GPU 1 there.
    let rails = |node: &str, shift: u32| -> String {
        let map: GpuRails =
            (0..8).map(|i| (format!("GPU-{node}-{i}"), format!("r{}", (i + shift) % 8))).collect();
        node_gpu_domain::encode(&map)
    };
    let e = env(&[("n0", nvswitch(), Some(rails("n0", 0))), ("n1", nvswitch(), Some(rails("n1", 2)))]);
    let first = e.pod("g1", 1, "link", Sibling::Gang("ddp"), true, &uuids("n0", &[3]));
    assert_eq!(e.place(&first, &["n0"]), ("n0".to_owned(), vec![3]));
    let second = e.pod("g2", 1, "link", Sibling::Gang("ddp"), true, &[]);
    assert_eq!(e.place(&second, &["n1"]), ("n1".to_owned(), vec![1]));
    assert_eq!((e.alignment_count("rail"), e.alignment_count("component")), (1, 0));
    // Two-GPU member: rails r3 only has one GPU on n1, so the rail window is too small; the whole-node
    // NVLink component (same domain signature) takes it.
    let third = e.pod("g3", 2, "link", Sibling::Gang("ddp"), true, &[]);
    let (node, got) = e.place(&third, &["n1"]);
    assert_eq!((node.as_str(), got.len()), ("n1", 2));
    assert_eq!(e.alignment_count("component"), 1);
}

#[test]
fn without_rails_the_device_index_is_the_rail() {
    let e = env(&[("n0", nvswitch(), None), ("n1", nvswitch(), Some("not json".to_owned()))]);
    let first = e.pod("g1", 1, "link", Sibling::Gang("ddp"), true, &uuids("n0", &[5]));
    assert_eq!(e.place(&first, &["n0"]).1, [5]);
    // n1's rail map does not decode: ignored, so index 5 is rail 5 there too.
    let second = e.pod("g2", 1, "link", Sibling::Gang("ddp"), true, &[]);
    assert_eq!(e.place(&second, &["n1"]), ("n1".to_owned(), vec![5]));
    assert_eq!(e.alignment_count("rail"), 1);
}

#[test]
fn link_subset_searches_reach_the_metrics() {
    let e = env(&[("n0", nvswitch(), None)]);
    let searches = |algo: &str| e.sample(&format!("vgpu_scheduler_link_search_total{{algo=\"{algo}\"}}"));
    let searched =
        |algo: &str| e.sample(&format!("vgpu_scheduler_link_search_candidates_sum{{algo=\"{algo}\"}}"));
    assert_eq!((searches("exhaustive"), searches("greedy")), (0.0, 0.0), "pre-created at zero");
    // 3 of 8 equal NVLink GPUs: one exhaustive search over the 8.
    let p = e.pod("s1", 3, "link", Sibling::Alone, false, &[]);
    assert_eq!(e.place(&p, &["n0"]).1, [0, 1, 2]);
    assert_eq!((searches("exhaustive"), searched("exhaustive")), (1.0, 8.0));
    // All 8 GPUs (each still has free slots): nothing to search.
    let p = e.pod("s2", 8, "link", Sibling::Alone, false, &[]);
    assert_eq!(e.place(&p, &["n0"]).1, [0, 1, 2, 3, 4, 5, 6, 7]);
    assert_eq!((searches("exhaustive"), searches("greedy")), (1.0, 0.0));
}
