//! vgpu-manager's OWN Helm charts (not ours) installed on the real node with our image (issue #32's last
//! acceptance point): the charts come from a copy of vgpu-manager's repository fetched for reading, never
//! committed here — `$VGPU_UPSTREAM_CHARTS` names the folder holding `vgpu-manager/` and
//! `vgpu-manager-dra-driver/` (`scripts/upstream-charts.sh` extracts them and runs this test). Without it the
//! tests say so and pass: CI has no copy.
//!
//! Each chart is installed with its own `values.yaml` and only the overrides this environment needs: the
//! image (ours, imported into the node's containerd, never pulled), the node's folders (kubelet root, manager
//! directory, driver root with fake device nodes, CDI folder), the chart's kube-scheduler image (the control
//! plane's binary alone in an image), and the mock GPU: the charts take no extra arguments, so the mock
//! backend is chosen through the containers' extra env the charts do offer (`VGPU_BACKEND=mock`,
//! `VGPU_MOCK_CONFIG=/driver-root/mock.yaml`, appended to the chart's own env lists). The node gets the label
//! each chart's DaemonSet selects (`vgpu-manager=device-plugin`, `vgpu-manager=dra-driver`).
//!
//! - `vgpu-manager`: the device plugin (+ device monitor, after the `/scripts/install_files.sh` init
//!   container), the chart's kube-scheduler + our extender (`device-scheduler`), the webhook (`device-webhook`,
//!   the chart's self-signed certificate) all Running and Ready; the pod of vgpu-manager's README (one vGPU,
//!   10 % of the cores, 1024 MiB) is placed by the chart's scheduler through our extender and starts with its
//!   limits.
//! - `vgpu-manager-dra-driver`: the kubelet plugin (after `kubelet-plugin-prestart.sh` and
//!   `install_files.sh`, started through the chart's `bash -c '… exec kubelet-plugin "$@"'`) and the webhook
//!   Running and Ready, the node's ResourceSlice published; the same README pod, without a scheduler name, is
//!   converted by the webhook into a claim of the chart's `vgpu-manager` DeviceClass and starts with its
//!   limits.
//!
//! The CUDA limiter (`libvgpu-control.so`) is vgpu-manager's, not in our image: each test first shows that,
//! without it, the plugin refuses the README pod naming the missing library (the device plugin's Allocate,
//! the kubelet plugin's NodePrepareResources); then, as in `real_node_helm.rs`, stand-ins for its runtime
//! files are installed on the host, which the probe container (static busybox) never loads. The limits
//! checked are what the plugins hand the container (env, `vgpu.config`), not their enforcement.
//!
//! Needs the control plane, the real node, Helm and root: `scripts/upstream-charts.sh`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::Duration,
};

use k8s_openapi::api::{
    core::v1::{Node, Pod},
    resource::v1::{ResourceClaim, ResourceSlice},
};
use kube::{
    Api,
    api::{ListParams, Patch, PatchParams},
};
use serde_json::{Value, json};
use vgpu_core::abi::runtime_files;
use vgpu_e2e::{
    TestEnv,
    fixtures::{VGPU_CORES, VGPU_MEMORY, VGPU_NUMBER},
    helm, images, probe,
    real_node::{self, RealNode},
    scheduler_configuration,
};

const TIMEOUT: Duration = Duration::from_secs(180);
/// The folder holding vgpu-manager's `vgpu-manager/` and `vgpu-manager-dra-driver/` charts.
const CHARTS_ENV: &str = "VGPU_UPSTREAM_CHARTS";
/// The chart's kube-scheduler: the control plane's binary alone in an image.
const KUBE_SCHEDULER_IMAGE: &str = "localhost/kube-scheduler";
const KUBE_SCHEDULER_TAG: &str = "e2e";
const NAMESPACE: &str = "vgpu-system";
const WORKLOADS: &str = "default";
/// Where the mock description is inside the charts' containers: the driver root, which both charts mount
/// at `/driver-root` in every node container.
const MOCK_IN_CONTAINER: &str = "/driver-root/mock.yaml";
const MOCK: &str =
    "gpus:\n  - { uuid: GPU-UP-0, name: NVIDIA A30, memoryMiB: 24576, computeCapability: '8.0', minor: 0 }\n";

