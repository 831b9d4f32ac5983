//! [`AgentCluster`] over the API server. PhysicalGPUs go through `Api<DynamicObject>` with the
//! [`ApiResource`] of the configured group ([`vgpu_api::api_resource_for_group`]), so one binary serves any
//! group; every write is a server-side apply with the field manager [`FIELD_MANAGER`] (forced: the agent is
//! the only writer of these fields).
//!
//! | call | request |
//! |---|---|
//! | node labels | `GET /api/v1/nodes/<node>` (404 → `None`) |
//! | vendors ConfigMap | `GET /api/v1/namespaces/<ns>/configmaps/<name>` (404 → `None`) |
//! | list | `GET /apis/<group>/v1alpha1/physicalgpus?&fieldSelector=spec.nodeName%3D<node>` |
//! | apply | `PATCH /apis/<group>/v1alpha1/physicalgpus/<name>?&force=true&fieldManager=vgpu-node-agent`, `application/apply-patch+yaml`, `{apiVersion, kind, metadata: {name, labels}, spec}`; then the same on `/status` with `{apiVersion, kind, metadata: {name}, status}` |
//! | delete | `DELETE /apis/<group>/v1alpha1/physicalgpus/<name>?` (404 is success) |
//! | node labels | `PATCH /api/v1/nodes/<node>?&force=true&fieldManager=vgpu-node-agent`, apply, `{apiVersion: v1, kind: Node, metadata: {name, labels}}` |

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Node};
use kube::{
    Client,
    api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams},
    core::ApiResource,
};
use serde_json::json;
use vgpu_api::{GroupError, PhysicalGPU, api_resource_for_group};

use vgpu_kube::error::CallError;

use crate::cluster::{AgentCluster, GpuObject};

/// The field manager of every write.
pub const FIELD_MANAGER: &str = "vgpu-node-agent";

/// The API server behind a `kube::Client`.
#[derive(Clone)]
pub struct KubeCluster {
    client: Client,
    gpus: ApiResource,
}

impl std::fmt::Debug for KubeCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeCluster").field("group", &self.gpus.group).finish_non_exhaustive()
    }
}

impl KubeCluster {
    /// A cluster whose PhysicalGPUs live in `group`.
    pub fn new(client: Client, group: &str) -> Result<Self, GroupError> {
        Ok(Self { client, gpus: api_resource_for_group::<PhysicalGPU>(group)? })
    }

    fn gpu_api(&self) -> Api<DynamicObject> {
        Api::all_with(self.client.clone(), &self.gpus)
    }

    fn apply_params() -> PatchParams {
        PatchParams::apply(FIELD_MANAGER).force()
    }
}

fn is_not_found(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == 404)
}

impl AgentCluster for KubeCluster {
    async fn node_labels(&self, node: &str) -> Result<Option<BTreeMap<String, String>>, CallError> {
        let api: Api<Node> = Api::all(self.client.clone());
        let found =
            api.get_opt(node).await.map_err(|e| CallError::from_kube(format!("get Node {node}"), &e))?;
        Ok(found.map(|n| n.metadata.labels.unwrap_or_default()))
    }

    async fn config_map_data(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<BTreeMap<String, String>>, CallError> {
        let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), namespace);
        let found = api
            .get_opt(name)
            .await
            .map_err(|e| CallError::from_kube(format!("get ConfigMap {namespace}/{name}"), &e))?;
        Ok(found.map(|cm| cm.data.unwrap_or_default()))
    }

    async fn list_gpus(&self, node: &str) -> Result<Vec<String>, CallError> {
        let params = ListParams::default().fields(&format!("spec.nodeName={node}"));
        let list = self
            .gpu_api()
            .list(&params)
            .await
            .map_err(|e| CallError::from_kube(format!("list {} on node {node}", self.gpus.plural), &e))?;
        Ok(list.items.into_iter().filter_map(|o| o.metadata.name).collect())
    }

    async fn apply_gpu(&self, gpu: &GpuObject) -> Result<(), CallError> {
        let api = self.gpu_api();
        let name = gpu.name.as_str();
        let object = json!({
            "apiVersion": self.gpus.api_version, "kind": self.gpus.kind,
            "metadata": { "name": name, "labels": gpu.labels },
            "spec": gpu.spec,
        });
        api.patch(name, &Self::apply_params(), &Patch::Apply(&object))
            .await
            .map_err(|e| CallError::from_kube(format!("apply PhysicalGPU {name}"), &e))?;
        let status = json!({
            "apiVersion": self.gpus.api_version, "kind": self.gpus.kind,
            "metadata": { "name": name },
            "status": gpu.status,
        });
        api.patch_status(name, &Self::apply_params(), &Patch::Apply(&status))
            .await
            .map_err(|e| CallError::from_kube(format!("apply PhysicalGPU {name} status"), &e))?;
        Ok(())
    }

    async fn delete_gpu(&self, name: &str) -> Result<(), CallError> {
        match self.gpu_api().delete(name, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(CallError::from_kube(format!("delete PhysicalGPU {name}"), &e)),
        }
    }

    async fn apply_node_labels(
        &self,
        node: &str,
        labels: &BTreeMap<String, String>,
    ) -> Result<(), CallError> {
        let api: Api<Node> = Api::all(self.client.clone());
        let object = json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": { "name": node, "labels": labels },
        });
        api.patch(node, &Self::apply_params(), &Patch::Apply(&object))
            .await
            .map_err(|e| CallError::from_kube(format!("apply Node {node} labels"), &e))?;
        Ok(())
    }
}
