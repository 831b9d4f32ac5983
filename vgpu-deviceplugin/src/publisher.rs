//! The node publisher (contract §1.1, §2): keeps the node's `node-device-register`, `node-config-info`,
//! `node-device-topology` (gate `TopologyAwareGPUAllocation`) annotations and driver/CUDA labels up to date,
//! and removes the stale capacity of resource plugins whose gate is off.
//!
//! * Publishes at start, every [`PublisherConfig::interval`] (30 s) and at once when the device health
//!   changes; a failed publish is retried after [`PublisherConfig::retry_min`], doubling up to
//!   [`PublisherConfig::retry_max`]. Errors are logged, never fatal.
//! * Every publish also deletes the deprecated `node-device-heartbeat` annotation.
//! * On shutdown the annotations are removed (labels stay), with a few attempts.
//! * Stale resources are removed every [`PublisherConfig::stale_poll`] (5 s) until
//!   [`PublisherConfig::stale_clean_passes`] (6) consecutive passes find nothing to remove.

use std::{collections::BTreeMap, future::Future, sync::Arc, time::Duration};

use vgpu_core::{
    backend::LinkMatrix,
    codec::{node_config_info, node_devices},
    domain::ResourceDomain,
    model::{GpuDevice, NodeDeviceInventory},
    node_config::NodeSettings,
    topology::{DeviceTopology, GpuLinks, InvalidLinkType, P2PLinkType},
};

use crate::{
    cluster::{ClusterError, NodeClient, NodePatch},
    inventory::DeviceState,
};

/// Timing of the publisher.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublisherConfig {
    /// Period of the regular publish (upstream 30 s).
    pub interval: Duration,
    /// First retry delay after a failed publish (upstream retries after 10 s).
    pub retry_min: Duration,
    /// Longest retry delay.
    pub retry_max: Duration,
    /// Period of the stale-resource pass (upstream 5 s).
    pub stale_poll: Duration,
    /// Consecutive clean passes after which the stale-resource pass stops (upstream 6).
    pub stale_clean_passes: u32,
    /// Attempts to remove the annotations on shutdown.
    pub shutdown_attempts: u32,
}

impl Default for PublisherConfig {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(30),
            retry_min: Duration::from_secs(10),
            retry_max: Duration::from_secs(30),
            stale_poll: Duration::from_secs(5),
            stale_clean_passes: 6,
            shutdown_attempts: 3,
        }
    }
}

/// Driver versions for the node labels.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DriverLabels {
    /// `node-driver-version`, e.g. `570.86.10` (no label when empty).
    pub driver_version: String,
    /// CUDA driver version `(major, minor)` (`node-cuda-version` = `major.minor`, `node-cuda-major`,
    /// `node-cuda-minor`).
    pub cuda_version: Option<(u32, u32)>,
}

/// Building the node patch failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PublishError {
    /// The device list could not be encoded.
    #[error("encoding {annotation}: {source}")]
    Encode {
        /// The annotation.
        annotation: String,
        /// The codec error.
        #[source]
        source: vgpu_core::codec::CodecError,
    },
    /// The API call failed.
    #[error(transparent)]
    Cluster(#[from] ClusterError),
}

/// The `node-device-topology` value of a backend link matrix: per GPU, peer index → link codes (pairs with
/// no link information are left out).
pub fn topology_from_matrix(matrix: &LinkMatrix) -> Result<DeviceTopology, InvalidLinkType> {
    let mut gpus = Vec::with_capacity(matrix.len());
    for (i, row) in matrix.rows().iter().enumerate() {
        let mut links = BTreeMap::new();
        for (j, cell) in row.iter().enumerate() {
            if i == j || cell.is_empty() {
                continue;
            }
            let codes =
                cell.iter().map(|c| P2PLinkType::from_code(i64::from(*c))).collect::<Result<Vec<_>, _>>()?;
            links.insert(j, codes);
        }
        gpus.push(GpuLinks { index: i, links });
    }
    Ok(DeviceTopology { gpus })
}

/// Publishes this node's device annotations and labels.
pub struct NodePublisher {
    node: String,
    domain: ResourceDomain,
    settings: NodeSettings,
    state: DeviceState,
    client: Arc<dyn NodeClient>,
    config: PublisherConfig,
    topology: Option<DeviceTopology>,
    driver: DriverLabels,
    gfd: BTreeMap<String, String>,
    stale_resources: Vec<String>,
    live_settings: Option<tokio::sync::watch::Receiver<NodeSettings>>,
}

