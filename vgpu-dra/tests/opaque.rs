//! Opaque device configs through Prepare ([`DeviceState::with_modes`] with [`OpaqueConfigCheck`] and the
//! time-slicing mode over real files in a temporary directory, in-memory claims, the mock backend): which
//! config wins for which device (claim over class, named request over all requests, later over earlier,
//! `main/sub` requests), configs of other drivers ignored, a config of the wrong kind for a named request
//! refused, and [`configs_for`] as other modes call it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use k8s_openapi::{
    api::resource::v1::{DeviceAllocationConfiguration, OpaqueDeviceConfiguration},
    apimachinery::pkg::runtime::RawExtension,
};
use serde_json::{Value, json};
use vgpu_core::backend::{DeviceBackend, NvidiaAdapter, TimeSlice, mock::MockBackend};
use vgpu_dra::claims::ClaimRef;
use vgpu_dra::{
    claims::{InMemoryClaims, allocated, allocation_result, claim},
    config::DriverConfig,
    devices::{AllocatableDevices, DeviceConfig as DeviceModelConfig},
    modes::{ClaimContext, ClaimDevice, ClaimMode},
    opaque::{ConfigSource, DeviceConfig, OpaqueConfigCheck, Sharing, configs_for},
    sharing::TimeSlicingMode,
    state::DeviceState,
};

const NODE: &str = "node-1";
const DRIVER: &str = "manager.nvidia.com";
const MOCK: &str = "gpus:\n  - { uuid: GPU-a, name: NVIDIA A30, memoryMiB: 24576, minor: 0 }\n  - { uuid: GPU-b, name: NVIDIA A30, memoryMiB: 24576, minor: 1 }\n";

fn entry(source: &str, driver: &str, requests: &[&str], params: Value) -> DeviceAllocationConfiguration {
    DeviceAllocationConfiguration {
        source: source.to_owned(),
        requests: (!requests.is_empty()).then(|| requests.iter().map(|r| (*r).to_owned()).collect()),
        opaque: Some(OpaqueDeviceConfiguration {
            driver: driver.to_owned(),
            parameters: RawExtension(params),
        }),
    }
}

fn ts(interval: &str) -> Value {
    json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig",
           "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": interval}}})
}

struct Node {
    _dir: tempfile::TempDir,
    config: Arc<DriverConfig>,
    backend: Arc<MockBackend>,
    devices: Arc<AllocatableDevices>,
    claims: Arc<InMemoryClaims>,
}

impl Node {
    fn new(vgpu: bool) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut config = DriverConfig::under(NODE, dir.path());
        vgpu_core::abi::runtime_files::install(&config.manager_dir, &config.library_version, b"").unwrap();
        config.boot_id_path = dir.path().join("boot_id");
        std::fs::write(&config.boot_id_path, "boot-1\n").unwrap();
        config.gates = vgpu_dra::feature_gates()
            .configure([format!("TimeSlicingSettings=true,VGPUSupport={vgpu}")])
            .unwrap();
        let backend = Arc::new(MockBackend::from_yaml_str(MOCK).unwrap());
        let model = DeviceModelConfig { vgpu_support: vgpu, ..DeviceModelConfig::default() };
        let devices = AllocatableDevices::from_backend(&*backend, &model).unwrap();
        Self {
            _dir: dir,
            config: Arc::new(config),
            backend,
            devices: Arc::new(devices),
            claims: Arc::new(InMemoryClaims::default()),
        }
    }

    async fn state(&self) -> DeviceState {
        let modes: Vec<Arc<dyn ClaimMode>> = vec![
            Arc::new(OpaqueConfigCheck),
            Arc::new(TimeSlicingMode::new(self.backend.clone() as Arc<dyn DeviceBackend>, &self.config)),
        ];
        DeviceState::with_modes(
            Arc::clone(&self.config),
            Arc::clone(&self.devices),
            Arc::new(NvidiaAdapter),
            self.claims.clone(),
            modes,
        )
        .await
        .unwrap()
    }

    /// A claim with results `(request, device)` and `configs`.
    fn add(&self, uid: &str, results: &[(&str, &str)], configs: Vec<DeviceAllocationConfiguration>) {
        let results = results.iter().map(|(r, d)| allocation_result(r, DRIVER, NODE, d, None, &[])).collect();
        let mut c = allocated(claim("ns", uid, uid), results, &["pod-1"]);
        c.status.as_mut().unwrap().allocation.as_mut().unwrap().devices.as_mut().unwrap().config =
            Some(configs);
        self.claims.insert(c);
    }
}

