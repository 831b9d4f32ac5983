//! The GPU module's `vfio-switch-<NODE_NAME>-<PCI>` Job on the real node (issue #34 item 3): the NVIDIA
//! adapter's switch controller ([`vgpu_dra::vfio_switch::controller`], run in this process against the real
//! API server) sees a PhysicalGPU of the node with `spec.passthrough: true` on `nvidia`, creates the Job,
//! the real kube-controller-manager makes its pod, the real kubelet and containerd run `vgpu-node-agent
//! vfio-switch` in it (privileged, `nodeName` the node), against a fake sysfs tree mounted in from the host,
//! and a [`PollingKernel`] in this process acts on the bind files the container writes as the kernel would.
//! The PhysicalGPU's condition `VfioSwitch` goes `Switching` → `SwitchedToVfioPci`, the GPU is on
//! `vfio-pci` in the tree (`driver_override` set, `drivers_probe` written) and the finished Job is deleted.
//! A second PhysicalGPU whose address is not in the tree gets a failed Job and `SwitchFailed`, with the
//! container's own message (`no such PCI device`). The controller's resync is longer than the test's
//! timeout, so every step is driven by its watches of the Jobs and PhysicalGPUs.
//!
//! The image is the node's busybox: the Job mounts the workspace's `vgpu-node-agent` (a debug build, linked
//! against glibc) and the host's glibc folders read-only at their own paths, and the fake tree at its own
//! path (its links are absolute). Needs the control plane, the real node and root:
//! `e2e/run.sh real_node_vfio_switch`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{path::PathBuf, time::Duration};

