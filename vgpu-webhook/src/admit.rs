//! The admission routes from body to answer: decode ([`vgpu_serve::admission`]), fetch what the rules need
//! through a [`ClusterApi`], call the pure rules ([`crate::mutate`], [`crate::validate`],
//! [`crate::convert`]), answer.
//!
//! | route | operations | does |
//! |---|---|---|
//! | `/pods/mutate` | CREATE | [`crate::mutate::pod_patch`]; other operations are allowed unchanged |
//! | `/pods/validate` | CREATE | with `--dra-admission-enabled`: the sharing rules ([`crate::validate::check_pod_sharing`], [`crate::validate::check_cross_pod`]); with `--default-convert2-dra`: creates the ResourceClaims the pod's `original-resources` record names (all or none: claims created before a failure are deleted again) |
//! | `/pods/validate` | DELETE | with `--default-convert2-dra`: deletes those ResourceClaims (not on a dry run) |
//! | `/resourceclaims/validate` | CREATE, UPDATE | opaque configs of `resource.k8s.io/v1` ResourceClaims and ResourceClaimTemplates ([`crate::validate::check_opaque_configs`]) |
//! | `/resourceclaims/validate` | UPDATE of `resourceclaims/status` | with `--dra-admission-enabled`: the sharing rules of the allocated vGPU requests across the reserved pods ([`crate::validate::check_allocated_sharing`]) |
//! | `/volcano-jobs/mutate` | CREATE | with `--default-convert2-dra`: [`crate::volcano::job_patch`] |
//! | `/volcano-jobs/mutate` | UPDATE | with `--default-convert2-dra`, not on a dry run, for a Job with a record: the Job becomes the controller of each recorded template its tasks reference ([`ClusterApi::set_template_owner`]); tasks whose templates are all its own leave the record; API errors are logged, never refuse the update |
//! | `/volcano-jobs/validate` | CREATE | with `--default-convert2-dra`: creates the ResourceClaimTemplates of the Job's record ([`crate::volcano::planned_templates`]), all or none |
//! | `/volcano-jobs/validate` | DELETE | with `--default-convert2-dra`, not on a dry run: deletes the recorded templates the tasks reference |
//!
//! A claim (template) that already exists with this pod's (Job's) owner key counts as created (the API server
//! may call the webhook again for the same object); one of another owner denies the object.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{DeviceClass, DeviceRequest, ResourceClaim, ResourceClaimTemplate};
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionReview, Operation};
use vgpu_core::domain::{ORIGINAL_RESOURCES_ANNOTATION, OWNER_KEY_LABEL};

use crate::config::WebhookConfig;
use crate::convert::ClaimSource;
use crate::convert::{self, ResourceInfo};
use crate::mutate;
use crate::validate::{self, PodClaimRequests, RequestClass};
use crate::volcano::{self, VolcanoJob};
use vgpu_api::pod::{containers, owner_key};
use vgpu_kube::claims::{ApiError, ClusterApi, OwnerUpdate};
use vgpu_serve::admission::{self as review, Denial, ReviewError};

/// Milliseconds since the Unix epoch (the `create-timestamp` label).
pub type Clock = Arc<dyn Fn() -> u128 + Send + Sync>;

fn system_clock() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis())
}

/// The webhook: its configuration and its cluster seam.
pub struct Admission<C> {
    config: WebhookConfig,
    api: C,
    clock: Clock,
}

impl<C> fmt::Debug for Admission<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Admission").field("config", &self.config).finish_non_exhaustive()
    }
}

fn deny_api(e: ApiError) -> Denial {
    Denial::new(e.to_string())
}

impl<C: ClusterApi> Admission<C> {
    /// A webhook with this configuration over `api`.
    pub fn new(config: WebhookConfig, api: C) -> Self {
        Self { config, api, clock: Arc::new(system_clock) }
    }

    /// Uses `clock` for the `create-timestamp` label (tests).
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// The configuration.
    pub fn config(&self) -> &WebhookConfig {
        &self.config
    }

    /// The cluster seam.
    pub fn api(&self) -> &C {
        &self.api
    }

