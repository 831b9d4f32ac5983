//! The controller's view of the cluster ([`ControllerCluster`]): a snapshot of what it reads (GPUClasses,
//! PhysicalGPUs, node labels, ResourceClaims, ResourceSlices, the DeviceClasses it manages), the live pod
//! list of [`crate::claims`], and the six writes it makes. [`crate::kube_cluster::KubeCluster`] reads from watch-fed caches and writes with
//! server-side apply; [`InMemoryCluster`] serves tests and benches, with failure injection
//! ([`InMemoryCluster::fail_next`]).

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Mutex, MutexGuard, PoisonError};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::ResourceExt;
use vgpu_api::{GPUClass, GPUClassStatus, PhysicalGPU, PhysicalGPUStatus};

use vgpu_kube::error::CallError;

use crate::desired::NodeLabels;
use crate::occupancy::GpuStatus;

/// Everything one reconcile pass reads.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// GPUClasses.
    pub classes: Vec<GPUClass>,
    /// PhysicalGPUs.
    pub gpus: Vec<PhysicalGPU>,
    /// Node name → labels.
    pub nodes: NodeLabels,
    /// ResourceClaims of all namespaces.
    pub claims: Vec<ResourceClaim>,
    /// ResourceSlices.
    pub slices: Vec<ResourceSlice>,
    /// The DeviceClasses carrying the controller's GPUClass label.
    pub device_classes: Vec<DeviceClass>,
}

/// The cluster calls of the controller.
pub trait ControllerCluster: Send + Sync + 'static {
    /// What the cluster holds now (from caches: no request per call in the kube implementation).
    fn snapshot(&self) -> impl Future<Output = Result<Snapshot, CallError>> + Send;
    /// Applies a DeviceClass (labels, owner, spec).
    fn apply_device_class(&self, class: &DeviceClass) -> impl Future<Output = Result<(), CallError>> + Send;
    /// Deletes a DeviceClass; one already gone is no error.
    fn delete_device_class(&self, name: &str) -> impl Future<Output = Result<(), CallError>> + Send;
    /// Applies the controller's GPUClass status fields (`valid`, `message`, `deviceClassName`, `Valid`).
    fn apply_class_status(
        &self,
        class: &str,
        status: &GPUClassStatus,
    ) -> impl Future<Output = Result<(), CallError>> + Send;
    /// Applies the controller's PhysicalGPU status fields (`state`, `occupancy`).
    fn apply_gpu_status(
        &self,
        gpu: &str,
        status: &GpuStatus,
    ) -> impl Future<Output = Result<(), CallError>> + Send;
    /// The pods of `namespace` matching `label_selector` (`key in (a,b)` or `key=value[,key=value]`), read live.
    fn list_pods(
        &self,
        namespace: &str,
        label_selector: &str,
    ) -> impl Future<Output = Result<Vec<Pod>, CallError>> + Send;
    /// Sets `metadata.ownerReferences` of `claim` to `owners`, only if the stored claim still has `claim`'s
    /// UID; a claim already gone is no error.
    fn set_claim_owners(
        &self,
        claim: &ResourceClaim,
        owners: &[OwnerReference],
    ) -> impl Future<Output = Result<(), CallError>> + Send;
    /// Deletes `claim`, only if the stored claim still has `claim`'s UID and resourceVersion; a claim already
    /// gone is no error.
    fn delete_claim(&self, claim: &ResourceClaim) -> impl Future<Output = Result<(), CallError>> + Send;
    /// Deletes PhysicalGPU `gpu`, only if the stored one still has `gpu`'s UID; one already gone is no error.
    fn delete_gpu(&self, gpu: &PhysicalGPU) -> impl Future<Output = Result<(), CallError>> + Send;
}

/// `namespace/name` of a namespaced object, for messages.
pub fn key_of(obj: &impl ResourceExt) -> String {
    format!("{}/{}", obj.namespace().unwrap_or_default(), obj.name_any())
}

// === impl InMemoryCluster ===

/// Objects held in memory; writes apply at once.
#[derive(Debug, Default)]
pub struct InMemoryCluster {
    state: Mutex<MemoryState>,
}

#[derive(Debug, Default)]
struct MemoryState {
    snapshot: Snapshot,
    pods: Vec<Pod>,
    pod_lists: u32,
    fail_next: u32,
    writes: Vec<String>,
}

