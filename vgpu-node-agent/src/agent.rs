//! The scan loop: [`NodeAgent::scan_once`] makes the cluster match one sysfs scan; [`NodeAgent::run`] refuses
//! control-plane nodes, then scans every [`AgentConfig::scan_interval`] until shutdown.
//!
//! One scan, in order:
//!
//! | step | call | on failure |
//! |---|---|---|
//! | vendor table | `config_map_data` (when configured) | built-in table, `error!` once per distinct reason |
//! | scan | [`vgpu_core::discovery::discover`] on a blocking thread | the scan fails ([`AgentError::Discovery`]); nothing is written or deleted |
//! | list | `list_gpus(node)` | the scan fails |
//! | write | `apply_gpu` for each GPU that is new, changed, or missing from the list | logged, counted, the rest go on |
//! | delete | `delete_gpu` for each listed PhysicalGPU of this node no longer found | logged, counted, the rest go on |
//! | node labels | `apply_node_labels` when they differ from the last applied | logged, counted |
//!
//! An unchanged GPU costs no write: the agent remembers what it applied last. `DriverBound`'s
//! `lastTransitionTime` is set when its status changes (seconds precision).

use std::{
    collections::{BTreeMap, BTreeSet},
    future::Future,
    path::PathBuf,
    sync::Arc,
    time::Duration,
};

use vgpu_core::discovery::{DiscoveryConfig, DiscoveryError, discover, pci_ids::DEFAULT_PCI_IDS_PATHS};
use vgpu_kube::error::CallError;

use crate::{
    cluster::{AgentCluster, GpuObject},
    desired, vendors,
    vendors::VendorsError,
};

/// The label that marks a control-plane node.
pub const CONTROL_PLANE_LABEL: &str = "node-role.kubernetes.io/control-plane";

/// The node agent's resolved configuration (nothing below it reads flags or the environment).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentConfig {
    /// This node's name.
    pub node_name: String,
    /// The sysfs mount (`/sys`, `/host-sys`).
    pub sysfs_root: PathBuf,
    /// `pci.ids` candidates, first readable wins.
    pub pci_ids_paths: Vec<PathBuf>,
    /// Time between scans.
    pub scan_interval: Duration,
    /// The API group of PhysicalGPU.
    pub group: String,
    /// The domain of the labels (`<domain>/vendor`).
    pub label_domain: String,
    /// The vendors ConfigMap, `(namespace, name)`; `None` uses the built-in table silently.
    pub vendors_config_map: Option<(String, String)>,
    /// Run even on a control-plane node.
    pub allow_control_plane: bool,
    /// Also scan at once on kernel PCI uevents ([`crate::uevent`]), where the socket can be opened.
    pub watch_uevents: bool,
}

/// How long after a PCI uevent the agent waits before scanning (the rest of the burst: add, bind).
pub const UEVENT_SETTLE: Duration = Duration::from_secs(1);

impl AgentConfig {
    /// Defaults for `node_name`: `/sys`, the usual `pci.ids` paths, 60 s, group and label domain
    /// `gpu.deckhouse.io`, no ConfigMap, control-plane refused, PCI uevents watched.
    pub fn new(node_name: impl Into<String>) -> Self {
        Self {
            node_name: node_name.into(),
            sysfs_root: PathBuf::from(vgpu_core::discovery::DEFAULT_SYSFS_ROOT),
            pci_ids_paths: DEFAULT_PCI_IDS_PATHS.iter().map(PathBuf::from).collect(),
            scan_interval: Duration::from_secs(60),
            group: vgpu_api::DEFAULT_GROUP.to_owned(),
            label_domain: vgpu_api::DEFAULT_GROUP.to_owned(),
            vendors_config_map: None,
            allow_control_plane: false,
            watch_uevents: true,
        }
    }
}

/// Parses a `namespace/name` ConfigMap reference.
///
/// ```
/// use vgpu_node_agent::agent::parse_config_map_ref;
///
/// assert_eq!(parse_config_map_ref("d8-gpu/gpu-supported-vendors").unwrap(), ("d8-gpu".into(), "gpu-supported-vendors".into()));
/// assert!(parse_config_map_ref("gpu-supported-vendors").is_err());
/// ```
pub fn parse_config_map_ref(value: &str) -> Result<(String, String), String> {
    let valid = |s: &str| {
        !s.is_empty()
            && s.len() <= 253
            && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
    };
    match value.split_once('/') {
        Some((ns, name)) if valid(ns) && valid(name) => Ok((ns.to_owned(), name.to_owned())),
        _ => Err(format!(
            "{value:?} is not a ConfigMap reference (expected <namespace>/<name>, e.g. d8-gpu/gpu-supported-vendors)"
        )),
    }
}