    /// `/pods/mutate`.
    pub fn mutate_pods(&self, body: &[u8]) -> Result<AdmissionReview<DynamicObject>, ReviewError> {
        let req = review::decode::<Pod>(body)?;
        let outcome = match (&req.operation, &req.object) {
            (Operation::Create, Some(pod)) => mutate::pod_patch(&self.config, &req.uid, pod).map(Some),
            _ => Ok(None),
        };
        if let Err(d) = &outcome {
            tracing::info!(uid = %req.uid, namespace = ?req.namespace, message = %d.message, "pod denied");
        }
        Ok(review::respond(&req, outcome))
    }

    /// `/pods/validate`.
    pub async fn validate_pods(&self, body: &[u8]) -> Result<AdmissionReview<DynamicObject>, ReviewError> {
        let req = review::decode::<Pod>(body)?;
        let outcome = match req.operation {
            Operation::Create => match &req.object {
                Some(pod) => self.validate_create(&req, with_identity(pod, &req)).await,
                None => Ok(()),
            },
            Operation::Delete => match &req.old_object {
                Some(pod) if self.config.convert_to_dra && !req.dry_run => {
                    self.delete_claims(&with_identity(pod, &req)).await;
                    Ok(())
                }
                _ => Ok(()),
            },
            _ => Ok(()),
        };
        if let Err(d) = &outcome {
            tracing::info!(uid = %req.uid, namespace = ?req.namespace, name = %req.name, message = %d.message, "pod denied");
        }
        Ok(review::respond(&req, outcome.map(|()| None)))
    }

    async fn validate_create(&self, req: &AdmissionRequest<Pod>, pod: Pod) -> Result<(), Denial> {
        if self.config.dra_admission && has_pod_claims(&pod) {
            let converted = record(&pod).and_then(Result::ok).unwrap_or_default();
            let mut cache = ClaimCache::default();
            let resolved = self.resolve_pod_claims(&pod, &converted, &mut cache).await?;
            validate::check_pod_sharing(&pod, &converted, &resolved)?;
            self.check_cross_pod(&pod, &converted, &mut cache).await?;
        }
        if self.config.convert_to_dra {
            self.create_claims(&pod, req.dry_run).await?;
        }
        Ok(())
    }

    async fn device_classes(&self, requests: &[DeviceRequest], cache: &mut ClaimCache) -> Result<(), Denial> {
        let mut names: Vec<&str> = Vec::new();
        for r in requests {
            if let Some(e) = &r.exactly {
                names.push(&e.device_class_name);
            }
            names.extend(r.first_available.iter().flatten().map(|s| s.device_class_name.as_str()));
        }
        for name in names {
            if name == self.config.device_class_name
                || name.is_empty()
                || cache.fetched_classes.contains(name)
            {
                continue;
            }
            cache.fetched_classes.insert(name.to_owned());
            if let Some(class) = self.api.get_device_class(name).await.map_err(deny_api)? {
                cache.classes.insert(name.to_owned(), class);
            }
        }
        Ok(())
    }

    async fn claim(
        &self,
        ns: &str,
        name: &str,
        cache: &mut ClaimCache,
    ) -> Result<Option<ResourceClaim>, Denial> {
        if let Some(c) = cache.claims.get(name) {
            return Ok(c.clone());
        }
        let c = self.api.get_claim(ns, name).await.map_err(deny_api)?;
        cache.claims.insert(name.to_owned(), c.clone());
        Ok(c)
    }

    async fn resolve_pod_claims(
        &self,
        pod: &Pod,
        converted: &[ResourceInfo],
        cache: &mut ClaimCache,
    ) -> Result<BTreeMap<String, PodClaimRequests>, Denial> {
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let mut out = BTreeMap::new();
        for pc in pod.spec.as_ref().and_then(|s| s.resource_claims.as_ref()).into_iter().flatten() {
            if converted.iter().any(|i| i.claim_name == pc.name) {
                continue;
            }
            let requests = if let Some(name) = pc.resource_claim_name.as_deref().filter(|n| !n.is_empty()) {
                self.claim(&ns, name, cache)
                    .await?
                    .map(|c| c.spec.and_then(|s| s.devices).and_then(|d| d.requests).unwrap_or_default())
            } else if let Some(name) = pc.resource_claim_template_name.as_deref().filter(|n| !n.is_empty()) {
                self.api.get_claim_template(&ns, name).await.map_err(deny_api)?.map(
                    |t: ResourceClaimTemplate| {
                        t.spec
                            .and_then(|s| s.spec)
                            .and_then(|s| s.devices)
                            .and_then(|d| d.requests)
                            .unwrap_or_default()
                    },
                )
            } else {
                None
            };
            let entry = match requests {
                Some(requests) => {
                    self.device_classes(&requests, cache).await?;
                    PodClaimRequests::Found(validate::classify(
                        &requests,
                        &self.config.device_class_name,
                        &cache.classes,
                    ))
                }
                None => PodClaimRequests::Missing,
            };
            out.insert(pc.name.clone(), entry);
        }
        Ok(out)
    }

