//! Kubernetes API objects (`k8s-openapi`) → the extender's light [`Pod`], [`Node`] and [`PodDisruptionBudget`].
//!
//! The HTTP layer (full `Pod` objects in extender requests) and the kube-backed cluster (watch events) both go
//! through these functions, so the cache and the verbs see one model whatever the source. Conversion never
//! fails: fields the extender does not read are dropped, and a malformed quantity simply does not count
//! (the request model reports invalid vGPU limits itself, naming the container and the value).
//!
//! Gang identity follows the contract (§2, `PodHasGangName`, first hit wins): `spec.schedulingGroup.podGroupName`
//! (Kubernetes ≥ 1.36), label `scheduling.x-k8s.io/pod-group`, label `pod-group.scheduling.sigs.k8s.io/name`,
//! annotations `scheduling.k8s.io/group-name`, `scheduling.volcano.sh/group-name`,
//! `gang.scheduling.koordinator.sh/name`, then an owner reference of kind `PodGroup`. The key is
//! `<namespace>/<name>`; a value that already holds a `/` is kept as is.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1 as corev1;
use k8s_openapi::api::policy::v1 as policyv1;
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as metav1;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use vgpu_core::alloc::{PodContainer, PodSpec, parse_quantity};
use vgpu_core::domain::ResourceDomain;

use crate::cluster::{Node, Pod, PodPhase};
use crate::pdb::{LabelSelector, PodDisruptionBudget, SelectorOperator, SelectorRequirement};

/// Labels naming a pod's gang, in lookup order (after `spec.schedulingGroup`).
pub const GANG_LABELS: [&str; 2] = ["scheduling.x-k8s.io/pod-group", "pod-group.scheduling.sigs.k8s.io/name"];
/// Annotations naming a pod's gang, in lookup order (after [`GANG_LABELS`]).
pub const GANG_ANNOTATIONS: [&str; 3] = [
    "scheduling.k8s.io/group-name",
    "scheduling.volcano.sh/group-name",
    "gang.scheduling.koordinator.sh/name",
];

/// Unix nanoseconds of a Kubernetes timestamp (saturating; Kubernetes times fit easily).
pub fn time_ns(time: &Time) -> i64 {
    i64::try_from(time.0.as_nanosecond()).unwrap_or(if time.0.as_nanosecond() < 0 {
        i64::MIN
    } else {
        i64::MAX
    })
}

/// `metadata.resourceVersion` as a counter; 0 when absent or not a decimal integer (the cache then applies the
/// object without comparing versions).
pub fn resource_version(meta: &ObjectMeta) -> u64 {
    meta.resource_version.as_deref().and_then(|v| v.parse().ok()).unwrap_or(0)
}

fn string_map(map: &Option<BTreeMap<String, String>>) -> BTreeMap<String, String> {
    map.clone().unwrap_or_default()
}

/// `status.phase` text → [`PodPhase`] (unknown or absent text → `Pending`, as a pod without status is).
pub fn pod_phase(phase: Option<&str>) -> PodPhase {
    match phase {
        Some("Running") => PodPhase::Running,
        Some("Succeeded") => PodPhase::Succeeded,
        Some("Failed") => PodPhase::Failed,
        Some("Unknown") => PodPhase::Unknown,
        _ => PodPhase::Pending,
    }
}

/// The string form of a [`PodPhase`] (`status.phase`).
pub fn pod_phase_str(phase: PodPhase) -> &'static str {
    match phase {
        PodPhase::Pending => "Pending",
        PodPhase::Running => "Running",
        PodPhase::Succeeded => "Succeeded",
        PodPhase::Failed => "Failed",
        PodPhase::Unknown => "Unknown",
    }
}

fn limits_of(resources: &Option<corev1::ResourceRequirements>) -> BTreeMap<String, String> {
    resources
        .as_ref()
        .and_then(|r| r.limits.as_ref())
        .map(|limits| limits.iter().map(|(k, q)| (k.clone(), q.0.clone())).collect())
        .unwrap_or_default()
}

fn gang_key(namespace: &str, name: &str) -> Option<String> {
    let name = name.trim();
    if name.is_empty() {
        None
    } else if name.contains('/') {
        Some(name.to_owned())
    } else {
        Some(format!("{namespace}/{name}"))
    }
}

