//! Gate `DynamicMIG` at the state layer: [`DeviceState::with_modes`] with [`MigMode`] over the mock backend's
//! MIG state machine (an A100 80GB in MIG mode, its layout persisted to a state file in a temporary
//! directory) and real checkpoint/CDI files. Published devices and slices with the gate on vs off; Prepare
//! creates the instance at the allocated placement (the state file shows it), Unprepare destroys it;
//! re-applying is idempotent; a crash after the first host action converges on restart; overlapping
//! placements are refused at Prepare; and a proptest ties the published counters to the backend's
//! placement rules (a set of MIG devices fits the counters exactly when the backend can create them all).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::{
    collections::BTreeMap,
    path::PathBuf,
    sync::{Arc, atomic::Ordering},
};

use proptest::prelude::*;
use vgpu_core::backend::{DeviceBackend, mock::MockBackend};
use vgpu_core::dra::DeviceType;
use vgpu_dra::claims::ClaimRef;
use vgpu_dra::{
    checkpoint::ClaimState,
    claims::{InMemoryClaims, allocated, allocation_result, claim},
    config::DriverConfig,
    devices::AllocatableDevices,
    devices::DeviceConfig,
    devices::ExtraAttribute,
    health::HealthSnapshot,
    mig::{self, MigMode},
    modes::{ClaimContext, ClaimDevice, ClaimMode},
    slices::{SliceConfig, build_slices},
    state::{
        DeviceState,
        error::ClaimFailure,
        fault::{FaultHook, FaultPoint},
    },
};

const NODE: &str = "node-1";
const DRIVER: &str = "manager.nvidia.com";

/// GPU 0: an A100 80GB in MIG mode (minor 0); GPU 1: an A30 without MIG (minor 1).
fn mock_yaml(state_file: &std::path::Path) -> String {
    format!(
        "gpus:\n  - {{ uuid: GPU-mig, name: NVIDIA A100-SXM4-80GB, memoryMiB: 81920, minor: 0, mig: {{ mode: Enabled }} }}\n  - {{ uuid: GPU-plain, name: NVIDIA A30, memoryMiB: 24576, minor: 1 }}\nmigStateFile: {}\n",
        state_file.display()
    )
}

struct MigNode {
    dir: tempfile::TempDir,
    config: Arc<DriverConfig>,
    backend: Arc<MockBackend>,
    devices: Arc<AllocatableDevices>,
    claims: Arc<InMemoryClaims>,
}

impl MigNode {
    fn new(gate: bool) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut config = DriverConfig::under(NODE, dir.path());
        config.boot_id_path = dir.path().join("boot_id");
        std::fs::write(&config.boot_id_path, "boot-1\n").unwrap();
        let backend = Arc::new(MockBackend::from_yaml_str(&mock_yaml(&dir.path().join("mig.json"))).unwrap());
        let mut devices =
            AllocatableDevices::from_backend(backend.as_ref(), &DeviceConfig::default()).unwrap();
        if gate {
            assert_eq!(mig::publish(&mut devices, backend.as_ref()).unwrap(), 1);
        }
        Self {
            dir,
            config: Arc::new(config),
            backend,
            devices: Arc::new(devices),
            claims: Arc::new(InMemoryClaims::default()),
        }
    }

    fn mode(&self) -> Arc<MigMode> {
        Arc::new(MigMode::new(self.backend.clone()))
    }

    async fn state(&self, hook: Option<FaultHook>) -> DeviceState {
        let modes: Vec<Arc<dyn ClaimMode>> = vec![self.mode()];
        support::open_state(&self.config, &self.devices, self.claims.clone(), modes, hook).await
    }

    /// Claim `ns/<name>` allocated `devices` (one request `mig`, exclusive).
    fn add_claim(&self, name: &str, uid: &str, devices: &[&str]) {
        let results = devices.iter().map(|d| allocation_result("mig", DRIVER, NODE, d, None, &[])).collect();
        self.claims.insert(allocated(claim("ns", name, uid), results, &["pod-1"]));
    }

    /// The persisted MIG layout of GPU-mig as (profile, start) pairs, read from the state file by a second
    /// backend (as another process would).
    fn instances(&self) -> Vec<(String, u32)> {
        let other = MockBackend::from_yaml_str(&mock_yaml(&self.dir.path().join("mig.json"))).unwrap();
        let mut out: Vec<_> = other
            .mig_layout(0)
            .unwrap()
            .instances
            .iter()
            .map(|i| (i.profile.to_string(), i.placement_start))
            .collect();
        out.sort();
        out
    }

    fn spec(&self, uid: &str) -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(self.config.cdi_spec_path(uid)).unwrap()).unwrap()
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }
}

