//! Gate `PassthroughSupport` end to end at the state layer: [`DeviceState::with_modes`] with the
//! [`VfioMode`] over real files in a temporary directory (checkpoint, CDI specs) and a fake sysfs tree
//! ([`FakeSysfs`]) whose bind files are acted on by the [`SimulatedKernel`]; every host action is observed
//! there (the driver links and the recorded writes), never on the real host. Gate off vs on, idempotent
//! apply/revert, a crash after the first host action followed by a restart, the GPU-overlap rule, the IOMMU
//! group check and failure rollbacks.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::{Arc, atomic::Ordering};

use vgpu_core::backend::mock::MockBackend;
use vgpu_core::cdi::Spec;
use vgpu_core::dra::DeviceType;
use vgpu_dra::claims::ClaimRef;
use vgpu_dra::{
    checkpoint::ClaimState,
    claims::{ClaimSource, InMemoryClaims, allocated, allocation_result, claim},
    config::DriverConfig,
    devices::AllocatableDevices,
    devices::DeviceConfig,
    health::HealthSnapshot,
    modes::{ClaimContext, ClaimDevice, ClaimMode},
    slices::{SliceConfig, build_device},
    state::{
        DeviceState,
        error::ClaimFailure,
        fault::{FaultHook, FaultPoint},
    },
    vfio::{
        SysfsRoots, VfioConfig, VfioError, VfioMode,
        fake::{FakeModules, FakeSysfs, SimulatedKernel},
        vfio_devices,
    },
};

const NODE: &str = "node-1";
const DRIVER: &str = "manager.nvidia.com";
const GPU0: &str = "0000:01:00.0";
const GPU1: &str = "0000:02:00.0";
const MOCK: &str = "gpus:\n  - { uuid: GPU-a, name: NVIDIA H100 80GB HBM3, memoryMiB: 81559, minor: 0 }\n  - { uuid: GPU-b, name: NVIDIA H100 80GB HBM3, memoryMiB: 81559, minor: 1 }\n";

struct Node {
    dir: tempfile::TempDir,
    config: Arc<DriverConfig>,
    devices: Arc<AllocatableDevices>,
    claims: Arc<InMemoryClaims>,
    tree: FakeSysfs,
    kernel: Arc<SimulatedKernel>,
    modules: Arc<FakeModules>,
    mode: Option<Arc<VfioMode>>,
}

/// The sysfs tree every test starts from: two GPUs on `nvidia` in IOMMU groups 1 and 2, GPU 0's audio
/// function (unbound) in group 1, `vfio-pci` not loaded.
fn tree(roots: &SysfsRoots) -> FakeSysfs {
    let tree = FakeSysfs::new(roots);
    tree.add_gpu(GPU0, 0x2330, "1", Some("nvidia")).unwrap();
    tree.add_gpu(GPU1, 0x2330, "2", Some("nvidia")).unwrap();
    tree.add_device("0000:01:00.1", 0x10de, 0x22a3, 0x040300, "1", None, "").unwrap();
    tree
}

impl Node {
    fn new(passthrough: bool) -> Self {
        Self::with(passthrough, |_| {})
    }