fn scheduling_group_name(_spec: Option<&corev1::PodSpec>) -> Option<String> {
    k8s_openapi::k8s_if_ge_1_36! {
        return _spec.and_then(|s| s.scheduling_group.as_ref()).and_then(|g| g.pod_group_name.clone());
    }
    #[allow(unreachable_code)]
    None
}

/// The gang key of a pod (module docs), if it belongs to one.
pub fn gang_of(pod: &corev1::Pod) -> Option<String> {
    gang_of_meta(&pod.metadata, scheduling_group_name(pod.spec.as_ref()).as_deref())
}

/// The gang key from a pod's metadata and its `spec.schedulingGroup.podGroupName` (module docs).
pub(crate) fn gang_of_meta(meta: &ObjectMeta, scheduling_group: Option<&str>) -> Option<String> {
    let namespace = meta.namespace.as_deref().unwrap_or_default();
    if let Some(g) = scheduling_group.and_then(|n| gang_key(namespace, n)) {
        return Some(g);
    }
    let labels = meta.labels.as_ref();
    let annotations = meta.annotations.as_ref();
    GANG_LABELS
        .iter()
        .find_map(|k| labels.and_then(|l| l.get(*k)).and_then(|v| gang_key(namespace, v)))
        .or_else(|| {
            GANG_ANNOTATIONS
                .iter()
                .find_map(|k| annotations.and_then(|a| a.get(*k)).and_then(|v| gang_key(namespace, v)))
        })
        .or_else(|| {
            meta.owner_references
                .iter()
                .flatten()
                .find(|o| o.kind == "PodGroup")
                .and_then(|o| gang_key(namespace, &o.name))
        })
}

/// Converts a Kubernetes pod.
pub fn pod_from_k8s(pod: &corev1::Pod) -> Pod {
    let meta = &pod.metadata;
    let spec = pod.spec.as_ref();
    let status = pod.status.as_ref();
    let mut containers = Vec::new();
    if let Some(spec) = spec {
        for c in spec.init_containers.iter().flatten() {
            let mut pc = if c.restart_policy.as_deref() == Some("Always") {
                PodContainer::sidecar(c.name.clone())
            } else {
                PodContainer::init(c.name.clone())
            };
            pc.limits = limits_of(&c.resources);
            containers.push(pc);
        }
        for c in &spec.containers {
            let mut pc = PodContainer::app(c.name.clone());
            pc.limits = limits_of(&c.resources);
            containers.push(pc);
        }
    }
    let unschedulable_since_ns = status
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .find(|c| {
            c.type_ == "PodScheduled" && c.status == "False" && c.reason.as_deref() == Some("Unschedulable")
        })
        .and_then(|c| c.last_transition_time.as_ref())
        .map(time_ns);
    let controller = meta.owner_references.iter().flatten().find(|o| o.controller == Some(true));
    Pod {
        uid: meta.uid.clone().unwrap_or_default(),
        namespace: meta.namespace.clone().unwrap_or_default(),
        name: meta.name.clone().unwrap_or_default(),
        node_name: spec.and_then(|s| s.node_name.clone()).filter(|n| !n.is_empty()),
        phase: pod_phase(status.and_then(|s| s.phase.as_deref())),
        deleting: meta.deletion_timestamp.is_some(),
        annotations: string_map(&meta.annotations),
        labels: string_map(&meta.labels),
        spec: PodSpec { containers, annotations: BTreeMap::new() },
        priority: spec.and_then(|s| s.priority).unwrap_or(0),
        created_ns: meta.creation_timestamp.as_ref().map(time_ns).unwrap_or(0),
        unschedulable_since_ns,
        owner_kind: controller.map(|o| o.kind.clone()),
        owner_uid: controller.map(|o| o.uid.clone()).filter(|u| !u.is_empty()),
        gang: gang_of(pod),
        resource_version: resource_version(meta),
    }
}