    async fn check_cross_pod(
        &self,
        pod: &Pod,
        converted: &[ResourceInfo],
        cache: &mut ClaimCache,
    ) -> Result<(), Denial> {
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        for pc in pod.spec.as_ref().and_then(|s| s.resource_claims.as_ref()).into_iter().flatten() {
            let Some(actual) = pc.resource_claim_name.as_deref().filter(|n| !n.is_empty()) else { continue };
            if converted.iter().any(|i| i.claim_name == pc.name) {
                continue;
            }
            let Some(claim) = self.claim(&ns, actual, cache).await? else { continue };
            let reserved_for = claim.status.as_ref().and_then(|s| s.reserved_for.clone()).unwrap_or_default();
            if reserved_for.is_empty() {
                continue;
            }
            let requests = claim
                .spec
                .as_ref()
                .and_then(|s| s.devices.as_ref())
                .and_then(|d| d.requests.clone())
                .unwrap_or_default();
            self.device_classes(&requests, cache).await?;
            let index = validate::classify(&requests, &self.config.device_class_name, &cache.classes);
            if !index.values().any(|c| *c == RequestClass::Vgpu) {
                continue;
            }
            let mut reserved = Vec::new();
            for r in reserved_for {
                if r.api_group.as_deref().is_some_and(|g| !g.is_empty()) || r.resource != "pods" {
                    continue;
                }
                let claim_ns = claim.metadata.namespace.as_deref().unwrap_or(&ns);
                let Some(other) = self.api.get_pod(claim_ns, &r.name).await.map_err(deny_api)? else {
                    continue;
                };
                if !r.uid.is_empty() && other.metadata.uid.as_deref() != Some(r.uid.as_str()) {
                    continue;
                }
                reserved.push(other);
            }
            validate::check_cross_pod(pod, &pc.name, &claim, &index, &reserved)?;
        }
        Ok(())
    }

    async fn create_claims(&self, pod: &Pod, dry_run: bool) -> Result<(), Denial> {
        let infos = match record(pod) {
            None => return Ok(()),
            Some(Err(e)) => return Err(Denial::new(e.to_string())),
            Some(Ok(infos)) if infos.is_empty() => return Ok(()),
            Some(Ok(infos)) => infos,
        };
        let claims = planned_claims(&self.config, pod, &infos, (self.clock)())?;
        let objects: Vec<Generated<'_>> = claims.iter().map(Generated::Claim).collect();
        self.create_all(&objects, "pod", &owner_key(pod), dry_run).await
    }