    fn with(passthrough: bool, adjust: impl FnOnce(&FakeSysfs)) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut config = DriverConfig::under(NODE, dir.path());
        config.boot_id_path = dir.path().join("boot_id");
        std::fs::write(&config.boot_id_path, "boot-1\n").unwrap();
        let roots = SysfsRoots::under(&dir.path().join("host"));
        let tree = tree(&roots);
        adjust(&tree);
        let backend = MockBackend::from_yaml_str(MOCK).unwrap();
        let device_config = DeviceConfig { vgpu_support: false, ..DeviceConfig::default() };
        let mut devices = AllocatableDevices::from_backend(&backend, &device_config).unwrap();
        let kernel = Arc::new(SimulatedKernel::new(&roots));
        let modules = Arc::new(FakeModules::new(&roots, true));
        let mut mode = None;
        if passthrough {
            for device in vfio_devices(&roots, &devices).unwrap() {
                devices.add(device).unwrap();
            }
            let vfio = VfioConfig {
                roots: roots.clone(),
                default_driver: "nvidia".into(),
                modules: modules.clone(),
                sysfs: kernel.clone(),
                proc_root: Some(roots.host_root.join("proc")),
            };
            mode = Some(Arc::new(VfioMode::new(vfio, &devices)));
        }
        Self {
            dir,
            config: Arc::new(config),
            devices: Arc::new(devices),
            claims: Arc::new(InMemoryClaims::default()),
            tree,
            kernel,
            modules,
            mode,
        }
    }

    fn add_claim(&self, name: &str, uid: &str, devices: &[&str]) {
        let results = devices
            .iter()
            .enumerate()
            .map(|(i, d)| allocation_result(&format!("r{i}"), DRIVER, NODE, d, None, &[]))
            .collect();
        self.claims.insert(allocated(claim("ns", name, uid), results, &["pod-1"]));
    }

    async fn state(&self, hook: Option<FaultHook>) -> DeviceState {
        let modes: Vec<Arc<dyn ClaimMode>> =
            self.mode.iter().map(|m| m.clone() as Arc<dyn ClaimMode>).collect();
        support::open_state(&self.config, &self.devices, self.claims.clone(), modes, hook).await
    }

    fn spec(&self, uid: &str) -> Spec {
        serde_json::from_slice(&std::fs::read(self.config.cdi_spec_path(uid)).unwrap()).unwrap()
    }

    fn writes(&self) -> Vec<(String, String)> {
        self.kernel.writes()
    }
}

fn node_paths(edits: &vgpu_core::cdi::ContainerEdits) -> Vec<&str> {
    edits.device_nodes.iter().map(|n| n.path.as_str()).collect()
}

fn bind_writes(bus: &str) -> Vec<(String, String)> {
    vec![
        (format!("bus/pci/devices/{bus}/driver_override"), "vfio-pci".into()),
        (format!("bus/pci/devices/{bus}/driver/unbind"), bus.into()),
        ("bus/pci/drivers/vfio-pci/bind".into(), bus.into()),
    ]
}

fn rebind_writes(bus: &str, to: &str) -> Vec<(String, String)> {
    vec![
        (format!("bus/pci/devices/{bus}/driver_override"), "\n".into()),
        (format!("bus/pci/devices/{bus}/driver/unbind"), bus.into()),
        (format!("bus/pci/drivers/{to}/bind"), bus.into()),
    ]
}

#[tokio::test]
async fn gate_off_publishes_no_vfio_device_and_touches_no_driver() {
    let node = Node::new(false);
    let names: Vec<&str> = node.devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["gpu-0", "gpu-1"]);
    node.add_claim("c1", "uid-1", &["gpu-0"]);
    let state = node.state(None).await;
    state.prepare(&[ClaimRef::new("ns", "c1", "uid-1")]).await.remove("uid-1").unwrap().unwrap();
    assert!(node.writes().is_empty());
    assert_eq!(node.tree.driver(GPU0), "nvidia");
    let spec = node.spec("uid-1");
    assert_eq!(node_paths(&spec.devices[0].container_edits), ["/dev/nvidia0"]);
    assert!(state.checkpoint().await.unwrap().claims()["uid-1"].host_actions.is_empty());
    // A VFIO device name is unknown without the gate.
    node.add_claim("c2", "uid-2", &["gpu-vfio-0"]);
    let err =
        state.prepare(&[ClaimRef::new("ns", "c2", "uid-2")]).await.remove("uid-2").unwrap().unwrap_err();
    assert!(err.to_string().contains("unknown device \"gpu-vfio-0\""), "{err}");
}