/// `$VGPU_UPSTREAM_CHARTS`, or `None` after saying why the test skips.
fn upstream_charts() -> Option<PathBuf> {
    let Some(dir) = std::env::var_os(CHARTS_ENV).filter(|v| !v.is_empty()).map(PathBuf::from) else {
        println!(
            "skipped: {CHARTS_ENV} is not set (the folder holding vgpu-manager's own charts; scripts/upstream-charts.sh extracts them from a copy of its repository and runs this test)"
        );
        return None;
    };
    for chart in ["vgpu-manager", "vgpu-manager-dra-driver"] {
        assert!(
            dir.join(chart).join("Chart.yaml").is_file(),
            "{CHARTS_ENV}={} holds no {chart}/Chart.yaml",
            dir.display()
        );
    }
    Some(dir)
}

/// Our image as an OCI archive (`$VGPU_E2E_IMAGE_ARCHIVE`, else built once per test binary by
/// `vgpu_e2e::images::vgpu_image_archive` into `<target>/tmp/<test>/`, replaced by the next run).
fn image_archive() -> PathBuf {
    images::vgpu_image_archive(&Path::new(env!("CARGO_TARGET_TMPDIR")).join("real_node_upstream_charts"))
        .unwrap()
}

/// The environment (API server, controller manager, kube-scheduler for the `default-scheduler` profile),
/// the real node with kube-proxy, our image imported, fake GPUs and the mock description in the driver root.
struct Cluster {
    // Dropped first: the node is torn down before the environment.
    node: RealNode,
    env: TestEnv,
    client: kube::Client,
    helm: PathBuf,
    host: probe::GpuHost,
    work: PathBuf,
    charts: PathBuf,
}

impl Cluster {
    async fn start(name: &str) -> Option<Self> {
        let charts = upstream_charts()?;
        let binaries = real_node::locate_or_skip().unwrap()?;
        let helm_bin = helm::locate_helm().unwrap()?;
        let mut env = real_node::env_builder(name).cluster_services().start().await.unwrap();
        let node = RealNode::builder().binaries(binaries).kube_proxy().start(&env).await.unwrap();
        let client = env.client().await.unwrap();
        // The environment's kube-scheduler places the charts' own pods (and DRA pods); vGPU pods of the
        // vgpu-manager chart go to that chart's scheduler.
        let mut scheduler = scheduler_configuration(env.kubeconfig_path(), &[]);
        scheduler["profiles"] = json!([{"schedulerName": "default-scheduler"}]);
        env.start_scheduler_with_config(&scheduler).await.unwrap();

        // Under the node folder, a shared mount: the charts mount the manager directory (and the kubelet's
        // folders) with `mountPropagation: Bidirectional`, which containerd refuses for a host path on a
        // private mount (a real node's `/` is shared, the test host's may not be).
        let work = node.dir().join("upstream");
        std::fs::create_dir_all(&work).unwrap();
        let imported = node.import_image_archive(&image_archive()).unwrap();
        assert!(
            imported.iter().any(|i| i == images::VGPU_IMAGE),
            "{} not among the imported images {imported:?}",
            images::VGPU_IMAGE
        );
        let host = probe::GpuHost::create(&work, 1).unwrap();
        std::fs::write(host.driver_root.join("mock.yaml"), MOCK).unwrap();
        Some(Self { node, env, client, helm: helm_bin, host, work, charts })
    }

