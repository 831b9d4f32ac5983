//! Our charts installed with Helm on the real node (issue #33): the vgpu image (`scripts/build-image.sh`
//! from the binaries this test run uses, written as an OCI archive) imported into the node's containerd, the
//! chart installed with `helm install` against the real API server, its pods created by the real
//! kube-controller-manager, run by the real kubelet and containerd, and reaching the API server as any
//! in-cluster client does: through the `kubernetes` Service, which kube-proxy routes to the host's address.
//! Only the GPU is mocked (`backend: mock`, a host file named by a chart value, and fake device nodes under
//! a temporary driver root).
//!
//! - `vgpu-manager-dra-driver`: the DaemonSet's pod (install-files init container, kubelet plugin, device
//!   monitor) becomes Ready, the plugin registers with the kubelet and publishes the node's ResourceSlice, a
//!   claim pod of the chart's `vgpu-manager` DeviceClass runs with its share's limits; `helm upgrade` with a
//!   gate replaces the plugin's pod only; `helm uninstall` then leaves no pod, no plugin socket and no claim
//!   CDI spec behind.
//! - `vgpu-manager`: the device plugin (with its monitor), the chart's own kube-scheduler + extender (the
//!   control plane's `kube-scheduler` binary as an image of its own, [`vgpu_e2e::images`]) and the webhook
//!   all Ready; a vGPU pod created without a scheduler name gets ours from the webhook, is placed by the
//!   extender and sees its limits; `helm upgrade` turning the extender's `SerializedNodeBind` gate off
//!   replaces the scheduler's pod and nothing else, keeps the webhook's certificate (caBundle) and a second
//!   vGPU pod starts through it; `helm uninstall` leaves no pod, no plugin socket, no webhook configuration
//!   and no pod's files in the manager directory.
//! - `gpu-module`, device-plugin mode with default values: the node agent, the device plugin (whole GPUs),
//!   the controller and the MIG manager (with the chart's own mig-parted ConfigMap) Ready, the node
//!   advertises `nvidia.com/gpu` (3 mock GPUs), a pod asking for one runs with it; `helm upgrade` changing
//!   `nodeAgent.scanInterval` replaces the node agent's pod only; uninstall leaves no pod or socket (the
//!   CRDs stay, as Helm keeps them).
//! - `gpu-module`, device-plugin mode, a NodeGroup with vGPU shares: `helm upgrade` changing the group's
//!   split count changes the node's `nvidia.com/vgpu-number` capacity while the plugin's pod stays the same
//!   (its ConfigMap re-read live; the kubelet's `syncFrequency` shortened to 5 s).
//! - `gpu-module`, DRA mode: the controller, the node agent and the NVIDIA adapter Ready; a GPUClass
//!   becomes a DeviceClass, and a claim pod of it runs with the GPU; uninstall leaves no pod, socket or
//!   claim CDI spec (the CRDs stay).
//!
//! The image: `$VGPU_E2E_IMAGE_ARCHIVE` when set (an archive naming [`images::VGPU_IMAGE`]), else built once per run with
//! `PREBUILT=<our binaries' folder> OCI_ARCHIVE=<target tmp>/real_node_helm/vgpu.oci.tar
//! scripts/build-image.sh` (buildah; about 20 s from debug binaries). Needs the control plane, the real
//! node, Helm and root: `e2e/run.sh real_node_helm`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::Duration,
};

use k8s_openapi::api::{
    admissionregistration::v1::MutatingWebhookConfiguration,
    core::v1::Pod,
    resource::v1::{DeviceClass, ResourceClaim, ResourceSlice},
};
use kube::{
    Api,
    api::{DeleteParams, ListParams, PostParams},
};
use serde_json::json;
use vgpu_core::abi::runtime_files;
use vgpu_e2e::{
    TestEnv,
    fixtures::{self, VGPU_CORES, VGPU_MEMORY, VGPU_NUMBER},
    helm, images, probe,
    real_node::{self, RealNode},
    scheduler_configuration,
};

const TIMEOUT: Duration = Duration::from_secs(120);
/// The vgpu-manager chart's kube-scheduler: the control plane's binary alone in an image.
const KUBE_SCHEDULER_IMAGE: &str = "localhost/kube-scheduler:e2e";
const NAMESPACE: &str = "vgpu-dra";
const WORKLOADS: &str = "default";
const MOCK: &str = "gpus:\n  - { uuid: GPU-HELM-0, name: NVIDIA A30, memoryMiB: 24576, computeCapability: '8.0', minor: 0 }\n";
/// Three GPUs for the gpu-module chart (whole GPUs: `nvidia.com/gpu: 3`).
const MOCK_3: &str = "gpus:
  - { uuid: GPU-MOD-0, name: NVIDIA A30, memoryMiB: 24576, computeCapability: '8.0', minor: 0 }
  - { uuid: GPU-MOD-1, name: NVIDIA A30, memoryMiB: 24576, computeCapability: '8.0', minor: 1 }
  - { uuid: GPU-MOD-2, name: NVIDIA A30, memoryMiB: 24576, computeCapability: '8.0', minor: 2 }
";

/// Our image as an OCI archive (`$VGPU_E2E_IMAGE_ARCHIVE`, else built once per test binary by
/// `vgpu_e2e::images::vgpu_image_archive` into `<target>/tmp/<test>/`, replaced by the next run).
fn image_archive() -> PathBuf {
    images::vgpu_image_archive(&Path::new(env!("CARGO_TARGET_TMPDIR")).join("real_node_helm")).unwrap()
}

/// A running environment (API server, controller manager, kube-scheduler with `profiles`) with the real node
/// (kube-proxy included), our image imported, fake GPUs and the mock description `mock` on the host.
struct Cluster {
    // Dropped first: the node is torn down before the environment.
    node: RealNode,
    env: TestEnv,
    client: kube::Client,
    helm: PathBuf,
    host: probe::GpuHost,
    mock: PathBuf,
    work: PathBuf,
}

impl Cluster {
    async fn start(name: &str, profiles: &[&str], mock: &str) -> Option<Self> {
        Self::start_with(name, profiles, mock, |node| node).await
    }

