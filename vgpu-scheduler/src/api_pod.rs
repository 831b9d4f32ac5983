//! [`ApiPod`]: a Kubernetes Pod's JSON decoded into only the fields the extender reads.
//!
//! Every pod reaches the extender as a whole `v1.Pod`: in each filter and prioritize request (`ExtenderArgs.Pod`)
//! and in each watch event (several per pod between creation and deletion). Decoded as k8s-openapi's
//! `Pod`, each one costs a heap allocation for every string, map and list of the object, `managedFields`,
//! environment, volumes, probes and status included, then [`convert::pod_from_k8s`](crate::convert::pod_from_k8s)
//! copies the few fields the extender uses. An [`ApiPod`] decodes those fields only; serde skips the rest of
//! the text without allocating, and [`ApiPod::into_pod`] moves the strings into the light [`Pod`] instead of
//! copying them.
//!
//! | JSON field | read into |
//! |---|---|
//! | `metadata.{name,namespace,uid,resourceVersion}` | [`Pod::name`], [`Pod::namespace`], [`Pod::uid`], [`Pod::resource_version`] |
//! | `metadata.{creationTimestamp,deletionTimestamp}` | [`Pod::created_ns`], [`Pod::deleting`] |
//! | `metadata.{labels,annotations}` | [`Pod::labels`], [`Pod::annotations`] |
//! | `metadata.ownerReferences[].{kind,name,uid,controller}` | [`Pod::owner_kind`], [`Pod::owner_uid`], [`Pod::gang`] (kind `PodGroup`) |
//! | `spec.{containers,initContainers}[].{name,restartPolicy,resources.limits}` | [`Pod::spec`] |
//! | `spec.{nodeName,priority,schedulingGroup.podGroupName}` | [`Pod::node_name`], [`Pod::priority`], [`Pod::gang`] |
//! | `status.phase`, `status.conditions[].{type,status,reason,lastTransitionTime}` | [`Pod::phase`], [`Pod::unschedulable_since_ns`] |
//!
//! The result equals `pod_from_k8s` of the same JSON decoded as k8s-openapi's `Pod` (a property test holds
//! them equal). Decoding is lenient where Go's is: `null` reads as absent, unknown fields are skipped, and a
//! resource limit may be a JSON string or number (Go's `resource.Quantity` takes both). Fields the extender
//! does not read are not checked at all: a pod whose `spec.volumes` is malformed still decodes.
//!
//! [`ApiPod`] implements [`k8s_openapi::Resource`] and [`k8s_openapi::Metadata`] (as `v1` `Pod`), so
//! `kube::Api<ApiPod>` lists and watches pods with this decoding ([`watch`](crate::watch) does).
//!
//! ```
//! use vgpu_scheduler::api_pod::ApiPod;
//!
//! let json = r#"{"metadata": {"name": "p", "namespace": "ns", "uid": "u1",
//!     "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}]},
//!   "spec": {"containers": [{"name": "main", "image": "cuda", "env": [{"name": "A", "value": "1"}],
//!     "resources": {"limits": {"nvidia.com/vgpu-number": "1"}}}]}}"#;
//! let pod = serde_json::from_str::<ApiPod>(json)?.into_pod();
//! assert_eq!(pod.key(), "ns/p");
//! assert_eq!(pod.spec.containers[0].limits["nvidia.com/vgpu-number"], "1");
//! # Ok::<(), serde_json::Error>(())
//! ```

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use serde::de::{Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};
use vgpu_core::alloc::{PodContainer, PodSpec};

use crate::cluster::Pod;
use crate::convert::{gang_of_meta, pod_phase, resource_version, time_ns};
use crate::wire::null_default;

/// A Kubernetes Pod decoded into the fields the extender reads (module docs).
///
/// `metadata` is a k8s-openapi [`ObjectMeta`] so that `kube::Api` can track resource versions; only the
/// fields of the module table are filled (`managedFields` and the rest stay empty).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ApiPod {
    /// `metadata`: name, namespace, uid, resource version, timestamps, labels, annotations, owners.
    pub metadata: ObjectMeta,
    /// `spec`: the fields of the module table.
    pub spec: Option<ApiPodSpec>,
    /// `status`: phase and conditions.
    pub status: Option<ApiPodStatus>,
}

