//! Our charts installed with Helm on the real node (issue #33): the vgpu image (`scripts/build-image.sh`
//! from the binaries this test run uses, written as an OCI archive) imported into the node's containerd, the
//! chart installed with `helm install` against the real API server, its pods created by the real
//! kube-controller-manager, run by the real kubelet and containerd, and reaching the API server as any
//! in-cluster client does: through the `kubernetes` Service, which kube-proxy routes to the host's address.
//! Only the GPU is mocked (`backend: mock`, a host file named by a chart value, and fake device nodes under
//! a temporary driver root).
//!
//! `vgpu-manager-dra-driver`: the DaemonSet's pod (install-files init container, kubelet plugin, device
//! monitor) becomes Ready, the plugin registers with the kubelet and publishes the node's ResourceSlice, a
//! claim pod of the chart's `vgpu-manager` DeviceClass runs with its share's limits; `helm uninstall` then
//! leaves no pod, no plugin socket and no claim CDI spec behind.
//!
//! The image: `$VGPU_E2E_IMAGE_ARCHIVE` when set (an archive naming [`IMAGE`]), else built here with
//! `PREBUILT=<our binaries' folder> OCI_ARCHIVE=<work>/vgpu.oci.tar scripts/build-image.sh` (buildah; about
//! 20 s from debug binaries). Needs the control plane, the real node, Helm and root: `e2e/run.sh real_node_helm`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use k8s_openapi::api::{
    core::v1::Pod,
    resource::v1::{ResourceClaim, ResourceSlice},
};
use kube::{
    Api,
    api::{DeleteParams, ListParams, PostParams},
};
use serde_json::json;
use vgpu_core::abi::runtime_files;
use vgpu_e2e::{
    fixtures, helm, probe,
    real_node::{self, RealNode},
    scheduler_configuration, vgpu_binary,
};

const TIMEOUT: Duration = Duration::from_secs(120);
/// The image the charts run, as the archive names it.
const IMAGE: &str = "localhost/vgpu:e2e";
const ARCHIVE_ENV: &str = "VGPU_E2E_IMAGE_ARCHIVE";
const NAMESPACE: &str = "vgpu-dra";
const WORKLOADS: &str = "default";
const MOCK: &str = "gpus:\n  - { uuid: GPU-HELM-0, name: NVIDIA A30, memoryMiB: 24576, computeCapability: '8.0', minor: 0 }\n";

