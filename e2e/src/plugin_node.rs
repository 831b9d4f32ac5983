//! A vGPU node served by our real `vgpu-device-plugin --backend mock` ([`MockPluginNode`]), and our
//! extender under the real kube-scheduler ([`start_vgpu_scheduling`]): the common start of every
//! device-plugin scenario.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::PostParams;
use tonic::transport::Channel;
use vgpu_core::codec::{node_devices, pod_devices};
use vgpu_core::domain::ResourceDomain;
use vgpu_core::model::NodeDeviceInventory;
use vgpu_kubelet::api::v1beta1::{
    AllocateRequest, AllocateResponse, ContainerAllocateRequest, Device, Empty, ListAndWatchResponse,
    RegisterRequest, device_plugin_client::DevicePluginClient,
};

use crate::env::TestEnv;
use crate::fixtures::{NODE_DEVICE_REGISTER, VGPU_NUMBER, set_node_capacity};
use crate::kubelet::TestKubelet;
use crate::scheduler::ExtenderConfig;
use crate::vgpu::{free_port, vgpu_binary, wait_ready};

/// The device plugin's process name (and binary).
pub const DEVICE_PLUGIN: &str = "vgpu-device-plugin";
/// The scheduler extender's process name (and binary).
pub const EXTENDER: &str = "vgpu-scheduler-extender";
/// How long the plugin gets to register and to publish the node.
const PLUGIN_START_TIMEOUT: Duration = Duration::from_secs(60);

/// The mock backend's description used by the scenarios: four PCIe L40S, GPU 3 marked unhealthy (an ECC
/// event).
pub fn mock_description() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/mock/pcie-l40s-4gpu.yaml")
}

/// A Node object, the test kubelet and the device plugin with the mock backend, after the kubelet's part
/// of the start: the plugin registered `<domain>/vgpu-number`, published its node annotations, answered
/// the first `ListAndWatch`, and the healthy devices are advertised on the Node status.
#[derive(Debug)]
pub struct MockPluginNode {
    /// The node's name.
    pub name: String,
    /// The test kubelet (`<workdir>/device-plugins`).
    pub kubelet: TestKubelet,
    /// `--manager-dir` (and `--host-manager-dir`): `<workdir>/manager`.
    pub manager_dir: PathBuf,
    /// The vGPU-number plugin's `Register` request.
    pub registration: RegisterRequest,
    /// A client on the vGPU-number plugin's endpoint.
    pub plugin: DevicePluginClient<Channel>,
    /// The devices of the first `ListAndWatch` answer.
    pub devices: Vec<Device>,
    /// The rest of the `ListAndWatch` stream (kept open, as the kubelet does).
    pub updates: tonic::Streaming<ListAndWatchResponse>,
    /// The `node-device-register` annotation as first read.
    pub device_register: String,
    /// That annotation decoded.
    pub inventory: NodeDeviceInventory,
}

impl MockPluginNode {
    /// Creates the Node `name`, starts the test kubelet and [`DEVICE_PLUGIN`] (`--backend=mock` with
    /// [`mock_description`], `--device-split-count=<split>`, a 2 s publish interval, the manager and kubelet
    /// folders in the environment, then `extra_args`), and advertises the healthy devices: `vgpu-number`
    /// = healthy device IDs, `vgpu-cores` and `vgpu-memory` of the schedulable GPUs.
    pub async fn start(env: &mut TestEnv, name: &str, split: u32, extra_args: &[String]) -> Result<Self> {
        let client = env.client().await?;
        let nodes: Api<Node> = Api::all(client.clone());
        let node = Node {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                labels: Some(BTreeMap::from([("kubernetes.io/hostname".to_owned(), name.to_owned())])),
                ..ObjectMeta::default()
            },
            ..Node::default()
        };
        nodes.create(&PostParams::default(), &node).await.context("creating the node")?;

