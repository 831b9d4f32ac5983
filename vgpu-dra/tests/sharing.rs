//! Gate `TimeSlicingSettings` end to end at the state layer ([`DeviceState::with_modes`] over real files in a
//! temporary directory, in-memory claims, the mock backend's recorded time slices): a claim's opaque
//! `GpuConfig` time-slicing interval is applied on Prepare and set back to `Default` on Unprepare; with the
//! gate off the same claim is refused naming the gate; invalid configs are refused with the field path;
//! apply and revert are idempotent; a crash after the host action is reverted at restart; two claims
//! sharing one GPU must agree on the interval and the last one out restores `Default`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

use k8s_openapi::{
    api::resource::v1::{DeviceAllocationConfiguration, OpaqueDeviceConfiguration, ResourceClaim},
    apimachinery::pkg::runtime::RawExtension,
};
use serde_json::{Value, json};
use vgpu_core::backend::{DeviceBackend, TimeSlice, mock::MockBackend};
use vgpu_dra::claims::ClaimRef;
use vgpu_dra::{
    checkpoint::ClaimState,
    claims::{InMemoryClaims, allocated, allocation_result, claim},
    config::DriverConfig,
    devices::{AllocatableDevices, DeviceConfig},
    modes::ClaimMode,
    opaque::OpaqueConfigCheck,
    sharing::TimeSlicingMode,
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
    _dir: tempfile::TempDir,
    config: Arc<DriverConfig>,
    backend: Arc<MockBackend>,
    devices: Arc<AllocatableDevices>,
    claims: Arc<InMemoryClaims>,
}

impl Node {
    fn new(gates: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut config = DriverConfig::under(NODE, dir.path());
        vgpu_core::abi::runtime_files::install(&config.manager_dir, &config.library_version, b"").unwrap();
        config.boot_id_path = dir.path().join("boot_id");
        std::fs::write(&config.boot_id_path, "boot-1\n").unwrap();
        config.gates = vgpu_dra::feature_gates().configure([gates]).unwrap();
        let backend = Arc::new(MockBackend::from_yaml_str(MOCK).unwrap());
        let devices = AllocatableDevices::from_backend(&*backend, &DeviceConfig::default()).unwrap();
        Self {
            _dir: dir,
            config: Arc::new(config),
            backend,
            devices: Arc::new(devices),
            claims: Arc::new(InMemoryClaims::default()),
        }
    }

    fn mode(&self) -> TimeSlicingMode {
        TimeSlicingMode::new(self.backend.clone() as Arc<dyn DeviceBackend>, &self.config)
    }

    /// The modes the binary installs: the config check always, the time-slicing mode with its gate.
    fn modes(&self, with_time_slicing: bool) -> Vec<Arc<dyn ClaimMode>> {
        let mut modes: Vec<Arc<dyn ClaimMode>> = vec![Arc::new(OpaqueConfigCheck)];
        if with_time_slicing {
            modes.push(Arc::new(self.mode()));
        }
        modes
    }

    async fn state(&self, with_time_slicing: bool, hook: Option<FaultHook>) -> DeviceState {
        support::open_state(
            &self.config,
            &self.devices,
            self.claims.clone(),
            self.modes(with_time_slicing),
            hook,
        )
        .await
    }

    fn add(&self, name: &str, uid: &str, device: &str, share: &str, params: Option<Value>) {
        let result = allocation_result("gpu", DRIVER, NODE, device, Some(share), &[("cores", "10")]);
        let mut c = allocated(claim("ns", name, uid), vec![result], &["pod-1"]);
        if let Some(p) = params {
            set_configs(&mut c, vec![opaque("FromClaim", &[], p)]);
        }
        self.claims.insert(c);
    }

    fn spec(&self, uid: &str) -> Value {
        serde_json::from_str(&std::fs::read_to_string(self.config.cdi_spec_path(uid)).unwrap()).unwrap()
    }
}

fn opaque(source: &str, requests: &[&str], params: Value) -> DeviceAllocationConfiguration {
    DeviceAllocationConfiguration {
        source: source.to_owned(),
        requests: (!requests.is_empty()).then(|| requests.iter().map(|r| (*r).to_owned()).collect()),
        opaque: Some(OpaqueDeviceConfiguration {
            driver: DRIVER.to_owned(),
            parameters: RawExtension(params),
        }),
    }
}

fn set_configs(c: &mut ResourceClaim, configs: Vec<DeviceAllocationConfiguration>) {
    let devices = c.status.as_mut().unwrap().allocation.as_mut().unwrap().devices.as_mut().unwrap();
    devices.config = Some(configs);
}

fn time_slicing(interval: &str) -> Value {
    json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
           "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": interval}}})
}

fn r(name: &str, uid: &str) -> ClaimRef {
    ClaimRef::new("ns", name, uid)
}

