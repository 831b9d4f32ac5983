//! Gate `MPSSupport` end to end at the state layer ([`DeviceState::with_modes`] over real files in a
//! temporary directory, in-memory claims, the mock backend's compute modes, [`FakeMpsDaemons`] for the
//! control daemons): an MPS claim gets a daemon, its directories, `EXCLUSIVE_PROCESS` and the CDI env and
//! mounts; Unprepare stops it and restores `DEFAULT`; with the gate off the claim is refused naming the
//! gate; apply adopts a running daemon; a crash after the host action is reverted at restart (daemon
//! stopped, directories gone) and a fresh Prepare starts one; daemons of claims that stay prepared are
//! started again after a plugin restart.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

use k8s_openapi::{
    api::resource::v1::{DeviceAllocationConfiguration, OpaqueDeviceConfiguration},
    apimachinery::pkg::runtime::RawExtension,
};
use serde_json::{Value, json};
use vgpu_core::backend::{ComputeMode, DeviceBackend, mock::MockBackend};
use vgpu_dra::claims::ClaimRef;
use vgpu_dra::{
    checkpoint::ClaimState,
    claims::{InMemoryClaims, allocated, allocation_result, claim},
    config::DriverConfig,
    devices::{AllocatableDevices, DeviceConfig},
    modes::{ClaimContext, ClaimMode},
    mps::{FakeMpsDaemons, MpsMode},
    opaque::OpaqueConfigCheck,
    state::{
        DeviceState,
        error::ClaimFailure,
        fault::{FaultHook, FaultPoint},
    },
};

const NODE: &str = "node-1";
const DRIVER: &str = "manager.nvidia.com";
const MOCK: &str = "gpus:\n  - { uuid: GPU-a, name: NVIDIA A30, memoryMiB: 24576, minor: 0 }\n  - { uuid: GPU-b, name: NVIDIA A30, memoryMiB: 24576, minor: 1 }\n";

struct Node {
    dir: tempfile::TempDir,
    config: Arc<DriverConfig>,
    backend: Arc<MockBackend>,
    devices: Arc<AllocatableDevices>,
    claims: Arc<InMemoryClaims>,
    daemons: Arc<FakeMpsDaemons>,
}

impl Node {
    fn new(gates: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut config = DriverConfig::under(NODE, dir.path());
        config.boot_id_path = dir.path().join("boot_id");
        std::fs::write(&config.boot_id_path, "boot-1\n").unwrap();
        config.gates = vgpu_dra::feature_gates().configure([gates]).unwrap();
        let backend = Arc::new(MockBackend::from_yaml_str(MOCK).unwrap());
        // MPSSupport excludes VGPUSupport: whole `gpu-<minor>` devices.
        let device_config = DeviceConfig { vgpu_support: false, ..DeviceConfig::default() };
        let devices = AllocatableDevices::from_backend(&*backend, &device_config).unwrap();
        Self {
            dir,
            config: Arc::new(config),
            backend,
            devices: Arc::new(devices),
            claims: Arc::new(InMemoryClaims::default()),
            daemons: Arc::new(FakeMpsDaemons::default()),
        }
    }

    fn mode(&self) -> MpsMode {
        MpsMode::new(self.backend.clone() as Arc<dyn DeviceBackend>, self.daemons.clone(), &self.config)
    }

    async fn state(&self, with_mps: bool, hook: Option<FaultHook>) -> DeviceState {
        let mut modes: Vec<Arc<dyn ClaimMode>> = vec![Arc::new(OpaqueConfigCheck)];
        if with_mps {
            modes.push(Arc::new(self.mode()));
        }
        support::open_state(&self.config, &self.devices, self.claims.clone(), modes, hook).await
    }