    /// The limiter is vgpu-manager's, not in our image (so `install_files.sh` installs none): stand-ins for its
    /// runtime files, which the static busybox of the probe pods never loads.
    fn install_limiter_stand_ins(&self) {
        runtime_files::install(&self.host.manager_dir, "v1.0.0", b"not a real library: busybox is static")
            .unwrap();
    }

    /// Waits until pod `name`'s status message or one of its events names the missing control library, and
    /// returns that text: how the plugins refuse a vGPU container while `libvgpu-control.so` is not installed.
    async fn refused_for_the_limiter(&self, pods: &Api<Pod>, name: &str) -> String {
        let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(self.client.clone(), WORKLOADS);
        let found = self
            .env
            .poll(&format!("pod {name} refused for want of libvgpu-control.so"), TIMEOUT, || async {
                let pod = pods.get(name).await.ok()?;
                let status = pod.status.unwrap_or_default();
                let mut texts: Vec<String> = status.message.into_iter().collect();
                let params = ListParams::default().fields(&format!("involvedObject.name={name}"));
                texts.extend(events.list(&params).await.ok()?.items.into_iter().filter_map(|e| e.message));
                texts.into_iter().find(|t| t.contains("libvgpu-control.so"))
            })
            .await;
        found.unwrap_or_else(|e| panic!("{e}\n{}", self.diagnostics()))
    }

    /// Deletes workload pod `name` and waits until it is gone.
    async fn delete_pod(&self, pods: &Api<Pod>, name: &str) {
        pods.delete(name, &Default::default()).await.unwrap();
        self.env
            .poll(&format!("{name} gone"), TIMEOUT, || async {
                pods.get_opt(name).await.ok()?.is_none().then_some(())
            })
            .await
            .unwrap();
    }

