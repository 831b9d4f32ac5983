//! The API-server seam of the admission routes (the vGPU webhook's and the GPU module controller's): what `/pods/validate` reads (ResourceClaims, ResourceClaimTemplates,
//! DeviceClasses, reserved pods) and writes (the ResourceClaims of converted pods), and what the Volcano Job
//! routes write (the ResourceClaimTemplates of converted Jobs, and the Job as their owner).
//!
//! | method | request ([`KubeApi`]) |
//! |---|---|
//! | [`ClusterApi::get_claim`] | `GET /apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}` (404 → `None`) |
//! | [`ClusterApi::get_claim_template`] | `GET /apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaimtemplates/{name}` |
//! | [`ClusterApi::get_device_class`] | `GET /apis/resource.k8s.io/v1/deviceclasses/{name}` |
//! | [`ClusterApi::get_pod`] | `GET /api/v1/namespaces/{ns}/pods/{name}` |
//! | [`ClusterApi::create_claim`] | `POST /apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims` (`?dryRun=All` on a dry run) |
//! | [`ClusterApi::delete_claim`] | `DELETE /apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}` (404 is success) |
//! | [`ClusterApi::create_claim_template`] | `POST /apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaimtemplates` (`?dryRun=All` on a dry run) |
//! | [`ClusterApi::delete_claim_template`] | `DELETE /apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaimtemplates/{name}` (404 is success) |
//! | [`ClusterApi::set_template_owner`] | `GET` the template, then, when it has no controller, `PUT` it with the owner added (the read `resourceVersion` guards the write; a conflict is retried) |
//!
//! The templates are those of converted Volcano Jobs (the webhook's `volcano` module). [`MemoryApi`] keeps the same objects
//! in maps, for tests, with failure injection on create.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceClaimTemplate};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, PostParams};

/// A failed API call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{action}: {message}")]
pub struct ApiError {
    /// What was being done, e.g. `create ResourceClaim ml/web-main-1a2b3c4d`.
    pub action: String,
    /// The API server's (or the transport's) message.
    pub message: String,
    /// The object already exists (409 AlreadyExists).
    pub already_exists: bool,
}

impl ApiError {
    fn new(action: impl Into<String>, message: impl Into<String>) -> Self {
        Self { action: action.into(), message: message.into(), already_exists: false }
    }
}

/// What [`ClusterApi::set_template_owner`] found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OwnerUpdate {
    /// The template had no controller; the owner was added.
    Adopted,
    /// The template is already controlled by this owner (same UID).
    AlreadyOwned,
    /// The template is controlled by another object (its kind and name); left alone.
    OtherController(String),
    /// The template does not exist.
    NotFound,
}

/// The controller among `refs`, if any.
fn controller(refs: Option<&Vec<OwnerReference>>) -> Option<&OwnerReference> {
    refs?.iter().find(|r| r.controller == Some(true))
}

/// What adding `owner` as the controller of an object with these owner references does: `None` when it is to be
/// added, else the outcome without a write.
fn owner_decision(refs: Option<&Vec<OwnerReference>>, owner: &OwnerReference) -> Option<OwnerUpdate> {
    controller(refs).map(|c| {
        if c.uid == owner.uid {
            OwnerUpdate::AlreadyOwned
        } else {
            OwnerUpdate::OtherController(format!("{} {}", c.kind, c.name))
        }
    })
}