    /// Claim `ns/<name>` allocated `devices` (request `gpu`) with `params` as its opaque config.
    fn add(&self, name: &str, uid: &str, devices: &[&str], params: Option<Value>) {
        let results = devices.iter().map(|d| allocation_result("gpu", DRIVER, NODE, d, None, &[])).collect();
        let mut c = allocated(claim("ns", name, uid), results, &["pod-1"]);
        if let Some(p) = params {
            let d = c.status.as_mut().unwrap().allocation.as_mut().unwrap().devices.as_mut().unwrap();
            d.config = Some(vec![DeviceAllocationConfiguration {
                source: "FromClaim".into(),
                requests: None,
                opaque: Some(OpaqueDeviceConfiguration {
                    driver: DRIVER.into(),
                    parameters: RawExtension(p),
                }),
            }]);
        }
        self.claims.insert(c);
    }

    fn mps_dir(&self, uid: &str) -> std::path::PathBuf {
        self.config.manager_dir.join("mps").join(uid)
    }

    fn spec(&self, uid: &str) -> Value {
        serde_json::from_str(&std::fs::read_to_string(self.config.cdi_spec_path(uid)).unwrap()).unwrap()
    }
}

fn mps(config: Value) -> Value {
    json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
           "sharing": {"strategy": "MPS", "mpsConfig": config}})
}

fn r(name: &str, uid: &str) -> ClaimRef {
    ClaimRef::new("ns", name, uid)
}

const GATES_ON: &str = "MPSSupport=true,VGPUSupport=false";

