//! `vgpuctl simulate --from-cluster`: "how many more pods of this shape fit in my cluster, and where?"
//!
//! Read-only against the API server: one paged list of nodes and one of pods (all namespaces), as the
//! extender's initial sync does (the shared [`Snapshot`]; RBAC `list` on `nodes` and `pods`). Nothing is
//! written. The vGPU nodes (those publishing `<domain>/node-device-register`) and every pod go into an
//! in-memory cluster; the extender's cache counts the pods' `pre-allocated` annotations exactly as the live
//! extender does (vgpu-manager's annotations are the same, so a vgpu-manager cluster reads the same way).
//! Then `--count` pods of the `--pod` shape are streamed through the extender's filter and bind, one after the
//! other, each seeing the earlier ones' placements.
//!
//! The answer is deterministic for a given cluster state: candidates go in node-name order, placement and
//! ranking have no randomness, and the clock is frozen at the snapshot's time. Once one pod of the shape does
//! not fit, none of the later ones can (nothing changed), so they are counted with the same reason without
//! being tried.
//!
//! What is not modelled: taints, cordons, node selectors and affinity, and resources other than vGPUs (the
//! kube-scheduler's own filters); gates are the library defaults (`TopologyAwareGPUAllocation` on).
//!
//! JSON (`--json`) fields:
//!
//! | field | meaning |
//! |---|---|
//! | `snapshot.nodes`, `snapshot.vgpu_nodes`, `snapshot.pods` | objects listed; nodes publishing a device register |
//! | `snapshot.allocations` | every pod the cache counts: `{pod, node, pre_allocated}`, sorted by pod |
//! | `pod`, `count` | the shape (canonical text) and how many were asked |
//! | `fit`, `placements` | how many were placed, and node → how many of them |
//! | `rejected`, `rejected_by_reason` | how many did not fit, by the most common node rejection reason |
//! | `unfit_nodes_by_reason` | for the first pod that did not fit: reason → number of nodes rejecting it |
//! | `before`, `after` | `gpus`, `gpus_in_use`, `core_utilization_pct`, `memory_utilization_pct`, `fragmentation_pct` (used GPUs with both cores and memory left) |

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::json;
use vgpu_scheduler::CandidateNames;

use crate::pod_shape::PodShape;
use crate::progress::Progress;
use crate::snapshot::{Snapshot, allocations, usage_summary};

/// Namespace of the simulated pods (never created in the cluster).
pub const SIM_NAMESPACE: &str = "vgpuctl-simulate";

/// What `--from-cluster` needs.
#[derive(Debug)]
pub struct FromClusterArgs {
    /// `--kubeconfig`.
    pub kubeconfig: Option<PathBuf>,
    /// `--pod`.
    pub shape: PodShape,
    /// `--count`.
    pub count: usize,
    /// `--json`.
    pub json: bool,
}

/// Runs the what-if; returns the report text (JSON or human).
pub fn run(args: &FromClusterArgs) -> Result<String, String> {
    let snap = Snapshot::load(args.kubeconfig.as_deref())?;
    let (rt, d, cluster, ext, cache) = (&snap.rt, &snap.domain, &snap.cluster, &snap.ext, &snap.cache);
    let (total_nodes, total_pods) = (snap.total_nodes, snap.total_pods);
    // One buffer for every filter call (cloned per call as the server's request body would hand it over).
    let candidates = &CandidateNames::from(&snap.candidates[..]);
    let snapshot = json!({
        "nodes": total_nodes,
        "vgpu_nodes": candidates.len(),
        "pods": total_pods,
        "allocations": allocations(cache, d),
    });
    let before = usage_summary(cache);

    let mut placements: BTreeMap<String, usize> = BTreeMap::new();
    let mut rejected: BTreeMap<String, usize> = BTreeMap::new();
    let mut unfit: Option<BTreeMap<String, usize>> = None;
    let mut progress = Progress::new(args.count as u64, "pods");
    for i in 0..args.count {
        if let Some(reason) = unfit.as_ref().and_then(|u| u.iter().max_by_key(|(_, c)| **c)).map(|(r, _)| r) {
            // Nothing changed since a pod of this very shape did not fit: neither does this one.
            *rejected.entry(reason.clone()).or_default() += 1;
            progress.inc();
            continue;
        }
        let name = format!("simulate-{i:06}");
        let pod = args.shape.pod(SIM_NAMESPACE, &name, &format!("{SIM_NAMESPACE}-{i:06}"), d);
        let pod = cluster.upsert_pod(pod);
        let r = rt.block_on(ext.filter(Some(&pod), candidates.clone()));
        let chosen = r.passed().next().map(str::to_owned);
        match chosen {
            Some(node) => {
                let b = rt.block_on(ext.bind(&pod.namespace, &pod.name, &pod.uid, &node));
                if b.error.is_empty() {
                    *placements.entry(node).or_default() += 1;
                } else {
                    *rejected.entry(format!("bind: {}", b.error)).or_default() += 1;
                }
            }
            None if !r.error.is_empty() => {
                *rejected.entry(r.error.clone()).or_default() += 1;
                unfit = Some(BTreeMap::from([(r.error, candidates.len())]));
            }
            None => {
                let mut counts: BTreeMap<String, usize> = BTreeMap::new();
                for f in r.failed_nodes() {
                    *counts.entry(f.reason.to_string()).or_default() += 1;
                }
                let top = counts.iter().max_by_key(|(_, c)| **c).map(|(k, _)| k.clone()).unwrap_or_default();
                *rejected.entry(top).or_default() += 1;
                unfit = Some(counts);
            }
        }
        progress.inc();
    }
    progress.finish();
    let after = usage_summary(cache);
    let fit: usize = placements.values().sum();
    let n_rejected: usize = rejected.values().sum();
    let summary = json!({
        "snapshot": snapshot,
        "pod": args.shape.to_text(),
        "count": args.count,
        "fit": fit,
        "placements": placements,
        "rejected": n_rejected,
        "rejected_by_reason": rejected,
        "unfit_nodes_by_reason": unfit.clone().unwrap_or_default(),
        "before": before,
        "after": after,
    });
    if args.json {
        return Ok(format!("{summary:#}\n"));
    }
    let mut s = format!(
        "Cluster: {total_nodes} nodes ({} with vGPUs), {total_pods} pods, {} holding vGPUs\n",
        candidates.len(),
        snapshot["allocations"].as_array().map_or(0, Vec::len)
    );
    s.push_str(&format!(
        "Pod shape {} x {}: {fit} fit, {n_rejected} do not\n",
        args.shape.to_text(),
        args.count
    ));
    for (node, n) in &placements {
        s.push_str(&format!("  {n:>6}  on {node}\n"));
    }
    for (reason, n) in &rejected {
        s.push_str(&format!("  {n:>6}  rejected: {reason}\n"));
    }
    if let Some(u) = &unfit {
        s.push_str("First pod that did not fit, nodes by reason:\n");
        for (reason, n) in u {
            s.push_str(&format!("  {n:>6}  {reason}\n"));
        }
    }
    for (label, v) in [("before", &before), ("after", &after)] {
        s.push_str(&format!(
            "GPUs {label}: {} of {} in use, cores {}%, memory {}%, fragmentation {}%\n",
            v["gpus_in_use"],
            v["gpus"],
            v["core_utilization_pct"],
            v["memory_utilization_pct"],
            v["fragmentation_pct"]
        ));
    }
    Ok(s)
}