#[tokio::test]
async fn gate_on_applies_the_interval_and_unprepare_restores_default() {
    let node = Node::new("TimeSlicingSettings=true");
    node.add("c1", "uid-1", "vgpu-1", "s1", Some(time_slicing("Long")));
    let state = node.state(true, None).await;
    assert_eq!(state.mode_names(), ["opaqueConfig", "timeSlicing"]);
    state.prepare(&[r("c1", "uid-1")]).await.remove("uid-1").unwrap().unwrap();
    assert_eq!(node.backend.time_slice(1).unwrap(), TimeSlice::Long);
    assert_eq!(node.backend.time_slice(0).unwrap(), TimeSlice::Default, "only the claim's GPU");
    let cp = state.checkpoint().await.unwrap();
    let actions = &cp.claims()["uid-1"].host_actions;
    assert_eq!(actions.len(), 1);
    assert_eq!(actions[0].mode, "timeSlicing");
    assert_eq!(actions[0].action, json!({"claim": "uid-1", "index": 1, "uuid": "GPU-b", "interval": "Long"}));
    assert_eq!(
        node.mode().holds("GPU-b").into_iter().collect::<Vec<_>>(),
        [("uid-1".to_owned(), TimeSlice::Long)]
    );

    state.unprepare(&[r("c1", "uid-1")]).await.remove("uid-1").unwrap().unwrap();
    assert_eq!(node.backend.time_slice(1).unwrap(), TimeSlice::Default);
    assert!(node.mode().holds("GPU-b").is_empty());
    assert!(state.checkpoint().await.unwrap().claims().is_empty());
}

#[tokio::test]
async fn gate_off_refuses_the_config_naming_the_gate_and_a_plain_claim_is_unchanged() {
    let off = Node::new("TimeSlicingSettings=false");
    off.add("c1", "uid-1", "vgpu-0", "s1", Some(time_slicing("Long")));
    off.add("plain", "uid-2", "vgpu-0", "s2", None);
    let state = off.state(false, None).await;
    let results = state.prepare(&[r("c1", "uid-1"), r("plain", "uid-2")]).await;
    let err = results["uid-1"].as_ref().unwrap_err().to_string();
    assert_eq!(
        err,
        "ResourceClaim ns/c1: opaqueConfig: config[0].opaque.parameters.sharing.strategy: \"TimeSlicing\" is selected as the GPU sharing strategy, but the feature gate \"TimeSlicingSettings\" is not enabled (FromClaim config)"
    );
    assert!(!off.config.cdi_spec_path("uid-1").exists(), "nothing was written");
    assert_eq!(off.backend.sharing_changes(), 0, "nothing was set");
    assert!(results["uid-2"].is_ok());

    // Gate on: the same plain claim gets the same CDI spec and no host action; the configured one is set.
    let on = Node::new("TimeSlicingSettings=true");
    on.add("c1", "uid-1", "vgpu-0", "s1", Some(time_slicing("Long")));
    on.add("plain", "uid-2", "vgpu-0", "s2", None);
    let state_on = on.state(true, None).await;
    let results = state_on.prepare(&[r("c1", "uid-1"), r("plain", "uid-2")]).await;
    assert!(results.values().all(Result::is_ok), "{results:?}");
    // Host paths differ between the two temporary nodes.
    let off_spec = off.spec("uid-2").to_string().replace(off._dir.path().to_str().unwrap(), "<root>");
    let on_spec = on.spec("uid-2").to_string().replace(on._dir.path().to_str().unwrap(), "<root>");
    assert_eq!(off_spec, on_spec);
    assert!(state_on.checkpoint().await.unwrap().claims()["uid-2"].host_actions.is_empty());
    assert_eq!(on.backend.time_slice(0).unwrap(), TimeSlice::Long);
    assert_eq!(off.backend.time_slice(0).unwrap(), TimeSlice::Default);
}

#[tokio::test]
async fn invalid_configs_are_refused_at_prepare_with_the_field_path() {
    let node = Node::new("TimeSlicingSettings=true");
    node.add("fast", "uid-1", "vgpu-0", "s1", Some(time_slicing("Fast")));
    let mut c = allocated(
        claim("ns", "two", "uid-2"),
        vec![allocation_result("gpu", DRIVER, NODE, "vgpu-1", Some("s2"), &[])],
        &["p"],
    );
    set_configs(
        &mut c,
        vec![
            opaque("FromClass", &[], time_slicing("Short")),
            opaque(
                "FromClaim",
                &["gpu"],
                json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long", "period": 3}}}),
            ),
        ],
    );
    node.claims.insert(c);
    let state = node.state(true, None).await;
    let results = state.prepare(&[r("fast", "uid-1"), r("two", "uid-2")]).await;
    assert_eq!(
        results["uid-1"].as_ref().unwrap_err().to_string(),
        "ResourceClaim ns/fast: opaqueConfig: config[0].opaque.parameters.sharing.timeSlicingConfig.interval: expected Default|Short|Medium|Long, got \"Fast\" (FromClaim config)"
    );
    let err = results["uid-2"].as_ref().unwrap_err().to_string();
    assert!(
        err.contains("config[1].opaque.parameters.sharing.timeSlicingConfig.period: unknown field"),
        "{err}"
    );
    assert!(state.checkpoint().await.unwrap().claims().is_empty());
    assert_eq!(node.backend.sharing_changes(), 0);
}

