//! `vgpuctl cluster`: nodes × GPUs of a live cluster with what is allocated on each, the pods per GPU,
//! fragmentation and unhealthy GPUs (in the spirit of `kubectl inspect gpushare`). Read-only.
//!
//! The cluster is read through the shared [`Snapshot`] (one list of nodes, one of pods) and what is allocated
//! is what the extender's cache counts from the pods' `pre-allocated` annotations (falling back to
//! `real-allocated`), so it works on clusters running vgpu-manager too. GPUs come from each node's
//! `node-device-register`; a node whose register does not decode is listed with its error.
//!
//! JSON (`--json`) fields; keys are sorted, nodes by name, GPUs by index, pods by `namespace/name`:
//!
//! | field | meaning |
//! |---|---|
//! | `nodes_listed`, `pods_listed` | objects listed |
//! | `nodes[].name`, `nodes[].error` | a vGPU node; `error` when its `node-device-register` does not decode |
//! | `nodes[].gpus[]` | `index`, `uuid`, `type`, `healthy`, `mig`, `vgpus` (slots), `cores`, `memory_mib` (capacity), `vgpus_allocated`, `cores_allocated`, `memory_mib_allocated`, `pods` |
//! | `nodes[].pods` | pods holding GPUs of the node (counted by the extender's cache, with a device claim) |
//! | `nodes[].summary`, `summary` | `gpus`, `gpus_in_use`, `core_utilization_pct`, `memory_utilization_pct`, `fragmentation_pct` (used GPUs with both cores and memory left), `unhealthy_gpus` — over schedulable GPUs |
//! | `unhealthy[]` | `{node, index, uuid}` of every unhealthy GPU |
//! | `allocations[]` | every pod holding GPUs on a vGPU node: `{pod, node, pre_allocated}` (the annotation's text) |

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use serde_json::{Value, json};
use vgpu_core::alloc::NodeUsage;
use vgpu_core::codec::node_devices;
use vgpu_core::model::NodeDeviceInventory;
use vgpu_scheduler::prealloc;

use crate::snapshot::{Snapshot, pct};

/// Arguments of `vgpuctl cluster`.
#[derive(Debug, clap::Args)]
pub struct ClusterArgs {
    /// Kubeconfig (default: in-cluster config, $KUBECONFIG or ~/.kube/config).
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// Print JSON (stable: sorted keys and rows).
    #[arg(long)]
    pub json: bool,
}

/// One GPU's row.
#[derive(Debug, Default, Clone)]
struct GpuRow {
    index: u32,
    uuid: String,
    type_name: String,
    healthy: bool,
    mig: bool,
    vgpus: u32,
    cores: u64,
    memory_mib: u64,
    vgpus_allocated: u32,
    cores_allocated: u64,
    memory_mib_allocated: u64,
    pods: Vec<String>,
}

/// Totals over schedulable GPUs (healthy, not MIG).
#[derive(Debug, Default, Clone, Copy)]
struct Totals {
    gpus: u64,
    in_use: u64,
    partial: u64,
    unhealthy: u64,
    cap_c: u64,
    cap_m: u64,
    use_c: u64,
    use_m: u64,
}

impl Totals {
    fn add(&mut self, g: &GpuRow) {
        if !g.healthy {
            self.unhealthy += 1;
        }
        if !g.healthy || g.mig {
            return;
        }
        self.gpus += 1;
        self.cap_c += g.cores;
        self.cap_m += g.memory_mib;
        self.use_c += g.cores_allocated;
        self.use_m += g.memory_mib_allocated;
        if g.vgpus_allocated > 0 {
            self.in_use += 1;
            if g.cores_allocated < g.cores && g.memory_mib_allocated < g.memory_mib {
                self.partial += 1;
            }
        }
    }
    fn merge(&mut self, o: &Totals) {
        self.gpus += o.gpus;
        self.in_use += o.in_use;
        self.partial += o.partial;
        self.unhealthy += o.unhealthy;
        self.cap_c += o.cap_c;
        self.cap_m += o.cap_m;
        self.use_c += o.use_c;
        self.use_m += o.use_m;
    }
    fn json(&self) -> Value {
        json!({
            "gpus": self.gpus,
            "gpus_in_use": self.in_use,
            "core_utilization_pct": pct(self.use_c, self.cap_c),
            "memory_utilization_pct": pct(self.use_m, self.cap_m),
            "fragmentation_pct": pct(self.partial, self.in_use),
            "unhealthy_gpus": self.unhealthy,
        })
    }
}