    /// [`Cluster::start`] with the real node's builder adjusted by `node` (e.g. its kubelet configuration).
    async fn start_with(
        name: &str,
        profiles: &[&str],
        mock: &str,
        node: impl FnOnce(real_node::RealNodeBuilder) -> real_node::RealNodeBuilder,
    ) -> Option<Self> {
        let binaries = real_node::locate_or_skip().unwrap()?;
        let helm_bin = helm::locate_helm().unwrap()?;
        let mut env = real_node::env_builder(name).cluster_services().start().await.unwrap();
        let node = node(RealNode::builder().binaries(binaries).kube_proxy()).start(&env).await.unwrap();
        let client = env.client().await.unwrap();
        let mut scheduler = scheduler_configuration(env.kubeconfig_path(), &[]);
        scheduler["profiles"] = profiles.iter().map(|p| json!({"schedulerName": p})).collect();
        env.start_scheduler_with_config(&scheduler).await.unwrap();

        let work = env.workdir().join("helm");
        std::fs::create_dir_all(&work).unwrap();
        let archive = image_archive();
        let imported = node.import_image_archive(&archive).unwrap();
        assert!(
            imported.iter().any(|i| i == images::VGPU_IMAGE),
            "{} not among the imported images {imported:?}",
            images::VGPU_IMAGE
        );
        let gpus = u32::try_from(mock.matches("uuid:").count()).unwrap();
        let host = probe::GpuHost::create(&work, gpus).unwrap();
        // The limiter is vgpu-manager's, not in our image: the test installs stand-ins for its files.
        runtime_files::install(&host.manager_dir, "v1.0.0", b"not a real library: busybox is static")
            .unwrap();
        let mock_path = work.join("mock.yaml");
        std::fs::write(&mock_path, mock).unwrap();
        Some(Self { node, env, client, helm: helm_bin, host, mock: mock_path, work })
    }

    fn helm(&self, verb: &str, args: &[String]) {
        helm::run(&self.helm, self.env.kubeconfig_path(), verb, args).unwrap();
    }

