#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Lean decode (issue #35 item 3): the extender's cost of reading a pod as kube-scheduler and the API server
//! send it, with k8s-openapi's whole `Pod` (then `convert::pod_from_k8s`) against
//! [`ApiPod`](vgpu_scheduler::api_pod::ApiPod) (then `into_pod`).
//!
//! `cargo bench -p vgpu-scheduler --bench decode`
//!
//! The pod is what a Deployment's vGPU pod looks like after admission
//! ([`api_server_pod_json`](vgpu_scheduler::fixture::api_server_pod_json)): labels, annotations, an owner, three
//! `managedFields` entries, a projected service-account volume, env, probes, tolerations and a pending status.
//! `tests/alloc_budget.rs` holds the lean filter's allocations to half of the 361 the full one took before
//! issue #35.
//!
//! Printed once before the timed benches (counted by `stats_alloc`'s instrumented system allocator):
//! - `decode`: heap allocations and bytes of one pod body → light [`Pod`](vgpu_scheduler::Pod), each way;
//! - `filter`: heap allocations of one whole filter request over 100 candidate nodes, body to answer bytes,
//!   as the HTTP handler runs it (decode, `Extender::filter`, `ExtenderFilterResult::to_json`), each way.
//!
//! Criterion: `decode/{full,lean}` (one pod body) and `filter_100/{full,lean}` (one filter request).

use std::alloc::System;
use std::hint::black_box;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use serde_json::{Value, json};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use vgpu_core::domain::ResourceDomain;
use vgpu_core::model::{NodeDeviceInventory, NodeVgpuConfig};
use vgpu_scheduler::api_pod::ApiPod;
use vgpu_scheduler::fixture::{api_server_pod_json, filter_only_extender, vgpu_node, vgpu_pod};
use vgpu_scheduler::wire::{ExtenderArgs, ExtenderFilterResult};
use vgpu_scheduler::{Pod, convert};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

const NOW: i64 = 1_700_000_000_000_000_000;
const NODES: usize = 100;

fn full_pod(body: &[u8]) -> Pod {
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_slice(body).unwrap();
    convert::pod_from_k8s(&pod)
}

fn lean_pod(body: &[u8]) -> Pod {
    serde_json::from_slice::<ApiPod>(body).unwrap().into_pod()
}

/// Heap allocations and bytes of one call of `f`.
fn counted<T>(f: impl FnOnce() -> T) -> (usize, usize) {
    let region = Region::new(GLOBAL);
    let out = f();
    let s = region.change();
    drop(out);
    (s.allocations + s.reallocations, s.bytes_allocated)
}

fn bench(c: &mut Criterion) {
    let d = ResourceDomain::default();
    let ann = vec![
        (d.node_scheduler_policy(), "binpack".to_string()),
        (d.device_scheduler_policy(), "binpack".to_string()),
    ];
    let probe = vgpu_pod("probe", 2, 50, 16384, &ann, &d);
    let pod_json = api_server_pod_json(&probe, &d);
    let pod_body = serde_json::to_vec(&pod_json).unwrap();
    assert_eq!(full_pod(&pod_body), lean_pod(&pod_body));

    // The extender over 100 vGPU nodes; the probe fits on each.
    let inventory = NodeDeviceInventory::uniform(8, 81559, 10);
    let names: Vec<String> = (0..NODES).map(|n| format!("node-{n:03}")).collect();
    let nodes = names
        .iter()
        .map(|n| {
            vgpu_node(
                n,
                &inventory.clone().with_uuids(|i| format!("GPU-{n}-{i}")),
                &NodeVgpuConfig::default(),
                None,
                &d,
            )
            .unwrap()
        })
        .collect();
    let ext = filter_only_extender(nodes, NOW);
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let reset = || {
        ext.cache().delete_pod(&probe.uid);
        ext.cluster().upsert_pod(probe.clone());
    };
    let filter_body = serde_json::to_vec(&json!({"Pod": pod_json, "NodeNames": names})).unwrap();
    let filter_full = || {
        let mut args: ExtenderArgs = serde_json::from_slice(&filter_body).unwrap();
        let names = args.take_candidate_names().unwrap();
        let pod = args.pod.as_ref().map(convert::pod_from_k8s);
        let result = rt.block_on(ext.filter(pod.as_ref(), names));
        ExtenderFilterResult::from_result(&args, result).to_json().unwrap()
    };
    let filter_lean = || {
        let mut args: ExtenderArgs<ApiPod> = serde_json::from_slice(&filter_body).unwrap();
        let names = args.take_candidate_names().unwrap();
        let pod = args.pod.take().map(ApiPod::into_pod);
        let result = rt.block_on(ext.filter(pod.as_ref(), names));
        ExtenderFilterResult::from_result(&args, result).to_json().unwrap()
    };
    reset();
    let answer_full = filter_full();
    reset();
    let answer_lean = filter_lean();
    assert_eq!(answer_full, answer_lean);
    let answer: Value = serde_json::from_slice(&answer_lean).unwrap();
    // The extender places the pod on one node (its pre-allocation) and fails the other candidates.
    assert_eq!(answer["NodeNames"].as_array().map(Vec::len), Some(1), "{answer}");
    assert_eq!(answer["FailedNodes"].as_object().map(|m| m.len()), Some(NODES - 1), "{answer}");

    let (full_n, full_b) = counted(|| full_pod(&pod_body));
    let (lean_n, lean_b) = counted(|| lean_pod(&pod_body));
    println!(
        "decode: one {}-byte pod → light Pod: full {full_n} allocations / {full_b} bytes, lean {lean_n} / {lean_b} ({:.2}x fewer allocations)",
        pod_body.len(),
        full_n as f64 / lean_n as f64
    );
    reset();
    let (ffull_n, ffull_b) = counted(filter_full);
    reset();
    let (flean_n, flean_b) = counted(filter_lean);
    println!(
        "filter: one request over {NODES} candidates, body to answer: full {ffull_n} allocations / {ffull_b} bytes, lean {flean_n} / {flean_b} ({:.2}x fewer allocations)",
        ffull_n as f64 / flean_n as f64
    );

    let mut group = c.benchmark_group("decode");
    group.bench_function("full", |b| b.iter(|| black_box(full_pod(black_box(&pod_body)))));
    group.bench_function("lean", |b| b.iter(|| black_box(lean_pod(black_box(&pod_body)))));
    group.finish();

    let mut group = c.benchmark_group(format!("filter_{NODES}"));
    group.bench_function("full", |b| {
        b.iter_batched(reset, |()| black_box(filter_full()), BatchSize::PerIteration)
    });
    group.bench_function("lean", |b| {
        b.iter_batched(reset, |()| black_box(filter_lean()), BatchSize::PerIteration)
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
