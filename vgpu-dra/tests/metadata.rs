//! Gate `DeviceMetadata` end to end at the state layer: [`DeviceState::with_modes`] with the [`VfioMode`]
//! (fake sysfs, as in `tests/vfio.rs`) and the [`MetadataMode`] over real files in a temporary directory.
//! Checks the KEP-5304 files written under the claim directory (content, atomic rewrite, in-container
//! paths for named and template claims), the read-only CDI mounts, idempotent apply/revert, and crashes
//! between `PrepareStarted` and `PrepareCompleted` followed by a restart.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::Arc;

use vgpu_core::backend::mock::MockBackend;
use vgpu_core::cdi::Spec;
use vgpu_dra::claims::ClaimRef;
use vgpu_dra::{
    claims::{ClaimSource, InMemoryClaims, allocated, allocation_result, claim},
    config::DriverConfig,
    devices::{AllocatableDevices, DeviceConfig},
    metadata::{MetadataConfig, MetadataMode},
    modes::{ClaimContext, ClaimDevice, ClaimMode},
    slices::SliceConfig,
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
const MOCK: &str = "gpus:\n  - { uuid: GPU-a, name: NVIDIA A100, memoryMiB: 40960, minor: 0 }\n  - { uuid: GPU-b, name: NVIDIA A100, memoryMiB: 40960, minor: 1 }\n  - { uuid: GPU-c, name: NVIDIA A100, memoryMiB: 40960, minor: 2 }\n";
const FILE: &str = "manager.nvidia.com-metadata.json";

struct Node {
    _dir: tempfile::TempDir,
    config: Arc<DriverConfig>,
    claims: Arc<InMemoryClaims>,
    tree: FakeSysfs,
    devices: Arc<AllocatableDevices>,
    vfio: Arc<VfioMode>,
    metadata: Option<Arc<MetadataMode>>,
}

impl Node {
    fn new(metadata: bool) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut config = DriverConfig::under(NODE, dir.path());
        config.boot_id_path = dir.path().join("boot_id");
        // The host sees the manager directory elsewhere than this process: the mounts use the host's path.
        config.host_manager_dir = "/etc/vgpu-manager".into();
        std::fs::write(&config.boot_id_path, "boot-1\n").unwrap();
        let roots = SysfsRoots::under(&dir.path().join("host"));
        let tree = FakeSysfs::new(&roots);
        tree.add_gpu("0000:01:00.0", 0x20b0, "1", Some("nvidia")).unwrap();
        tree.add_gpu("0000:02:00.0", 0x20b0, "2", Some("nvidia")).unwrap();
        let backend = MockBackend::from_yaml_str(MOCK).unwrap();
        let mut devices = AllocatableDevices::from_backend(
            &backend,
            &DeviceConfig { vgpu_support: false, ..DeviceConfig::default() },
        )
        .unwrap();
        for d in vfio_devices(&roots, &devices).unwrap() {
            devices.add(d).unwrap();
        }
        let vfio = Arc::new(VfioMode::new(
            VfioConfig {
                roots: roots.clone(),
                default_driver: "nvidia".into(),
                modules: Arc::new(FakeModules::new(&roots, true)),
                sysfs: Arc::new(SimulatedKernel::new(&roots)),
                proc_root: None,
            },
            &devices,
        ));
        let devices = Arc::new(devices);
        let metadata = metadata.then(|| {
            Arc::new(MetadataMode::new(MetadataConfig {
                slice: SliceConfig::new(NODE),
                devices: Arc::clone(&devices),
            }))
        });
        Self {
            _dir: dir,
            config: Arc::new(config),
            claims: Arc::new(InMemoryClaims::default()),
            tree,
            devices,
            vfio,
            metadata,
        }
    }

    /// Claim `ns/<name>` with one result per `(request, device)`.
    fn add_claim(&self, name: &str, uid: &str, results: &[(&str, &str)], pod_claim_name: Option<&str>) {
        let results =
            results.iter().map(|(req, dev)| allocation_result(req, DRIVER, NODE, dev, None, &[])).collect();
        let mut object = allocated(claim("ns", name, uid), results, &["pod-1"]);
        if let Some(pod) = pod_claim_name {
            object.metadata.annotations =
                Some([("resource.kubernetes.io/pod-claim-name".to_owned(), pod.to_owned())].into());
        }
        self.claims.insert(object);
    }

    fn modes(&self) -> Vec<Arc<dyn ClaimMode>> {
        let mut modes: Vec<Arc<dyn ClaimMode>> = vec![self.vfio.clone()];
        if let Some(m) = &self.metadata {
            modes.push(m.clone());
        }
        modes
    }

    async fn state(&self, modes: Vec<Arc<dyn ClaimMode>>, hook: Option<FaultHook>) -> DeviceState {
        support::open_state(&self.config, &self.devices, self.claims.clone(), modes, hook).await
    }

    fn file(&self, uid: &str, request: &str) -> std::path::PathBuf {
        self.config.claim_dir(uid).join("device-metadata").join(request).join(FILE)
    }

    fn spec(&self, uid: &str) -> Spec {
        serde_json::from_slice(&std::fs::read(self.config.cdi_spec_path(uid)).unwrap()).unwrap()
    }
}

