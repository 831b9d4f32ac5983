//! Walks over a Pod with no client: its containers with the field that names each ([`containers`],
//! [`ContainerSlot::path`]), the JSON sides a pod patch is the diff of ([`comparable`]), and the owner key of
//! the objects made for it ([`owner_key`]), and the claim a pod's claim entry stands for ([`actual_claim_name`]).

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};

/// Init or app container, with its index: names the field in messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContainerSlot {
    /// `spec.initContainers[i]`.
    Init(usize),
    /// `spec.containers[i]`.
    App(usize),
}

impl ContainerSlot {
    /// The field path, e.g. `spec.containers[0]`.
    pub fn path(self) -> String {
        match self {
            ContainerSlot::Init(i) => format!("spec.initContainers[{i}]"),
            ContainerSlot::App(i) => format!("spec.containers[{i}]"),
        }
    }
}

/// Every container of a pod, init containers first, with its slot.
pub fn containers(pod: &Pod) -> Vec<(ContainerSlot, &Container)> {
    pod.spec.as_ref().map(spec_containers).unwrap_or_default()
}

/// Every container of a pod spec (a pod's or a pod template's), init containers first, with its slot.
pub fn spec_containers(spec: &PodSpec) -> Vec<(ContainerSlot, &Container)> {
    let mut out = Vec::new();
    for (i, c) in spec.init_containers.iter().flatten().enumerate() {
        out.push((ContainerSlot::Init(i), c));
    }
    for (i, c) in spec.containers.iter().enumerate() {
        out.push((ContainerSlot::App(i), c));
    }
    out
}

/// `{"metadata": …, "spec": …}` of a pod, `managedFields` left out: the two sides a pod patch is the diff of.
pub fn comparable(pod: &Pod) -> Result<serde_json::Value, serde_json::Error> {
    let mut metadata = serde_json::to_value(&pod.metadata)?;
    if let Some(m) = metadata.as_object_mut() {
        m.remove("managedFields");
    }
    let mut out = serde_json::Map::new();
    out.insert("metadata".to_owned(), metadata);
    if let Some(spec) = &pod.spec {
        out.insert("spec".to_owned(), serde_json::to_value(spec)?);
    }
    Ok(serde_json::Value::Object(out))
}

/// Owner-key label value of a pod's generated claims.
pub fn owner_key(pod: &Pod) -> String {
    format!(
        "{}-{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

/// The name of the ResourceClaim a pod's `spec.resourceClaims[name]` entry (`pod_claim`) stands for: its
/// `resourceClaimName`, or for a template the claim generated from it (`status.resourceClaimStatuses`).
/// `None`: no such entry, or its template's claim has not been created yet. An empty name counts as none.
///
/// ```
/// use k8s_openapi::api::core::v1::{Pod, PodResourceClaim, PodResourceClaimStatus, PodSpec, PodStatus};
/// use vgpu_api::pod::actual_claim_name;
///
/// let pod = Pod {
///     spec: Some(PodSpec {
///         resource_claims: Some(vec![
///             PodResourceClaim { name: "direct".into(), resource_claim_name: Some("shared-gpu".into()), ..Default::default() },
///             PodResourceClaim { name: "tmpl".into(), resource_claim_template_name: Some("t".into()), ..Default::default() },
///         ]),
///         ..Default::default()
///     }),
///     status: Some(PodStatus {
///         resource_claim_statuses: Some(vec![PodResourceClaimStatus {
///             name: "tmpl".into(),
///             resource_claim_name: Some("web-0-tmpl-x7k2p".into()),
///         }]),
///         ..Default::default()
///     }),
///     ..Default::default()
/// };
/// assert_eq!(actual_claim_name(&pod, "direct"), Some("shared-gpu"));
/// assert_eq!(actual_claim_name(&pod, "tmpl"), Some("web-0-tmpl-x7k2p"));
/// assert_eq!(actual_claim_name(&pod, "other"), None);
/// ```
pub fn actual_claim_name<'a>(pod: &'a Pod, pod_claim: &str) -> Option<&'a str> {
    let entry = pod.spec.as_ref()?.resource_claims.iter().flatten().find(|c| c.name == pod_claim)?;
    if let Some(name) = entry.resource_claim_name.as_deref().filter(|n| !n.is_empty()) {
        return Some(name);
    }
    pod.status
        .as_ref()?
        .resource_claim_statuses
        .iter()
        .flatten()
        .find(|s| s.name == pod_claim)?
        .resource_claim_name
        .as_deref()
        .filter(|n| !n.is_empty())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn pod() -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "ml", "managedFields": [{"manager": "kubectl"}]},
            "spec": {"initContainers": [{"name": "init"}], "containers": [{"name": "a"}, {"name": "b"}]}
        }))
        .unwrap()
    }

    #[test]
    fn containers_init_first_with_their_paths() {
        let p = pod();
        let walk: Vec<(String, &str)> =
            containers(&p).into_iter().map(|(s, c)| (s.path(), c.name.as_str())).collect();
        assert_eq!(
            walk,
            [
                ("spec.initContainers[0]".to_owned(), "init"),
                ("spec.containers[0]".to_owned(), "a"),
                ("spec.containers[1]".to_owned(), "b")
            ]
        );
        assert!(containers(&Pod::default()).is_empty());
    }

    #[test]
    fn comparable_drops_managed_fields_and_owner_key_joins() {
        let p = pod();
        let v = comparable(&p).unwrap();
        assert!(v["metadata"].get("managedFields").is_none());
        assert_eq!(v["metadata"]["name"], "web");
        assert_eq!(v["spec"]["containers"][1]["name"], "b");
        assert_eq!(owner_key(&p), "ml-web");
    }

    use k8s_openapi::api::core::v1::{PodResourceClaim, PodResourceClaimStatus, PodSpec, PodStatus};

    fn claim_pod(direct: Option<&str>, generated: Option<&str>) -> Pod {
        Pod {
            spec: Some(PodSpec {
                resource_claims: Some(vec![PodResourceClaim {
                    name: "gpu".into(),
                    resource_claim_name: direct.map(str::to_owned),
                    resource_claim_template_name: Some("t".into()),
                }]),
                ..Default::default()
            }),
            status: Some(PodStatus {
                resource_claim_statuses: Some(vec![PodResourceClaimStatus {
                    name: "gpu".into(),
                    resource_claim_name: generated.map(str::to_owned),
                }]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn the_direct_name_wins_then_the_generated_one() {
        assert_eq!(actual_claim_name(&claim_pod(Some("a"), Some("b")), "gpu"), Some("a"));
        assert_eq!(actual_claim_name(&claim_pod(None, Some("b")), "gpu"), Some("b"));
        assert_eq!(
            actual_claim_name(&claim_pod(Some(""), Some("b")), "gpu"),
            Some("b"),
            "an empty name is none"
        );
        assert_eq!(actual_claim_name(&claim_pod(None, None), "gpu"), None, "template claim not created yet");
        assert_eq!(actual_claim_name(&claim_pod(None, Some("")), "gpu"), None);
        assert_eq!(actual_claim_name(&claim_pod(Some("a"), None), "other"), None);
        assert_eq!(actual_claim_name(&Pod::default(), "gpu"), None);
    }
}