/// Converts a Kubernetes node, keeping the allocatable quantities of the domain's vGPU resources.
pub fn node_from_k8s(node: &corev1::Node, domain: &ResourceDomain) -> Node {
    let wanted = [domain.vgpu_number(), domain.vgpu_cores(), domain.vgpu_memory()];
    let allocatable = node
        .status
        .as_ref()
        .and_then(|s| s.allocatable.as_ref())
        .map(|a| {
            a.iter()
                .filter(|(k, _)| wanted.contains(k))
                .filter_map(|(k, q)| parse_quantity(&q.0).map(|v| (k.clone(), v)))
                .collect()
        })
        .unwrap_or_default();
    Node {
        name: node.metadata.name.clone().unwrap_or_default(),
        labels: string_map(&node.metadata.labels),
        annotations: string_map(&node.metadata.annotations),
        allocatable,
    }
}

/// `status.disruptionsAllowed`, whichever form the picked Kubernetes version gives it (a plain integer before
/// 1.36, optional from 1.36 on).
trait DisruptionsAllowed {
    fn value(&self) -> i32;
}

impl DisruptionsAllowed for i32 {
    fn value(&self) -> i32 {
        *self
    }
}

impl DisruptionsAllowed for Option<i32> {
    fn value(&self) -> i32 {
        self.unwrap_or(0)
    }
}

/// A `metav1.LabelSelector`; `None` when a requirement has an operator outside `In`, `NotIn`, `Exists`,
/// `DoesNotExist` (such a selector matches nothing).
pub fn label_selector(selector: &metav1::LabelSelector) -> Option<LabelSelector> {
    let match_expressions = selector
        .match_expressions
        .iter()
        .flatten()
        .map(|r| {
            Some(SelectorRequirement {
                key: r.key.clone(),
                operator: SelectorOperator::parse(&r.operator)?,
                values: r.values.clone().unwrap_or_default(),
            })
        })
        .collect::<Option<Vec<_>>>()?;
    Some(LabelSelector { match_labels: string_map(&selector.match_labels), match_expressions })
}

