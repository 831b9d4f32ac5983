//! The node agent on fake sysfs trees (real files in temp dirs) against the in-memory cluster: the acceptance
//! layout (two NVIDIA GPUs, one MetaX GPU, one NIC → three PhysicalGPUs and the vendor labels), removal on
//! the next scan, no writes when nothing changed, the vendors ConfigMap and its fallback, the control-plane
//! refusal, failure injection, and a proptest that any set of devices converges in one scan.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{collections::BTreeMap, sync::Arc};

use proptest::prelude::*;
use vgpu_api::ConditionStatus;
use vgpu_node_agent::{
    AgentConfig, AgentError, InMemoryCluster, NodeAgent,
    fake_sysfs::{FakeDevice, FakeSysfs},
    vendors::VendorsError,
};

struct Setup {
    _dir: tempfile::TempDir,
    sys: FakeSysfs,
    cluster: Arc<InMemoryCluster>,
    agent: NodeAgent<InMemoryCluster>,
}

fn setup(configure: impl FnOnce(&mut AgentConfig)) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let sys = FakeSysfs::create(dir.path()).unwrap();
    let cluster = Arc::new(InMemoryCluster::new());
    cluster.put_node("w1", BTreeMap::from([("other".to_owned(), "kept".to_owned())]));
    let mut config = AgentConfig::new("w1");
    config.sysfs_root = sys.sysfs_root();
    config.pci_ids_paths = vec![sys.pci_ids()];
    configure(&mut config);
    let agent = NodeAgent::new(cluster.clone(), config);
    Setup { _dir: dir, sys, cluster, agent }
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
}

const A: &str = "w1-nvidia-20b0-0000-3b-00-0";
const B: &str = "w1-nvidia-20b0-0000-86-00-0";
const M: &str = "w1-metax-4001-0000-5e-00-0";

#[tokio::test]
async fn two_nvidia_one_metax_one_nic_give_three_gpus_and_the_labels() {
    let mut s = setup(|_| {});
    s.sys.two_nvidia_one_metax_one_nic().unwrap();
    s.agent.check_node().await.unwrap();
    let outcome = s.agent.scan_once().await.unwrap();
    assert_eq!(outcome.gpus, [M, A, B]);
    let gpus = s.cluster.gpus();
    assert_eq!(gpus.keys().collect::<Vec<_>>(), [M, A, B]);
    let a = &gpus[A];
    assert_eq!(a.spec.index, 0);
    assert_eq!(a.spec.device_name, "GA100 [A100 SXM4 40GB]");
    assert_eq!(a.spec.vendor_name, "NVIDIA Corporation");
    assert_eq!(a.spec.model, "a100-sxm4-40gb");
    assert_eq!(a.labels["gpu.deckhouse.io/vendor"], "nvidia");
    assert_eq!(a.status.driver.as_deref(), Some("nvidia"));
    assert_eq!(a.status.conditions[0].type_, "DriverBound");
    assert_eq!(a.status.conditions[0].status, ConditionStatus::True);
    assert!(a.status.conditions[0].last_transition_time.is_some());
    let m = &gpus[M];
    assert_eq!((m.spec.index, m.spec.vendor.as_str(), m.spec.device_name.as_str()), (1, "metax", "MXC500"));
    assert_eq!(gpus[B].spec.index, 2);
    assert_eq!(
        s.cluster.node("w1").unwrap(),
        labels(&[
            ("gpu.deckhouse.io/vendor", "nvidia"),
            ("gpu.deckhouse.io/vendor.metax", "true"),
            ("gpu.deckhouse.io/vendor.nvidia", "true"),
            ("other", "kept"),
        ])
    );
}

#[tokio::test]
async fn a_removed_device_loses_its_gpu_on_the_next_scan_and_nothing_else_is_written() {
    let mut s = setup(|_| {});
    s.sys.two_nvidia_one_metax_one_nic().unwrap();
    s.agent.scan_once().await.unwrap();
    let calls = s.cluster.calls().len();

    let unchanged = s.agent.scan_once().await.unwrap();
    assert!(unchanged.applied.is_empty() && unchanged.deleted.is_empty());
    assert_eq!(s.cluster.calls().len(), calls, "an unchanged scan writes nothing");

    s.sys.remove("0000:5e:00.0").unwrap();
    let outcome = s.agent.scan_once().await.unwrap();
    assert_eq!(outcome.deleted, [M]);
    // B moved from index 2 to 1: its spec changed, its name did not.
    assert_eq!(outcome.applied, [B]);
    assert_eq!(s.cluster.gpus().keys().collect::<Vec<_>>(), [A, B]);
    assert_eq!(s.cluster.gpus()[B].spec.index, 1);
    assert_eq!(
        s.cluster.node("w1").unwrap(),
        labels(&[
            ("gpu.deckhouse.io/vendor", "nvidia"),
            ("gpu.deckhouse.io/vendor.nvidia", "true"),
            ("other", "kept")
        ])
    );

    for address in ["0000:3b:00.0", "0000:86:00.0"] {
        s.sys.remove(address).unwrap();
    }
    let outcome = s.agent.scan_once().await.unwrap();
    assert_eq!(outcome.deleted, [A, B]);
    assert!(s.cluster.gpus().is_empty());
    assert_eq!(s.cluster.node("w1").unwrap(), labels(&[("other", "kept")]));
}

