//! The Helm charts under `charts/` against the real kube-apiserver (issue #21): each chart is rendered with
//! `helm template --kube-version 1.37.2 --namespace <ns>` for a set of values (defaults, every monitoring
//! switch, the DRA gates that change mounts, cert-manager on and off, gpu-module in both modes), and every
//! rendered object is created with a server-side dry-run (`?dryRun=All`) — admission, defaulting and the
//! OpenAPI/CRD schema validation of the API server, nothing stored.
//!
//! Before the renders, for real: the gpu-module chart's own CRDs (`charts/gpu-module/crds`), minimal
//! stand-ins for the Prometheus Operator's and cert-manager's CRDs (`e2e/fixtures/`), and the namespaces the
//! renders use. One control plane serves every render.
//!
//! Needs the control-plane binaries and Helm (`$VGPU_HELM`, else the cache of `e2e/build-helm.sh`); without
//! Helm it is skipped with a message on stderr. Run `e2e/run.sh charts_dry_run`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::api::PostParams;
use serde_json::json;
use vgpu_e2e::TestEnv;
use vgpu_e2e::helm;

/// One render: a chart, a name for its values, the `--set` arguments, kinds it must contain, and text its
/// DaemonSets must (`has`) and must not (`lacks`) contain (gate-dependent host mounts, gpu-module's mode).
struct Case {
    chart: &'static str,
    values: &'static str,
    set: &'static [&'static str],
    kinds: &'static [&'static str],
    has: &'static [&'static str],
    lacks: &'static [&'static str],
}

/// Host paths mounted only with gate PassthroughSupport (`/lib/modules`) and NRISupport (`/var/run/nri`).
const PASSTHROUGH_MOUNT: &str = r#""path":"/lib/modules""#;
const NRI_MOUNT: &str = r#""path":"/var/run/nri""#;
/// The node DaemonSets' init container that installs the host files (`hostFiles.install`).
const INSTALL_FILES: &str = r#""name":"install-files""#;
/// gpu-module's two modes: kubelet plugin adapters (`dra.enabled`) or the device plugin.
const KUBELET_PLUGIN: &str = "/usr/bin/vgpu-kubelet-plugin";
const DEVICE_PLUGIN: &str = "/usr/bin/vgpu-device-plugin";

const MONITORING_ON: &[&str] = &[
    "monitoring.podMonitor.enabled=true",
    "monitoring.serviceMonitor.enabled=true",
    "monitoring.prometheusRule.enabled=true",
    "monitoring.dashboard.enabled=true",
    "monitoring.schedulerExtender.serveMetrics=true",
];