        let mut kubelet = TestKubelet::start(env.workdir().join("device-plugins"))?;
        let manager_dir = env.workdir().join("manager");
        std::fs::create_dir_all(&manager_dir)?;
        // The vGPU runtime files an install step puts on the host (Allocate refuses containers without them).
        vgpu_core::abi::runtime_files::install(&manager_dir, "v1.0.0", b"")?;
        let mut args = vec![
            "--backend=mock".to_owned(),
            format!("--mock-config={}", mock_description().display()),
            format!("--node-name={name}"),
            format!("--kubeconfig={}", env.kubeconfig_path().display()),
            format!("--device-plugin-path={}", kubelet.dir().display()),
            format!("--manager-dir={}", manager_dir.display()),
            format!("--host-manager-dir={}", manager_dir.display()),
            format!("--kubelet-root={}", env.workdir().display()),
            format!("--pod-resources-socket={}", env.workdir().join("no-pod-resources.sock").display()),
            format!("--device-split-count={split}"),
            "--node-publish-interval=2".to_owned(),
        ];
        args.extend_from_slice(extra_args);
        env.start_process(
            DEVICE_PLUGIN,
            &vgpu_binary(DEVICE_PLUGIN)?,
            &args,
            &[("RUST_LOG".into(), "info".into())],
        )?;

        let registration = match kubelet.registration(VGPU_NUMBER, PLUGIN_START_TIMEOUT).await {
            Ok(r) => r,
            Err(e) => bail!("{e}\n{DEVICE_PLUGIN} log:\n{}", env.log_tail(DEVICE_PLUGIN, 30)),
        };
        let device_register = env
            .poll("the node-device-register annotation", PLUGIN_START_TIMEOUT, || async {
                nodes.get(name).await.ok()?.metadata.annotations?.get(NODE_DEVICE_REGISTER).cloned()
            })
            .await?;
        let inventory = node_devices::decode(&device_register)?;

        let mut plugin = kubelet.connect(&registration.endpoint).await?;
        let mut updates = plugin.list_and_watch(Empty {}).await?.into_inner();
        let devices = updates.message().await?.context("ListAndWatch ended before its first answer")?.devices;
        let healthy = devices.iter().filter(|d| d.health == "Healthy").count();
        let schedulable = inventory.devices.iter().filter(|d| d.is_schedulable());
        let (cores, memory) = schedulable.fold((0, 0), |(c, m), d| (c + d.cores, m + d.memory_mib));
        set_node_capacity(&client, name, u64::try_from(healthy)?, cores, memory).await?;

        Ok(Self {
            name: name.to_owned(),
            kubelet,
            manager_dir,
            registration,
            plugin,
            devices,
            updates,
            device_register,
            inventory,
        })
    }

    /// Admits `pod`'s first container as the kubelet would: `Allocate` with one device ID of the GPU our
    /// extender pre-allocated to it (the `<domain>/pre-allocated` annotation).
    pub async fn allocate_pre_allocated(&mut self, pod: &Pod) -> Result<AllocateResponse> {
        let annotations = pod.metadata.annotations.clone().unwrap_or_default();
        let Some(pre) = annotations.get(&ResourceDomain::default().pre_allocated()) else {
            bail!("pod {:?} has no pre-allocated annotation: {annotations:?}", pod.metadata.name);
        };
        let claim = pod_devices::decode_pre_allocated(pre)?;
        let uuid = &claim
            .containers
            .first()
            .and_then(|c| c.devices.first())
            .with_context(|| format!("no device in the pre-allocation {pre}"))?
            .uuid;
        let prefix = format!("{uuid}::");
        let id = self
            .devices
            .iter()
            .map(|d| d.id.clone())
            .find(|id| id.starts_with(&prefix))
            .with_context(|| format!("no device ID of GPU {uuid} in ListAndWatch"))?;
        let request =
            AllocateRequest { container_requests: vec![ContainerAllocateRequest { devices_ids: vec![id] }] };
        Ok(self.plugin.allocate(request).await?.into_inner())
    }
}

