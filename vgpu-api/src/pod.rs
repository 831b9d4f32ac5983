//! Helpers over core Kubernetes objects (no client): what a pod's fields mean.

use k8s_openapi::api::core::v1::Pod;

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
    use k8s_openapi::api::core::v1::{PodResourceClaim, PodResourceClaimStatus, PodSpec, PodStatus};

    use super::*;

    fn pod(direct: Option<&str>, generated: Option<&str>) -> Pod {
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
        assert_eq!(actual_claim_name(&pod(Some("a"), Some("b")), "gpu"), Some("a"));
        assert_eq!(actual_claim_name(&pod(None, Some("b")), "gpu"), Some("b"));
        assert_eq!(actual_claim_name(&pod(Some(""), Some("b")), "gpu"), Some("b"), "an empty name is none");
        assert_eq!(actual_claim_name(&pod(None, None), "gpu"), None, "template claim not created yet");
        assert_eq!(actual_claim_name(&pod(None, Some("")), "gpu"), None);
        assert_eq!(actual_claim_name(&pod(Some("a"), None), "other"), None);
        assert_eq!(actual_claim_name(&Pod::default(), "gpu"), None);
    }
}