/// Why the agent stopped or a scan failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AgentError {
    /// This node's Node object does not exist.
    #[error("node {0} not found (check --node-name / NODE_NAME)")]
    NodeNotFound(String),
    /// The node is a control-plane node and `--allow-control-plane` was not given.
    #[error(
        "node {0} has the {CONTROL_PLANE_LABEL} label; the node agent does not run on control-plane nodes (pass --allow-control-plane to override)"
    )]
    ControlPlane(String),
    /// The sysfs scan could not run.
    #[error("scan failed: {0}")]
    Discovery(#[from] DiscoveryError),
    /// The blocking scan task failed.
    #[error("scan task failed: {0}")]
    ScanTask(String),
    /// A read the scan depends on failed.
    #[error(transparent)]
    Cluster(#[from] CallError),
    /// Some writes failed (the others were made); the next scan retries them.
    #[error("{count} write(s) failed, first: {first}")]
    Writes {
        /// How many failed.
        count: usize,
        /// The first failure.
        first: CallError,
    },
}

/// What one scan did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScanOutcome {
    /// The PhysicalGPUs of this node after the scan, by name.
    pub gpus: Vec<String>,
    /// Those written (new or changed).
    pub applied: Vec<String>,
    /// Those deleted.
    pub deleted: Vec<String>,
    /// The node labels the agent owns.
    pub node_labels: BTreeMap<String, String>,
    /// Why the vendors ConfigMap was not used, if it was configured and not used.
    pub vendors_error: Option<VendorsError>,
    /// Discovery warnings (one line each).
    pub warnings: Vec<String>,
}

/// The node agent. See the module docs.
pub struct NodeAgent<C> {
    cluster: Arc<C>,
    config: AgentConfig,
    applied: BTreeMap<String, GpuObject>,
    applied_labels: Option<BTreeMap<String, String>>,
    last_vendors_error: Option<String>,
}

impl<C> std::fmt::Debug for NodeAgent<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeAgent")
            .field("config", &self.config)
            .field("applied", &self.applied.len())
            .finish_non_exhaustive()
    }
}

impl<C: AgentCluster> NodeAgent<C> {
    /// An agent writing through `cluster`.
    pub fn new(cluster: Arc<C>, config: AgentConfig) -> Self {
        Self { cluster, config, applied: BTreeMap::new(), applied_labels: None, last_vendors_error: None }
    }

    /// The configuration.
    pub fn config(&self) -> &AgentConfig {
        &self.config
    }

    /// Checks that the Node exists and is not a control-plane node (unless allowed).
    pub async fn check_node(&self) -> Result<(), AgentError> {
        let node = &self.config.node_name;
        let labels =
            self.cluster.node_labels(node).await?.ok_or_else(|| AgentError::NodeNotFound(node.clone()))?;
        if labels.contains_key(CONTROL_PLANE_LABEL) && !self.config.allow_control_plane {
            return Err(AgentError::ControlPlane(node.clone()));
        }
        Ok(())
    }

