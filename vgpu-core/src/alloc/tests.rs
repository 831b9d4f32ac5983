//! Unit and golden tests of the allocator, written from the contract text.

use super::*;
use crate::codec::pod_devices;
use crate::domain::ResourceDomain;
use crate::model::{
    DeviceHealth, GpuDevice, MemoryPolicy, NodeDeviceInventory, NodeVgpuConfig, SchedulingPolicy,
};

fn dom() -> ResourceDomain {
    ResourceDomain::default()
}

fn gpu(i: u32, mem: u64, numa: Option<u32>) -> GpuDevice {
    GpuDevice {
        index: i,
        uuid: format!("GPU-{i}"),
        type_name: "NVIDIA A100".into(),
        memory_mib: mem,
        cores: 100,
        split_count: 4,
        numa_node: numa,
        ..Default::default()
    }
}

struct Fix {
    inv: NodeDeviceInventory,
    cfg: NodeVgpuConfig,
    usage: NodeUsage,
    links: Option<NodeLinks>,
}

impl Fix {
    fn new(devices: Vec<GpuDevice>) -> Self {
        Self {
            inv: NodeDeviceInventory::new(devices),
            cfg: NodeVgpuConfig::default(),
            usage: NodeUsage::new(),
            links: None,
        }
    }
    fn uniform(n: u32) -> Self {
        Self::new((0..n).map(|i| gpu(i, 16384, Some(i / 2))).collect())
    }
    fn view(&self) -> NodeView<'_> {
        NodeView {
            name: "node",
            inventory: &self.inv,
            config: &self.cfg,
            links: self.links.as_ref(),
            usage: &self.usage,
        }
    }
    fn busy(&mut self, key: &str, claim: &str) {
        let c = pod_devices::decode_pre_allocated(claim).unwrap();
        self.usage.insert_pod(key, PodFootprint::from_claim(&c));
    }
}

fn ctr(c: PodContainer, n: u64, cores: u64, mem: u64) -> PodContainer {
    let d = dom();
    c.limit(d.vgpu_number(), n).limit(d.vgpu_cores(), cores).limit(d.vgpu_memory(), mem)
}

fn req(ann: &[(&str, &str)], ctrs: Vec<PodContainer>) -> PodRequest {
    let mut p = PodSpec::new();
    for (k, v) in ann {
        p = p.annotation(dom().key(k), *v);
    }
    for c in ctrs {
        p = p.container(c);
    }
    PodRequest::from_pod(&p, &dom()).unwrap()
}

fn run(r: &PodRequest, f: &Fix) -> Result<String, NodeFailure> {
    allocate(r, &f.view()).map(|a| pod_devices::encode(&a.claim).unwrap())
}

fn code(r: &PodRequest, f: &Fix) -> ReasonCode {
    allocate(r, &f.view()).unwrap_err().code
}

fn topo(json: &str) -> NodeLinks {
    NodeLinks::decode(json).unwrap()
}

const RTX8000: &str = r#"[{"index":0,"links":{"1":[2],"2":[1],"3":[8]}},{"index":1,"links":{"0":[2],"2":[8],"3":[1]}},
    {"index":2,"links":{"0":[1],"1":[8],"3":[2]}},{"index":3,"links":{"0":[8],"1":[1],"2":[2]}}]"#;

// === request model (§4.1) ===

#[test]
fn request_order_totals_and_maxima() {
    let r = req(
        &[],
        vec![
            ctr(PodContainer::app("app1"), 1, 30, 1000),
            ctr(PodContainer::init("init1"), 2, 50, 0),
            PodContainer::app("cpu-only"),
            ctr(PodContainer::sidecar("side"), 1, 20, 500),
            ctr(PodContainer::app("app2"), 2, 10, 2000),
            ctr(PodContainer::init("init2"), 1, 0, 3000),
        ],
    );
    let names: Vec<&str> = r.containers.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["init1", "side", "init2", "app1", "app2"]);
    assert!(r.has_sequential_init());
    let cfg = NodeVgpuConfig { memory_factor: 2, ..Default::default() };
    let inv = NodeDeviceInventory::new(vec![gpu(0, 16384, None), gpu(1, 16384, None)]);
    let res = r.resolve(&inv, &cfg);
    // init1: whole memory resolved to the uniform card size; cores 50.
    assert_eq!(res.containers[0].memory_mib, 16384);
    assert_eq!(res.containers[2].memory_mib, 6000);
    assert_eq!(res.containers[2].cores, 0);
    // sidecar (1, 20, 1000) + max(regular (3, 50, 10000), init max (2, 100, 32768)).
    assert_eq!(res.total, Footprint { number: 4, cores: 120, memory_mib: 33768 });
    assert_eq!(res.max, Footprint { number: 2, cores: 50, memory_mib: 16384 });
    // Heterogeneous cards: whole-card memory stays 0 (resolved per card).
    let inv = NodeDeviceInventory::new(vec![gpu(0, 16384, None), gpu(1, 8192, None)]);
    assert_eq!(r.resolve(&inv, &cfg).containers[0].memory_mib, 0);
}