#[tokio::test]
async fn a_gpu_of_another_writer_on_this_node_is_deleted_and_other_nodes_are_left_alone() {
    let mut s = setup(|_| {});
    s.sys.add("0000:3b:00.0", &FakeDevice::gpu("10de", "20b0", "nvidia")).unwrap();
    let mut stale = {
        s.agent.scan_once().await.unwrap();
        s.cluster.gpus()[A].clone()
    };
    stale.name = "w1-stale".into();
    s.cluster.put_gpu(stale.clone());
    let mut foreign = stale.clone();
    foreign.name = "w2-nvidia".into();
    foreign.spec.node_name = "w2".into();
    s.cluster.put_gpu(foreign);
    let outcome = s.agent.scan_once().await.unwrap();
    assert_eq!(outcome.deleted, ["w1-stale"]);
    assert_eq!(s.cluster.gpus().keys().collect::<Vec<_>>(), [A, "w2-nvidia"]);
}

#[tokio::test]
async fn the_vendors_config_map_adds_and_removes_vendors_and_a_bad_one_falls_back() {
    let mut s = setup(|c| c.vendors_config_map = Some(("d8-gpu".into(), "gpu-supported-vendors".into())));
    s.sys.two_nvidia_one_metax_one_nic().unwrap();
    s.sys.add("0000:af:00.0", &FakeDevice::gpu("1002", "74a1", "amdgpu")).unwrap();

    let outcome = s.agent.scan_once().await.unwrap();
    assert!(
        matches!(outcome.vendors_error, Some(VendorsError::Missing { .. })),
        "{:?}",
        outcome.vendors_error
    );
    assert_eq!(outcome.gpus.len(), 3, "built-in table: NVIDIA and MetaX");

    let doc = "vendors:\n  - id: '1002'\n    name: amd\n  - id: '9999'\n    enabled: false\n";
    s.cluster.put_config_map("d8-gpu", "gpu-supported-vendors", labels(&[("vendors.yaml", doc)]));
    let outcome = s.agent.scan_once().await.unwrap();
    assert_eq!(outcome.vendors_error, None);
    assert_eq!(outcome.gpus, ["w1-amd-74a1-0000-af-00-0", A, B]);
    assert_eq!(outcome.deleted, [M]);
    assert_eq!(outcome.node_labels["gpu.deckhouse.io/vendor.amd"], "true");

    s.cluster.put_config_map(
        "d8-gpu",
        "gpu-supported-vendors",
        labels(&[("vendors.yaml", "vendors: [{id: zz}]")]),
    );
    let outcome = s.agent.scan_once().await.unwrap();
    let err = outcome.vendors_error.expect("a bad ConfigMap is reported");
    assert!(err.to_string().contains("d8-gpu/gpu-supported-vendors"), "{err}");
    assert!(err.to_string().contains("\"zz\""), "{err}");
    assert_eq!(outcome.gpus, [M, A, B], "back to the built-in table");
}

#[tokio::test]
async fn control_plane_nodes_are_refused_unless_allowed() {
    let s = setup(|_| {});
    s.cluster.put_node("w1", labels(&[("node-role.kubernetes.io/control-plane", "")]));
    let err = s.agent.check_node().await.unwrap_err();
    assert!(matches!(err, AgentError::ControlPlane(ref n) if n == "w1"), "{err}");
    assert!(err.to_string().contains("--allow-control-plane"));

    let allowed = setup(|c| c.allow_control_plane = true);
    allowed.cluster.put_node("w1", labels(&[("node-role.kubernetes.io/control-plane", "")]));
    allowed.agent.check_node().await.unwrap();

    let missing = setup(|c| c.node_name = "nope".into());
    assert!(matches!(missing.agent.check_node().await, Err(AgentError::NodeNotFound(_))));
}