impl std::fmt::Debug for NodePublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodePublisher")
            .field("node", &self.node)
            .field("config", &self.config)
            .field("stale_resources", &self.stale_resources)
            .finish_non_exhaustive()
    }
}

impl NodePublisher {
    /// A publisher of `state` for `node`, without topology, labels or stale resources.
    pub fn new(
        node: impl Into<String>,
        domain: ResourceDomain,
        settings: NodeSettings,
        state: DeviceState,
        client: Arc<dyn NodeClient>,
    ) -> Self {
        Self {
            node: node.into(),
            domain,
            settings,
            state,
            client,
            config: PublisherConfig::default(),
            topology: None,
            driver: DriverLabels::default(),
            gfd: BTreeMap::new(),
            stale_resources: Vec::new(),
            live_settings: None,
        }
    }

    /// Sets the timing.
    pub fn with_config(mut self, config: PublisherConfig) -> Self {
        self.config = config;
        self
    }

    /// Publishes `node-device-topology` too (gate `TopologyAwareGPUAllocation`).
    pub fn with_topology(mut self, topology: DeviceTopology) -> Self {
        self.topology = Some(topology);
        self
    }

    /// Publishes the driver/CUDA labels.
    pub fn with_driver_labels(mut self, driver: DriverLabels) -> Self {
        self.driver = driver;
        self
    }

    /// Publishes these GPU feature labels too ([`vgpu_core::gfd::gfd_labels`], `--gfd-labels`), in every
    /// patch, so node-feature-discovery rules written for gpu-feature-discovery keep working without GFD.
    pub fn with_gfd_labels(mut self, labels: BTreeMap<String, String>) -> Self {
        self.gfd = labels;
        self
    }

    /// Removes these extended resources from the node status (plugins whose gate is off).
    pub fn with_stale_resources(mut self, resources: Vec<String>) -> Self {
        self.stale_resources = resources;
        self
    }

    /// Publishes the settings `settings` holds (`node-config-info`) instead of those given to
    /// [`NodePublisher::new`], as they change (the node configuration reloaded while the plugin runs,
    /// [`crate::node_config_watch`]); a change publishes at once.
    pub fn with_live_settings(mut self, settings: tokio::sync::watch::Receiver<NodeSettings>) -> Self {
        self.live_settings = Some(settings);
        self
    }

    /// The settings published now.
    fn settings(&self) -> NodeSettings {
        match &self.live_settings {
            Some(rx) => rx.borrow().clone(),
            None => self.settings.clone(),
        }
    }

    /// The patch publishing `devices`.
    pub fn publish_patch(&self, devices: &[GpuDevice]) -> Result<NodePatch, PublishError> {
        let d = &self.domain;
        let mut patch = NodePatch::default();
        let mut sorted = devices.to_vec();
        sorted.sort_by_key(|g| g.index);
        let register = node_devices::encode(&NodeDeviceInventory::new(sorted))
            .map_err(|source| PublishError::Encode { annotation: d.node_device_register(), source })?;
        let config_info = node_config_info::encode(&self.settings().vgpu_config())
            .map_err(|source| PublishError::Encode { annotation: d.node_config_info(), source })?;
        patch.annotations.insert(d.node_device_register(), Some(register));
        patch.annotations.insert(d.node_config_info(), Some(config_info));
        if let Some(topology) = &self.topology {
            patch.annotations.insert(d.node_device_topology(), Some(topology.encode()));
        }
        patch.annotations.insert(d.node_device_heartbeat(), None);
        if !self.driver.driver_version.is_empty() {
            patch.labels.insert(d.node_driver_version(), Some(self.driver.driver_version.clone()));
        }
        if let Some((major, minor)) = self.driver.cuda_version {
            patch.labels.insert(d.node_cuda_version(), Some(format!("{major}.{minor}")));
            patch.labels.insert(d.node_cuda_major(), Some(major.to_string()));
            patch.labels.insert(d.node_cuda_minor(), Some(minor.to_string()));
        }
        for (key, value) in &self.gfd {
            patch.labels.insert(key.clone(), Some(value.clone()));
        }
        Ok(patch)
    }

