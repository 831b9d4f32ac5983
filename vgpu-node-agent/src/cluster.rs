//! The node agent's view of the cluster ([`AgentCluster`]): read its Node's labels and the vendors ConfigMap,
//! list, apply and delete the PhysicalGPUs of its node, apply its node labels.
//! [`crate::kube_cluster::KubeCluster`] talks to the API server; [`InMemoryCluster`] serves tests and
//! simulations, with failure injection ([`InMemoryCluster::fail_next`]).
//!
//! Every write is a server-side apply of exactly the fields the agent owns, so a field the agent stops
//! sending (a node label of a vendor that left) is removed by the API server, and fields other writers own
//! (adapter and controller status, other labels) are never touched.

use std::{
    collections::BTreeMap,
    future::Future,
    sync::{Mutex, PoisonError},
};

use vgpu_api::{PhysicalGPUSpec, PhysicalGPUStatus};
use vgpu_kube::error::CallError;

/// One PhysicalGPU as the agent writes it: name, labels, spec, and the status fields it owns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuObject {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.labels` (`<domain>/vendor`, `<domain>/node`).
    pub labels: BTreeMap<String, String>,
    /// The spec.
    pub spec: PhysicalGPUSpec,
    /// The status fields the agent owns (`driver`, the `DriverBound` condition).
    pub status: PhysicalGPUStatus,
}

/// The cluster calls of the node agent.
pub trait AgentCluster: Send + Sync + 'static {
    /// The Node's labels; `None` when the Node does not exist.
    fn node_labels(
        &self,
        node: &str,
    ) -> impl Future<Output = Result<Option<BTreeMap<String, String>>, CallError>> + Send;

    /// A ConfigMap's `data`; `None` when it does not exist.
    fn config_map_data(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<BTreeMap<String, String>>, CallError>> + Send;

    /// Names of the PhysicalGPUs with `spec.nodeName == node`.
    fn list_gpus(&self, node: &str) -> impl Future<Output = Result<Vec<String>, CallError>> + Send;

    /// Applies a PhysicalGPU's labels and spec, then its status (`/status`), with the agent's field manager.
    fn apply_gpu(&self, gpu: &GpuObject) -> impl Future<Output = Result<(), CallError>> + Send;

    /// Deletes a PhysicalGPU; one that is already gone is not an error.
    fn delete_gpu(&self, name: &str) -> impl Future<Output = Result<(), CallError>> + Send;

    /// Applies the node labels the agent owns; labels it owned before and leaves out are removed.
    fn apply_node_labels(
        &self,
        node: &str,
        labels: &BTreeMap<String, String>,
    ) -> impl Future<Output = Result<(), CallError>> + Send;
}

// === impl InMemoryCluster ===

/// Nodes, ConfigMaps and PhysicalGPUs held in memory; writes apply immediately.
#[derive(Debug, Default)]
pub struct InMemoryCluster {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Node name → labels.
    nodes: BTreeMap<String, BTreeMap<String, String>>,
    /// Labels each node's agent applied last (so dropped ones are removed, as server-side apply does).
    owned_labels: BTreeMap<String, BTreeMap<String, String>>,
    /// `namespace/name` → data.
    config_maps: BTreeMap<String, BTreeMap<String, String>>,
    gpus: BTreeMap<String, GpuObject>,
    calls: Vec<String>,
    fail_next: usize,
    fail_writes: usize,
}

impl InMemoryCluster {
    /// An empty cluster.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds or replaces a Node with these labels.
    pub fn put_node(&self, node: &str, labels: BTreeMap<String, String>) {
        self.lock().nodes.insert(node.to_owned(), labels);
    }

    /// Adds or replaces a ConfigMap's data.
    pub fn put_config_map(&self, namespace: &str, name: &str, data: BTreeMap<String, String>) {
        self.lock().config_maps.insert(format!("{namespace}/{name}"), data);
    }