#[test]
fn whole_card_defaults() {
    let r = req(&[], vec![ctr(PodContainer::app("m"), 2, 0, 0)]);
    let f = Fix::uniform(2);
    assert_eq!(run(&r, &f).unwrap(), "m[0_GPU-0_100_16384,1_GPU-1_100_16384]");
    let r = req(&[], vec![PodContainer::app("m").limit(dom().vgpu_number(), 1)]);
    let f = Fix::new(vec![gpu(0, 8192, None), gpu(1, 4096, None)]);
    assert_eq!(run(&r, &f).unwrap(), "m[0_GPU-0_100_8192]");
}

#[test]
fn request_profile_examples() {
    let p = |n, c, m| req(&[], vec![ctr(PodContainer::app("m"), n, c, m)]).profile;
    let close = |p: RequestProfile, e: (f64, f64, f64)| {
        assert!(
            (p.number - e.0).abs() < 1e-9 && (p.memory - e.1).abs() < 1e-9 && (p.cores - e.2).abs() < 1e-9,
            "{p:?}"
        );
    };
    close(p(1, 0, 0), (1.0 / 3.0, 1.0 / 3.0, 1.0 / 3.0));
    close(p(1, 50, 0), (0.4, 0.4, 0.2));
    close(p(1, 0, 4096), (0.2, 0.8, 0.0));
    close(p(1, 50, 4096), (1.0 / 5.5, 4.0 / 5.5, 0.5 / 5.5));
    assert_eq!(RequestProfile::from_total(Footprint::default()), RequestProfile::UNIFORM);
}

#[test]
fn request_errors() {
    let build = |c: PodContainer| PodRequest::from_pod(&PodSpec::new().container(c), &dom());
    let e = build(ctr(PodContainer::app("m"), 17, 0, 0)).unwrap_err();
    assert_eq!(e.to_string(), "container m requests vGPU number exceeding limit (17 > 16)");
    let e = build(ctr(PodContainer::app("m"), 1, 101, 0)).unwrap_err();
    assert!(matches!(e, RequestBuildError::Invalid(_)));
    let e = build(PodContainer::app("m").limit(dom().vgpu_number(), "1.5")).unwrap_err();
    assert!(matches!(e, RequestBuildError::Quantity { .. }), "{e}");
    assert!(build(PodContainer::app("m")).unwrap().is_empty());
}

#[test]
fn policy_annotations() {
    let r = req(
        &[
            ("node-scheduler-policy", "Spread"),
            ("device-scheduler-policy", "bogus"),
            ("device-topology-mode", "numa-strict"),
            ("memory-scheduler-policy", "virtualized"),
            ("vgpu-compute-policy", "balance"),
            ("cross-pod-topology", "TRUE"),
            ("include-gpu-type", "a100"),
        ],
        vec![ctr(PodContainer::app("m"), 1, 0, 0)],
    );
    assert_eq!(r.node_policy, SchedulingPolicy::Spread);
    assert_eq!(r.device_policy, SchedulingPolicy::None);
    assert_eq!(r.invalid_policies.len(), 1);
    assert_eq!(r.topology, crate::model::TopologyMode::NumaStrict);
    assert_eq!(r.memory_policy, Some(MemoryPolicy::Virtual));
    assert_eq!(
        r.effective_compute_policy(Some(crate::model::ComputePolicy::None)),
        crate::model::ComputePolicy::Balance
    );
    assert!(r.cross_pod_topology);
    assert!(!r.filter.is_unset());
    let plain = req(&[("device-topology-mode", "weird")], vec![]);
    assert_eq!(plain.topology, crate::model::TopologyMode::None);
    assert_eq!(plain.effective_compute_policy(None), crate::model::ComputePolicy::Fixed);
}

// === reason codes (§3.1) ===

#[test]
fn node_stage_reasons() {
    let r = req(&[("memory-scheduler-policy", "virtual")], vec![ctr(PodContainer::app("m"), 1, 0, 0)]);
    let mut f = Fix::uniform(1);
    assert_eq!(code(&r, &f), ReasonCode::NodeMemoryTypeMismatch);
    f.cfg.memory_factor = 0;
    assert_eq!(code(&r, &f), ReasonCode::NodeBadMemoryFactor);
    f.cfg.device_split = 0;
    assert_eq!(code(&r, &f), ReasonCode::NodeBadVgpuConfig);
    let reg = r#"[{"id":0,"type":"T4","uuid":"GPU-a","core":100,"memory":15360,"number":10,"numa":0,"mig":false,"busId":"0000:01:00.0","capability":7.5,"healthy":true}]"#;
    let cfg = r#"{"deviceSplit":10,"coresScaling":1,"memoryFactor":1,"memoryScaling":1}"#;
    assert!(decode_node(Some(reg), Some(cfg)).is_ok());
    assert_eq!(decode_node(None, Some(cfg)).unwrap_err().code, ReasonCode::NodeNoVgpuRegister);
    assert_eq!(decode_node(Some("[x"), Some(cfg)).unwrap_err().code, ReasonCode::NodeBadVgpuRegister);
    assert_eq!(decode_node(Some(reg), None).unwrap_err().code, ReasonCode::NodeNoVgpuConfig);
    assert_eq!(decode_node(Some(reg), Some("{")).unwrap_err().code, ReasonCode::NodeBadVgpuConfig);
}