#[tokio::test]
async fn gate_on_publishes_vfio_devices_and_binds_on_prepare() {
    let node = Node::new(true);
    let names: Vec<&str> = node.devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["gpu-0", "gpu-1", "gpu-vfio-0", "gpu-vfio-1"]);
    let vfio = node.devices.get("gpu-vfio-0").unwrap();
    assert_eq!((vfio.kind, vfio.gpu.uuid.as_str(), vfio.gpu.minor), (DeviceType::Vfio, "GPU-a", 0));
    let api = build_device(&SliceConfig::new(NODE), &node.devices, vfio, &HealthSnapshot::default()).unwrap();
    let attrs = api.attributes.unwrap();
    let s = |k: &str| attrs[k].string.clone().unwrap();
    assert_eq!(s("type"), "vfio");
    assert_eq!(s("uuid"), vgpu_dra::vfio::uuid_v5_dns(GPU0));
    assert_eq!((s("deviceID"), s("vendorID")), ("0x2330".into(), "0x10de".into()));
    assert_eq!(s("productName"), "NVIDIA H100 80GB HBM3");
    assert_eq!(attrs["iommuFDEnabled"].bool, Some(false));
    assert_eq!(api.capacity.unwrap()["addressableMemory"].value.0, "32Gi");

    node.add_claim("c1", "uid-1", &["gpu-vfio-0"]);
    let state = node.state(None).await;
    let c1 = ClaimRef::new("ns", "c1", "uid-1");
    let prepared = state.prepare(std::slice::from_ref(&c1)).await.remove("uid-1").unwrap().unwrap();
    assert_eq!(prepared[0].device_name, "gpu-vfio-0");
    assert_eq!(node.tree.driver(GPU0), "vfio-pci");
    assert_eq!(node.tree.driver(GPU1), "nvidia");
    assert_eq!(node.modules.loads(), ["vfio-pci"]);
    assert_eq!(node.writes(), bind_writes(GPU0));
    let spec = node.spec("uid-1");
    assert_eq!(node_paths(&spec.container_edits), ["/dev/vfio/vfio"]);
    assert!(spec.container_edits.env.contains(&"NVIDIA_VISIBLE_DEVICES=void".to_owned()));
    assert_eq!(
        node_paths(&spec.devices[0].container_edits),
        ["/dev/vfio/1"],
        "no /dev/nvidia0 for a VFIO device"
    );
    let cp = state.checkpoint().await.unwrap();
    let actions = &cp.claims()["uid-1"].host_actions;
    assert_eq!(actions.len(), 1);
    assert_eq!(
        actions[0].action,
        serde_json::json!({"device": "gpu-vfio-0", "busId": GPU0, "originalDriver": "nvidia", "iommuGroup": "1", "common": true})
    );

    node.kernel.clear();
    state.unprepare(&[c1]).await.remove("uid-1").unwrap().unwrap();
    assert_eq!(node.tree.driver(GPU0), "nvidia");
    assert_eq!(node.tree.driver_override(GPU0), "(null)");
    assert_eq!(node.writes(), rebind_writes(GPU0, "nvidia"));
    assert!(!node.config.cdi_spec_path("uid-1").exists());
}