#[tokio::test]
async fn gate_off_writes_no_metadata() {
    let node = Node::new(false);
    node.add_claim("vm", "uid-1", &[("gpu", "gpu-vfio-0")], None);
    let state = node.state(node.modes(), None).await;
    state.prepare(&[ClaimRef::new("ns", "vm", "uid-1")]).await.remove("uid-1").unwrap().unwrap();
    assert!(!node.config.claim_dir("uid-1").exists());
    assert!(node.spec("uid-1").devices.iter().all(|d| d.container_edits.mounts.is_empty()));
}

#[tokio::test]
async fn gate_on_writes_kep_5304_files_and_mounts_them_read_only() {
    let node = Node::new(true);
    node.add_claim("vm", "uid-1", &[("gpu", "gpu-vfio-0"), ("gpu", "gpu-vfio-1"), ("other", "gpu-2")], None);
    let state = node.state(node.modes(), None).await;
    let vm = ClaimRef::new("ns", "vm", "uid-1");
    state.prepare(std::slice::from_ref(&vm)).await.remove("uid-1").unwrap().unwrap();

    let text = std::fs::read_to_string(node.file("uid-1", "gpu")).unwrap();
    assert!(text.ends_with('\n'), "a JSON stream of one object per version");
    let doc: serde_json::Value = serde_json::from_str(text.trim_end()).unwrap();
    assert_eq!(doc["apiVersion"], "metadata.resource.k8s.io/v1alpha1");
    assert_eq!(doc["kind"], "DeviceMetadata");
    assert_eq!(
        doc["metadata"],
        serde_json::json!({"name": "vm", "namespace": "ns", "uid": "uid-1", "generation": 1})
    );
    assert!(doc.get("podClaimName").is_none());
    let request = &doc["requests"][0];
    assert_eq!(request["name"], "gpu");
    let names: Vec<&str> =
        request["devices"].as_array().unwrap().iter().map(|d| d["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["gpu-vfio-0", "gpu-vfio-1"]);
    let dev = &request["devices"][0];
    assert_eq!((dev["driver"].as_str(), dev["pool"].as_str()), (Some(DRIVER), Some(NODE)));
    assert_eq!(dev["attributes"]["type"], serde_json::json!({"string": "vfio"}));
    assert_eq!(
        dev["attributes"]["resource.kubernetes.io/pciBusID"],
        serde_json::json!({"string": "0000:01:00.0"})
    );
    assert_eq!(dev["attributes"]["deviceID"], serde_json::json!({"string": "0x20b0"}));
    let other: serde_json::Value =
        serde_json::from_str(std::fs::read_to_string(node.file("uid-1", "other")).unwrap().trim_end())
            .unwrap();
    assert_eq!(
        other["requests"][0]["devices"][0]["attributes"]["type"],
        serde_json::json!({"string": "gpu"})
    );

    // One mount per request, on the request's first device, read-only, from the host's manager directory.
    let spec = node.spec("uid-1");
    let mounts: Vec<Vec<(String, String, Vec<String>)>> = spec
        .devices
        .iter()
        .map(|d| {
            d.container_edits
                .mounts
                .iter()
                .map(|m| (m.container_path.clone(), m.host_path.clone(), m.options.clone()))
                .collect()
        })
        .collect();
    let ro: Vec<String> = ["ro", "nosuid", "nodev", "bind"].map(str::to_owned).to_vec();
    assert_eq!(
        mounts,
        [
            vec![(
                format!("/var/run/kubernetes.io/dra-device-attributes/resourceclaims/vm/gpu/{FILE}"),
                format!("/etc/vgpu-manager/claims/uid-1/device-metadata/gpu/{FILE}"),
                ro.clone()
            )],
            vec![],
            vec![(
                format!("/var/run/kubernetes.io/dra-device-attributes/resourceclaims/vm/other/{FILE}"),
                format!("/etc/vgpu-manager/claims/uid-1/device-metadata/other/{FILE}"),
                ro
            )],
        ]
    );

    state.unprepare(&[vm]).await.remove("uid-1").unwrap().unwrap();
    assert!(!node.config.claim_dir("uid-1").exists(), "files and the emptied claim directory are gone");
    assert_eq!(node.tree.driver("0000:01:00.0"), "nvidia");
}

#[tokio::test]
async fn template_claims_use_the_pod_claim_name_and_subrequests_their_base_request() {
    let node = Node::new(true);
    node.add_claim("pod-x-gpu-7k2p9", "uid-2", &[("gpu/big", "gpu-vfio-1")], Some("gpu"));
    let state = node.state(node.modes(), None).await;
    state.prepare(&[ClaimRef::new("ns", "pod-x-gpu-7k2p9", "uid-2")]).await.remove("uid-2").unwrap().unwrap();
    let doc: serde_json::Value =
        serde_json::from_str(std::fs::read_to_string(node.file("uid-2", "gpu")).unwrap().trim_end()).unwrap();
    assert_eq!(doc["podClaimName"], "gpu");
    assert_eq!(doc["requests"][0]["name"], "gpu/big");
    let spec = node.spec("uid-2");
    assert_eq!(
        spec.devices[0].container_edits.mounts[0].container_path,
        format!("/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/gpu/gpu/{FILE}")
    );
}

#[tokio::test]
async fn apply_and_revert_are_idempotent() {
    let node = Node::new(true);
    node.add_claim("vm", "uid-1", &[("gpu", "gpu-vfio-0")], None);
    let state = node.state(node.modes(), None).await;
    let vm = ClaimRef::new("ns", "vm", "uid-1");
    state.prepare(std::slice::from_ref(&vm)).await.remove("uid-1").unwrap().unwrap();
    let cp = state.checkpoint().await.unwrap();
    let recorded = cp.claims()["uid-1"].host_actions.iter().find(|h| h.mode == "deviceMetadata").unwrap();
    assert_eq!(
        recorded.action,
        serde_json::json!({"dir": node.config.claim_dir("uid-1").join("device-metadata").display().to_string(), "claimUid": "uid-1"})
    );
    let mode = node.metadata.clone().unwrap();
    let object = node.claims.get("ns", "vm").await.unwrap().unwrap();
    let device = node.devices.get("gpu-vfio-0").unwrap().clone();
    let devices = [ClaimDevice { request: "gpu".into(), device, share_id: None, cdi_name: "d0".into() }];
    let ctx = ClaimContext { claim: &vm, object: &object, devices: &devices, config: &node.config };
    let before = std::fs::read(node.file("uid-1", "gpu")).unwrap();
    let first = mode.apply(&ctx, &recorded.action).unwrap();
    let again = mode.apply(&ctx, &recorded.action).unwrap();
    assert_eq!(first, again);
    assert_eq!(std::fs::read(node.file("uid-1", "gpu")).unwrap(), before, "the same bytes");
    mode.revert(&recorded.action).unwrap();
    mode.revert(&recorded.action).unwrap();
    assert!(!node.config.claim_dir("uid-1").exists());
    // A recorded directory that is not the claim's is never removed.
    let outside = node.config.manager_dir.join("keep");
    std::fs::create_dir_all(&outside).unwrap();
    mode.revert(&serde_json::json!({"dir": outside.display().to_string(), "claimUid": "uid-1"})).unwrap();
    assert!(outside.exists());
    state.unprepare(&[vm]).await.remove("uid-1").unwrap().unwrap();
}

#[tokio::test]
async fn crashes_before_completion_are_rolled_back_on_restart() {
    let node = Node::new(true);
    node.add_claim("vm", "uid-1", &[("gpu", "gpu-vfio-0")], None);
    let vm = ClaimRef::new("ns", "vm", "uid-1");

    // Metadata first: the crash follows the file write.
    let metadata_first: Vec<Arc<dyn ClaimMode>> = vec![node.metadata.clone().unwrap(), node.vfio.clone()];
    let state =
        node.state(metadata_first.clone(), Some(support::crash_once(FaultPoint::AfterHostAction).0)).await;
    let result = state.prepare(std::slice::from_ref(&vm)).await.remove("uid-1").unwrap();
    assert!(matches!(result, Err(ClaimFailure::Injected(FaultPoint::AfterHostAction))));
    assert!(node.file("uid-1", "gpu").exists());
    assert_eq!(node.tree.driver("0000:01:00.0"), "nvidia", "the vfio action did not run yet");
    drop(state);
    let state = node.state(metadata_first, None).await;
    assert!(!node.config.claim_dir("uid-1").exists());
    assert!(state.checkpoint().await.unwrap().claims().is_empty());
    drop(state);

    // Everything done but PrepareCompleted: the restart reverts both modes.
    let state = node.state(node.modes(), Some(support::crash_once(FaultPoint::AfterSideEffects).0)).await;
    let result = state.prepare(std::slice::from_ref(&vm)).await.remove("uid-1").unwrap();
    assert!(matches!(result, Err(ClaimFailure::Injected(FaultPoint::AfterSideEffects))));
    assert!(node.file("uid-1", "gpu").exists());
    assert_eq!(node.tree.driver("0000:01:00.0"), "vfio-pci");
    drop(state);
    let state = node.state(node.modes(), None).await;
    assert!(!node.config.claim_dir("uid-1").exists());
    assert_eq!(node.tree.driver("0000:01:00.0"), "nvidia");
    // A fresh Prepare converges.
    state.prepare(&[vm]).await.remove("uid-1").unwrap().unwrap();
    assert!(node.file("uid-1", "gpu").exists());
    assert_eq!(node.tree.driver("0000:01:00.0"), "vfio-pci");
}
