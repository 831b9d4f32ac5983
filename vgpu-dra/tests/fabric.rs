//! Gate `FabricManagerPartitioning` end to end at the state layer: [`DeviceState::with_modes`] with the
//! [`FabricMode`] over real files in a temporary directory and the in-process [`FakeFabricManager`] (FM's
//! partition table and rules), which records every activate/deactivate. Gate off vs on (attributes and FM
//! calls), the exact-set rule, idempotent apply/revert, a crash after the activation followed by a restart,
//! partitions shared by claims on shared GPUs, and the combination with VFIO passthrough.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

use vgpu_core::backend::{NvidiaAdapter, mock::MockBackend};
use vgpu_dra::claims::ClaimRef;
use vgpu_dra::{
    checkpoint::ClaimState,
    claims::{ClaimSource, InMemoryClaims, allocated, allocation_result, claim},
    config::DriverConfig,
    devices::{AllocatableDevices, ConsumableShares, DeviceConfig, ExtraAttribute},
    fabric::{FabricMode, FakeFabricManager, Partition, PartitionGpu, attach_partitions},
    health::HealthSnapshot,
    modes::{ClaimContext, ClaimDevice, ClaimMode},
    slices::{SliceConfig, build_device},
    state::{
        DeviceState,
        error::ClaimFailure,
        fault::{FaultHook, FaultPoint},
    },
    vfio::{
        SysfsRoots, VfioConfig, VfioMode,
        fake::{FakeModules, FakeSysfs, SimulatedKernel},
        vfio_devices,
    },
};

const NODE: &str = "node-1";
const DRIVER: &str = "manager.nvidia.com";
const MOCK: &str = "gpus:\n  - { uuid: GPU-a, name: NVIDIA H100, memoryMiB: 81559, minor: 0 }\n  - { uuid: GPU-b, name: NVIDIA H100, memoryMiB: 81559, minor: 1 }\n  - { uuid: GPU-c, name: NVIDIA H100, memoryMiB: 81559, minor: 2 }\n  - { uuid: GPU-d, name: NVIDIA H100, memoryMiB: 81559, minor: 3 }\n";

/// FM's table for 4 GPUs (modules 1..4 at PCI 01..04): one of 4, two of 2, four of 1.
fn partitions() -> Vec<Partition> {
    let gpu = |m: u32| PartitionGpu {
        physical_id: m,
        uuid: String::new(),
        pci_bus_id: format!("00000000:{m:02X}:00.0"),
    };
    let p = |id: u32, modules: &[u32]| Partition {
        id,
        active: false,
        gpus: modules.iter().map(|&m| gpu(m)).collect(),
    };
    vec![p(0, &[1, 2, 3, 4]), p(1, &[1, 2]), p(2, &[3, 4]), p(3, &[1]), p(4, &[2]), p(5, &[3]), p(6, &[4])]
}

struct Node {
    _dir: tempfile::TempDir,
    config: Arc<DriverConfig>,
    devices: Arc<AllocatableDevices>,
    claims: Arc<InMemoryClaims>,
    fm: Arc<FakeFabricManager>,
    modes: Vec<Arc<dyn ClaimMode>>,
    tree: Option<FakeSysfs>,
}