/// What the routes read and write in the cluster.
pub trait ClusterApi: Send + Sync + 'static {
    /// A ResourceClaim, `None` when it does not exist.
    fn get_claim(
        &self,
        ns: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<ResourceClaim>, ApiError>> + Send;
    /// A ResourceClaimTemplate, `None` when it does not exist.
    fn get_claim_template(
        &self,
        ns: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<ResourceClaimTemplate>, ApiError>> + Send;
    /// A DeviceClass, `None` when it does not exist.
    fn get_device_class(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<Option<DeviceClass>, ApiError>> + Send;
    /// A pod, `None` when it does not exist.
    fn get_pod(&self, ns: &str, name: &str) -> impl Future<Output = Result<Option<Pod>, ApiError>> + Send;
    /// Creates a ResourceClaim (validated but not stored when `dry_run`).
    fn create_claim(
        &self,
        claim: &ResourceClaim,
        dry_run: bool,
    ) -> impl Future<Output = Result<(), ApiError>> + Send;
    /// Deletes a ResourceClaim; one that does not exist is no error.
    fn delete_claim(&self, ns: &str, name: &str) -> impl Future<Output = Result<(), ApiError>> + Send;
    /// Creates a ResourceClaimTemplate (validated but not stored when `dry_run`).
    fn create_claim_template(
        &self,
        template: &ResourceClaimTemplate,
        dry_run: bool,
    ) -> impl Future<Output = Result<(), ApiError>> + Send;
    /// Deletes a ResourceClaimTemplate; one that does not exist is no error.
    fn delete_claim_template(
        &self,
        ns: &str,
        name: &str,
    ) -> impl Future<Output = Result<(), ApiError>> + Send;
    /// Makes `owner` (with `controller: true`) the controller of a ResourceClaimTemplate that has none; a
    /// template with a controller is left as it is ([`OwnerUpdate`]).
    fn set_template_owner(
        &self,
        ns: &str,
        name: &str,
        owner: &OwnerReference,
    ) -> impl Future<Output = Result<OwnerUpdate, ApiError>> + Send;
}

/// Attempts of [`KubeApi::set_template_owner`] when the template changes between its read and its write.
const OWNER_ATTEMPTS: usize = 3;

// === impl KubeApi ===

/// [`ClusterApi`] over a `kube::Client`.
#[derive(Clone)]
pub struct KubeApi {
    client: kube::Client,
}

impl fmt::Debug for KubeApi {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KubeApi").finish_non_exhaustive()
    }
}

impl KubeApi {
    /// Uses `client` for every call.
    pub fn new(client: kube::Client) -> Self {
        Self { client }
    }

    /// Creates a namespaced `object` of `kind` (validated but not stored when `dry_run`).
    async fn create<K>(&self, kind: &str, object: &K, dry_run: bool) -> Result<(), ApiError>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + serde::Serialize
            + serde::de::DeserializeOwned
            + fmt::Debug,
    {
        let ns = object.meta().namespace.clone().unwrap_or_default();
        let name = object.meta().name.clone().unwrap_or_default();
        let api: Api<K> = Api::namespaced(self.client.clone(), &ns);
        let params = PostParams { dry_run, ..PostParams::default() };
        api.create(&params, object)
            .await
            .map(drop)
            .map_err(|e| kube_error(format!("create {kind} {ns}/{name}"), e))
    }

    /// Deletes the namespaced object `ns/name` of `kind`; one that does not exist is no error.
    async fn delete<K>(&self, kind: &str, ns: &str, name: &str) -> Result<(), ApiError>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
            + Clone
            + serde::de::DeserializeOwned
            + fmt::Debug,
    {
        let api: Api<K> = Api::namespaced(self.client.clone(), ns);
        match api.delete(name, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(kube_error(format!("delete {kind} {ns}/{name}"), e)),
        }
    }
}

fn kube_error(action: String, e: kube::Error) -> ApiError {
    let already_exists = matches!(&e, kube::Error::Api(s) if s.code == 409);
    ApiError { action, message: e.to_string(), already_exists }
}

impl ClusterApi for KubeApi {
    async fn get_claim(&self, ns: &str, name: &str) -> Result<Option<ResourceClaim>, ApiError> {
        let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), ns);
        api.get_opt(name).await.map_err(|e| kube_error(format!("get ResourceClaim {ns}/{name}"), e))
    }

    async fn get_claim_template(
        &self,
        ns: &str,
        name: &str,
    ) -> Result<Option<ResourceClaimTemplate>, ApiError> {
        let api: Api<ResourceClaimTemplate> = Api::namespaced(self.client.clone(), ns);
        api.get_opt(name).await.map_err(|e| kube_error(format!("get ResourceClaimTemplate {ns}/{name}"), e))
    }

    async fn get_device_class(&self, name: &str) -> Result<Option<DeviceClass>, ApiError> {
        let api: Api<DeviceClass> = Api::all(self.client.clone());
        api.get_opt(name).await.map_err(|e| kube_error(format!("get DeviceClass {name}"), e))
    }

    async fn get_pod(&self, ns: &str, name: &str) -> Result<Option<Pod>, ApiError> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        api.get_opt(name).await.map_err(|e| kube_error(format!("get Pod {ns}/{name}"), e))
    }

    async fn create_claim(&self, claim: &ResourceClaim, dry_run: bool) -> Result<(), ApiError> {
        self.create("ResourceClaim", claim, dry_run).await
    }

    async fn delete_claim(&self, ns: &str, name: &str) -> Result<(), ApiError> {
        self.delete::<ResourceClaim>("ResourceClaim", ns, name).await
    }

    async fn create_claim_template(
        &self,
        template: &ResourceClaimTemplate,
        dry_run: bool,
    ) -> Result<(), ApiError> {
        self.create("ResourceClaimTemplate", template, dry_run).await
    }

    async fn delete_claim_template(&self, ns: &str, name: &str) -> Result<(), ApiError> {
        self.delete::<ResourceClaimTemplate>("ResourceClaimTemplate", ns, name).await
    }

    async fn set_template_owner(
        &self,
        ns: &str,
        name: &str,
        owner: &OwnerReference,
    ) -> Result<OwnerUpdate, ApiError> {
        let api: Api<ResourceClaimTemplate> = Api::namespaced(self.client.clone(), ns);
        let action = format!("set the owner of ResourceClaimTemplate {ns}/{name}");
        let mut attempt = 0;
        loop {
            attempt += 1;
            let Some(mut template) = api.get_opt(name).await.map_err(|e| kube_error(action.clone(), e))?
            else {
                return Ok(OwnerUpdate::NotFound);
            };
            if let Some(done) = owner_decision(template.metadata.owner_references.as_ref(), owner) {
                return Ok(done);
            }
            template.metadata.owner_references.get_or_insert_with(Vec::new).push(owner.clone());
            match api.replace(name, &PostParams::default(), &template).await {
                Ok(_) => return Ok(OwnerUpdate::Adopted),
                Err(kube::Error::Api(s)) if s.code == 409 && attempt < OWNER_ATTEMPTS => continue,
                Err(kube::Error::Api(s)) if s.code == 404 => return Ok(OwnerUpdate::NotFound),
                Err(e) => return Err(kube_error(action, e)),
            }
        }
    }
}

