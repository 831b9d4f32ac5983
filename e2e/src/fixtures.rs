//! Objects the vgpu e2e tests share: a vGPU node as the device plugin would publish it, a pod
//! requesting vGPUs, and waiting for a pod to be bound.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Result, bail};
use k8s_openapi::api::core::v1::{Container, Node, Pod, PodSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::scheduler::SCHEDULER_NAME;

/// Node annotation with the JSON device list (`DeviceInfo` array) written by the device plugin.
pub const NODE_DEVICE_REGISTER: &str = "nvidia.com/node-device-register";
/// Node annotation with the node configuration.
pub const NODE_CONFIG_INFO: &str = "nvidia.com/node-config-info";
/// vGPU count resource.
pub const VGPU_NUMBER: &str = "nvidia.com/vgpu-number";
/// vGPU cores resource (percent of a GPU).
pub const VGPU_CORES: &str = "nvidia.com/vgpu-cores";
/// vGPU memory resource (MiB with memory factor 1).
pub const VGPU_MEMORY: &str = "nvidia.com/vgpu-memory";

/// Memory of each fake GPU, in MiB.
pub const FAKE_GPU_MEMORY_MIB: u64 = 16_384;

/// The `nvidia.com/node-device-register` value for `gpus` healthy fake GPUs, each split
/// `split` ways (ids `0..gpus`, sorted, as the contract requires).
pub fn device_register(gpus: u32, split: u32) -> Value {
    (0..gpus)
        .map(|id| {
            json!({
                "id": id,
                "type": "NVIDIA E2E Fake GPU",
                "uuid": fake_gpu_uuid(id),
                "core": 100,
                "memory": FAKE_GPU_MEMORY_MIB,
                "number": split,
                "numa": 0,
                "mig": false,
                "busId": format!("0000:{:02x}:00.0", id + 1),
                "capability": 8.0,
                "healthy": true,
            })
        })
        .collect()
}

/// Creates a node named `name` carrying `gpus` fake GPUs split `split` ways: the
/// device-register and node-config annotations on the object, and capacity/allocatable
/// (`nvidia.com/vgpu-number = gpus * split`, cores, memory, plus cpu/memory/pods) through
/// the `status` subresource. Returns the node as read back after the status update.
pub async fn create_vgpu_node(client: &kube::Client, name: &str, gpus: u32, split: u32) -> Result<Node> {
    let nodes: Api<Node> = Api::all(client.clone());
    let node = Node {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(BTreeMap::from([
                ("kubernetes.io/hostname".to_owned(), name.to_owned()),
                ("vgpu-manager".to_owned(), "device-plugin".to_owned()),
            ])),
            annotations: Some(BTreeMap::from([
                (NODE_DEVICE_REGISTER.to_owned(), device_register(gpus, split).to_string()),
                (
                    NODE_CONFIG_INFO.to_owned(),
                    json!({"deviceSplit": split, "coresScaling": 1, "memoryFactor": 1, "memoryScaling": 1})
                        .to_string(),
                ),
            ])),
            ..ObjectMeta::default()
        },
        ..Node::default()
    };
    nodes.create(&PostParams::default(), &node).await?;
    let gpus = u64::from(gpus);
    set_node_capacity(client, name, gpus * u64::from(split), gpus * 100, gpus * FAKE_GPU_MEMORY_MIB).await
}

/// Does the kubelet's part of advertising a node: capacity and allocatable (`nvidia.com/vgpu-number`,
/// `vgpu-cores` and `vgpu-memory` as given, plus 32 cpu, 128Gi memory, 110 pods) and a `Ready` condition,
/// through the `status` subresource. Returns the node as read back after the update.
pub async fn set_node_capacity(
    client: &kube::Client,
    name: &str,
    vgpu_number: u64,
    vgpu_cores: u64,
    vgpu_memory: u64,
) -> Result<Node> {
    let nodes: Api<Node> = Api::all(client.clone());
    let resources = json!({
        "cpu": "32",
        "memory": "128Gi",
        "pods": "110",
        VGPU_NUMBER: vgpu_number.to_string(),
        VGPU_CORES: vgpu_cores.to_string(),
        VGPU_MEMORY: vgpu_memory.to_string(),
    });
    let status = json!({
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [{
                "type": "Ready",
                "status": "True",
                "reason": "KubeletReady",
                "message": "fake node of the vgpu e2e tests",
            }],
        }
    });
    Ok(nodes.patch_status(name, &PatchParams::default(), &Patch::Merge(&status)).await?)
}