#[tokio::test]
async fn gate_on_publishes_partitionable_devices_gate_off_does_not() {
    let off = MigNode::new(false);
    let names: Vec<_> = off.devices.iter().map(|d| d.name.clone()).collect();
    assert_eq!(names, ["vgpu-1"], "without the gate a MIG-enabled GPU offers nothing");
    assert!(off.devices.counter_sets().is_empty());
    off.add_claim("c1", "uid-1", &["gpu-0-mig-9-4-4"]);
    let state = off.state(None).await;
    let err =
        state.prepare(&[ClaimRef::new("ns", "c1", "uid-1")]).await.remove("uid-1").unwrap().unwrap_err();
    assert!(err.to_string().contains("unknown device \"gpu-0-mig-9-4-4\""), "{err}");
    assert!(off.instances().is_empty());

    let on = MigNode::new(true);
    let mig: Vec<_> = on.devices.iter().filter(|d| d.kind == DeviceType::Mig).collect();
    assert_eq!(mig.len(), 25);
    assert!(on.devices.get("vgpu-1").is_some(), "the A30 without MIG stays a vGPU");
    let slices = build_slices(&SliceConfig::new(NODE), &on.devices, &HealthSnapshot::default(), 1).unwrap();
    assert_eq!(slices.len(), 2, "devices, then the counter set in a slice of its own");
    assert!(slices.iter().all(|s| s.spec.pool.resource_slice_count == 2));
    let json = serde_json::to_value(&slices).unwrap();
    assert!(json[1]["spec"].get("devices").is_none());
    assert_eq!(json[1]["spec"]["sharedCounters"][0]["name"], "gpu-0-counter-set");
    assert_eq!(json[1]["spec"]["sharedCounters"][0]["counters"]["memory-slice-7"]["value"], "1");
    let device = json[0]["spec"]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "gpu-0-mig-9-4-4")
        .unwrap()
        .clone();
    assert_eq!(device["attributes"]["type"]["string"], "mig");
    assert_eq!(device["attributes"]["profile"]["string"], "3g.40gb");
    assert_eq!(device["attributes"]["parentUUID"]["string"], "gpu-mig");
    assert!(device["attributes"].get("uuid").is_none());
    assert_eq!(device["capacity"]["memory"]["value"], "39424Mi", "4 slices of 9856 MiB");
    assert_eq!(device["capacity"]["memorySlice4"]["value"], "1");
    assert_eq!(device["consumesCounters"][0]["counterSet"], "gpu-0-counter-set");
    let consumed: Vec<&String> =
        device["consumesCounters"][0]["counters"].as_object().unwrap().keys().collect();
    assert_eq!(
        consumed,
        ["compute-slices", "memory", "memory-slice-4", "memory-slice-5", "memory-slice-6", "memory-slice-7"]
    );
}

