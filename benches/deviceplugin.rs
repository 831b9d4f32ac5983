#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The device plugin's hot paths, without the API server (in-memory cluster) and without gRPC transport:
//!
//! * `allocate/4x2gpu`: `Allocate` for a pod of 4 containers × 2 GPUs on an 8-GPU node: find the pod, check
//!   the claims, build envs / mounts / device nodes, write `devices.json` and `vgpu.config` (atomically, on
//!   tmpfs when `/dev/shm` exists) and patch the pod in memory.
//! * `list_and_watch/16x10`: the initial `ListAndWatch` list of 16 GPUs × split 10 (160 devices), built and
//!   encoded to its protobuf wire bytes.

use std::{collections::BTreeMap, hint::black_box, sync::Arc};

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use prost::Message;
use vgpu_core::backend::{DeviceBackend, mock::MockBackend};
use vgpu_deviceplugin::{
    cluster::{ContainerInfo, InMemoryCluster, PodInfo},
    config::PluginConfig,
    inventory::{DeviceState, node_devices},
    plugin::PluginHandler,
    vnumber::VgpuNumberPlugin,
};
use vgpu_kubelet::api::v1beta1::{AllocateRequest, ContainerAllocateRequest, ListAndWatchResponse};

fn mock(gpus: usize) -> MockBackend {
    let mut yaml = String::from("gpus:\n");
    for i in 0..gpus {
        yaml.push_str(&format!(
            "  - {{ uuid: GPU-{i:02}, name: NVIDIA H100 80GB HBM3, memoryMiB: 81559, numaNode: {} }}\n",
            i / 8
        ));
    }
    MockBackend::from_yaml_str(&yaml).unwrap()
}

fn plugin(
    gpus: usize,
    dir: &std::path::Path,
    cluster: Arc<InMemoryCluster>,
) -> (VgpuNumberPlugin, DeviceState) {
    let backend = mock(gpus);
    let mut config = PluginConfig::new("node-1");
    config.manager_dir = dir.to_path_buf();
    let state =
        DeviceState::new(node_devices(&backend.devices().unwrap(), &config.settings), &config.settings);
    (VgpuNumberPlugin::new(Arc::new(config), state.clone(), Some(cluster)), state)
}

fn pod() -> PodInfo {
    let containers: Vec<String> = (0..4)
        .map(|c| {
            format!("c{c}[{}_GPU-{:02}_25_4096,{}_GPU-{:02}_25_4096]", 2 * c, 2 * c, 2 * c + 1, 2 * c + 1)
        })
        .collect();
    PodInfo {
        namespace: "default".into(),
        name: "bench".into(),
        uid: "5d1f0c3a-6a55-4a0e-9f7e-0f1b2c3d4e5f".into(),
        node_name: "node-1".into(),
        phase: "Pending".into(),
        deleting: false,
        labels: BTreeMap::from([("nvidia.com/assigned-phase".to_owned(), "allocating".to_owned())]),
        annotations: BTreeMap::from([
            ("nvidia.com/pre-allocated".to_owned(), containers.join(";")),
            ("nvidia.com/predicate-node".to_owned(), "node-1".to_owned()),
            ("nvidia.com/predicate-time".to_owned(), "1700000000000000000".to_owned()),
        ]),
        containers: (0..4).map(|c| ContainerInfo { name: format!("c{c}"), env: BTreeMap::new() }).collect(),
    }
}

fn bench_allocate(c: &mut Criterion) {
    let shm = std::path::Path::new("/dev/shm");
    let dir = if shm.is_dir() { tempfile::tempdir_in(shm) } else { tempfile::tempdir() }.unwrap();
    let cluster = Arc::new(InMemoryCluster::default());
    let (plugin, _state) = plugin(8, dir.path(), Arc::clone(&cluster));
    let request = AllocateRequest {
        container_requests: (0..4)
            .map(|c| ContainerAllocateRequest {
                devices_ids: vec![format!("GPU-{:02}::0", 2 * c), format!("GPU-{:02}::0", 2 * c + 1)],
            })
            .collect(),
    };
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let fresh = pod();
    c.bench_function("allocate/4x2gpu", |b| {
        b.iter_batched(
            || cluster.upsert(fresh.clone()),
            |()| {
                let resp = rt.block_on(plugin.allocate(black_box(request.clone()))).unwrap();
                assert_eq!(resp.container_responses.len(), 4);
                resp
            },
            BatchSize::PerIteration,
        );
    });
}

fn bench_list_and_watch(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let (plugin, state) = plugin(16, dir.path(), Arc::new(InMemoryCluster::default()));
    let gpus = state.devices();
    c.bench_function("list_and_watch/16x10", |b| {
        b.iter(|| {
            let devices = plugin.devices(black_box(&gpus));
            assert_eq!(devices.len(), 160);
            ListAndWatchResponse { devices }.encode_to_vec()
        });
    });
}

criterion_group!(benches, bench_allocate, bench_list_and_watch);
criterion_main!(benches);