/// `$VGPU_E2E_IMAGE_ARCHIVE`, or the image built into `work` from the binaries this run uses.
fn image_archive(work: &Path) -> PathBuf {
    if let Some(path) = std::env::var_os(ARCHIVE_ENV).filter(|v| !v.is_empty()) {
        return PathBuf::from(path);
    }
    let bins = vgpu_binary("vgpu-kubelet-plugin").unwrap().parent().unwrap().to_owned();
    let archive = work.join("vgpu.oci.tar");
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let output = Command::new(repo.join("scripts/build-image.sh"))
        .arg(IMAGE)
        .current_dir(&repo)
        .env("PREBUILT", &bins)
        .env("OCI_ARCHIVE", &archive)
        .output()
        .unwrap();
    assert!(
        output.status.success() && archive.is_file(),
        "scripts/build-image.sh failed ({}):\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    archive
}

/// The `--set` arguments that point the DRA chart at the real node's folders, the image and the mock GPU.
fn dra_values(node: &RealNode, host: &probe::GpuHost, mock: &Path) -> Vec<String> {
    let (repository, tag) = IMAGE.rsplit_once(':').unwrap();
    let path = |p: &Path| p.display().to_string();
    [
        ("image.repository", repository.to_owned()),
        ("image.tag", tag.to_owned()),
        ("image.pullPolicy", "Never".to_owned()),
        ("namespace.create", "false".to_owned()),
        ("kubeletPlugin.kubeletRegistrarDirectoryPath", path(&node.plugins_registry_dir())),
        ("kubeletPlugin.kubeletPluginsDirectoryPath", path(&node.plugins_dir())),
        ("kubeletPlugin.cdiRoot", path(&node.cdi_dir())),
        ("kubeletPlugin.hostManagerDir", path(&host.manager_dir)),
        ("kubeletPlugin.nvidiaDriverRoot", path(&host.driver_root)),
        ("kubeletPlugin.mockConfig", path(mock)),
        ("kubeletPlugin.containers.plugin.backend", "mock".to_owned()),
    ]
    .into_iter()
    .flat_map(|(k, v)| ["--set".to_owned(), format!("{k}={v}")])
    .collect()
}

/// Every pod of `namespace`, as `name phase ready` lines, for failure messages.
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the control plane, the real node, Helm and root: run e2e/run.sh"]
async fn real_node_helm_installs_the_dra_chart_and_runs_a_claim_pod() {
    let Some(binaries) = real_node::locate_or_skip().unwrap() else { return };
    let Some(helm_bin) = helm::locate_helm().unwrap() else { return };
    let mut env = real_node::env_builder("real_node_helm_installs_the_dra_chart_and_runs_a_claim_pod")
        .cluster_services()
        .start()
        .await
        .unwrap();
    let mut node = RealNode::builder().binaries(binaries).kube_proxy().start(&env).await.unwrap();
    let client = env.client().await.unwrap();
    // The tests' pods use our scheduler name; the charts' (DaemonSet pods included) kube-scheduler's default.
    let mut scheduler = scheduler_configuration(env.kubeconfig_path(), &[]);
    scheduler["profiles"].as_array_mut().unwrap().push(json!({"schedulerName": "default-scheduler"}));
    env.start_scheduler_with_config(&scheduler).await.unwrap();

    let work = env.workdir().join("helm");
    std::fs::create_dir_all(&work).unwrap();
    let archive = image_archive(&work);
    let imported = node.import_image_archive(&archive).unwrap();
    assert!(imported.iter().any(|i| i == IMAGE), "{IMAGE} not among the imported images {imported:?}");

    let host = probe::GpuHost::create(&work, 1).unwrap();
    // The limiter is vgpu-manager's, not in our image: the test installs stand-ins for its files.
    runtime_files::install(&host.manager_dir, "v1.0.0", b"not a real library: busybox is static").unwrap();
    let mock = work.join("mock.yaml");
    std::fs::write(&mock, MOCK).unwrap();

    let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/vgpu-manager-dra-driver");
    let mut args = vec![
        "dra".to_owned(),
        chart.display().to_string(),
        "--namespace".to_owned(),
        NAMESPACE.to_owned(),
        "--create-namespace".to_owned(),
    ];
    args.extend(dra_values(&node, &host, &mock));
    helm::run(&helm_bin, env.kubeconfig_path(), "install", &args).unwrap();

    // The DaemonSet's pod, created by kube-controller-manager, Ready on the node.
    let plugin_pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let pod = env
        .poll("the chart's kubelet-plugin pod Ready", TIMEOUT, || async {
            plugin_pods.list(&ListParams::default()).await.ok()?.items.into_iter().find(all_ready)
        })
        .await
        .unwrap_or_else(|e| {
            panic!("{e}\n{}\n{}", block_on_text(pod_states(&client, NAMESPACE)), node.log_tails(40))
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
    let (_, seen) = probe::running(&env, &node, &pods, "cuda", "kube-scheduler", TIMEOUT)
        .await
        .unwrap_or_else(|e| panic!("{e:#}\n{}", block_on_text(pod_states(&client, NAMESPACE))));
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
    helm::run(&helm_bin, env.kubeconfig_path(), "upgrade", &upgrade).unwrap();
    let upgraded = env
        .poll("the upgraded kubelet-plugin pod Ready", TIMEOUT, || async {
            let list = plugin_pods.list(&ListParams::default()).await.ok()?.items;
            (list.len() == 1).then_some(())?;
            list.into_iter()
                .find(|p| all_ready(p) && p.metadata.uid.as_deref() != Some(before_upgrade.as_str()))
        })
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", block_on_text(pod_states(&client, NAMESPACE))));
    let gates = serde_json::to_string(&upgraded.spec.as_ref().unwrap().containers[0].env).unwrap();
    assert!(gates.contains("TimeSlicingSettings=true"), "{gates}");
    let cuda_after = pods.get("cuda").await.unwrap();
    assert_eq!(cuda_after.metadata.uid, cuda_before.metadata.uid);
    let restarts = |p: &Pod| {
        p.status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .map(|c| (c[0].restart_count, c[0].container_id.clone()))
    };
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
        &helm_bin,
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
    .unwrap_or_else(|e| panic!("{e}\n{}", block_on_text(pod_states(&client, NAMESPACE))));
    env.poll("the registration socket gone", TIMEOUT, || async { (!registration.exists()).then_some(()) })
        .await
        .unwrap();
    let left: Vec<String> = std::fs::read_dir(node.cdi_dir())
        .map(|d| d.filter_map(|e| Some(e.ok()?.file_name().to_string_lossy().into_owned())).collect())
        .unwrap_or_default();
    assert!(left.iter().all(|f| !f.contains("claim_")), "claim CDI specs left: {left:?}");
    // kube-proxy's chains included, the node leaves nothing on the host.
    node.stop().unwrap();
    env.finish();
}

/// Runs a future to completion from a synchronous panic message (the test's runtime is multi-threaded).
fn block_on_text<F: std::future::Future<Output = String>>(future: F) -> String {
    tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(future))
}