impl Node {
    /// `fabric`: the gate; `vfio`: also PassthroughSupport (devices and mode); `shares`: ConsumableShares.
    fn new(fabric: bool, vfio: bool, shares: ConsumableShares) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut config = DriverConfig::under(NODE, dir.path());
        vgpu_core::abi::runtime_files::install(&config.manager_dir, &config.library_version, b"").unwrap();
        config.boot_id_path = dir.path().join("boot_id");
        std::fs::write(&config.boot_id_path, "boot-1\n").unwrap();
        let backend = MockBackend::from_yaml_str(MOCK).unwrap();
        let device_config =
            DeviceConfig { vgpu_support: false, consumable_shares: shares, ..DeviceConfig::default() };
        let mut devices = AllocatableDevices::from_backend(&backend, &device_config).unwrap();
        let fm = Arc::new(FakeFabricManager::new(partitions()));
        let mut modes: Vec<Arc<dyn ClaimMode>> = Vec::new();
        let mut tree = None;
        let mut vfio_config = None;
        if vfio {
            let roots = SysfsRoots::under(&dir.path().join("host"));
            let t = FakeSysfs::new(&roots);
            for m in 1..=4u8 {
                t.add_gpu(&format!("0000:{m:02x}:00.0"), 0x2330, &m.to_string(), Some("nvidia")).unwrap();
            }
            for d in vfio_devices(&roots, &devices).unwrap() {
                devices.add(d).unwrap();
            }
            vfio_config = Some(VfioConfig {
                roots: roots.clone(),
                default_driver: "nvidia".into(),
                modules: Arc::new(FakeModules::new(&roots, true)),
                sysfs: Arc::new(SimulatedKernel::new(&roots)),
                proc_root: None,
            });
            tree = Some(t);
        }
        // Start-up order: devices (GPU, then VFIO), FM attributes, then the modes (fabric before vfio).
        if fabric {
            attach_partitions(fm.as_ref(), &mut devices).unwrap();
            modes.push(Arc::new(FabricMode::new(fm.clone(), config.checkpoint_path())));
        }
        if let Some(v) = vfio_config {
            modes.push(Arc::new(VfioMode::new(v, &devices)));
        }
        Self {
            _dir: dir,
            config: Arc::new(config),
            devices: Arc::new(devices),
            claims: Arc::new(InMemoryClaims::default()),
            fm,
            modes,
            tree,
        }
    }

    fn add_claim(&self, name: &str, uid: &str, devices: &[&str], shared: bool) {
        let results = devices
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let share = format!("{uid}-{i}");
                let consumed: &[(&str, &str)] = if shared { &[("memory", "1Gi")] } else { &[] };
                allocation_result(
                    &format!("r{i}"),
                    DRIVER,
                    NODE,
                    d,
                    shared.then_some(share.as_str()),
                    consumed,
                )
            })
            .collect();
        self.claims.insert(allocated(claim("ns", name, uid), results, &["pod-1"]));
    }

    async fn state(&self, hook: Option<FaultHook>) -> DeviceState {
        support::open_state(&self.config, &self.devices, self.claims.clone(), self.modes.clone(), hook).await
    }
}

fn r(name: &str, uid: &str) -> ClaimRef {
    ClaimRef::new("ns", name, uid)
}

#[tokio::test]
async fn gate_off_adds_no_attribute_and_never_calls_fm() {
    let node = Node::new(false, false, ConsumableShares::Disabled);
    assert!(node.devices.iter().all(|d| d.extra.attributes.is_empty()));
    node.add_claim("c1", "uid-1", &["gpu-0", "gpu-2"], false);
    let state = node.state(None).await;
    state.prepare(&[r("c1", "uid-1")]).await.remove("uid-1").unwrap().unwrap();
    state.unprepare(&[r("c1", "uid-1")]).await.remove("uid-1").unwrap().unwrap();
    assert!(node.fm.calls().is_empty());
}

#[tokio::test]
async fn gate_on_publishes_module_ids_and_activates_the_exact_partition() {
    let node = Node::new(true, false, ConsumableShares::Disabled);
    let gpu0 = node.devices.get("gpu-0").unwrap();
    let api = build_device(&SliceConfig::new(NODE), &node.devices, gpu0, &HealthSnapshot::default()).unwrap();
    let attrs = api.attributes.unwrap();
    let int = |k: &str| attrs[k].int;
    assert_eq!(
        (
            int("gpuModuleID"),
            int("partition1"),
            int("partition2"),
            int("partition4"),
            attrs.get("partition8")
        ),
        (Some(1), Some(3), Some(1), Some(0), None)
    );
    assert_eq!(node.devices.get("gpu-3").unwrap().extra.attributes["partition2"], ExtraAttribute::Int(2));

    node.add_claim("c1", "uid-1", &["gpu-1", "gpu-0"], false);
    let state = node.state(None).await;
    state.prepare(&[r("c1", "uid-1")]).await.remove("uid-1").unwrap().unwrap();
    assert_eq!(node.fm.calls(), ["activate 1"]);
    assert_eq!(node.fm.active(), [1]);
    let cp = state.checkpoint().await.unwrap();
    assert_eq!(
        cp.claims()["uid-1"].host_actions[0].action,
        serde_json::json!({"partitionId": 1, "moduleIds": [1, 2], "claimUid": "uid-1"})
    );
    state.unprepare(&[r("c1", "uid-1")]).await.remove("uid-1").unwrap().unwrap();
    assert_eq!(node.fm.calls(), ["activate 1", "deactivate 1"]);
    assert!(node.fm.active().is_empty());
}

