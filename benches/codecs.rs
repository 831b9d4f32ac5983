//! Codec throughput: decode + encode of a 16-GPU `node-device-register` and a 16-container `pre-allocated`;
//! decode of `node-config-info` and of the `node-device-topology` of a DGX-1 (8 GPUs) and of two 8-GPU islands.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use vgpu_core::topology::Topology;
use vgpu_core::{
    codec::{node_config_info, node_devices, pod_devices},
    model::{
        ComputeCapability, ContainerDeviceClaim, DeviceClaim, DeviceHealth, GpuDevice, NodeDeviceInventory,
        PodDeviceClaim, Vendor,
    },
};

const DGX1_VOLTA: &str = include_str!("../vgpu-core/tests/fixtures/topology/dgx1-volta.json");
const TWO_ISLANDS: &str = include_str!("../vgpu-core/tests/fixtures/topology/two-islands-16x.json");
const CONFIG: &str = r#"{"deviceSplit":10,"coresScaling":1,"memoryFactor":1,"memoryScaling":1}"#;

fn inventory() -> NodeDeviceInventory {
    NodeDeviceInventory::new(
        (0..16u32)
            .map(|i| GpuDevice {
                index: i,
                uuid: format!("GPU-49aa2e6a-33f3-99dd-e08b-ea4beb0e0d{i:02}"),
                type_name: "NVIDIA H100 80GB HBM3".to_owned(),
                vendor: Vendor::Nvidia,
                memory_mib: 81559,
                cores: 100,
                split_count: 10,
                numa_node: Some(i / 8),
                mig_enabled: false,
                bus_id: format!("0000:{:02x}:00.0", 0x18 + i),
                capability: ComputeCapability { major: 9, minor: 0 },
                health: DeviceHealth::Healthy,
            })
            .collect(),
    )
}

fn claim() -> PodDeviceClaim {
    PodDeviceClaim {
        containers: (0..16u32)
            .map(|c| ContainerDeviceClaim {
                name: format!("worker-{c}"),
                devices: (0..2u32)
                    .map(|d| DeviceClaim {
                        index: (c + d) % 16,
                        uuid: format!("GPU-49aa2e6a-33f3-99dd-e08b-ea4beb0e0d{:02}", (c + d) % 16),
                        cores: 50,
                        memory_mib: 40960,
                    })
                    .collect(),
            })
            .collect(),
    }
}

fn bench(c: &mut Criterion) {
    let Ok(devices) = node_devices::encode(&inventory()) else { return };
    let Ok(pre) = pod_devices::encode(&claim()) else { return };
    c.bench_function("node-device-register 16 GPUs decode+encode", |b| {
        b.iter(|| node_devices::decode(black_box(&devices)).and_then(|inv| node_devices::encode(&inv)))
    });
    c.bench_function("pre-allocated 16 containers decode+encode", |b| {
        b.iter(|| pod_devices::decode_pre_allocated(black_box(&pre)).and_then(|c| pod_devices::encode(&c)))
    });
    c.bench_function("node-config-info decode", |b| b.iter(|| node_config_info::decode(black_box(CONFIG))));
    c.bench_function("node-device-topology DGX-1 decode", |b| {
        b.iter(|| Topology::decode(black_box(DGX1_VOLTA)))
    });
    c.bench_function("node-device-topology 2x8 islands decode", |b| {
        b.iter(|| Topology::decode(black_box(TWO_ISLANDS)))
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