/// The fields of an [`ApiPod`], decoded by serde's derive (which would also take a JSON array, positionally).
#[derive(Deserialize)]
struct ApiPodFields {
    #[serde(default, deserialize_with = "lean_meta")]
    metadata: ObjectMeta,
    #[serde(default)]
    spec: Option<ApiPodSpec>,
    #[serde(default)]
    status: Option<ApiPodStatus>,
}

/// Only a JSON object is a pod, as in Go (an array is refused with serde's "expected a map" error).
impl<'de> Deserialize<'de> for ApiPod {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = ApiPod;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a Pod object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                let f = ApiPodFields::deserialize(serde::de::value::MapAccessDeserializer::new(map))?;
                Ok(ApiPod { metadata: f.metadata, spec: f.spec, status: f.status })
            }
        }
        d.deserialize_map(V)
    }
}

/// `spec` of an [`ApiPod`].
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApiPodSpec {
    /// `spec.containers`.
    #[serde(default, deserialize_with = "null_default")]
    pub containers: Vec<ApiContainer>,
    /// `spec.initContainers` (a `restartPolicy: Always` one is a sidecar).
    #[serde(default, deserialize_with = "null_default")]
    pub init_containers: Vec<ApiContainer>,
    /// `spec.nodeName`.
    #[serde(default)]
    pub node_name: Option<String>,
    /// `spec.priority`.
    #[serde(default)]
    pub priority: Option<i32>,
    /// `spec.schedulingGroup` (Kubernetes ≥ 1.36).
    #[serde(default)]
    pub scheduling_group: Option<ApiSchedulingGroup>,
}

/// `spec.schedulingGroup` of an [`ApiPod`].
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApiSchedulingGroup {
    /// `podGroupName`.
    #[serde(default)]
    pub pod_group_name: Option<String>,
}

/// A container of an [`ApiPod`].
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApiContainer {
    /// `name`.
    #[serde(default, deserialize_with = "null_default")]
    pub name: String,
    /// `restartPolicy` (init containers: `Always` makes a sidecar).
    #[serde(default)]
    pub restart_policy: Option<String>,
    /// `resources.limits`, each quantity as its text.
    #[serde(default, deserialize_with = "limits")]
    pub resources: BTreeMap<String, String>,
}

/// `status` of an [`ApiPod`].
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct ApiPodStatus {
    /// `status.phase`.
    #[serde(default)]
    pub phase: Option<String>,
    /// `status.conditions`.
    #[serde(default, deserialize_with = "null_default")]
    pub conditions: Vec<ApiPodCondition>,
}

/// A `status.conditions` entry of an [`ApiPod`].
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApiPodCondition {
    /// `type`.
    #[serde(rename = "type", default, deserialize_with = "null_default")]
    pub type_: String,
    /// `status`.
    #[serde(default, deserialize_with = "null_default")]
    pub status: String,
    /// `reason`.
    #[serde(default)]
    pub reason: Option<String>,
    /// `lastTransitionTime`.
    #[serde(default)]
    pub last_transition_time: Option<Time>,
}

impl ApiPod {
    /// The light pod, strings moved rather than copied (equal to `pod_from_k8s` of the full object).
    pub fn into_pod(self) -> Pod {
        let ApiPod { metadata: meta, spec, status } = self;
        let gang = gang_of_meta(
            &meta,
            spec.as_ref().and_then(|s| s.scheduling_group.as_ref()).and_then(|g| g.pod_group_name.as_deref()),
        );
        let mut containers = Vec::new();
        let (mut node_name, mut priority) = (None, 0);
        if let Some(spec) = spec {
            containers.reserve(spec.init_containers.len() + spec.containers.len());
            for c in spec.init_containers {
                let mut pc = if c.restart_policy.as_deref() == Some("Always") {
                    PodContainer::sidecar(c.name)
                } else {
                    PodContainer::init(c.name)
                };
                pc.limits = c.resources;
                containers.push(pc);
            }
            for c in spec.containers {
                let mut pc = PodContainer::app(c.name);
                pc.limits = c.resources;
                containers.push(pc);
            }
            node_name = spec.node_name.filter(|n| !n.is_empty());
            priority = spec.priority.unwrap_or(0);
        }
        let (phase, unschedulable_since_ns) = match &status {
            Some(s) => (
                pod_phase(s.phase.as_deref()),
                s.conditions
                    .iter()
                    .find(|c| {
                        c.type_ == "PodScheduled"
                            && c.status == "False"
                            && c.reason.as_deref() == Some("Unschedulable")
                    })
                    .and_then(|c| c.last_transition_time.as_ref())
                    .map(time_ns),
            ),
            None => (pod_phase(None), None),
        };
        let resource_version = resource_version(&meta);
        let controller = meta.owner_references.iter().flatten().find(|o| o.controller == Some(true));
        let (owner_kind, owner_uid) = match controller {
            Some(o) => (Some(o.kind.clone()), Some(o.uid.clone()).filter(|u| !u.is_empty())),
            None => (None, None),
        };
        Pod {
            uid: meta.uid.unwrap_or_default(),
            namespace: meta.namespace.unwrap_or_default(),
            name: meta.name.unwrap_or_default(),
            node_name,
            phase,
            deleting: meta.deletion_timestamp.is_some(),
            annotations: meta.annotations.unwrap_or_default(),
            labels: meta.labels.unwrap_or_default(),
            spec: PodSpec { containers, annotations: BTreeMap::new() },
            priority,
            created_ns: meta.creation_timestamp.as_ref().map(time_ns).unwrap_or(0),
            unschedulable_since_ns,
            owner_kind,
            owner_uid,
            gang,
            resource_version,
        }
    }

