//! A read-only snapshot of a live cluster, loaded into the extender's own cache: shared by
//! `simulate --from-cluster`, `cluster` and `pod`.
//!
//! One paged list of nodes and one of pods (all namespaces), as the extender's initial sync does
//! ([`KubeCluster`]'s snapshot; RBAC `list` on `nodes` and `pods`). Nothing is written. The vGPU nodes (those
//! publishing `<domain>/node-device-register`) and every pod go into an in-memory cluster; the extender's
//! cache counts the pods' `pre-allocated` annotations exactly as the live extender does (vgpu-manager's
//! annotations are the same, so a vgpu-manager cluster reads the same way). The clock is frozen at the
//! snapshot's time and the extender records no events.
//!
//! | item | meaning |
//! |---|---|
//! | [`Snapshot::candidates`] | vGPU nodes, sorted by name |
//! | [`usage_summary`] | `gpus`, `gpus_in_use`, `core_utilization_pct`, `memory_utilization_pct`, `fragmentation_pct` |
//! | [`allocations`] | every pod the cache counts: `{pod, node, pre_allocated}`, sorted by pod |

use std::path::Path;
use std::sync::Arc;

use serde_json::{Value, json};
use vgpu_core::clock::{Clock, ManualClock, SystemClock};
use vgpu_core::domain::ResourceDomain;
use vgpu_scheduler::{Cluster, ClusterCache, Extender, ExtenderConfig, KubeCluster, MemoryCluster, Node};

/// The extender over the snapshot.
pub type SnapshotExtender = Extender<MemoryCluster, ManualClock>;

/// The cluster as listed, in the extender's cache.
pub struct Snapshot {
    /// The runtime the snapshot was read with (and the extender's verbs run on).
    pub rt: tokio::runtime::Runtime,
    /// The client the snapshot was read with (for further read-only requests).
    pub client: kube::Client,
    /// The resource domain (`nvidia.com`).
    pub domain: ResourceDomain,
    /// Nodes listed.
    pub total_nodes: usize,
    /// Pods listed.
    pub total_pods: usize,
    /// The vGPU nodes as listed, sorted by name.
    pub nodes: Vec<Node>,
    /// The vGPU nodes' names, sorted.
    pub candidates: Vec<String>,
    /// The in-memory cluster holding the vGPU nodes and every pod.
    pub cluster: MemoryCluster,
    /// The extender over `cluster`, synced.
    pub ext: SnapshotExtender,
    /// The extender's cache.
    pub cache: Arc<ClusterCache>,
}

impl std::fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Snapshot")
            .field("total_nodes", &self.total_nodes)
            .field("total_pods", &self.total_pods)
            .field("candidates", &self.candidates)
            .field("ext", &self.ext)
            .finish_non_exhaustive()
    }
}

impl Snapshot {
    /// Lists the cluster through `kubeconfig` (default: in-cluster config, $KUBECONFIG or ~/.kube/config) and
    /// loads it into a fresh extender.
    pub fn load(kubeconfig: Option<&Path>) -> Result<Self, String> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("starting the runtime: {e}"))?;
        let domain = ResourceDomain::default();
        let (client, nodes, pods) = rt.block_on(async {
            let client = vgpu_bins::kube_client(kubeconfig).await.map_err(|e| format!("{e:#}"))?;
            let (nodes, pods) = KubeCluster::new(client.clone(), "vgpuctl")
                .snapshot()
                .await
                .map_err(|e| format!("reading the cluster: {e}"))?;
            Ok::<_, String>((client, nodes, pods))
        })?;
        let (total_nodes, total_pods) = (nodes.len(), pods.len());
        let cluster = MemoryCluster::new().without_event_log();
        let mut vgpu_nodes: Vec<Node> = Vec::new();
        for node in nodes {
            if node.annotations.contains_key(&domain.node_device_register()) {
                vgpu_nodes.push(node.clone());
                cluster.upsert_node(node);
            }
        }
        vgpu_nodes.sort_by(|a, b| a.name.cmp(&b.name));
        let candidates: Vec<String> = vgpu_nodes.iter().map(|n| n.name.clone()).collect();
        for pod in pods {
            cluster.upsert_pod(pod);
        }
        let clock = Arc::new(ManualClock::new(SystemClock.now_ns()));
        let config = ExtenderConfig { emit_events: false, ..ExtenderConfig::default() };
        let ext = Extender::new(cluster.clone(), clock, config);
        rt.block_on(ext.sync()).map_err(|e| format!("loading the snapshot: {e}"))?;
        ext.attach();
        let cache = ext.cache().clone();
        Ok(Self {
            rt,
            client,
            domain,
            total_nodes,
            total_pods,
            nodes: vgpu_nodes,
            candidates,
            cluster,
            ext,
            cache,
        })
    }
}

/// Percentage `a / b` rounded to two decimals (0 when `b` is 0).
pub fn pct(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { (10_000.0 * a as f64 / b as f64).round() / 100.0 }
}

/// Utilization and fragmentation of the cache's schedulable GPUs.
pub fn usage_summary(cache: &ClusterCache) -> Value {
    let (mut gpus, mut in_use, mut partial) = (0u64, 0u64, 0u64);
    let (mut cap_c, mut cap_m, mut use_c, mut use_m) = (0u64, 0u64, 0u64, 0u64);
    for (_, decoded, usage) in cache.usage_snapshot() {
        let Some(d) = decoded else { continue };
        for g in d.inventory.schedulable() {
            let u = usage.device(g.index);
            gpus += 1;
            cap_c += g.cores;
            cap_m += g.memory_mib;
            use_c += u.cores;
            use_m += u.memory_mib;
            if u.number > 0 {
                in_use += 1;
                if u.cores < g.cores && u.memory_mib < g.memory_mib {
                    partial += 1;
                }
            }
        }
    }
    json!({
        "gpus": gpus,
        "gpus_in_use": in_use,
        "core_utilization_pct": pct(use_c, cap_c),
        "memory_utilization_pct": pct(use_m, cap_m),
        "fragmentation_pct": pct(partial, in_use),
    })
}

/// The pods the cache counts, with their node and `pre-allocated` value, sorted by pod.
pub fn allocations(cache: &ClusterCache, d: &ResourceDomain) -> Vec<Value> {
    let mut out: Vec<(String, String, String)> = cache
        .pods()
        .iter()
        .filter_map(|p| {
            let node = cache.counted_node(&p.uid)?;
            Some((p.key(), node, p.annotations.get(&d.pre_allocated()).cloned().unwrap_or_default()))
        })
        .collect();
    out.sort();
    out.into_iter()
        .map(|(pod, node, pre)| json!({ "pod": pod, "node": node, "pre_allocated": pre }))
        .collect()
}
