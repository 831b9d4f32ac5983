//! Building cluster objects the way the device plugin publishes them (tests, the simulator, benches).

use serde_json::json;
use vgpu_core::alloc::{PodContainer, PodSpec};
use vgpu_core::backend::LinkMatrix;
use vgpu_core::codec::{CodecError, node_config_info, node_devices};
use vgpu_core::domain::ResourceDomain;
use vgpu_core::model::{NodeDeviceInventory, NodeVgpuConfig};
use vgpu_core::topology::{DeviceTopology, GpuLinks, P2PLinkType};

use std::sync::Arc;

use crate::cluster::{MemoryCluster, Node, Pod};
use crate::extender::{Extender, ExtenderConfig};
use vgpu_core::clock::ManualClock;

/// The `node-device-topology` value of a backend's link matrix (unknown codes are skipped).
pub fn topology_of(matrix: &LinkMatrix) -> DeviceTopology {
    let gpus = matrix
        .rows()
        .iter()
        .enumerate()
        .map(|(i, row)| GpuLinks {
            index: i,
            links: row
                .iter()
                .enumerate()
                .filter(|(j, l)| *j != i && !l.is_empty())
                .map(|(j, l)| {
                    (j, l.iter().filter_map(|&c| P2PLinkType::from_code(i64::from(c)).ok()).collect())
                })
                .collect(),
        })
        .collect();
    DeviceTopology { gpus }
}

/// A vGPU-enabled node: allocatable `vgpu-number`, `node-device-register`, `node-config-info` and, when given,
/// `node-device-topology`.
pub fn vgpu_node(
    name: &str,
    inventory: &NodeDeviceInventory,
    config: &NodeVgpuConfig,
    topology: Option<&DeviceTopology>,
    domain: &ResourceDomain,
) -> Result<Node, CodecError> {
    let mut node = Node { name: name.to_owned(), ..Node::default() };
    let slots: u64 = inventory.schedulable().map(|d| u64::from(d.split_count)).sum();
    node.allocatable.insert(domain.vgpu_number(), slots);
    node.annotations.insert(domain.node_device_register(), node_devices::encode(inventory)?);
    node.annotations.insert(domain.node_config_info(), node_config_info::encode(config)?);
    if let Some(t) = topology {
        node.annotations.insert(domain.node_device_topology(), t.encode());
    }
    Ok(node)
}

/// A pending pod with one app container asking for `number` vGPUs with `cores` and `memory` each, plus
/// annotations.
pub fn vgpu_pod(
    uid: &str,
    number: u32,
    cores: u32,
    memory: u64,
    annotations: &[(String, String)],
    domain: &ResourceDomain,
) -> Pod {
    let mut c = PodContainer::app("main").limit(domain.vgpu_number(), number);
    if cores > 0 {
        c = c.limit(domain.vgpu_cores(), cores);
    }
    if memory > 0 {
        c = c.limit(domain.vgpu_memory(), memory);
    }
    Pod {
        uid: uid.to_owned(),
        namespace: "default".to_owned(),
        name: format!("pod-{uid}"),
        annotations: annotations.iter().cloned().collect(),
        spec: PodSpec::new().container(c),
        ..Pod::default()
    }
}

