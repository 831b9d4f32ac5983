//! The reconcile pass of the MIG manager ([`MigManager::reconcile`]) and its loop ([`MigManager::run`]).
//!
//! One pass, for the node this process runs on:
//!
//! 1. No `nvidia.com/mig.config` label: no MIG change (a maintenance this manager left open is closed); the
//!    GFD labels are still published when enabled.
//! 2. Read the ConfigMap key (mig-parted format), select the label's configuration, check it against the
//!    backend and place the instances ([`crate::plan::plan`]). Any error here — missing ConfigMap or key,
//!    bad YAML, unknown configuration or profile, a layout that does not fit, a GPU without MIG — leaves the
//!    node untouched: state label `nvidia.com/mig.config.state=failed` and the reason in the annotation
//!    `nvidia.com/mig.config.state.reason`.
//! 3. The backend already matches: state `success` (GFD labels refreshed when enabled).
//! 4. Otherwise maintenance: state `pending`; taint `nvidia.com/mig-reconfigure:NoSchedule` and cordon
//!    (`spec.unschedulable`, conditional on the node's resourceVersion); the annotation
//!    `nvidia.com/mig.config.cordoned=true` records that the cordon is ours, so a node an administrator had
//!    cordoned stays cordoned afterwards.
//! 5. Evict the node's GPU pods (pods whose containers request a resource under one of the GPU resource
//!    prefixes, `nvidia.com/` by default) through the Eviction API; a 429 (PodDisruptionBudget) is retried on
//!    the next pass. The pass ends while any GPU pod remains (the loop comes back after the short period).
//! 6. Apply the layout through the backend's MIG calls ([`crate::plan::apply`]); a backend failure is state
//!    `failed` with the reason, and the node is returned to service.
//! 7. Make the device plugin re-advertise: our device plugin reads the MIG layout when it starts
//!    (`vgpu-deviceplugin`'s daemon builds its MIG plugins once), so the manager deletes the device plugin
//!    pods on the node (label selector, default `app.kubernetes.io/name=vgpu-device-plugin`); their
//!    DaemonSet starts them again and they register the new `nvidia.com/mig-<profile>` resources.
//! 8. Publish the GFD labels ([`crate::labels`]) when enabled, close the maintenance (taint removed,
//!    uncordoned if the cordon was ours), state `success`, reason removed.
//!
//! Every step is idempotent, so a manager restarted in the middle converges on its next pass.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use vgpu_core::{backend::DeviceBackend, node_config::MigStrategy};

use crate::{
    CONFIG_LABEL, CORDONED_ANNOTATION, REASON_ANNOTATION, STATE_LABEL, TAINT_KEY,
    cluster::{ClusterError, EvictOutcome, MetadataPatch, MigCluster, NodeState, NodeTaint},
    config::MigConfigFile,
    labels::{NodeFacts, gfd_labels, label_patch},
    plan::{apply, plan},
};

/// `nvidia.com/mig.config.state` values.
pub mod state {
    /// Maintenance in progress.
    pub const PENDING: &str = "pending";
    /// The node has the layout its label asks.
    pub const SUCCESS: &str = "success";
    /// The layout could not be applied; the reason is in the annotation.
    pub const FAILED: &str = "failed";
}

/// How the manager is set up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManagerConfig {
    /// This node.
    pub node_name: String,
    /// Namespace of the configuration ConfigMap.
    pub config_map_namespace: String,
    /// Name of the configuration ConfigMap.
    pub config_map_name: String,
    /// Key of the file in the ConfigMap (`config.yaml`).
    pub config_key: String,
    /// Resource name prefixes that make a pod a GPU pod (`nvidia.com/`).
    pub gpu_resource_prefixes: Vec<String>,
    /// Labels of the device plugin pods to restart after a change.
    pub device_plugin_selector: BTreeMap<String, String>,
    /// Whether to publish GFD-compatible labels.
    pub gfd_labels: bool,
    /// The MIG strategy of the labels (the device plugin's `--mig-strategy`).
    pub mig_strategy: MigStrategy,
    /// The machine's product name for `nvidia.com/gpu.machine`.
    pub machine: Option<String>,
    /// Period between passes when nothing is pending.
    pub period: Duration,
    /// Period while waiting for evictions.
    pub retry_period: Duration,
}

