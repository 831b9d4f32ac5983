//! `vgpuctl pod NAMESPACE/NAME`: where a pod runs and on which GPUs, or why it is pending. Read-only.
//!
//! The cluster is read through the shared [`Snapshot`]; the pod's events are listed from its namespace
//! (`GET /api/v1/namespaces/<ns>/events?fieldSelector=involvedObject.name=<name>`, RBAC `list` on `events`).
//! The extender records `FilteringFailed` (with the `0/N nodes are available: <reason> (<nodes>)` summary),
//! `FilteringSucceed`, `TopologyFallback` and `BindingFailed`; kube-scheduler records `FailedScheduling`.
//!
//! For a pod not bound yet, the extender's side-effect-free dry-run filter (the placement code of the live
//! filter: same cache, same reason codes, detailed text) runs locally over every vGPU node of the snapshot.
//! For a bound pod (or one holding a pre-allocation), its GPUs come from `pre-allocated` (else
//! `real-allocated`).
//!
//! JSON (`--json`) fields (keys sorted; nodes by name; events by time):
//!
//! | field | meaning |
//! |---|---|
//! | `pod`, `uid`, `phase`, `node` | the pod; `node` is `spec.nodeName` or `null` |
//! | `status` | `bound`, or `pending` |
//! | `allocation` | `null`, or `{node, pre_allocated, real_allocated, containers: [{name, devices: [{index, uuid, cores, memory_mib}]}]}` |
//! | `events[]` | `{time, type, reason, source, count, message}` of the pod, `time` in whole seconds (UTC) |
//! | `placement` | pending pods: `{error, summary, fits: [node], nodes: [{node, fits, code, reason}]}` (`code` is the contract's reason code), else `null` |

use std::path::PathBuf;
use std::process::ExitCode;

use k8s_openapi::api::core::v1::Event as KubeEvent;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::ListParams;
use serde_json::{Value, json};
use vgpu_core::alloc::{ReasonCode, render_unavailable};
use vgpu_scheduler::{Pod, prealloc};

use crate::snapshot::Snapshot;

/// Arguments of `vgpuctl pod`.
#[derive(Debug, clap::Args)]
pub struct PodArgs {
    /// The pod, `NAMESPACE/NAME`.
    #[arg(value_name = "NAMESPACE/NAME", value_parser = parse_pod_ref)]
    pub pod: (String, String),
    /// Kubeconfig (default: in-cluster config, $KUBECONFIG or ~/.kube/config).
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// Print JSON (stable: sorted keys and rows).
    #[arg(long)]
    pub json: bool,
}

/// `NAMESPACE/NAME` → (namespace, name).
pub fn parse_pod_ref(s: &str) -> Result<(String, String), String> {
    match s.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok((ns.to_owned(), name.to_owned()))
        }
        _ => Err(format!("expected NAMESPACE/NAME, got {s:?}")),
    }
}