impl InMemoryCluster {
    /// An empty cluster.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, MemoryState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds or replaces a GPUClass.
    pub fn put_class(&self, class: GPUClass) {
        let mut s = self.lock();
        s.snapshot.classes.retain(|c| c.name_any() != class.name_any());
        s.snapshot.classes.push(class);
    }

    /// Removes a GPUClass.
    pub fn remove_class(&self, name: &str) {
        self.lock().snapshot.classes.retain(|c| c.name_any() != name);
    }

    /// Adds or replaces a PhysicalGPU.
    pub fn put_gpu(&self, gpu: PhysicalGPU) {
        let mut s = self.lock();
        s.snapshot.gpus.retain(|g| g.name_any() != gpu.name_any());
        s.snapshot.gpus.push(gpu);
    }

    /// Sets a node's labels.
    pub fn put_node(&self, node: &str, labels: BTreeMap<String, String>) {
        self.lock().snapshot.nodes.insert(node.to_owned(), labels);
    }

    /// Adds or replaces a ResourceClaim.
    pub fn put_claim(&self, claim: ResourceClaim) {
        let mut s = self.lock();
        let key = (claim.namespace(), claim.name_any());
        s.snapshot.claims.retain(|c| (c.namespace(), c.name_any()) != key);
        s.snapshot.claims.push(claim);
    }

    /// Removes a ResourceClaim.
    pub fn remove_claim(&self, namespace: &str, name: &str) {
        self.lock()
            .snapshot
            .claims
            .retain(|c| !(c.namespace().as_deref() == Some(namespace) && c.name_any() == name));
    }

    /// Adds or replaces a pod (the live pods [`ControllerCluster::list_pods`] reads).
    pub fn put_pod(&self, pod: Pod) {
        let mut s = self.lock();
        let key = (pod.namespace(), pod.name_any());
        s.pods.retain(|p| (p.namespace(), p.name_any()) != key);
        s.pods.push(pod);
    }

    /// Removes a pod.
    pub fn remove_pod(&self, namespace: &str, name: &str) {
        self.lock().pods.retain(|p| !(p.namespace().as_deref() == Some(namespace) && p.name_any() == name));
    }

    /// How many times the pods were listed.
    pub fn pod_lists(&self) -> u32 {
        self.lock().pod_lists
    }

    /// Adds a ResourceSlice.
    pub fn put_slice(&self, slice: ResourceSlice) {
        self.lock().snapshot.slices.push(slice);
    }

    /// The stored snapshot.
    pub fn state(&self) -> Snapshot {
        self.lock().snapshot.clone()
    }

    /// The writes made so far (`apply DeviceClass x`, `status GPUClass y`, `status PhysicalGPU z`,
    /// `delete DeviceClass x`, `owners ResourceClaim ns/c: Pod p`, `delete ResourceClaim ns/c`).
    pub fn writes(&self) -> Vec<String> {
        self.lock().writes.clone()
    }

    /// The next `n` writes fail.
    pub fn fail_next(&self, n: u32) {
        self.lock().fail_next = n;
    }

    fn write(&self, operation: String, f: impl FnOnce(&mut Snapshot)) -> Result<(), CallError> {
        self.try_write(operation, |s| {
            f(s);
            Ok(())
        })
    }

    /// A write that may refuse (a failed precondition) with a message.
    fn try_write(
        &self,
        operation: String,
        f: impl FnOnce(&mut Snapshot) -> Result<(), String>,
    ) -> Result<(), CallError> {
        let mut s = self.lock();
        if s.fail_next > 0 {
            s.fail_next -= 1;
            return Err(CallError::Api { operation, message: "injected failure".into() });
        }
        f(&mut s.snapshot).map_err(|message| CallError::Api { operation: operation.clone(), message })?;
        s.writes.push(operation);
        Ok(())
    }
}

/// `key in (a,b)`, or `key=value[,key=value]`, or `key` (exists): the selectors the controller sends.
fn labels_match(pod: &Pod, selector: &str) -> bool {
    if let Some((key, rest)) = selector.split_once(" in (") {
        let values = rest.trim_end().trim_end_matches(')');
        return pod.labels().get(key.trim()).is_some_and(|v| values.split(',').any(|w| w.trim() == v));
    }
    selector.split(',').filter(|t| !t.is_empty()).all(|term| match term.split_once('=') {
        Some((k, v)) => pod.labels().get(k.trim()).map(String::as_str) == Some(v.trim()),
        None => pod.labels().contains_key(term.trim()),
    })
}

