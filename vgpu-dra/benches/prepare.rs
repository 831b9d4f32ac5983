//! NodePrepareResources for a 1-device vGPU claim (issue #17: median ≤ 2 ms), checkpoint and CDI write
//! included, on tmpfs (`/dev/shm`) when the machine has it, else a temporary directory:
//!
//! * `prepare/state`: [`DeviceState::prepare`] — `pu.lock`, checkpoint read, claim read (in memory), plan,
//!   `PrepareStarted` write, partition directories, CDI spec, `PrepareCompleted` write (every write is
//!   temp + fsync + rename + directory fsync);
//! * `prepare/grpc`: the same through `v1.DRAPlugin/NodePrepareResources` over the plugin's unix socket.
//!
//! Only Prepare is timed; each iteration's Unprepare runs outside the measurement.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    path::Path,
    sync::Arc,
    time::{Duration, Instant},
};

use criterion::{Criterion, criterion_group, criterion_main};
use vgpu_core::backend::{NvidiaAdapter, mock::MockBackend};
use vgpu_dra::claims::ClaimRef;
use vgpu_dra::{
    claims::{InMemoryClaims, allocated, allocation_result, claim},
    config::DriverConfig,
    devices::{AllocatableDevices, DeviceConfig},
    driver::Driver,
    health::HealthSnapshot,
    state::DeviceState,
};
use vgpu_kubelet::api::dra_v1;

const NODE: &str = "bench-node";

fn root() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() { tempfile::tempdir_in(shm).unwrap() } else { tempfile::tempdir().unwrap() }
}

async fn state(dir: &Path) -> Arc<DeviceState> {
    let mut config = DriverConfig::under(NODE, dir);
    config.boot_id_path = dir.join("boot_id");
    std::fs::write(&config.boot_id_path, "bench-boot\n").unwrap();
    // Prepare checks the runtime files a vGPU claim's mounts name (the control library, ld.so.preload).
    vgpu_core::abi::runtime_files::install(&config.manager_dir, &config.library_version, b"").unwrap();
    let backend =
        MockBackend::from_yaml_str("gpus:\n  - { uuid: GPU-a, name: NVIDIA A30, memoryMiB: 24576 }\n")
            .unwrap();
    let devices = AllocatableDevices::from_backend(&backend, &DeviceConfig::default()).unwrap();
    let claims = InMemoryClaims::default();
    let result = allocation_result(
        "gpu",
        vgpu_dra::DRIVER_NAME,
        NODE,
        "vgpu-0",
        Some("s1"),
        &[("cores", "10"), ("memory", "1Gi")],
    );
    claims.insert(allocated(claim("ns", "c1", "uid-1"), vec![result], &["pod-1"]));
    Arc::new(
        DeviceState::new(Arc::new(config), Arc::new(devices), Arc::new(NvidiaAdapter), Arc::new(claims))
            .await
            .unwrap(),
    )
}

fn prepare(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let dir = root();
    let state = rt.block_on(state(dir.path()));
    let claims = [ClaimRef::new("ns", "c1", "uid-1")];
    let mut group = c.benchmark_group("prepare");
    group.bench_function("state", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let start = Instant::now();
                    let out = state.prepare(&claims).await;
                    total += start.elapsed();
                    assert!(out["uid-1"].is_ok(), "{:?}", out["uid-1"]);
                    assert!(state.unprepare(&claims).await["uid-1"].is_ok());
                }
                total
            })
        });
    });

    let (_tx, health) = tokio::sync::watch::channel(HealthSnapshot::unmonitored_default());
    let running = rt.block_on(async { Driver::new(Arc::clone(&state), health).serve().unwrap() });
    let mut client = rt.block_on(async {
        let channel =
            vgpu_kubelet::socket::connect_unix(&running.dra_socket, Duration::from_secs(5)).await.unwrap();
        dra_v1::dra_plugin_client::DraPluginClient::new(channel)
    });
    let wire = dra_v1::Claim { namespace: "ns".into(), uid: "uid-1".into(), name: "c1".into() };
    group.bench_function("grpc", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let start = Instant::now();
                    let out = client
                        .node_prepare_resources(dra_v1::NodePrepareResourcesRequest {
                            claims: vec![wire.clone()],
                        })
                        .await
                        .unwrap()
                        .into_inner();
                    total += start.elapsed();
                    assert_eq!(out.claims["uid-1"].devices.len(), 1);
                    assert!(state.unprepare(&claims).await["uid-1"].is_ok());
                }
                total
            })
        });
    });
    group.finish();
    rt.block_on(running.stop()).unwrap();
}

criterion_group!(benches, prepare);
criterion_main!(benches);