    /// Creates `objects` (all or none: on a failure those created are deleted again). One that already exists
    /// with the owner-key label `owner` counts as created (a retried admission); one of another owner denies.
    async fn create_all(
        &self,
        objects: &[Generated<'_>],
        owner_noun: &str,
        owner: &str,
        dry_run: bool,
    ) -> Result<(), Denial> {
        let mut created: Vec<Generated<'_>> = Vec::new();
        for &object in objects {
            let result = match object {
                Generated::Claim(c) => self.api.create_claim(c, dry_run).await,
                Generated::Template(t) => self.api.create_claim_template(t, dry_run).await,
            };
            match result {
                Ok(()) => created.push(object),
                Err(e) if e.already_exists => {
                    if self.existing_owner(object).await.as_deref() != Some(owner) {
                        self.roll_back(&created, dry_run).await;
                        return Err(Denial::new(format!(
                            "{e}: {} {} exists and does not belong to {owner_noun} {owner} (label {OWNER_KEY_LABEL})",
                            object.kind_name(),
                            object.key()
                        )));
                    }
                }
                Err(e) => {
                    self.roll_back(&created, dry_run).await;
                    return Err(deny_api(e));
                }
            }
        }
        if !dry_run {
            let created: Vec<String> =
                created.iter().map(|o| format!("{} {}", o.kind_name(), o.key())).collect();
            tracing::info!(owner = %owner, ?created, "created vGPU ResourceClaims/ResourceClaimTemplates");
        }
        Ok(())
    }

    /// The owner-key label of the stored object named like `object` (`None` when it cannot be read).
    async fn existing_owner(&self, object: Generated<'_>) -> Option<String> {
        let (ns, name) = object.namespace_name();
        let labels = match object {
            Generated::Claim(_) => self.api.get_claim(ns, name).await.ok().flatten()?.metadata.labels,
            Generated::Template(_) => {
                self.api.get_claim_template(ns, name).await.ok().flatten()?.metadata.labels
            }
        };
        labels?.remove(OWNER_KEY_LABEL)
    }

    async fn roll_back(&self, created: &[Generated<'_>], dry_run: bool) {
        if dry_run {
            return;
        }
        for object in created {
            let (ns, name) = object.namespace_name();
            let result = match object {
                Generated::Claim(_) => self.api.delete_claim(ns, name).await,
                Generated::Template(_) => self.api.delete_claim_template(ns, name).await,
            };
            if let Err(e) = result {
                tracing::warn!(error = %e, "could not delete a generated object after a failed admission");
            }
        }
    }

    async fn delete_claims(&self, pod: &Pod) {
        let Some(Ok(infos)) = record(pod) else { return };
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        for (name, listed) in mutate::recorded_claims(pod.spec.as_ref(), &infos, ClaimSource::Claim) {
            if !listed {
                continue;
            }
            if let Err(e) = self.api.delete_claim(&ns, &name).await {
                tracing::warn!(error = %e, "could not delete the ResourceClaim of a deleted pod");
            }
        }
    }

    /// `/volcano-jobs/mutate` ([`crate::volcano`]): with `--default-convert2-dra`, the conversion patch on
    /// CREATE and the template adoption on UPDATE (not on a dry run); every other request is allowed unchanged.
    pub async fn mutate_volcano_jobs(
        &self,
        body: &[u8],
    ) -> Result<AdmissionReview<DynamicObject>, ReviewError> {
        let req = review::decode::<DynamicObject>(body)?;
        let outcome = match (&req.operation, &req.object) {
            _ if !self.config.convert_to_dra => Ok(None),
            (Operation::Create, Some(obj)) => volcano_job(&req, obj)
                .and_then(|job| volcano::job_patch(&self.config, &req.uid, &job))
                .map(Some),
            (Operation::Update, Some(obj)) if !req.dry_run && has_job_record(obj) => {
                match volcano_job(&req, obj) {
                    Ok(job) => self.adopt_templates(&job).await.map(Some),
                    Err(d) => Err(d),
                }
            }
            _ => Ok(None),
        };
        if let Err(d) = &outcome {
            tracing::info!(uid = %req.uid, namespace = ?req.namespace, name = %req.name, message = %d.message, "Volcano Job denied");
        }
        Ok(review::respond(&req, outcome))
    }

    /// `/volcano-jobs/validate` ([`crate::volcano`]): with `--default-convert2-dra`, creates the recorded
    /// ResourceClaimTemplates on CREATE (all or none) and deletes them on DELETE (not on a dry run).
    pub async fn validate_volcano_jobs(
        &self,
        body: &[u8],
    ) -> Result<AdmissionReview<DynamicObject>, ReviewError> {
        let req = review::decode::<DynamicObject>(body)?;
        let outcome = match (&req.operation, &req.object, &req.old_object) {
            _ if !self.config.convert_to_dra => Ok(()),
            (Operation::Create, Some(obj), _) => match volcano_job(&req, obj) {
                Ok(job) => self.create_templates(&job, req.dry_run).await,
                Err(d) => Err(d),
            },
            (Operation::Delete, _, Some(old)) if !req.dry_run => {
                match volcano_job(&req, old) {
                    Ok(job) => self.delete_templates(&job).await,
                    Err(d) => tracing::warn!(message = %d.message, "cannot read a deleted Volcano Job"),
                }
                Ok(())
            }
            _ => Ok(()),
        };
        if let Err(d) = &outcome {
            tracing::info!(uid = %req.uid, namespace = ?req.namespace, name = %req.name, message = %d.message, "Volcano Job denied");
        }
        Ok(review::respond(&req, outcome.map(|()| None)))
    }

    async fn create_templates(&self, job: &VolcanoJob, dry_run: bool) -> Result<(), Denial> {
        let record = match volcano::job_record(job) {
            None => return Ok(()),
            Some(Err(e)) => return Err(Denial::new(e.to_string())),
            Some(Ok(record)) => record,
        };
        let templates = volcano::planned_templates(&self.config, job, &record, (self.clock)())?;
        let objects: Vec<Generated<'_>> = templates.iter().map(Generated::Template).collect();
        let owner = format!("{}-{}", job.metadata.namespace.as_deref().unwrap_or_default(), job.name());
        self.create_all(&objects, "Job", &owner, dry_run).await
    }

    async fn delete_templates(&self, job: &VolcanoJob) {
        let Some(Ok(record)) = volcano::job_record(job) else { return };
        let ns = job.metadata.namespace.clone().unwrap_or_default();
        for (task_name, infos) in &record {
            let Some((_, task)) = job.task(task_name) else { continue };
            for (name, referenced) in volcano::recorded_templates(task, infos) {
                if !referenced {
                    continue;
                }
                if let Err(e) = self.api.delete_claim_template(&ns, &name).await {
                    tracing::warn!(error = %e, "could not delete the ResourceClaimTemplate of a deleted Volcano Job");
                }
            }
        }
    }

    /// UPDATE: the Job becomes the controller of the recorded templates its tasks reference; tasks whose
    /// templates are all owned by it leave the record. API errors are logged and leave the task in the record
    /// (the next update tries again): an update of the Job is never refused for them.
    async fn adopt_templates(&self, job: &VolcanoJob) -> Result<json_patch::Patch, Denial> {
        let unchanged = json_patch::Patch(Vec::new());
        let (Some(Ok(record)), Some(owner)) = (volcano::job_record(job), volcano::owner_reference(job))
        else {
            return Ok(unchanged);
        };
        let ns = job.metadata.namespace.clone().unwrap_or_default();
        let mut kept = record.clone();
        for (task_name, infos) in &record {
            let Some((_, task)) = job.task(task_name) else { continue };
            let mut all_owned = true;
            for (name, referenced) in volcano::recorded_templates(task, infos) {
                if !referenced {
                    all_owned = false;
                    continue;
                }
                match self.api.set_template_owner(&ns, &name, &owner).await {
                    Ok(OwnerUpdate::Adopted | OwnerUpdate::AlreadyOwned) => {}
                    Ok(OwnerUpdate::NotFound) => all_owned = false,
                    Ok(OwnerUpdate::OtherController(other)) => {
                        tracing::warn!(template = %name, controller = %other, "a Volcano Job's ResourceClaimTemplate has another controller");
                        all_owned = false;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "could not make a Volcano Job the owner of its ResourceClaimTemplate");
                        all_owned = false;
                    }
                }
            }
            if all_owned {
                kept.remove(task_name);
            }
        }
        if kept == record {
            return Ok(unchanged);
        }
        volcano::patch_between(job, &volcano::with_record(job, &kept))
    }

    /// `/resourceclaims/validate`.
    pub async fn validate_claims(&self, body: &[u8]) -> Result<AdmissionReview<DynamicObject>, ReviewError> {
        let req = review::decode::<DynamicObject>(body)?;
        let outcome = match (&req.operation, &req.object) {
            (Operation::Create | Operation::Update, Some(obj)) => match check_claim_object(&req, obj) {
                Ok(Some(claim))
                    if self.config.dra_admission
                        && req.operation == Operation::Update
                        && req.sub_resource.as_deref() == Some("status") =>
                {
                    self.check_allocated(&claim).await
                }
                Ok(_) => Ok(()),
                Err(d) => Err(d),
            },
            _ => Ok(()),
        };
        if let Err(d) = &outcome {
            tracing::info!(uid = %req.uid, namespace = ?req.namespace, name = %req.name, message = %d.message, "claim denied");
        }
        Ok(review::respond(&req, outcome.map(|()| None)))
    }

    /// The sharing rules of an allocated claim across the pods it is reserved for
    /// ([`validate::check_allocated_sharing`]).
    async fn check_allocated(&self, claim: &ResourceClaim) -> Result<(), Denial> {
        if claim.status.as_ref().and_then(|s| s.allocation.as_ref()).is_none() {
            return Ok(());
        }
        let ns = claim.metadata.namespace.clone().unwrap_or_default();
        let name = claim.metadata.name.clone().unwrap_or_default();
        let mut cache = ClaimCache::default();
        let requests = claim
            .spec
            .as_ref()
            .and_then(|s| s.devices.as_ref())
            .and_then(|d| d.requests.clone())
            .unwrap_or_default();
        self.device_classes(&requests, &mut cache).await?;
        let reserved_for = claim.status.as_ref().and_then(|s| s.reserved_for.clone()).unwrap_or_default();
        let mut reserved = Vec::new();
        for r in reserved_for {
            if r.api_group.as_deref().is_some_and(|g| !g.is_empty()) || r.resource != "pods" {
                continue;
            }
            let Some(pod) = self.api.get_pod(&ns, &r.name).await.map_err(deny_api)? else { continue };
            if !r.uid.is_empty() && pod.metadata.uid.as_deref() != Some(r.uid.as_str()) {
                continue;
            }
            let mut claims = BTreeMap::new();
            for (_, c) in containers(&pod) {
                for reference in c.resources.as_ref().and_then(|r| r.claims.as_ref()).into_iter().flatten() {
                    let Some(actual) =
                        vgpu_api::pod::actual_claim_name(&pod, &reference.name).map(str::to_owned)
                    else {
                        continue;
                    };
                    if actual == name || claims.contains_key(&actual) {
                        continue;
                    }
                    let other = self.claim(&ns, &actual, &mut cache).await?;
                    if let Some(o) = &other {
                        let reqs = o
                            .spec
                            .as_ref()
                            .and_then(|s| s.devices.as_ref())
                            .and_then(|d| d.requests.clone())
                            .unwrap_or_default();
                        self.device_classes(&reqs, &mut cache).await?;
                    }
                    claims.insert(actual, other);
                }
            }
            reserved.push(validate::ReservedPod { pod, claims });
        }
        validate::check_allocated_sharing(claim, &reserved, &self.config.device_class_name, &cache.classes)
    }
}

#[derive(Debug, Default)]
struct ClaimCache {
    claims: BTreeMap<String, Option<ResourceClaim>>,
    classes: BTreeMap<String, DeviceClass>,
    fetched_classes: std::collections::BTreeSet<String>,
}

fn has_pod_claims(pod: &Pod) -> bool {
    pod.spec.as_ref().and_then(|s| s.resource_claims.as_ref()).is_some_and(|c| !c.is_empty())
}

/// The pod with the request's namespace and name filled in where the object lacks them.
fn with_identity(pod: &Pod, req: &AdmissionRequest<Pod>) -> Pod {
    let mut pod = pod.clone();
    if pod.metadata.namespace.as_deref().is_none_or(str::is_empty) {
        pod.metadata.namespace = req.namespace.clone();
    }
    if pod.metadata.name.as_deref().is_none_or(str::is_empty) && !req.name.is_empty() {
        pod.metadata.name = Some(req.name.clone());
    }
    pod
}

fn record(pod: &Pod) -> Option<Result<Vec<ResourceInfo>, convert::RecordError>> {
    let value = pod.metadata.annotations.as_ref()?.get(ORIGINAL_RESOURCES_ANNOTATION)?;
    if value.is_empty() {
        return None;
    }
    Some(convert::decode_record(value))
}

/// A generated object `/pods/validate` or `/volcano-jobs/validate` creates.
#[derive(Debug, Clone, Copy)]
enum Generated<'a> {
    Claim(&'a ResourceClaim),
    Template(&'a ResourceClaimTemplate),
}

impl Generated<'_> {
    /// `ResourceClaim` or `ResourceClaimTemplate`.
    fn kind_name(&self) -> &'static str {
        match self {
            Generated::Claim(_) => "ResourceClaim",
            Generated::Template(_) => "ResourceClaimTemplate",
        }
    }