// === impl MemoryApi ===

#[derive(Debug, Default)]
struct MemoryState {
    claims: BTreeMap<(String, String), ResourceClaim>,
    templates: BTreeMap<(String, String), ResourceClaimTemplate>,
    classes: BTreeMap<String, DeviceClass>,
    pods: BTreeMap<(String, String), Pod>,
    pass_creates: u32,
    fail_creates: u32,
    creates: u32,
    deletes: Vec<(String, String)>,
    template_deletes: Vec<(String, String)>,
}

impl MemoryState {
    /// Whether this create fails ([`MemoryApi::fail_creates_after`]).
    fn injected_failure(&mut self) -> bool {
        if self.pass_creates > 0 {
            self.pass_creates -= 1;
            return false;
        }
        if self.fail_creates > 0 {
            self.fail_creates -= 1;
            return true;
        }
        false
    }

    /// A create of `object` (`kind`, keyed by its metadata) into the map `map` picks: counted, failed when
    /// injected, refused when the name is taken, stored unless `dry_run`.
    fn create<T: kube::Resource + Clone>(
        &mut self,
        kind: &str,
        object: &T,
        dry_run: bool,
        map: fn(&mut Self) -> &mut BTreeMap<(String, String), T>,
    ) -> Result<(), ApiError> {
        let meta = object.meta();
        let k = key(meta.namespace.as_ref(), meta.name.as_ref());
        let action = format!("create {kind} {}/{}", k.0, k.1);
        self.creates += 1;
        if self.injected_failure() {
            return Err(ApiError::new(action, "injected failure"));
        }
        let objects = map(self);
        if objects.contains_key(&k) {
            return Err(ApiError { already_exists: true, ..ApiError::new(action, "already exists") });
        }
        if !dry_run {
            objects.insert(k, object.clone());
        }
        Ok(())
    }
}

/// [`ClusterApi`] over in-memory maps, for tests.
#[derive(Debug, Clone, Default)]
pub struct MemoryApi {
    state: Arc<Mutex<MemoryState>>,
}

fn key(ns: Option<&String>, name: Option<&String>) -> (String, String) {
    (ns.cloned().unwrap_or_default(), name.cloned().unwrap_or_default())
}

impl MemoryApi {
    /// Empty maps.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, MemoryState> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Stores a ResourceClaim.
    pub fn put_claim(&self, claim: ResourceClaim) {
        let k = key(claim.metadata.namespace.as_ref(), claim.metadata.name.as_ref());
        self.lock().claims.insert(k, claim);
    }

    /// Stores a ResourceClaimTemplate.
    pub fn put_template(&self, template: ResourceClaimTemplate) {
        let k = key(template.metadata.namespace.as_ref(), template.metadata.name.as_ref());
        self.lock().templates.insert(k, template);
    }

