//! Where Prepare reads ResourceClaims from: [`ClaimSource`] (`resource.k8s.io/v1` ResourceClaim by
//! namespace and name), with [`KubeClaims`] over a `kube::Client` and [`InMemoryClaims`] for tests, with
//! failure injection.
//!
//! | call | request | result |
//! |---|---|---|
//! | [`ClaimSource::get`] | `GET /apis/resource.k8s.io/v1/namespaces/<ns>/resourceclaims/<name>` | `Ok(Some)`; 404 → `Ok(None)`; anything else → [`ClaimError`] |
//! | [`ClaimSource::pod`] | `GET /api/v1/namespaces/<ns>/pods/<name>` (a consumer, for the partition walk) | as above |
//! | [`ClaimSource::annotate`] | `PATCH` (merge) `/apis/resource.k8s.io/v1/namespaces/<ns>/resourceclaims/<name>` `{"metadata":{"annotations":{k: v or null}}}` (client mode's `manager.nvidia.com/<uuid>`) | 404 → `Ok(())` |
//!
//! The caller checks the UID: a claim of the same name but another UID is a different (re-created) claim.
//!
//! ```
//! use vgpu_dra::claims::{ClaimSource, InMemoryClaims, claim};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), vgpu_dra::claims::ClaimError> {
//! let claims = InMemoryClaims::default();
//! claims.insert(claim("ns", "c1", "uid-1"));
//! assert_eq!(claims.get("ns", "c1").await?.and_then(|c| c.metadata.uid).as_deref(), Some("uid-1"));
//! assert!(claims.get("ns", "other").await?.is_none());
//! claims.fail_next("apiserver down");
//! assert!(claims.get("ns", "c1").await.is_err());
//! # Ok(())
//! # }
//! ```

use std::{
    collections::BTreeMap,
    sync::{Mutex, PoisonError},
};

use k8s_openapi::api::{core::v1::Pod, resource::v1::ResourceClaim};

/// A claim as the kubelet names it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct ClaimRef {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// UID.
    pub uid: String,
}

impl ClaimRef {
    /// `namespace/name` with `uid`.
    pub fn new(namespace: &str, name: &str, uid: &str) -> Self {
        Self { namespace: namespace.to_owned(), name: name.to_owned(), uid: uid.to_owned() }
    }
}

/// Reading a claim failed (not a 404).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("get ResourceClaim {namespace}/{name}: {message}")]
pub struct ClaimError {
    /// The claim's namespace.
    pub namespace: String,
    /// The claim's name.
    pub name: String,
    /// Why.
    pub message: String,
}

/// ResourceClaims by namespace and name.
#[tonic::async_trait]
pub trait ClaimSource: Send + Sync + std::fmt::Debug + 'static {
    /// The claim, or `None` when it does not exist.
    async fn get(&self, namespace: &str, name: &str) -> Result<Option<ResourceClaim>, ClaimError>;

    /// The pod `namespace/name` (a claim's consumer, for [`crate::partition`]), or `None` when it does not
    /// exist. The default reads nothing (every request then gets its fallback partition).
    async fn pod(&self, _namespace: &str, _name: &str) -> Result<Option<Pod>, ClaimError> {
        Ok(None)
    }

    /// Sets (`Some`) or removes (`None`) annotations of the claim `namespace/name` whose UID is `uid` (empty:
    /// any); a claim that no longer exists, or whose name now belongs to a claim with another UID, is fine and
    /// left untouched. The default does nothing.
    async fn annotate(
        &self,
        _namespace: &str,
        _name: &str,
        _uid: &str,
        _changes: &BTreeMap<String, Option<String>>,
    ) -> Result<(), ClaimError> {
        Ok(())
    }
}

// === impl KubeClaims ===

/// [`ClaimSource`] over the API server.
#[derive(Clone)]
pub struct KubeClaims {
    client: kube::Client,
}

impl std::fmt::Debug for KubeClaims {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeClaims").finish_non_exhaustive()
    }
}

impl KubeClaims {
    /// Wraps a client.
    pub fn new(client: kube::Client) -> Self {
        Self { client }
    }
}

#[tonic::async_trait]
impl ClaimSource for KubeClaims {
    async fn get(&self, namespace: &str, name: &str) -> Result<Option<ResourceClaim>, ClaimError> {
        let api: kube::Api<ResourceClaim> = kube::Api::namespaced(self.client.clone(), namespace);
        api.get_opt(name).await.map_err(|e| ClaimError {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            message: e.to_string(),
        })
    }

    async fn pod(&self, namespace: &str, name: &str) -> Result<Option<Pod>, ClaimError> {
        let api: kube::Api<Pod> = kube::Api::namespaced(self.client.clone(), namespace);
        api.get_opt(name).await.map_err(|e| ClaimError {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            message: format!("get Pod: {e}"),
        })
    }

    async fn annotate(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        changes: &BTreeMap<String, Option<String>>,
    ) -> Result<(), ClaimError> {
        let api: kube::Api<ResourceClaim> = kube::Api::namespaced(self.client.clone(), namespace);
        let mut patch = serde_json::json!({ "metadata": { "annotations": changes } });
        if !uid.is_empty() {
            // A precondition: kube-apiserver refuses the patch (422, `metadata.uid` immutable) for another claim.
            patch["metadata"]["uid"] = serde_json::Value::String(uid.to_owned());
        }
        match api.patch(name, &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch)).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
            Err(kube::Error::Api(status))
                if status.code == 422 && status.message.contains("metadata.uid") =>
            {
                Ok(())
            }
            Err(e) => Err(ClaimError {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
                message: format!("patch annotations: {e}"),
            }),
        }
    }
}