#[tokio::test]
async fn prepare_creates_the_instance_and_unprepare_destroys_it() {
    let node = MigNode::new(true);
    // The driver's capability files of the instance the mock will create (GPU instance 1, compute instance 0).
    let caps = node.config.container_driver_root.join("proc/driver/nvidia/capabilities/gpu0/mig/gi1");
    std::fs::create_dir_all(caps.join("ci0")).unwrap();
    std::fs::write(caps.join("access"), "DeviceFileMinor: 12\n").unwrap();
    std::fs::write(caps.join("ci0/access"), "DeviceFileMinor: 13\n").unwrap();
    node.add_claim("c1", "uid-1", &["gpu-0-mig-9-4-4"]);
    let state = node.state(None).await;
    let c1 = ClaimRef::new("ns", "c1", "uid-1");
    let prepared = state.prepare(std::slice::from_ref(&c1)).await.remove("uid-1").unwrap().unwrap();
    assert_eq!(prepared[0].device_name, "gpu-0-mig-9-4-4");
    assert_eq!(node.instances(), [("3g.40gb".to_owned(), 4)]);

    let cp = state.checkpoint().await.unwrap();
    let entry = &cp.claims()["uid-1"];
    assert_eq!(entry.checkpoint_state, ClaimState::PrepareCompleted);
    assert_eq!(entry.host_actions.len(), 1);
    assert_eq!(entry.host_actions[0].mode, "mig");
    assert_eq!(entry.host_actions[0].action["profile"], "3g.40gb");
    assert_eq!(entry.host_actions[0].action["start"], 4);

    let spec = node.spec("uid-1");
    let edits = &spec["devices"][0]["containerEdits"];
    let env: Vec<&str> = edits["env"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    assert_eq!(env, ["NVIDIA_VISIBLE_DEVICES=MIG-mig-1", "CUDA_VISIBLE_DEVICES=MIG-mig-1"]);
    let nodes: Vec<&str> =
        edits["deviceNodes"].as_array().unwrap().iter().map(|n| n["path"].as_str().unwrap()).collect();
    assert_eq!(nodes, ["/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap12", "/dev/nvidia-caps/nvidia-cap13"]);
    assert!(!spec.to_string().contains("LD_PRELOAD"), "no vGPU edits on a MIG device");

    // Prepare again: answered from the checkpoint, nothing created twice.
    let again = state.prepare(std::slice::from_ref(&c1)).await.remove("uid-1").unwrap().unwrap();
    assert_eq!(again, prepared);
    assert_eq!(node.instances().len(), 1);

    state.unprepare(std::slice::from_ref(&c1)).await.remove("uid-1").unwrap().unwrap();
    assert!(node.instances().is_empty(), "destroyed on Unprepare");
    assert!(!node.config.cdi_spec_path("uid-1").exists());
    assert!(state.checkpoint().await.unwrap().claims().is_empty());
    // Unprepare again: nothing left to do.
    state.unprepare(&[c1]).await.remove("uid-1").unwrap().unwrap();
    assert!(node.path("mig.json").exists());
}

#[tokio::test]
async fn apply_and_revert_are_idempotent() {
    let node = MigNode::new(true);
    let mode = node.mode();
    let device = node.devices.get("gpu-0-mig-14-2-2").unwrap().clone();
    let claim_ref = ClaimRef::new("ns", "c", "uid-9");
    let object = claim("ns", "c", "uid-9");
    let devices =
        [ClaimDevice { request: "mig".into(), device, share_id: None, cdi_name: "uid-9-mig".into() }];
    let ctx = ClaimContext { claim: &claim_ref, object: &object, devices: &devices, config: &node.config };
    let actions = mode.plan(&ctx).unwrap();
    assert_eq!(actions.len(), 1);
    mode.revert(&actions[0]).unwrap();
    assert!(node.instances().is_empty(), "revert before apply is fine");
    let first = mode.apply(&ctx, &actions[0]).unwrap();
    let second = mode.apply(&ctx, &actions[0]).unwrap();
    assert_eq!(first, second, "the existing instance is adopted");
    assert_eq!(node.instances(), [("2g.20gb".to_owned(), 2)]);
    assert!(mode.plan(&ctx).is_ok(), "its own instance does not block the plan");
    mode.revert(&actions[0]).unwrap();
    mode.revert(&actions[0]).unwrap();
    assert!(node.instances().is_empty());
}

#[tokio::test]
async fn crash_after_the_first_host_action_converges_on_restart() {
    let node = MigNode::new(true);
    node.add_claim("c1", "uid-1", &["gpu-0-mig-9-0-4", "gpu-0-mig-14-4-2"]);
    let c1 = ClaimRef::new("ns", "c1", "uid-1");
    let (hook, fired) = support::crash_once(FaultPoint::AfterHostAction);
    let state = node.state(Some(hook)).await;
    let result = state.prepare(std::slice::from_ref(&c1)).await.remove("uid-1").unwrap();
    assert!(fired.load(Ordering::SeqCst));
    assert!(matches!(result, Err(ClaimFailure::Injected(FaultPoint::AfterHostAction))), "{result:?}");
    assert_eq!(node.instances(), [("3g.40gb".to_owned(), 0)], "the first instance exists, the second not");
    let cp = state.checkpoint().await.unwrap();
    assert_eq!(cp.claims()["uid-1"].checkpoint_state, ClaimState::PrepareStarted);
    assert_eq!(cp.claims()["uid-1"].host_actions.len(), 2);
    drop(state);

    // Restart on the same directories: the started claim is reverted before anything is served.
    let state = node.state(None).await;
    assert!(state.checkpoint().await.unwrap().claims().is_empty());
    assert!(node.instances().is_empty(), "the created instance is destroyed");
    assert!(node.cdi_root_empty());
    let prepared = state.prepare(std::slice::from_ref(&c1)).await.remove("uid-1").unwrap().unwrap();
    assert_eq!(prepared.len(), 2);
    assert_eq!(node.instances(), [("2g.20gb".to_owned(), 4), ("3g.40gb".to_owned(), 0)]);
    state.unprepare(&[c1]).await.remove("uid-1").unwrap().unwrap();
    assert!(node.instances().is_empty());
}

impl MigNode {
    fn cdi_root_empty(&self) -> bool {
        std::fs::read_dir(&self.config.cdi_root).map(|d| d.count() == 0).unwrap_or(true)
    }
}

#[tokio::test]
async fn overlapping_placements_are_refused_at_prepare() {
    let node = MigNode::new(true);
    node.add_claim("a", "uid-a", &["gpu-0-mig-9-0-4"]);
    node.add_claim("b", "uid-b", &["gpu-0-mig-14-2-2"]);
    node.add_claim("c", "uid-c", &["gpu-0-mig-0-0-8"]);
    node.add_claim("d", "uid-d", &["gpu-0-mig-19-4-1", "gpu-0-mig-15-4-2"]);
    let state = node.state(None).await;
    let mut results = state
        .prepare(&[
            ClaimRef::new("ns", "a", "uid-a"),
            ClaimRef::new("ns", "b", "uid-b"),
            ClaimRef::new("ns", "c", "uid-c"),
            ClaimRef::new("ns", "d", "uid-d"),
        ])
        .await;
    results.remove("uid-a").unwrap().unwrap();
    for uid in ["uid-b", "uid-c"] {
        let err = results.remove(uid).unwrap().unwrap_err().to_string();
        assert!(err.contains("overlaps existing MIG instance MIG-mig-1 (3g.40gb at 0..4)"), "{err}");
    }
    let err = results.remove("uid-d").unwrap().unwrap_err().to_string();
    assert!(err.contains("devices gpu-0-mig-19-4-1 and gpu-0-mig-15-4-2 of the claim overlap"), "{err}");
    assert_eq!(node.instances(), [("3g.40gb".to_owned(), 0)], "nothing created for the refused claims");
    let cp = state.checkpoint().await.unwrap();
    assert_eq!(cp.claims().keys().collect::<Vec<_>>(), ["uid-a"]);
    assert!(!node.config.cdi_spec_path("uid-b").exists());
}

/// Consumption of a set of devices against the counter set, per counter.
fn fits(devices: &AllocatableDevices, names: &[String]) -> bool {
    let set = &devices.counter_sets()[0];
    let mut used: BTreeMap<&str, u64> = BTreeMap::new();
    for name in names {
        for c in &devices.get(name).unwrap().extra.consumes_counters {
            assert_eq!(c.counter_set, set.name);
            for (k, v) in &c.counters {
                assert!(set.counters.contains_key(k), "{name} consumes {k}, which the set lacks");
                *used.entry(k.as_str()).or_default() += v.value();
            }
        }
    }
    used.iter().all(|(k, v)| *v <= set.counters[*k].value())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// The counters model the placement rules exactly: a set of MIG devices of one GPU fits the counters
    /// iff the backend's MIG state machine accepts creating all of them; in particular no two devices whose
    /// placements overlap ever fit together.
    #[test]
    fn counters_admit_exactly_what_the_backend_can_create(picks in proptest::collection::vec(0usize..25, 0..6)) {
        let dir = tempfile::tempdir().unwrap();
        let yaml = mock_yaml(&dir.path().join("mig.json"));
        let backend = MockBackend::from_yaml_str(&yaml).unwrap();
        let config = DeviceConfig { vgpu_support: false, ..DeviceConfig::default() };
        let mut devices = AllocatableDevices::from_backend(&backend, &config).unwrap();
        mig::publish(&mut devices, &backend).unwrap();
        let mig: Vec<String> =
            devices.iter().filter(|d| d.kind == DeviceType::Mig).map(|d| d.name.clone()).collect();
        let mut names: Vec<String> = picks.iter().map(|&i| mig[i].clone()).collect();
        names.sort();
        names.dedup();
        let fit = fits(&devices, &names);
        let mut created = true;
        for name in &names {
            let d = devices.get(name).unwrap();
            let (profile, start) = match (&d.extra.attributes["profile"], &d.extra.attributes["placementStart"]) {
                (ExtraAttribute::String(p), ExtraAttribute::Int(s)) => (p.parse().unwrap(), u32::try_from(*s).unwrap()),
                other => panic!("{other:?}"),
            };
            if backend.create_mig_device(0, &profile, start).is_err() {
                created = false;
                break;
            }
        }
        prop_assert_eq!(fit, created, "{:?}", names);
        if names.len() >= 2 {
            let overlapping = names.iter().enumerate().any(|(i, a)| names[..i].iter().any(|b| {
                let slices = |n: &str| devices.get(n).unwrap().extra.capacities.keys().filter(|k| k.starts_with("memorySlice")).cloned().collect::<Vec<_>>();
                slices(a).iter().any(|s| slices(b).contains(s))
            }));
            prop_assert!(!(overlapping && fit));
        }
        // The whole GPU fits alone, never with any MIG device.
        prop_assert!(fits(&devices, &["gpu-0".to_owned()]));
        if !names.is_empty() {
            let mut with_whole = names.clone();
            with_whole.push("gpu-0".to_owned());
            prop_assert!(!fits(&devices, &with_whole));
        }
    }
}