    /// One scan (see the module docs).
    pub async fn scan_once(&mut self) -> Result<ScanOutcome, AgentError> {
        let mut outcome = ScanOutcome::default();
        let table = match &self.config.vendors_config_map {
            Some((namespace, name)) => {
                let (table, problem) = vendors::load(self.cluster.as_ref(), namespace, name).await;
                let text = problem.as_ref().map(ToString::to_string);
                if text != self.last_vendors_error {
                    match &text {
                        Some(text) => tracing::error!("{text}"),
                        None => {
                            tracing::info!(configmap = %format!("{namespace}/{name}"), "vendors ConfigMap loaded")
                        }
                    }
                    self.last_vendors_error = text;
                }
                outcome.vendors_error = problem;
                table
            }
            None => vgpu_core::discovery::VendorTable::builtin(),
        };
        let discovery = DiscoveryConfig::default()
            .with_sysfs_root(self.config.sysfs_root.clone())
            .with_pci_ids_paths(self.config.pci_ids_paths.clone())
            .with_vendors(table);
        let report = tokio::task::spawn_blocking(move || discover(&discovery))
            .await
            .map_err(|e| AgentError::ScanTask(e.to_string()))??;
        for warning in &report.warnings {
            tracing::warn!("{warning}");
            outcome.warnings.push(warning.to_string());
        }

        let node = self.config.node_name.clone();
        let mut wanted = BTreeMap::new();
        for gpu in &report.gpus {
            match desired::gpu_object(&node, &self.config.label_domain, gpu) {
                Some(object) => {
                    wanted.insert(object.name.clone(), object);
                }
                None => tracing::error!(
                    address = %gpu.address,
                    "the PhysicalGPU name for this GPU would exceed {} characters (node name too long); skipped",
                    desired::MAX_NAME_LEN
                ),
            }
        }
        let existing: BTreeSet<String> = self.cluster.list_gpus(&node).await?.into_iter().collect();

        let mut failures = Vec::new();
        let now = now_rfc3339();
        for (name, mut object) in wanted.clone() {
            let previous = self.applied.get(&name);
            stamp_conditions(&mut object, previous, &now);
            if previous == Some(&object) && existing.contains(&name) {
                continue;
            }
            match self.cluster.apply_gpu(&object).await {
                Ok(()) => {
                    tracing::info!(%name, address = %object.spec.pci_address, device = %object.spec.device_name, "PhysicalGPU applied");
                    outcome.applied.push(name.clone());
                    self.applied.insert(name, object);
                }
                Err(err) => {
                    tracing::error!("{err}");
                    self.applied.remove(&name);
                    failures.push(err);
                }
            }
        }
        for name in existing.iter().filter(|n| !wanted.contains_key(*n)) {
            match self.cluster.delete_gpu(name).await {
                Ok(()) => {
                    tracing::info!(%name, "PhysicalGPU deleted: the device is gone");
                    outcome.deleted.push(name.clone());
                    self.applied.remove(name);
                }
                Err(err) => {
                    tracing::error!("{err}");
                    failures.push(err);
                }
            }
        }
        self.applied.retain(|name, _| wanted.contains_key(name));

        let labels = desired::node_labels(&self.config.label_domain, &report.gpus);
        if self.applied_labels.as_ref() != Some(&labels) {
            match self.cluster.apply_node_labels(&node, &labels).await {
                Ok(()) => {
                    tracing::info!(?labels, "node labels applied");
                    self.applied_labels = Some(labels.clone());
                }
                Err(err) => {
                    tracing::error!("{err}");
                    self.applied_labels = None;
                    failures.push(err);
                }
            }
        }
        outcome.node_labels = labels;
        outcome.gpus = wanted.into_keys().collect();

        let count = failures.len();
        match failures.into_iter().next() {
            Some(first) => Err(AgentError::Writes { count, first }),
            None => Ok(outcome),
        }
    }

    /// Checks the node ([`Self::check_node`]), then scans until `shutdown` resolves. A failed scan is logged
    /// and retried after the interval; only the node check ends the loop with an error.
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) -> Result<(), AgentError> {
        self.check_node().await?;
        tokio::pin!(shutdown);
        let mut events = if self.config.watch_uevents {
            match crate::uevent::PciEvents::open() {
                Ok(events) => Some(events),
                Err(err) => {
                    tracing::info!(%err, "no kernel uevents (PCI hot-plug): scanning on the period only");
                    None
                }
            }
        } else {
            None
        };
        loop {
            match self.scan_once().await {
                Ok(outcome) => tracing::info!(
                    gpus = outcome.gpus.len(),
                    applied = outcome.applied.len(),
                    deleted = outcome.deleted.len(),
                    "scan done"
                ),
                Err(err) => tracing::error!("{err}"),
            }
            let next_event = async {
                match events.as_mut() {
                    Some(events) => events.next().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = &mut shutdown => return Ok(()),
                () = tokio::time::sleep(self.config.scan_interval) => {}
                event = next_event => match event {
                    Ok(event) => {
                        tracing::info!(action = %event.action, device = %event.devpath, "PCI uevent: scanning now");
                        // A hot-plug comes as a burst (add, then bind once a driver takes it): scan after it.
                        tokio::time::sleep(UEVENT_SETTLE).await;
                    }
                    Err(err) => {
                        tracing::warn!(%err, "reading kernel uevents failed: scanning on the period only");
                        events = None;
                    }
                },
            }
        }
    }
}

/// Keeps a condition's `lastTransitionTime` from `previous` while its status is unchanged; sets `now` otherwise.
fn stamp_conditions(object: &mut GpuObject, previous: Option<&GpuObject>, now: &str) {
    for condition in &mut object.status.conditions {
        let old = previous.and_then(|p| p.status.conditions.iter().find(|c| c.type_ == condition.type_));
        condition.last_transition_time = match old {
            Some(old) if old.status == condition.status => old.last_transition_time.clone(),
            _ => Some(now.to_owned()),
        };
    }
}

fn now_rfc3339() -> String {
    let now = k8s_openapi::jiff::Timestamp::now();
    k8s_openapi::jiff::Timestamp::from_second(now.as_second()).unwrap_or(now).to_string()
}