#[tokio::test]
async fn no_exact_partition_fails_the_claim_naming_the_partitions() {
    let node = Node::new(true, false, ConsumableShares::Disabled);
    node.add_claim("c1", "uid-1", &["gpu-0", "gpu-2"], false);
    let state = node.state(None).await;
    let err = state.prepare(&[r("c1", "uid-1")]).await.remove("uid-1").unwrap().unwrap_err().to_string();
    assert_eq!(
        err,
        "ResourceClaim ns/c1: fabricManager: no Fabric Manager partition has exactly GPU modules [1,3] (devices gpu-0, gpu-2); partitions: 0 [1,2,3,4], 1 [1,2], 2 [3,4], 3 [1], 4 [2], 5 [3], 6 [4]"
    );
    assert!(node.fm.calls().is_empty());
    assert!(state.checkpoint().await.unwrap().claims().is_empty());
}

#[tokio::test]
async fn apply_and_revert_are_idempotent() {
    let node = Node::new(true, false, ConsumableShares::Disabled);
    node.add_claim("c1", "uid-1", &["gpu-2", "gpu-3"], false);
    let state = node.state(None).await;
    state.prepare(&[r("c1", "uid-1")]).await.remove("uid-1").unwrap().unwrap();
    let recorded = state.checkpoint().await.unwrap().claims()["uid-1"].host_actions[0].action.clone();
    let mode = node.modes[0].clone();
    let object = node.claims.get("ns", "c1").await.unwrap().unwrap();
    let c1 = r("c1", "uid-1");
    let devices: Vec<ClaimDevice> = Vec::new();
    let ctx = ClaimContext { claim: &c1, object: &object, devices: &devices, config: &node.config };
    mode.apply(&ctx, &recorded).unwrap();
    mode.apply(&ctx, &recorded).unwrap();
    assert_eq!(node.fm.calls(), ["activate 2"], "already active: FM is not called again");
    mode.revert(&recorded).unwrap();
    mode.revert(&recorded).unwrap();
    assert_eq!(node.fm.calls(), ["activate 2", "deactivate 2"]);
    // A revert of an action that never ran (partition 5 never activated) calls nothing.
    mode.revert(&serde_json::json!({"partitionId": 5, "moduleIds": [3], "claimUid": "uid-9"})).unwrap();
    assert_eq!(node.fm.calls().len(), 2);
    // Unprepare after the manual revert is still fine.
    state.unprepare(&[c1]).await.remove("uid-1").unwrap().unwrap();
    assert_eq!(node.fm.calls().len(), 2);
}

#[tokio::test]
async fn crash_after_the_activation_then_restart_converges() {
    let node = Node::new(true, false, ConsumableShares::Disabled);
    node.add_claim("c1", "uid-1", &["gpu-0", "gpu-1", "gpu-2", "gpu-3"], false);
    let fired = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&fired);
    let hook: FaultHook =
        Arc::new(move |at, _| at == FaultPoint::AfterHostAction && !flag.swap(true, Ordering::SeqCst));
    let state = node.state(Some(hook)).await;
    let result = state.prepare(&[r("c1", "uid-1")]).await.remove("uid-1").unwrap();
    assert!(matches!(result, Err(ClaimFailure::Injected(FaultPoint::AfterHostAction))));
    assert_eq!(node.fm.active(), [0]);
    assert_eq!(
        state.checkpoint().await.unwrap().claims()["uid-1"].checkpoint_state,
        ClaimState::PrepareStarted
    );
    drop(state);

    let state = node.state(None).await;
    assert!(node.fm.active().is_empty(), "recovery deactivated it");
    assert!(state.checkpoint().await.unwrap().claims().is_empty());
    state.prepare(&[r("c1", "uid-1")]).await.remove("uid-1").unwrap().unwrap();
    assert_eq!(node.fm.active(), [0]);
    assert_eq!(node.fm.calls(), ["activate 0", "deactivate 0", "activate 0"]);
}

#[tokio::test]
async fn a_partition_shared_by_two_claims_stays_active_until_the_last_goes() {
    let node = Node::new(true, false, ConsumableShares::Unlimited);
    node.add_claim("a", "uid-a", &["gpu-0", "gpu-1"], true);
    node.add_claim("b", "uid-b", &["gpu-0", "gpu-1"], true);
    let state = node.state(None).await;
    state.prepare(&[r("a", "uid-a"), r("b", "uid-b")]).await.into_values().for_each(|v| {
        v.unwrap();
    });
    assert_eq!(node.fm.calls(), ["activate 1"]);
    state.unprepare(&[r("a", "uid-a")]).await.remove("uid-a").unwrap().unwrap();
    assert_eq!(node.fm.active(), [1], "claim b still uses it");
    state.unprepare(&[r("b", "uid-b")]).await.remove("uid-b").unwrap().unwrap();
    assert!(node.fm.active().is_empty());
    assert_eq!(node.fm.calls(), ["activate 1", "deactivate 1"]);
}