fn same_claim(stored: &ResourceClaim, claim: &ResourceClaim) -> bool {
    stored.namespace() == claim.namespace() && stored.name_any() == claim.name_any()
}

impl ControllerCluster for InMemoryCluster {
    async fn snapshot(&self) -> Result<Snapshot, CallError> {
        Ok(self.state())
    }

    async fn apply_device_class(&self, class: &DeviceClass) -> Result<(), CallError> {
        let name = class.name_any();
        self.write(format!("apply DeviceClass {name}"), |s| {
            s.device_classes.retain(|c| c.name_any() != name);
            s.device_classes.push(class.clone());
        })
    }

    async fn delete_device_class(&self, name: &str) -> Result<(), CallError> {
        self.write(format!("delete DeviceClass {name}"), |s| {
            s.device_classes.retain(|c| c.name_any() != name)
        })
    }

    async fn apply_class_status(&self, class: &str, status: &GPUClassStatus) -> Result<(), CallError> {
        self.write(format!("status GPUClass {class}"), |s| {
            if let Some(c) = s.classes.iter_mut().find(|c| c.name_any() == class) {
                c.status = Some(status.clone());
            }
        })
    }

    async fn apply_gpu_status(&self, gpu: &str, status: &GpuStatus) -> Result<(), CallError> {
        self.write(format!("status PhysicalGPU {gpu}"), |s| {
            if let Some(g) = s.gpus.iter_mut().find(|g| g.name_any() == gpu) {
                let st = g.status.get_or_insert_with(PhysicalGPUStatus::default);
                st.state = Some(status.state);
                st.occupancy = Some(status.occupancy.clone());
                st.class_passthrough = status.passthrough.wish;
                st.conditions.retain(|c| c.type_ != crate::passthrough::CONDITION);
                st.conditions.extend(status.passthrough.condition.clone());
            }
        })
    }
    async fn list_pods(&self, namespace: &str, label_selector: &str) -> Result<Vec<Pod>, CallError> {
        let mut s = self.lock();
        s.pod_lists += 1;
        Ok(s.pods
            .iter()
            .filter(|p| p.namespace().as_deref() == Some(namespace) && labels_match(p, label_selector))
            .cloned()
            .collect())
    }

    async fn set_claim_owners(
        &self,
        claim: &ResourceClaim,
        owners: &[OwnerReference],
    ) -> Result<(), CallError> {
        let pods: Vec<&str> = owners.iter().map(|o| o.name.as_str()).collect();
        self.try_write(format!("owners ResourceClaim {}: Pod {}", key_of(claim), pods.join(",")), |s| {
            let Some(stored) = s.claims.iter_mut().find(|c| same_claim(c, claim)) else { return Ok(()) };
            if stored.metadata.uid != claim.metadata.uid {
                return Err("the claim was replaced (another UID)".to_owned());
            }
            stored.metadata.owner_references = Some(owners.to_vec());
            Ok(())
        })
    }

    async fn delete_claim(&self, claim: &ResourceClaim) -> Result<(), CallError> {
        self.try_write(format!("delete ResourceClaim {}", key_of(claim)), |s| {
            let Some(i) = s.claims.iter().position(|c| same_claim(c, claim)) else { return Ok(()) };
            let stored = &s.claims[i].metadata;
            if stored.uid != claim.metadata.uid || stored.resource_version != claim.metadata.resource_version
            {
                return Err("the claim changed since it was read (UID or resourceVersion)".to_owned());
            }
            s.claims.remove(i);
            Ok(())
        })
    }

    async fn delete_gpu(&self, gpu: &PhysicalGPU) -> Result<(), CallError> {
        let name = gpu.name_any();
        self.try_write(format!("delete PhysicalGPU {name}"), |s| {
            let Some(i) = s.gpus.iter().position(|g| g.name_any() == name) else { return Ok(()) };
            if s.gpus[i].metadata.uid != gpu.metadata.uid {
                return Err("the PhysicalGPU was replaced (another UID)".to_owned());
            }
            s.gpus.remove(i);
            Ok(())
        })
    }
}