#[tokio::test]
async fn gate_on_runs_a_daemon_per_claim_and_unprepare_stops_it() {
    let node = Node::new(GATES_ON);
    node.add(
        "c1",
        "uid-1",
        &["gpu-0", "gpu-1"],
        Some(mps(json!({"defaultActiveThreadPercentage": 50, "defaultPinnedDeviceMemoryLimit": "2Gi",
                        "defaultPerDevicePinnedMemoryLimit": {"1": "1Gi"}}))),
    );
    let state = node.state(true, None).await;
    state.prepare(&[r("c1", "uid-1")]).await.remove("uid-1").unwrap().unwrap();

    assert_eq!(
        node.daemons.running()["uid-1"],
        [
            "set_default_active_thread_percentage 50",
            "set_default_device_pinned_mem_limit GPU-a 2048M",
            "set_default_device_pinned_mem_limit GPU-b 1024M"
        ]
    );
    for i in [0, 1] {
        assert_eq!(node.backend.compute_mode(i).unwrap(), ComputeMode::ExclusiveProcess);
    }
    for sub in ["pipe", "shm", "log"] {
        assert!(node.mps_dir("uid-1").join(sub).is_dir(), "{sub}");
    }
    let spec = node.spec("uid-1");
    let common = &spec["containerEdits"];
    let env: Vec<&str> = common["env"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    for want in [
        "CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=GPU-a=2048M,GPU-b=1024M",
    ] {
        assert!(env.contains(&want), "{want} not in {env:?}");
    }
    let mounts = common["mounts"].as_array().unwrap();
    let host = node.mps_dir("uid-1");
    assert!(mounts.iter().any(|m| m["containerPath"] == "/tmp/nvidia-mps"
        && m["hostPath"] == host.join("pipe").display().to_string()));
    assert!(
        mounts
            .iter()
            .any(|m| m["containerPath"] == "/dev/shm"
                && m["hostPath"] == host.join("shm").display().to_string())
    );
    // The GPUs' own device nodes are still there, per device.
    assert_eq!(spec["devices"].as_array().unwrap().len(), 2);

    state.unprepare(&[r("c1", "uid-1")]).await.remove("uid-1").unwrap().unwrap();
    assert!(node.daemons.running().is_empty());
    assert_eq!(node.backend.compute_mode(0).unwrap(), ComputeMode::Default);
    assert!(!node.mps_dir("uid-1").exists());
}

#[tokio::test]
async fn gate_off_refuses_mps_naming_the_gate_and_a_plain_claim_gets_no_mps_edits() {
    let off = Node::new("MPSSupport=false,VGPUSupport=false");
    off.add("c1", "uid-1", &["gpu-0"], Some(mps(json!({}))));
    off.add("plain", "uid-2", &["gpu-1"], None);
    let state = off.state(false, None).await;
    let results = state.prepare(&[r("c1", "uid-1"), r("plain", "uid-2")]).await;
    let err = results["uid-1"].as_ref().unwrap_err().to_string();
    assert!(
        err.contains("\"MPS\" is selected as the GPU sharing strategy, but the feature gate \"MPSSupport\" is not enabled"),
        "{err}"
    );
    assert!(results["uid-2"].is_ok());
    assert!(!off.spec("uid-2").to_string().contains("CUDA_MPS"));
    assert_eq!(off.backend.sharing_changes(), 0);

    let on = Node::new(GATES_ON);
    on.add("plain", "uid-2", &["gpu-1"], None);
    let state = on.state(true, None).await;
    state.prepare(&[r("plain", "uid-2")]).await.remove("uid-2").unwrap().unwrap();
    assert!(on.daemons.running().is_empty(), "no MPS config, no daemon");
    assert!(!on.spec("uid-2").to_string().contains("CUDA_MPS"));
}

#[tokio::test]
async fn apply_adopts_a_running_daemon_and_revert_is_idempotent() {
    let node = Node::new(GATES_ON);
    node.add("c1", "uid-1", &["gpu-0"], Some(mps(json!({"multiUser": true}))));
    let mode = node.mode();
    let object = claim("ns", "c1", "uid-1");
    let c = r("c1", "uid-1");
    let state = node.state(true, None).await;
    state.prepare(std::slice::from_ref(&c)).await.remove("uid-1").unwrap().unwrap();
    let cp = state.checkpoint().await.unwrap();
    let action = cp.claims()["uid-1"].host_actions[0].action.clone();
    assert_eq!(action["claim"], "uid-1");
    use std::os::unix::fs::PermissionsExt;
    let perm = std::fs::metadata(node.mps_dir("uid-1").join("pipe")).unwrap().permissions().mode();
    assert_eq!(perm & 0o7777, 0o1777, "multiUser: any UID may connect");

    let ctx = ClaimContext { claim: &c, object: &object, devices: &[], config: &node.config };
    let again = mode.apply(&ctx, &action).unwrap();
    assert_eq!(node.daemons.starts(), 1, "the running daemon is adopted");
    assert!(again.common.env.contains(&"CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps".to_owned()));
    mode.revert(&action).unwrap();
    mode.revert(&action).unwrap();
    assert!(node.daemons.running().is_empty() && !node.mps_dir("uid-1").exists());
    // A recorded directory outside <manager>/mps/<claim> is never touched.
    let mut evil = action.clone();
    evil["root"] = json!(node.dir.path().join("cdi").display().to_string());
    assert!(mode.revert(&evil).unwrap_err().to_string().contains("is not"));
    assert!(node.config.cdi_root.exists());
}

#[tokio::test]
async fn a_crash_after_the_host_action_is_reverted_at_restart_and_a_fresh_prepare_starts_a_daemon() {
    let node = Node::new(GATES_ON);
    node.add("c1", "uid-1", &["gpu-0"], Some(mps(json!({"defaultActiveThreadPercentage": 25}))));
    let fired = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&fired);
    let hook: FaultHook =
        Arc::new(move |at, _| at == FaultPoint::AfterHostAction && !flag.swap(true, Ordering::SeqCst));
    let state = node.state(true, Some(hook)).await;
    let results = state.prepare(&[r("c1", "uid-1")]).await;
    assert!(matches!(results["uid-1"], Err(ClaimFailure::Injected(FaultPoint::AfterHostAction))));
    assert!(node.daemons.running().contains_key("uid-1"), "the daemon started before the crash");
    assert_eq!(
        state.checkpoint().await.unwrap().claims()["uid-1"].checkpoint_state,
        ClaimState::PrepareStarted
    );
    drop(state);

    let state = node.state(true, None).await;
    assert!(state.checkpoint().await.unwrap().claims().is_empty());
    assert!(node.daemons.running().is_empty(), "stopped at start-up");
    assert!(!node.mps_dir("uid-1").exists(), "directories removed");
    assert_eq!(node.backend.compute_mode(0).unwrap(), ComputeMode::Default);
    state.prepare(&[r("c1", "uid-1")]).await.remove("uid-1").unwrap().unwrap();
    assert_eq!(node.daemons.starts(), 2, "a fresh daemon");
    assert_eq!(node.daemons.running()["uid-1"], ["set_default_active_thread_percentage 25"]);
}

