//! A MetaX node on the DRA path (issue #20 item 4), at the publisher + state layer: the mock backend with
//! two MetaX GPUs (`vendor: metax`), the MetaX vendor adapter (`vgpu_core::backend::MetaxAdapter`: DRM card
//! and render nodes per GPU, `/dev/mxcd`), real files in a temporary directory. Even with `VGPUSupport` (on
//! by default) the GPUs are published as whole `gpu-<minor>` devices (the vGPU limits are a CUDA hook), the
//! slices reach the in-memory store, and Prepare of a claim the scheduler would have allocated writes a
//! valid CDI spec with the adapter's edits: the GPU's DRM nodes, `/dev/mxcd` when present, and none of the
//! CUDA control env or mounts.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::{collections::BTreeMap, sync::Arc};

use support::{DRIVER, NODE, TestNode};
use vgpu_core::backend::{MetaxAdapter, mock::MockBackend};
use vgpu_core::dra::DeviceType;
use vgpu_dra::claims::ClaimRef;
use vgpu_dra::{
    claims::{allocated, allocation_result, claim},
    devices::AllocatableDevices,
    devices::DeviceConfig,
    health::HealthSnapshot,
    slices::{
        SliceConfig,
        publisher::{PublishOutcome, SlicePublisher},
        store::MemorySliceStore,
    },
    state::DeviceState,
};

const MOCK: &str = "\
gpus:
  - { uuid: MX-0, name: MetaX C500, vendor: metax, memoryMiB: 65536, minor: 0 }
  - { uuid: MX-1, name: MetaX C500, vendor: metax, memoryMiB: 65536, minor: 1 }
";

fn adapter() -> MetaxAdapter {
    MetaxAdapter::new(BTreeMap::from([
        (0, vec!["/dev/dri/card1".into(), "/dev/dri/renderD129".into()]),
        (1, vec!["/dev/dri/card2".into(), "/dev/dri/renderD130".into()]),
    ]))
}

fn metax_devices() -> Arc<AllocatableDevices> {
    let backend = MockBackend::from_yaml_str(MOCK).unwrap();
    Arc::new(AllocatableDevices::from_backend(&backend, &DeviceConfig::default()).unwrap())
}

#[tokio::test]
async fn a_metax_node_publishes_whole_gpus() {
    let devices = metax_devices();
    assert!(DeviceConfig::default().vgpu_support, "VGPUSupport is on by default");
    let names: Vec<(&str, DeviceType, bool)> =
        devices.iter().map(|d| (d.name.as_str(), d.kind, d.shared)).collect();
    assert_eq!(names, [("gpu-0", DeviceType::Gpu, false), ("gpu-1", DeviceType::Gpu, false)]);

    let store = MemorySliceStore::new();
    let health = tokio::sync::watch::channel(HealthSnapshot::unmonitored_default()).1;
    let mut publisher = SlicePublisher::new(store.clone(), SliceConfig::new(NODE), devices, health);
    assert!(matches!(publisher.sync().await.unwrap(), PublishOutcome::Published { created: 1, .. }));
    let slices = store.slices();
    let slice = slices.values().next().unwrap();
    assert_eq!(slice.spec.driver, DRIVER);
    let published = slice.spec.devices.as_ref().unwrap();
    assert_eq!(published.len(), 2);
    for device in published {
        let attributes = device.attributes.as_ref().unwrap();
        assert_eq!(attributes["type"].string.as_deref(), Some("gpu"), "{}", device.name);
        assert_eq!(attributes["productName"].string.as_deref(), Some("MetaX C500"));
        assert!(device.capacity.is_none(), "an exclusive whole GPU: no consumable capacity");
        assert!(device.allow_multiple_allocations.is_none());
    }
}

#[tokio::test]
async fn prepare_writes_the_metax_adapters_cdi_edits() {
    let mut node = TestNode::new();
    node.devices = metax_devices();
    // `/dev/mxcd` exists on this node (under the container driver root, where the plugin looks).
    let mxcd = node.config.container_driver_root.join("dev/mxcd");
    std::fs::create_dir_all(mxcd.parent().unwrap()).unwrap();
    std::fs::write(&mxcd, b"").unwrap();
    let result = allocation_result("gpu", DRIVER, NODE, "gpu-1", None, &[]);
    node.claims.insert(allocated(claim("ns", "c1", "u1"), vec![result], &["pod-1"]));
    let state = DeviceState::new(
        Arc::clone(&node.config),
        Arc::clone(&node.devices),
        Arc::new(adapter()),
        node.claims.clone(),
    )
    .await
    .unwrap();

    let results = state.prepare(&[ClaimRef::new("ns", "c1", "u1")]).await;
    let devices = results["u1"].as_ref().unwrap();
    assert_eq!(devices.len(), 1);
    assert_eq!((devices[0].device_name.as_str(), devices[0].uuid.as_str()), ("gpu-1", "MX-1"));
    let spec: vgpu_core::cdi::Spec =
        serde_json::from_slice(&std::fs::read(node.config.cdi_spec_path("u1")).unwrap()).unwrap();
    assert_eq!(vgpu_core::cdi::validate(&spec), Ok(()));
    let host = &node.config.host_driver_root;
    let node_paths = |edits: &vgpu_core::cdi::ContainerEdits| -> Vec<(String, String)> {
        edits.device_nodes.iter().map(|n| (n.path.clone(), n.host_path.clone())).collect()
    };
    let under = |p: &str| host.join(p.trim_start_matches('/')).display().to_string();
    assert_eq!(node_paths(&spec.container_edits), [("/dev/mxcd".to_owned(), under("/dev/mxcd"))]);
    assert_eq!(spec.devices.len(), 1);
    assert_eq!(
        node_paths(&spec.devices[0].container_edits),
        [
            ("/dev/dri/card2".to_owned(), under("/dev/dri/card2")),
            ("/dev/dri/renderD130".to_owned(), under("/dev/dri/renderD130"))
        ]
    );
    // None of the NVIDIA vGPU edits: no CUDA hook, no limits, no partition directories.
    let env: Vec<&String> = spec
        .container_edits
        .env
        .iter()
        .chain(spec.devices.iter().flat_map(|d| &d.container_edits.env))
        .collect();
    assert!(env.is_empty(), "{env:?}");
    assert!(spec.container_edits.mounts.is_empty() && spec.devices[0].container_edits.mounts.is_empty());
    assert!(node.claim_dirs().is_empty());

    assert!(state.unprepare(&[ClaimRef::new("ns", "c1", "u1")]).await["u1"].is_ok());
    assert!(node.cdi_files().is_empty());
}