/// The pod's events, oldest first.
fn events(snap: &Snapshot, pod: &Pod) -> Result<Vec<Value>, String> {
    let api: Api<KubeEvent> = Api::namespaced(snap.client.clone(), &pod.namespace);
    let lp = ListParams::default().fields(&format!("involvedObject.name={}", pod.name));
    let list =
        snap.rt.block_on(api.list(&lp)).map_err(|e| format!("listing the events of {}: {e}", pod.key()))?;
    let mut rows: Vec<(Option<Timestamp>, String, Value)> = list
        .items
        .into_iter()
        .filter(|e| e.involved_object.kind.as_deref().is_none_or(|k| k == "Pod"))
        .filter(|e| e.involved_object.uid.as_deref().is_none_or(|u| u.is_empty() || u == pod.uid))
        .map(|e| {
            // Core events carry lastTimestamp; those written through events.k8s.io (kube-scheduler's) eventTime.
            let at = e
                .last_timestamp
                .as_ref()
                .map(|t| t.0)
                .or_else(|| e.event_time.as_ref().map(|t| t.0))
                .or_else(|| e.first_timestamp.as_ref().map(|t| t.0));
            // Whole seconds: the two kinds have different precisions.
            let time = at
                .and_then(|t| Timestamp::from_second(t.as_second()).ok())
                .map(|t| t.to_string())
                .unwrap_or_default();
            let source = e
                .source
                .as_ref()
                .and_then(|s| s.component.clone())
                .or_else(|| e.reporting_component.clone())
                .unwrap_or_default();
            let name = e.metadata.name.clone().unwrap_or_default();
            let row = json!({
                "time": time,
                "type": e.type_.clone().unwrap_or_default(),
                "reason": e.reason.clone().unwrap_or_default(),
                "source": source,
                "count": e.count.or_else(|| e.series.as_ref().and_then(|s| s.count)).unwrap_or(1),
                "message": e.message.clone().unwrap_or_default(),
            });
            (at, name, row)
        })
        .collect();
    rows.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
    Ok(rows.into_iter().map(|r| r.2).collect())
}

/// The pod's GPUs from its annotations, when it holds a claim.
fn allocation(snap: &Snapshot, pod: &Pod) -> Value {
    let d = &snap.domain;
    let Some(claim) = prealloc::planned_claim(pod, d) else { return Value::Null };
    let containers: Vec<Value> = claim
        .containers
        .iter()
        .map(|c| {
            let devices: Vec<Value> = c
                .devices
                .iter()
                .map(|g| json!({ "index": g.index, "uuid": g.uuid, "cores": g.cores, "memory_mib": g.memory_mib }))
                .collect();
            json!({ "name": c.name, "devices": devices })
        })
        .collect();
    json!({
        "node": prealloc::planned_node(pod, d),
        "pre_allocated": pod.annotations.get(&d.pre_allocated()),
        "real_allocated": pod.annotations.get(&d.real_allocated()),
        "containers": containers,
    })
}

/// The dry-run filter over every vGPU node.
fn placement(snap: &Snapshot, pod: &Pod) -> Value {
    let r = snap.ext.filter_dry_run(Some(pod), snap.candidates.clone());
    let mut nodes: Vec<(String, Value)> = r
        .passed()
        .map(|n| {
            (n.to_owned(), json!({ "node": n, "fits": true, "code": Value::Null, "reason": Value::Null }))
        })
        .collect();
    nodes.extend(r.failed_nodes().map(|f| {
        (
            f.node.to_owned(),
            json!({ "node": f.node, "fits": false, "code": f.code.as_str(), "reason": f.reason }),
        )
    }));
    nodes.sort_by(|a, b| a.0.cmp(&b.0));
    let summary = if r.passed().len() == 0 && r.error.is_empty() {
        let failed: Vec<(&str, ReasonCode)> = r.failed_nodes().map(|f| (f.node, f.code)).collect();
        render_unavailable(snap.candidates.len(), failed)
    } else if r.error.is_empty() {
        format!("{}/{} nodes fit", r.passed().len(), snap.candidates.len())
    } else {
        String::new()
    };
    let mut fits: Vec<String> = r.passed().map(str::to_owned).collect();
    fits.sort();
    json!({
        "error": r.error,
        "summary": summary,
        "fits": fits,
        "nodes": nodes.into_iter().map(|n| n.1).collect::<Vec<_>>(),
    })
}

fn report(snap: &Snapshot, pod: &Pod) -> Result<Value, String> {
    let bound = pod.node_name.as_deref().is_some_and(|n| !n.is_empty());
    Ok(json!({
        "pod": pod.key(),
        "uid": pod.uid,
        "phase": format!("{:?}", pod.phase),
        "node": pod.node_name.as_deref().filter(|n| !n.is_empty()),
        "status": if bound { "bound" } else { "pending" },
        "allocation": allocation(snap, pod),
        "events": events(snap, pod)?,
        "placement": if bound { Value::Null } else { placement(snap, pod) },
    }))
}