/// One node's view.
#[derive(Debug)]
struct NodeView {
    name: String,
    error: Option<String>,
    gpus: Vec<GpuRow>,
    /// Pods holding GPUs here: (`namespace/name`, `pre-allocated`).
    pods: Vec<(String, String)>,
    totals: Totals,
}

fn gpu_rows(
    inventory: &NodeDeviceInventory,
    usage: &NodeUsage,
    pods: &BTreeMap<u32, Vec<String>>,
) -> Vec<GpuRow> {
    inventory
        .devices
        .iter()
        .map(|g| {
            let u = usage.device(g.index);
            GpuRow {
                index: g.index,
                uuid: g.uuid.clone(),
                type_name: g.type_name.clone(),
                healthy: g.health.is_healthy(),
                mig: g.mig_enabled,
                vgpus: g.split_count,
                cores: g.cores,
                memory_mib: g.memory_mib,
                vgpus_allocated: u.number,
                cores_allocated: u.cores,
                memory_mib_allocated: u.memory_mib,
                pods: pods.get(&g.index).cloned().unwrap_or_default(),
            }
        })
        .collect()
}

/// Every vGPU node of the snapshot, by name.
fn views(snap: &Snapshot) -> Vec<NodeView> {
    let d = &snap.domain;
    let usage: BTreeMap<String, NodeUsage> =
        snap.cache.usage_snapshot().into_iter().map(|(name, _, usage)| (name, usage)).collect();
    let mut out = Vec::new();
    for node in &snap.nodes {
        let mut per_gpu: BTreeMap<u32, Vec<String>> = BTreeMap::new();
        let mut pods: Vec<(String, String)> = Vec::new();
        for pod in snap.cache.pods_on(&node.name) {
            if let Some(claim) = prealloc::planned_claim(&pod, d) {
                let pre = pod.annotations.get(&d.pre_allocated()).cloned().unwrap_or_default();
                pods.push((pod.key(), pre));
                for c in claim.devices() {
                    let list = per_gpu.entry(c.index).or_default();
                    if !list.contains(&pod.key()) {
                        list.push(pod.key());
                    }
                }
            }
        }
        pods.sort();
        per_gpu.values_mut().for_each(|v| v.sort());
        let register =
            node.annotations.get(&d.node_device_register()).map(String::as_str).unwrap_or_default();
        let (gpus, error) = match node_devices::decode(register) {
            Ok(inv) => {
                let u = usage.get(&node.name).cloned().unwrap_or_default();
                (gpu_rows(&inv, &u, &per_gpu), None)
            }
            Err(e) => (Vec::new(), Some(format!("{}: {e}", d.node_device_register()))),
        };
        let mut totals = Totals::default();
        gpus.iter().for_each(|g| totals.add(g));
        out.push(NodeView { name: node.name.clone(), error, gpus, pods, totals });
    }
    out
}

/// The report as JSON.
fn report(snap: &Snapshot, views: &[NodeView]) -> Value {
    let mut all = Totals::default();
    let mut unhealthy = Vec::new();
    let mut held: Vec<(&String, &String, &String)> =
        views.iter().flat_map(|v| v.pods.iter().map(move |(p, pre)| (p, &v.name, pre))).collect();
    held.sort();
    let allocations: Vec<Value> = held
        .into_iter()
        .map(|(pod, node, pre)| json!({ "pod": pod, "node": node, "pre_allocated": pre }))
        .collect();
    let nodes: Vec<Value> = views
        .iter()
        .map(|v| {
            all.merge(&v.totals);
            let gpus: Vec<Value> = v
                .gpus
                .iter()
                .map(|g| {
                    if !g.healthy {
                        unhealthy.push(json!({ "node": v.name, "index": g.index, "uuid": g.uuid }));
                    }
                    json!({
                        "index": g.index,
                        "uuid": g.uuid,
                        "type": g.type_name,
                        "healthy": g.healthy,
                        "mig": g.mig,
                        "vgpus": g.vgpus,
                        "cores": g.cores,
                        "memory_mib": g.memory_mib,
                        "vgpus_allocated": g.vgpus_allocated,
                        "cores_allocated": g.cores_allocated,
                        "memory_mib_allocated": g.memory_mib_allocated,
                        "pods": g.pods,
                    })
                })
                .collect();
            let pods: Vec<&String> = v.pods.iter().map(|p| &p.0).collect();
            let mut n = json!({ "name": v.name, "gpus": gpus, "pods": pods, "summary": v.totals.json() });
            if let Some(e) = &v.error {
                n["error"] = json!(e);
            }
            n
        })
        .collect();
    json!({
        "nodes_listed": snap.total_nodes,
        "pods_listed": snap.total_pods,
        "nodes": nodes,
        "summary": all.json(),
        "unhealthy": unhealthy,
        "allocations": allocations,
    })
}

