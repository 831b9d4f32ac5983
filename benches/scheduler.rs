#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! One live filter call against a cache of 5,000 nodes x 8 GPUs holding 20,000 placed pods (binpack, spread,
//! link), next to the Go approach: rebuild every node's usage from the full pod list on each call.
//!
//! - `cache/<policy>`: `Extender::filter` end to end: rank, allocate, reserve, patch (in-memory cluster), cache
//!   update, and the answer with 4,999 `FailedNodes` entries, the candidates in node creation order (the rank
//!   table's rows are read sequentially). Each iteration starts from the same cache: the setup (not timed)
//!   forgets the previous iteration's placement.
//! - `shuffled/<policy>`: the same call with the candidate list in a different random order each time, as
//!   kube-scheduler sends it (its parallel node filter appends feasible nodes as they finish, from a rotating
//!   start): rows are read in random order.
//! - `json/<policy>`: the same call as the HTTP handler runs it, from the request body (`ExtenderArgs` with 5,000
//!   `NodeNames`) to the serialized `ExtenderFilterResult`.
//! - `rebuild_per_call/<policy>`: the Go approach's node usage rebuild, ordering and allocation (no patch, no
//!   answer): a lower bound of its cost.

use std::collections::HashMap;
use std::hint::black_box;
use std::sync::Arc;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use vgpu_core::alloc::{NodeLinks, NodeUsage, NodeView, PodFootprint, PodRequest, allocate, order_nodes};
use vgpu_core::clock::ManualClock;
use vgpu_core::codec::{node_devices, pod_devices};
use vgpu_core::domain::ResourceDomain;
use vgpu_core::model::{NodeDeviceInventory, NodeVgpuConfig};
use vgpu_core::topology::{DeviceTopology, GpuLinks, P2PLinkType};
use vgpu_scheduler::fixture::{vgpu_node, vgpu_pod};
use vgpu_scheduler::wire::{ExtenderArgs, ExtenderFilterResult};
use vgpu_scheduler::{CandidateNames, Extender, ExtenderConfig, MemoryCluster, Pod, convert};

const NODES: usize = 5000;
const PODS: usize = 20_000;

fn inventory(n: usize) -> NodeDeviceInventory {
    NodeDeviceInventory::uniform(8, 81559, 10)
        .with_type_name("NVIDIA H100 80GB HBM3")
        .with_uuids(|i| format!("GPU-{n:05}-{i}"))
}

fn nvswitch() -> DeviceTopology {
    let nv18 = P2PLinkType::nvlinks(18).unwrap();
    let pcie = P2PLinkType::from_code(2).unwrap();
    DeviceTopology {
        gpus: (0..8)
            .map(|i| GpuLinks {
                index: i,
                links: (0..8).filter(|&j| j != i).map(|j| (j, vec![pcie, nv18])).collect(),
            })
            .collect(),
    }
}

struct Setup {
    ext: Extender<MemoryCluster, ManualClock>,
    names: Vec<String>,
    pods: Vec<Pod>,
    nodes: Vec<(String, String, String, String)>,
}

fn setup() -> Setup {
    let d = ResourceDomain::default();
    let cluster = MemoryCluster::new().without_event_log();
    let ext = Extender::new(
        cluster,
        Arc::new(ManualClock::new(1_700_000_000_000_000_000)),
        ExtenderConfig { emit_events: false, serialize_filter: false, ..ExtenderConfig::default() },
    );
    let topo = nvswitch();
    let mut names = Vec::with_capacity(NODES);
    let mut nodes = Vec::with_capacity(NODES);
    for n in 0..NODES {
        let name = format!("node-{n:05}");
        let node = vgpu_node(&name, &inventory(n), &NodeVgpuConfig::default(), Some(&topo), &d).unwrap();
        ext.cache().upsert_node(&node);
        nodes.push((
            name.clone(),
            node.annotations[&d.node_device_register()].clone(),
            node.annotations[&d.node_config_info()].clone(),
            node.annotations[&d.node_device_topology()].clone(),
        ));
        names.push(name);
    }
    // 20,000 bound pods: 4 per node, 1-2 vGPUs of 25 cores and 8 GiB.
    let mut pods = Vec::with_capacity(PODS);
    for p in 0..PODS {
        let n = p % NODES;
        let k = p / NODES;
        let mut pod = vgpu_pod(&format!("placed-{p}"), 1, 25, 8192, &[], &d);
        pod.node_name = Some(names[n].clone());
        pod.resource_version = 1;
        let claim = format!("main[{k}_GPU-{n:05}-{k}_25_8192]");
        pod.annotations.insert(d.pre_allocated(), claim);
        pod.annotations.insert(d.predicate_node(), names[n].clone());
        ext.cache().upsert_pod(pod.clone(), 0);
        pods.push(pod);
    }
    Setup { ext, names, pods, nodes }
}