const CASES: &[Case] = &[
    Case {
        chart: "vgpu-manager",
        values: "defaults",
        set: &[],
        kinds: &["DaemonSet", "Deployment", "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"],
        has: &[r#""--feature-gates=HonorPreAllocatedDeviceIDs=true""#, INSTALL_FILES, r#""LIBRARY_VERSION""#],
        lacks: &[],
    },
    Case {
        chart: "vgpu-manager",
        values: "monitoring on, extender serveMetrics",
        set: MONITORING_ON,
        kinds: &["PodMonitor", "ServiceMonitor", "PrometheusRule", "ConfigMap", "Secret"],
        has: &[],
        lacks: &[],
    },
    Case {
        chart: "vgpu-manager",
        values: "monitoring on, dashboard in another namespace, no metrics RBAC",
        set: &[
            "monitoring.podMonitor.enabled=true",
            "monitoring.prometheusRule.enabled=true",
            "monitoring.dashboard.enabled=true",
            "monitoring.dashboard.namespace=grafana-dashboards",
            "devicePlugin.deviceMonitor.enableRbac=false",
        ],
        kinds: &["PodMonitor", "PrometheusRule", "ConfigMap"],
        has: &[],
        lacks: &[],
    },
    Case {
        chart: "vgpu-manager",
        values: "webhook with cert-manager",
        set: &["webhook.certManager.enabled=true"],
        kinds: &["Issuer", "Certificate", "MutatingWebhookConfiguration"],
        has: &[],
        lacks: &[],
    },
    Case {
        chart: "vgpu-manager",
        values: "webhook with the Volcano Job routes",
        set: &["webhook.volcano.enabled=true"],
        kinds: &["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration", "ClusterRole"],
        has: &[],
        lacks: &[],
    },
    Case {
        chart: "vgpu-manager",
        values: "gate maps",
        set: &[
            "devicePlugin.devicePlugin.commands.featureGates.TopologyAwareGPUAllocation=true",
            "scheduler.schedulerExtender.commands.featureGates.SerializedNodeBind=true",
        ],
        kinds: &["DaemonSet", "Deployment"],
        has: &[r#""--feature-gates=HonorPreAllocatedDeviceIDs=true,TopologyAwareGPUAllocation=true""#],
        lacks: &[],
    },
    Case {
        chart: "vgpu-manager",
        values: "host files installed by hand",
        set: &["devicePlugin.hostFiles.install=false"],
        kinds: &["DaemonSet"],
        has: &[],
        lacks: &[INSTALL_FILES],
    },
    Case {
        chart: "vgpu-manager",
        values: "HonorPreAllocatedDeviceIDs off",
        set: &["devicePlugin.devicePlugin.commands.featureGates.HonorPreAllocatedDeviceIDs=false"],
        kinds: &["DaemonSet"],
        has: &[r#""--feature-gates=HonorPreAllocatedDeviceIDs=false""#],
        lacks: &[],
    },
    Case {
        chart: "vgpu-manager-dra-driver",
        values: "defaults",
        set: &[],
        kinds: &["DaemonSet", "DeviceClass"],
        has: &[INSTALL_FILES, r#""LIBRARY_VERSION""#],
        lacks: &[PASSTHROUGH_MOUNT, NRI_MOUNT],
    },
    Case {
        chart: "vgpu-manager-dra-driver",
        values: "monitoring on",
        set: &["monitoring.podMonitor.enabled=true", "monitoring.serviceMonitor.enabled=true"],
        kinds: &["PodMonitor", "ServiceMonitor", "Service", "Secret"],
        has: &[],
        lacks: &[],
    },
    Case {
        chart: "vgpu-manager-dra-driver",
        values: "gate NRISupport",
        set: &["kubeletPlugin.containers.plugin.featureGates.NRISupport=true"],
        kinds: &["DaemonSet"],
        has: &[NRI_MOUNT],
        lacks: &[PASSTHROUGH_MOUNT],
    },
    Case {
        chart: "vgpu-manager-dra-driver",
        values: "gate PassthroughSupport",
        set: &[
            "kubeletPlugin.containers.plugin.featureGates.PassthroughSupport=true",
            "kubeletPlugin.containers.plugin.featureGates.VGPUSupport=false",
            "kubeletPlugin.containers.plugin.featureGates.NVMLDeviceHealthCheck=false",
        ],
        kinds: &["DaemonSet"],
        has: &[PASSTHROUGH_MOUNT],
        lacks: &[NRI_MOUNT],
    },
    Case {
        chart: "gpu-module",
        values: "dra.enabled=true",
        set: &["dra.enabled=true"],
        kinds: &["DaemonSet", "Deployment", "ValidatingWebhookConfiguration"],
        has: &[KUBELET_PLUGIN],
        lacks: &[DEVICE_PLUGIN, PASSTHROUGH_MOUNT, r#""VFIO_SWITCH_IMAGE""#],
    },
    Case {
        chart: "gpu-module",
        values: "defaults (dra.enabled=false: whole GPUs)",
        set: &[],
        kinds: &["DaemonSet", "Deployment", "ValidatingWebhookConfiguration"],
        has: &[DEVICE_PLUGIN, r#""--whole-gpus""#],
        lacks: &[KUBELET_PLUGIN],
    },
    Case {
        chart: "gpu-module",
        values: "device plugin with vGPU shares",
        set: &["devicePluginMode.wholeGpus=false"],
        kinds: &["DaemonSet"],
        has: &[DEVICE_PLUGIN],
        lacks: &[KUBELET_PLUGIN, r#""--whole-gpus""#],
    },
    Case {
        chart: "gpu-module",
        values: "two NodeGroups (whole GPUs, vGPU shares)",
        set: &[
            "devicePluginMode.nodeGroups[0].name=whole",
            "devicePluginMode.nodeGroups[0].nodeSelector.gpu\\.deckhouse\\.io/pool=whole",
            "devicePluginMode.nodeGroups[1].name=shared",
            "devicePluginMode.nodeGroups[1].nodeSelector.gpu\\.deckhouse\\.io/pool=shared",
            "devicePluginMode.nodeGroups[1].config.wholeGpus=false",
            "devicePluginMode.nodeGroups[1].config.deviceSplitCount=4",
        ],
        kinds: &["DaemonSet", "ConfigMap"],
        has: &[
            DEVICE_PLUGIN,
            r#""name":"vgpu-device-plugin-whole""#,
            r#""name":"vgpu-device-plugin-shared""#,
            r#""--node-config-path=/etc/vgpu-node-config/node-config.yaml""#,
        ],
        lacks: &[KUBELET_PLUGIN],
    },
    Case {
        chart: "gpu-module",
        values: "adapters' metrics monitored, DCGM exporter (chart-only)",
        set: &[
            "dra.enabled=true",
            "monitoring.podMonitor.enabled=true",
            "monitoring.serviceMonitor.enabled=true",
            "monitoring.prometheusRule.enabled=true",
            "dcgmExporter.enabled=true",
        ],
        kinds: &["PodMonitor", "ServiceMonitor", "PrometheusRule", "DaemonSet"],
        has: &[KUBELET_PLUGIN, r#""--enable-rbac=true""#, "nvcr.io/nvidia/k8s/dcgm-exporter"],
        lacks: &[DEVICE_PLUGIN],
    },
    Case {
        chart: "gpu-module",
        values: "NVIDIA passthrough (vfio-switch Jobs)",
        set: &["dra.enabled=true", "adapters.nvidia.passthrough.enabled=true"],
        kinds: &["DaemonSet", "Role", "RoleBinding"],
        has: &[
            KUBELET_PLUGIN,
            PASSTHROUGH_MOUNT,
            r#""PassthroughSupport=true,VGPUSupport=false,NVMLDeviceHealthCheck=false""#,
            r#""VFIO_SWITCH_IMAGE""#,
            r#""VFIO_SWITCH_NAMESPACE""#,
            r#""mountPath":"/host-root""#,
            r#""mountPath":"/sys""#,
        ],
        lacks: &[],
    },
    Case {
        chart: "gpu-module",
        values: "controller with cert-manager",
        set: &["controller.certManager.enabled=true"],
        kinds: &["Issuer", "Certificate"],
        has: &[],
        lacks: &[],
    },
];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
}

fn describe(object: &serde_json::Value) -> String {
    format!(
        "{} {}{}",
        object["kind"].as_str().unwrap_or("?"),
        object["metadata"]["namespace"].as_str().map(|ns| format!("{ns}/")).unwrap_or_default(),
        object["metadata"]["name"].as_str().unwrap_or("?")
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the control-plane binaries and Helm: run e2e/run.sh"]
async fn charts_render_objects_the_api_server_accepts() {
    let Some(helm_bin) = helm::locate_helm().unwrap() else {
        return; // locate_helm said so on stderr
    };
    let started = Instant::now();
    let env = TestEnv::builder("charts_render_objects_the_api_server_accepts").start().await.unwrap();
    let client = env.client().await.unwrap();
    let env_ready = started.elapsed();

    // Every render first, so that a chart that fails to render is reported before any API call.
    let mut renders = Vec::new();
    for (i, case) in CASES.iter().enumerate() {
        let namespace = format!("{}-{i}", case.chart);
        let args: Vec<String> = case.set.iter().flat_map(|s| ["--set".to_owned(), (*s).to_owned()]).collect();
        let chart = repo().join("charts").join(case.chart);
        let objects = helm::template(&helm_bin, &chart, "r", &namespace, &args)
            .unwrap_or_else(|e| panic!("chart {} with values '{}': {e:#}", case.chart, case.values));
        let kinds: BTreeSet<&str> = objects.iter().filter_map(|o| o["kind"].as_str()).collect();
        for kind in case.kinds {
            assert!(
                kinds.contains(kind),
                "chart {} with values '{}' renders no {kind} (kinds: {kinds:?})",
                case.chart,
                case.values
            );
        }
        let daemonsets: String =
            objects.iter().filter(|o| o["kind"] == "DaemonSet").map(|o| o.to_string()).collect();
        for text in case.has {
            assert!(
                daemonsets.contains(text),
                "chart {} with values '{}': no {text} in its DaemonSets",
                case.chart,
                case.values
            );
        }
        for text in case.lacks {
            assert!(
                !daemonsets.contains(text),
                "chart {} with values '{}': {text} in its DaemonSets",
                case.chart,
                case.values
            );
        }
        renders.push((case, namespace, objects));
    }

    // CRDs for real: the gpu-module chart's own, and the stand-ins for the Prometheus Operator's and
    // cert-manager's.
    let mut crd_files = yaml_files(&repo().join("charts/gpu-module/crds"));
    crd_files.extend(yaml_files(&Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures")));
    let crds = helm::read_crds(&crd_files).unwrap();
    assert_eq!(crds.len(), 7, "2 gpu-module CRDs + 3 Prometheus Operator + 2 cert-manager: {crd_files:?}");
    helm::install_crds(&client, &crds, Duration::from_secs(30)).await.unwrap();

    // Namespaces for real: each render's, and any other an object names (unless it exists).
    let mut namespaces = BTreeSet::new();
    for (_, namespace, objects) in &renders {
        namespaces.insert(namespace.clone());
        namespaces
            .extend(objects.iter().filter_map(|o| o["metadata"]["namespace"].as_str().map(str::to_owned)));
    }
    let ns_api: Api<Namespace> = Api::all(client.clone());
    for ns in &namespaces {
        if ns_api.get_opt(ns).await.unwrap().is_some() {
            continue; // kube-system, default
        }
        let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap();
        ns_api.create(&PostParams::default(), &namespace).await.unwrap();
    }
    let setup_done = started.elapsed();

    let mut failures = Vec::new();
    let mut accepted = 0;
    for (case, namespace, objects) in &renders {
        let render_start = Instant::now();
        for object in objects {
            match helm::create_dry_run(&client, object, namespace).await {
                Ok(()) => accepted += 1,
                Err(e) => failures.push(format!(
                    "chart {} with values '{}': {} refused: {e:#}",
                    case.chart,
                    case.values,
                    describe(object)
                )),
            }
        }
        eprintln!(
            "{} [{}]: {} objects dry-run in {:?}",
            case.chart,
            case.values,
            objects.len(),
            render_start.elapsed()
        );
    }
    assert!(
        failures.is_empty(),
        "{} object(s) refused by the API server:\n{}",
        failures.len(),
        failures.join("\n")
    );

    // The check can fail: the API server's validation and the CRD schemas are reached (a broken copy of a
    // rendered object is refused, with the server's message), and nothing was stored.
    let (_, namespace, objects) = &renders[0];
    let daemonset = objects.iter().find(|o| o["kind"] == "DaemonSet").unwrap();
    let mut broken = daemonset.clone();
    broken["spec"]["template"]["spec"]["containers"][0]["image"] = json!("");
    let refused = helm::create_dry_run(&client, &broken, namespace).await.unwrap_err().to_string();
    assert!(refused.contains("image") && refused.contains("Invalid"), "{refused}");
    let (_, namespace, objects) = renders.iter().find(|(c, _, _)| c.set == MONITORING_ON).unwrap();
    let mut broken = objects.iter().find(|o| o["kind"] == "PodMonitor").unwrap().clone();
    broken.as_object_mut().unwrap().remove("spec");
    let refused = helm::create_dry_run(&client, &broken, namespace).await.unwrap_err().to_string();
    assert!(refused.contains("spec"), "{refused}");
    let name = daemonset["metadata"]["name"].as_str().unwrap();
    let stored: Api<DaemonSet> = Api::namespaced(client.clone(), &renders[0].1);
    assert!(stored.get_opt(name).await.unwrap().is_none(), "the dry-run stored DaemonSet {name}");
    eprintln!("refusals reported: {refused}");
    eprintln!(
        "{accepted} objects of {} renders accepted; control plane {env_ready:?}, renders + CRDs + namespaces {:?}, \
         total {:?}",
        renders.len(),
        setup_done - env_ready,
        started.elapsed()
    );
    env.finish();
}
