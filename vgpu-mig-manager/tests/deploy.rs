//! The manifests under `deploy/mig-manager/` at the file layer: the sample mig-parted ConfigMap parses and
//! every layout in it fits an A100 80GB and an H100 80GB (mock backends, the real planner), and the
//! gpu-module chart's own ConfigMap (`charts/gpu-module/files/mig-parted-config.yaml`) holds the same
//! layouts; the DaemonSet
//! tolerates the manager's own maintenance taint and names the ConfigMap the RBAC lets it read; the RBAC
//! grants every call of `KubeCluster` (its module docs' table).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use k8s_openapi::api::{
    apps::v1::DaemonSet,
    core::v1::ConfigMap,
    rbac::v1::{ClusterRole, Role},
};
use vgpu_core::backend::{DeviceBackend, mock::MockBackend};
use vgpu_mig_manager::{TAINT_KEY, config::MigConfigFile, plan::plan};

fn deploy(file: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/mig-manager").join(file))
        .unwrap()
}

#[test]
fn every_sample_layout_fits_80gb_gpus() {
    let cm: ConfigMap = serde_saphyr::from_str(&deploy("config.yaml")).unwrap();
    let text = cm.data.unwrap().remove("config.yaml").unwrap();
    let file = MigConfigFile::parse(&text, "deploy/mig-manager/config.yaml").unwrap();
    assert!(file.configs.len() >= 8);
    for name in ["NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"] {
        let backend = MockBackend::from_yaml_str(&format!(
            "gpus:\n  - {{ uuid: GPU-0, name: {name}, memoryMiB: 81920, mig: {{ mode: Disabled }} }}\n"
        ))
        .unwrap();
        for config in file.configs.keys() {
            let targets =
                file.targets(config, 1, |i| backend.pci_device_id(i).map_err(|e| e.to_string())).unwrap();
            let plans = plan(&backend, &targets).unwrap_or_else(|e| panic!("{name} {config}: {e}"));
            let wanted: u32 = targets[&0].mig_devices.values().sum();
            assert_eq!(plans[0].instances.len() as u32, wanted, "{config}");
        }
    }
}

#[test]
fn the_charts_layouts_are_the_samples() {
    let cm: ConfigMap = serde_saphyr::from_str(&deploy("config.yaml")).unwrap();
    let sample = cm.data.unwrap().remove("config.yaml").unwrap();
    let sample = MigConfigFile::parse(&sample, "deploy/mig-manager/config.yaml").unwrap();
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/gpu-module/files/mig-parted-config.yaml");
    let chart = MigConfigFile::parse(&std::fs::read_to_string(&path).unwrap(), "chart").unwrap();
    assert_eq!(chart, sample, "{} differs from deploy/mig-manager/config.yaml", path.display());
}

#[test]
fn daemonset_and_rbac_match_the_manager() {
    let ds: DaemonSet = serde_saphyr::from_str(&deploy("daemonset.yaml")).unwrap();
    let pod = ds.spec.template.spec.unwrap();
    assert!(pod.tolerations.unwrap().iter().any(|t| t.key.as_deref() == Some(TAINT_KEY)));
    let args = pod.containers[0].args.clone().unwrap();
    assert!(args.contains(&"--config-map=d8-gpu/default-mig-parted-config".to_owned()));
    assert_eq!(pod.service_account_name.as_deref(), Some("vgpu-mig-manager"));

    let docs: Vec<serde_json::Value> = serde_saphyr::from_multiple(&deploy("rbac.yaml")).unwrap();
    let cluster_role: ClusterRole =
        serde_json::from_value(docs.iter().find(|d| d["kind"] == "ClusterRole").unwrap().clone()).unwrap();
    let grants = |rules: &[k8s_openapi::api::rbac::v1::PolicyRule], resource: &str, verb: &str| {
        rules
            .iter()
            .any(|r| r.resources.iter().flatten().any(|x| x == resource) && r.verbs.iter().any(|v| v == verb))
    };
    let rules = cluster_role.rules.unwrap();
    for (resource, verb) in [
        ("nodes", "get"),
        ("nodes", "patch"),
        ("pods", "list"),
        ("pods", "delete"),
        ("pods/eviction", "create"),
    ] {
        assert!(grants(&rules, resource, verb), "{resource} {verb}");
    }
    let role: Role =
        serde_json::from_value(docs.iter().find(|d| d["kind"] == "Role").unwrap().clone()).unwrap();
    let role_rules = role.rules.unwrap();
    assert!(grants(&role_rules, "configmaps", "get"));
    assert_eq!(role.metadata.namespace.as_deref(), Some("d8-gpu"));
    assert_eq!(role_rules[0].resource_names.as_deref(), Some(&["default-mig-parted-config".to_owned()][..]));
}
