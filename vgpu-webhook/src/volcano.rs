//! Volcano Jobs (`batch.volcano.sh/v1alpha1` `Job`, a CRD) under `--default-convert2-dra`: the pure part of
//! `/volcano-jobs/mutate` and `/volcano-jobs/validate` ([`crate::admit`] does the API calls).
//!
//! Only what the rules need is decoded ([`VolcanoJob`]: `metadata`, `spec.tasks[].name`,
//! `spec.tasks[].template` as a `PodTemplateSpec`); the patch is the diff of those parts only, with paths of the
//! whole Job, so every other field is left as it came.
//!
//! | step | what |
//! |---|---|
//! | mutate, CREATE | per task with a vGPU container: the pod conversion of [`crate::mutate`] on the task's pod template ([`mutate::default_requests`], [`mutate::convert_containers`]): vGPU limits removed, container `resources.claims` added, `spec.resourceClaims` entries `{name: <claim>, resourceClaimTemplateName: <claim>}` (a template: every pod of the task gets its own claim); the Job gets the record [`ORIGINAL_RESOURCES_ANNOTATION`] = `{"<task>": [ResourceInfo…]}` |
//! | validate, CREATE | the record checked against the tasks ([`planned_templates`]); one ResourceClaimTemplate per recorded claim, its `spec.spec` what the pod path puts in a ResourceClaim ([`convert::resource_claim_template`]) |
//! | mutate, UPDATE | the Job becomes the controller of the recorded templates its tasks still reference; tasks whose templates are all owned leave the record, an empty record leaves the Job |
//! | validate, DELETE | the recorded templates the tasks reference are deleted |
//!
//! A Job that already carries the record is not converted again. Tasks without a name, and tasks whose name
//! another task also has, are not converted (the record is keyed by task name; Volcano itself refuses
//! duplicate names): their pods are converted one by one by `/pods/mutate`.
//!
//! Template names: the base is `<job>-<task>-<hash>` ([`task_claim_base`]: [`mutate::claim_base`] of the Job,
//! then the task through [`safe_resource_name`]), so two tasks with a container of the same name get distinct
//! templates (vgpu-manager bases every task on the Job name alone, and such tasks collide). For a Job named by
//! `generateName`, and for combined claims, the Job part carries the 5-hex-digit suffix of the admission
//! request UID, as for pods. Per container the template is `<base>-<container>-<hash>`; with
//! `--combined-resource-claim` one template per task, `<base>-<hash>`, holds every vGPU container's request.
//!
//! Owner references are set on UPDATE, not at CREATE: at validation time the Job is not stored yet, and the
//! garbage collector could delete a template whose owner it cannot find.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use serde::Deserialize;
use serde_json::Value;
use vgpu_core::domain::ORIGINAL_RESOURCES_ANNOTATION;

use crate::config::WebhookConfig;
use crate::convert::ClaimSource;
use crate::convert::{self, MAX_RECORD_BYTES, RecordError, RecordScope, ResourceInfo};
use crate::mutate;
use vgpu_api::names::safe_resource_name;
use vgpu_serve::admission::Denial;

/// API group of Volcano Jobs.
pub const JOB_GROUP: &str = "batch.volcano.sh";
/// API version of Volcano Jobs.
pub const JOB_VERSION: &str = "v1alpha1";
/// Kind of Volcano Jobs.
pub const JOB_KIND: &str = "Job";

/// The record of a converted Job: task name → the converted containers of its pod template.
pub type JobRecord = BTreeMap<String, Vec<ResourceInfo>>;

/// One task of a Volcano Job (`spec.tasks[i]`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Task {
    /// `name` (empty when absent).
    pub name: String,
    /// `template`.
    pub template: Option<PodTemplateSpec>,
}

/// The parts of a Volcano Job the webhook reads and changes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct VolcanoJob {
    /// `metadata`.
    pub metadata: ObjectMeta,
    /// `spec.tasks`, in order.
    pub tasks: Vec<Task>,
}

#[derive(Deserialize)]
struct RawJob {
    #[serde(default)]
    metadata: Option<ObjectMeta>,
    #[serde(default)]
    spec: Option<RawSpec>,
}

#[derive(Deserialize)]
struct RawSpec {
    #[serde(default)]
    tasks: Option<Vec<RawTask>>,
}

#[derive(Deserialize)]
struct RawTask {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    template: Option<PodTemplateSpec>,
}

