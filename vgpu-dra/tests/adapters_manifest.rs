//! `deploy/gpu-module/adapters.yaml` parsed as YAML documents (issue #20, "Adapters"): one kubelet-plugin
//! DaemonSet per vendor, selected by the node agent's `gpu.deckhouse.io/vendor` label, with the vendor's DRA
//! driver name and backend, and a least-privilege ClusterRole that covers the PhysicalGPU status writes of
//! `vgpu_dra::physical_gpu` and nothing beyond the plugin's API calls. The passthrough overlay
//! (`deploy/gpu-module/passthrough/adapter-nvidia.yaml`) is the base NVIDIA DaemonSet plus exactly the gate,
//! the host mounts it needs and the vfio-switch settings, with a Role for the Jobs.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;

use serde_json::Value;

fn documents() -> Vec<Value> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/gpu-module/adapters.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    serde_saphyr::from_multiple(&text).unwrap()
}

fn passthrough_documents() -> Vec<Value> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/gpu-module/passthrough/adapter-nvidia.yaml");
    let text = std::fs::read_to_string(path).unwrap();
    serde_saphyr::from_multiple(&text).unwrap()
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

fn args(ds: &Value) -> Vec<String> {
    let container = &ds["spec"]["template"]["spec"]["containers"][0];
    container["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap().to_owned()).collect()
}

#[test]
fn one_daemonset_per_vendor_with_its_driver_and_backend() {
    let docs = documents();
    let daemonsets = of_kind(&docs, "DaemonSet");
    assert_eq!(daemonsets.len(), 2);
    let mut seen = BTreeSet::new();
    for ds in daemonsets {
        let pod = &ds["spec"]["template"]["spec"];
        let selector = pod["nodeSelector"].as_object().unwrap();
        assert_eq!(selector.len(), 1, "{selector:?}");
        let vendor = selector["gpu.deckhouse.io/vendor"].as_str().unwrap();
        let (driver, backend) = match vendor {
            "nvidia" => (vgpu_dra::DRIVER_NAME, "auto"),
            "metax" => ("gpu.metax-tech.com", "metax"),
            other => panic!("unexpected vendor {other}"),
        };
        let args = args(ds);
        assert!(args.contains(&format!("--driver-name={driver}")), "{vendor}: {args:?}");
        assert!(args.contains(&format!("--backend={backend}")), "{vendor}: {args:?}");
        assert!(!args.iter().any(|a| a == "--physical-gpu-status=false"), "{vendor}: status writes on");
        assert!(args.contains(&"--http-endpoint=:8080".to_owned()), "{vendor}: metrics served: {args:?}");
        assert!(args.contains(&"--enable-rbac=true".to_owned()), "{vendor}: metrics authorized: {args:?}");
        assert_eq!(pod["serviceAccountName"], "vgpu-adapter");
        assert_eq!(ds["metadata"]["namespace"], "d8-gpu");
        // The selector matches the pod template.
        let labels = &ds["spec"]["template"]["metadata"]["labels"];
        for (k, v) in ds["spec"]["selector"]["matchLabels"].as_object().unwrap() {
            assert_eq!(&labels[k], v, "{vendor}: selector label {k}");
        }
        // Every mount has its volume; the plugin and registry directories are the kubelet's.
        let volumes: BTreeSet<&str> =
            pod["volumes"].as_array().unwrap().iter().map(|v| v["name"].as_str().unwrap()).collect();
        let mounts = pod["containers"][0]["volumeMounts"].as_array().unwrap();
        for m in mounts {
            assert!(volumes.contains(m["name"].as_str().unwrap()), "{vendor}: {m}");
        }
        let paths: BTreeSet<&str> = mounts.iter().map(|m| m["mountPath"].as_str().unwrap()).collect();
        assert!(
            paths.is_superset(&BTreeSet::from([
                "/var/lib/kubelet/plugins",
                "/var/lib/kubelet/plugins_registry"
            ]))
        );
        assert!(seen.insert(vendor.to_owned()), "{vendor} twice");
    }
    assert_eq!(seen, BTreeSet::from(["metax".to_owned(), "nvidia".to_owned()]));
}

#[test]
fn rbac_is_least_privilege_and_covers_physical_gpu_status() {
    let docs = documents();
    let accounts = of_kind(&docs, "ServiceAccount");
    assert_eq!(accounts.len(), 1);
    assert_eq!(accounts[0]["metadata"]["name"], "vgpu-adapter");
    let binding = of_kind(&docs, "ClusterRoleBinding")[0];
    assert_eq!(binding["subjects"][0]["name"], "vgpu-adapter");
    assert_eq!(binding["subjects"][0]["namespace"], "d8-gpu");
    let role = of_kind(&docs, "ClusterRole");
    assert_eq!(role.len(), 1);
    assert_eq!(binding["roleRef"]["name"], role[0]["metadata"]["name"]);
    let mut granted = BTreeSet::new();
    for rule in role[0]["rules"].as_array().unwrap() {
        for group in rule["apiGroups"].as_array().unwrap() {
            for resource in rule["resources"].as_array().unwrap() {
                for verb in rule["verbs"].as_array().unwrap() {
                    let (g, r, v) =
                        (group.as_str().unwrap(), resource.as_str().unwrap(), verb.as_str().unwrap());
                    assert!(g != "*" && r != "*" && v != "*", "no wildcards: {rule}");
                    granted.insert(format!("{g}/{r}:{v}"));
                }
            }
        }
    }
    let expected: BTreeSet<String> = [
        "resource.k8s.io/resourceslices:get",
        "resource.k8s.io/resourceslices:list",
        "resource.k8s.io/resourceslices:create",
        "resource.k8s.io/resourceslices:update",
        "resource.k8s.io/resourceslices:delete",
        "resource.k8s.io/resourceclaims:get",
        "resource.k8s.io/resourceclaims:patch",
        "/pods:get",
        "/nodes:get",
        "gpu.deckhouse.io/physicalgpus:get",
        "gpu.deckhouse.io/physicalgpus:list",
        "gpu.deckhouse.io/physicalgpus:watch",
        "gpu.deckhouse.io/physicalgpus/status:patch",
    ]
    .into_iter()
    .map(str::to_owned)
    .collect();
    assert_eq!(granted, expected);
}

/// `--enable-rbac` needs TokenReview and SubjectAccessReview: the adapters' ServiceAccount is bound to
/// `system:auth-delegator`.
#[test]
fn the_adapters_may_review_scrapers() {
    let docs = documents();
    let binding = of_kind(&docs, "ClusterRoleBinding")
        .into_iter()
        .find(|b| b["roleRef"]["name"] == "system:auth-delegator")
        .expect("a binding to system:auth-delegator");
    assert_eq!(binding["subjects"][0]["name"], "vgpu-adapter");
    assert_eq!(binding["subjects"][0]["namespace"], "d8-gpu");
}

/// Removes from `list` (a JSON array) the entries whose `name` is in `names`; the removed ones, by name.
fn take_named(list: &mut Value, names: &[&str]) -> std::collections::BTreeMap<String, Value> {
    let items = list.as_array_mut().unwrap();
    let mut taken = std::collections::BTreeMap::new();
    items.retain(|item| {
        let name = item["name"].as_str().unwrap();
        if names.contains(&name) {
            taken.insert(name.to_owned(), item.clone());
            false
        } else {
            true
        }
    });
    taken
}

#[test]
fn the_passthrough_overlay_is_the_base_plus_the_gate_its_mounts_and_the_switch_jobs() {
    let base = documents();
    let base = of_kind(&base, "DaemonSet")
        .into_iter()
        .find(|d| d["metadata"]["name"] == "vgpu-adapter-nvidia")
        .unwrap()
        .clone();
    let docs = passthrough_documents();
    let daemonsets = of_kind(&docs, "DaemonSet");
    assert_eq!(daemonsets.len(), 1);
    let mut overlay = daemonsets[0].clone();
    assert_eq!(overlay["metadata"], base["metadata"], "same name: it replaces the base DaemonSet");

    let pod = &mut overlay["spec"]["template"]["spec"];
    let env = take_named(
        &mut pod["containers"][0]["env"],
        &["FEATURE_GATES", "HOST_ROOT", "VFIO_SWITCH_NAMESPACE", "VFIO_SWITCH_IMAGE"],
    );
    let value = |name: &str| env[name]["value"].as_str().unwrap().to_owned();
    let gates = value("FEATURE_GATES");
    let configured = vgpu_gates::kubelet_plugin().configure([gates.as_str()]).unwrap();
    assert!(configured.enabled(vgpu_gates::DraGate::PassthroughSupport), "{gates}");
    assert_eq!(value("HOST_ROOT"), "/host-root");
    assert_eq!(value("VFIO_SWITCH_NAMESPACE"), "d8-gpu");
    assert_eq!(value("VFIO_SWITCH_IMAGE"), base["spec"]["template"]["spec"]["containers"][0]["image"]);
    let mounts =
        take_named(&mut pod["containers"][0]["volumeMounts"], &["host-root", "host-sys", "host-modules"]);
    let volumes = take_named(&mut pod["volumes"], &["host-root", "host-sys", "host-modules"]);
    // The gate's host mounts (feature_gates.md): host root, sysfs, /lib/modules; procfs is the base's /proc-host.
    for (name, host, container) in [
        ("host-root", "/", "/host-root"),
        ("host-sys", "/sys", "/sys"),
        ("host-modules", "/lib/modules", "/lib/modules"),
    ] {
        assert_eq!(volumes[name]["hostPath"]["path"], host, "{name}");
        assert_eq!(mounts[name]["mountPath"], container, "{name}");
    }
    let base_volumes = &base["spec"]["template"]["spec"]["volumes"];
    assert!(base_volumes.as_array().unwrap().iter().any(|v| v["hostPath"]["path"] == "/proc"), "procfs");
    assert_eq!(overlay, base, "nothing else differs from the base DaemonSet");

    // The Role: exactly the Job calls of the switch controller, in the Jobs' namespace, bound to the adapter.
    let role = of_kind(&docs, "Role")[0];
    assert_eq!(role["metadata"]["namespace"], "d8-gpu");
    let mut granted = BTreeSet::new();
    for rule in role["rules"].as_array().unwrap() {
        for resource in rule["resources"].as_array().unwrap() {
            for verb in rule["verbs"].as_array().unwrap() {
                granted.insert(format!(
                    "{}/{}:{}",
                    rule["apiGroups"][0].as_str().unwrap(),
                    resource.as_str().unwrap(),
                    verb.as_str().unwrap()
                ));
            }
        }
    }
    let expected: BTreeSet<String> = [
        "batch/jobs:get",
        "batch/jobs:list",
        "batch/jobs:watch",
        "batch/jobs:create",
        "batch/jobs:delete",
        "/pods:list",
    ]
    .into_iter()
    .map(str::to_owned)
    .collect();
    assert_eq!(granted, expected);
    let binding = of_kind(&docs, "RoleBinding")[0];
    assert_eq!(binding["roleRef"]["name"], role["metadata"]["name"]);
    assert_eq!(binding["subjects"][0]["name"], "vgpu-adapter");
    assert_eq!(binding["metadata"]["namespace"], "d8-gpu");
}
