//! Parse + validate of a 13-gate kubelet-plugin string, and of a Core string.

use criterion::{Criterion, criterion_group, criterion_main};
use std::hint::black_box;

fn bench(c: &mut Criterion) {
    let dra = "VGPUSupport=true,NVMLDeviceHealthCheck=true,IMEXDaemonsWithDNSNames=true,\
               TimeSlicingSettings=true,MPSSupport=false,PassthroughSupport=false,DynamicMIG=false,\
               DeviceMetadata=false,SharedSMUtilizationWatcher=true,DevicePluginClientMode=true,\
               NRISupport=true,FabricManagerPartitioning=false,DRAListTypeAttributes=true";
    let registry = vgpu::gates::kubelet_plugin();
    // Fail loudly (not silently bench an error path) if the input is not valid.
    if let Err(e) = registry.configure([dra]) {
        eprintln!("bench input invalid: {e}");
        std::process::exit(1);
    }
    c.bench_function("gates/parse_validate_13_dra", |b| {
        b.iter(|| registry.configure([black_box(dra)]).map(|g| g.enabled(vgpu::gates::DraGate::VGPUSupport)))
    });
    let invalid = "MPSSupport=true,DeviceMetadata=true";
    c.bench_function("gates/parse_validate_invalid_with_suggestion", |b| {
        b.iter(|| registry.configure([black_box(invalid)]).is_err())
    });
    let core = "GPUCoreResourcePlugin=true,GPUMemoryResourcePlugin=true,TopologyAwareGPUAllocation=true,\
                SharedSMUtilizationWatcher=true,VirtualMemoryTracking=true,HonorPreAllocatedDeviceIDs=true";
    let dp = vgpu::gates::device_plugin();
    c.bench_function("gates/parse_validate_6_core", |b| b.iter(|| dp.configure([black_box(core)]).is_ok()));
}

criterion_group!(benches, bench);
criterion_main!(benches);
