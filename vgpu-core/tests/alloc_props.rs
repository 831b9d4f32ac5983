#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Property tests of the allocator: no over-commit of slots, cores or memory; deterministic results; the
//! allocation-free `quick_reject` agrees with a full placement wherever it answers.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use vgpu_core::alloc::{
    Alignment, AlignmentWindow, ContainerRole, GpuFree, NodeLinks, NodeUsage, NodeView, PodContainer,
    PodFootprint, PodRequest, PodSpec, ReasonCode, allocate, gate_inputs, place, place_aligned, precheck,
    quick_reject, quick_reject_summary, size_gate, topology_fitness, topology_fitness_table,
};
use vgpu_core::domain::ResourceDomain;
use vgpu_core::model::{
    ContainerDeviceClaim, DeviceClaim, DeviceHealth, GpuDevice, NodeDeviceInventory, NodeVgpuConfig,
    PodDeviceClaim, TopologyMode,
};

/// A GPU: split, cores, GiB, NUMA node, healthy, MIG.
type DeviceCase = (u32, u64, u64, Option<u32>, bool, bool);

fn device() -> impl Strategy<Value = DeviceCase> {
    (
        1u32..=4,
        prop::sample::select(vec![100u64, 200]),
        1u64..=8,
        prop::option::of(0u32..2),
        prop::bool::weighted(0.9),
        prop::bool::weighted(0.1),
    )
}

/// An inventory from [`device`] tuples (split, cores, GiB, NUMA node, healthy, MIG).
fn inventory(devices: &[DeviceCase]) -> NodeDeviceInventory {
    NodeDeviceInventory::new(
        devices
            .iter()
            .enumerate()
            .map(|(i, &(split, cores, gib, numa, healthy, mig))| GpuDevice {
                index: i as u32,
                uuid: format!("GPU-{i}"),
                type_name: "T".into(),
                memory_mib: gib * 1024,
                cores,
                split_count: split,
                numa_node: numa,
                mig_enabled: mig,
                health: DeviceHealth::from_bool(healthy),
                ..Default::default()
            })
            .collect(),
    )
}

fn container() -> impl Strategy<Value = (u8, u64, u64, u64)> {
    (0u8..3, 0u64..=3, 0u64..=100, prop::sample::select(vec![0u64, 512, 2048, 4096, 8192]))
}

type PodCase = (Vec<(u8, u64, u64, u64)>, usize, usize, usize);

fn pod() -> impl Strategy<Value = PodCase> {
    (prop::collection::vec(container(), 1..=3), 0usize..3, 0usize..3, 0usize..5)
}

/// The request of a [`pod`] case, with an optional `include-gpu-type`.
fn request_of(&(ref ctrs, dp, np, mode): &PodCase, include_type: Option<&str>) -> PodRequest {
    let d = ResourceDomain::default();
    let modes = ["none", "numa", "link", "numa-strict", "link-strict"];
    let pols = ["none", "binpack", "spread"];
    let mut spec = PodSpec::new()
        .annotation(d.device_scheduler_policy(), pols[dp])
        .annotation(d.node_scheduler_policy(), pols[np])
        .annotation(d.device_topology_mode(), modes[mode]);
    if let Some(t) = include_type {
        spec = spec.annotation(d.include_gpu_type(), t);
    }
    for (c, &(kind, n, cores, mem)) in ctrs.iter().enumerate() {
        let name = format!("c{c}");
        let base = match kind {
            0 => PodContainer::app(name),
            1 => PodContainer::init(name),
            _ => PodContainer::sidecar(name),
        };
        spec = spec.container(
            base.limit(d.vgpu_number(), n).limit(d.vgpu_cores(), cores).limit(d.vgpu_memory(), mem),
        );
    }
    PodRequest::from_pod(&spec, &d).unwrap()
}