/// A Deployment's vGPU pod as the API server serves it, with `probe`'s name, namespace, UID, annotations and
/// vGPU limits: labels, an owner, three `managedFields` entries, a projected service-account volume, env,
/// probes, tolerations and a pending status: what kube-scheduler sends in a filter call's `Pod` (benches and
/// allocation tests of the decoding).
pub fn api_server_pod_json(probe: &Pod, d: &ResourceDomain) -> serde_json::Value {
    let managed = |manager: &str, op: &str, fields: serde_json::Value| {
        json!({"manager": manager, "operation": op, "apiVersion": "v1", "time": "2026-12-06T10:00:00Z",
               "fieldsType": "FieldsV1", "fieldsV1": fields})
    };
    json!({
        "kind": "Pod", "apiVersion": "v1",
        "metadata": {
            "name": probe.name, "namespace": probe.namespace, "uid": probe.uid,
            "generateName": "train-7d9f8c6b5-", "resourceVersion": "1204417",
            "creationTimestamp": "2026-12-06T10:00:00Z",
            "labels": {"app": "train", "pod-template-hash": "7d9f8c6b5", "team": "ml-platform"},
            "annotations": probe.annotations,
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "train-7d9f8c6b5",
                "uid": "0b8e2b9c-3f0e-4f43-9d1f-9a8d3c2e1f00", "controller": true, "blockOwnerDeletion": true}],
            "managedFields": [
                managed("kube-controller-manager", "Update", json!({"f:metadata": {"f:generateName": {},
                    "f:labels": {".": {}, "f:app": {}, "f:pod-template-hash": {}, "f:team": {}},
                    "f:ownerReferences": {".": {}, "k:{\"uid\":\"0b8e2b9c\"}": {}}},
                    "f:spec": {"f:containers": {"k:{\"name\":\"main\"}": {".": {}, "f:command": {}, "f:env": {},
                        "f:image": {}, "f:imagePullPolicy": {}, "f:name": {}, "f:resources": {".": {},
                        "f:limits": {}, "f:requests": {}}, "f:terminationMessagePath": {}}},
                        "f:dnsPolicy": {}, "f:enableServiceLinks": {}, "f:restartPolicy": {},
                        "f:schedulerName": {}, "f:securityContext": {}, "f:terminationGracePeriodSeconds": {}}})),
                managed("vgpu-webhook", "Update", json!({"f:metadata": {"f:annotations": {".": {}}}})),
                managed("kube-scheduler", "Update", json!({"f:status": {"f:conditions": {".": {},
                    "k:{\"type\":\"PodScheduled\"}": {".": {}, "f:lastProbeTime": {}, "f:lastTransitionTime": {},
                    "f:message": {}, "f:reason": {}, "f:status": {}, "f:type": {}}}}})),
            ]
        },
        "spec": {
            "volumes": [{"name": "kube-api-access-x7k2p", "projected": {"defaultMode": 420, "sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace",
                    "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}]}}],
            "containers": [{
                "name": "main", "image": "registry.example.com/ml/train:2026.12", "imagePullPolicy": "IfNotPresent",
                "command": ["python", "-m", "train"], "args": ["--epochs", "40", "--batch", "256"],
                "ports": [{"name": "metrics", "containerPort": 9400, "protocol": "TCP"}],
                "env": [{"name": "NCCL_DEBUG", "value": "WARN"}, {"name": "OMP_NUM_THREADS", "value": "8"},
                        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}}},
                        {"name": "DATA_DIR", "value": "/data"}, {"name": "LOG_LEVEL", "value": "info"}],
                "resources": {
                    "limits": {d.vgpu_number(): "2", d.vgpu_cores(): "50", d.vgpu_memory(): "16384"},
                    "requests": {"cpu": "4", "memory": "16Gi"}},
                "volumeMounts": [{"name": "kube-api-access-x7k2p", "readOnly": true,
                    "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}],
                "readinessProbe": {"httpGet": {"path": "/healthz", "port": 9400, "scheme": "HTTP"},
                    "timeoutSeconds": 1, "periodSeconds": 10, "successThreshold": 1, "failureThreshold": 3},
                "terminationMessagePath": "/dev/termination-log", "terminationMessagePolicy": "File"}],
            "restartPolicy": "Always", "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default", "serviceAccount": "default", "securityContext": {},
            "schedulerName": "default-scheduler", "priority": 0, "enableServiceLinks": true,
            "preemptionPolicy": "PreemptLowerPriority",
            "tolerations": [
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}]
        },
        "status": {"phase": "Pending", "qosClass": "Burstable", "conditions": [{"type": "PodScheduled",
            "status": "False", "lastProbeTime": null, "lastTransitionTime": "2026-12-06T10:00:01Z",
            "reason": "Unschedulable", "message": "0/100 nodes are available: 100 Insufficient nvidia.com/vgpu-number."}]}
    })
}

/// An extender over an in-memory cluster whose cache holds `nodes` and no pod, at clock `now_ns`, with no events
/// and no serialized filter: the filter alone, as the decode bench and the allocation budget test measure it.
pub fn filter_only_extender(nodes: Vec<Node>, now_ns: i64) -> Extender<MemoryCluster, ManualClock> {
    let ext = Extender::new(
        MemoryCluster::new().without_event_log(),
        Arc::new(ManualClock::new(now_ns)),
        ExtenderConfig { emit_events: false, serialize_filter: false, ..ExtenderConfig::default() },
    );
    ext.cache().load(nodes, Vec::new(), now_ns);
    ext
}
