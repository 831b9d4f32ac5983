//! The GPU module's controller: turns each `GPUClass` ([`vgpu_api`]) into a DRA `DeviceClass`, keeps the
//! occupancy of every `PhysicalGPU` from the ResourceClaims the scheduler allocated, and validates GPUClass,
//! DeviceClass, ResourceClaim and Pod objects at admission (and turns a pod's GPUClass request into a claim).
//!
//! # Watches → reconcile → writes
//!
//! | object | role | written |
//! |---|---|---|
//! | `GPUClass` | primary | `status` (`valid`, `message`, `deviceClassName`, condition `Valid`) |
//! | `DeviceClass` (`resource.k8s.io/v1`) | owned (ownerReference to the GPUClass, label `<group>/gpuclass`) | applied from [`desired::desired_class`], deleted when its GPUClass is gone |
//! | `PhysicalGPU` | mapped (matching, occupancy) | `status.state`, `status.occupancy` ([`occupancy`]); `status.classPassthrough` and condition `PassthroughPolicy` ([`passthrough`]) |
//! | `Node` | mapped (labels for `nodeSelector`) | — |
//! | `ResourceClaim`, `ResourceSlice` | mapped (allocations → GPUs) | — |
//! | `ResourceClaim` made by the pod mutation | owned by its pod ([`claims`]) | `metadata.ownerReferences` (JSON patch), or deleted when its pod never came to be |
//! | `Pod` | read live, only for claims without an owner (`list` by label `<group>/admission-id`) | — |
//!
//! Every write is a server-side apply with field manager [`FIELD_MANAGER`]. One replica writes (Lease leader
//! election, in the binary); every replica serves admission.
//!
//! # Module map
//!
//! | module | what |
//! |---|---|
//! | [`config`] | [`ControllerConfig`](config::ControllerConfig): API group, vendor → DRA driver |
//! | [`cel`] | the DeviceClass CEL selector of a GPUClass |
//! | [`desired`] | pure: GPUClass + PhysicalGPUs → DeviceClass + status |
//! | [`occupancy`] | pure: ResourceClaim allocations → PhysicalGPU state and occupancy |
//! | [`passthrough`] | pure: the GPUClasses' `spec.passthrough` → each PhysicalGPU's class wish and `PassthroughPolicy` |
//! | [`reconcile`] | the pass (plan + writes) and its run loop |
//! | [`cluster`] | the seam: [`ControllerCluster`](cluster::ControllerCluster), [`InMemoryCluster`](cluster::InMemoryCluster) |
//! | [`kube_cluster`] | [`KubeCluster`](kube_cluster::KubeCluster): watch-fed caches and server-side apply |
//! | [`admission`] | validating rules for GPUClass, DeviceClass, ResourceClaim; the pod mutation |
//! | [`pod_validation`] | pure: a pod's GPUClass requests and ResourceClaims against the classes, GPUs and claims (`/pods/validate`) |
//! | [`pod_update`] | pure: the pod mutation on UPDATE (the admission-id label kept) |
//! | [`claims`] | pure: the owner (or deletion) of each ResourceClaim the pod mutation created |
//! | [`server`] | HTTPS routes: admission, `/healthz`, `/readyz`, `/version`, `/metrics` (RBAC-authorized) |
//! | [`metrics`] | the Prometheus families |
//! | [`fixture`] | objects for tests and benches |
//!
//! # Example
//!
//! ```
//! use vgpu_controller::{config::ControllerConfig, desired, fixture};
//!
//! let config = ControllerConfig::default();
//! let gpus = [fixture::gpu("w1", 0, "nvidia", "a100-sxm4-40gb", Some(40960))];
//! let class = fixture::class("a100-shared", "nvidia", Some("a100-sxm4-40gb"), Some(4));
//! let d = desired::desired_class(&config, &class, &gpus, &Default::default());
//! assert_eq!(d.status.valid, Some(true));
//! assert_eq!(d.status.device_class_name.as_deref(), Some("a100-shared.gpu.deckhouse.io"));
//! assert_eq!(vgpu_controller::FIELD_MANAGER, "vgpu-controller");
//! ```

pub mod admission;
pub mod cel;
pub mod claims;
pub mod cluster;
pub mod config;
pub mod desired;
pub mod fixture;
pub mod kube_cluster;
pub mod metrics;
pub mod occupancy;
pub mod passthrough;
pub mod pod_update;
pub mod pod_validation;
pub mod reconcile;
pub mod server;

/// The field manager of the controller's server-side applies.
pub const FIELD_MANAGER: &str = "vgpu-controller";