impl VolcanoJob {
    /// Reads a Job from its JSON form; other fields are ignored. Denied when a read part does not decode.
    pub fn from_value(value: &Value) -> Result<Self, Denial> {
        let raw = RawJob::deserialize(value)
            .map_err(|e| Denial::new(format!("cannot decode the Volcano Job: {e}")))?;
        let tasks = raw
            .spec
            .and_then(|s| s.tasks)
            .unwrap_or_default()
            .into_iter()
            .map(|t| Task { name: t.name.unwrap_or_default(), template: t.template })
            .collect();
        Ok(Self { metadata: raw.metadata.unwrap_or_default(), tasks })
    }

    /// The Job's name (empty when it has none yet).
    pub fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }

    /// The task named `name` and its index.
    pub fn task(&self, name: &str) -> Option<(usize, &Task)> {
        self.tasks.iter().enumerate().find(|(_, t)| t.name == name)
    }

    fn annotation(&self, key: &str) -> Option<&str> {
        self.metadata.annotations.as_ref()?.get(key).map(String::as_str)
    }
}

/// Decodes a Job's record.
pub fn decode_job_record(value: &str) -> Result<JobRecord, RecordError> {
    let annotation = ORIGINAL_RESOURCES_ANNOTATION;
    if value.len() > MAX_RECORD_BYTES {
        return Err(RecordError::TooLong { annotation, len: value.len() });
    }
    serde_json::from_str(value).map_err(|e| RecordError::JobJson { annotation, reason: e.to_string() })
}

/// Encodes a Job's record.
pub fn encode_job_record(record: &JobRecord) -> String {
    // Strings and maps of strings: serialisation cannot fail; fall back to an empty object regardless.
    serde_json::to_string(record).unwrap_or_else(|_| "{}".to_owned())
}

/// The Job's record: `None` when it has none (absent or empty annotation).
pub fn job_record(job: &VolcanoJob) -> Option<Result<JobRecord, RecordError>> {
    job.annotation(ORIGINAL_RESOURCES_ANNOTATION).filter(|v| !v.is_empty()).map(decode_job_record)
}

/// The base of a task's template names (module docs).
pub fn task_claim_base(job: &VolcanoJob, task: &str, config: &WebhookConfig, request_uid: &str) -> String {
    safe_resource_name(&[&mutate::claim_base(&job.metadata, config, request_uid), task])
}

/// The Job as `/volcano-jobs/mutate` stores it on CREATE (module docs). Unchanged without
/// `--default-convert2-dra` and when it already carries a record; denied when a task's vGPU limits are malformed
/// or over the limits (the message names the task).
pub fn mutate_job(config: &WebhookConfig, request_uid: &str, job: &VolcanoJob) -> Result<VolcanoJob, Denial> {
    let mut out = job.clone();
    if !config.convert_to_dra || job.annotation(ORIGINAL_RESOURCES_ANNOTATION).is_some_and(|v| !v.is_empty())
    {
        return Ok(out);
    }
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    for t in &job.tasks {
        *seen.entry(t.name.as_str()).or_default() += 1;
    }
    let mut record = JobRecord::new();
    for (i, task) in out.tasks.iter_mut().enumerate() {
        if task.name.is_empty() || seen.get(task.name.as_str()).is_some_and(|n| *n > 1) {
            continue;
        }
        let Some(spec) = task.template.as_mut().and_then(|t| t.spec.as_mut()) else { continue };
        let mut converted = spec.clone();
        let defaulted = mutate::default_requests(&mut converted, &config.domain).map_err(|d| {
            Denial::new(format!("task {:?} (spec.tasks[{i}].template): {}", task.name, d.message))
        })?;
        let slots: Vec<_> = defaulted.iter().filter(|(_, _, r)| r.number > 0).map(|(s, _, _)| *s).collect();
        if slots.is_empty() {
            continue;
        }
        let base = task_claim_base(job, &task.name, config, request_uid);
        let infos = mutate::convert_containers(config, &mut converted, &slots, &base, ClaimSource::Template);
        *spec = converted;
        record.insert(task.name.clone(), infos);
    }
    if !record.is_empty() {
        out = with_record(&out, &record);
    }
    Ok(out)
}