#[tokio::test]
async fn run_refuses_a_control_plane_node_before_scanning() {
    let s = setup(|_| {});
    s.cluster.put_node("w1", labels(&[("node-role.kubernetes.io/control-plane", "")]));
    s.sys.two_nvidia_one_metax_one_nic().unwrap();
    let err = s.agent.run(std::future::pending()).await.unwrap_err();
    assert!(matches!(err, AgentError::ControlPlane(_)));
    assert!(s.cluster.gpus().is_empty());
}

#[tokio::test]
async fn a_failed_listing_writes_nothing_and_a_failed_write_is_retried() {
    let mut s = setup(|_| {});
    s.sys.two_nvidia_one_metax_one_nic().unwrap();
    s.cluster.fail_next(1);
    let err = s.agent.scan_once().await.unwrap_err();
    assert!(matches!(err, AgentError::Cluster(_)), "the listing failed: {err}");
    assert!(s.cluster.calls().is_empty(), "nothing is written when the listing fails");

    s.cluster.fail_next_writes(1);
    let err = s.agent.scan_once().await.unwrap_err();
    assert!(matches!(err, AgentError::Writes { count: 1, .. }), "{err}");
    assert_eq!(s.cluster.gpus().len(), 2, "the other writes were made");
    let outcome = s.agent.scan_once().await.unwrap();
    assert_eq!(outcome.applied, [M], "only the failed one is retried");
    assert_eq!(s.cluster.gpus().len(), 3);
}

#[tokio::test]
async fn a_missing_sysfs_is_a_scan_error_and_deletes_nothing() {
    let mut s = setup(|c| c.sysfs_root = "/nonexistent/sys".into());
    let mut gpu_setup = setup(|_| {});
    gpu_setup.sys.add("0000:3b:00.0", &FakeDevice::gpu("10de", "20b0", "nvidia")).unwrap();
    gpu_setup.agent.scan_once().await.unwrap();
    s.cluster.put_gpu(gpu_setup.cluster.gpus()[A].clone());
    let err = s.agent.scan_once().await.unwrap_err();
    assert!(matches!(err, AgentError::Discovery(_)), "{err}");
    assert!(err.to_string().contains("/nonexistent/sys"), "{err}");
    assert_eq!(s.cluster.gpus().len(), 1);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Whatever devices are added or removed between two scans, after a scan the cluster holds exactly one
    /// PhysicalGPU per GPU in the tree.
    #[test]
    fn one_scan_converges(first in prop::collection::btree_map(0u8..32, 0u8..4, 0..8),
                          second in prop::collection::btree_map(0u8..32, 0u8..4, 0..8)) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let mut s = setup(|_| {});
        let kinds = [
            FakeDevice::gpu("10de", "20b0", "nvidia"),
            FakeDevice::gpu("10de", "2330", "vfio-pci"),
            FakeDevice::gpu("9999", "4001", "metax"),
            FakeDevice::nic(),
        ];
        for (layout, prev) in [(&first, None), (&second, Some(&first))] {
            if let Some(prev) = prev {
                for slot in prev.keys() {
                    s.sys.remove(&format!("0000:{slot:02x}:00.0")).unwrap();
                }
            }
            for (slot, kind) in layout {
                s.sys.add(&format!("0000:{slot:02x}:00.0"), &kinds[usize::from(*kind)]).unwrap();
            }
            let outcome = runtime.block_on(s.agent.scan_once()).unwrap();
            let expected = layout.values().filter(|k| **k != 3).count();
            prop_assert_eq!(outcome.gpus.len(), expected);
            prop_assert_eq!(s.cluster.gpus().len(), expected);
            let names: Vec<String> = s.cluster.gpus().into_keys().collect();
            prop_assert_eq!(names, outcome.gpus);
        }
    }
}

#[test]
fn the_sample_config_map_is_valid() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/gpu-module/gpu-supported-vendors.yaml");
    let cm: k8s_openapi::api::core::v1::ConfigMap =
        serde_saphyr::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(cm.metadata.name.as_deref(), Some("gpu-supported-vendors"));
    let table =
        vgpu_node_agent::vendors::table_from_data("d8-gpu", "gpu-supported-vendors", &cm.data.unwrap())
            .unwrap();
    let keys: Vec<&str> = table.iter().map(|v| v.key.as_str()).collect();
    assert_eq!(keys, ["nvidia", "metax"]);
}