    /// The gang key (see [`convert`](crate::convert)), read without converting the whole pod.
    pub fn gang(&self) -> Option<String> {
        let group = self.spec.as_ref().and_then(|s| s.scheduling_group.as_ref());
        gang_of_meta(&self.metadata, group.and_then(|g| g.pod_group_name.as_deref()))
    }
}

impl k8s_openapi::Resource for ApiPod {
    const API_VERSION: &'static str = "v1";
    const GROUP: &'static str = "";
    const KIND: &'static str = "Pod";
    const VERSION: &'static str = "v1";
    const URL_PATH_SEGMENT: &'static str = "pods";
    type Scope = k8s_openapi::NamespaceResourceScope;
}

impl k8s_openapi::Metadata for ApiPod {
    type Ty = ObjectMeta;

    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// Serialized as the metadata it holds (for logs and the generic `kube` bounds); never sent to the API server.
impl Serialize for ApiPod {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("Pod", 3)?;
        st.serialize_field("apiVersion", "v1")?;
        st.serialize_field("kind", "Pod")?;
        st.serialize_field("metadata", &self.metadata)?;
        st.end()
    }
}

/// `metadata` without the fields the extender never reads.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct LeanMeta {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    uid: Option<String>,
    #[serde(default)]
    resource_version: Option<String>,
    #[serde(default)]
    creation_timestamp: Option<Time>,
    #[serde(default)]
    deletion_timestamp: Option<Time>,
    #[serde(default)]
    labels: Option<BTreeMap<String, String>>,
    #[serde(default)]
    annotations: Option<BTreeMap<String, String>>,
    #[serde(default)]
    owner_references: Option<Vec<LeanOwner>>,
}

#[derive(Deserialize)]
struct LeanOwner {
    #[serde(rename = "apiVersion", default, deserialize_with = "null_default")]
    api_version: String,
    #[serde(default, deserialize_with = "null_default")]
    kind: String,
    #[serde(default, deserialize_with = "null_default")]
    name: String,
    #[serde(default, deserialize_with = "null_default")]
    uid: String,
    #[serde(default)]
    controller: Option<bool>,
}

fn lean_meta<'de, D: Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    let Some(m) = Option::<LeanMeta>::deserialize(d)? else { return Ok(ObjectMeta::default()) };
    Ok(ObjectMeta {
        name: m.name,
        namespace: m.namespace,
        uid: m.uid,
        resource_version: m.resource_version,
        creation_timestamp: m.creation_timestamp,
        deletion_timestamp: m.deletion_timestamp,
        labels: m.labels,
        annotations: m.annotations,
        owner_references: m.owner_references.map(|owners| {
            owners
                .into_iter()
                .map(|o| OwnerReference {
                    api_version: o.api_version,
                    kind: o.kind,
                    name: o.name,
                    uid: o.uid,
                    controller: o.controller,
                    ..OwnerReference::default()
                })
                .collect()
        }),
        ..ObjectMeta::default()
    })
}