/// Starts [`EXTENDER`] on a free port and kube-scheduler calling it ([`ExtenderConfig::vgpu`]); returns the
/// extender's configuration, to start the scheduler again after stopping it.
pub async fn start_vgpu_scheduling(env: &mut TestEnv) -> Result<ExtenderConfig> {
    let port = free_port()?;
    let args = vec![
        format!("--kubeconfig={}", env.kubeconfig_path().display()),
        format!("--server-bind-port={port}"),
    ];
    env.start_process(EXTENDER, &vgpu_binary(EXTENDER)?, &args, &[])?;
    if let Err(e) = wait_ready(port, Duration::from_secs(60)).await {
        bail!("{e}\n{EXTENDER} log:\n{}", env.log_tail(EXTENDER, 30));
    }
    let extender = ExtenderConfig::vgpu(format!("http://127.0.0.1:{port}/scheduler"));
    env.start_scheduler(&extender).await?;
    Ok(extender)
}

/// The scheduling scenario the `vgpuctl` tests read back: `nodes` vGPU nodes (`gpu-node-<n>`, `gpus` GPUs split
/// `split` ways), our extender under kube-scheduler ([`start_vgpu_scheduling`]), and `pods` vGPU pods
/// `default/pod-<i>` of 1–2 GPUs (25, 10 or 50 % cores, 2 GiB), each waited for until bound.
pub async fn schedule_mixed_vgpu_pods(
    env: &mut TestEnv,
    nodes: u32,
    gpus: u32,
    split: u32,
    pods: usize,
) -> Result<()> {
    let client = env.client().await?;
    for n in 0..nodes {
        crate::fixtures::create_vgpu_node(&client, &format!("gpu-node-{n}"), gpus, split).await?;
    }
    start_vgpu_scheduling(env).await?;
    let api: Api<Pod> = Api::namespaced(client.clone(), "default");
    for i in 0..pods {
        let limits = [
            (VGPU_NUMBER, [1, 2, 1][i % 3]),
            (crate::fixtures::VGPU_CORES, [25, 10, 50][i % 3]),
            (crate::fixtures::VGPU_MEMORY, 2048),
        ];
        let pod = crate::fixtures::vgpu_pod_with("default", &format!("pod-{i:02}"), &limits, &[]);
        api.create(&PostParams::default(), &pod).await?;
    }
    for i in 0..pods {
        crate::fixtures::wait_for_pod_node(
            &client,
            "default",
            &format!("pod-{i:02}"),
            Duration::from_secs(120),
        )
        .await
        .with_context(|| env.log_tail("kube-scheduler", 30))?;
    }
    Ok(())
}

/// `namespace/name` → (resourceVersion, node, `nvidia.com/pre-allocated`) of every pod `pods` lists.
pub async fn pod_state(
    pods: &Api<Pod>,
) -> Result<BTreeMap<String, (String, Option<String>, Option<String>)>> {
    let list = pods.list(&kube::api::ListParams::default()).await?;
    Ok(list
        .items
        .into_iter()
        .map(|p| {
            let namespace = p.metadata.namespace.clone().unwrap_or_default();
            let key = format!("{namespace}/{}", p.metadata.name.clone().unwrap_or_default());
            let node = p.spec.as_ref().and_then(|s| s.node_name.clone());
            let pre =
                p.metadata.annotations.as_ref().and_then(|a| a.get("nvidia.com/pre-allocated").cloned());
            (key, (p.metadata.resource_version.clone().unwrap_or_default(), node, pre))
        })
        .collect())
}

/// Runs `vgpuctl <args> --kubeconfig=<the environment's>`; its stdout, or an error with its stderr.
pub fn vgpuctl(env: &TestEnv, args: &[&str]) -> Result<String> {
    let out = std::process::Command::new(vgpu_binary("vgpuctl")?)
        .args(args)
        .arg(format!("--kubeconfig={}", env.kubeconfig_path().display()))
        .output()
        .context("running vgpuctl")?;
    let stdout = String::from_utf8(out.stdout).context("vgpuctl's output is not UTF-8")?;
    if !out.status.success() {
        bail!("vgpuctl {args:?}: {}\n{stdout}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(stdout)
}