/// Counts a placed pod on the node's usage under `key`.
fn count_placed(usage: &mut NodeUsage, key: String, req: &PodRequest, claim: &PodDeviceClaim) {
    let roles: BTreeMap<String, ContainerRole> =
        req.containers.iter().map(|c| (c.name.clone(), ContainerRole::of(c))).collect();
    usage.insert_pod(key, PodFootprint::from_claim_with_roles(claim, |n| roles[n]));
}

fn links_json(n: usize, codes: &[u8]) -> String {
    let mut gpus = Vec::new();
    for i in 0..n {
        let mut peers = Vec::new();
        for j in 0..n {
            if i == j {
                continue;
            }
            let (a, b) = (i.min(j), i.max(j));
            let c = codes[(a * 7 + b) % codes.len()];
            if c > 0 {
                peers.push(format!("\"{j}\":[{c}]"));
            }
        }
        gpus.push(format!("{{\"index\":{i},\"links\":{{{}}}}}", peers.join(",")));
    }
    format!("[{}]", gpus.join(","))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Pods are placed one after the other on one node (usage grows); before each, `quick_reject` must give
    /// exactly the code `precheck` + `place` fail with whenever it answers, and answer for every precheck
    /// failure.
    #[test]
    fn quick_reject_agrees_with_placement(
        devices in prop::collection::vec(device(), 1..=6),
        codes in prop::collection::vec(prop::sample::select(vec![0u8, 1, 2, 4, 5, 7, 8, 12]), 1..10),
        pods in prop::collection::vec(pod(), 1..=10),
        types in prop::collection::vec(prop::option::of(prop::sample::select(vec!["T", "X"])), 10),
    ) {
        let inv = inventory(&devices);
        let cfg = NodeVgpuConfig::default();
        let links = NodeLinks::decode(&links_json(inv.len(), &codes)).unwrap();
        let mut usage = NodeUsage::new();
        for (p, case) in pods.iter().enumerate() {
            let req = request_of(case, types[p]);
            let view = NodeView { name: "n", inventory: &inv, config: &cfg, links: Some(&links), usage: &usage };
            let resolved = req.resolve(&inv, &cfg);
            let quick = quick_reject(&req, &resolved, &view);
            // From a node summary: the same answer without include/exclude lists, the size gates with them.
            let gpus = inv.devices.iter().map(|g| GpuFree::of(g, usage.device(g.index)));
            let summary = quick_reject_summary(&req, &resolved, &gate_inputs(&view), gpus);
            if types[p].is_none() {
                prop_assert_eq!(summary, quick);
            } else {
                prop_assert_eq!(summary, size_gate(&resolved, &gate_inputs(&view)));
            }
            let full = precheck(&req, &resolved, &view).and_then(|()| place(&req, &resolved, &view));
            let pre = precheck(&req, &resolved, &view);
            if let Err(f) = &pre {
                prop_assert_eq!(quick, Some(f.code), "every precheck failure is answered");
            }
            // The size gates from a node summary agree with precheck: same code, or a later gate.
            match (size_gate(&resolved, &gate_inputs(&view)), &pre) {
                (Some(code), Err(f)) => prop_assert_eq!(code, f.code),
                (Some(code), Ok(())) => prop_assert!(false, "size gate {:?} but precheck passed", code),
                (None, Err(f)) => prop_assert!(
                    matches!(f.code, ReasonCode::DeviceUuidMismatch | ReasonCode::DeviceTypeMismatch), "{:?}", f
                ),
                (None, Ok(())) => {}
            }
            match (quick, &full) {
                (Some(code), Err(f)) => prop_assert_eq!(code, f.code, "{:?}", f),
                (Some(code), Ok(a)) => prop_assert!(false, "quick {:?} but placed {:?}", code, a.claim),
                (None, _) => {}
            }
            let Ok(got) = full else { continue };
            count_placed(&mut usage, format!("p{p}"), &req, &got.claim);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn never_overcommits_and_is_deterministic(
        devices in prop::collection::vec(device(), 1..=6),
        codes in prop::collection::vec(prop::sample::select(vec![0u8, 1, 2, 4, 5, 7, 8, 12]), 1..10),
        pods in prop::collection::vec(pod(), 1..=6),
    ) {
        let inv = inventory(&devices);
        let cfg = NodeVgpuConfig::default();
        let links = NodeLinks::decode(&links_json(inv.len(), &codes)).unwrap();
        let mut usage = NodeUsage::new();
        for (p, case) in pods.iter().enumerate() {
            let req = request_of(case, None);
            let view = NodeView { name: "n", inventory: &inv, config: &cfg, links: Some(&links), usage: &usage };
            let first = allocate(&req, &view);
            prop_assert_eq!(&first, &allocate(&req, &view));
            let Ok(got) = first else { continue };
            // Every container got exactly its number of distinct, schedulable GPUs.
            for (c, claim) in req.containers.iter().zip(&got.claim.containers) {
                prop_assert_eq!(&c.name, &claim.name);
                let set: BTreeSet<u32> = claim.devices.iter().map(|x| x.index).collect();
                prop_assert_eq!(set.len(), c.request.number as usize);
                for x in &claim.devices {
                    prop_assert!(inv.get(x.index).unwrap().is_schedulable());
                }
            }
            count_placed(&mut usage, format!("p{p}"), &req, &got.claim);
            for dev in &inv.devices {
                let u = usage.device(dev.index);
                prop_assert!(u.number <= dev.split_count, "slots {} > {} on {}", u.number, dev.split_count, dev.index);
                prop_assert!(u.cores <= dev.cores, "cores {} > {} on {}", u.cores, dev.cores, dev.index);
                prop_assert!(u.memory_mib <= dev.memory_mib, "memory {} > {} on {}", u.memory_mib, dev.memory_mib, dev.index);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// The per-need table equals `topology_fitness` of a pod of each need, for every mode.
    #[test]
    fn fitness_table_matches_per_pod_fitness(
        devices in prop::collection::vec(device(), 1..=8),
        codes in prop::collection::vec(prop::sample::select(vec![0u8, 1, 2, 4, 5, 7, 8, 12]), 1..10),
        with_links in any::<bool>(),
    ) {
        let d = ResourceDomain::default();
        let inv = inventory(&devices);
        let cfg = NodeVgpuConfig::default();
        let links = NodeLinks::decode(&links_json(inv.len(), &codes)).unwrap();
        let usage = NodeUsage::new();
        let view = NodeView {
            name: "n", inventory: &inv, config: &cfg, links: with_links.then_some(&links), usage: &usage,
        };
        for (mode, name) in [(TopologyMode::Link, "link"), (TopologyMode::Numa, "numa"), (TopologyMode::None, "none")] {
            let table = topology_fitness_table::<12>(mode, &view);
            for n in 0..12usize {
                let spec = PodSpec::new()
                    .annotation(d.device_topology_mode(), name)
                    .container(PodContainer::app("m").limit(d.vgpu_number(), n.max(1)));
                let req = PodRequest::from_pod(&spec, &d).unwrap();
                prop_assert_eq!(table.map(|t| t[n]), topology_fitness(&req, &view), "{} need {}", name, n);
            }
        }
    }
}

const FIXTURES: [&str; 3] = [
    include_str!("fixtures/topology/dgx1-volta.json"),
    include_str!("fixtures/topology/hgx-nvswitch-8x.json"),
    include_str!("fixtures/topology/two-islands-16x.json"),
];

fn subset(n: usize) -> impl Strategy<Value = Option<Vec<u32>>> {
    prop::option::of(prop::collection::btree_set(0..n as u32, 0..=n).prop_map(|s| s.into_iter().collect()))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// Cross-pod windows on fixture topologies with random usage: no window or whole-node windows change
    /// nothing; a non-strict request is never rejected because of alignment; a windowed placement stays inside
    /// its window; a strict request with an anchor stays inside the windows.
    #[test]
    fn alignment_windows(
        fixture in 0usize..FIXTURES.len(),
        used in prop::collection::vec((0u32..=4, 0u64..=100), 16),
        need in 1u64..=6,
        cores in prop::sample::select(vec![0u64, 10, 30, 60]),
        strict in any::<bool>(),
        policy in prop::sample::select(vec!["none", "binpack", "spread"]),
        raw_rail in subset(16),
        raw_anchor in subset(16),
    ) {
        let d = ResourceDomain::default();
        let links = NodeLinks::decode(FIXTURES[fixture]).unwrap();
        let n = links.len();
        let inv = NodeDeviceInventory::new((0..n as u32).map(|i| GpuDevice {
            index: i,
            uuid: format!("GPU-{i}"),
            type_name: "T".into(),
            memory_mib: 16384,
            cores: 100,
            split_count: 4,
            numa_node: Some(i * 2 / n as u32),
            ..Default::default()
        }).collect());
        let mut usage = NodeUsage::new();
        for (i, &(slots, c)) in used.iter().take(n).enumerate() {
            let devices: Vec<DeviceClaim> = (0..slots).map(|_| DeviceClaim {
                index: i as u32, uuid: format!("GPU-{i}"), cores: c / 4, memory_mib: 1024,
            }).collect();
            let claim = PodDeviceClaim { containers: vec![ContainerDeviceClaim { name: "c".into(), devices }] };
            usage.insert_pod(format!("busy{i}"), PodFootprint::from_claim(&claim));
        }
        let cfg = NodeVgpuConfig::default();
        let spec = PodSpec::new()
            .annotation(d.device_scheduler_policy(), policy)
            .annotation(d.device_topology_mode(), if strict { "link-strict" } else { "link" })
            .container(PodContainer::app("m").limit(d.vgpu_number(), need).limit(d.vgpu_cores(), cores)
                .limit(d.vgpu_memory(), 1024));
        let req = PodRequest::from_pod(&spec, &d).unwrap();
        let view = NodeView { name: "n", inventory: &inv, config: &cfg, links: Some(&links), usage: &usage };
        let resolved = req.resolve(&inv, &cfg);
        let plain = place(&req, &resolved, &view);
        let strip = |r: &Result<vgpu_core::alloc::PodAllocation, vgpu_core::alloc::NodeFailure>| {
            r.clone().map(|a| (a.claim, a.notices))
        };

        // No window, and windows covering the whole node: the placement of `place`.
        let all: Vec<u32> = (0..n as u32).collect();
        for a in [
            Alignment::default(),
            Alignment { rail_gpus: Some(all.clone()), anchor_gpus: None },
            Alignment { rail_gpus: None, anchor_gpus: Some(all.clone()) },
            Alignment { rail_gpus: Some(all.clone()), anchor_gpus: Some(all.clone()) },
        ] {
            let got = place_aligned(&req, &resolved, &view, Some(&a));
            prop_assert_eq!(strip(&got), strip(&plain), "{:?}", a);
        }

        // Random windows.
        let clip = |w: Option<Vec<u32>>| w.map(|v| v.into_iter().filter(|&i| (i as usize) < n).collect::<Vec<u32>>());
        let a = Alignment { rail_gpus: clip(raw_rail), anchor_gpus: clip(raw_anchor) };
        let got = place_aligned(&req, &resolved, &view, Some(&a));
        if !strict {
            prop_assert_eq!(got.is_ok(), plain.is_ok(), "alignment never rejects a non-strict request");
        }
        if let Ok(got) = &got {
            let picked: Vec<u32> = got.claim.devices().map(|x| x.index).collect();
            let inside = |w: &Option<Vec<u32>>| w.as_ref().is_some_and(|w| picked.iter().all(|i| w.contains(i)));
            match got.alignment {
                Some(AlignmentWindow::Rail) => prop_assert!(inside(&a.rail_gpus)),
                Some(AlignmentWindow::Component) => prop_assert!(inside(&a.anchor_gpus)),
                Some(AlignmentWindow::None) => {}
                None => prop_assert!(false, "alignment given but not reported"),
            }
            if strict && a.anchor_gpus.is_some() {
                prop_assert!(inside(&a.rail_gpus) || inside(&a.anchor_gpus), "strict + anchor left the windows");
            }
        }
    }
}