    /// Namespace and name.
    fn namespace_name(&self) -> (&str, &str) {
        let meta = match self {
            Generated::Claim(c) => &c.metadata,
            Generated::Template(t) => &t.metadata,
        };
        (meta.namespace.as_deref().unwrap_or_default(), meta.name.as_deref().unwrap_or_default())
    }

    /// `<namespace>/<name>`.
    fn key(&self) -> String {
        let (ns, name) = self.namespace_name();
        format!("{ns}/{name}")
    }
}

/// Whether an object carries a non-empty `original-resources` annotation.
fn has_job_record(obj: &DynamicObject) -> bool {
    obj.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ORIGINAL_RESOURCES_ANNOTATION))
        .is_some_and(|v| !v.is_empty())
}

/// The request's object as a Volcano Job, its namespace and name filled in from the request where it lacks
/// them; denied when the request is not about a `batch.volcano.sh` `Job` or the Job does not decode.
fn volcano_job(req: &AdmissionRequest<DynamicObject>, obj: &DynamicObject) -> Result<VolcanoJob, Denial> {
    let gvk = &req.kind;
    if gvk.group != volcano::JOB_GROUP || gvk.kind != volcano::JOB_KIND {
        return Err(Denial::new(format!(
            "expected a {}/{} {}, got {}/{} {}",
            volcano::JOB_GROUP,
            volcano::JOB_VERSION,
            volcano::JOB_KIND,
            gvk.group,
            gvk.version,
            gvk.kind
        )));
    }
    let value =
        serde_json::to_value(obj).map_err(|e| Denial::new(format!("cannot read the Volcano Job: {e}")))?;
    let mut job = VolcanoJob::from_value(&value)?;
    if job.metadata.namespace.as_deref().is_none_or(str::is_empty) {
        job.metadata.namespace = req.namespace.clone();
    }
    if job.metadata.name.as_deref().is_none_or(str::is_empty) && !req.name.is_empty() {
        job.metadata.name = Some(req.name.clone());
    }
    Ok(job)
}