impl ManagerConfig {
    /// Defaults for `node_name`: ConfigMap `default-mig-parted-config` key `config.yaml` in `namespace`.
    pub fn new(node_name: impl Into<String>, namespace: impl Into<String>) -> Self {
        Self {
            node_name: node_name.into(),
            config_map_namespace: namespace.into(),
            config_map_name: "default-mig-parted-config".to_owned(),
            config_key: "config.yaml".to_owned(),
            gpu_resource_prefixes: vec!["nvidia.com/".to_owned()],
            device_plugin_selector: [("app.kubernetes.io/name".to_owned(), "vgpu-device-plugin".to_owned())]
                .into_iter()
                .collect(),
            gfd_labels: true,
            mig_strategy: MigStrategy::Mixed,
            machine: None,
            period: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

/// How a pass ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The node has no `nvidia.com/mig.config` label.
    NoConfig,
    /// The backend already matched.
    InSync,
    /// The layout was changed and the node returned.
    Applied,
    /// In maintenance, waiting for GPU pods to go (the reasons, e.g. refused evictions).
    Waiting(String),
    /// State `failed` with this reason.
    Failed(String),
}

/// A pass could not finish because of the cluster (retried on the next pass).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ManagerError {
    /// A cluster call failed.
    #[error(transparent)]
    Cluster(#[from] ClusterError),
}

/// The MIG manager of one node.
pub struct MigManager<C> {
    config: ManagerConfig,
    cluster: C,
    backend: Arc<dyn DeviceBackend>,
}

impl<C> std::fmt::Debug for MigManager<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MigManager").field("config", &self.config).finish_non_exhaustive()
    }
}

impl<C: MigCluster> MigManager<C> {
    /// A manager over `cluster` and `backend`.
    pub fn new(config: ManagerConfig, cluster: C, backend: Arc<dyn DeviceBackend>) -> Self {
        Self { config, cluster, backend }
    }

    /// The cluster access.
    pub fn cluster(&self) -> &C {
        &self.cluster
    }