// === impl InMemoryClaims ===

/// [`ClaimSource`] over a map, with failure injection ([`fail_next`](Self::fail_next)).
#[derive(Debug, Default)]
pub struct InMemoryClaims {
    claims: Mutex<BTreeMap<(String, String), ResourceClaim>>,
    pods: Mutex<BTreeMap<(String, String), Pod>>,
    failures: Mutex<Vec<String>>,
}

impl InMemoryClaims {
    /// Adds or replaces a claim (keyed by its namespace and name).
    pub fn insert(&self, claim: ResourceClaim) {
        let key = (
            claim.metadata.namespace.clone().unwrap_or_default(),
            claim.metadata.name.clone().unwrap_or_default(),
        );
        self.claims.lock().unwrap_or_else(PoisonError::into_inner).insert(key, claim);
    }

    /// Removes a claim.
    pub fn remove(&self, namespace: &str, name: &str) {
        self.claims
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&(namespace.to_owned(), name.to_owned()));
    }

    /// Adds or replaces a pod (keyed by its namespace and name).
    pub fn insert_pod(&self, pod: Pod) {
        let key = (
            pod.metadata.namespace.clone().unwrap_or_default(),
            pod.metadata.name.clone().unwrap_or_default(),
        );
        self.pods.lock().unwrap_or_else(PoisonError::into_inner).insert(key, pod);
    }

    /// The next `get` fails with `message`.
    pub fn fail_next(&self, message: &str) {
        self.failures.lock().unwrap_or_else(PoisonError::into_inner).push(message.to_owned());
    }
}

#[tonic::async_trait]
impl ClaimSource for InMemoryClaims {
    async fn get(&self, namespace: &str, name: &str) -> Result<Option<ResourceClaim>, ClaimError> {
        if let Some(message) = self.failures.lock().unwrap_or_else(PoisonError::into_inner).pop() {
            return Err(ClaimError { namespace: namespace.to_owned(), name: name.to_owned(), message });
        }
        Ok(self
            .claims
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&(namespace.to_owned(), name.to_owned()))
            .cloned())
    }

    async fn pod(&self, namespace: &str, name: &str) -> Result<Option<Pod>, ClaimError> {
        let pods = self.pods.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(pods.get(&(namespace.to_owned(), name.to_owned())).cloned())
    }

    async fn annotate(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        changes: &BTreeMap<String, Option<String>>,
    ) -> Result<(), ClaimError> {
        let mut claims = self.claims.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(claim) = claims
            .get_mut(&(namespace.to_owned(), name.to_owned()))
            .filter(|c| uid.is_empty() || c.metadata.uid.as_deref() == Some(uid))
        {
            let annotations = claim.metadata.annotations.get_or_insert_with(BTreeMap::new);
            for (key, value) in changes {
                match value {
                    Some(v) => annotations.insert(key.clone(), v.clone()),
                    None => annotations.remove(key),
                };
            }
        }
        Ok(())
    }
}

/// A bare claim `namespace/name` with `uid` (no spec, no status): a starting point for tests and examples.
pub fn claim(namespace: &str, name: &str, uid: &str) -> ResourceClaim {
    let mut c = ResourceClaim::default();
    c.metadata.namespace = Some(namespace.to_owned());
    c.metadata.name = Some(name.to_owned());
    c.metadata.uid = Some(uid.to_owned());
    c
}

/// One allocation result of `driver` for `request` on `pool`/`device`, with an optional share ID and the
/// consumed capacity (`[("cores", "10"), ("memory", "1Gi")]`): for tests, benches and examples.
pub fn allocation_result(
    request: &str,
    driver: &str,
    pool: &str,
    device: &str,
    share_id: Option<&str>,
    consumed: &[(&str, &str)],
) -> k8s_openapi::api::resource::v1::DeviceRequestAllocationResult {
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    k8s_openapi::api::resource::v1::DeviceRequestAllocationResult {
        request: request.to_owned(),
        driver: driver.to_owned(),
        pool: pool.to_owned(),
        device: device.to_owned(),
        share_id: share_id.map(str::to_owned),
        consumed_capacity: (!consumed.is_empty())
            .then(|| consumed.iter().map(|(k, v)| ((*k).to_owned(), Quantity((*v).to_owned()))).collect()),
        ..Default::default()
    }
}

/// `claim` with `results` as its allocation and reserved for the pods `consumers` (UIDs).
pub fn allocated(
    mut claim: ResourceClaim,
    results: Vec<k8s_openapi::api::resource::v1::DeviceRequestAllocationResult>,
    consumers: &[&str],
) -> ResourceClaim {
    use k8s_openapi::api::resource::v1::{
        AllocationResult, DeviceAllocationResult, ResourceClaimConsumerReference, ResourceClaimStatus,
    };
    claim.status = Some(ResourceClaimStatus {
        allocation: Some(AllocationResult {
            devices: Some(DeviceAllocationResult { results: Some(results), config: None }),
            ..Default::default()
        }),
        reserved_for: Some(
            consumers
                .iter()
                .map(|uid| ResourceClaimConsumerReference {
                    resource: "pods".to_owned(),
                    name: format!("pod-{uid}"),
                    uid: (*uid).to_owned(),
                    api_group: None,
                })
                .collect(),
        ),
        ..Default::default()
    });
    claim
}