    /// The patch removing the published annotations (shutdown).
    pub fn removal_patch(&self) -> NodePatch {
        let d = &self.domain;
        let mut patch = NodePatch::default();
        for key in [d.node_device_register(), d.node_config_info(), d.node_device_topology()] {
            patch.annotations.insert(key, None);
        }
        patch
    }

    /// Publishes the current devices once.
    pub async fn publish_once(&self) -> Result<(), PublishError> {
        let patch = self.publish_patch(&self.state.devices())?;
        self.client.patch_node(&self.node, &patch).await?;
        Ok(())
    }

    async fn publish_loop(&self) {
        let mut rx = self.state.subscribe();
        let mut settings = self.live_settings.clone();
        let mut watching = true;
        let mut backoff = self.config.retry_min;
        loop {
            rx.borrow_and_update();
            if let Some(s) = &mut settings {
                s.borrow_and_update();
            }
            let wait = match self.publish_once().await {
                Ok(()) => {
                    tracing::debug!(node = %self.node, "published node device annotations");
                    backoff = self.config.retry_min;
                    self.config.interval
                }
                Err(err) => {
                    let wait = backoff;
                    tracing::warn!(node = %self.node, %err, retry_in = ?wait, "publishing node annotations failed");
                    backoff = backoff.saturating_mul(2).min(self.config.retry_max);
                    wait
                }
            };
            if watching {
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    changed = rx.changed() => match changed {
                        Ok(()) => tracing::info!(node = %self.node, "device health changed; publishing now"),
                        Err(_) => {
                            watching = false;
                            tokio::time::sleep(wait).await;
                        }
                    },
                    Ok(()) = async {
                        match &mut settings {
                            Some(s) => s.changed().await,
                            None => std::future::pending().await,
                        }
                    } => tracing::info!(node = %self.node, "node configuration changed; publishing now"),
                }
            } else {
                tokio::time::sleep(wait).await;
            }
        }
    }

    async fn stale_loop(&self) {
        if self.stale_resources.is_empty() {
            return;
        }
        let mut clean = 0;
        while clean < self.config.stale_clean_passes {
            match self.client.remove_node_resources(&self.node, &self.stale_resources).await {
                Ok(true) => {
                    tracing::info!(node = %self.node, resources = ?self.stale_resources, "removed stale node resources");
                    clean = 0;
                }
                Ok(false) => clean += 1,
                Err(err) => {
                    tracing::warn!(node = %self.node, %err, "removing stale node resources failed");
                    clean = 0;
                }
            }
            tokio::time::sleep(self.config.stale_poll).await;
        }
        tracing::debug!(node = %self.node, "no stale node resources left");
    }

    /// Removes the published annotations, retrying a few times.
    pub async fn unpublish(&self) -> Result<(), ClusterError> {
        let patch = self.removal_patch();
        let mut delay = self.config.retry_min.min(Duration::from_secs(1));
        let mut attempt = 1;
        loop {
            match self.client.patch_node(&self.node, &patch).await {
                Ok(()) => {
                    tracing::info!(node = %self.node, "removed node device annotations");
                    return Ok(());
                }
                Err(err) if attempt >= self.config.shutdown_attempts.max(1) => return Err(err),
                Err(err) => {
                    tracing::warn!(node = %self.node, %err, attempt, "removing node annotations failed; retrying");
                    tokio::time::sleep(delay).await;
                    delay = delay.saturating_mul(2);
                    attempt += 1;
                }
            }
        }
    }

    /// Publishes until `shutdown` completes, then removes the annotations. Never fails: errors are logged.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let stale = async {
            self.stale_loop().await;
            std::future::pending::<()>().await;
        };
        tokio::select! {
            () = shutdown => {}
            () = self.publish_loop() => {}
            () = stale => {}
        }
        if let Err(err) = self.unpublish().await {
            tracing::error!(node = %self.node, %err, "could not remove node device annotations on shutdown");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vgpu_core::backend::links::{LINK_CROSS_CPU, nvlinks};

    #[test]
    fn topology_from_links() {
        let mut m = LinkMatrix::new(3);
        m.set_pair(0, 1, vec![LINK_CROSS_CPU, nvlinks(2).unwrap()]);
        let t = topology_from_matrix(&m).unwrap();
        assert_eq!(
            t.encode(),
            r#"[{"index":0,"links":{"1":[1,8]}},{"index":1,"links":{"0":[1,8]}},{"index":2,"links":{}}]"#
        );
    }
}
