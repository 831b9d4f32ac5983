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
//!    prefixes, `nvidia.com/` by default) — or, with [`EvictionScope::Drain`] (`--drain`), every pod but
//!    DaemonSet and mirror pods ([`crate::drain`]) — through the Eviction API; a 429 (PodDisruptionBudget) is
//!    retried on a later pass. The pass ends while any such pod remains (the loop comes back after the retry
//!    period, doubled on each further wait up to [`ManagerConfig::max_retry_period`]).
//! 6. Apply the layout through the backend's MIG calls ([`crate::reset::apply_with_reset`]); a MIG mode left
//!    pending is applied by a GPU reset. A backend failure is state `failed` with the reason, and the node is
//!    returned to service. A pending mode no reset can apply is state `reboot-required`, the annotation
//!    `nvidia.com/mig.config.reboot-required` and the Node condition `MIGRebootRequired=True`
//!    ([`crate::reset`]); the node stays in maintenance until it has rebooted and the layout applies.
//! 7. Make the device plugin re-advertise: our device plugin reads the MIG layout when it starts
//!    (`vgpu-deviceplugin`'s daemon builds its MIG plugins once), so the manager deletes the device plugin
//!    pods on the node (label selector, default `app.kubernetes.io/name=vgpu-device-plugin`); their
//!    DaemonSet starts them again and they register the new `nvidia.com/mig-<profile>` resources.
//! 8. Publish the GFD labels ([`vgpu_core::gfd`]) when enabled, close the maintenance (taint removed,
//!    uncordoned if the cordon was ours), state `success`, reason removed, a reboot request withdrawn
//!    (annotation removed, condition `False`).
//!
//! Every step is idempotent, so a manager restarted in the middle converges on its next pass.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use vgpu_core::{backend::DeviceBackend, node_config::MigStrategy};

use vgpu_core::gfd::{NodeFacts, gfd_labels, label_patch};

use crate::{
    CONFIG_LABEL, CORDONED_ANNOTATION, REASON_ANNOTATION, REBOOT_ANNOTATION, REBOOT_CONDITION, STATE_LABEL,
    TAINT_KEY,
    cluster::{ClusterError, EvictOutcome, MetadataPatch, MigCluster, NodeCondition, NodeState, NodeTaint},
    config::MigConfigFile,
    drain::{EvictionScope, keep_reason, retry_delay},
    plan::plan,
    reset::{ApplyFailure, apply_with_reset, rebooted_since, request_value},
};