use k8s_openapi::{
    api::batch::v1::Job, apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube::{
    Api,
    api::{DeleteParams, ListParams, Patch, PatchParams, PostParams},
};
use serde_json::json;
use vgpu_api::{ConditionStatus, PhysicalGPU, PhysicalGPUSpec};
use vgpu_dra::{
    vfio::{
        SysfsRoots,
        fake::{FakeSysfs, PollingKernel},
    },
    vfio_switch::controller::{
        CONDITION, KubeSwitchCluster, REASON_SWITCH_FAILED, REASON_SWITCHED_TO_VFIO_PCI, SwitchConfig,
        SwitchController,
    },
};
use vgpu_e2e::{
    real_node::{self, RealNode},
    vgpu_binary,
};

const TIMEOUT: Duration = Duration::from_secs(90);
const NAMESPACE: &str = "default";
const BUS: &str = "0000:3b:00.0";
/// An address with no device in the fake tree: its Job fails.
const MISSING: &str = "0000:86:00.0";
/// The host's dynamic loader and C library folders, mounted into the Job for the glibc-linked binary.
const GLIBC: [&str; 2] = ["/lib64", "/lib/x86_64-linux-gnu"];

fn gpu(node: &str, name: &str, pci: &str) -> PhysicalGPU {
    PhysicalGPU::new(
        name,
        PhysicalGPUSpec {
            node_name: node.to_owned(),
            index: 0,
            pci_address: pci.to_owned(),
            vendor: "nvidia".into(),
            vendor_id: "10de".into(),
            vendor_name: "NVIDIA Corporation".into(),
            device_id: "2330".into(),
            device_name: "GH100 [H100 SXM5 80GB]".into(),
            model: "h100-sxm5-80gb".into(),
            subsystem: None,
            class_code: "030200".into(),
            numa_node: None,
            iommu_group: Some(7),
            passthrough: Some(true),
        },
    )
}

/// The `VfioSwitch` condition of PhysicalGPU `name` as (status, reason, message).
async fn condition(gpus: &Api<PhysicalGPU>, name: &str) -> Option<(ConditionStatus, String, String)> {
    let gpu = gpus.get(name).await.ok()?;
    let c = gpu.status?.conditions.into_iter().find(|c| c.type_ == CONDITION)?;
    Some((c.status, c.reason.unwrap_or_default(), c.message.unwrap_or_default()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the control plane, the real node and root: run e2e/run.sh"]
async fn real_node_vfio_switch_job_binds_a_gpu_to_vfio_pci() {
    if let Some(missing) = GLIBC.iter().find(|p| !std::path::Path::new(p).exists()) {
        eprintln!("SKIPPED: {missing} does not exist on this host (the Job mounts the host's glibc)");
        return;
    }
    let Some(binaries) = real_node::locate_or_skip().unwrap() else { return };
    let env = real_node::env_builder("real_node_vfio_switch_job_binds_a_gpu_to_vfio_pci")
        .cluster_services()
        .start()
        .await
        .unwrap();
    let mut node = RealNode::builder().binaries(binaries).start(&env).await.unwrap();
    let client = env.client().await.unwrap();

    // The PhysicalGPU CRD, as the chart installs it.
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in vgpu_api::crds(vgpu_api::DEFAULT_GROUP).unwrap() {
        crds.create(&PostParams::default(), &crd).await.unwrap();
    }
    let gpus: Api<PhysicalGPU> = Api::all(client.clone());
    env.poll("PhysicalGPU API served", TIMEOUT, || {
        let gpus = gpus.clone();
        async move { gpus.list(&ListParams::default()).await.ok().map(drop) }
    })
    .await
    .unwrap();

    // The fake sysfs: one H100 on nvidia, vfio-pci registered; the kernel stand-in polls its bind files.
    let sys_root = env.workdir().join("host");
    let roots = SysfsRoots::under(&sys_root);
    let tree = FakeSysfs::new(&roots);
    tree.add_gpu(BUS, 0x2330, "7", Some("nvidia")).unwrap();
    tree.add_driver("vfio-pci").unwrap();
    let kernel = PollingKernel::start(&roots, Duration::from_millis(20)).unwrap();

    let node_name = node.node_name().to_owned();
    for (name, pci) in [("gpu-a", BUS), ("gpu-missing", MISSING)] {
        gpus.create(&PostParams::default(), &gpu(&node_name, name, pci)).await.unwrap();
        let status = json!({"apiVersion": "gpu.deckhouse.io/v1alpha1", "kind": "PhysicalGPU",
            "status": {"driver": "nvidia"}});
        gpus.patch_status(name, &PatchParams::apply("vgpu-node-agent").force(), &Patch::Apply(&status))
            .await
            .unwrap();
    }

    // The adapter's controller, its Jobs in the node's busybox with our binary mounted in.
    // A hostPath must be absolute and free of `..` (the API server refuses it): the path cargo gives may hold `e2e/../target`.
    let binary = vgpu_binary("vgpu-node-agent").unwrap().canonicalize().unwrap();
    let mut config = SwitchConfig::new(&node_name, NAMESPACE, node.busybox_image());
    config.image_pull_policy = "Never".into();
    config.binary = binary.display().to_string();
    config.host_sys.clone_from(&roots.sys);
    config.container_sys.clone_from(&roots.sys);
    config.mount_host_root = false;
    config.extra_host_paths =
        std::iter::once(binary.clone()).chain(GLIBC.iter().map(PathBuf::from)).collect();
    // Only the watches of the Jobs and PhysicalGPUs can drive the controller within TIMEOUT.
    config.resync = Duration::from_secs(600);
    let stop = tokio_util::sync::CancellationToken::new();
    let controller =
        SwitchController::new(std::sync::Arc::new(KubeSwitchCluster::new(client.clone())), config)
            .spawn(stop.clone().cancelled_owned());

    let started = std::time::Instant::now();
    let jobs: Api<Job> = Api::namespaced(client.clone(), NAMESPACE);
    let job_name = format!("vfio-switch-{node_name}-0000-3b-00-0");
    let (status, _, message) = env
        .poll("VfioSwitch Switching", TIMEOUT, || async {
            condition(&gpus, "gpu-a").await.filter(|c| c.1 == "Switching")
        })
        .await
        .unwrap();
    assert_eq!(status, ConditionStatus::Unknown);
    assert!(message.contains(&job_name) && message.contains("from nvidia to vfio-pci"), "{message}");
    let done = env
        .poll("VfioSwitch SwitchedToVfioPci", TIMEOUT, || async {
            condition(&gpus, "gpu-a").await.filter(|c| c.1 == REASON_SWITCHED_TO_VFIO_PCI)
        })
        .await
        .unwrap_or_else(|e| panic!("{e}\nkernel errors: {:?}\n{}", kernel.errors(), node.log_tails(40)));
    eprintln!("switched in {:?}", started.elapsed());
    assert_eq!(done.0, ConditionStatus::True);
    assert_eq!(tree.driver(BUS), "vfio-pci");
    assert_eq!(tree.driver_override(BUS), "vfio-pci");
    let acted: Vec<String> = kernel.writes().into_iter().map(|(path, _)| path).collect();
    assert_eq!(acted, ["bus/pci/drivers/nvidia/unbind", "bus/pci/drivers_probe"]);
    assert!(kernel.errors().is_empty(), "{:?}", kernel.errors());
    env.poll("the finished Job deleted", TIMEOUT, || async {
        jobs.get_opt(&job_name).await.ok()?.is_none().then_some(())
    })
    .await
    .unwrap();

    // The GPU the tree does not have: the Job fails and says why, and it is kept (no retry loop).
    let failed = env
        .poll("VfioSwitch SwitchFailed", TIMEOUT, || async {
            condition(&gpus, "gpu-missing").await.filter(|c| c.1 == REASON_SWITCH_FAILED)
        })
        .await
        .unwrap();
    assert_eq!(failed.0, ConditionStatus::False);
    assert!(failed.2.contains("no such PCI device"), "{}", failed.2);
    let missing_job = format!("vfio-switch-{node_name}-0000-86-00-0");
    assert!(jobs.get_opt(&missing_job).await.unwrap().is_some(), "a failed Job is kept");

    stop.cancel();
    controller.await.unwrap();
    let background = DeleteParams::background();
    jobs.delete(&missing_job, &background).await.unwrap();
    drop(kernel);
    node.stop().unwrap();
    env.finish();
}