#[test]
fn structural_gates() {
    let f = Fix::uniform(2);
    assert_eq!(
        code(&req(&[], vec![ctr(PodContainer::app("m"), 3, 0, 0)]), &f),
        ReasonCode::InsufficientGpuCards
    );
    assert_eq!(
        code(&req(&[], vec![ctr(PodContainer::app("m"), 1, 0, 20000)]), &f),
        ReasonCode::InsufficientVgpuMemory
    );
    let mut f2 = Fix::uniform(2);
    f2.busy("x", "a[0_GPU-0_60_0,1_GPU-1_60_0]");
    let two = vec![ctr(PodContainer::app("a"), 1, 50, 0), ctr(PodContainer::app("b"), 1, 50, 0)];
    assert_eq!(code(&req(&[], two), &f2), ReasonCode::InsufficientVgpuCore);
    let mut f3 = Fix::uniform(1);
    f3.busy("x", "a[0_GPU-0_0_100];b[0_GPU-0_0_100];c[0_GPU-0_0_100];d[0_GPU-0_0_100]");
    assert_eq!(
        code(&req(&[], vec![ctr(PodContainer::app("m"), 1, 10, 0)]), &f3),
        ReasonCode::InsufficientVgpuSlot
    );
    let m = || vec![ctr(PodContainer::app("m"), 2, 10, 0)];
    assert_eq!(code(&req(&[("include-gpu-uuid", "gpu-1")], m()), &f), ReasonCode::DeviceUuidMismatch);
    assert_eq!(code(&req(&[("exclude-gpu-type", "a100")], m()), &f), ReasonCode::DeviceTypeMismatch);
}

/// Per-GPU reasons from the filter, reached through `place` (past the node-level gates).
#[test]
fn filter_reasons_each() {
    let mut devices = vec![gpu(0, 16384, None), gpu(1, 16384, None), gpu(2, 16384, None)];
    devices[1].health = DeviceHealth::Unhealthy;
    devices[2].mig_enabled = true;
    let check = |f: &Fix, r: &PodRequest, want: ReasonCode| {
        let res = r.resolve(&f.inv, &f.cfg);
        let e = place(r, &res, &f.view()).unwrap_err();
        assert_eq!(e.code, want, "{e}");
    };
    let one = |c, m| req(&[], vec![ctr(PodContainer::app("m"), 1, c, m)]);
    // A full healthy card beside two unhealthy (or MIG) ones: the dominant count names the bad cards.
    let full = "a[0_GPU-0_0_0];b[0_GPU-0_0_0];c[0_GPU-0_0_0];d[0_GPU-0_0_0]";
    let mut f = Fix::new(vec![devices[0].clone(), devices[1].clone(), devices[1].clone()]);
    f.busy("x", full);
    check(&f, &one(10, 10), ReasonCode::DeviceUnhealthy);
    f = Fix::new(vec![devices[0].clone(), devices[2].clone(), devices[2].clone()]);
    f.busy("x", full);
    check(&f, &one(10, 10), ReasonCode::DeviceMigEnabled);
    f = Fix::new(vec![devices[0].clone()]);
    f.busy("x", "a[0_GPU-0_0_0];b[0_GPU-0_0_0];c[0_GPU-0_0_0];d[0_GPU-0_0_0]");
    check(&f, &one(10, 10), ReasonCode::InsufficientVgpuSlot);
    f = Fix::new(vec![devices[0].clone()]);
    f.busy("x", "a[0_GPU-0_0_16000]");
    check(&f, &one(10, 1000), ReasonCode::InsufficientVgpuMemory);
    f = Fix::new(vec![devices[0].clone()]);
    f.busy("x", "a[0_GPU-0_95_0]");
    check(&f, &one(10, 10), ReasonCode::InsufficientVgpuCore);
    f = Fix::new(vec![devices[0].clone()]);
    f.busy("x", "a[0_GPU-0_100_0]");
    check(&f, &req(&[], vec![ctr(PodContainer::app("m"), 1, 0, 10)]), ReasonCode::InsufficientVgpuCore);
    f = Fix::new(vec![devices[0].clone()]);
    check(
        &f,
        &req(&[("include-gpu-type", "h100")], vec![ctr(PodContainer::app("m"), 1, 1, 1)]),
        ReasonCode::DeviceTypeMismatch,
    );
    check(
        &f,
        &req(&[("exclude-gpu-uuid", "gpu-0")], vec![ctr(PodContainer::app("m"), 1, 1, 1)]),
        ReasonCode::DeviceUuidMismatch,
    );
    // Whole-card memory needs an untouched card.
    f.busy("y", "a[0_GPU-0_10_1]");
    check(&f, &req(&[], vec![ctr(PodContainer::app("m"), 1, 10, 0)]), ReasonCode::InsufficientVgpuMemory);
    // Dominant count wins and the counts are kept.
    let f = Fix::new(devices.clone());
    let r = req(&[], vec![ctr(PodContainer::app("m"), 2, 10, 10)]);
    let e = place(&r, &r.resolve(&f.inv, &f.cfg), &f.view()).unwrap_err();
    assert_eq!(e.code, ReasonCode::InsufficientGpuCards);
    let f = Fix::new(vec![devices[0].clone(), devices[1].clone(), devices[1].clone(), gpu(3, 16384, None)]);
    let e = place(&r, &r.resolve(&f.inv, &f.cfg), &f.view());
    assert!(e.is_ok());
}