#[tokio::test]
async fn apply_and_revert_are_idempotent() {
    let node = Node::new(true);
    node.add_claim("c1", "uid-1", &["gpu-vfio-1"]);
    let state = node.state(None).await;
    let c1 = ClaimRef::new("ns", "c1", "uid-1");
    state.prepare(std::slice::from_ref(&c1)).await.remove("uid-1").unwrap().unwrap();
    let recorded = state.checkpoint().await.unwrap().claims()["uid-1"].host_actions[0].action.clone();
    let mode = node.mode.clone().unwrap();
    let object = node.claims.get("ns", "c1").await.unwrap().unwrap();
    let device = node.devices.get("gpu-vfio-1").unwrap().clone();
    let devices = [ClaimDevice {
        request: "r0".into(),
        device,
        share_id: None,
        cdi_name: "uid-1-r0-gpu-vfio-1-0".into(),
    }];
    let ctx = ClaimContext { claim: &c1, object: &object, devices: &devices, config: &node.config };
    node.kernel.clear();
    let first = mode.apply(&ctx, &recorded).unwrap();
    let again = mode.apply(&ctx, &recorded).unwrap();
    assert_eq!(first, again);
    assert!(node.writes().is_empty(), "already on vfio-pci: nothing written");
    assert_eq!(node_paths(&first.devices["uid-1-r0-gpu-vfio-1-0"]), ["/dev/vfio/2"]);

    mode.revert(&recorded).unwrap();
    assert_eq!(node.writes(), rebind_writes(GPU1, "nvidia"));
    node.kernel.clear();
    mode.revert(&recorded).unwrap();
    assert!(node.writes().is_empty(), "already back on nvidia: nothing written");
    assert_eq!(node.tree.driver(GPU1), "nvidia");
    // Revert of an action that never ran is fine too (GPU 0 was never bound).
    let never = serde_json::json!({"device": "gpu-vfio-0", "busId": GPU0, "originalDriver": "nvidia", "iommuGroup": "1", "common": true});
    mode.revert(&never).unwrap();
    assert!(node.writes().is_empty());
    // Unprepare after the manual revert still succeeds.
    state.unprepare(&[c1]).await.remove("uid-1").unwrap().unwrap();
}

#[tokio::test]
async fn crash_after_the_first_bind_then_restart_converges() {
    let node = Node::new(true);
    node.add_claim("c1", "uid-1", &["gpu-vfio-0", "gpu-vfio-1"]);
    let c1 = ClaimRef::new("ns", "c1", "uid-1");
    let (hook, fired) = support::crash_once(FaultPoint::AfterHostAction);
    let state = node.state(Some(hook)).await;
    let result = state.prepare(std::slice::from_ref(&c1)).await.remove("uid-1").unwrap();
    assert!(fired.load(Ordering::SeqCst));
    assert!(matches!(result, Err(ClaimFailure::Injected(FaultPoint::AfterHostAction))));
    // What the crash leaves: GPU 0 on vfio-pci, GPU 1 untouched, the started entry with both actions.
    assert_eq!((node.tree.driver(GPU0).as_str(), node.tree.driver(GPU1).as_str()), ("vfio-pci", "nvidia"));
    let cp = state.checkpoint().await.unwrap();
    assert_eq!(cp.claims()["uid-1"].checkpoint_state, ClaimState::PrepareStarted);
    assert_eq!(cp.claims()["uid-1"].host_actions.len(), 2);
    drop(state);

    // Restart: recovery reverts both actions (the unapplied one is a no-op).
    node.kernel.clear();
    let state = node.state(None).await;
    assert!(state.checkpoint().await.unwrap().claims().is_empty());
    assert_eq!((node.tree.driver(GPU0).as_str(), node.tree.driver(GPU1).as_str()), ("nvidia", "nvidia"));
    assert_eq!(node.tree.driver_override(GPU0), "(null)");
    assert_eq!(node.writes(), rebind_writes(GPU0, "nvidia"));

    // A fresh Prepare binds both.
    let devices = state.prepare(std::slice::from_ref(&c1)).await.remove("uid-1").unwrap().unwrap();
    assert_eq!(devices.len(), 2);
    assert_eq!((node.tree.driver(GPU0).as_str(), node.tree.driver(GPU1).as_str()), ("vfio-pci", "vfio-pci"));
    let spec = node.spec("uid-1");
    assert_eq!(node_paths(&spec.container_edits), ["/dev/vfio/vfio"], "claim-wide nodes once");
    let per_device: Vec<Vec<&str>> = spec.devices.iter().map(|d| node_paths(&d.container_edits)).collect();
    assert_eq!(per_device, [["/dev/vfio/1"], ["/dev/vfio/2"]]);
}

