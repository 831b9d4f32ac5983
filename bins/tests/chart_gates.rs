//! The charts' feature-gate data, generated from `vgpu-gates` (the codegen pattern: the test fails when a
//! committed file differs; `VGPU_REGEN=1 cargo test -p vgpu-bins --test chart_gates` rewrites them), and the
//! chart's own rule check compared with `vgpu-gates` on every combination of the 14 DRA driver gates (the spec's 13
//! and ConsumableShares; the three logging gates take part in no rule and stay at their defaults).
//!
//! | file | what |
//! |---|---|
//! | `charts/<chart>/files/gates.json` | per component: gates (name, default, stage, locked) and rules, read by `templates/_gates.tpl` |
//! | `charts/<chart>/values.schema.json` | each gate map at its values path accepts exactly the component's gate names, booleans only |
//!
//! The rule check renders once with `helm template` (Helm built by `e2e/build-helm.sh`; the test says so and
//! skips that part where Helm is not built): a test-only value `gateCheckMatrix` makes `templates/gate-matrix.yaml`
//! evaluate the chart's check for each of the 16,384 maps, and every answer must equal `vgpu-gates`' violations
//! (message and fix, in rule order). And values files written for vgpu-manager's charts (the five gate maps at
//! the spec's paths) render the same `--feature-gates` / `FEATURE_GATES` strings as `vgpuctl gates render`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use serde_json::{Value, json};
use vgpu_gates::{Component, DraGate, FeatureGate, Rule};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn rules<G: FeatureGate>(rules: &[Rule<G>]) -> Value {
    rules
        .iter()
        .map(|r| match *r {
            Rule::Requires { gate, requires } => {
                json!({"kind": "requires", "gate": gate.name(), "other": requires.name()})
            }
            Rule::MutuallyExclusive(a, b) => {
                json!({"kind": "exclusive", "gate": a.name(), "other": b.name()})
            }
        })
        .collect()
}

fn component(c: Component) -> Value {
    let gates: Vec<Value> = c
        .registry()
        .gate_infos()
        .into_iter()
        .map(|g| {
            json!({
                "name": g.name,
                "default": g.spec.default,
                "stage": g.spec.stage.as_str(),
                "locked": g.spec.lock_to_default,
            })
        })
        .collect();
    let rules = match c {
        Component::DevicePlugin => rules(vgpu_gates::device_plugin().rules()),
        Component::SchedulerExtender => rules(vgpu_gates::scheduler_extender().rules()),
        Component::DeviceMonitor => rules(vgpu_gates::device_monitor().rules()),
        Component::KubeletPlugin => rules(vgpu_gates::kubelet_plugin().rules()),
    };
    json!({"gates": gates, "rules": rules})
}

/// The charts and the components whose gate maps each one holds.
const CHARTS: [(&str, &[Component]); 2] = [
    ("vgpu-manager", &[Component::DevicePlugin, Component::DeviceMonitor, Component::SchedulerExtender]),
    ("vgpu-manager-dra-driver", &[Component::KubeletPlugin, Component::DeviceMonitor]),
];

fn gates_json(components: &[Component]) -> String {
    let mut map = serde_json::Map::new();
    for c in components {
        map.insert(c.as_str().to_owned(), component(*c));
    }
    serde_json::to_string_pretty(&Value::Object(map)).unwrap() + "\n"
}

/// The gate map schema of one component: exactly its gate names, booleans.
fn gate_map_schema(c: Component) -> Value {
    let names = c.gate_names();
    let props: serde_json::Map<String, Value> = names
        .iter()
        .map(|n| {
            (
                (*n).to_owned(),
                json!({"type": "boolean", "description": format!("Feature gate {n} of {}", c.as_str())}),
            )
        })
        .collect();
    json!({
        "type": "object",
        "description": format!("Feature gates of {} (name: true|false); rendered into its --feature-gates", c.as_str()),
        "properties": props,
        "additionalProperties": false,
    })
}

/// Puts `leaf` at the dotted `path` of `schema`, creating `object` nodes on the way.
fn insert(schema: &mut Value, path: &str, leaf: Value) {
    let mut cur = schema;
    let parts: Vec<&str> = path.split('.').collect();
    for (i, part) in parts.iter().enumerate() {
        let obj = cur.as_object_mut().unwrap();
        obj.entry("type").or_insert(json!("object"));
        let props = obj.entry("properties").or_insert(json!({}));
        let node = props.as_object_mut().unwrap().entry((*part).to_owned()).or_insert(json!({}));
        if i + 1 == parts.len() {
            *node = leaf.clone();
        }
        cur = node;
    }
}

fn values_schema(chart: &str, components: &[Component]) -> String {
    let mut schema = json!({
        "$schema": "https://json-schema.org/draft-07/schema#",
        "title": format!("{chart} values"),
        "type": "object",
    });
    for c in components {
        for path in c.chart_values_paths() {
            let in_chart = match chart {
                "vgpu-manager" => path.starts_with("devicePlugin.") || path.starts_with("scheduler."),
                _ => path.starts_with("kubeletPlugin."),
            };
            if in_chart {
                insert(&mut schema, path, gate_map_schema(*c));
            }
        }
    }
    // Hand-written: the observability values (charts/<chart>/files/monitoring.schema.json), checked by
    // charts/tests/monitoring.sh.
    let monitoring = repo().join("charts").join(chart).join("files/monitoring.schema.json");
    if let Ok(text) = std::fs::read_to_string(&monitoring) {
        insert(&mut schema, "monitoring", serde_json::from_str(&text).unwrap());
    }
    // Test-only: the rule-check matrix of tests/chart_gates.rs.
    insert(
        &mut schema,
        "gateCheckMatrix",
        json!({"type": "array", "description": "test only: gate maps whose rule check templates/gate-matrix.yaml renders"}),
    );
    serde_json::to_string_pretty(&schema).unwrap() + "\n"
}