/// The Job with `record` as its record annotation, or without the annotation when `record` is empty.
pub fn with_record(job: &VolcanoJob, record: &JobRecord) -> VolcanoJob {
    let mut out = job.clone();
    if record.is_empty() {
        if let Some(a) = out.metadata.annotations.as_mut() {
            a.remove(ORIGINAL_RESOURCES_ANNOTATION);
        }
    } else {
        out.metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(ORIGINAL_RESOURCES_ANNOTATION.to_owned(), encode_job_record(record));
    }
    out
}

/// `{"metadata": …, "spec": {"tasks": [{"template": …}, …]}}`, `managedFields` left out: the two sides a Job
/// patch is the diff of. Paths in the diff are those of the whole Job.
pub fn comparable(job: &VolcanoJob) -> Result<Value, Denial> {
    let encode = |e: serde_json::Error| Denial::new(format!("cannot encode the Volcano Job: {e}"));
    let mut metadata = serde_json::to_value(&job.metadata).map_err(encode)?;
    if let Some(m) = metadata.as_object_mut() {
        m.remove("managedFields");
    }
    let mut tasks = Vec::with_capacity(job.tasks.len());
    for t in &job.tasks {
        let mut task = serde_json::Map::new();
        if let Some(template) = &t.template {
            task.insert("template".to_owned(), serde_json::to_value(template).map_err(encode)?);
        }
        tasks.push(Value::Object(task));
    }
    Ok(serde_json::json!({"metadata": metadata, "spec": {"tasks": tasks}}))
}

/// The JSON patch from `before` to `after` ([`comparable`] sides).
pub fn patch_between(before: &VolcanoJob, after: &VolcanoJob) -> Result<json_patch::Patch, Denial> {
    Ok(json_patch::diff(&comparable(before)?, &comparable(after)?))
}

/// The JSON patch from `job` to [`mutate_job`]'s result (empty when nothing changes).
pub fn job_patch(
    config: &WebhookConfig,
    request_uid: &str,
    job: &VolcanoJob,
) -> Result<json_patch::Patch, Denial> {
    patch_between(job, &mutate_job(config, request_uid, job)?)
}

/// A task's pod template as a pod named after the Job, in the Job's namespace: what the claim code of
/// [`crate::convert`] reads (the template's annotations choose the selectors; the owner key is `<ns>-<job>`).
pub fn task_pod(job: &VolcanoJob, task: &Task) -> Pod {
    let template = task.template.clone().unwrap_or_default();
    let mut metadata = template.metadata.unwrap_or_default();
    metadata.namespace = job.metadata.namespace.clone();
    metadata.name = job.metadata.name.clone();
    Pod { metadata, spec: template.spec, status: None }
}

/// The recorded template names of a task, each with whether the task's pod template refers to it
/// (`spec.resourceClaims[].resourceClaimTemplateName`), in record order without repeats.
pub fn recorded_templates(task: &Task, infos: &[ResourceInfo]) -> Vec<(String, bool)> {
    let spec = task.template.as_ref().and_then(|t| t.spec.as_ref());
    mutate::recorded_claims(spec, infos, ClaimSource::Template)
}

/// The ResourceClaimTemplates `/volcano-jobs/validate` creates for a converted Job, checked against the Job:
/// every recorded task exists, and each entry passes [`convert::planned_requests`] against the task's pod
/// template (container found, numbers within the limits, template referenced by `spec.resourceClaims`); no
/// template is named by two tasks.
pub fn planned_templates(
    config: &WebhookConfig,
    job: &VolcanoJob,
    record: &JobRecord,
    created_ms: u128,
) -> Result<Vec<ResourceClaimTemplate>, Denial> {
    let subject = format!("Job {:?}", job.name());
    let mut owners: BTreeMap<String, &str> = BTreeMap::new();
    let mut out = Vec::new();
    for (task_name, infos) in record {
        let record_field = format!("metadata.annotations[{ORIGINAL_RESOURCES_ANNOTATION}][{task_name}]");
        let Some((i, task)) = job.task(task_name) else {
            return Err(Denial::new(format!(
                "{subject} is invalid: {record_field}: Invalid value: {task_name:?}: task not found"
            )));
        };
        let pod = task_pod(job, task);
        let scope = RecordScope {
            subject: subject.clone(),
            record_field,
            spec_prefix: format!("spec.tasks[{i}].template."),
            source: ClaimSource::Template,
        };
        for (name, requests) in convert::planned_requests(config, &pod, infos, &scope)? {
            if let Some(other) = owners.insert(name.clone(), task_name) {
                return Err(Denial::new(format!(
                    "{subject} is invalid: metadata.annotations[{ORIGINAL_RESOURCES_ANNOTATION}]: Invalid value: ResourceClaimTemplate {name:?} is named by tasks {other:?} and {task_name:?}"
                )));
            }
            out.push(convert::resource_claim_template(&pod, &config.domain, &name, requests, created_ms));
        }
    }
    Ok(out)
}