/// Converts a `policy/v1` PodDisruptionBudget (a missing status reads as no disruption allowed, as
/// kube-scheduler reads it).
pub fn pdb_from_k8s(pdb: &policyv1::PodDisruptionBudget) -> PodDisruptionBudget {
    let status = pdb.status.as_ref();
    PodDisruptionBudget {
        namespace: pdb.metadata.namespace.clone().unwrap_or_default(),
        name: pdb.metadata.name.clone().unwrap_or_default(),
        selector: pdb.spec.as_ref().and_then(|s| s.selector.as_ref()).and_then(label_selector),
        disruptions_allowed: status.map(|s| s.disruptions_allowed.value()).unwrap_or(0),
        disrupted_pods: status
            .and_then(|s| s.disrupted_pods.as_ref())
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn pod_json(v: serde_json::Value) -> corev1::Pod {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn converts_a_full_pod() {
        let pod = pod_json(serde_json::json!({
            "metadata": {
                "name": "p", "namespace": "ns", "uid": "u-1", "resourceVersion": "42",
                "creationTimestamp": "2026-01-02T03:04:05Z",
                "labels": {"scheduling.x-k8s.io/pod-group": "g1"},
                "annotations": {"nvidia.com/pre-allocated": "main[0_GPU-0_10_1024]"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "r", "controller": true}]
            },
            "spec": {
                "nodeName": "n1", "priority": 7,
                "initContainers": [
                    {"name": "init", "resources": {"limits": {"nvidia.com/vgpu-number": "1"}}},
                    {"name": "side", "restartPolicy": "Always"}
                ],
                "containers": [{"name": "main", "resources": {"limits": {"nvidia.com/vgpu-number": "2", "nvidia.com/vgpu-memory": "4Ki"}}}]
            },
            "status": {
                "phase": "Running",
                "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "lastTransitionTime": "2026-01-02T03:04:06Z"}]
            }
        }));
        let p = pod_from_k8s(&pod);
        assert_eq!((p.uid.as_str(), p.namespace.as_str(), p.name.as_str()), ("u-1", "ns", "p"));
        assert_eq!(p.node_name.as_deref(), Some("n1"));
        assert_eq!(p.phase, PodPhase::Running);
        assert_eq!(p.priority, 7);
        assert_eq!(p.resource_version, 42);
        assert_eq!(p.created_ns, 1_767_323_045_000_000_000);
        assert_eq!(p.unschedulable_since_ns, Some(1_767_323_046_000_000_000));
        assert_eq!(p.owner_kind.as_deref(), Some("ReplicaSet"));
        assert_eq!(p.owner_uid.as_deref(), Some("r"));
        assert_eq!(p.gang.as_deref(), Some("ns/g1"));
        assert_eq!(p.spec.containers.len(), 3);
        assert_eq!(p.spec.containers[0], PodContainer::init("init").limit("nvidia.com/vgpu-number", "1"));
        assert_eq!(p.spec.containers[1], PodContainer::sidecar("side"));
        assert_eq!(p.spec.containers[2].limits["nvidia.com/vgpu-memory"], "4Ki");
        assert_eq!(p.annotations["nvidia.com/pre-allocated"], "main[0_GPU-0_10_1024]");
        assert!(!p.deleting);
    }

    #[test]
    fn empty_pod_converts_to_defaults() {
        let p = pod_from_k8s(&corev1::Pod::default());
        assert_eq!(p, Pod::default());
    }

    #[test]
    fn gang_lookup_order_and_keys() {
        let with = |labels: serde_json::Value, annotations: serde_json::Value| {
            gang_of(&pod_json(serde_json::json!({
                "metadata": {"namespace": "ns", "labels": labels, "annotations": annotations}
            })))
        };
        assert_eq!(with(serde_json::json!({}), serde_json::json!({})), None);
        assert_eq!(
            with(
                serde_json::json!({"pod-group.scheduling.sigs.k8s.io/name": "b"}),
                serde_json::json!({"scheduling.k8s.io/group-name": "c"})
            ),
            Some("ns/b".into())
        );
        assert_eq!(
            with(serde_json::json!({}), serde_json::json!({"scheduling.volcano.sh/group-name": "other/x"})),
            Some("other/x".into())
        );
        assert_eq!(
            with(serde_json::json!({"scheduling.x-k8s.io/pod-group": " "}), serde_json::json!({})),
            None
        );
        let owned = pod_json(serde_json::json!({"metadata": {"namespace": "ns", "ownerReferences": [
            {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup", "name": "pg", "uid": "x"}]}}));
        assert_eq!(gang_of(&owned), Some("ns/pg".into()));
        let grouped = pod_json(serde_json::json!({
            "metadata": {"namespace": "ns", "labels": {"scheduling.x-k8s.io/pod-group": "label"}},
            "spec": {"containers": [], "schedulingGroup": {"podGroupName": "sg"}}
        }));
        assert_eq!(gang_of(&grouped), Some("ns/sg".into()));
        assert_eq!(pod_from_k8s(&owned).owner_kind, None);
        assert_eq!(pod_from_k8s(&owned).owner_uid, None, "not a controller reference");
    }

    #[test]
    fn node_keeps_only_vgpu_allocatable() {
        let d = ResourceDomain::default();
        let mut node = corev1::Node::default();
        node.metadata.name = Some("n1".into());
        node.status = Some(corev1::NodeStatus {
            allocatable: Some(
                [
                    (d.vgpu_number(), Quantity("80".into())),
                    (d.vgpu_memory(), Quantity("1Ki".into())),
                    ("cpu".to_owned(), Quantity("8".into())),
                    (d.vgpu_cores(), Quantity("bogus".into())),
                ]
                .into_iter()
                .collect(),
            ),
            ..Default::default()
        });
        let n = node_from_k8s(&node, &d);
        assert_eq!(n.name, "n1");
        assert_eq!(n.allocatable.len(), 2);
        assert_eq!(n.allocatable[&d.vgpu_number()], 80);
        assert_eq!(n.allocatable[&d.vgpu_memory()], 1024);
    }

    #[test]
    fn phases_round_trip() {
        for p in
            [PodPhase::Pending, PodPhase::Running, PodPhase::Succeeded, PodPhase::Failed, PodPhase::Unknown]
        {
            assert_eq!(pod_phase(Some(pod_phase_str(p))), p);
        }
        assert_eq!(pod_phase(None), PodPhase::Pending);
    }
}