fn check_or_write(path: &Path, want: &str) -> Option<String> {
    if std::env::var_os("VGPU_REGEN").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, want).unwrap();
        return None;
    }
    let have = std::fs::read_to_string(path).unwrap_or_default();
    (have != want).then(|| format!("{} differs from vgpu-gates (VGPU_REGEN=1 rewrites it)", path.display()))
}

#[test]
fn committed_gate_data_and_schemas_match_vgpu_gates() {
    let mut stale = Vec::new();
    for (chart, comps) in CHARTS {
        let dir = repo().join("charts").join(chart);
        stale.extend(check_or_write(&dir.join("files/gates.json"), &gates_json(comps)));
        stale.extend(check_or_write(&dir.join("values.schema.json"), &values_schema(chart, comps)));
    }
    assert!(stale.is_empty(), "{}", stale.join("\n"));
}

/// Helm, from `VGPU_HELM` or the cache `e2e/build-helm.sh` fills.
fn helm() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("VGPU_HELM") {
        return Some(PathBuf::from(p));
    }
    let cache = std::env::var_os("VGPU_E2E_CACHE").map(PathBuf::from).or_else(|| {
        std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .map(|c| c.join("vgpu-e2e"))
    })?;
    let mut found: Vec<PathBuf> = std::fs::read_dir(cache)
        .ok()?
        .filter_map(Result::ok)
        .map(|e| e.path().join("helm"))
        .filter(|p| {
            p.parent()
                .is_some_and(|d| d.file_name().is_some_and(|n| n.to_string_lossy().starts_with("helm-")))
                && p.is_file()
        })
        .collect();
    found.sort();
    found.pop()
}

/// `vgpu-gates`' answer for one explicit map: each violation as `message; fix: ...`.
fn expected(map: &[(String, bool)]) -> Vec<String> {
    match Component::KubeletPlugin.registry().configure_map(map) {
        Ok(_) => Vec::new(),
        Err(vgpu_gates::Error::Validation(e)) => e.violations().iter().map(ToString::to_string).collect(),
        Err(e) => panic!("unexpected error for {map:?}: {e}"),
    }
}

