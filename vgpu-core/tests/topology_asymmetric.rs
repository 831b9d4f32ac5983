#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! A `node-device-topology` with one asymmetric GPU pair (the two GPUs list different links for each other):
//! only that pair loses its link benefit; the node keeps the rest of its topology and link-mode placement
//! still uses it.

use vgpu_core::alloc::{
    LinkTier, NodeLinks, NodeUsage, NodeView, PodContainer, PodFootprint, PodRequest, PodSpec, ReasonCode,
    allocate,
};
use vgpu_core::domain::ResourceDomain;
use vgpu_core::model::{
    ContainerDeviceClaim, DeviceClaim, NodeDeviceInventory, NodeVgpuConfig, PodDeviceClaim,
};
use vgpu_core::topology::{P2PLinkType, Topology, TopologyError};

/// Four GPUs: NV2 (8) between 0 and 1 both ways; GPU 2 lists NV4 (10) for GPU 3, which lists only SYS (1)
/// back; SYS between every other pair. Read one-sided, 2-3 would be the strongest pair of the node.
const ANNOTATION: &str = r#"[{"index":0,"links":{"1":[8],"2":[1],"3":[1]}},
    {"index":1,"links":{"0":[8],"2":[1],"3":[1]}},
    {"index":2,"links":{"0":[1],"1":[1],"3":[10]}},
    {"index":3,"links":{"0":[1],"1":[1],"2":[1]}}]"#;

const MEMORY: u64 = 16384;

fn request(mode: &str, gpus: u64) -> PodRequest {
    let d = ResourceDomain::default();
    let spec = PodSpec::new()
        .annotation(d.device_scheduler_policy(), "none")
        .annotation(d.device_topology_mode(), mode)
        .container(
            PodContainer::app("m")
                .limit(d.vgpu_number(), gpus)
                .limit(d.vgpu_cores(), 10)
                .limit(d.vgpu_memory(), 1024),
        );
    PodRequest::from_pod(&spec, &d).unwrap()
}

/// Usage with each of `gpus` holding a pod that takes all its memory.
fn full(gpus: &[u32]) -> NodeUsage {
    let mut usage = NodeUsage::new();
    for &i in gpus {
        let devices = vec![DeviceClaim { index: i, uuid: format!("GPU-{i}"), cores: 10, memory_mib: MEMORY }];
        let claim = PodDeviceClaim { containers: vec![ContainerDeviceClaim { name: "c".into(), devices }] };
        usage.insert_pod(format!("busy{i}"), PodFootprint::from_claim(&claim));
    }
    usage
}

fn indices(req: &PodRequest, links: &NodeLinks, usage: &NodeUsage) -> Result<Vec<u32>, (ReasonCode, String)> {
    let inventory = NodeDeviceInventory::uniform(4, MEMORY, 4);
    let config = NodeVgpuConfig::default();
    let view = NodeView { name: "n", inventory: &inventory, config: &config, links: Some(links), usage };
    allocate(req, &view)
        .map(|a| a.claim.devices().map(|d| d.index).collect())
        .map_err(|e| (e.code, e.detail.unwrap_or_default()))
}

#[test]
fn the_asymmetric_pair_is_unlinked_and_the_rest_is_kept() {
    let e = Topology::decode(ANNOTATION).unwrap_err();
    assert!(matches!(e, TopologyError::Asymmetric { a: 2, b: 3, .. }), "strict validation unchanged: {e}");

    let links = NodeLinks::decode(ANNOTATION).unwrap();
    let pairs = links.asymmetric_pairs();
    assert_eq!(pairs.len(), 1);
    assert_eq!((pairs[0].a, pairs[0].b), (2, 3));
    assert_eq!(pairs[0].forward, [P2PLinkType::ALL[10]]);
    assert_eq!(pairs[0].backward, [P2PLinkType::ALL[1]]);
    // The pair: no link benefit, either way.
    for (a, b) in [(2, 3), (3, 2)] {
        assert_eq!((links.pair_score(a, b), links.strongest(a, b)), (0, 0));
    }
    // Every other pair keeps its score.
    assert_eq!((links.pair_score(0, 1), links.pair_score(1, 0), links.strongest(0, 1)), (200, 200, 8));
    for (a, b) in [(0, 2), (0, 3), (1, 2), (1, 3)] {
        assert_eq!((links.pair_score(a, b), links.pair_score(b, a), links.strongest(b, a)), (10, 10, 1));
    }
    assert!(links.has_links());
    assert_eq!(links.largest_component(LinkTier::NvLink), 2);
    assert_eq!(links.components(&[0, 1, 2, 3], LinkTier::NvLink), [vec![0, 1], vec![2], vec![3]]);
    assert_eq!(links.topology().set_score(&[0, 1, 2, 3]), Ok(200 + 4 * 10));
}

#[test]
fn link_placement_still_uses_the_rest_of_the_topology() {
    let links = NodeLinks::decode(ANNOTATION).unwrap();
    let idle = NodeUsage::new();
    // The NVLink pair, not the one-sided NV4 pair 2-3.
    assert_eq!(indices(&request("link-strict", 2), &links, &idle), Ok(vec![0, 1]));
    assert_eq!(indices(&request("link", 2), &links, &idle), Ok(vec![0, 1]));
    // Three GPUs: no NVLink component that large (the node still has a topology, so the strict reason is
    // about its components, not a missing topology).
    let (code, detail) = indices(&request("link-strict", 3), &links, &idle).unwrap_err();
    assert_eq!(code, ReasonCode::LinkTopologyUnsatisfied);
    assert_eq!(detail, "no NVLink-connected set of 3 GPUs (largest NVLink component 2)");
    // With 0 and 1 full, 2-3 is not an NVLink pair: strict refuses, non-strict places there.
    let busy = full(&[0, 1]);
    let (code, _) = indices(&request("link-strict", 2), &links, &busy).unwrap_err();
    assert_eq!(code, ReasonCode::LinkTopologyUnsatisfied);
    assert_eq!(indices(&request("link", 2), &links, &busy), Ok(vec![2, 3]));
}