/// The Job as the controller owner of its templates (`batch.volcano.sh/v1alpha1` `Job`, `controller` and
/// `blockOwnerDeletion` true); `None` while it has no name or UID.
pub fn owner_reference(job: &VolcanoJob) -> Option<OwnerReference> {
    let name = job.metadata.name.as_deref().filter(|n| !n.is_empty())?;
    let uid = job.metadata.uid.as_deref().filter(|u| !u.is_empty())?;
    Some(OwnerReference {
        api_version: format!("{JOB_GROUP}/{JOB_VERSION}"),
        kind: JOB_KIND.to_owned(),
        name: name.to_owned(),
        uid: uid.to_owned(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    })
}

/// Every template name of a record, without repeats.
pub fn record_template_names(record: &JobRecord) -> BTreeSet<&str> {
    record.values().flatten().map(|i| i.claim_name.as_str()).collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use serde_json::json;

    use super::*;

    fn job(v: Value) -> VolcanoJob {
        VolcanoJob::from_value(&v).unwrap()
    }

    #[test]
    fn decodes_only_what_it_needs() {
        let j = job(json!({"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
            "metadata": {"name": "train", "namespace": "ml"},
            "spec": {"minAvailable": 2, "tasks": [{"name": "w", "replicas": 2,
                "template": {"spec": {"containers": [{"name": "main"}]}}}, {"replicas": 1}]}}));
        assert_eq!(j.name(), "train");
        assert_eq!(j.tasks.len(), 2);
        assert_eq!(j.tasks[1], Task::default());
        assert!(j.task("w").is_some_and(|(i, _)| i == 0));
        assert_eq!(job(json!({})), VolcanoJob::default());
        let err =
            VolcanoJob::from_value(&json!({"spec": {"tasks": [{"template": {"spec": 3}}]}})).unwrap_err();
        assert!(err.message.starts_with("cannot decode the Volcano Job: "), "{}", err.message);
    }

    #[test]
    fn record_round_trip_and_errors() {
        let text = r#"{"w":[{"name":"main","claimName":"c","requestName":"vgpu","resources":{"nvidia.com/vgpu-number":"1"}}]}"#;
        let record = decode_job_record(text).unwrap();
        assert_eq!(encode_job_record(&record), text);
        let err = decode_job_record("[]").unwrap_err().to_string();
        assert!(
            err.starts_with(
                "invalid vgpu-manager.io/original-resources annotation of a Volcano Job: invalid type"
            ),
            "{err}"
        );
        assert!(matches!(
            decode_job_record(&" ".repeat(MAX_RECORD_BYTES + 1)),
            Err(RecordError::TooLong { .. })
        ));
    }

    #[test]
    fn owner_needs_name_and_uid() {
        let mut j = job(json!({"metadata": {"name": "train"}}));
        assert_eq!(owner_reference(&j), None);
        j.metadata.uid = Some("u".into());
        assert_eq!(
            serde_json::to_value(owner_reference(&j)).unwrap(),
            json!({"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "name": "train", "uid": "u",
                "controller": true, "blockOwnerDeletion": true})
        );
    }

    #[test]
    fn with_record_sets_and_removes() {
        let j = job(json!({"metadata": {"name": "train", "annotations": {"team": "a"}}}));
        let record = JobRecord::from([("w".to_owned(), vec![])]);
        let set = with_record(&j, &record);
        assert_eq!(set.annotation(ORIGINAL_RESOURCES_ANNOTATION), Some(r#"{"w":[]}"#));
        let cleared = with_record(&set, &JobRecord::new());
        assert_eq!(cleared, j);
        assert_eq!(
            serde_json::to_value(patch_between(&set, &cleared).unwrap()).unwrap(),
            json!([{"op": "remove", "path": "/metadata/annotations/vgpu-manager.io~1original-resources"}])
        );
    }
}