/// `nvidia.com/mig.config.state` values.
pub mod state {
    /// Maintenance in progress.
    pub const PENDING: &str = "pending";
    /// The node has the layout its label asks.
    pub const SUCCESS: &str = "success";
    /// The layout could not be applied; the reason is in the annotation.
    pub const FAILED: &str = "failed";
    /// A MIG mode is pending and no GPU reset can apply it: the node must reboot ([`crate::reset`]); the
    /// reason is in the annotation.
    pub const REBOOT_REQUIRED: &str = "reboot-required";
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
    /// Period while waiting for evictions (the first wait; later ones double).
    pub retry_period: Duration,
    /// The longest wait between passes while evictions are refused or pods terminate.
    pub max_retry_period: Duration,
    /// Which pods leave the node: the GPU pods, or all of them ([`EvictionScope::Drain`]).
    pub eviction: EvictionScope,
    /// Whether to reset a GPU whose MIG mode is pending (otherwise a reboot is requested at once).
    pub gpu_reset: bool,
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
            max_retry_period: Duration::from_secs(60),
            eviction: EvictionScope::GpuPods,
            gpu_reset: true,
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
    /// In maintenance, waiting for pods to go (the reasons, e.g. refused evictions).
    Waiting(String),
    /// In maintenance, waiting for a node reboot (state `reboot-required`, the reason).
    RebootRequired(String),
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
        let mut waits = 0u32;
        loop {
            let wait = match self.reconcile().await {
                Ok(Outcome::Waiting(why)) => {
                    let wait = retry_delay(self.config.retry_period, waits, self.config.max_retry_period);
                    waits = waits.saturating_add(1);
                    tracing::info!(%why, ?wait, "waiting for pods to leave the node");
                    wait
                }
                Ok(Outcome::RebootRequired(why)) => {
                    waits = 0;
                    tracing::warn!(%why, "waiting for the node to reboot");
                    self.config.period
                }
                Ok(outcome) => {
                    waits = 0;
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
            self.withdraw_reboot_request().await?;
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
            self.withdraw_reboot_request().await?;
            return Ok(Outcome::InSync);
        }

        let node = self.begin_maintenance(node).await?;
        if let Some(waiting) = self.evict_pods().await? {
            return Ok(Outcome::Waiting(waiting));
        }
        let backend = Arc::clone(&self.backend);
        let reset_allowed = self.config.gpu_reset;
        let applied =
            tokio::task::spawn_blocking(move || apply_with_reset(backend.as_ref(), &plans, reset_allowed))
                .await
                .map_err(|err| ClusterError::new("apply the MIG layout", err.to_string()))?;
        match applied {
            Ok(reset) if !reset.is_empty() => {
                tracing::info!(gpus = ?reset, "GPU reset applied the pending MIG mode")
            }
            Ok(_) => {}
            Err(ApplyFailure::RebootRequired { reason, .. }) => {
                return self.request_reboot(&node, reason).await;
            }
            Err(err) => {
                tracing::error!(%err, "MIG layout not applied");
                return self.fail(&node, true, err.to_string()).await;
            }
        }
        self.restart_device_plugin().await?;
        let node = self.cluster.get_node(node_name).await?;
        self.end_maintenance(&node, Some(state::SUCCESS)).await?;
        self.withdraw_reboot_request().await?;
        tracing::info!(config = %name, "MIG configuration applied");
        Ok(Outcome::Applied)
    }

    /// Asks for a node reboot ([`crate::reset`]), keeping the node in maintenance; or, when the node already
    /// rebooted for this request and the mode is still pending, state `failed` (no second reboot).
    async fn request_reboot(&self, node: &NodeState, reason: String) -> Result<Outcome, ManagerError> {
        if let Some(requested) = node.annotations.get(REBOOT_ANNOTATION)
            && rebooted_since(requested, &node.boot_id)
        {
            let reason = format!(
                "{reason}; still pending after the node rebooted (boot ID {requested} -> {}); remove the annotation {REBOOT_ANNOTATION} to request another reboot",
                node.boot_id
            );
            let outcome = self.fail(node, true, reason.clone()).await?;
            self.set_reboot_condition(node, false, "MIGModeStillPending", &reason).await?;
            return Ok(outcome);
        }
        let mut patch = MetadataPatch::default();
        if node.labels.get(STATE_LABEL).map(String::as_str) != Some(state::REBOOT_REQUIRED) {
            patch.labels.insert(STATE_LABEL.to_owned(), Some(state::REBOOT_REQUIRED.to_owned()));
        }
        if node.annotations.get(REASON_ANNOTATION) != Some(&reason) {
            patch.annotations.insert(REASON_ANNOTATION.to_owned(), Some(reason.clone()));
        }
        if !node.annotations.contains_key(REBOOT_ANNOTATION) {
            patch.annotations.insert(REBOOT_ANNOTATION.to_owned(), Some(request_value(&node.boot_id)));
            tracing::warn!(%reason, boot_id = %node.boot_id, "requesting a node reboot to apply the MIG mode");
        }
        if !patch.is_empty() {
            self.cluster.patch_node_metadata(&self.config.node_name, &patch).await?;
        }
        self.set_reboot_condition(node, true, "MIGModePending", &reason).await?;
        Ok(Outcome::RebootRequired(reason))
    }

    /// Sets the `MIGRebootRequired` condition unless it already has `status` (a `False` one is only written
    /// over a `True` one).
    async fn set_reboot_condition(
        &self,
        node: &NodeState,
        status: bool,
        reason: &str,
        message: &str,
    ) -> Result<(), ManagerError> {
        let current = node.conditions.get(REBOOT_CONDITION).map(String::as_str);
        let wanted = if status { "True" } else { "False" };
        if current == Some(wanted) || (!status && current.is_none()) {
            return Ok(());
        }
        let condition = NodeCondition {
            type_: REBOOT_CONDITION.to_owned(),
            status,
            reason: reason.to_owned(),
            message: message.to_owned(),
        };
        self.cluster.set_node_condition(&self.config.node_name, &condition).await?;
        Ok(())
    }

    /// Removes the reboot annotation and sets the condition `False`, when either is there.
    async fn withdraw_reboot_request(&self) -> Result<(), ManagerError> {
        let node = self.cluster.get_node(&self.config.node_name).await?;
        if node.annotations.contains_key(REBOOT_ANNOTATION) {
            let patch = MetadataPatch {
                annotations: [(REBOOT_ANNOTATION.to_owned(), None)].into_iter().collect(),
                ..MetadataPatch::default()
            };
            self.cluster.patch_node_metadata(&self.config.node_name, &patch).await?;
            tracing::info!("node reboot request withdrawn");
        }
        self.set_reboot_condition(&node, false, "MIGConfigApplied", "the MIG configuration is applied").await
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
        // A reboot request still waiting for its reboot keeps its state (no flapping on every pass).
        let awaiting_reboot = node.labels.get(STATE_LABEL).map(String::as_str)
            == Some(state::REBOOT_REQUIRED)
            && node.annotations.get(REBOOT_ANNOTATION).is_some_and(|r| !rebooted_since(r, &node.boot_id));
        if !awaiting_reboot && node.labels.get(STATE_LABEL).map(String::as_str) != Some(state::PENDING) {
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

    fn evicted(&self, pod: &crate::cluster::PodState) -> bool {
        keep_reason(pod, self.config.eviction, &self.config.gpu_resource_prefixes).is_none()
    }

    /// Evicts the pods of the eviction scope; `Some(reason)` while any remains.
    async fn evict_pods(&self) -> Result<Option<String>, ManagerError> {
        let pods = self.cluster.list_node_pods(&self.config.node_name).await?;
        let mut waiting = Vec::new();
        for pod in pods.iter().filter(|p| self.evicted(p)) {
            let key = format!("{}/{}", pod.namespace, pod.name);
            if pod.deleting {
                waiting.push(format!("{key} is terminating"));
                continue;
            }
            match self.cluster.evict_pod(&pod.namespace, &pod.name).await? {
                EvictOutcome::Evicted => {
                    tracing::info!(pod = %key, scope = ?self.config.eviction, "pod evicted");
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
            .filter(|p| self.evicted(p))
            .map(|p| format!("{}/{}", p.namespace, p.name))
            .collect();
        let what = match self.config.eviction {
            EvictionScope::GpuPods => "GPU pod(s)",
            EvictionScope::Drain => "pod(s)",
        };
        Ok((!left.is_empty()).then(|| format!("{} {what} left: {}", left.len(), waiting.join("; "))))
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