    /// Waits until `namespace` holds exactly `count` pods, all Running and Ready; returns them by name.
    async fn all_ready(&self, namespace: &str, count: usize) -> BTreeMap<String, Pod> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        self.env
            .poll(&format!("{count} pods Running and Ready in {namespace}"), TIMEOUT, || async {
                let list = pods.list(&ListParams::default()).await.ok()?.items;
                (list.len() == count && list.iter().all(all_ready)).then(|| {
                    list.into_iter().map(|p| (p.metadata.name.clone().unwrap_or_default(), p)).collect()
                })
            })
            .await
            .unwrap_or_else(|e| panic!("{e}\n{}", self.diagnostics(namespace)))
    }

    async fn no_pods(&self, namespace: &str) {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        self.env
            .poll(&format!("no pod left in {namespace}"), TIMEOUT, || async {
                pods.list(&ListParams::default()).await.ok()?.items.is_empty().then_some(())
            })
            .await
            .unwrap_or_else(|e| panic!("{e}\n{}", self.diagnostics(namespace)));
    }

    fn diagnostics(&self, namespace: &str) -> String {
        format!("{}\n{}", block_on_text(pod_states(&self.client, namespace)), self.node.log_tails(40))
    }

    /// The value arguments every chart gets: our image, never pulled.
    fn image_values(&self) -> Vec<(&'static str, String)> {
        let (repository, tag) = images::VGPU_IMAGE.rsplit_once(':').unwrap();
        vec![
            ("image.repository", repository.to_owned()),
            ("image.tag", tag.to_owned()),
            ("image.pullPolicy", "Never".to_owned()),
        ]
    }

    /// Deletes the workload pod `name` and waits until the API server no longer has it.
    async fn delete_pod(&self, pods: &Api<Pod>, name: &str) {
        pods.delete(name, &DeleteParams::default()).await.unwrap();
        self.env
            .poll(&format!("pod {name} gone"), TIMEOUT, || async {
                pods.get_opt(name).await.ok()?.is_none().then_some(())
            })
            .await
            .unwrap();
    }

    /// Sockets other than the kubelet's own left in the device-plugin folder.
    fn plugin_sockets(&self) -> Vec<String> {
        std::fs::read_dir(self.node.device_plugin_dir())
            .map(|d| {
                d.filter_map(|e| Some(e.ok()?.file_name().to_string_lossy().into_owned()))
                    .filter(|f| f.ends_with(".sock") && f != "kubelet.sock")
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Per-pod folders (`<podUID>_<container>`) left in the manager directory.
    fn pod_folders(&self) -> Vec<String> {
        std::fs::read_dir(&self.host.manager_dir)
            .map(|d| {
                d.filter_map(|e| Some(e.ok()?.file_name().to_string_lossy().into_owned()))
                    .filter(|f| vgpu_deviceplugin::locate::pod_uid_of_dir(f).is_some())
                    .collect()
            })
            .unwrap_or_default()
    }

    fn finish(mut self) {
        // kube-proxy's chains included, the node leaves nothing on the host.
        self.node.stop().unwrap();
        self.env.finish();
    }
}

/// `--set key=value` arguments.
fn set_args(values: &[(&str, String)]) -> Vec<String> {
    values.iter().flat_map(|(k, v)| ["--set".to_owned(), format!("{k}={v}")]).collect()
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}

fn chart(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts").join(name).display().to_string()
}

/// The `--set` arguments that point the DRA chart at the real node's folders, the image and the mock GPU.
fn dra_values(cluster: &Cluster) -> Vec<String> {
    let (node, host) = (&cluster.node, &cluster.host);
    let path = |p: &Path| p.display().to_string();
    let mut values = cluster.image_values();
    values.extend([
        ("namespace.create", "false".to_owned()),
        ("kubeletPlugin.kubeletRegistrarDirectoryPath", path(&node.plugins_registry_dir())),
        ("kubeletPlugin.kubeletPluginsDirectoryPath", path(&node.plugins_dir())),
        ("kubeletPlugin.cdiRoot", path(&node.cdi_dir())),
        ("kubeletPlugin.hostManagerDir", path(&host.manager_dir)),
        ("kubeletPlugin.nvidiaDriverRoot", path(&host.driver_root)),
        ("kubeletPlugin.mockConfig", path(&cluster.mock)),
        ("kubeletPlugin.containers.plugin.backend", "mock".to_owned()),
    ]);
    set_args(&values)
}

/// Every pod of `namespace`, as `name status` lines, for failure messages.
async fn pod_states(client: &kube::Client, namespace: &str) -> String {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let Ok(list) = pods.list(&ListParams::default()).await else { return "cannot list pods".to_owned() };
    list.items
        .iter()
        .map(|p| {
            format!(
                "{} {}",
                p.metadata.name.as_deref().unwrap_or("?"),
                serde_json::to_string(&p.status).unwrap_or_default()
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn all_ready(pod: &Pod) -> bool {
    let Some(status) = &pod.status else { return false };
    status.phase.as_deref() == Some("Running")
        && status.container_statuses.as_ref().is_some_and(|c| !c.is_empty() && c.iter().all(|c| c.ready))
}

/// Each container's restart count and container ID.
type Restarts = Vec<(i32, Option<String>)>;

/// Each container's restart count and container ID: unchanged when the pod was left alone.
fn restarts(pod: &Pod) -> Restarts {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .map(|c| c.iter().map(|c| (c.restart_count, c.container_id.clone())).collect())
        .unwrap_or_default()
}

/// A chart pod's component: its `app.kubernetes.io/name` label (else `app`, else its name).
fn component(pod: &Pod) -> String {
    let labels = pod.metadata.labels.as_ref();
    labels
        .and_then(|l| l.get("app.kubernetes.io/name").or_else(|| l.get("app")))
        .cloned()
        .unwrap_or_else(|| pod.metadata.name.clone().unwrap_or_default())
}

/// Pods by component: (uid, restarts).
fn by_component(pods: &BTreeMap<String, Pod>) -> BTreeMap<String, (String, Restarts)> {
    pods.values().map(|p| (component(p), (p.metadata.uid.clone().unwrap_or_default(), restarts(p)))).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the control plane, the real node, Helm and root: run e2e/run.sh"]
async fn real_node_helm_installs_the_dra_chart_and_runs_a_claim_pod() {
    // The tests' pods use our scheduler name; the charts' (DaemonSet pods included) kube-scheduler's default.
    let Some(cluster) = Cluster::start(
        "real_node_helm_installs_the_dra_chart_and_runs_a_claim_pod",
        &[vgpu_e2e::SCHEDULER_NAME, "default-scheduler"],
        MOCK,
    )
    .await
    else {
        return;
    };
    let (env, node, client, host, helm_bin) =
        (&cluster.env, &cluster.node, &cluster.client, &cluster.host, &cluster.helm);
    let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/vgpu-manager-dra-driver");
    let mut args = vec![
        "dra".to_owned(),
        chart.display().to_string(),
        "--namespace".to_owned(),
        NAMESPACE.to_owned(),
        "--create-namespace".to_owned(),
    ];
    args.extend(dra_values(&cluster));
    helm::run(helm_bin, env.kubeconfig_path(), "install", &args).unwrap();

    // The DaemonSet's pod, created by kube-controller-manager, Ready on the node.
    let plugin_pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let pod = env
        .poll("the chart's kubelet-plugin pod Ready", TIMEOUT, || async {
            plugin_pods.list(&ListParams::default()).await.ok()?.items.into_iter().find(all_ready)
        })
        .await
        .unwrap_or_else(|e| {
            panic!("{e}\n{}\n{}", block_on_text(pod_states(client, NAMESPACE)), node.log_tails(40))
        });
    assert_eq!(pod.spec.as_ref().and_then(|s| s.node_name.as_deref()), Some(node.node_name()));
    let installed = host.manager_dir.join("registry/device-client");
    assert!(installed.is_file(), "the install-files init container did not install {}", installed.display());

    let slices: Api<ResourceSlice> = Api::all(client.clone());
    env.poll("the plugin's ResourceSlice", TIMEOUT, || async {
        let list = slices
            .list(&ListParams::default().fields(&format!("spec.nodeName={}", node.node_name())))
            .await
            .ok()?;
        list.items.into_iter().next()
    })
    .await
    .unwrap();
    let registration = node.plugins_registry_dir().join("manager.nvidia.com-reg.sock");
    assert!(registration.exists(), "{}", registration.display());

    // A claim of the chart's DeviceClass and a pod using it.
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), WORKLOADS);
    let pods: Api<Pod> = Api::namespaced(client.clone(), WORKLOADS);
    let capacity = json!({ "requests": { "cores": "10", "memory": "1Gi" } });
    claims
        .create(
            &PostParams::default(),
            &fixtures::dra_claim(WORKLOADS, "share", "vgpu-manager", &capacity).unwrap(),
        )
        .await
        .unwrap();
    let resources = json!({"claims": [{"name": "gpu"}]});
    let spec = json!({"resourceClaims": [{"name": "gpu", "resourceClaimName": "share"}]});
    pods.create(
        &PostParams::default(),
        &probe::pod(WORKLOADS, "cuda", "cuda", node.busybox_image(), resources, spec).unwrap(),
    )
    .await
    .unwrap();
    let (_, seen) = probe::running(env, node, &pods, "cuda", "kube-scheduler", TIMEOUT)
        .await
        .unwrap_or_else(|e| panic!("{e:#}\n{}", block_on_text(pod_states(client, NAMESPACE))));
    let uid = claims.get("share").await.unwrap().metadata.uid.unwrap();
    for (key, want) in [
        ("CUDA_MEM_LIMIT_0", "1024m"),
        ("CUDA_CORE_LIMIT_0", "10"),
        ("MANAGER_VISIBLE_DEVICE_0", "GPU-HELM-0"),
        ("MANAGER_VGPU_CLAIM_UID", uid.as_str()),
    ] {
        assert_eq!(seen.env.get(key).map(String::as_str), Some(want), "{key} in {:?}", seen.env);
    }
    assert!(seen.device("nvidia0").is_some(), "{:?}", seen.dev);
    let spec_file = node.cdi_dir().join(format!("k8s.manager.nvidia.com-claim_{uid}.json"));
    assert!(spec_file.exists(), "{}", spec_file.display());

    // `helm upgrade` with a gate turned on: the plugin's pod is replaced (the gate is in its template) and
    // Ready again; the claim pod runs on untouched, and the new plugin unprepares it below.
    let before_upgrade = pod.metadata.uid.clone().unwrap();
    let cuda_before = pods.get("cuda").await.unwrap();
    let mut upgrade = vec![
        "dra".to_owned(),
        chart.display().to_string(),
        "--namespace".to_owned(),
        NAMESPACE.to_owned(),
        "--reuse-values".to_owned(),
        "--set".to_owned(),
        "kubeletPlugin.containers.plugin.featureGates.TimeSlicingSettings=true".to_owned(),
    ];
    upgrade.extend(["--wait".to_owned(), "--timeout".to_owned(), "2m".to_owned()]);
    helm::run(helm_bin, env.kubeconfig_path(), "upgrade", &upgrade).unwrap();
    let upgraded = env
        .poll("the upgraded kubelet-plugin pod Ready", TIMEOUT, || async {
            let list = plugin_pods.list(&ListParams::default()).await.ok()?.items;
            (list.len() == 1).then_some(())?;
            list.into_iter()
                .find(|p| all_ready(p) && p.metadata.uid.as_deref() != Some(before_upgrade.as_str()))
        })
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", block_on_text(pod_states(client, NAMESPACE))));
    let gates = serde_json::to_string(&upgraded.spec.as_ref().unwrap().containers[0].env).unwrap();
    assert!(gates.contains("TimeSlicingSettings=true"), "{gates}");
    let cuda_after = pods.get("cuda").await.unwrap();
    assert_eq!(cuda_after.metadata.uid, cuda_before.metadata.uid);
    assert_eq!(restarts(&cuda_after), restarts(&cuda_before), "the claim pod was restarted by the upgrade");

    // The workload goes, then the chart: nothing of the driver is left on the node.
    pods.delete("cuda", &DeleteParams::default()).await.unwrap();
    env.poll("the claim pod gone", TIMEOUT, || async {
        pods.get_opt("cuda").await.ok()?.is_none().then_some(())
    })
    .await
    .unwrap();
    claims.delete("share", &DeleteParams::default()).await.unwrap();
    assert!(!spec_file.exists(), "{} left after the pod", spec_file.display());
    helm::run(
        helm_bin,
        env.kubeconfig_path(),
        "uninstall",
        &[
            "dra".to_owned(),
            "--namespace".to_owned(),
            NAMESPACE.to_owned(),
            "--wait".to_owned(),
            "--timeout".to_owned(),
            "2m".to_owned(),
        ],
    )
    .unwrap();
    env.poll("the chart's pods gone", TIMEOUT, || async {
        plugin_pods.list(&ListParams::default()).await.ok()?.items.is_empty().then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", block_on_text(pod_states(client, NAMESPACE))));
    env.poll("the registration socket gone", TIMEOUT, || async { (!registration.exists()).then_some(()) })
        .await
        .unwrap();
    let left: Vec<String> = std::fs::read_dir(node.cdi_dir())
        .map(|d| d.filter_map(|e| Some(e.ok()?.file_name().to_string_lossy().into_owned())).collect())
        .unwrap_or_default();
    assert!(left.iter().all(|f| !f.contains("claim_")), "claim CDI specs left: {left:?}");
    cluster.finish();
}

/// The value arguments that run the vgpu-manager chart on the real node: the device plugin on the mock GPU
/// and the node's folders, the chart's kube-scheduler from [`KUBE_SCHEDULER_IMAGE`].
fn vgpu_manager_values(cluster: &Cluster) -> Vec<String> {
    let path = |p: &Path| p.display().to_string();
    let mut values = cluster.image_values();
    values.extend([
        ("devicePlugin.hostManagerDir", path(&cluster.host.manager_dir)),
        ("devicePlugin.nvidiaDriverRoot", path(&cluster.host.driver_root)),
        ("devicePlugin.kubeletRootDir", path(&cluster.node.root_dir())),
        ("devicePlugin.mockConfig", path(&cluster.mock)),
        ("devicePlugin.devicePlugin.commands.backend", "mock".to_owned()),
        ("scheduler.kubeScheduler.image", KUBE_SCHEDULER_IMAGE.to_owned()),
    ]);
    set_args(&values)
}

const VGPU_MANAGER_NAMESPACE: &str = "vgpu-system";

/// A probe pod asking for a vGPU share with no scheduler name: the webhook gives it ours.
fn vgpu_probe(name: &str, node: &RealNode) -> Pod {
    let limits = json!({"limits": {VGPU_NUMBER: "1", VGPU_CORES: "50", VGPU_MEMORY: "4096"}});
    probe::pod(WORKLOADS, name, "main", node.busybox_image(), limits, json!({"schedulerName": null})).unwrap()
}

/// Creates `pod`, retrying while the webhook cannot be reached yet (its Service's endpoints reach kube-proxy
/// shortly after the pod is Ready).
async fn create_through_webhook(cluster: &Cluster, pods: &Api<Pod>, pod: &Pod) -> Pod {
    let last = std::sync::Mutex::new(String::new());
    let created = cluster
        .env
        .poll("the pod created through the webhook", TIMEOUT, || async {
            match pods.create(&PostParams::default(), pod).await {
                Ok(created) => Some(created),
                Err(e) => {
                    *last.lock().unwrap() = e.to_string();
                    None
                }
            }
        })
        .await;
    created.unwrap_or_else(|e| panic!("{e}: {}", last.lock().unwrap()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the control plane, the real node, Helm and root: run e2e/run.sh"]
async fn real_node_helm_installs_vgpu_manager_and_runs_a_vgpu_pod_through_webhook_and_extender() {
    // kube-scheduler of the environment places the chart's own pods only: vGPU pods go to the chart's.
    let Some(cluster) = Cluster::start(
        "real_node_helm_installs_vgpu_manager_and_runs_a_vgpu_pod_through_webhook_and_extender",
        &["default-scheduler"],
        MOCK,
    )
    .await
    else {
        return;
    };
    let binary = &cluster.env.binaries().kube_scheduler;
    let archive = images::single_binary_image(KUBE_SCHEDULER_IMAGE, binary, &cluster.work).unwrap();
    let imported = cluster.node.import_image_archive(&archive).unwrap();
    assert!(imported.iter().any(|i| i == KUBE_SCHEDULER_IMAGE), "{imported:?}");

    let mut install = vec!["vm".to_owned(), chart("vgpu-manager")];
    install.extend(strings(&["--namespace", VGPU_MANAGER_NAMESPACE, "--create-namespace"]));
    install.extend(vgpu_manager_values(&cluster));
    cluster.helm("install", &install);
    // Device plugin (+ monitor), kube-scheduler + extender, webhook.
    let installed = cluster.all_ready(VGPU_MANAGER_NAMESPACE, 3).await;
    let components = by_component(&installed);
    for want in ["vgpu-device-plugin", "vgpu-scheduler", "vgpu-webhook"] {
        assert!(components.contains_key(want), "{want} not among {:?}", components.keys());
    }
    cluster.node.wait_allocatable(&cluster.env, VGPU_NUMBER, 10, "kube-scheduler", TIMEOUT).await.unwrap();

    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), WORKLOADS);
    let created = create_through_webhook(&cluster, &pods, &vgpu_probe("vgpu", &cluster.node)).await;
    let scheduler_name = created.spec.as_ref().and_then(|s| s.scheduler_name.as_deref());
    assert_eq!(scheduler_name, Some(vgpu_e2e::SCHEDULER_NAME), "the webhook did not set our scheduler");
    let (running, seen) =
        probe::running(&cluster.env, &cluster.node, &pods, "vgpu", "kube-scheduler", TIMEOUT)
            .await
            .unwrap_or_else(|e| panic!("{e:#}\n{}", cluster.diagnostics(VGPU_MANAGER_NAMESPACE)));
    for (key, want) in [("CUDA_MEM_LIMIT_0", "4096m"), ("CUDA_CORE_LIMIT_0", "50")] {
        assert_eq!(seen.env.get(key).map(String::as_str), Some(want), "{key} in {:?}", seen.env);
    }
    assert!(seen.device("nvidia0").is_some(), "{:?}", seen.dev);
    let annotations = running.metadata.annotations.clone().unwrap_or_default();
    assert!(
        annotations.contains_key("nvidia.com/pre-allocated"),
        "not placed by the extender: {annotations:?}"
    );
    let uid = running.metadata.uid.clone().unwrap();
    assert!(
        cluster.pod_folders().iter().any(|f| f.starts_with(&uid)),
        "no files of the pod in the manager directory: {:?}",
        cluster.pod_folders()
    );

    // `helm upgrade` turning an extender gate off: the scheduler's pod (whose template holds a checksum of
    // the scheduler values) is replaced, the device plugin and the webhook are left alone, and the webhook's
    // certificate is kept (the caBundle the API server uses still matches what the webhook serves).
    let hooks: Api<MutatingWebhookConfiguration> = Api::all(cluster.client.clone());
    let ca_bundle = |c: MutatingWebhookConfiguration| c.webhooks.unwrap()[0].client_config.ca_bundle.clone();
    let ca_before = ca_bundle(hooks.get("vm-vgpu-manager-webhook-mutating").await.unwrap());
    let vgpu_before = pods.get("vgpu").await.unwrap();
    let mut upgrade = vec!["vm".to_owned(), chart("vgpu-manager")];
    upgrade.extend(strings(&["--namespace", VGPU_MANAGER_NAMESPACE, "--reuse-values"]));
    upgrade.extend(set_args(&[(
        "scheduler.schedulerExtender.commands.featureGates.SerializedNodeBind",
        "false".to_owned(),
    )]));
    cluster.helm("upgrade", &upgrade);
    let upgraded = cluster
        .env
        .poll("the scheduler's pod replaced and every pod Ready", TIMEOUT, || async {
            let ns: Api<Pod> = Api::namespaced(cluster.client.clone(), VGPU_MANAGER_NAMESPACE);
            let list = ns.list(&ListParams::default()).await.ok()?.items;
            let now: BTreeMap<String, Pod> =
                list.into_iter().map(|p| (p.metadata.name.clone().unwrap_or_default(), p)).collect();
            let replaced = by_component(&now).get("vgpu-scheduler")?.0 != components["vgpu-scheduler"].0;
            (now.len() == 3 && now.values().all(all_ready) && replaced).then_some(now)
        })
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", cluster.diagnostics(VGPU_MANAGER_NAMESPACE)));
    let after = by_component(&upgraded);
    for untouched in ["vgpu-device-plugin", "vgpu-webhook"] {
        assert_eq!(after[untouched], components[untouched], "{untouched} was restarted by the upgrade");
    }
    let scheduler_pod = upgraded.values().find(|p| component(p) == "vgpu-scheduler").unwrap();
    let args = serde_json::to_string(&scheduler_pod.spec.as_ref().unwrap().containers).unwrap();
    assert!(args.contains("SerializedNodeBind=false"), "{args}");
    assert_eq!(ca_bundle(hooks.get("vm-vgpu-manager-webhook-mutating").await.unwrap()), ca_before);
    let vgpu_after = pods.get("vgpu").await.unwrap();
    assert_eq!(vgpu_after.metadata.uid, vgpu_before.metadata.uid);
    assert_eq!(restarts(&vgpu_after), restarts(&vgpu_before), "the vGPU pod was restarted by the upgrade");
    // The upgraded scheduler and the kept webhook place and start another vGPU pod.
    create_through_webhook(&cluster, &pods, &vgpu_probe("vgpu-after-upgrade", &cluster.node)).await;
    let (_, seen) =
        probe::running(&cluster.env, &cluster.node, &pods, "vgpu-after-upgrade", "kube-scheduler", TIMEOUT)
            .await
            .unwrap_or_else(|e| panic!("{e:#}\n{}", cluster.diagnostics(VGPU_MANAGER_NAMESPACE)));
    assert_eq!(seen.env.get("CUDA_CORE_LIMIT_0").map(String::as_str), Some("50"), "{:?}", seen.env);

    // The first workload goes: the device plugin's periodic sweep removes its files (every 15 s, once they
    // are 5 s older than a pod list without them).
    let first_uid = vgpu_after.metadata.uid.clone().unwrap();
    cluster.delete_pod(&pods, "vgpu").await;
    cluster
        .env
        .poll("the deleted pod's files swept by the device plugin", TIMEOUT, || async {
            (!cluster.pod_folders().iter().any(|f| f.starts_with(&first_uid))).then_some(())
        })
        .await
        .unwrap_or_else(|e| panic!("{e}: {:?}", cluster.pod_folders()));
    // The second goes right before the uninstall, before any periodic sweep: the plugin's shutdown sweep
    // removes its files although Helm deletes the plugin's RBAC while its pod stops (the API server then
    // refuses the pod list; the kubelet's pod-resources API answers). Then the chart: no pod, socket,
    // webhook or pod file is left.
    cluster.delete_pod(&pods, "vgpu-after-upgrade").await;
    let mut uninstall = vec!["vm".to_owned()];
    uninstall.extend(strings(&["--namespace", VGPU_MANAGER_NAMESPACE, "--wait", "--timeout", "2m"]));
    cluster.helm("uninstall", &uninstall);
    cluster.no_pods(VGPU_MANAGER_NAMESPACE).await;
    cluster
        .env
        .poll("the plugin's sockets and the pods' files gone", TIMEOUT, || async {
            (cluster.plugin_sockets().is_empty() && cluster.pod_folders().is_empty()).then_some(())
        })
        .await
        .unwrap_or_else(|e| {
            panic!("{e}: sockets {:?}, pod folders {:?}", cluster.plugin_sockets(), cluster.pod_folders())
        });
    let left = hooks.list(&ListParams::default()).await.unwrap().items;
    assert!(left.is_empty(), "webhook configurations left: {left:?}");
    cluster.finish();
}

const GPU_MODULE_NAMESPACE: &str = "gpu-module";

/// A fake sysfs with one NVIDIA GPU per mock GPU (the node agent labels the node `gpu.deckhouse.io/vendor:
/// nvidia`, which the node DaemonSets select), in `dir`.
fn fake_sysfs(dir: &Path, gpus: usize) -> PathBuf {
    let fake = vgpu_node_agent::fake_sysfs::FakeSysfs::create(dir).unwrap();
    for i in 0..gpus {
        let device = vgpu_node_agent::fake_sysfs::FakeDevice::gpu("10de", "20b7", "nvidia");
        fake.add(&format!("0000:{:02x}:00.0", 0x3b + i), &device).unwrap();
    }
    fake.sysfs_root()
}

/// The value arguments every gpu-module install on the real node gets: the image, one controller replica on
/// any node, the node agent on the fake sysfs.
fn gpu_module_values(cluster: &Cluster, dra: bool) -> Vec<(&'static str, String)> {
    let sysfs = fake_sysfs(&cluster.work.join("sysfs"), MOCK_3.matches("uuid:").count());
    let mut values = cluster.image_values();
    values.extend([
        ("dra.enabled", dra.to_string()),
        ("controller.replicas", "1".to_owned()),
        ("controller.nodeSelector", "null".to_owned()),
        ("nodeAgent.sysfsRoot", sysfs.display().to_string()),
        ("nodeAgent.scanInterval", "5s".to_owned()),
    ]);
    values
}

/// The CustomResourceDefinitions of the gpu-module chart that exist now.
async fn gpu_module_crds(client: &kube::Client) -> Vec<String> {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .filter(|n| n.ends_with(".gpu.deckhouse.io"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the control plane, the real node, Helm and root: run e2e/run.sh"]
async fn real_node_helm_installs_gpu_module_in_device_plugin_mode() {
    let Some(cluster) = Cluster::start(
        "real_node_helm_installs_gpu_module_in_device_plugin_mode",
        &[vgpu_e2e::SCHEDULER_NAME, "default-scheduler"],
        MOCK_3,
    )
    .await
    else {
        return;
    };
    let path = |p: &Path| p.display().to_string();
    let mut values = gpu_module_values(&cluster, false);
    values.extend([
        ("devicePluginMode.backend", "mock".to_owned()),
        ("devicePluginMode.mockConfig", path(&cluster.mock)),
        ("devicePluginMode.kubeletRootDir", path(&cluster.node.root_dir())),
        ("devicePluginMode.hostManagerDir", path(&cluster.host.manager_dir)),
        ("devicePluginMode.driverRoot", path(&cluster.host.driver_root)),
    ]);
    let mut install = vec!["gm".to_owned(), chart("gpu-module")];
    install.extend(strings(&["--namespace", GPU_MODULE_NAMESPACE, "--create-namespace"]));
    install.extend(set_args(&values));
    cluster.helm("install", &install);
    // Node agent, device plugin (on the node the agent labelled), controller, and the MIG manager with the
    // chart's own mig-parted ConfigMap (the node asks for no layout: it waits).
    let installed = cluster.all_ready(GPU_MODULE_NAMESPACE, 4).await;
    let components = by_component(&installed);
    for want in ["vgpu-node-agent", "vgpu-device-plugin", "vgpu-controller", "vgpu-mig-manager"] {
        assert!(components.contains_key(want), "{want} not among {:?}", components.keys());
    }
    cluster
        .node
        .wait_allocatable(&cluster.env, "nvidia.com/gpu", 3, "kube-scheduler", TIMEOUT)
        .await
        .unwrap();

    // A pod asking for a whole GPU, placed by kube-scheduler alone.
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), WORKLOADS);
    let limits = json!({"limits": {"nvidia.com/gpu": "1"}});
    let pod =
        probe::pod(WORKLOADS, "whole", "main", cluster.node.busybox_image(), limits, json!({})).unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let (_, seen) = probe::running(&cluster.env, &cluster.node, &pods, "whole", "kube-scheduler", TIMEOUT)
        .await
        .unwrap_or_else(|e| panic!("{e:#}\n{}", cluster.diagnostics(GPU_MODULE_NAMESPACE)));
    let visible = seen.env.get("NVIDIA_VISIBLE_DEVICES").cloned().unwrap_or_default();
    assert!(visible.starts_with("GPU-MOD-") && !visible.contains(','), "one whole GPU: {:?}", seen.env);
    assert!(!seen.env.keys().any(|k| k.starts_with("CUDA_MEM_LIMIT")), "no vGPU limits: {:?}", seen.env);
    let minor = visible.trim_start_matches("GPU-MOD-");
    assert!(seen.device(&format!("nvidia{minor}")).is_some(), "{:?}", seen.dev);

    // `helm upgrade` changing the node agent's scan interval replaces its pod only.
    let whole_before = pods.get("whole").await.unwrap();
    let mut upgrade = vec!["gm".to_owned(), chart("gpu-module")];
    upgrade.extend(strings(&["--namespace", GPU_MODULE_NAMESPACE, "--reuse-values"]));
    upgrade.extend(set_args(&[("nodeAgent.scanInterval", "7s".to_owned())]));
    cluster.helm("upgrade", &upgrade);
    let upgraded = cluster
        .env
        .poll("the node agent's pod replaced and every pod Ready", TIMEOUT, || async {
            let ns: Api<Pod> = Api::namespaced(cluster.client.clone(), GPU_MODULE_NAMESPACE);
            let list = ns.list(&ListParams::default()).await.ok()?.items;
            let now: BTreeMap<String, Pod> =
                list.into_iter().map(|p| (p.metadata.name.clone().unwrap_or_default(), p)).collect();
            let replaced = by_component(&now).get("vgpu-node-agent")?.0 != components["vgpu-node-agent"].0;
            (now.len() == 4 && now.values().all(all_ready) && replaced).then_some(now)
        })
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", cluster.diagnostics(GPU_MODULE_NAMESPACE)));
    let after = by_component(&upgraded);
    for untouched in ["vgpu-device-plugin", "vgpu-controller", "vgpu-mig-manager"] {
        assert_eq!(after[untouched], components[untouched], "{untouched} was restarted by the upgrade");
    }
    let agent = upgraded.values().find(|p| component(p) == "vgpu-node-agent").unwrap();
    let args = serde_json::to_string(&agent.spec.as_ref().unwrap().containers[0].args).unwrap();
    assert!(args.contains("--scan-interval=7s"), "{args}");
    let whole_after = pods.get("whole").await.unwrap();
    assert_eq!(restarts(&whole_after), restarts(&whole_before), "the GPU pod was restarted by the upgrade");

    // The workload goes, then the chart: no pod or socket left, the CRDs stay.
    cluster.delete_pod(&pods, "whole").await;
    let mut uninstall = vec!["gm".to_owned()];
    uninstall.extend(strings(&["--namespace", GPU_MODULE_NAMESPACE, "--wait", "--timeout", "2m"]));
    cluster.helm("uninstall", &uninstall);
    cluster.no_pods(GPU_MODULE_NAMESPACE).await;
    cluster
        .env
        .poll("the plugin's sockets and the pods' files gone", TIMEOUT, || async {
            (cluster.plugin_sockets().is_empty() && cluster.pod_folders().is_empty()).then_some(())
        })
        .await
        .unwrap_or_else(|e| {
            panic!("{e}: sockets {:?}, pod folders {:?}", cluster.plugin_sockets(), cluster.pod_folders())
        });
    let crds = gpu_module_crds(&cluster.client).await;
    assert_eq!(crds.len(), 2, "the CRDs are kept: {crds:?}");
    cluster.finish();
}

/// `devicePluginMode.nodeGroups=[{name: shared, config: {wholeGpus: false, deviceSplitCount: N}}]`.
fn shared_group(split: u32) -> String {
    json!([{"name": "shared", "nodeSelector": {}, "config": {"wholeGpus": false, "deviceSplitCount": split}}])
        .to_string()
}

/// NodeGroups, live configuration: a group's device plugin (`vgpu-device-plugin-shared`, vGPU shares) makes
/// the node advertise `nvidia.com/vgpu-number` = 3 GPUs × the group's split count; `helm upgrade` changing
/// that split count changes the group's ConfigMap only, and the node's capacity follows while the plugin's pod
/// stays the same pod (same UID, same container, no restart): the kubelet refreshes the ConfigMap volume
/// (its `syncFrequency` set to 5 s here, the default being a minute) and the plugin re-reads the file and
/// re-advertises.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the control plane, the real node, Helm and root: run e2e/run.sh"]
async fn real_node_helm_gpu_module_node_group_split_count_changes_live() {
    let Some(cluster) = Cluster::start_with(
        "real_node_helm_gpu_module_node_group_split_count_changes_live",
        &[vgpu_e2e::SCHEDULER_NAME, "default-scheduler"],
        MOCK_3,
        |node| node.kubelet_config("syncFrequency", json!("5s")),
    )
    .await
    else {
        return;
    };
    let path = |p: &Path| p.display().to_string();
    let mut values = gpu_module_values(&cluster, false);
    values.extend([
        ("devicePluginMode.backend", "mock".to_owned()),
        ("devicePluginMode.mockConfig", path(&cluster.mock)),
        ("devicePluginMode.kubeletRootDir", path(&cluster.node.root_dir())),
        ("devicePluginMode.hostManagerDir", path(&cluster.host.manager_dir)),
        ("devicePluginMode.driverRoot", path(&cluster.host.driver_root)),
        ("devicePluginMode.migManager.enabled", "false".to_owned()),
    ]);
    let mut install = vec!["gm".to_owned(), chart("gpu-module")];
    install.extend(strings(&["--namespace", GPU_MODULE_NAMESPACE, "--create-namespace"]));
    install.extend(set_args(&values));
    install.extend(["--set-json".to_owned(), format!("devicePluginMode.nodeGroups={}", shared_group(2))]);
    cluster.helm("install", &install);
    let installed = cluster.all_ready(GPU_MODULE_NAMESPACE, 3).await;
    let plugin_pod = |pods: &BTreeMap<String, Pod>| -> (String, String, Restarts) {
        let pod = pods
            .values()
            .find(|p| component(p) == "vgpu-device-plugin")
            .unwrap_or_else(|| panic!("no device plugin among {:?}", pods.keys()));
        let name = pod.metadata.name.clone().unwrap();
        assert!(name.starts_with("vgpu-device-plugin-shared-"), "{name}");
        (name, pod.metadata.uid.clone().unwrap(), restarts(pod))
    };
    let before = plugin_pod(&installed);
    cluster
        .node
        .wait_allocatable(&cluster.env, VGPU_NUMBER, 6, "kube-scheduler", TIMEOUT)
        .await
        .unwrap_or_else(|e| panic!("{e:#}\n{}", cluster.diagnostics(GPU_MODULE_NAMESPACE)));

    // Split 2 → 5: only the ConfigMap changes; the same pod re-advertises 3 × 5.
    let started = std::time::Instant::now();
    let mut upgrade = vec!["gm".to_owned(), chart("gpu-module")];
    upgrade.extend(strings(&["--namespace", GPU_MODULE_NAMESPACE, "--reuse-values"]));
    upgrade.extend(["--set-json".to_owned(), format!("devicePluginMode.nodeGroups={}", shared_group(5))]);
    cluster.helm("upgrade", &upgrade);
    cluster
        .node
        .wait_allocatable(&cluster.env, VGPU_NUMBER, 15, "kube-scheduler", TIMEOUT)
        .await
        .unwrap_or_else(|e| panic!("{e:#}\n{}", cluster.diagnostics(GPU_MODULE_NAMESPACE)));
    eprintln!("capacity 6 → 15 {:.1} s after helm upgrade", started.elapsed().as_secs_f64());
    let after = cluster.all_ready(GPU_MODULE_NAMESPACE, 3).await;
    assert_eq!(plugin_pod(&after), before, "the device plugin's pod was replaced or restarted");

    let mut uninstall = vec!["gm".to_owned()];
    uninstall.extend(strings(&["--namespace", GPU_MODULE_NAMESPACE, "--wait", "--timeout", "2m"]));
    cluster.helm("uninstall", &uninstall);
    cluster.no_pods(GPU_MODULE_NAMESPACE).await;
    cluster.finish();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the control plane, the real node, Helm and root: run e2e/run.sh"]
async fn real_node_helm_installs_gpu_module_in_dra_mode() {
    let Some(cluster) = Cluster::start(
        "real_node_helm_installs_gpu_module_in_dra_mode",
        &[vgpu_e2e::SCHEDULER_NAME, "default-scheduler"],
        MOCK_3,
    )
    .await
    else {
        return;
    };
    let (node, host) = (&cluster.node, &cluster.host);
    let path = |p: &Path| p.display().to_string();
    let mut values = gpu_module_values(&cluster, true);
    values.extend([
        ("adapters.metax.enabled", "false".to_owned()),
        ("adapters.nvidia.backend", "mock".to_owned()),
        ("adapters.mockConfig", path(&cluster.mock)),
        ("adapters.kubeletRegistrarDirectoryPath", path(&node.plugins_registry_dir())),
        ("adapters.kubeletPluginsDirectoryPath", path(&node.plugins_dir())),
        ("adapters.cdiRoot", path(&node.cdi_dir())),
        ("adapters.hostManagerDir", path(&host.manager_dir)),
        ("adapters.driverRoot", path(&host.driver_root)),
    ]);
    let mut install = vec!["gm".to_owned(), chart("gpu-module")];
    install.extend(strings(&["--namespace", GPU_MODULE_NAMESPACE, "--create-namespace"]));
    install.extend(set_args(&values));
    cluster.helm("install", &install);
    // Node agent, NVIDIA adapter (on the node the agent labelled), controller.
    let installed = cluster.all_ready(GPU_MODULE_NAMESPACE, 3).await;
    let components = by_component(&installed);
    for want in ["vgpu-node-agent", "vgpu-adapter-nvidia", "vgpu-controller"] {
        assert!(components.contains_key(want), "{want} not among {:?}", components.keys());
    }
    let registration = node.plugins_registry_dir().join("manager.nvidia.com-reg.sock");
    let slices: Api<ResourceSlice> = Api::all(cluster.client.clone());
    cluster
        .env
        .poll("the adapter's ResourceSlice", TIMEOUT, || async {
            let list = slices
                .list(&ListParams::default().fields(&format!("spec.nodeName={}", node.node_name())))
                .await
                .ok()?;
            list.items.into_iter().next()
        })
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", cluster.diagnostics(GPU_MODULE_NAMESPACE)));
    assert!(registration.exists(), "{}", registration.display());

    // A GPUClass becomes a DeviceClass (the controller), and a claim of it runs a pod with a GPU.
    let ar = kube::api::ApiResource {
        group: "gpu.deckhouse.io".into(),
        version: "v1alpha1".into(),
        api_version: "gpu.deckhouse.io/v1alpha1".into(),
        kind: "GPUClass".into(),
        plural: "gpuclasses".into(),
    };
    let classes: Api<kube::api::DynamicObject> = Api::all_with(cluster.client.clone(), &ar);
    let class: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "gpu.deckhouse.io/v1alpha1", "kind": "GPUClass", "metadata": {"name": "a30-whole"},
        "spec": {"vendor": "nvidia", "sharing": {"mode": "Exclusive"}}}))
    .unwrap();
    let last = std::sync::Mutex::new(String::new());
    cluster
        .env
        .poll("the GPUClass created (the controller's webhook answers)", TIMEOUT, || async {
            match classes.create(&PostParams::default(), &class).await {
                Ok(_) => Some(()),
                Err(e) => {
                    *last.lock().unwrap() = e.to_string();
                    None
                }
            }
        })
        .await
        .unwrap_or_else(|e| panic!("{e}: {}", last.lock().unwrap()));
    let device_classes: Api<DeviceClass> = Api::all(cluster.client.clone());
    let device_class = "a30-whole.gpu.deckhouse.io";
    cluster
        .env
        .poll("the GPUClass's DeviceClass", TIMEOUT, || async {
            device_classes.get_opt(device_class).await.ok()?
        })
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", cluster.diagnostics(GPU_MODULE_NAMESPACE)));

    let claims: Api<ResourceClaim> = Api::namespaced(cluster.client.clone(), WORKLOADS);
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), WORKLOADS);
    let claim = fixtures::dra_claim(WORKLOADS, "gpu", device_class, &serde_json::Value::Null).unwrap();
    claims.create(&PostParams::default(), &claim).await.unwrap();
    let resources = json!({"claims": [{"name": "gpu"}]});
    let spec = json!({"resourceClaims": [{"name": "gpu", "resourceClaimName": "gpu"}]});
    let pod = probe::pod(WORKLOADS, "claimed", "cuda", node.busybox_image(), resources, spec).unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let (_, seen) = probe::running(&cluster.env, node, &pods, "claimed", "kube-scheduler", TIMEOUT)
        .await
        .unwrap_or_else(|e| panic!("{e:#}\n{}", cluster.diagnostics(GPU_MODULE_NAMESPACE)));
    let uid = claims.get("gpu").await.unwrap().metadata.uid.unwrap();
    let visible = seen.env.get("MANAGER_VISIBLE_DEVICE_0").cloned().unwrap_or_default();
    assert!(visible.starts_with("GPU-MOD-"), "{:?}", seen.env);
    assert_eq!(seen.env.get("MANAGER_VGPU_CLAIM_UID"), Some(&uid), "{:?}", seen.env);
    let spec_file = node.cdi_dir().join(format!("k8s.manager.nvidia.com-claim_{uid}.json"));
    assert!(spec_file.exists(), "{}", spec_file.display());

    // The workload goes, then the chart: no pod, socket or claim CDI spec left; the CRDs stay.
    cluster.delete_pod(&pods, "claimed").await;
    claims.delete("gpu", &DeleteParams::default()).await.unwrap();
    let mut uninstall = vec!["gm".to_owned()];
    uninstall.extend(strings(&["--namespace", GPU_MODULE_NAMESPACE, "--wait", "--timeout", "2m"]));
    cluster.helm("uninstall", &uninstall);
    cluster.no_pods(GPU_MODULE_NAMESPACE).await;
    cluster
        .env
        .poll("the registration socket gone", TIMEOUT, || async { (!registration.exists()).then_some(()) })
        .await
        .unwrap();
    let left: Vec<String> = std::fs::read_dir(node.cdi_dir())
        .map(|d| d.filter_map(|e| Some(e.ok()?.file_name().to_string_lossy().into_owned())).collect())
        .unwrap_or_default();
    assert!(left.iter().all(|f| !f.contains("claim_")), "claim CDI specs left: {left:?}");
    let crds = gpu_module_crds(&cluster.client).await;
    assert_eq!(crds.len(), 2, "the CRDs are kept: {crds:?}");
    cluster.finish();
}

/// Runs a future to completion from a synchronous panic message (the test's runtime is multi-threaded).
fn block_on_text<F: std::future::Future<Output = String>>(future: F) -> String {
    tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(future))
}