#[tokio::test]
async fn daemons_of_prepared_claims_start_again_after_a_plugin_restart() {
    let node = Node::new(GATES_ON);
    node.add("c1", "uid-1", &["gpu-0"], Some(mps(json!({}))));
    let state = node.state(true, None).await;
    state.prepare(&[r("c1", "uid-1")]).await.remove("uid-1").unwrap().unwrap();
    drop(state);
    node.daemons.kill_all(); // the plugin's container ended, and its daemons with it
    let state = node.state(true, None).await;
    let cp = state.checkpoint().await.unwrap();
    let restarted = node.mode().restart_daemons(&cp);
    assert_eq!(restarted.len(), 1);
    assert!(restarted[0].1.is_ok());
    assert!(node.daemons.running().contains_key("uid-1"));
    assert_eq!(node.mode().restart_daemons(&cp).len(), 1);
    assert_eq!(node.daemons.starts(), 2, "a running daemon is adopted, not started twice");
}

#[tokio::test]
async fn bad_mps_claims_are_refused_with_the_reason() {
    let node = Node::new(GATES_ON);
    node.add(
        "idx",
        "uid-1",
        &["gpu-0"],
        Some(mps(json!({"defaultPerDevicePinnedMemoryLimit": {"3": "1Gi"}}))),
    );
    node.add("pct", "uid-2", &["gpu-1"], Some(mps(json!({"defaultActiveThreadPercentage": 0}))));
    let state = node.state(true, None).await;
    let results = state.prepare(&[r("idx", "uid-1"), r("pct", "uid-2")]).await;
    let err = results["uid-1"].as_ref().unwrap_err().to_string();
    assert!(err.contains("mps: defaultPerDevicePinnedMemoryLimit: device index 3 is out of range"), "{err}");
    let err = results["uid-2"].as_ref().unwrap_err().to_string();
    assert!(
        err.contains("config[0].opaque.parameters.sharing.mpsConfig.defaultActiveThreadPercentage: expected an integer 1..100, got 0"),
        "{err}"
    );
    assert!(node.daemons.running().is_empty());
    assert_eq!(node.backend.sharing_changes(), 0);
}

#[tokio::test]
async fn a_daemon_that_cannot_start_fails_the_claim_and_leaves_nothing_behind() {
    let node = Node::new(GATES_ON);
    node.add("c1", "uid-1", &["gpu-0"], Some(mps(json!({}))));
    node.daemons.fail_starts(true);
    let state = node.state(true, None).await;
    let err = state.prepare(&[r("c1", "uid-1")]).await.remove("uid-1").unwrap().unwrap_err().to_string();
    assert!(
        err.contains("mps: start the MPS daemon of claim uid-1: nvidia-cuda-mps-control: not found (fake)"),
        "{err}"
    );
    assert!(state.checkpoint().await.unwrap().claims().is_empty());
    assert!(!node.mps_dir("uid-1").exists(), "directories removed by the rollback");
    assert_eq!(node.backend.compute_mode(0).unwrap(), ComputeMode::Default, "compute mode restored");
    assert!(!node.config.cdi_spec_path("uid-1").exists());
    node.daemons.fail_starts(false);
    state.prepare(&[r("c1", "uid-1")]).await.remove("uid-1").unwrap().unwrap();
    assert!(node.daemons.running().contains_key("uid-1"));
}