fn text(r: &Value) -> String {
    let s = |v: &Value| v.as_str().map(str::to_owned).unwrap_or_else(|| v.to_string());
    let mut out = format!("Pod {} ({}): {}", s(&r["pod"]), s(&r["phase"]), s(&r["status"]));
    if let Some(n) = r["node"].as_str() {
        out.push_str(&format!(" on {n}"));
    }
    out.push('\n');
    if r["allocation"].is_object() {
        out.push_str(&format!("GPUs (planned on {}):\n", s(&r["allocation"]["node"])));
        for c in r["allocation"]["containers"].as_array().into_iter().flatten() {
            for g in c["devices"].as_array().into_iter().flatten() {
                out.push_str(&format!(
                    "  {:<16} GPU {} {}  cores {}  memory {} MiB\n",
                    s(&c["name"]),
                    g["index"],
                    s(&g["uuid"]),
                    g["cores"],
                    g["memory_mib"]
                ));
            }
        }
    }
    if r["placement"].is_object() {
        let p = &r["placement"];
        if let Some(e) = p["error"].as_str().filter(|e| !e.is_empty()) {
            out.push_str(&format!("Placement (local dry-run): error: {e}\n"));
        } else {
            out.push_str(&format!("Placement (local dry-run): {}\n", s(&p["summary"])));
            for n in p["nodes"].as_array().into_iter().flatten() {
                if n["fits"].as_bool() == Some(true) {
                    out.push_str(&format!("  {:<24} fits\n", s(&n["node"])));
                } else {
                    out.push_str(&format!(
                        "  {:<24} {}: {}\n",
                        s(&n["node"]),
                        s(&n["code"]),
                        s(&n["reason"])
                    ));
                }
            }
        }
    }
    let events = r["events"].as_array().map(Vec::as_slice).unwrap_or_default();
    if events.is_empty() {
        out.push_str("Events: none\n");
    } else {
        out.push_str("Events:\n");
        for e in events {
            out.push_str(&format!(
                "  {}  {:<7} {:<18} {:<16} x{}  {}\n",
                s(&e["time"]),
                s(&e["type"]),
                s(&e["reason"]),
                s(&e["source"]),
                e["count"],
                s(&e["message"])
            ));
        }
    }
    out
}

/// `vgpuctl pod`: exit 0, 2 when the cluster cannot be read or the pod does not exist, 1 when stdout cannot
/// be written.
pub fn run(args: PodArgs) -> ExitCode {
    let (ns, name) = &args.pod;
    let result = Snapshot::load(args.kubeconfig.as_deref()).and_then(|snap| {
        let pod =
            snap.cluster.pod(ns, name).ok_or_else(|| format!("pod {ns}/{name} not found in the cluster"))?;
        report(&snap, &pod)
    });
    match result {
        Ok(r) => {
            let text = if args.json { format!("{:#}\n", crate::cluster::sorted(r)) } else { text(&r) };
            crate::output::print(&text, ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use proptest::prelude::*;

    use super::parse_pod_ref;

    proptest! {
        #[test]
        fn namespace_and_name_round_trip(ns in "[a-z0-9][a-z0-9.-]{0,20}", name in "[^/]{1,30}") {
            prop_assert_eq!(parse_pod_ref(&format!("{ns}/{name}")).unwrap(), (ns, name));
        }

        #[test]
        fn anything_else_is_refused_with_the_expected_form(s in ".{0,40}") {
            let ok = matches!(s.split_once('/'), Some((a, b)) if !a.is_empty() && !b.is_empty() && !b.contains('/'));
            match parse_pod_ref(&s) {
                Ok((a, b)) => prop_assert!(ok && [a, b].join("/") == s),
                Err(e) => prop_assert!(!ok && e.contains("expected NAMESPACE/NAME"), "{}", e),
            }
        }
    }
}