/// A pod in `namespace` for [`SCHEDULER_NAME`] whose one container limits
/// `nvidia.com/vgpu-number` to `vgpus`. Its image is never pulled (there is no kubelet).
pub fn vgpu_pod(namespace: &str, name: &str, vgpus: u32) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(namespace.to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            scheduler_name: Some(SCHEDULER_NAME.to_owned()),
            containers: vec![Container {
                name: "main".to_owned(),
                image: Some("registry.invalid/vgpu-e2e/pause:none".to_owned()),
                resources: Some(ResourceRequirements {
                    limits: Some(BTreeMap::from([(VGPU_NUMBER.to_owned(), Quantity(vgpus.to_string()))])),
                    ..ResourceRequirements::default()
                }),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
        ..Pod::default()
    }
}

/// A pod like [`vgpu_pod`] whose container limits are `limits` (resource name → quantity) and whose
/// annotations are `annotations` (e.g. scheduling policies).
pub fn vgpu_pod_with(
    namespace: &str,
    name: &str,
    limits: &[(&str, u64)],
    annotations: &[(&str, &str)],
) -> Pod {
    let mut pod = vgpu_pod(namespace, name, 0);
    if let Some(c) = pod.spec.as_mut().and_then(|s| s.containers.first_mut()) {
        c.resources = Some(ResourceRequirements {
            limits: Some(limits.iter().map(|(k, v)| ((*k).to_owned(), Quantity(v.to_string()))).collect()),
            ..ResourceRequirements::default()
        });
    }
    if !annotations.is_empty() {
        pod.metadata.annotations =
            Some(annotations.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect());
    }
    pod
}

/// The UUID [`device_register`] gives GPU `id`.
pub fn fake_gpu_uuid(id: u32) -> String {
    format!("GPU-e2e00000-0000-0000-0000-{id:012}")
}

/// Polls until the pod has `spec.nodeName` and returns it; fails after `timeout`.
pub async fn wait_for_pod_node(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    timeout: Duration,
) -> Result<String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let deadline = Instant::now() + timeout;
    loop {
        let pod = pods.get(name).await?;
        if let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) {
            return Ok(node);
        }
        if Instant::now() >= deadline {
            let conditions = pod
                .status
                .and_then(|s| s.conditions)
                .map(|c| serde_json::to_string(&c).unwrap_or_default())
                .unwrap_or_default();
            bail!("pod {namespace}/{name} not bound after {timeout:?}; conditions: {conditions}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The node a DRA driver publishes for (the kubelet's part: `kubernetes.io/hostname` label, Ready, zero
/// capacity) and the DeviceClasses of `deploy/dra/deviceclasses.yaml`, created through the API. Returns the
/// created Node and the classes.
pub async fn create_dra_node_and_classes(
    client: &kube::Client,
    node: &str,
) -> Result<(Node, Vec<k8s_openapi::api::resource::v1::DeviceClass>)> {
    use anyhow::Context as _;
    let nodes: Api<Node> = Api::all(client.clone());
    let object = Node {
        metadata: ObjectMeta {
            name: Some(node.into()),
            labels: Some(BTreeMap::from([("kubernetes.io/hostname".to_owned(), node.to_owned())])),
            ..ObjectMeta::default()
        },
        ..Node::default()
    };
    let created = nodes
        .create(&PostParams::default(), &object)
        .await
        .with_context(|| format!("creating node {node}"))?;
    set_node_capacity(client, node, 0, 0, 0).await?;
    let classes = create_dra_device_classes(client).await?;
    Ok((created, classes))
}

/// A ResourceClaim of one device of `class` asking `capacity` (e.g. `{"requests": {"cores": "10"}}`).
pub fn dra_claim(
    namespace: &str,
    name: &str,
    class: &str,
    capacity: &Value,
) -> Result<k8s_openapi::api::resource::v1::ResourceClaim> {
    let claim = json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": { "name": name, "namespace": namespace },
        "spec": { "devices": { "requests": [{
            "name": "vgpu",
            "exactly": {
                "deviceClassName": class,
                "allocationMode": "ExactCount",
                "count": 1,
                "capacity": capacity,
            },
        }] } },
    });
    Ok(serde_json::from_value(claim)?)
}

/// A pod for our scheduler whose one container uses the ResourceClaim `claim` (as `gpu`).
pub fn dra_pod(namespace: &str, name: &str, claim: &str) -> Result<Pod> {
    let pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": name, "namespace": namespace },
        "spec": {
            "schedulerName": crate::SCHEDULER_NAME,
            "containers": [{ "name": "cuda", "image": "example.invalid/cuda:never-pulled",
                             "resources": { "claims": [{ "name": "gpu" }] } }],
            "resourceClaims": [{ "name": "gpu", "resourceClaimName": claim }],
        },
    });
    Ok(serde_json::from_value(pod)?)
}

/// Applies the DeviceClasses of `deploy/dra/deviceclasses.yaml` and returns them.
pub async fn create_dra_device_classes(
    client: &kube::Client,
) -> Result<Vec<k8s_openapi::api::resource::v1::DeviceClass>> {
    use anyhow::Context as _;
    use k8s_openapi::api::resource::v1::DeviceClass;
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/dra/deviceclasses.yaml");
    let manifest = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
    let classes: Vec<DeviceClass> =
        serde_saphyr::from_multiple(&manifest).with_context(|| format!("parsing {path}"))?;
    let class_api: Api<DeviceClass> = Api::all(client.clone());
    for class in &classes {
        class_api.create(&PostParams::default(), class).await.context("creating a DeviceClass")?;
    }
    Ok(classes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_register_follows_the_contract() {
        let reg = device_register(2, 10);
        let list = reg.as_array().unwrap();
        assert_eq!(list.len(), 2);
        assert_eq!(list[1]["id"], 1);
        assert_eq!(list[1]["number"], 10);
        assert_eq!(list[1]["healthy"], true);
        assert_eq!(list[0]["busId"], "0000:01:00.0");
    }

    #[test]
    fn vgpu_pod_uses_the_vgpu_scheduler() {
        let pod = vgpu_pod("default", "p", 1);
        let spec = pod.spec.unwrap();
        assert_eq!(spec.scheduler_name.as_deref(), Some(SCHEDULER_NAME));
        let limits = spec.containers[0].resources.clone().unwrap().limits.unwrap();
        assert_eq!(limits[VGPU_NUMBER], Quantity("1".into()));
    }
}