#[test]
fn chart_rule_check_agrees_with_vgpu_gates_on_every_dra_combination() {
    let Some(helm) = helm() else {
        eprintln!("skipped: Helm is not built (run e2e/build-helm.sh or set VGPU_HELM)");
        return;
    };
    let names: Vec<&str> =
        DraGate::ALL.iter().filter(|g| !DraGate::LOGGING.contains(g)).map(|g| g.name()).collect();
    assert_eq!(names.len(), 14, "the 13 gates of the spec and ConsumableShares");
    let maps: Vec<Vec<(String, bool)>> = (0u32..1 << names.len())
        .map(|mask| names.iter().enumerate().map(|(i, n)| ((*n).to_owned(), mask & (1 << i) != 0)).collect())
        .collect();
    let matrix: Vec<Value> =
        maps.iter().map(|m| Value::Object(m.iter().map(|(k, v)| (k.clone(), json!(v))).collect())).collect();
    let dir = tempfile::tempdir().unwrap();
    let values = dir.path().join("matrix.json");
    std::fs::write(&values, serde_json::to_vec(&json!({"gateCheckMatrix": matrix})).unwrap()).unwrap();
    let out = Command::new(&helm)
        .args(["template", "t", "--kube-version", "1.37.2"])
        .arg(repo().join("charts/vgpu-manager-dra-driver"))
        .args(["--show-only", "templates/gate-matrix.yaml", "-f"])
        .arg(&values)
        .output()
        .unwrap();
    assert!(out.status.success(), "helm template failed: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let start = text.find("results: ").expect("a results line") + "results: ".len();
    let line = text[start..].lines().next().unwrap();
    let results: Vec<Vec<String>> =
        serde_json::from_str(&serde_json::from_str::<String>(line).unwrap()).unwrap();
    assert_eq!(results.len(), maps.len());
    let mut failing = 0;
    for (map, got) in maps.iter().zip(&results) {
        let want = expected(map);
        assert_eq!(&want, got, "chart and vgpu-gates disagree for {map:?}");
        failing += usize::from(!want.is_empty());
    }
    // Both answers occur: the comparison is not vacuous.
    assert!(failing > 0 && failing < maps.len());
}

/// `helm template` of `chart` with `sets`; the rendered documents as `(kind, name, text)`.
fn render(helm: &Path, chart: &str, sets: &[&str]) -> Vec<(String, String, String)> {
    let mut cmd = Command::new(helm);
    cmd.args(["template", "t", "--kube-version", "1.37.2", "-n", "d8-gpu"])
        .arg(repo().join("charts").join(chart));
    for s in sets {
        cmd.args(["--set", s]);
    }
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "helm template {chart} {sets:?}: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    text.split("\n---\n")
        .filter_map(|doc| {
            let field =
                |key: &str| doc.lines().find_map(|l| l.strip_prefix(key)).map(|v| v.trim().to_owned());
            Some((field("kind: ")?, field("  name: ")?, doc.to_owned()))
        })
        .collect()
}

/// The gpu-module chart's one switch between its modes: `dra.enabled=true` deploys the vendor adapters (kubelet
/// plugins selected by `gpu.deckhouse.io/vendor`) and no device plugin; `false` (the default) deploys the device
/// plugin with `--gfd-labels` and `--whole-gpus` and the MIG manager, and no adapter. The node agent and the
/// controller run in both.
#[test]
fn gpu_module_dra_switch_selects_the_mode() {
    let Some(helm) = helm() else {
        eprintln!("skipped: Helm is not built (run e2e/build-helm.sh or set VGPU_HELM)");
        return;
    };
    let daemonsets = |docs: &[(String, String, String)]| -> Vec<String> {
        let mut names: Vec<String> =
            docs.iter().filter(|(k, _, _)| k == "DaemonSet").map(|(_, n, _)| n.clone()).collect();
        names.sort();
        names
    };
    let dra = render(&helm, "gpu-module", &["dra.enabled=true"]);
    assert_eq!(daemonsets(&dra), ["vgpu-adapter-metax", "vgpu-adapter-nvidia", "vgpu-node-agent"]);
    let metax = dra.iter().find(|(_, n, _)| n == "vgpu-adapter-metax").unwrap();
    assert!(
        metax.2.contains("gpu.deckhouse.io/vendor: metax")
            && metax.2.contains("--driver-name=gpu.metax-tech.com")
    );
    assert!(dra.iter().any(|(k, n, _)| k == "Deployment" && n == "vgpu-controller"));

    let dp = render(&helm, "gpu-module", &[]);
    assert_eq!(daemonsets(&dp), ["vgpu-device-plugin-default", "vgpu-mig-manager", "vgpu-node-agent"]);
    let plugin = dp.iter().find(|(k, n, _)| k == "DaemonSet" && n == "vgpu-device-plugin-default").unwrap();
    assert!(plugin.2.contains("--gfd-labels") && plugin.2.contains("--whole-gpus"));
    assert!(dp.iter().any(|(k, n, _)| k == "Deployment" && n == "vgpu-controller"));
}

/// The gpu-module chart ships the `gpu-supported-vendors` ConfigMap and points the node agent at it; the
/// agent's own parser reads its vendor table (NVIDIA and MetaX). A ConfigMap named by the values replaces it.
#[test]
fn gpu_module_ships_the_vendors_config_map_the_node_agent_reads() {
    let Some(helm) = helm() else {
        eprintln!("skipped: Helm is not built (run e2e/build-helm.sh or set VGPU_HELM)");
        return;
    };
    let docs = render(&helm, "gpu-module", &[]);
    let (_, _, text) = docs
        .iter()
        .find(|(k, n, _)| k == "ConfigMap" && n == "gpu-supported-vendors")
        .expect("the chart ships gpu-supported-vendors");
    let cm: k8s_openapi::api::core::v1::ConfigMap = serde_saphyr::from_str(text).unwrap();
    assert_eq!(cm.metadata.namespace.as_deref(), Some("d8-gpu"));
    let table =
        vgpu_node_agent::vendors::table_from_data("d8-gpu", "gpu-supported-vendors", &cm.data.unwrap())
            .unwrap();
    let keys: Vec<&str> = table.iter().map(|v| v.key.as_str()).collect();
    assert_eq!(keys, ["nvidia", "metax"]);
    let agent = docs.iter().find(|(k, n, _)| k == "DaemonSet" && n == "vgpu-node-agent").unwrap();
    assert!(agent.2.contains("--vendors-configmap=d8-gpu/gpu-supported-vendors"), "{}", agent.2);

    let own = render(&helm, "gpu-module", &["nodeAgent.vendorsConfigMap=ops/my-vendors"]);
    assert!(!own.iter().any(|(k, n, _)| k == "ConfigMap" && n == "gpu-supported-vendors"));
    let agent = own.iter().find(|(k, n, _)| k == "DaemonSet" && n == "vgpu-node-agent").unwrap();
    assert!(agent.2.contains("--vendors-configmap=ops/my-vendors"), "{}", agent.2);
}

/// The node DaemonSets of vgpu-manager's two charts join the host's PID namespace exactly when something in
/// the pod needs host PIDs: the monitor sidecar (NVML's process PIDs against the containers' `cgroup.procs`),
/// `DevicePluginClientMode` (the registry's `SO_PEERCRED` PIDs) or `SharedSMUtilizationWatcher`; all eight
/// combinations of the three, for each chart.
#[test]
fn node_daemonsets_share_the_host_pid_namespace_exactly_when_needed() {
    let Some(helm) = helm() else {
        eprintln!("skipped: Helm is not built (run e2e/build-helm.sh or set VGPU_HELM)");
        return;
    };
    let charts = [
        (
            "vgpu-manager",
            "t-vgpu-manager-device-plugin",
            "devicePlugin.deviceMonitor.enabled",
            "devicePlugin.devicePlugin.commands",
        ),
        (
            "vgpu-manager-dra-driver",
            "t-vgpu-manager-dra-driver-kubelet-plugin",
            "kubeletPlugin.containers.monitor.enabled",
            "kubeletPlugin.containers.plugin",
        ),
    ];
    for (chart, daemonset, monitor, gates) in charts {
        for bits in 0..8u8 {
            let (with_monitor, client, watcher) = (bits & 1 != 0, bits & 2 != 0, bits & 4 != 0);
            let sets = [
                format!("{monitor}={with_monitor}"),
                format!("{gates}.featureGates.DevicePluginClientMode={client}"),
                format!("{gates}.featureGates.SharedSMUtilizationWatcher={watcher}"),
            ];
            let sets: Vec<&str> = sets.iter().map(String::as_str).collect();
            let docs = render(&helm, chart, &sets);
            let (_, _, text) = docs
                .iter()
                .find(|(k, n, _)| k == "DaemonSet" && n == daemonset)
                .unwrap_or_else(|| panic!("{chart}: no DaemonSet {daemonset}"));
            let want = with_monitor || client || watcher;
            assert_eq!(text.contains("\n      hostPID: true\n"), want, "{chart} {sets:?}");
            assert!(text.contains("--host-proc-root=/proc-host"), "{chart} {sets:?}");
        }
    }
}

/// The container `name` of the rendered workloads: its `--feature-gates=` argument or its `FEATURE_GATES` env.
fn rendered_gates(docs: &[Value], container: &str) -> String {
    let c = docs
        .iter()
        .filter_map(|doc| doc.pointer("/spec/template/spec/containers").and_then(Value::as_array))
        .flatten()
        .find(|c| c["name"] == container)
        .unwrap_or_else(|| panic!("no container {container} in the rendered workloads"));
    let from_args = c["args"]
        .as_array()
        .into_iter()
        .flatten()
        .find_map(|a| a.as_str()?.strip_prefix("--feature-gates=").map(str::to_owned));
    let from_env = c["env"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| e["name"] == "FEATURE_GATES")
        .and_then(|e| e["value"].as_str().map(str::to_owned));
    from_args.or(from_env).unwrap_or_default()
}

/// Values files written for vgpu-manager's charts, with the five gate maps at the spec's paths, render the
/// same `--feature-gates` / `FEATURE_GATES` strings as `vgpuctl gates render` makes of the same files.
#[test]
fn chart_gate_strings_equal_vgpuctl_gates_render() {
    let Some(helm) = helm() else {
        eprintln!("skipped: Helm is not built (run e2e/build-helm.sh or set VGPU_HELM)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // Helm merges these maps over the chart's own (the device plugin's turns HonorPreAllocatedDeviceIDs on);
    // vgpuctl renders the file alone, so every gate the chart sets by default is set here too.
    let manager = dir.path().join("vgpu-manager-values.yaml");
    std::fs::write(
        &manager,
        "devicePlugin:\n  devicePlugin:\n    commands:\n      featureGates:\n        TopologyAwareGPUAllocation: true\n        SharedSMUtilizationWatcher: true\n        GPUCoreResourcePlugin: false\n        HonorPreAllocatedDeviceIDs: false\n  deviceMonitor:\n    commands:\n      featureGates:\n        VirtualMemoryTracking: true\nscheduler:\n  schedulerExtender:\n    commands:\n      featureGates:\n        SerializedNodeBind: true\n        TopologyAwareGPUAllocation: true\n",
    )
    .unwrap();
    let dra = dir.path().join("dra-values.yaml");
    std::fs::write(
        &dra,
        "kubeletPlugin:\n  containers:\n    plugin:\n      featureGates:\n        DynamicMIG: true\n        NVMLDeviceHealthCheck: false\n        TimeSlicingSettings: true\n    monitor:\n      featureGates:\n        SharedSMUtilizationWatcher: true\n",
    )
    .unwrap();
    let cases = [
        ("vgpu-manager", &manager, "device-plugin", "device-plugin"),
        ("vgpu-manager", &manager, "device-monitor", "device-monitor"),
        ("vgpu-manager", &manager, "scheduler-extender", "scheduler-extender"),
        ("vgpu-manager-dra-driver", &dra, "plugin", "kubelet-plugin"),
        ("vgpu-manager-dra-driver", &dra, "monitor", "device-monitor"),
    ];
    for (chart, values, container, component) in cases {
        let out = Command::new(&helm)
            .args(["template", "t", "--kube-version", "1.37.2"])
            .arg(repo().join("charts").join(chart))
            .arg("-f")
            .arg(values)
            .output()
            .unwrap();
        assert!(out.status.success(), "helm template {chart}: {}", String::from_utf8_lossy(&out.stderr));
        let docs: Vec<Value> = serde_saphyr::from_multiple(&String::from_utf8(out.stdout).unwrap()).unwrap();
        let rendered = rendered_gates(&docs, container);
        let vgpuctl = Command::new(env!("CARGO_BIN_EXE_vgpuctl"))
            .args(["gates", "render", "--component", component, "--values"])
            .arg(values)
            .output()
            .unwrap();
        assert!(vgpuctl.status.success(), "{}", String::from_utf8_lossy(&vgpuctl.stderr));
        let want = String::from_utf8(vgpuctl.stdout).unwrap().trim().to_owned();
        assert!(!want.is_empty(), "{chart}/{container}: the values set gates");
        assert_eq!(rendered, want, "{chart}/{container} ({component})");
    }
}

/// `helm template` of `chart` with `sets`: its error text when the render fails.
fn render_error(helm: &Path, chart: &str, sets: &[&str]) -> Option<String> {
    let mut cmd = Command::new(helm);
    cmd.args(["template", "t", "--kube-version", "1.37.2", "-n", "d8-gpu"])
        .arg(repo().join("charts").join(chart));
    for s in sets {
        cmd.args(["--set", s]);
    }
    let out = cmd.output().unwrap();
    (!out.status.success()).then(|| String::from_utf8_lossy(&out.stderr).into_owned())
}

/// The values that run the charts on a test node (issue #33, `e2e/tests/real_node_helm.rs`): the mock backend
/// is refused at render time without its description file, and with it every container that opens the backend
/// gets `--mock-config` and the file mounted; the kubelet's root, the host folders and the sysfs root are
/// the values', not fixed paths.
#[test]
fn charts_take_the_mock_backend_and_the_node_paths_from_values() {
    let Some(helm) = helm() else {
        eprintln!("skipped: Helm is not built (run e2e/build-helm.sh or set VGPU_HELM)");
        return;
    };
    for (chart, sets, needs) in [
        ("vgpu-manager", vec!["devicePlugin.devicePlugin.commands.backend=mock"], "devicePlugin.mockConfig"),
        ("gpu-module", vec!["devicePluginMode.backend=mock"], "devicePluginMode.mockConfig"),
        ("gpu-module", vec!["dra.enabled=true", "adapters.nvidia.backend=mock"], "adapters.mockConfig"),
    ] {
        let error = render_error(&helm, chart, &sets).unwrap_or_else(|| panic!("{chart} {sets:?} rendered"));
        assert!(error.contains(needs), "{chart} {sets:?}: {error}");
    }

    let docs = render(
        &helm,
        "vgpu-manager",
        &[
            "devicePlugin.devicePlugin.commands.backend=mock",
            "devicePlugin.mockConfig=/srv/mock.yaml",
            "devicePlugin.kubeletRootDir=/srv/kubelet/",
        ],
    );
    let ds =
        &docs.iter().find(|(k, n, _)| k == "DaemonSet" && n == "t-vgpu-manager-device-plugin").unwrap().2;
    assert_eq!(ds.matches("--mock-config=/etc/vgpu-mock/config.yaml").count(), 2, "plugin and monitor: {ds}");
    for want in [
        "hostPath: {path: /srv/mock.yaml, type: File}",
        "hostPath: {path: /srv/kubelet/device-plugins}",
        "hostPath: {path: /srv/kubelet/pod-resources}",
    ] {
        assert!(ds.contains(want), "{want} in {ds}");
    }

    let docs = render(
        &helm,
        "gpu-module",
        &[
            "devicePluginMode.backend=mock",
            "devicePluginMode.mockConfig=/srv/mock.yaml",
            "devicePluginMode.kubeletRootDir=/srv/kubelet",
            "devicePluginMode.hostManagerDir=/srv/manager",
            "devicePluginMode.driverRoot=/srv/driver",
            "nodeAgent.sysfsRoot=/srv/sys",
        ],
    );
    let plugin =
        &docs.iter().find(|(k, n, _)| k == "DaemonSet" && n == "vgpu-device-plugin-default").unwrap().2;
    for want in [
        "--backend=mock",
        "--mock-config=/etc/vgpu-mock/config.yaml",
        "hostPath: {path: /srv/kubelet/device-plugins}",
        "hostPath: {path: /srv/manager, type: DirectoryOrCreate}",
        "hostPath: {path: /srv/driver}",
        "{name: HOST_MANAGER_DIR, value: \"/srv/manager\"}",
    ] {
        assert!(plugin.contains(want), "{want} in {plugin}");
    }
    let mig = &docs.iter().find(|(k, n, _)| k == "DaemonSet" && n == "vgpu-mig-manager").unwrap().2;
    assert!(mig.contains("--mock-config=/etc/vgpu-mock/config.yaml"), "{mig}");
    let agent = &docs.iter().find(|(k, n, _)| k == "DaemonSet" && n == "vgpu-node-agent").unwrap().2;
    assert!(agent.contains("--sysfs-root=/srv/sys") && agent.contains("mountPath: /srv/sys"), "{agent}");

    let docs = render(
        &helm,
        "gpu-module",
        &["dra.enabled=true", "adapters.nvidia.backend=mock", "adapters.mockConfig=/srv/mock.yaml"],
    );
    let nvidia = &docs.iter().find(|(k, n, _)| k == "DaemonSet" && n == "vgpu-adapter-nvidia").unwrap().2;
    assert!(nvidia.contains("--mock-config=/etc/vgpu-mock/config.yaml") && nvidia.contains("/srv/mock.yaml"));
    let metax = &docs.iter().find(|(k, n, _)| k == "DaemonSet" && n == "vgpu-adapter-metax").unwrap().2;
    assert!(!metax.contains("mock"), "{metax}");
}

/// The generated webhook certificates: the caBundle is the Secret's `ca.crt` (what `helm upgrade` reads back with
/// `lookup` to keep the pair), and vgpu-manager's webhook never sees the release namespace's own pods.
#[test]
fn generated_webhook_certificates_carry_their_ca_and_skip_the_release_namespace() {
    let Some(helm) = helm() else {
        eprintln!("skipped: Helm is not built (run e2e/build-helm.sh or set VGPU_HELM)");
        return;
    };
    for (chart, secret, hooks) in [
        ("vgpu-manager", "t-vgpu-manager-webhook-tls", "t-vgpu-manager-webhook-mutating"),
        ("gpu-module", "vgpu-controller-cert", "vgpu-controller-mutate"),
    ] {
        let docs = render(&helm, chart, &[]);
        let secret = &docs.iter().find(|(k, n, _)| k == "Secret" && n == secret).unwrap().2;
        let ca = secret
            .lines()
            .find_map(|l| l.trim().strip_prefix("ca.crt: "))
            .unwrap_or_else(|| panic!("{chart}: no ca.crt in {secret}"));
        let hooks =
            &docs.iter().find(|(k, n, _)| k == "MutatingWebhookConfiguration" && n == hooks).unwrap().2;
        assert!(hooks.contains(&format!("caBundle: {ca}")), "{chart}: caBundle is not the Secret's ca.crt");
    }
    let docs = render(&helm, "vgpu-manager", &[]);
    let hooks = &docs.iter().find(|(k, _, _)| k == "MutatingWebhookConfiguration").unwrap().2;
    let selector = hooks.split("namespaceSelector:").nth(1).unwrap();
    let names = selector.split("objectSelector:").next().unwrap();
    assert!(names.contains("- d8-gpu"), "the release namespace is not excluded: {names}");
}

/// `nfd.enabled` sends the device plugin's GPU feature labels to node-feature-discovery's feature file (the
/// host's `features.d` mounted at the same path, `--gfd-output=nfd-feature-file`, no `--gfd-labels`) and ships
/// the NodeFeatureRule `gpu-module-nvidia` with the `nfd.rules` labels and taints; off (the default): neither.
/// The rule is run by the real nfd-master in e2e/tests/nfd.rs.
#[test]
fn gpu_module_nfd_switch_writes_the_feature_file_and_ships_the_rule() {
    let Some(helm) = helm() else {
        eprintln!("skipped: Helm is not built (run e2e/build-helm.sh or set VGPU_HELM)");
        return;
    };
    let plugin = |docs: &[(String, String, String)]| -> String {
        docs.iter().find(|(k, n, _)| k == "DaemonSet" && n == "vgpu-device-plugin-default").unwrap().2.clone()
    };
    let off = render(&helm, "gpu-module", &[]);
    assert!(!off.iter().any(|(k, _, _)| k == "NodeFeatureRule"));
    let text = plugin(&off);
    assert!(text.contains("--gfd-labels") && !text.contains("--gfd-output") && !text.contains("features.d"));

    let on = render(
        &helm,
        "gpu-module",
        &[
            "nfd.enabled=true",
            "nfd.interval=30s",
            "nfd.rules.taints[0].key=gpu.deckhouse.io/nvidia",
            "nfd.rules.taints[0].effect=NoSchedule",
        ],
    );
    let ds: k8s_openapi::api::apps::v1::DaemonSet = serde_saphyr::from_str(&plugin(&on)).unwrap();
    let pod = ds.spec.template.spec.unwrap();
    let args = pod.containers[0].args.clone().unwrap();
    for want in [
        "--gfd-output=nfd-feature-file",
        "--nfd-feature-file=/etc/kubernetes/node-feature-discovery/features.d/gfd",
        "--nfd-feature-interval=30s",
    ] {
        assert!(args.iter().any(|a| a == want), "{want} missing from {args:?}");
    }
    assert!(!args.iter().any(|a| a == "--gfd-labels"), "{args:?}");
    let mount =
        pod.containers[0].volume_mounts.as_ref().unwrap().iter().find(|m| m.name == "nfd-features").unwrap();
    assert_eq!(mount.mount_path, "/etc/kubernetes/node-feature-discovery/features.d");
    assert!(mount.read_only != Some(true));
    let volume =
        pod.volumes.unwrap().into_iter().find(|v| v.name == "nfd-features").unwrap().host_path.unwrap();
    assert_eq!(volume.path, "/etc/kubernetes/node-feature-discovery/features.d");
    assert_eq!(volume.type_.as_deref(), Some("DirectoryOrCreate"));

    let (_, _, rule) =
        on.iter().find(|(k, n, _)| k == "NodeFeatureRule" && n == "gpu-module-nvidia").unwrap();
    let rule: Value = serde_saphyr::from_str(rule).unwrap();
    assert_eq!(rule["apiVersion"], "nfd.k8s-sigs.io/v1alpha1");
    let r = &rule["spec"]["rules"][0];
    assert_eq!(r["labels"], json!({"gpu.deckhouse.io/nvidia.present": "true"}));
    assert_eq!(r["taints"], json!([{"key": "gpu.deckhouse.io/nvidia", "effect": "NoSchedule"}]));
    let features: Vec<&str> = r["matchAny"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["matchFeatures"][0]["feature"].as_str().unwrap())
        .collect();
    assert_eq!(features, ["pci.device", "local.label"]);
    assert_eq!(
        r["matchAny"][1]["matchFeatures"][0]["matchExpressions"]["nvidia.com/gpu.count"],
        json!({"op": "Gt", "value": ["0"]})
    );

    let no_rule = render(&helm, "gpu-module", &["nfd.enabled=true", "nfd.rules.enabled=false"]);
    assert!(!no_rule.iter().any(|(k, _, _)| k == "NodeFeatureRule"));
    assert!(plugin(&no_rule).contains("--gfd-output=nfd-feature-file"));
}

/// `helm template gpu-module -f <values>`: the documents, or Helm's error.
fn render_values(helm: &Path, values: &str) -> Result<Vec<(String, String, String)>, String> {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("values.yaml");
    std::fs::write(&file, values).unwrap();
    let out = Command::new(helm)
        .args(["template", "t", "--kube-version", "1.37.2", "-n", "d8-gpu"])
        .arg(repo().join("charts/gpu-module"))
        .arg("-f")
        .arg(&file)
        .output()
        .unwrap();
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let text = String::from_utf8(out.stdout).unwrap();
    Ok(text
        .split("\n---\n")
        .filter_map(|doc| {
            let field =
                |key: &str| doc.lines().find_map(|l| l.strip_prefix(key)).map(|v| v.trim().to_owned());
            Some((field("kind: ")?, field("  name: ")?, doc.to_owned()))
        })
        .collect())
}

/// `devicePluginMode.nodeGroups`: each group renders the DaemonSet `vgpu-device-plugin-<name>` (pods labelled for
/// the MIG manager and by group, on the NVIDIA nodes of its selector, start-time settings as arguments) and the
/// ConfigMap of the same name, mounted as a folder (never a subPath, which would not be updated) and named by
/// `--node-config-path`; its file is read back by the plugin's own parser (`NodeConfigFile`) and resolves to the
/// group's live settings. No checksum of the ConfigMap in the pod template: a change there is applied by the
/// running plugin, not by a rollout. Bad groups are refused at render.
#[test]
fn gpu_module_node_groups_render_one_plugin_and_config_per_group() {
    use k8s_openapi::api::{apps::v1::DaemonSet, core::v1::ConfigMap};
    use vgpu_core::node_config::{MigStrategy, NodeConfigFile, NodeSettings};
    let Some(helm) = helm() else {
        eprintln!("skipped: Helm is not built (run e2e/build-helm.sh or set VGPU_HELM)");
        return;
    };
    let values = "\
devicePluginMode:
  nodeGroups:
    - name: shared
      nodeSelector: {gpu.deckhouse.io/pool: shared}
      config: {wholeGpus: false, deviceSplitCount: 4, deviceMemoryScaling: 1.5, excludeDevices: '1', migStrategy: none}
    - name: whole
      nodeSelector: {gpu.deckhouse.io/pool: whole}
";
    let docs = render_values(&helm, values).unwrap();
    let find = |kind: &str, name: &str| -> String {
        docs.iter()
            .find(|(k, n, _)| k == kind && n == name)
            .unwrap_or_else(|| panic!("no {kind} {name}"))
            .2
            .clone()
    };
    let mut plugins: Vec<&str> = docs
        .iter()
        .filter(|(k, n, _)| k == "DaemonSet" && n.starts_with("vgpu-device-plugin"))
        .map(|(_, n, _)| n.as_str())
        .collect();
    plugins.sort_unstable();
    assert_eq!(plugins, ["vgpu-device-plugin-shared", "vgpu-device-plugin-whole"]);

    for (group, whole, split, mig) in [("shared", false, 4, "none"), ("whole", true, 10, "mixed")] {
        let name = format!("vgpu-device-plugin-{group}");
        let ds: DaemonSet = serde_saphyr::from_str(&find("DaemonSet", &name)).unwrap();
        let spec = ds.spec;
        let labels = spec.template.metadata.unwrap().labels.unwrap();
        assert_eq!(labels["app.kubernetes.io/name"], "vgpu-device-plugin", "the MIG manager's selector");
        assert_eq!(labels["gpu.deckhouse.io/device-plugin-group"], group);
        assert_eq!(spec.selector.match_labels.unwrap(), labels, "each DaemonSet selects its own pods");
        let pod = spec.template.spec.unwrap();
        let selector = pod.node_selector.unwrap();
        assert_eq!(selector["gpu.deckhouse.io/vendor"], "nvidia");
        assert_eq!(selector["gpu.deckhouse.io/pool"], group);
        let args = pod.containers[0].args.clone().unwrap();
        assert!(args.contains(&"--node-config-path=/etc/vgpu-node-config/node-config.yaml".to_owned()));
        assert!(args.contains(&format!("--mig-strategy={mig}")), "{args:?}");
        assert_eq!(args.contains(&"--whole-gpus".to_owned()), whole, "{args:?}");
        let mount = pod.containers[0]
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .find(|m| m.name == "node-config")
            .unwrap()
            .clone();
        assert_eq!((mount.mount_path.as_str(), mount.sub_path.as_deref()), ("/etc/vgpu-node-config", None));
        let volume = pod.volumes.unwrap().into_iter().find(|v| v.name == "node-config").unwrap();
        assert_eq!(volume.config_map.unwrap().name, name);
        let annotations = find("DaemonSet", &name);
        assert!(!annotations.contains("checksum/"), "no rollout on a config change");

        let cm: ConfigMap = serde_saphyr::from_str(&find("ConfigMap", &name)).unwrap();
        let text = &cm.data.unwrap()["node-config.yaml"];
        let file = NodeConfigFile::parse_yaml("chart", text).unwrap();
        let settings = file.resolve("any-node", NodeSettings::default()).unwrap();
        assert_eq!(settings.device_split_count, split, "{text}");
        assert_eq!(settings.mig_strategy, MigStrategy::Mixed, "not in the file: an argument");
        if group == "shared" {
            assert_eq!(settings.device_memory_scaling, 1.5);
            assert!(
                settings.exclude_devices.contains(1, "GPU-x") && !settings.exclude_devices.contains(0, "")
            );
        }
    }

    // The default: one group, on every NVIDIA node, today's settings.
    let docs = render_values(&helm, "{}").unwrap();
    let ds = &docs.iter().find(|(k, n, _)| k == "DaemonSet" && n == "vgpu-device-plugin-default").unwrap().2;
    assert!(ds.contains("--whole-gpus") && ds.contains("--mig-strategy=mixed"), "{ds}");

    let group = |name: &str, selector: &str, config: &str| {
        format!("    - name: {name}\n      nodeSelector: {selector}\n      config: {config}\n")
    };
    let refused = |groups: String, want: &str| {
        let err = render_values(&helm, &format!("devicePluginMode:\n  nodeGroups:\n{groups}")).unwrap_err();
        assert!(err.contains(want), "{want} not in {err}");
    };
    refused(group("Bad_Name", "{}", "{}"), "a DNS label is needed");
    refused(group(&"a".repeat(41), "{}", "{}"), "at most 40 characters");
    refused(group("a", "{x: '1'}", "{}") + &group("a", "{x: '2'}", "{}"), "the name \"a\" is used twice");
    refused(group("a", "{x: '1'}", "{}") + &group("b", "{}", "{}"), "an empty nodeSelector selects every");
    refused(
        group("a", "{x: '1'}", "{}") + &group("b", "{x: '1'}", "{}"),
        "a and b have the same nodeSelector",
    );
    refused(group("a", "{}", "{deviceSplitCount: 0}"), "deviceSplitCount 0: an integer of at least 1");
    refused(group("a", "{}", "{deviceSplitCount: 2.5}"), "an integer of at least 1");
    refused(group("a", "{}", "{deviceSplitCount: many}"), "deviceSplitCount: a number is needed");
    refused(group("a", "{}", "{migStrategy: all}"), "none, single or mixed");
    refused(group("a", "{}", "{deviceCoresScaling: -1}"), "deviceCoresScaling: a number of at least 0");
    refused(group("a", "{}", "{deviceMemoryFactor: 0}"), "deviceMemoryFactor 0");
    refused(String::new(), "at least one group is needed");
}

/// gpu-module's `adapters.nvidia.passthrough.enabled` turns gate PassthroughSupport on for the NVIDIA adapter
/// (and the two gates it excludes off, as `vgpu-gates` accepts), with the host mounts the gate spec requires
/// (host root, `/lib/modules`, sysfs; procfs at `/proc-host` in every mode), the vfio-switch settings (Jobs in
/// the release namespace, the chart's image) and a Role for the Jobs; off, none of them (the MetaX adapter
/// never gets them).
#[test]
fn gpu_module_passthrough_value_brings_the_gate_its_mounts_flags_and_job_rbac() {
    let Some(helm) = helm() else {
        eprintln!("skipped: Helm is not built (run e2e/build-helm.sh or set VGPU_HELM)");
        return;
    };
    let adapter = |docs: &[(String, String, String)], name: &str| -> k8s_openapi::api::apps::v1::DaemonSet {
        let (_, _, text) = docs.iter().find(|(k, n, _)| k == "DaemonSet" && n == name).unwrap();
        serde_saphyr::from_str(text).unwrap()
    };
    let host_paths = |ds: &k8s_openapi::api::apps::v1::DaemonSet| -> Vec<(String, String)> {
        let pod = ds.spec.template.spec.as_ref().unwrap();
        let volumes = pod.volumes.as_ref().unwrap();
        let mut out: Vec<(String, String)> = pod.containers[0]
            .volume_mounts
            .iter()
            .flatten()
            .filter_map(|m| {
                let v = volumes.iter().find(|v| v.name == m.name)?;
                Some((v.host_path.as_ref()?.path.clone(), m.mount_path.clone()))
            })
            .collect();
        out.sort();
        out
    };
    let env = |ds: &k8s_openapi::api::apps::v1::DaemonSet, name: &str| -> Option<String> {
        let pod = ds.spec.template.spec.as_ref().unwrap();
        pod.containers[0].env.iter().flatten().find(|e| e.name == name).and_then(|e| e.value.clone())
    };
    let on = render(&helm, "gpu-module", &["dra.enabled=true", "adapters.nvidia.passthrough.enabled=true"]);
    let off = render(&helm, "gpu-module", &["dra.enabled=true"]);
    let nvidia = adapter(&on, "vgpu-adapter-nvidia");
    let gates = env(&nvidia, "FEATURE_GATES").unwrap();
    let configured = vgpu_gates::kubelet_plugin().configure([gates.as_str()]).unwrap();
    assert!(configured.enabled(DraGate::PassthroughSupport), "{gates}");
    assert_eq!(env(&nvidia, "HOST_ROOT").as_deref(), Some("/host-root"));
    assert_eq!(env(&nvidia, "VFIO_SWITCH_NAMESPACE").as_deref(), Some("d8-gpu"));
    let image = nvidia.spec.template.spec.as_ref().unwrap().containers[0].image.clone();
    assert_eq!(env(&nvidia, "VFIO_SWITCH_IMAGE"), image, "the Jobs run the chart's image");
    let paths = host_paths(&nvidia);
    for want in
        [("/", "/host-root"), ("/sys", "/sys"), ("/lib/modules", "/lib/modules"), ("/proc", "/proc-host")]
    {
        assert!(paths.contains(&(want.0.to_owned(), want.1.to_owned())), "{want:?} in {paths:?}");
    }
    let role = on.iter().find(|(k, n, _)| k == "Role" && n == "vgpu-adapter-vfio-switch").expect("a Role");
    assert!(role.2.contains("verbs: [get, list, watch, create, delete]"), "{}", role.2);
    assert!(on.iter().any(|(k, n, _)| k == "RoleBinding" && n == "vgpu-adapter-vfio-switch"));

    for (docs, name) in
        [(&off, "vgpu-adapter-nvidia"), (&on, "vgpu-adapter-metax"), (&off, "vgpu-adapter-metax")]
    {
        let ds = adapter(docs, name);
        for var in ["FEATURE_GATES", "VFIO_SWITCH_NAMESPACE", "VFIO_SWITCH_IMAGE"] {
            assert_eq!(env(&ds, var), None, "{name}: {var}");
        }
        let paths = host_paths(&ds);
        assert!(
            !paths.iter().any(|(h, c)| h == "/lib/modules" || c == "/host-root" || c == "/sys"),
            "{name}: {paths:?}"
        );
    }
    assert!(
        !off.iter().any(|(k, n, _)| k == "Role" && n == "vgpu-adapter-vfio-switch"),
        "no Job RBAC without passthrough"
    );
}