#[tokio::test]
async fn apply_and_revert_are_idempotent_and_revert_without_apply_is_fine() {
    let node = Node::new("TimeSlicingSettings=true");
    let mode = node.mode();
    let action = json!({"claim": "uid-1", "index": 0, "uuid": "GPU-a", "interval": "Medium"});
    mode.revert(&action).unwrap(); // never applied
    assert_eq!(node.backend.time_slice(0).unwrap(), TimeSlice::Default);
    let object = claim("ns", "c1", "uid-1");
    let c = r("c1", "uid-1");
    let ctx =
        vgpu_dra::modes::ClaimContext { claim: &c, object: &object, devices: &[], config: &node.config };
    let first = mode.apply(&ctx, &action).unwrap();
    let changes = node.backend.sharing_changes();
    let second = mode.apply(&ctx, &action).unwrap();
    assert_eq!(first, second);
    assert_eq!(node.backend.sharing_changes(), changes, "applying again changes nothing");
    assert_eq!(node.backend.time_slice(0).unwrap(), TimeSlice::Medium);
    mode.revert(&action).unwrap();
    mode.revert(&action).unwrap();
    assert_eq!(node.backend.time_slice(0).unwrap(), TimeSlice::Default);
    let err = mode.revert(&json!({"claim": "uid-1"})).unwrap_err().to_string();
    assert!(err.starts_with("timeSlicing: recorded action"), "{err}");
}

#[tokio::test]
async fn a_crash_after_the_host_action_is_reverted_at_restart_then_prepares_again() {
    let node = Node::new("TimeSlicingSettings=true");
    node.add("c1", "uid-1", "vgpu-0", "s1", Some(time_slicing("Short")));
    let fired = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&fired);
    let hook: FaultHook =
        Arc::new(move |at, _| at == FaultPoint::AfterHostAction && !flag.swap(true, Ordering::SeqCst));
    let state = node.state(true, Some(hook)).await;
    let results = state.prepare(&[r("c1", "uid-1")]).await;
    assert!(matches!(results["uid-1"], Err(ClaimFailure::Injected(FaultPoint::AfterHostAction))));
    assert_eq!(node.backend.time_slice(0).unwrap(), TimeSlice::Short, "the crash came after the host action");
    assert_eq!(
        state.checkpoint().await.unwrap().claims()["uid-1"].checkpoint_state,
        ClaimState::PrepareStarted
    );
    drop(state);

    let state = node.state(true, None).await;
    assert!(state.checkpoint().await.unwrap().claims().is_empty());
    assert_eq!(node.backend.time_slice(0).unwrap(), TimeSlice::Default, "reverted at start-up");
    assert!(node.mode().holds("GPU-a").is_empty());
    state.prepare(&[r("c1", "uid-1")]).await.remove("uid-1").unwrap().unwrap();
    assert_eq!(node.backend.time_slice(0).unwrap(), TimeSlice::Short);
}

#[tokio::test]
async fn claims_sharing_a_gpu_must_agree_and_the_last_one_restores_default() {
    let node = Node::new("TimeSlicingSettings=true");
    node.add("a", "uid-a", "vgpu-0", "s1", Some(time_slicing("Long")));
    node.add("b", "uid-b", "vgpu-0", "s2", Some(time_slicing("Short")));
    node.add("c", "uid-c", "vgpu-0", "s3", Some(time_slicing("Long")));
    let state = node.state(true, None).await;
    let results = state.prepare(&[r("a", "uid-a"), r("b", "uid-b"), r("c", "uid-c")]).await;
    assert!(results["uid-a"].is_ok() && results["uid-c"].is_ok());
    assert_eq!(
        results["uid-b"].as_ref().unwrap_err().to_string(),
        "ResourceClaim ns/b: timeSlicing: device vgpu-0: GPU GPU-a is time-sliced Long for claim uid-a; this claim asks for Short (one interval per GPU)"
    );
    state.unprepare(&[r("a", "uid-a")]).await.remove("uid-a").unwrap().unwrap();
    assert_eq!(node.backend.time_slice(0).unwrap(), TimeSlice::Long, "uid-c still holds it");
    state.unprepare(&[r("c", "uid-c")]).await.remove("uid-c").unwrap().unwrap();
    assert_eq!(node.backend.time_slice(0).unwrap(), TimeSlice::Default);
    // Now the Short claim fits.
    state.prepare(&[r("b", "uid-b")]).await.remove("uid-b").unwrap().unwrap();
    assert_eq!(node.backend.time_slice(0).unwrap(), TimeSlice::Short);
}