#[tokio::test]
async fn a_gpu_is_never_prepared_both_ways() {
    let node = Node::new(true);
    node.add_claim("a", "uid-a", &["gpu-0"]);
    node.add_claim("b", "uid-b", &["gpu-vfio-0"]);
    node.add_claim("c", "uid-c", &["gpu-vfio-1"]);
    node.add_claim("d", "uid-d", &["gpu-1"]);
    node.add_claim("e", "uid-e", &["gpu-1", "gpu-vfio-1"]);
    let state = node.state(None).await;
    let r = |n: &str, u: &str| ClaimRef::new("ns", n, u);
    state.prepare(&[r("a", "uid-a")]).await.remove("uid-a").unwrap().unwrap();
    let err = state.prepare(&[r("b", "uid-b")]).await.remove("uid-b").unwrap().unwrap_err().to_string();
    assert!(
        err.contains(
            "device gpu-vfio-0 is GPU 0000:01:00.0 which is prepared as gpu-0 for claim ns/a (uid-a)"
        ),
        "{err}"
    );
    assert_eq!(node.tree.driver(GPU0), "nvidia");

    let err = state.prepare(&[r("e", "uid-e")]).await.remove("uid-e").unwrap().unwrap_err().to_string();
    assert!(err.contains("devices gpu-1 and gpu-vfio-1 are the same GPU"), "{err}");

    state.prepare(&[r("c", "uid-c")]).await.remove("uid-c").unwrap().unwrap();
    let err = state.prepare(&[r("d", "uid-d")]).await.remove("uid-d").unwrap().unwrap_err().to_string();
    assert!(
        err.contains(
            "device gpu-1 is GPU 0000:02:00.0 which is prepared as gpu-vfio-1 for claim ns/c (uid-c)"
        ),
        "{err}"
    );
    let cp = state.checkpoint().await.unwrap();
    assert_eq!(cp.claims().keys().collect::<Vec<_>>(), ["uid-a", "uid-c"]);

    // Once the passthrough claim is gone, the GPU can be used through its driver again.
    state.unprepare(&[r("c", "uid-c")]).await.remove("uid-c").unwrap().unwrap();
    state.prepare(&[r("d", "uid-d")]).await.remove("uid-d").unwrap().unwrap();
}

#[tokio::test]
async fn a_busy_iommu_group_fails_the_claim_and_leaves_the_gpu() {
    let node = Node::with(true, |tree| {
        tree.add_device("0000:01:00.2", 0x10de, 0x1ad6, 0x0c0330, "1", Some("xhci_hcd"), "").unwrap();
        tree.add_device("0000:00:01.0", 0x8086, 0x1901, 0x060400, "1", Some("pcieport"), "").unwrap();
    });
    node.add_claim("c1", "uid-1", &["gpu-vfio-0"]);
    let state = node.state(None).await;
    let err =
        state.prepare(&[ClaimRef::new("ns", "c1", "uid-1")]).await.remove("uid-1").unwrap().unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains(
            "IOMMU group 1 is not viable for passthrough: its device 0000:01:00.2 is bound to xhci_hcd"
        ),
        "{text}"
    );
    assert!(!text.contains("0000:00:01.0"), "a bridge is fine: {text}");
    assert_eq!(node.tree.driver(GPU0), "nvidia");
    assert!(!node.writes().iter().any(|(p, _)| p.ends_with("bind")), "{:?}", node.writes());
    assert!(state.checkpoint().await.unwrap().claims().is_empty());
}

#[tokio::test]
async fn a_failed_bind_is_rolled_back_to_the_original_driver() {
    let node = Node::new(true);
    node.add_claim("c1", "uid-1", &["gpu-vfio-0"]);
    let state = node.state(None).await;
    node.kernel.fail_next("drivers/vfio-pci/bind");
    let err =
        state.prepare(&[ClaimRef::new("ns", "c1", "uid-1")]).await.remove("uid-1").unwrap().unwrap_err();
    assert!(err.to_string().contains("bind 0000:01:00.0 to vfio-pci"), "{err}");
    assert_eq!(node.tree.driver(GPU0), "nvidia", "rollback bound it back");
    assert_eq!(node.tree.driver_override(GPU0), "(null)");
    assert!(state.checkpoint().await.unwrap().claims().is_empty());
    // The next try works.
    state.prepare(&[ClaimRef::new("ns", "c1", "uid-1")]).await.remove("uid-1").unwrap().unwrap();
    assert_eq!(node.tree.driver(GPU0), "vfio-pci");
}

