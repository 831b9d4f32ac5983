//! vgpu-webhook: the admission webhook (contract §10). Users write `nvidia.com/vgpu-number: 1`; the webhook
//! fills in the rest (default cores, our scheduler, policies), keeps `spec.nodeName` from bypassing the
//! extender, and on a DRA cluster turns device-plugin limits into `resource.k8s.io/v1` ResourceClaims (for the
//! pod templates of Volcano Jobs, ResourceClaimTemplates).
//!
//! # Routes
//!
//! | route | admits | denies | patches / side effects |
//! |---|---|---|---|
//! | `POST /pods/mutate` (CREATE) | every pod whose vGPU limits are integers within the limits | a vGPU limit that is not a non-negative integer, `vgpu-number` > 16, `vgpu-cores` > 100 — message names the container and the field | defaults per container (number 1 / cores 100), `schedulerName`, node/device policies, `runtimeClassName`, topology mode (multi-GPU), stale scheduling annotations/labels removed, policies removed from non-vGPU pods, `spec.nodeName` → hostname `nodeSelector`, DRA conversion ([`mutate`]) |
//! | `POST /pods/validate` (CREATE, DELETE) | pods that keep the claim-sharing rules | with `--dra-admission-enabled`: a container using two vGPU claims, a vGPU request shared by concurrent containers or across pods ([`validate`]); a bad `original-resources` record | with `--default-convert2-dra`: creates the converted pod's ResourceClaims ([`convert`]) on CREATE, deletes them on DELETE |
//! | `POST /resourceclaims/validate` (CREATE, UPDATE, `status` UPDATE) | ResourceClaims/Templates whose `manager.nvidia.com` opaque configs are of a known kind | an unknown config kind or undecodable parameters; with `--dra-admission-enabled`, an allocation whose vGPU requests would be shared by concurrent containers or by two pods ([`validate::check_allocated_sharing`]) | — |
//! | `POST /volcano-jobs/mutate` (CREATE, UPDATE) | every `batch.volcano.sh/v1alpha1` Job whose vGPU limits are integers within the limits | with `--default-convert2-dra`: a task's malformed vGPU limit (message names the task, container and field); another kind than a Volcano Job | with `--default-convert2-dra` ([`volcano`]), CREATE: the vGPU containers of each task's pod template converted to `resourceClaimTemplateName` claims, the record `{task: [ResourceInfo…]}` on the Job; UPDATE (not on a dry run): the Job set as controller of its templates, fully owned tasks dropped from the record, an empty record removed. Without the flag: allowed unchanged |
//! | `POST /volcano-jobs/validate` (CREATE, DELETE) | Jobs whose record matches their tasks | with `--default-convert2-dra`: a record that does not decode or names a task, container or template the Job does not have; a failed template create (the templates created before it are deleted again) | with `--default-convert2-dra`: creates the recorded ResourceClaimTemplates on CREATE, deletes them on DELETE |
//! | `GET /healthz`, `GET /readyz` | — | — | 200 `ok` |
//!
//! Bad AdmissionReview bodies get HTTP 400 with the reason; denials are `allowed: false` with status reason
//! `Invalid` ([`vgpu_serve::admission`]). The manifests under `deploy/webhook/` use `failurePolicy: Fail`, so a webhook that
//! cannot answer keeps vGPU pods out rather than letting them in unmutated.
//!
//! # Module map
//!
//! | module | what |
//! |---|---|
//! | [`config`] | [`WebhookConfig`](config::WebhookConfig): the flags of contract §1.4, validated |
//! | [`mutate`] | the pure pod mutation and its JSON patch; the per-pod-spec defaults and DRA conversion shared with [`volcano`] |
//! | [`convert`] | the `original-resources` record, generated ResourceClaims and ResourceClaimTemplates (requests, CEL selectors, owner labels) |
//! | [`volcano`] | the pure Volcano Job part: decoding only what is needed, the task-template conversion and its JSON patch, the Job record, the planned templates, the owner reference |
//! | [`validate`] | the pure claim-sharing and opaque-config rules |
//! | [`admit`] | the routes from body to answer ([`Admission`](admit::Admission)) |
//! | [`server`] | the axum router, served over HTTPS by `vgpu_serve::http::serve` with a reloading certificate |
//!
//! Shared with the GPU module controller and owned below both: AdmissionReview decoding and answers
//! ([`vgpu_serve::admission`]), pod container walks and generated names ([`vgpu_api::pod`], [`vgpu_api::names`]),
//! the cluster seam of the routes ([`vgpu_kube::claims::ClusterApi`], `KubeApi`, `MemoryApi`).
//!
//! # Example
//!
//! A pod asking for one vGPU gets 100 cores, our scheduler and the default policies; a pod with too many cores
//! is denied with the container and the field named:
//!
//! ```
//! use k8s_openapi::api::core::v1::Pod;
//! use vgpu_core::model::SchedulingPolicy;
//! use vgpu_webhook::{config::WebhookConfig, mutate};
//!
//! let config = WebhookConfig {
//!     scheduler_name: Some("vgpu-scheduler".into()),
//!     default_node_policy: Some(SchedulingPolicy::Binpack),
//!     ..WebhookConfig::default()
//! };
//! let pod: Pod = serde_json::from_value(serde_json::json!({
//!     "metadata": {"name": "web", "namespace": "ml"},
//!     "spec": {"containers": [{"name": "main", "resources": {"limits": {"nvidia.com/vgpu-number": "1"}}}]}
//! }))?;
//! let patch = serde_json::to_value(mutate::pod_patch(&config, "uid-1", &pod)?)?;
//! assert_eq!(patch, serde_json::json!([
//!     {"op": "add", "path": "/metadata/annotations", "value": {"nvidia.com/node-scheduler-policy": "binpack"}},
//!     {"op": "add", "path": "/spec/containers/0/resources/limits/nvidia.com~1vgpu-cores", "value": "100"},
//!     {"op": "add", "path": "/spec/schedulerName", "value": "vgpu-scheduler"},
//! ]));
//!
//! let greedy: Pod = serde_json::from_value(serde_json::json!({
//!     "spec": {"containers": [{"name": "main", "resources": {"limits": {"nvidia.com/vgpu-cores": "150"}}}]}
//! }))?;
//! let denied = mutate::pod_patch(&config, "uid-2", &greedy).unwrap_err();
//! assert_eq!(
//!     denied.message,
//!     "container \"main\": spec.containers[0].resources.limits[nvidia.com/vgpu-cores]: Invalid value: \"150\": request exceeds limit, maximum: 100"
//! );
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod admit;
pub mod config;
pub mod convert;
pub mod mutate;
pub mod server;
pub mod validate;
pub mod volcano;