    /// Passes until `shutdown` completes; cluster errors are logged and retried.
    pub async fn run(&self, shutdown: impl std::future::Future<Output = ()>) {
        let mut shutdown = std::pin::pin!(shutdown);
        loop {
            let wait = match self.reconcile().await {
                Ok(Outcome::Waiting(why)) => {
                    tracing::info!(%why, "waiting for GPU pods to leave the node");
                    self.config.retry_period
                }
                Ok(outcome) => {
                    tracing::debug!(?outcome, "MIG pass done");
                    self.config.period
                }
                Err(err) => {
                    tracing::warn!(%err, "MIG pass failed; retrying");
                    self.config.retry_period
                }
            };
            tokio::select! {
                () = &mut shutdown => return,
                () = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// One pass (see the module docs).
    pub async fn reconcile(&self) -> Result<Outcome, ManagerError> {
        let node_name = &self.config.node_name;
        let node = self.cluster.get_node(node_name).await?;
        let ours = node.taints.iter().any(|t| t.key == TAINT_KEY);
        let Some(name) = node.labels.get(CONFIG_LABEL).cloned() else {
            if ours {
                self.end_maintenance(&node, None).await?;
            }
            self.publish(&node, None, None).await?;
            return Ok(Outcome::NoConfig);
        };
        let plans = match self.desired(&name).await? {
            Ok(plans) => plans,
            Err(reason) => return self.fail(&node, ours, reason).await,
        };
        if plans.iter().all(|p| !p.changes) {
            if ours {
                // A pass that applied but stopped before returning the node.
                self.restart_device_plugin().await?;
                self.end_maintenance(&node, Some(state::SUCCESS)).await?;
            } else {
                self.publish(&node, Some(state::SUCCESS), None).await?;
            }
            return Ok(Outcome::InSync);
        }

        let node = self.begin_maintenance(node).await?;
        if let Some(waiting) = self.evict_gpu_pods().await? {
            return Ok(Outcome::Waiting(waiting));
        }
        let backend = Arc::clone(&self.backend);
        let applied = tokio::task::spawn_blocking(move || apply(backend.as_ref(), &plans))
            .await
            .map_err(|err| ClusterError::new("apply the MIG layout", err.to_string()))?;
        if let Err(err) = applied {
            tracing::error!(%err, "MIG layout not applied");
            return self.fail(&node, true, err.to_string()).await;
        }
        self.restart_device_plugin().await?;
        let node = self.cluster.get_node(node_name).await?;
        self.end_maintenance(&node, Some(state::SUCCESS)).await?;
        tracing::info!(config = %name, "MIG configuration applied");
        Ok(Outcome::Applied)
    }

    /// The plans of configuration `name`, or the reason it cannot apply.
    async fn desired(&self, name: &str) -> Result<Result<Vec<crate::plan::GpuPlan>, String>, ManagerError> {
        let c = &self.config;
        let source = format!("{}/{}[{}]", c.config_map_namespace, c.config_map_name, c.config_key);
        let Some(data) = self.cluster.get_config_map(&c.config_map_namespace, &c.config_map_name).await?
        else {
            return Ok(Err(format!("ConfigMap {}/{} not found", c.config_map_namespace, c.config_map_name)));
        };
        let Some(text) = data.get(&c.config_key) else {
            return Ok(Err(format!(
                "ConfigMap {}/{} has no key {:?}",
                c.config_map_namespace, c.config_map_name, c.config_key
            )));
        };
        let backend = Arc::clone(&self.backend);
        let text = text.clone();
        let name = name.to_owned();
        let result = tokio::task::spawn_blocking(move || {
            let file = MigConfigFile::parse(&text, &source).map_err(|e| e.to_string())?;
            let count = backend.devices().map_err(|e| e.to_string())?.len();
            let count = u32::try_from(count).map_err(|_| "too many GPUs".to_owned())?;
            let id = |index: u32| backend.pci_device_id(index).map_err(|e| e.to_string());
            let targets = file.targets(&name, count, id).map_err(|e| e.to_string())?;
            plan(backend.as_ref(), &targets).map_err(|e| e.to_string())
        })
        .await
        .map_err(|err| ClusterError::new("plan the MIG layout", err.to_string()))?;
        Ok(result)
    }

    async fn fail(&self, node: &NodeState, ours: bool, reason: String) -> Result<Outcome, ManagerError> {
        tracing::warn!(%reason, "MIG configuration failed");
        if ours {
            self.end_maintenance(node, None).await?;
        }
        let mut patch = MetadataPatch::default();
        if node.labels.get(STATE_LABEL).map(String::as_str) != Some(state::FAILED) {
            patch.labels.insert(STATE_LABEL.to_owned(), Some(state::FAILED.to_owned()));
        }
        if node.annotations.get(REASON_ANNOTATION) != Some(&reason) {
            patch.annotations.insert(REASON_ANNOTATION.to_owned(), Some(reason.clone()));
        }
        if !patch.is_empty() {
            self.cluster.patch_node_metadata(&self.config.node_name, &patch).await?;
        }
        Ok(Outcome::Failed(reason))
    }

    /// GFD labels when enabled, and the state label when `state_value` is given (then `reason` `None`
    /// removes the reason annotation).
    async fn publish(
        &self,
        node: &NodeState,
        state_value: Option<&str>,
        reason: Option<String>,
    ) -> Result<(), ManagerError> {
        let mut patch = MetadataPatch::default();
        if self.config.gfd_labels {
            let backend = Arc::clone(&self.backend);
            let machine = self.config.machine.clone();
            let facts = tokio::task::spawn_blocking(move || {
                NodeFacts::from_backend(backend.as_ref(), machine).map_err(|e| e.to_string())
            })
            .await
            .map_err(|err| ClusterError::new("read the GPUs", err.to_string()))?;
            match facts {
                Ok(facts) => {
                    patch.labels = label_patch(&node.labels, &gfd_labels(&facts, self.config.mig_strategy))
                }
                Err(err) => tracing::warn!(%err, "GPU facts unavailable; GFD labels not refreshed"),
            }
        }
        let Some(state_value) = state_value else {
            if !patch.is_empty() {
                self.cluster.patch_node_metadata(&self.config.node_name, &patch).await?;
            }
            return Ok(());
        };
        if node.labels.get(STATE_LABEL).map(String::as_str) != Some(state_value) {
            patch.labels.insert(STATE_LABEL.to_owned(), Some(state_value.to_owned()));
        }
        match reason {
            Some(r) if node.annotations.get(REASON_ANNOTATION) != Some(&r) => {
                patch.annotations.insert(REASON_ANNOTATION.to_owned(), Some(r));
            }
            None if node.annotations.contains_key(REASON_ANNOTATION) => {
                patch.annotations.insert(REASON_ANNOTATION.to_owned(), None);
            }
            _ => {}
        }
        if !patch.is_empty() {
            self.cluster.patch_node_metadata(&self.config.node_name, &patch).await?;
        }
        Ok(())
    }

    async fn begin_maintenance(&self, node: NodeState) -> Result<NodeState, ManagerError> {
        let name = &self.config.node_name;
        let mut patch = MetadataPatch::default();
        if node.labels.get(STATE_LABEL).map(String::as_str) != Some(state::PENDING) {
            patch.labels.insert(STATE_LABEL.to_owned(), Some(state::PENDING.to_owned()));
        }
        let has_taint = node.taints.iter().any(|t| t.key == TAINT_KEY);
        if !has_taint && !node.unschedulable {
            patch.annotations.insert(CORDONED_ANNOTATION.to_owned(), Some("true".to_owned()));
        }
        if !patch.is_empty() {
            self.cluster.patch_node_metadata(name, &patch).await?;
        }
        if !has_taint || !node.unschedulable {
            let node = self.cluster.get_node(name).await?;
            let mut taints = node.taints.clone();
            if !taints.iter().any(|t| t.key == TAINT_KEY) {
                taints.push(NodeTaint {
                    key: TAINT_KEY.to_owned(),
                    value: None,
                    effect: "NoSchedule".to_owned(),
                });
            }
            self.cluster.set_node_spec(name, &node.resource_version, true, &taints).await?;
            tracing::info!(node = %name, "node cordoned and tainted for the MIG change");
        }
        Ok(self.cluster.get_node(name).await?)
    }

    async fn end_maintenance(&self, node: &NodeState, success: Option<&str>) -> Result<(), ManagerError> {
        let name = &self.config.node_name;
        let cordoned_by_us = node.annotations.get(CORDONED_ANNOTATION).is_some_and(|v| v == "true");
        let taints: Vec<NodeTaint> = node.taints.iter().filter(|t| t.key != TAINT_KEY).cloned().collect();
        let unschedulable = node.unschedulable && !cordoned_by_us;
        if taints.len() != node.taints.len() || unschedulable != node.unschedulable {
            self.cluster.set_node_spec(name, &node.resource_version, unschedulable, &taints).await?;
            tracing::info!(node = %name, uncordoned = cordoned_by_us, "node returned from the MIG change");
        }
        if cordoned_by_us {
            let patch = MetadataPatch {
                annotations: [(CORDONED_ANNOTATION.to_owned(), None)].into_iter().collect(),
                ..MetadataPatch::default()
            };
            self.cluster.patch_node_metadata(name, &patch).await?;
        }
        if let Some(value) = success {
            let node = self.cluster.get_node(name).await?;
            self.publish(&node, Some(value), None).await?;
        }
        Ok(())
    }

    fn is_gpu_pod(&self, resources: &std::collections::BTreeSet<String>) -> bool {
        resources.iter().any(|r| self.config.gpu_resource_prefixes.iter().any(|p| r.starts_with(p.as_str())))
    }

    /// Evicts the GPU pods; `Some(reason)` while any remains.
    async fn evict_gpu_pods(&self) -> Result<Option<String>, ManagerError> {
        let pods = self.cluster.list_node_pods(&self.config.node_name).await?;
        let mut waiting = Vec::new();
        for pod in pods.iter().filter(|p| self.is_gpu_pod(&p.resources)) {
            if matches!(pod.phase.as_str(), "Succeeded" | "Failed") {
                continue;
            }
            let key = format!("{}/{}", pod.namespace, pod.name);
            if pod.deleting {
                waiting.push(format!("{key} is terminating"));
                continue;
            }
            match self.cluster.evict_pod(&pod.namespace, &pod.name).await? {
                EvictOutcome::Evicted => {
                    tracing::info!(pod = %key, "GPU pod evicted");
                    waiting.push(format!("{key} evicted"));
                }
                EvictOutcome::NotFound => {}
                EvictOutcome::Refused(message) => {
                    tracing::info!(pod = %key, %message, "eviction refused; retrying later");
                    waiting.push(format!("{key}: eviction refused: {message}"));
                }
            }
        }
        if waiting.is_empty() {
            return Ok(None);
        }
        // Evicted pods may be gone at once; look again before waiting a period.
        let left: Vec<_> = self
            .cluster
            .list_node_pods(&self.config.node_name)
            .await?
            .into_iter()
            .filter(|p| self.is_gpu_pod(&p.resources) && !matches!(p.phase.as_str(), "Succeeded" | "Failed"))
            .map(|p| format!("{}/{}", p.namespace, p.name))
            .collect();
        Ok((!left.is_empty()).then(|| format!("{} GPU pod(s) left: {}", left.len(), waiting.join("; "))))
    }

    async fn restart_device_plugin(&self) -> Result<(), ManagerError> {
        let selector = &self.config.device_plugin_selector;
        if selector.is_empty() {
            return Ok(());
        }
        for pod in self.cluster.list_node_pods(&self.config.node_name).await? {
            if selector.iter().all(|(k, v)| pod.labels.get(k) == Some(v)) {
                self.cluster.delete_pod(&pod.namespace, &pod.name).await?;
                tracing::info!(pod = %format!("{}/{}", pod.namespace, pod.name), "device plugin pod deleted to re-advertise MIG devices");
            }
        }
        Ok(())
    }
}