#[tokio::test]
async fn an_unloadable_module_or_a_foreign_driver_fails_with_nothing_done() {
    let node = Node::with(true, |tree| {
        // GPU 1 on nouveau.
        let link = tree.roots().pci_device(GPU1).join("driver");
        std::fs::remove_file(&link).unwrap();
        tree.add_driver("nouveau").unwrap();
        std::os::unix::fs::symlink(tree.roots().pci_driver("nouveau"), link).unwrap();
    });
    node.add_claim("c2", "uid-2", &["gpu-vfio-1"]);
    let state = node.state(None).await;
    let err =
        state.prepare(&[ClaimRef::new("ns", "c2", "uid-2")]).await.remove("uid-2").unwrap().unwrap_err();
    assert!(
        err.to_string().contains(
            "gpu-vfio-1: GPU 0000:02:00.0 is bound to driver nouveau; only GPUs on nvidia or vfio-pci"
        ),
        "{err}"
    );
    assert!(node.writes().is_empty());

    let dir = tempfile::tempdir().unwrap();
    let roots = SysfsRoots::under(dir.path());
    let _tree = tree(&roots);
    let modules = Arc::new(FakeModules::new(&roots, false));
    let mut devices = AllocatableDevices::from_backend(
        &MockBackend::from_yaml_str(MOCK).unwrap(),
        &DeviceConfig { vgpu_support: false, ..DeviceConfig::default() },
    )
    .unwrap();
    for d in vfio_devices(&roots, &devices).unwrap() {
        devices.add(d).unwrap();
    }
    let kernel = Arc::new(SimulatedKernel::new(&roots));
    let config = VfioConfig {
        roots: roots.clone(),
        default_driver: "nvidia".into(),
        modules,
        sysfs: kernel.clone(),
        proc_root: None,
    };
    let mode = VfioMode::new(config, &devices);
    let action = serde_json::json!({"device": "gpu-vfio-0", "busId": GPU0, "originalDriver": "nvidia", "iommuGroup": "1", "common": true});
    let c = ClaimRef::new("ns", "c", "uid");
    let object = claim("ns", "c", "uid");
    let driver_config = DriverConfig::under(NODE, dir.path());
    let ctx = ClaimContext { claim: &c, object: &object, devices: &[], config: &driver_config };
    let err = mode.apply(&ctx, &action).unwrap_err().to_string();
    assert!(err.contains("load kernel module vfio-pci: modprobe: FATAL: Module vfio-pci not found"), "{err}");
    assert!(kernel.writes().is_empty());
}

#[test]
fn discovery_needs_the_iommu_and_reads_iommufd() {
    let dir = tempfile::tempdir().unwrap();
    let roots = SysfsRoots::under(dir.path());
    let devices = AllocatableDevices::from_backend(
        &MockBackend::from_yaml_str(MOCK).unwrap(),
        &DeviceConfig { vgpu_support: false, ..DeviceConfig::default() },
    )
    .unwrap();
    let err = vfio_devices(&roots, &devices).unwrap_err();
    assert!(matches!(err, VfioError::IommuDisabled(_)));
    assert!(err.to_string().contains("feature gate PassthroughSupport needs the IOMMU"), "{err}");

    let tree = tree(&roots);
    // A GPU NVML does not see (already on vfio-pci), numbered after the others by address.
    tree.add_driver("vfio-pci").unwrap();
    tree.add_gpu("0000:c1:00.0", 0x20b5, "9", Some("vfio-pci")).unwrap();
    // Not GPUs: an NVSwitch bridge function and another vendor's device.
    tree.add_device("0000:05:00.0", 0x10de, 0x22a4, 0x068000, "5", None, "").unwrap();
    tree.add_device("0000:06:00.0", 0x8086, 0x0b60, 0x030200, "6", None, "").unwrap();
    std::fs::create_dir_all(roots.host_root.join("dev")).unwrap();
    std::fs::write(roots.dev_iommu(), "").unwrap();
    let vfio = vfio_devices(&roots, &devices).unwrap();
    let names: Vec<(&str, &str)> = vfio.iter().map(|d| (d.name.as_str(), d.gpu.bus_id.as_str())).collect();
    assert_eq!(names, [("gpu-vfio-0", GPU0), ("gpu-vfio-1", GPU1), ("gpu-vfio-2", "0000:c1:00.0")]);
    let orphan = &vfio[2];
    assert_eq!((orphan.gpu.minor, orphan.gpu.product_name.as_str()), (u32::MAX, "NVIDIA PCI device 0x20b5"));
    assert_eq!(orphan.gpu.uuid, vgpu_dra::vfio::uuid_v5_dns("0000:c1:00.0"));
    assert!(
        vfio.iter()
            .all(|d| d.extra.attributes["iommuFDEnabled"] == vgpu_dra::devices::ExtraAttribute::Bool(true))
    );
}