/// `resources` → its `limits` (quantities as text: a JSON string, or a number as Go's `Quantity` takes it).
fn limits<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<String, String>, D::Error> {
    #[derive(Deserialize)]
    struct Resources {
        #[serde(default)]
        limits: Option<BTreeMap<String, QuantityText>>,
    }
    let r = Option::<Resources>::deserialize(d)?;
    Ok(r.and_then(|r| r.limits).map(|l| l.into_iter().map(|(k, v)| (k, v.0)).collect()).unwrap_or_default())
}

/// A quantity's text: a JSON string, or a JSON number written back as its decimal text.
struct QuantityText(String);

impl<'de> Deserialize<'de> for QuantityText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = QuantityText;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a quantity (a string such as \"16Gi\" or a number)")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(QuantityText(v.to_owned()))
            }
            fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(QuantityText(v))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Self::Value, E> {
                Ok(QuantityText(v.to_string()))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Self::Value, E> {
                Ok(QuantityText(v.to_string()))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Self::Value, E> {
                Ok(QuantityText(v.to_string()))
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;
    use crate::convert::pod_from_k8s;
    use proptest::prelude::*;
    use serde_json::{Value, json};

    fn both(v: &Value) -> (Pod, Pod) {
        let full: k8s_openapi::api::core::v1::Pod = serde_json::from_value(v.clone()).unwrap();
        let lean: ApiPod = serde_json::from_value(v.clone()).unwrap();
        (pod_from_k8s(&full), lean.into_pod())
    }

    fn realistic() -> Value {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": "train-0", "namespace": "ml", "uid": "7f1c", "resourceVersion": "4711",
                "creationTimestamp": "2026-12-06T10:00:00Z",
                "labels": {"app": "train", "pod-group.scheduling.sigs.k8s.io/name": "g1"},
                "annotations": {"nvidia.com/node-scheduler-policy": "binpack"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "rs-1",
                    "controller": true, "blockOwnerDeletion": true}],
                "managedFields": [{"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1",
                    "time": "2026-12-06T10:00:00Z", "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:metadata": {"f:labels": {".": {}, "f:app": {}}}}}]
            },
            "spec": {
                "nodeName": "n1", "priority": 100, "schedulerName": "default-scheduler",
                "volumes": [{"name": "kube-api-access", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}}],
                "initContainers": [
                    {"name": "setup", "image": "busybox", "resources": {"limits": {"cpu": "1"}}},
                    {"name": "side", "image": "busybox", "restartPolicy": "Always",
                     "resources": {"limits": {"nvidia.com/vgpu-number": "1"}}}
                ],
                "containers": [{"name": "main", "image": "cuda", "command": ["python", "train.py"],
                    "env": [{"name": "A", "value": "1"}],
                    "resources": {"limits": {"nvidia.com/vgpu-number": "2", "nvidia.com/vgpu-memory": "16384"},
                                  "requests": {"cpu": "2"}},
                    "volumeMounts": [{"name": "kube-api-access", "mountPath": "/var/run/secrets"}]}],
                "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"}]
            },
            "status": {"phase": "Pending", "qosClass": "Burstable", "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                 "lastTransitionTime": "2026-12-06T10:00:01Z", "message": "0/3 nodes"}]}
        })
    }

    #[test]
    fn equals_the_full_decode_of_a_realistic_pod() {
        let (full, lean) = both(&realistic());
        assert_eq!(lean, full);
        assert_eq!(lean.gang.as_deref(), Some("ml/g1"));
        assert_eq!(lean.owner_kind.as_deref(), Some("ReplicaSet"));
        assert!(lean.unschedulable_since_ns.is_some());
        assert_eq!(lean.spec.containers.len(), 3);
    }

    #[test]
    fn nulls_and_empty_objects_read_as_absent() {
        for v in [
            json!({}),
            json!({"metadata": null, "spec": null, "status": null}),
            json!({"metadata": {"labels": null, "ownerReferences": null}, "spec": {"containers": []}}),
        ] {
            let lean: ApiPod = serde_json::from_value(v.clone()).unwrap();
            assert_eq!(lean.into_pod().key(), "/", "{v}");
        }
    }

    #[test]
    fn only_an_object_is_a_pod() {
        for v in [json!([]), json!(5), json!("p")] {
            let e = serde_json::from_value::<ApiPod>(v.clone()).unwrap_err();
            assert!(e.to_string().contains("expected a Pod object"), "{v}: {e}");
        }
    }

    #[test]
    fn a_limit_may_be_a_number_as_go_takes_it() {
        let v = json!({"spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/vgpu-number": 2}}}]}});
        let pod = serde_json::from_value::<ApiPod>(v).unwrap().into_pod();
        assert_eq!(pod.spec.containers[0].limits["nvidia.com/vgpu-number"], "2");
    }

    #[test]
    fn fields_it_reads_are_still_checked() {
        let e = serde_json::from_value::<ApiPod>(json!({"spec": {"containers": 7}})).unwrap_err();
        assert!(e.to_string().contains("invalid type"), "{e}");
        let e = serde_json::from_value::<ApiPod>(json!({"metadata": {"name": 1}})).unwrap_err();
        assert!(e.to_string().contains("invalid type"), "{e}");
    }

    #[test]
    fn kube_sees_a_v1_pod() {
        use kube::Resource;
        assert_eq!(ApiPod::kind(&()), "Pod");
        assert_eq!(ApiPod::plural(&()), "pods");
        assert_eq!(ApiPod::api_version(&()), "v1");
    }

    fn owner() -> impl Strategy<Value = Value> {
        ("[A-Za-z]{1,8}", "[a-z0-9]{0,6}", "[a-z0-9-]{0,6}", proptest::option::of(any::<bool>())).prop_map(
            |(kind, name, uid, controller)| {
                json!({"apiVersion": "v1", "kind": kind, "name": name, "uid": uid, "controller": controller})
            },
        )
    }

    fn container() -> impl Strategy<Value = Value> {
        (
            "[a-z]{1,6}",
            proptest::option::of(prop_oneof![Just("Always"), Just("OnFailure")]),
            proptest::collection::btree_map("[a-z./-]{1,12}", "[0-9]{1,4}(Mi|Gi|m)?", 0..3),
        )
            .prop_map(|(name, restart, limits)| {
                json!({"name": name, "image": "x", "restartPolicy": restart, "resources": {"limits": limits}})
            })
    }

    proptest! {
        /// Any pod decodes to the same light pod through [`ApiPod`] as through k8s-openapi + `pod_from_k8s`.
        #[test]
        fn lean_and_full_decodes_agree(
            name in proptest::option::of("[a-z0-9-]{0,10}"),
            namespace in proptest::option::of("[a-z]{0,6}"),
            uid in proptest::option::of("[a-f0-9-]{0,8}"),
            rv in proptest::option::of(prop_oneof!["[0-9]{1,6}", "[a-z]{1,3}"]),
            labels in proptest::collection::btree_map(
                prop_oneof![Just("scheduling.x-k8s.io/pod-group".to_owned()), "[a-z]{1,5}"], "[a-z/ ]{0,6}", 0..3),
            annotations in proptest::collection::btree_map(
                prop_oneof![Just("scheduling.volcano.sh/group-name".to_owned()), "[a-z.]{1,8}"], "[ -~]{0,10}", 0..3),
            owners in proptest::collection::vec(owner(), 0..3),
            inits in proptest::collection::vec(container(), 0..3),
            apps in proptest::collection::vec(container(), 0..3),
            node in proptest::option::of("[a-z0-9]{0,5}"),
            priority in proptest::option::of(any::<i32>()),
            phase in proptest::option::of(prop_oneof![
                Just("Pending"), Just("Running"), Just("Succeeded"), Just("Failed"), Just("Weird")]),
            unschedulable in any::<bool>(),
            deleting in any::<bool>(),
        ) {
            let mut v = json!({
                "metadata": {"name": name, "namespace": namespace, "uid": uid, "resourceVersion": rv,
                    "labels": labels, "annotations": annotations, "ownerReferences": owners,
                    "creationTimestamp": "2026-01-02T03:04:05Z",
                    "managedFields": [{"manager": "m", "fieldsV1": {"f:x": {}}}]},
                "spec": {"initContainers": inits, "containers": apps, "nodeName": node, "priority": priority},
                "status": {"phase": phase, "conditions": [{"type": "PodScheduled",
                    "status": if unschedulable { "False" } else { "True" }, "reason": "Unschedulable",
                    "lastTransitionTime": "2026-01-02T03:04:06Z"}]}
            });
            if deleting {
                v["metadata"]["deletionTimestamp"] = json!("2026-01-02T03:05:00Z");
            }
            let (full, lean) = both(&v);
            prop_assert_eq!(lean, full);
        }
    }
}