#[test]
fn scheduler_level_phrases() {
    for (c, p) in [
        (ReasonCode::NodeNotVgpuEnabled, "node not vGPU-enabled"),
        (ReasonCode::NodeCacheMiss, "node missing from cache"),
        (ReasonCode::NodeInfoBuildFailed, "node info build failed"),
        (ReasonCode::AlreadyScheduledElsewhere, "pod already scheduled to another node"),
        (ReasonCode::AllocatorInternalError, "allocator internal error"),
        (ReasonCode::InsufficientGpuResources, "Insufficient GPU resources"),
    ] {
        assert_eq!(c.phrase(), p);
    }
}

// === device policy ordering (§4.2) ===

#[test]
fn device_policies() {
    let mut f = Fix::new(vec![
        gpu(0, 16384, Some(1)),
        gpu(1, 16384, Some(0)),
        gpu(2, 16384, None),
        gpu(3, 16384, Some(0)),
    ]);
    f.busy("x", "a[1_GPU-1_50_8192]");
    f.busy("y", "a[3_GPU-3_10_1024]");
    let one =
        |p: &str| req(&[("device-scheduler-policy", p)], vec![ctr(PodContainer::app("m"), 1, 10, 1024)]);
    assert_eq!(run(&one("binpack"), &f).unwrap(), "m[1_GPU-1_10_1024]");
    assert_eq!(run(&one("spread"), &f).unwrap(), "m[0_GPU-0_10_1024]");
    // none: NUMA ascending, unknown NUMA last, then index.
    assert_eq!(run(&one("none"), &f).unwrap(), "m[1_GPU-1_10_1024]");
    let three = req(&[], vec![ctr(PodContainer::app("m"), 4, 10, 1024)]);
    assert_eq!(
        run(&three, &f).unwrap(),
        "m[0_GPU-0_10_1024,1_GPU-1_10_1024,2_GPU-2_10_1024,3_GPU-3_10_1024]"
    );
}

// === NUMA (§4.2) ===

#[test]
fn numa_modes() {
    // NUMA 0: GPUs 0,1; NUMA 1: GPUs 2,3; GPU 4 unknown.
    let mut f = Fix::new(vec![
        gpu(0, 16384, Some(0)),
        gpu(1, 16384, Some(0)),
        gpu(2, 16384, Some(1)),
        gpu(3, 16384, Some(1)),
        gpu(4, 16384, None),
    ]);
    f.busy("x", "a[2_GPU-2_50_4096]");
    let two = |mode: &str, pol: &str| {
        req(
            &[("device-topology-mode", mode), ("device-scheduler-policy", pol)],
            vec![ctr(PodContainer::app("m"), 2, 10, 1024)],
        )
    };
    assert_eq!(run(&two("numa", "binpack"), &f).unwrap(), "m[2_GPU-2_10_1024,3_GPU-3_10_1024]");
    assert_eq!(run(&two("numa", "spread"), &f).unwrap(), "m[0_GPU-0_10_1024,1_GPU-1_10_1024]");
    assert_eq!(run(&two("numa", "none"), &f).unwrap(), "m[0_GPU-0_10_1024,1_GPU-1_10_1024]");
    let three =
        |mode: &str| req(&[("device-topology-mode", mode)], vec![ctr(PodContainer::app("m"), 3, 10, 1024)]);
    let e = allocate(&three("numa-strict"), &f.view()).unwrap_err();
    assert_eq!(e.code, ReasonCode::NumaTopologyUnsatisfied);
    assert_eq!(e.detail.as_deref(), Some("no NUMA node has 3 GPUs (max single-NUMA capacity 2)"));
    let ok = allocate(&three("numa"), &f.view()).unwrap();
    assert_eq!(ok.notices.len(), 1);
    assert!(ok.notices[0].message.contains("falling back to cross-NUMA allocation"));
    // 1-GPU numa-strict needs a NUMA-known GPU.
    let g = Fix::new(vec![gpu(0, 16384, None)]);
    let one = req(&[("device-topology-mode", "numa-strict")], vec![ctr(PodContainer::app("m"), 1, 10, 1024)]);
    let e = allocate(&one, &g.view()).unwrap_err();
    assert_eq!(e.detail.as_deref(), Some("node has no NUMA topology"));
}

// === link (§4.3) ===

fn link_req(mode: &str, pol: &str, n: u64) -> PodRequest {
    req(
        &[("device-topology-mode", mode), ("device-scheduler-policy", pol)],
        vec![ctr(PodContainer::app("m"), n, 10, 1024)],
    )
}

fn indices(a: &PodAllocation) -> Vec<u32> {
    a.claim.devices().map(|d| d.index).collect()
}