    /// Labels the node with `vgpu-manager=<value>` (what the charts' DaemonSets select).
    async fn label_node(&self, value: &str) {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let patch = json!({"metadata": {"labels": {"vgpu-manager": value}}});
        nodes.patch(self.node.node_name(), &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    }

    /// The chart's own `values.yaml`, as JSON.
    fn chart_values(&self, chart: &str) -> Value {
        let text = std::fs::read_to_string(self.charts.join(chart).join("values.yaml")).unwrap();
        serde_saphyr::from_str(&text).unwrap()
    }

    /// `helm install <release> <chart> -f <overrides>`; the overrides are written as JSON (YAML).
    fn install(&self, release: &str, chart: &str, overrides: &Value) {
        let file = self.work.join(format!("{release}-values.json"));
        std::fs::write(&file, serde_json::to_vec_pretty(overrides).unwrap()).unwrap();
        println!(
            "helm install {release} {chart} -f {}:\n{}",
            file.display(),
            serde_json::to_string_pretty(overrides).unwrap()
        );
        let args = [
            release,
            &self.charts.join(chart).display().to_string(),
            "--namespace",
            NAMESPACE,
            "--create-namespace",
            "-f",
            &file.display().to_string(),
        ]
        .map(str::to_owned);
        helm::run(&self.helm, self.env.kubeconfig_path(), "install", &args).unwrap();
    }

    fn uninstall(&self, release: &str) {
        let args = [release, "--namespace", NAMESPACE, "--wait", "--timeout", "2m"].map(str::to_owned);
        helm::run(&self.helm, self.env.kubeconfig_path(), "uninstall", &args).unwrap();
    }

    /// Waits until the chart's namespace holds exactly `count` pods, all Running and Ready.
    async fn all_ready(&self, count: usize) -> BTreeMap<String, Pod> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), NAMESPACE);
        let ready = self
            .env
            .poll(&format!("{count} pods Running and Ready in {NAMESPACE}"), TIMEOUT, || async {
                let list = pods.list(&ListParams::default()).await.ok()?.items;
                (list.len() == count && list.iter().all(all_ready)).then(|| {
                    list.into_iter().map(|p| (p.metadata.name.clone().unwrap_or_default(), p)).collect()
                })
            })
            .await;
        ready.unwrap_or_else(|e| panic!("{e}\n{}", self.diagnostics()))
    }

    async fn no_pods(&self) {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), NAMESPACE);
        self.env
            .poll(&format!("no pod left in {NAMESPACE}"), TIMEOUT, || async {
                pods.list(&ListParams::default()).await.ok()?.items.is_empty().then_some(())
            })
            .await
            .unwrap_or_else(|e| panic!("{e}\n{}", self.diagnostics()));
    }

    /// Every chart pod's status and its containers' logs, then the node's logs.
    fn diagnostics(&self) -> String {
        block_on(async {
            let pods: Api<Pod> = Api::namespaced(self.client.clone(), NAMESPACE);
            let Ok(list) = pods.list(&ListParams::default()).await else {
                return "cannot list pods".to_owned();
            };
            let mut out = Vec::new();
            for pod in list.items {
                let name = pod.metadata.name.clone().unwrap_or_default();
                out.push(format!(
                    "--- pod {name}: {}",
                    serde_json::to_string(&pod.status).unwrap_or_default()
                ));
                let spec = pod.spec.unwrap_or_default();
                let containers = spec.init_containers.unwrap_or_default().into_iter().chain(spec.containers);
                for c in containers {
                    let params = kube::api::LogParams {
                        container: Some(c.name.clone()),
                        tail_lines: Some(30),
                        ..Default::default()
                    };
                    let log = pods.logs(&name, &params).await.unwrap_or_else(|e| format!("(no log: {e})"));
                    out.push(format!("--- {name}/{}:\n{log}", c.name));
                }
            }
            out.join("\n")
        }) + "\n"
            + &self.node.log_tails(40)
    }

    /// Each chart pod's containers with their restart counts, for the report.
    fn describe(pods: &BTreeMap<String, Pod>) -> String {
        pods.values()
            .map(|p| {
                let statuses =
                    p.status.as_ref().and_then(|s| s.container_statuses.clone()).unwrap_or_default();
                let containers: Vec<String> = statuses
                    .iter()
                    .map(|c| format!("{} ready={} restarts={}", c.name, c.ready, c.restart_count))
                    .collect();
                format!("{}: Running [{}]", p.metadata.name.as_deref().unwrap_or("?"), containers.join(", "))
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn finish(mut self) {
        self.node.stop().unwrap();
        self.env.finish();
    }
}

fn all_ready(pod: &Pod) -> bool {
    let Some(status) = &pod.status else { return false };
    status.phase.as_deref() == Some("Running")
        && status.container_statuses.as_ref().is_some_and(|c| !c.is_empty() && c.iter().all(|c| c.ready))
}

/// `list` (a chart's env list) with `extra` appended.
fn env_with(list: &Value, extra: &[(&str, &str)]) -> Value {
    let mut items = list.as_array().cloned().unwrap_or_default();
    items.extend(extra.iter().map(|(k, v)| json!({"name": k, "value": v})));
    Value::Array(items)
}

const MOCK_ENV: [(&str, &str); 2] = [("VGPU_BACKEND", "mock"), ("VGPU_MOCK_CONFIG", MOCK_IN_CONTAINER)];

/// The pod of vgpu-manager's README ("Example of use"): one vGPU, 10 % of the cores, 1024 MiB; the probe
/// script (busybox) in place of the CUDA image.
fn readme_pod(name: &str, node: &RealNode, scheduler: Option<&str>) -> Pod {
    let limits = json!({"limits": {VGPU_NUMBER: "1", VGPU_CORES: "10", VGPU_MEMORY: "1024"}});
    let spec = json!({"schedulerName": scheduler, "terminationGracePeriodSeconds": 0});
    probe::pod(WORKLOADS, name, "default", node.busybox_image(), limits, spec).unwrap()
}

/// Creates `pod`, retrying while the webhook cannot be reached yet (its Service's endpoints reach kube-proxy
/// shortly after the pod is Ready).
async fn create_through_webhook(cluster: &Cluster, pods: &Api<Pod>, pod: &Pod) -> Pod {
    let last = std::sync::Mutex::new(String::new());
    let created = cluster
        .env
        .poll("the pod created through the webhook", TIMEOUT, || async {
            match pods.create(&kube::api::PostParams::default(), pod).await {
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
#[ignore = "needs vgpu-manager's charts ($VGPU_UPSTREAM_CHARTS), the control plane, the real node, Helm and root: scripts/upstream-charts.sh"]
async fn upstream_vgpu_manager_chart_runs_our_image_and_a_vgpu_pod() {
    let Some(cluster) = Cluster::start("upstream_vgpu_manager_chart_runs_our_image_and_a_vgpu_pod").await
    else {
        return;
    };
    let binary = &cluster.env.binaries().kube_scheduler;
    let reference = format!("{KUBE_SCHEDULER_IMAGE}:{KUBE_SCHEDULER_TAG}");
    let archive = images::single_binary_image(&reference, binary, &cluster.work).unwrap();
    let imported = cluster.node.import_image_archive(&archive).unwrap();
    assert!(imported.contains(&reference), "{imported:?}");
    cluster.label_node("device-plugin").await;

    let defaults = cluster.chart_values("vgpu-manager");
    let (repository, tag) = images::VGPU_IMAGE.rsplit_once(':').unwrap();
    let path = |p: &Path| p.display().to_string();
    let overrides = json!({
        "image": repository,
        "imageTag": tag,
        "imagePullPolicy": "Never",
        "scheduler": {"kubeScheduler": {
            "image": KUBE_SCHEDULER_IMAGE, "imageTag": KUBE_SCHEDULER_TAG, "imagePullPolicy": "Never"}},
        "devicePlugin": {
            "kubeletRoot": path(&cluster.node.root_dir()),
            "managerRoot": path(&cluster.host.manager_dir),
            "driverRoot": path(&cluster.host.driver_root),
            "devicePlugin": {"env": env_with(&defaults["devicePlugin"]["devicePlugin"]["env"], &MOCK_ENV)},
            "deviceMonitor": {"env": env_with(&defaults["devicePlugin"]["deviceMonitor"]["env"], &MOCK_ENV)},
        },
    });
    cluster.install("vm", "vgpu-manager", &overrides);
    // Device plugin (+ monitor), kube-scheduler + extender, webhook.
    let installed = cluster.all_ready(3).await;
    println!("vgpu-manager chart, every pod Running and Ready:\n{}", Cluster::describe(&installed));
    let installed_client = cluster.host.manager_dir.join("registry/device-client");
    assert!(installed_client.is_file(), "install_files.sh did not install {}", installed_client.display());
    cluster.node.wait_allocatable(&cluster.env, VGPU_NUMBER, 10, "kube-scheduler", TIMEOUT).await.unwrap();

    // Without the limiter (our image has none): the device plugin refuses the vGPU container, saying what
    // is missing.
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), WORKLOADS);
    create_through_webhook(&cluster, &pods, &readme_pod("no-limiter", &cluster.node, Some("vgpu-scheduler")))
        .await;
    let refusal = cluster.refused_for_the_limiter(&pods, "no-limiter").await;
    println!("no-limiter refused without libvgpu-control.so: {refusal}");
    cluster.delete_pod(&pods, "no-limiter").await;
    cluster.install_limiter_stand_ins();

    // The README's pod, with the README's scheduler name.
    let created = create_through_webhook(
        &cluster,
        &pods,
        &readme_pod("gpu-pod", &cluster.node, Some("vgpu-scheduler")),
    )
    .await;
    assert_eq!(created.spec.as_ref().and_then(|s| s.scheduler_name.as_deref()), Some("vgpu-scheduler"));
    let (running, seen) =
        probe::running(&cluster.env, &cluster.node, &pods, "gpu-pod", "kube-scheduler", TIMEOUT)
            .await
            .unwrap_or_else(|e| panic!("{e:#}\n{}", cluster.diagnostics()));
    println!(
        "gpu-pod Running on {:?}; its env: {:?}",
        running.spec.as_ref().and_then(|s| s.node_name.as_deref()),
        seen.env
            .iter()
            .filter(|(k, _)| k.starts_with("CUDA_")
                || k.starts_with("NVIDIA_")
                || k.starts_with("MANAGER_")
                || k.starts_with("LD_"))
            .collect::<BTreeMap<_, _>>()
    );
    for (key, want) in [("CUDA_MEM_LIMIT_0", "1024m"), ("CUDA_CORE_LIMIT_0", "10")] {
        assert_eq!(seen.env.get(key).map(String::as_str), Some(want), "{key} in {:?}", seen.env);
    }
    assert!(seen.device("nvidia0").is_some(), "{:?}", seen.dev);
    assert!(!seen.vgpu_config.is_empty(), "no vgpu.config mounted");
    let annotations = running.metadata.annotations.clone().unwrap_or_default();
    assert!(
        annotations.contains_key("nvidia.com/pre-allocated"),
        "not placed by the extender: {annotations:?}"
    );

    cluster.delete_pod(&pods, "gpu-pod").await;
    cluster.uninstall("vm");
    cluster.no_pods().await;
    cluster.finish();
}

/// A stand-in `nvidia-smi` (exit 0) and `libnvidia-ml.so.1` under the driver root: what the DRA chart's
/// `kubelet-plugin-prestart.sh` init container waits for before the plugin starts.
fn fake_driver_tools(driver_root: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let smi = driver_root.join("usr/bin/nvidia-smi");
    std::fs::create_dir_all(smi.parent().unwrap()).unwrap();
    std::fs::write(&smi, "#!/bin/sh\necho 'fake nvidia-smi (e2e): the mock GPU'\n").unwrap();
    std::fs::set_permissions(&smi, std::fs::Permissions::from_mode(0o755)).unwrap();
    let lib = driver_root.join("usr/lib64/libnvidia-ml.so.1");
    std::fs::create_dir_all(lib.parent().unwrap()).unwrap();
    std::fs::write(&lib, b"").unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs vgpu-manager's charts ($VGPU_UPSTREAM_CHARTS), the control plane, the real node, Helm and root: scripts/upstream-charts.sh"]
async fn upstream_dra_driver_chart_runs_our_image_and_a_vgpu_pod() {
    let Some(cluster) = Cluster::start("upstream_dra_driver_chart_runs_our_image_and_a_vgpu_pod").await
    else {
        return;
    };
    cluster.label_node("dra-driver").await;
    fake_driver_tools(&cluster.host.driver_root);

    let defaults = cluster.chart_values("vgpu-manager-dra-driver");
    let (repository, tag) = images::VGPU_IMAGE.rsplit_once(':').unwrap();
    let path = |p: &Path| p.display().to_string();
    let overrides = json!({
        "image": repository,
        "imageTag": tag,
        "imagePullPolicy": "Never",
        "kubeletPlugin": {
            "driverRoot": path(&cluster.host.driver_root),
            "kubeletRoot": path(&cluster.node.root_dir()),
            "managerRoot": path(&cluster.host.manager_dir),
            "cdiRoot": path(&cluster.node.cdi_dir()),
            "containers": {"plugin": {
                "env": env_with(&defaults["kubeletPlugin"]["containers"]["plugin"]["env"], &MOCK_ENV)}},
        },
    });
    cluster.install("dra", "vgpu-manager-dra-driver", &overrides);
    // Kubelet plugin, webhook.
    let installed = cluster.all_ready(2).await;
    println!(
        "vgpu-manager-dra-driver chart, every pod Running and Ready:\n{}",
        Cluster::describe(&installed)
    );
    let slices: Api<ResourceSlice> = Api::all(cluster.client.clone());
    let node_name = cluster.node.node_name().to_owned();
    cluster
        .env
        .poll("the plugin's ResourceSlice", TIMEOUT, || async {
            let list = slices
                .list(&ListParams::default().fields(&format!("spec.nodeName={node_name}")))
                .await
                .ok()?;
            list.items.into_iter().next()
        })
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", cluster.diagnostics()));

    // The README's pod without a scheduler name: the webhook turns its vGPU limits into a claim.
    let pods: Api<Pod> = Api::namespaced(cluster.client.clone(), WORKLOADS);
    let claims: Api<ResourceClaim> = Api::namespaced(cluster.client.clone(), WORKLOADS);
    let created = create_through_webhook(&cluster, &pods, &readme_pod("gpu-pod", &cluster.node, None)).await;
    let claims_of_pod = created.spec.as_ref().and_then(|s| s.resource_claims.clone()).unwrap_or_default();
    println!(
        "gpu-pod as the webhook admitted it: resourceClaims {}",
        serde_json::to_string(&claims_of_pod).unwrap()
    );
    assert!(
        !claims_of_pod.is_empty(),
        "the webhook did not convert the vGPU limits into a claim: {:?}",
        created.spec
    );
    // Without the limiter (our image has none): the kubelet plugin refuses to prepare the claim, saying what
    // is missing; once the runtime files are there, the kubelet's next try (its back-off: about a minute)
    // prepares it and the pod starts.
    let refusal = cluster.refused_for_the_limiter(&pods, "gpu-pod").await;
    println!("gpu-pod refused without libvgpu-control.so: {refusal}");
    cluster.install_limiter_stand_ins();
    let (_, seen) = probe::running(&cluster.env, &cluster.node, &pods, "gpu-pod", "kube-scheduler", TIMEOUT)
        .await
        .unwrap_or_else(|e| panic!("{e:#}\n{}", cluster.diagnostics()));
    println!(
        "gpu-pod Running; its env: {:?}",
        seen.env
            .iter()
            .filter(|(k, _)| k.starts_with("CUDA_")
                || k.starts_with("NVIDIA_")
                || k.starts_with("MANAGER_")
                || k.starts_with("LD_"))
            .collect::<BTreeMap<_, _>>()
    );
    for (key, want) in
        [("CUDA_MEM_LIMIT_0", "1024m"), ("CUDA_CORE_LIMIT_0", "10"), ("MANAGER_VISIBLE_DEVICE_0", "GPU-UP-0")]
    {
        assert_eq!(seen.env.get(key).map(String::as_str), Some(want), "{key} in {:?}", seen.env);
    }
    assert!(seen.device("nvidia0").is_some(), "{:?}", seen.dev);

    cluster.delete_pod(&pods, "gpu-pod").await;
    delete_claims(&cluster, &claims).await;
    cluster.uninstall("dra");
    cluster.no_pods().await;
    cluster.finish();
}

/// Deletes the workloads' claims (the webhook's, one per converted pod) and waits until none is left.
async fn delete_claims(cluster: &Cluster, claims: &Api<ResourceClaim>) {
    for claim in claims.list(&ListParams::default()).await.unwrap().items {
        let _ = claims.delete(claim.metadata.name.as_deref().unwrap_or_default(), &Default::default()).await;
    }
    cluster
        .env
        .poll("the workloads' claims gone", TIMEOUT, || async {
            claims.list(&ListParams::default()).await.ok()?.items.is_empty().then_some(())
        })
        .await
        .unwrap();
}

/// Runs a future to completion from synchronous code on the test's multi-threaded runtime.
fn block_on<F: std::future::Future<Output = String>>(future: F) -> String {
    tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(future))
}