/// Recursively sorts object keys (stable output whatever serde_json's map order is).
pub fn sorted(v: Value) -> Value {
    match v {
        Value::Object(m) => {
            let sorted: BTreeMap<String, Value> = m.into_iter().map(|(k, v)| (k, sorted(v))).collect();
            Value::Object(sorted.into_iter().collect())
        }
        Value::Array(a) => Value::Array(a.into_iter().map(sorted).collect()),
        other => other,
    }
}

/// The table.
fn table(report: &Value, views: &[NodeView]) -> String {
    let mut rows: Vec<[String; 8]> = vec![[
        "NODE".into(),
        "GPU".into(),
        "TYPE".into(),
        "HEALTH".into(),
        "VGPUS".into(),
        "CORES".into(),
        "MEMORY(MiB)".into(),
        "PODS".into(),
    ]];
    for v in views {
        if let Some(e) = &v.error {
            rows.push([
                v.name.clone(),
                "-".into(),
                "-".into(),
                format!("error: {e}"),
                "".into(),
                "".into(),
                "".into(),
                "".into(),
            ]);
            continue;
        }
        for g in &v.gpus {
            let health = match (g.healthy, g.mig) {
                (false, _) => "unhealthy",
                (true, true) => "mig",
                (true, false) => "healthy",
            };
            rows.push([
                v.name.clone(),
                g.index.to_string(),
                g.type_name.clone(),
                health.into(),
                format!("{}/{}", g.vgpus_allocated, g.vgpus),
                format!("{}/{}", g.cores_allocated, g.cores),
                format!("{}/{}", g.memory_mib_allocated, g.memory_mib),
                if g.pods.is_empty() { "-".into() } else { g.pods.join(",") },
            ]);
        }
    }
    let mut widths = [0usize; 8];
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut s = String::new();
    for r in &rows {
        let line: Vec<String> = r.iter().zip(widths).map(|(c, w)| format!("{c:<w$}")).collect();
        s.push_str(line.join("  ").trim_end());
        s.push('\n');
    }
    let t = &report["summary"];
    s.push_str(&format!(
        "\n{} vGPU nodes ({} listed), {} pods holding vGPUs; {} of {} schedulable GPUs in use, cores {}%, memory {}%, \
         fragmentation {}%, {} unhealthy\n",
        views.len(),
        report["nodes_listed"],
        report["allocations"].as_array().map_or(0, Vec::len),
        t["gpus_in_use"],
        t["gpus"],
        t["core_utilization_pct"],
        t["memory_utilization_pct"],
        t["fragmentation_pct"],
        t["unhealthy_gpus"],
    ));
    for u in report["unhealthy"].as_array().into_iter().flatten() {
        s.push_str(&format!(
            "unhealthy: {} GPU {} ({})\n",
            u["node"].as_str().unwrap_or_default(),
            u["index"],
            u["uuid"].as_str().unwrap_or_default()
        ));
    }
    s
}

/// `vgpuctl cluster`: exit 0, 2 when the cluster cannot be read, 1 when stdout cannot be written.
pub fn run(args: ClusterArgs) -> ExitCode {
    let snap = match Snapshot::load(args.kubeconfig.as_deref()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let views = views(&snap);
    let report = report(&snap, &views);
    let text = if args.json { format!("{:#}\n", sorted(report)) } else { table(&report, &views) };
    crate::output::print(&text, ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::sorted;

    #[test]
    fn keys_are_sorted_at_every_depth_and_arrays_keep_their_order() {
        let v = sorted(json!({"b": [{"z": 1, "a": 2}, 3], "a": {"y": null, "x": true}}));
        assert_eq!(v.to_string(), r#"{"a":{"x":true,"y":null},"b":[{"a":2,"z":1},3]}"#);
    }
}