#[test]
fn link_rtx8000() {
    let mut f = Fix::uniform(4);
    f.links = Some(topo(RTX8000));
    let got = allocate(&link_req("link-strict", "none", 2), &f.view()).unwrap();
    assert_eq!(indices(&got), [0, 3]);
    assert!(got.notices.is_empty());
    let e = allocate(&link_req("link-strict", "none", 3), &f.view()).unwrap_err();
    assert_eq!(e.code, ReasonCode::LinkTopologyUnsatisfied);
    assert_eq!(e.detail.as_deref(), Some("no NVLink-connected set of 3 GPUs (largest NVLink component 2)"));
    let got = allocate(&link_req("link", "none", 3), &f.view()).unwrap();
    assert_eq!(got.notices.len(), 1, "{got:?}");
    assert!(got.notices[0].message.contains("not NVLink"));
    // Busy card 0: binpack prefers the NVLink pair with the used card only if it still fits; 1-2 otherwise.
    f.busy("x", "a[0_GPU-0_10_1024]");
    assert_eq!(indices(&allocate(&link_req("link-strict", "binpack", 2), &f.view()).unwrap()), [0, 3]);
    assert_eq!(indices(&allocate(&link_req("link-strict", "spread", 2), &f.view()).unwrap()), [1, 2]);
}

#[test]
fn link_dgx1_volta_and_no_topology() {
    let mut f = Fix::uniform(8);
    f.links = Some(topo(include_str!("../../tests/fixtures/topology/dgx1-volta.json")));
    let got = allocate(&link_req("link-strict", "none", 4), &f.view()).unwrap();
    assert_eq!(indices(&got), [0, 1, 2, 3]);
    for n in [2, 4, 8] {
        assert!(allocate(&link_req("link-strict", "none", n), &f.view()).is_ok());
    }
    let got = allocate(&link_req("link", "none", 2), &f.view()).unwrap();
    let ids = indices(&got);
    let l = f.links.as_ref().unwrap();
    assert!(l.strongest(ids[0], ids[1]) >= 8, "expected an NV2 pair, got {ids:?}");
    // No topology: strict rejects (even one GPU), non-strict places.
    let g = Fix::uniform(2);
    for n in [1, 2] {
        let e = allocate(&link_req("link-strict", "none", n), &g.view()).unwrap_err();
        assert_eq!(e.detail.as_deref(), Some("node has no GPU link topology"));
        assert!(allocate(&link_req("link", "none", n), &g.view()).is_ok());
    }
}