#[tokio::test]
async fn iommufd_adds_its_nodes() {
    let node = Node::with(true, |tree| {
        let roots = tree.roots();
        std::fs::create_dir_all(roots.host_root.join("dev")).unwrap();
        std::fs::write(roots.dev_iommu(), "").unwrap();
        std::fs::create_dir_all(roots.pci_device(GPU0).join("vfio-dev/vfio3")).unwrap();
    });
    assert!(node.dir.path().exists());
    node.add_claim("c1", "uid-1", &["gpu-vfio-0"]);
    let state = node.state(None).await;
    state.prepare(&[ClaimRef::new("ns", "c1", "uid-1")]).await.remove("uid-1").unwrap().unwrap();
    let spec = node.spec("uid-1");
    assert_eq!(node_paths(&spec.container_edits), ["/dev/vfio/vfio", "/dev/iommu"]);
    assert_eq!(node_paths(&spec.devices[0].container_edits), ["/dev/vfio/1", "/dev/vfio/devices/vfio3"]);
}

#[tokio::test]
async fn a_gpu_in_use_is_not_unbound() {
    let node = Node::with(true, |tree| {
        let proc_root = tree.roots().host_root.join("proc");
        for (pid, comm, target) in
            [("4242", "nvidia-persiste", "/dev/nvidia0"), ("77", "python", "/dev/nvidia1")]
        {
            std::fs::create_dir_all(proc_root.join(pid).join("fd")).unwrap();
            std::fs::write(proc_root.join(pid).join("comm"), format!("{comm}\n")).unwrap();
            std::os::unix::fs::symlink(target, proc_root.join(pid).join("fd/7")).unwrap();
        }
        std::fs::create_dir_all(proc_root.join("self")).unwrap();
    });
    node.add_claim("c1", "uid-1", &["gpu-vfio-0"]);
    let state = node.state(None).await;
    let c1 = ClaimRef::new("ns", "c1", "uid-1");
    let err =
        state.prepare(std::slice::from_ref(&c1)).await.remove("uid-1").unwrap().unwrap_err().to_string();
    assert!(
        err.contains(
            "gpu-vfio-0: GPU 0000:01:00.0 is in use: /dev/nvidia0 is open in PIDs 4242 (nvidia-persiste)"
        ),
        "{err}"
    );
    assert_eq!(node.tree.driver(GPU0), "nvidia");
    assert!(node.writes().iter().all(|(p, _)| !p.ends_with("bind")), "{:?}", node.writes());
    assert!(node.modules.loads().is_empty(), "refused before anything");
    // The process exits: the next Prepare binds.
    std::fs::remove_file(node.dir.path().join("host/proc/4242/fd/7")).unwrap();
    state.prepare(&[c1]).await.remove("uid-1").unwrap().unwrap();
    assert_eq!(node.tree.driver(GPU0), "vfio-pci");
}