#[tokio::test]
async fn an_fm_failure_fails_the_claim_and_leaves_nothing() {
    let node = Node::new(true, false, ConsumableShares::Disabled);
    node.add_claim("c1", "uid-1", &["gpu-0"], false);
    let state = node.state(None).await;
    node.fm.fail_next("activate");
    let err = state.prepare(&[r("c1", "uid-1")]).await.remove("uid-1").unwrap().unwrap_err().to_string();
    assert!(
        err.contains("fabricManager: activate partition 3: fabric manager: activate: injected failure"),
        "{err}"
    );
    assert!(node.fm.active().is_empty());
    assert!(state.checkpoint().await.unwrap().claims().is_empty());
    state.prepare(&[r("c1", "uid-1")]).await.remove("uid-1").unwrap().unwrap();
    assert_eq!(node.fm.active(), [3]);
}

#[tokio::test]
async fn with_passthrough_the_vfio_devices_get_the_partition() {
    let node = Node::new(true, true, ConsumableShares::Disabled);
    let tree = node.tree.as_ref().unwrap();
    assert_eq!(
        node.devices.get("gpu-vfio-2").unwrap().extra.attributes["gpuModuleID"],
        ExtraAttribute::Int(3)
    );
    node.add_claim("vm", "uid-vm", &["gpu-vfio-2", "gpu-vfio-3"], false);
    let state = node.state(None).await;
    state.prepare(&[r("vm", "uid-vm")]).await.remove("uid-vm").unwrap().unwrap();
    assert_eq!(node.fm.active(), [2]);
    assert_eq!(
        (tree.driver("0000:03:00.0"), tree.driver("0000:04:00.0")),
        ("vfio-pci".into(), "vfio-pci".into())
    );
    let modes: Vec<String> = state.checkpoint().await.unwrap().claims()["uid-vm"]
        .host_actions
        .iter()
        .map(|h| h.mode.clone())
        .collect();
    assert_eq!(modes, ["fabricManager", "vfio", "vfio"]);
    state.unprepare(&[r("vm", "uid-vm")]).await.remove("uid-vm").unwrap().unwrap();
    assert!(node.fm.active().is_empty());
    assert_eq!(
        (tree.driver("0000:03:00.0"), tree.driver("0000:04:00.0")),
        ("nvidia".into(), "nvidia".into())
    );
}

#[tokio::test]
async fn vgpu_devices_carry_the_attributes_but_never_activate() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = DriverConfig::under(NODE, dir.path());
    vgpu_core::abi::runtime_files::install(&config.manager_dir, &config.library_version, b"").unwrap();
    config.boot_id_path = dir.path().join("boot_id");
    std::fs::write(&config.boot_id_path, "boot-1\n").unwrap();
    let backend = MockBackend::from_yaml_str(MOCK).unwrap();
    let mut devices = AllocatableDevices::from_backend(&backend, &DeviceConfig::default()).unwrap();
    let fm = Arc::new(FakeFabricManager::new(partitions()));
    attach_partitions(fm.as_ref(), &mut devices).unwrap();
    assert_eq!(devices.get("vgpu-1").unwrap().extra.attributes["gpuModuleID"], ExtraAttribute::Int(2));
    let claims = Arc::new(InMemoryClaims::default());
    let share =
        allocation_result("gpu", DRIVER, NODE, "vgpu-1", Some("s1"), &[("cores", "10"), ("memory", "1Gi")]);
    claims.insert(allocated(claim("ns", "c1", "uid-1"), vec![share], &["pod-1"]));
    let modes: Vec<Arc<dyn ClaimMode>> =
        vec![Arc::new(FabricMode::new(fm.clone(), config.checkpoint_path()))];
    let state =
        DeviceState::with_modes(Arc::new(config), Arc::new(devices), Arc::new(NvidiaAdapter), claims, modes)
            .await
            .unwrap();
    state.prepare(&[r("c1", "uid-1")]).await.remove("uid-1").unwrap().unwrap();
    assert!(fm.calls().is_empty());
    assert!(state.checkpoint().await.unwrap().claims()["uid-1"].host_actions.is_empty());
}