/// A fabric of `n` GPUs where every pair is joined by one link of `code(i, j)`.
fn fabric(n: u32, code: impl Fn(u32, u32) -> u8) -> NodeLinks {
    let gpus: Vec<String> = (0..n)
        .map(|i| {
            let links: Vec<String> =
                (0..n).filter(|&j| j != i).map(|j| format!(r#""{j}":[{}]"#, code(i, j))).collect();
            format!(r#"{{"index":{i},"links":{{{}}}}}"#, links.join(","))
        })
        .collect();
    topo(&format!("[{}]", gpus.join(",")))
}

/// A fabric where every pair of `n` GPUs has one NVLink (`NV1`, code 7).
fn full_nvlink(n: u32) -> NodeLinks {
    fabric(n, |_, _| 7)
}

#[test]
fn link_subset_searches_are_recorded_with_their_algorithm() {
    // One run of 8 equal GPUs, need 3: C(8,3) = 56 subsets, searched exhaustively.
    let mut f = Fix::uniform(8);
    f.links = Some(full_nvlink(8));
    let (got, searches) = record_link_searches(|| allocate(&link_req("link", "none", 3), &f.view()));
    assert_eq!(indices(&got.unwrap()), [0, 1, 2]);
    assert_eq!(searches, [LinkSearch { algo: LinkSearchAlgo::Exhaustive, candidates: 8 }]);
    // 32 GPUs, need 16: C(32,16) is far above MAX_COMBINATIONS, so greedy.
    let mut big = Fix::uniform(32);
    big.links = Some(full_nvlink(32));
    let (got, searches) = record_link_searches(|| allocate(&link_req("link", "none", 16), &big.view()));
    assert_eq!(indices(&got.unwrap()).len(), 16);
    assert_eq!(searches, [LinkSearch { algo: LinkSearchAlgo::Greedy, candidates: 32 }]);
    // Needing the whole run is no search; neither is a placement outside a recorder.
    let (_, searches) = record_link_searches(|| allocate(&link_req("link", "none", 8), &f.view()));
    assert!(searches.is_empty());
}

#[test]
fn link_single_gpu_needs_nvlink_peer() {
    let mut f = Fix::uniform(3);
    f.links =
        Some(topo(r#"[{"index":0,"links":{"1":[7]}},{"index":1,"links":{"0":[7]}},{"index":2,"links":{}}]"#));
    // GPU 2 has no peer; strict picks 0 even under spread once 0 and 1 are busy and 2 is free.
    f.busy("x", "a[0_GPU-0_50_8192,1_GPU-1_50_8192]");
    let got = allocate(&link_req("link-strict", "spread", 1), &f.view()).unwrap();
    assert_eq!(indices(&got), [0]);
    f.busy("y", "a[0_GPU-0_50_8000,1_GPU-1_50_8000]");
    let e = allocate(&link_req("link-strict", "spread", 1), &f.view()).unwrap_err();
    assert_eq!(e.code, ReasonCode::LinkTopologyUnsatisfied);
}

#[test]
fn link_policy_adherence_on_uniform_fabric() {
    // Uniform NV18: GPUs 5-7 half used; binpack need 2 → two used cards.
    let mut f = Fix::uniform(8);
    let mut entries = Vec::new();
    for i in 0..8 {
        let peers: Vec<String> = (0..8).filter(|&j| j != i).map(|j| format!("\"{j}\":[24]")).collect();
        entries.push(format!("{{\"index\":{i},\"links\":{{{}}}}}", peers.join(",")));
    }
    f.links = Some(topo(&format!("[{}]", entries.join(","))));
    f.busy("x", "a[5_GPU-5_50_8192,6_GPU-6_50_8192,7_GPU-7_50_8192]");
    let got = allocate(&link_req("link-strict", "binpack", 2), &f.view()).unwrap();
    assert_eq!(indices(&got), [5, 6]);
}

#[test]
fn link_never_worse_than_walk_and_uses_optimizer() {
    // 4 GPUs: NVLink between all, pair scores A-B 300, C-D 100, A-C 200, B-D 200, A-D 100, B-C 100.
    let t = r#"[{"index":0,"links":{"1":[9],"2":[8],"3":[7]}},{"index":1,"links":{"0":[9],"2":[7],"3":[8]}},
               {"index":2,"links":{"0":[8],"1":[7],"3":[7]}},{"index":3,"links":{"0":[7],"1":[8],"2":[7]}}]"#;
    let mut f = Fix::uniform(4);
    f.links = Some(topo(t));
    let got = allocate(&link_req("link-strict", "none", 2), &f.view()).unwrap();
    assert_eq!(indices(&got), [0, 1]);
}

// === multi-container and init containers ===

#[test]
fn multi_container_accumulates_usage() {
    let f = Fix::uniform(2);
    let r = req(
        &[("device-scheduler-policy", "binpack")],
        vec![
            ctr(PodContainer::app("a"), 1, 60, 8000),
            ctr(PodContainer::app("b"), 1, 60, 8000),
            ctr(PodContainer::app("c"), 2, 30, 4000),
        ],
    );
    assert_eq!(
        run(&r, &f).unwrap(),
        "a[0_GPU-0_60_8000];b[1_GPU-1_60_8000];c[0_GPU-0_30_4000,1_GPU-1_30_4000]"
    );
}

#[test]
fn init_containers_two_pass() {
    let f = Fix::uniform(4);
    let r = req(
        &[("device-scheduler-policy", "binpack")],
        vec![
            ctr(PodContainer::init("init-a"), 1, 90, 12000),
            ctr(PodContainer::sidecar("side"), 1, 10, 1000),
            ctr(PodContainer::app("main"), 2, 80, 12000),
            ctr(PodContainer::init("init-b"), 3, 50, 2000),
        ],
    );
    let got = allocate(&r, &f.view()).unwrap();
    let text = pod_devices::encode(&got.claim).unwrap();
    // side on GPU 0; main binpacks onto 0 and 1; init-a runs before main, so 90 cores fit beside the sidecar
    // on the pod's fullest GPU 0; init-b needs 3 cards, more than the pod's 2, so it goes to the whole node.
    assert_eq!(
        text,
        "init-a[0_GPU-0_90_12000];side[0_GPU-0_10_1000];init-b[0_GPU-0_50_2000,1_GPU-1_50_2000,2_GPU-2_50_2000];\
         main[0_GPU-0_80_12000,1_GPU-1_80_12000]"
    );
    // The reduced footprint never exceeds a card.
    let roles: std::collections::BTreeMap<String, ContainerRole> =
        r.containers.iter().map(|c| (c.name.clone(), ContainerRole::of(c))).collect();
    let fp = PodFootprint::from_claim_with_roles(&got.claim, |n| roles[n]);
    assert_eq!(fp.device(0), DeviceUsage { number: 2, cores: 100, memory_mib: 13000 });
    assert_eq!(fp.device(1), DeviceUsage { number: 1, cores: 80, memory_mib: 12000 });
    assert_eq!(fp.device(2), DeviceUsage { number: 1, cores: 50, memory_mib: 2000 });
}

#[test]
fn init_only_pod_and_two_inits_share() {
    let f = Fix::uniform(2);
    let r =
        req(&[], vec![ctr(PodContainer::init("i1"), 1, 100, 0), ctr(PodContainer::init("i2"), 1, 100, 0)]);
    assert_eq!(run(&r, &f).unwrap(), "i1[0_GPU-0_100_16384];i2[0_GPU-0_100_16384]");
}

// === node scoring (§3.2) ===

#[test]
fn node_order_binpack_spread_none_and_fitness() {
    let mut a = Fix::uniform(2);
    a.busy("x", "a[0_GPU-0_50_8192]");
    let b = Fix::uniform(2);
    let mut full = Fix::uniform(1);
    full.busy("x", "a[0_GPU-0_100_16384]");
    let views = |names: [&'static str; 3]| {
        let mut v = vec![a.view(), b.view(), full.view()];
        for (v, n) in v.iter_mut().zip(names) {
            v.name = n;
        }
        v
    };
    let nodes = views(["a", "b", "c"]);
    let r = |p: &str| req(&[("node-scheduler-policy", p)], vec![ctr(PodContainer::app("m"), 1, 20, 2048)]);
    assert_eq!(order_nodes(&r("binpack"), &nodes), [0, 1, 2]);
    assert_eq!(order_nodes(&r("spread"), &nodes), [1, 0, 2]);
    assert_eq!(order_nodes(&r("none"), &nodes), [0, 1, 2]);
    let s = score_node(&r("binpack"), &nodes[2]);
    assert_eq!((s.score, s.host_priority()), (0.0, 0));
    let sb = score_node(&r("spread"), &nodes[1]);
    assert_eq!(sb.host_priority(), 10);
    // Equal scores: name ascending.
    let same = vec![NodeView { name: "z", ..b.view() }, NodeView { name: "y", ..b.view() }];
    assert_eq!(order_nodes(&r("binpack"), &same), [1, 0]);
    // Fitness first: link mode prefers the node with an NVLink pair.
    let mut linked = Fix::uniform(4);
    linked.links = Some(topo(RTX8000));
    let lr = req(
        &[("device-topology-mode", "link"), ("node-scheduler-policy", "binpack")],
        vec![ctr(PodContainer::app("m"), 2, 20, 2048)],
    );
    let nodes = vec![NodeView { name: "a", ..a.view() }, NodeView { name: "l", ..linked.view() }];
    assert_eq!(topology_fitness(&lr, &nodes[0]), Some(0));
    assert_eq!(topology_fitness(&lr, &nodes[1]), Some(5));
    assert_eq!(order_nodes(&lr, &nodes), [1, 0]);
    let lr3 = req(&[("device-topology-mode", "link")], vec![ctr(PodContainer::app("m"), 3, 20, 2048)]);
    assert_eq!(topology_fitness(&lr3, &nodes[1]), Some(3));
    let nr = req(&[("device-topology-mode", "numa")], vec![ctr(PodContainer::app("m"), 3, 20, 2048)]);
    assert_eq!(topology_fitness(&nr, &nodes[1]), Some(1));
    assert_eq!(topology_fitness(&r("binpack"), &nodes[1]), None);
}

#[test]
fn binpack_score_formula() {
    // One card, split 4, 100 cores, 16384 MiB; request 1 vGPU + 50 cores: weights (num .4, core .2, mem .4).
    let f = Fix::uniform(1);
    let r = req(&[("node-scheduler-policy", "binpack")], vec![ctr(PodContainer::app("m"), 1, 50, 0)]);
    let s = score_node(&r, &f.view());
    // Post-placement utilization: slots 1/4, cores 50/100, memory (whole card) 1.
    let want = 100.0 * (0.4 * 0.25 + 0.2 * 0.5 + 0.4 * 1.0);
    assert!((s.score - want).abs() < 1e-9, "{}", s.score);
}

#[test]
fn determinism() {
    let mut f = Fix::uniform(8);
    f.links = Some(topo(include_str!("../../tests/fixtures/topology/dgx1-volta.json")));
    f.busy("x", "a[1_GPU-1_30_2048,5_GPU-5_30_2048]");
    for mode in ["none", "numa", "link", "numa-strict", "link-strict"] {
        for pol in ["none", "binpack", "spread"] {
            let r = link_req(mode, pol, 3);
            assert_eq!(allocate(&r, &f.view()), allocate(&r, &f.view()));
        }
    }
}

#[test]
fn optimizer_replaces_a_weaker_walk_set() {
    // All NVLink; 1-2 carry three links. Binpack puts used GPU 0 in its own run, so the walk takes 0 plus its
    // best partner (score 100); the exact best-effort set {1, 2} scores 300 and wins.
    let t = r#"[{"index":0,"links":{"1":[7],"2":[7],"3":[7]}},{"index":1,"links":{"0":[7],"2":[9],"3":[7]}},
               {"index":2,"links":{"0":[7],"1":[9],"3":[7]}},{"index":3,"links":{"0":[7],"1":[7],"2":[7]}}]"#;
    let mut f = Fix::uniform(4);
    f.links = Some(topo(t));
    f.busy("x", "a[0_GPU-0_10_1024]");
    let got = allocate(&link_req("link-strict", "binpack", 2), &f.view()).unwrap();
    assert_eq!(indices(&got), [1, 2]);
}

// === cross-pod windows (§4.3, §4.5) ===

/// Eight GPUs, NVLink (NV6) inside 0-3 and inside 4-7, same-CPU PCIe across.
fn two_islands() -> Fix {
    let mut f = Fix::uniform(8);
    f.links = Some(fabric(8, |i, j| if i / 4 == j / 4 { 12 } else { 2 }));
    f
}

fn aligned(r: &PodRequest, f: &Fix, a: &Alignment) -> Result<PodAllocation, NodeFailure> {
    let view = f.view();
    let resolved = r.resolve(view.inventory, view.config);
    place_aligned(r, &resolved, &view, Some(a))
}

fn windows(rail: Option<&[u32]>, anchor: Option<&[u32]>) -> Alignment {
    Alignment { rail_gpus: rail.map(<[u32]>::to_vec), anchor_gpus: anchor.map(<[u32]>::to_vec) }
}

#[test]
fn aligned_windows_are_tried_rail_then_anchor_then_none() {
    let mut f = two_islands();
    let r = link_req("link", "none", 2);
    // L1: the rail window holds enough GPUs.
    let got = aligned(&r, &f, &windows(Some(&[5, 6]), Some(&[0, 1, 2, 3]))).unwrap();
    assert_eq!((indices(&got), got.alignment), (vec![5, 6], Some(AlignmentWindow::Rail)));
    // Rail window smaller than the need: skipped, L2 anchor component.
    let got = aligned(&r, &f, &windows(Some(&[5]), Some(&[4, 5, 6, 7]))).unwrap();
    assert_eq!((indices(&got), got.alignment), (vec![4, 5], Some(AlignmentWindow::Component)));
    // Rail GPUs full: the rail plan fails, the anchor wins.
    f.busy("x", "a[5_GPU-5_100_1024,6_GPU-6_100_1024]");
    let got = aligned(&r, &f, &windows(Some(&[5, 6]), Some(&[4, 5, 6, 7]))).unwrap();
    assert_eq!((indices(&got), got.alignment), (vec![4, 7], Some(AlignmentWindow::Component)));
    // Anchor full too: L3 on the whole node.
    f.busy("y", "a[4_GPU-4_100_1024,7_GPU-7_100_1024]");
    let got = aligned(&r, &f, &windows(Some(&[5, 6]), Some(&[4, 5, 6, 7]))).unwrap();
    assert_eq!((indices(&got), got.alignment), (vec![0, 1], Some(AlignmentWindow::None)));
    // No window at all: same as place, reported as none.
    let plain = allocate(&r, &f.view()).unwrap();
    let got = aligned(&r, &f, &Alignment::default()).unwrap();
    assert_eq!((&got.claim, &got.notices), (&plain.claim, &plain.notices));
    assert_eq!((plain.alignment, got.alignment), (None, Some(AlignmentWindow::None)));
    // Other modes ignore the alignment.
    let got = aligned(&link_req("none", "none", 2), &f, &windows(Some(&[2, 3]), None)).unwrap();
    assert_eq!((indices(&got), got.alignment), (vec![0, 1], None));
}

#[test]
fn aligned_strict_keeps_trying_until_nvlink() {
    let f = two_islands();
    // The rail window straddles the islands: non-strict accepts the looser plan (with a downgrade notice) ...
    let a = windows(Some(&[2, 6]), Some(&[4, 5, 6, 7]));
    let got = aligned(&link_req("link", "none", 2), &f, &a).unwrap();
    assert_eq!((indices(&got), got.alignment), (vec![2, 6], Some(AlignmentWindow::Rail)));
    assert_eq!(got.notices.len(), 1);
    // ... strict goes on to the anchor component.
    let got = aligned(&link_req("link-strict", "none", 2), &f, &a).unwrap();
    assert_eq!((indices(&got), got.alignment), (vec![4, 5], Some(AlignmentWindow::Component)));
    assert!(got.notices.is_empty());
    // Strict without an anchor still has the unwindowed attempt.
    let got = aligned(&link_req("link-strict", "none", 2), &f, &windows(Some(&[2, 6]), None)).unwrap();
    assert_eq!((indices(&got), got.alignment), (vec![0, 1], Some(AlignmentWindow::None)));
}

#[test]
fn aligned_strict_anchor_too_small_or_full_rejects() {
    let mut f = two_islands();
    let small = windows(None, Some(&[0, 1]));
    let e = aligned(&link_req("link-strict", "none", 4), &f, &small).unwrap_err();
    assert_eq!(e.code, ReasonCode::LinkTopologyUnsatisfied);
    assert_eq!(e.detail.as_deref(), Some("gang anchor NVLink component has 2 GPUs, 4 requested"));
    // Non-strict ignores the too-small anchor.
    let got = aligned(&link_req("link", "none", 4), &f, &small).unwrap();
    assert_eq!((indices(&got), got.alignment), (vec![0, 1, 2, 3], Some(AlignmentWindow::None)));
    // Strict with the anchor full: no unwindowed attempt, so the node is rejected although 4-7 are free.
    f.busy("x", "a[0_GPU-0_100_1024,1_GPU-1_100_1024]");
    let anchor = windows(None, Some(&[0, 1, 2, 3]));
    let e = aligned(&link_req("link-strict", "none", 4), &f, &anchor).unwrap_err();
    assert_eq!(e.code, ReasonCode::LinkTopologyUnsatisfied);
    assert_eq!(indices(&allocate(&link_req("link-strict", "none", 4), &f.view()).unwrap()), [4, 5, 6, 7]);
    let got = aligned(&link_req("link", "none", 4), &f, &anchor).unwrap();
    assert_eq!((indices(&got), got.alignment), (vec![4, 5, 6, 7], Some(AlignmentWindow::None)));
}

#[test]
fn aligned_reports_the_loosest_container() {
    let f = two_islands();
    let r = req(
        &[("device-topology-mode", "link")],
        vec![ctr(PodContainer::app("a"), 2, 10, 1024), ctr(PodContainer::app("b"), 4, 10, 1024)],
    );
    // "a" fits the rail window {4, 5}; "b" needs 4 GPUs: the rail window is too small, the anchor is used.
    let got = aligned(&r, &f, &windows(Some(&[4, 5]), Some(&[4, 5, 6, 7]))).unwrap();
    let per: Vec<Vec<u32>> =
        got.claim.containers.iter().map(|c| c.devices.iter().map(|d| d.index).collect()).collect();
    assert_eq!(per, [vec![4, 5], vec![4, 5, 6, 7]]);
    assert_eq!(got.alignment, Some(AlignmentWindow::Component));
}
