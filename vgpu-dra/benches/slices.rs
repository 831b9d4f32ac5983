//! ResourceSlice encode time for a 16-GPU node (issue #17: "publishing slices for 16 GPUs — encode time
//! only"): `build_slices` from the device model and health snapshot, then the JSON body a create or replace
//! sends; once healthy, once with every device tainted (16 taints: one slice still, 64-device limit).

use std::{hint::black_box, sync::Arc};

use criterion::{Criterion, criterion_group, criterion_main};
use vgpu_core::{
    backend::{DriverVersions, HealthEvent, HealthEventKind},
    model::{ComputeCapability, GpuDevice},
};
use vgpu_dra::{
    devices::{AllocatableDevices, DeviceConfig},
    health::{HealthConfig, HealthMonitor, HealthSnapshot},
    slices::{SliceConfig, build_slices},
};

fn node(gpus: u32) -> Arc<AllocatableDevices> {
    let devices = (0..gpus)
        .map(|i| {
            let gpu = GpuDevice {
                index: i,
                uuid: format!("GPU-49aa2e6a-33f3-99dd-e08b-ea4beb0e0d{i:02}"),
                type_name: "NVIDIA H100 80GB HBM3".into(),
                memory_mib: 81559,
                numa_node: Some(u32::from(i >= gpus / 2)),
                bus_id: format!("0000:{:02x}:00.0", i + 0x18),
                capability: ComputeCapability { major: 9, minor: 0 },
                ..GpuDevice::default()
            };
            (gpu, i)
        })
        .collect();
    let versions = DriverVersions { driver_version: "570.86.10".into(), cuda_version: Some((12, 8)) };
    match AllocatableDevices::new(&DeviceConfig::default(), devices, Some(versions)) {
        Ok(devices) => Arc::new(devices),
        Err(e) => {
            eprintln!("bench input invalid: {e}");
            std::process::exit(1);
        }
    }
}

fn encode(config: &SliceConfig, devices: &AllocatableDevices, health: &HealthSnapshot) -> usize {
    match build_slices(config, devices, health, 7) {
        Ok(slices) => slices.iter().map(|s| serde_json::to_vec(s).map_or(0, |v| v.len())).sum(),
        Err(e) => {
            eprintln!("bench input invalid: {e}");
            std::process::exit(1);
        }
    }
}

fn bench(c: &mut Criterion) {
    let devices = node(16);
    let config = SliceConfig::new("gpu-node-01");
    let healthy = HealthSnapshot::default();
    c.bench_function("dra/slices_encode_16_gpus", |b| {
        b.iter(|| encode(black_box(&config), black_box(&devices), black_box(&healthy)))
    });

    let monitor = HealthMonitor::new(HealthConfig::new(&config.driver, &[]), &devices);
    for index in 0..16 {
        let kind = HealthEventKind::Xid { code: 79 };
        monitor.apply(&HealthEvent { index, uuid: String::new(), kind, message: String::new() });
    }
    let tainted = monitor.snapshot();
    c.bench_function("dra/slices_encode_16_gpus_tainted", |b| {
        b.iter(|| encode(black_box(&config), black_box(&devices), black_box(&tainted)))
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