/// The Go approach: decode nodes and rebuild usage from every pod, then order and allocate.
fn baseline(s: &Setup, pod: &Pod, d: &ResourceDomain) -> Option<String> {
    let request = PodRequest::from_pod(&pod.request_spec(), d).unwrap();
    let mut usage: HashMap<&str, NodeUsage> = HashMap::with_capacity(NODES);
    for p in &s.pods {
        let node = p.node_name.as_deref().unwrap();
        let claim = pod_devices::decode_pre_allocated(&p.annotations[&d.pre_allocated()]).unwrap();
        usage.entry(node).or_default().insert_pod(p.uid.clone(), PodFootprint::from_claim(&claim));
    }
    let decoded: Vec<(NodeDeviceInventory, NodeVgpuConfig, NodeLinks)> = s
        .nodes
        .iter()
        .map(|(_, reg, cfg, topo)| {
            (
                node_devices::decode(reg).unwrap(),
                vgpu_core::codec::node_config_info::decode(cfg).unwrap(),
                NodeLinks::decode(topo).unwrap(),
            )
        })
        .collect();
    let empty = NodeUsage::new();
    let views: Vec<NodeView<'_>> = s
        .nodes
        .iter()
        .zip(&decoded)
        .map(|((name, ..), (inv, cfg, links))| NodeView {
            name,
            inventory: inv,
            config: cfg,
            links: Some(links),
            usage: usage.get(name.as_str()).unwrap_or(&empty),
        })
        .collect();
    order_nodes(&request, &views)
        .into_iter()
        .find(|&i| allocate(&request, &views[i]).is_ok())
        .map(|i| views[i].name.to_owned())
}

/// `count` random permutations of the names (xorshift Fisher-Yates, fixed seed).
fn shuffled_orders(names: &[String], count: usize) -> Vec<Vec<String>> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    (0..count)
        .map(|_| {
            let mut v = names.to_vec();
            for i in (1..v.len()).rev() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                v.swap(i, (x % (i as u64 + 1)) as usize);
            }
            v
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let s = setup();
    let d = ResourceDomain::default();
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let mut group = c.benchmark_group("filter_5000x8_20000_pods");
    group.sample_size(10);
    for (label, node_policy, mode) in
        [("binpack", "binpack", "none"), ("spread", "spread", "none"), ("link", "binpack", "link")]
    {
        let ann = vec![
            (d.node_scheduler_policy(), node_policy.to_string()),
            (d.device_scheduler_policy(), "binpack".to_string()),
            (d.device_topology_mode(), mode.to_string()),
        ];
        let pod = vgpu_pod("probe", 2, 50, 16384, &ann, &d);
        let reset = || {
            s.ext.cache().delete_pod(&pod.uid);
            s.ext.cluster().upsert_pod(pod.clone());
        };
        reset();
        let first = rt.block_on(s.ext.filter(Some(&pod), s.names.clone()));
        assert_eq!(first.node_names().len(), 1, "{label}: {first:?}");
        assert_eq!(first.failed_nodes().len(), NODES - 1);
        // The candidate list is owned by the call (the server deserializes it); the copy is setup, not timed.
        let mut orders = shuffled_orders(&s.names, 16)
            .into_iter()
            .map(CandidateNames::from)
            .collect::<Vec<_>>()
            .into_iter()
            .cycle();
        let candidates = CandidateNames::from(&s.names[..]);
        group.bench_function(format!("shuffled/{label}"), |b| {
            b.iter_batched(
                || {
                    reset();
                    orders.next().unwrap_or_default()
                },
                |names| black_box(rt.block_on(s.ext.filter(Some(&pod), names))),
                BatchSize::PerIteration,
            )
        });
        group.bench_function(format!("cache/{label}"), |b| {
            b.iter_batched(
                || {
                    reset();
                    candidates.clone()
                },
                |names| black_box(rt.block_on(s.ext.filter(Some(&pod), names))),
                BatchSize::PerIteration,
            )
        });
        let body = serde_json::to_vec(&serde_json::json!({
            "Pod": {
                "metadata": {"name": pod.name, "namespace": pod.namespace, "uid": pod.uid, "annotations": pod.annotations},
                "spec": {"containers": [{"name": "main", "resources": {"limits": {
                    d.vgpu_number(): "2", d.vgpu_cores(): "50", d.vgpu_memory(): "16384"
                }}}]}
            },
            "NodeNames": s.names,
        }))
        .unwrap();
        group.bench_function(format!("json/{label}"), |b| {
            b.iter_batched(
                reset,
                |()| {
                    let mut args: ExtenderArgs = serde_json::from_slice(&body).unwrap();
                    let names = args.take_candidate_names().unwrap();
                    let pod = args.pod.as_ref().map(convert::pod_from_k8s);
                    let result = rt.block_on(s.ext.filter(pod.as_ref(), names));
                    black_box(serde_json::to_vec(&ExtenderFilterResult::from_result(&args, result)).unwrap())
                },
                BatchSize::PerIteration,
            )
        });
        group.bench_function(format!("rebuild_per_call/{label}"), |b| {
            b.iter(|| black_box(baseline(&s, &pod, &d)))
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
