//! The ready mock descriptions in `examples/mock/` load and describe the nodes they claim to.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers outside #[test] fns

use std::path::PathBuf;

use vgpu_core::{
    backend::{
        BackendKind, DeviceBackend, HealthEventKind, MigMode,
        links::{LINK_CROSS_CPU, LINK_MULTI_SWITCH, LINK_SAME_CPU, LINK_SINGLE_SWITCH, nvlinks},
        mock::MockBackend,
    },
    model::DeviceHealth,
};

fn example(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples/mock").join(name)
}

fn load(name: &str) -> Box<dyn DeviceBackend> {
    assert_eq!("mock".parse::<BackendKind>(), Ok(BackendKind::Mock));
    Box::new(MockBackend::from_path(&example(name)).unwrap_or_else(|err| panic!("{name}: {err}")))
}

#[test]
fn dgx_h100_loads() {
    let backend = load("dgx-h100-8gpu.yaml");
    let devices = backend.devices().unwrap();
    assert_eq!(devices.len(), 8);
    for (i, device) in devices.iter().enumerate() {
        assert_eq!(device.index as usize, i);
        assert_eq!(device.type_name, "NVIDIA H100 80GB HBM3");
        assert_eq!(device.numa_node, Some(if i < 4 { 0 } else { 1 }));
        assert_eq!(device.capability.to_string(), "9.0");
    }
    assert_eq!(devices.iter().filter(|d| d.mig_enabled).count(), 1);
    assert_eq!(backend.mig_layout(7).unwrap().mode, MigMode::Enabled);
    assert_eq!(backend.mig_layout(7).unwrap().instances.len(), 3);
    assert_eq!(backend.mig_layout(0).unwrap().mode, MigMode::Disabled);

    let topo = backend.topology().unwrap();
    let nv18 = nvlinks(18).unwrap();
    assert_eq!(topo.len(), 8);
    for i in 0..8 {
        for j in 0..8 {
            if i != j {
                let pcie = if (i < 4) == (j < 4) { LINK_SAME_CPU } else { LINK_CROSS_CPU };
                assert_eq!(topo.links(i, j), &[nv18, pcie], "{i}-{j}");
            }
        }
    }

    assert_eq!(backend.processes(0).unwrap().len(), 2);
    assert_eq!(backend.memory_usage(0).unwrap().used_bytes, (20480 + 8192) << 20);
    assert_eq!(backend.process_utilization(0, 0).unwrap().len(), 4);
    let events = backend.health_events().unwrap();
    let first = events.try_recv().unwrap();
    assert_eq!(first.kind, HealthEventKind::Xid { code: 13 });
    assert!(!first.kind.is_critical());
}

#[test]
fn pcie_l40s_loads() {
    let backend = load("pcie-l40s-4gpu.yaml");
    let devices = backend.devices().unwrap();
    assert_eq!(devices.len(), 4);
    assert!(devices.iter().all(|d| !d.mig_enabled && d.memory_mib == 46068));
    assert_eq!(devices[3].health, DeviceHealth::Unhealthy);
    let topo = backend.topology().unwrap();
    assert_eq!(topo.links(0, 1), &[LINK_SINGLE_SWITCH]);
    assert_eq!(topo.links(3, 2), &[LINK_MULTI_SWITCH]);
    assert_eq!(topo.links(0, 3), &[LINK_CROSS_CPU]);
    assert_eq!(backend.mig_layout(0).unwrap().mode, MigMode::NotSupported);
    let event = backend.health_events().unwrap().try_recv().unwrap();
    assert_eq!((event.index, event.kind.is_critical()), (3, true));
}
