#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Heap allocations of one live filter call (issue #35 item 3), counted by `stats_alloc`'s instrumented system
//! allocator: the request body as kube-scheduler sends it (a Deployment's pod as the API server serves it and
//! 100 candidate names) to the answer's bytes, as the HTTP handler runs it (`ExtenderArgs<ApiPod>` decoding,
//! `Extender::filter`, `ExtenderFilterResult::to_json`). The same call decoded with k8s-openapi's `Pod` took
//! 361 allocations before issue #35; the budget is half of that. `benches/decode.rs` prints the same counts
//! next to its timings.
//!
//! One test in this file: the counter is process-wide, and another test running at the same time would count
//! its own allocations too.

use std::alloc::System;

use serde_json::{Value, json};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use vgpu_core::domain::ResourceDomain;
use vgpu_core::model::{NodeDeviceInventory, NodeVgpuConfig};
use vgpu_scheduler::api_pod::ApiPod;
use vgpu_scheduler::fixture::{api_server_pod_json, filter_only_extender, vgpu_node, vgpu_pod};
use vgpu_scheduler::wire::{ExtenderArgs, ExtenderFilterResult};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

const NOW: i64 = 1_700_000_000_000_000_000;
const NODES: usize = 100;
/// Half of the 361 allocations of the same call before issue #35.
const BUDGET: usize = 180;

#[test]
fn one_filter_over_100_nodes_allocates_at_most_half_of_what_it_did() {
    let d = ResourceDomain::default();
    let ann = vec![
        (d.node_scheduler_policy(), "binpack".to_string()),
        (d.device_scheduler_policy(), "binpack".to_string()),
    ];
    let probe = vgpu_pod("probe", 2, 50, 16384, &ann, &d);
    let inventory = NodeDeviceInventory::uniform(8, 81559, 10);
    let names: Vec<String> = (0..NODES).map(|n| format!("node-{n:03}")).collect();
    let nodes = names
        .iter()
        .map(|n| vgpu_node(n, &inventory, &NodeVgpuConfig::default(), None, &d).unwrap())
        .collect();
    let ext = filter_only_extender(nodes, NOW);
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let body =
        serde_json::to_vec(&json!({"Pod": api_server_pod_json(&probe, &d), "NodeNames": names})).unwrap();
    let filter = || {
        let mut args: ExtenderArgs<ApiPod> = serde_json::from_slice(&body).unwrap();
        let names = args.take_candidate_names().unwrap();
        let pod = args.pod.take().map(ApiPod::into_pod);
        let result = rt.block_on(ext.filter(pod.as_ref(), names));
        ExtenderFilterResult::from_result(&args, result).to_json().unwrap()
    };
    let reset = || {
        ext.cache().delete_pod(&probe.uid);
        ext.cluster().upsert_pod(probe.clone());
    };
    // Warm up (lazily built state: the rank table's fitness, the resolve memo's first use).
    for _ in 0..3 {
        reset();
        filter();
    }
    let mut counts = Vec::new();
    for _ in 0..5 {
        reset();
        let region = Region::new(GLOBAL);
        let answer = filter();
        let stats = region.change();
        counts.push(stats.allocations + stats.reallocations);
        // The call did its work: one node chosen, its GPUs reserved, every other candidate refused.
        let answer: Value = serde_json::from_slice(&answer).unwrap();
        assert_eq!(answer["NodeNames"].as_array().map(Vec::len), Some(1), "{answer}");
        assert_eq!(answer["FailedNodes"].as_object().map(|m| m.len()), Some(NODES - 1), "{answer}");
        assert_eq!(answer["Error"], "", "{answer}");
        assert!(ext.cache().reservation(&probe.uid).is_some());
    }
    let least = counts.iter().copied().min().unwrap();
    println!("one filter over {NODES} candidates, body to answer: {counts:?} allocations (budget {BUDGET})");
    assert!(least <= BUDGET, "one filter took {least} allocations, over the budget of {BUDGET}: {counts:?}");
}