fn r(uid: &str) -> ClaimRef {
    ClaimRef::new("ns", uid, uid)
}

#[tokio::test]
async fn the_claims_config_beats_the_class_and_a_named_request_beats_all_requests() {
    let node = Node::new(false);
    node.add(
        "c1",
        &[("first", "gpu-0"), ("second/large", "gpu-1")],
        vec![
            entry("FromClaim", DRIVER, &[], ts("Short")),
            // A class config comes before every claim config whatever its place in the list.
            entry("FromClass", DRIVER, &["first"], ts("Medium")),
            entry("FromClaim", "gpu.nvidia.com", &[], json!({"kind": "not ours, never decoded"})),
            entry("FromClaim", DRIVER, &["second"], ts("Long")),
        ],
    );
    let state = node.state().await;
    state.prepare(&[r("c1")]).await.remove("c1").unwrap().unwrap();
    assert_eq!(node.backend.time_slice(0).unwrap(), TimeSlice::Short, "claim config over the class one");
    assert_eq!(
        node.backend.time_slice(1).unwrap(),
        TimeSlice::Long,
        "`second` names second/large's main request"
    );
    state.unprepare(&[r("c1")]).await.remove("c1").unwrap().unwrap();
    assert_eq!(node.backend.time_slice(0).unwrap(), TimeSlice::Default);
    assert_eq!(node.backend.time_slice(1).unwrap(), TimeSlice::Default);
}

#[tokio::test]
async fn a_config_of_the_wrong_kind_for_a_named_request_fails_prepare_with_nothing_done() {
    let node = Node::new(true);
    let vfio = json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "VfioDeviceConfig"});
    let mig = json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "MigDeviceConfig"});
    node.add("named", &[("gpu", "vgpu-0")], vec![entry("FromClaim", DRIVER, &["gpu"], vfio.clone())]);
    node.add(
        "general",
        &[("gpu", "vgpu-1")],
        vec![entry("FromClass", DRIVER, &[], mig), entry("FromClaim", DRIVER, &[], vfio)],
    );
    let state = node.state().await;
    let results = state.prepare(&[r("named"), r("general")]).await;
    assert_eq!(
        results["named"].as_ref().unwrap_err().to_string(),
        "ResourceClaim ns/named: opaqueConfig: config[0] (FromClaim config) is a VfioDeviceConfig for request \"gpu\", but that request got device vgpu-0, a vgpu device (expected GpuConfig)"
    );
    assert!(results["general"].is_ok(), "configs for all requests skip devices they do not fit");
    assert!(!node.config.cdi_spec_path("named").exists());
}

#[tokio::test]
async fn configs_for_resolves_each_device_of_a_claim() {
    let node = Node::new(false);
    node.add(
        "c1",
        &[("a", "gpu-0"), ("b", "gpu-1")],
        vec![
            entry("FromClass", DRIVER, &[], ts("Long")),
            entry(
                "FromClaim",
                DRIVER,
                &["b"],
                json!({"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig"}),
            ),
        ],
    );
    let object = vgpu_dra::claims::ClaimSource::get(&*node.claims, "ns", "c1").await.unwrap().unwrap();
    let devices: Vec<ClaimDevice> = [("a", "gpu-0"), ("b", "gpu-1")]
        .into_iter()
        .map(|(request, name)| ClaimDevice {
            request: request.to_owned(),
            device: node.devices.get(name).unwrap().clone(),
            share_id: None,
            cdi_name: format!("c1-{request}"),
        })
        .collect();
    let c = r("c1");
    let ctx = ClaimContext { claim: &c, object: &object, devices: &devices, config: &node.config };
    let configs = configs_for(&ctx).unwrap();
    assert_eq!(configs["c1-a"].source, ConfigSource::FromClass);
    assert_eq!(configs["c1-a"].config.sharing(), Some(&Sharing::TimeSlicing(Some(TimeSlice::Long))));
    assert_eq!(configs["c1-b"].index, 1);
    assert!(matches!(&configs["c1-b"].config, DeviceConfig::Gpu(g) if g.sharing.is_none()));
}