    /// Removes a ConfigMap.
    pub fn remove_config_map(&self, namespace: &str, name: &str) {
        self.lock().config_maps.remove(&format!("{namespace}/{name}"));
    }

    /// Adds a PhysicalGPU as another writer (or an earlier agent) would have.
    pub fn put_gpu(&self, gpu: GpuObject) {
        self.lock().gpus.insert(gpu.name.clone(), gpu);
    }

    /// The Node's labels now.
    pub fn node(&self, node: &str) -> Option<BTreeMap<String, String>> {
        self.lock().nodes.get(node).cloned()
    }

    /// All PhysicalGPUs, by name.
    pub fn gpus(&self) -> BTreeMap<String, GpuObject> {
        self.lock().gpus.clone()
    }

    /// The write calls received so far (`apply <name>`, `delete <name>`, `label <node>`), in order.
    pub fn calls(&self) -> Vec<String> {
        self.lock().calls.clone()
    }

    /// Makes the next `count` calls fail.
    pub fn fail_next(&self, count: usize) {
        self.lock().fail_next = count;
    }

    /// Makes the next `count` write calls (apply, delete, label) fail; reads go through.
    pub fn fail_next_writes(&self, count: usize) {
        self.lock().fail_writes = count;
    }

    fn check(&self, operation: &str) -> Result<std::sync::MutexGuard<'_, State>, CallError> {
        let mut state = self.lock();
        if state.fail_next > 0 {
            state.fail_next -= 1;
            return Err(CallError::Api {
                operation: operation.to_owned(),
                message: "injected failure".into(),
            });
        }
        Ok(state)
    }

    fn check_write(&self, operation: &str) -> Result<std::sync::MutexGuard<'_, State>, CallError> {
        let mut state = self.check(operation)?;
        if state.fail_writes > 0 {
            state.fail_writes -= 1;
            return Err(CallError::Api {
                operation: operation.to_owned(),
                message: "injected failure".into(),
            });
        }
        Ok(state)
    }
}

impl AgentCluster for InMemoryCluster {
    async fn node_labels(&self, node: &str) -> Result<Option<BTreeMap<String, String>>, CallError> {
        Ok(self.check(&format!("get Node {node}"))?.nodes.get(node).cloned())
    }

    async fn config_map_data(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<BTreeMap<String, String>>, CallError> {
        let state = self.check(&format!("get ConfigMap {namespace}/{name}"))?;
        Ok(state.config_maps.get(&format!("{namespace}/{name}")).cloned())
    }

    async fn list_gpus(&self, node: &str) -> Result<Vec<String>, CallError> {
        let state = self.check("list PhysicalGPUs")?;
        Ok(state.gpus.values().filter(|g| g.spec.node_name == node).map(|g| g.name.clone()).collect())
    }

    async fn apply_gpu(&self, gpu: &GpuObject) -> Result<(), CallError> {
        let mut state = self.check_write(&format!("apply PhysicalGPU {}", gpu.name))?;
        state.calls.push(format!("apply {}", gpu.name));
        state.gpus.insert(gpu.name.clone(), gpu.clone());
        Ok(())
    }

    async fn delete_gpu(&self, name: &str) -> Result<(), CallError> {
        let mut state = self.check_write(&format!("delete PhysicalGPU {name}"))?;
        state.calls.push(format!("delete {name}"));
        state.gpus.remove(name);
        Ok(())
    }

    async fn apply_node_labels(
        &self,
        node: &str,
        labels: &BTreeMap<String, String>,
    ) -> Result<(), CallError> {
        let mut state = self.check_write(&format!("apply Node {node} labels"))?;
        state.calls.push(format!("label {node}"));
        let previous = state.owned_labels.insert(node.to_owned(), labels.clone()).unwrap_or_default();
        let Some(current) = state.nodes.get_mut(node) else {
            return Err(CallError::Api {
                operation: format!("apply Node {node} labels"),
                message: "nodes not found".into(),
            });
        };
        for key in previous.keys() {
            current.remove(key);
        }
        current.extend(labels.clone());
        Ok(())
    }
}