    /// Stores a DeviceClass.
    pub fn put_device_class(&self, class: DeviceClass) {
        let name = class.metadata.name.clone().unwrap_or_default();
        self.lock().classes.insert(name, class);
    }

    /// Stores a pod.
    pub fn put_pod(&self, pod: Pod) {
        let k = key(pod.metadata.namespace.as_ref(), pod.metadata.name.as_ref());
        self.lock().pods.insert(k, pod);
    }

    /// Every stored ResourceClaim, by namespace and name.
    pub fn claims(&self) -> Vec<ResourceClaim> {
        self.lock().claims.values().cloned().collect()
    }

    /// Every stored ResourceClaimTemplate, by namespace and name.
    pub fn templates(&self) -> Vec<ResourceClaimTemplate> {
        self.lock().templates.values().cloned().collect()
    }

    /// ResourceClaimTemplates deleted so far, in order.
    pub fn deleted_templates(&self) -> Vec<(String, String)> {
        self.lock().template_deletes.clone()
    }

    /// The next `n` creates (of ResourceClaims or ResourceClaimTemplates) fail (after which creates succeed
    /// again).
    pub fn fail_next_creates(&self, n: u32) {
        self.fail_creates_after(0, n);
    }

    /// The next `succeed` creates (of ResourceClaims or ResourceClaimTemplates) go through, the `fail` after
    /// them fail, the rest go through again.
    pub fn fail_creates_after(&self, succeed: u32, fail: u32) {
        let mut s = self.lock();
        s.pass_creates = succeed;
        s.fail_creates = fail;
    }

    /// Create calls so far, claims and templates (dry runs included, failed ones too).
    pub fn create_calls(&self) -> u32 {
        self.lock().creates
    }

    /// Claims deleted so far, in order.
    pub fn deleted(&self) -> Vec<(String, String)> {
        self.lock().deletes.clone()
    }
}

impl ClusterApi for MemoryApi {
    async fn get_claim(&self, ns: &str, name: &str) -> Result<Option<ResourceClaim>, ApiError> {
        Ok(self.lock().claims.get(&(ns.to_owned(), name.to_owned())).cloned())
    }

    async fn get_claim_template(
        &self,
        ns: &str,
        name: &str,
    ) -> Result<Option<ResourceClaimTemplate>, ApiError> {
        Ok(self.lock().templates.get(&(ns.to_owned(), name.to_owned())).cloned())
    }

    async fn get_device_class(&self, name: &str) -> Result<Option<DeviceClass>, ApiError> {
        Ok(self.lock().classes.get(name).cloned())
    }

    async fn get_pod(&self, ns: &str, name: &str) -> Result<Option<Pod>, ApiError> {
        Ok(self.lock().pods.get(&(ns.to_owned(), name.to_owned())).cloned())
    }

    async fn create_claim(&self, claim: &ResourceClaim, dry_run: bool) -> Result<(), ApiError> {
        self.lock().create("ResourceClaim", claim, dry_run, |s| &mut s.claims)
    }

    async fn delete_claim(&self, ns: &str, name: &str) -> Result<(), ApiError> {
        let mut s = self.lock();
        s.deletes.push((ns.to_owned(), name.to_owned()));
        s.claims.remove(&(ns.to_owned(), name.to_owned()));
        Ok(())
    }

    async fn create_claim_template(
        &self,
        template: &ResourceClaimTemplate,
        dry_run: bool,
    ) -> Result<(), ApiError> {
        self.lock().create("ResourceClaimTemplate", template, dry_run, |s| &mut s.templates)
    }

    async fn delete_claim_template(&self, ns: &str, name: &str) -> Result<(), ApiError> {
        let mut s = self.lock();
        s.template_deletes.push((ns.to_owned(), name.to_owned()));
        s.templates.remove(&(ns.to_owned(), name.to_owned()));
        Ok(())
    }

    async fn set_template_owner(
        &self,
        ns: &str,
        name: &str,
        owner: &OwnerReference,
    ) -> Result<OwnerUpdate, ApiError> {
        let mut s = self.lock();
        let Some(template) = s.templates.get_mut(&(ns.to_owned(), name.to_owned())) else {
            return Ok(OwnerUpdate::NotFound);
        };
        if let Some(done) = owner_decision(template.metadata.owner_references.as_ref(), owner) {
            return Ok(done);
        }
        template.metadata.owner_references.get_or_insert_with(Vec::new).push(owner.clone());
        Ok(OwnerUpdate::Adopted)
    }
}