/// The ResourceClaims `/pods/validate` creates for a converted pod, checked against the pod: each entry's
/// container exists, its numbers are within the limits, and its claim is one of the pod's `resourceClaims`
/// ([`convert::planned_requests`]).
pub fn planned_claims(
    config: &WebhookConfig,
    pod: &Pod,
    infos: &[ResourceInfo],
    created_ms: u128,
) -> Result<Vec<ResourceClaim>, Denial> {
    let scope = convert::RecordScope {
        subject: format!("Pod {:?}", pod.metadata.name.as_deref().unwrap_or_default()),
        record_field: format!("metadata.annotations[{ORIGINAL_RESOURCES_ANNOTATION}]"),
        spec_prefix: String::new(),
        source: ClaimSource::Claim,
    };
    Ok(convert::planned_requests(config, pod, infos, &scope)?
        .into_iter()
        .map(|(name, requests)| convert::resource_claim(pod, &config.domain, &name, requests, created_ms))
        .collect())
}

fn check_claim_object(
    req: &AdmissionRequest<DynamicObject>,
    obj: &DynamicObject,
) -> Result<Option<ResourceClaim>, Denial> {
    let gvk = &req.kind;
    if gvk.group != "resource.k8s.io" || gvk.version != "v1" {
        return Err(Denial::new(format!(
            "expected a resource.k8s.io/v1 ResourceClaim or ResourceClaimTemplate, got {}/{} {}",
            gvk.group, gvk.version, gvk.kind
        )));
    }
    let value = serde_json::to_value(obj).map_err(|e| Denial::new(format!("cannot read the object: {e}")))?;
    match gvk.kind.as_str() {
        "ResourceClaim" => {
            let claim: ResourceClaim = serde_json::from_value(value)
                .map_err(|e| Denial::new(format!("cannot decode the ResourceClaim: {e}")))?;
            let configs = claim
                .spec
                .as_ref()
                .and_then(|s| s.devices.as_ref())
                .and_then(|d| d.config.clone())
                .unwrap_or_default();
            validate::check_opaque_configs(&configs, "spec")?;
            Ok(Some(claim))
        }
        "ResourceClaimTemplate" => {
            let template: ResourceClaimTemplate = serde_json::from_value(value)
                .map_err(|e| Denial::new(format!("cannot decode the ResourceClaimTemplate: {e}")))?;
            let configs = template
                .spec
                .and_then(|s| s.spec)
                .and_then(|s| s.devices)
                .and_then(|d| d.config)
                .unwrap_or_default();
            validate::check_opaque_configs(&configs, "spec.spec")?;
            Ok(None)
        }
        other => Err(Denial::new(format!(
            "expected a resource.k8s.io/v1 ResourceClaim or ResourceClaimTemplate, got {other}"
        ))),
    }
}
