//! [`Daemon`]: everything the `vgpu-device-plugin` binary runs, wired from a backend and cluster clients:
//! device state + health watch, the plugins ([`PluginManager`]) and the [`NodePublisher`]. Restarting the
//! plugins (SIGHUP in the binary) is a message on a channel; shutdown removes the node annotations. With
//! [`Daemon::with_node_config`] a changed node configuration file is applied while running
//! ([`crate::node_config_watch`]).

use std::{future::Future, sync::Arc};

use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use vgpu_core::{
    abi::vgpu_config::CudaVersion,
    backend::{DeviceBackend, DriverVersions},
    model::GpuDevice,
    node_config::{DeviceListStrategy, NodeSettings},
};
use vgpu_gates::CoreGate;

use crate::{
    build_handlers,
    cdi::SpecDevice,
    cluster::{ClusterClient, NodeClient, RescheduleClient},
    config::PluginConfig,
    error::ServerError,
    feature_file::{FeatureFileWriter, GfdOutput},
    inventory::{DeviceState, node_devices},
    locate::LivePods,
    manager::PluginManager,
    node_config_watch::{NodeConfigSource, plan_reload},
    publisher::{DriverLabels, NodePublisher, PublisherConfig, topology_from_matrix},
    reschedule::RescheduleController,
};
use vgpu_node::sm_watcher::SmWatcher;

/// Copies the backend's driver versions into the configuration `vgpu.config` is written from (a CUDA
/// version that does not fit `i32` is left unset).
pub fn apply_driver_versions(config: &mut PluginConfig, versions: &DriverVersions) {
    config.driver_version.clone_from(&versions.driver_version);
    if let Some((major, minor)) = versions.cuda_version
        && let (Ok(major), Ok(minor)) = (i32::try_from(major), i32::try_from(minor))
    {
        config.cuda_version = CudaVersion { major, minor };
    }
}

/// The node's CDI devices (each non-MIG GPU with the vendor's device nodes, e.g. `/dev/nvidia<minor>` or
/// MetaX's `/dev/dri` nodes; each served MIG instance with its nodes) and the vendor's control nodes
/// present under the container driver root.
pub fn cdi_spec_devices(config: &PluginConfig, gpus: &[GpuDevice]) -> (Vec<SpecDevice>, Vec<String>) {
    let control = config.present_control_nodes();
    let mut devices: Vec<SpecDevice> = gpus
        .iter()
        .filter(|g| !g.mig_enabled)
        .map(|g| SpecDevice { name: g.uuid.clone(), nodes: config.gpu_device_nodes(g.index) })
        .collect();
    for d in &config.mig_devices {
        let nodes = crate::mig::mig_device_specs(config, &[d])
            .into_iter()
            .map(|s| s.container_path)
            .filter(|p| !control.contains(p))
            .collect();
        devices.push(SpecDevice { name: d.uuid.clone(), nodes });
    }
    (devices, control)
}

/// The device-plugin process.
pub struct Daemon {
    /// Configuration (its `device_minors` are filled from the backend by [`Daemon::new`]).
    pub config: PluginConfig,
    /// The GPUs.
    pub backend: Arc<dyn DeviceBackend>,
    /// Pod access (Allocate).
    pub cluster: Arc<dyn ClusterClient>,
    /// Node access (publisher).
    pub nodes: Arc<dyn NodeClient>,
    /// Publisher timing.
    pub publisher: PublisherConfig,
    /// Driver labels.
    pub driver: DriverLabels,
    /// GPU feature labels as gpu-feature-discovery writes them ([`Daemon::with_gfd_labels`]; empty: none).
    pub gfd: std::collections::BTreeMap<String, String>,
    /// Where [`Daemon::gfd`] goes: onto the Node with the publisher (default), or into node-feature-discovery's
    /// feature file ([`crate::feature_file`]).
    pub gfd_output: GfdOutput,
    /// Pod access of the AllocationFailureReschedule controller ([`Daemon::with_reschedule_client`]); with
    /// the gate on and no client, no controller runs.
    pub reschedule: Option<Arc<dyn RescheduleClient>>,
    /// Sampling period of the shared SM watcher (gate `SharedSMUtilizationWatcher`; default
    /// [`vgpu_node::sm_watcher::DEFAULT_PERIOD`]).
    pub sm_watcher_period: std::time::Duration,
    /// The node configuration file watched for changes while the plugin runs, with the settings it
    /// resolved to at start ([`Daemon::with_node_config`]; none: no reload).
    pub node_config: Option<(NodeConfigSource, NodeSettings)>,
}

impl std::fmt::Debug for Daemon {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Daemon").field("node", &self.config.node_name).finish_non_exhaustive()
    }
}

impl Daemon {
    /// Publishes GPU feature labels compatible with gpu-feature-discovery (`nvidia.com/gpu.product`,
    /// `gpu.memory`, `gpu.count`, `cuda.driver.*`, `mig.*` …, [`vgpu_core::gfd`]) on the node, computed once
    /// from the backend and the node's MIG strategy; `machine` is the DMI product name when known.
    pub fn with_gfd_labels(mut self, machine: Option<String>) -> Result<Self, ServerError> {
        let facts = vgpu_core::gfd::NodeFacts::from_backend(self.backend.as_ref(), machine)?;
        self.gfd = vgpu_core::gfd::gfd_labels(&facts, self.config.settings.mig_strategy);
        Ok(self)
    }

    /// Wires a daemon; reads the GPUs' minor numbers, the vendor adapter ([`PluginConfig::vendor`]), the
    /// MIG instances to serve (fails when `migStrategy: single` finds a non-uniform node) and the driver
    /// versions from the backend, and resolves the IMEX channels
    /// ([`crate::config::resolve_imex_channels`]: fails when a required channel is missing). The driver
    /// and CUDA versions go to `vgpu.config` ([`PluginConfig::driver_version`],
    /// [`PluginConfig::cuda_version`]) and to the node labels ([`Daemon::driver`]); a backend that reports
    /// none leaves them as configured. Fails first when an enabled gate is not built
    /// ([`crate::gates::check_gates`]).
    pub fn new(
        mut config: PluginConfig,
        backend: Arc<dyn DeviceBackend>,
        cluster: Arc<dyn ClusterClient>,
        nodes: Arc<dyn NodeClient>,
    ) -> Result<Self, ServerError> {
        crate::gates::check_gates(&config.gates)?;
        if config.whole_gpus {
            crate::gates::check_whole_gpus(&config.gates)?;
        }
        if !config.whole_gpus && !config.gates.enabled(CoreGate::HonorPreAllocatedDeviceIDs) {
            // Upstream behaviour, kept: the gate alone offers GetPreferredAllocation. Our own components
            // never read a GPU from a kubelet device ID (PreStartContainer matches the exact ID set of
            // devices.json), but other readers of pod-resources or device health would be misled.
            tracing::info!(
                "gate HonorPreAllocatedDeviceIDs is off: the kubelet picks vgpu-number device IDs itself, so \
                 its checkpoint and pod-resources API may name another GPU than the one the scheduler \
                 pre-allocated and the container gets; turn the gate on to make them agree"
            );
        }
        for gpu in backend.devices()? {
            config.device_minors.insert(gpu.index, backend.minor_number(gpu.index)?);
        }
        config.vendor = backend.vendor_adapter()?;
        let (channels, notes) =
            crate::config::resolve_imex_channels(&config.settings.imex, &config.device_root, &*config.vendor)
                .map_err(ServerError::Config)?;
        for note in notes {
            tracing::warn!("{note}");
        }
        config.imex_channels = channels;
        config.mig_devices = crate::mig::mig_devices(backend.as_ref(), config.settings.mig_strategy)?;
        let mut driver = DriverLabels::default();
        match backend.driver_versions() {
            Ok(Some(versions)) => {
                apply_driver_versions(&mut config, &versions);
                driver = DriverLabels {
                    driver_version: versions.driver_version,
                    cuda_version: versions.cuda_version,
                };
            }
            Ok(None) => {}
            Err(err) => tracing::warn!(%err, "driver versions unavailable"),
        }
        Ok(Self {
            config,
            backend,
            cluster,
            nodes,
            publisher: PublisherConfig::default(),
            driver,
            gfd: std::collections::BTreeMap::new(),
            gfd_output: GfdOutput::NodeLabels,
            reschedule: None,
            sm_watcher_period: vgpu_node::sm_watcher::DEFAULT_PERIOD,
            node_config: None,
        })
    }

    /// Watches the node configuration file while running ([`crate::node_config_watch`]): a valid new
    /// version is applied without the process exiting (device lists rebuilt and re-sent on every
    /// `ListAndWatch` stream, node annotations republished, the plugins re-registered when a setting
    /// `Allocate` reads changed); an invalid one is logged and the running settings kept. `loaded` is what
    /// the file resolved to when the configuration was built (before the cgroup driver was detected).
    pub fn with_node_config(mut self, source: NodeConfigSource, loaded: NodeSettings) -> Self {
        self.node_config = Some((source, loaded));
        self
    }

    /// Applies a new version of the node configuration (`next`, resolved; `previous`: the version before)
    /// to the running `current` configuration and `state`, publishing the settings on `settings`. Returns
    /// whether the plugins must be served again with the new configuration.
    fn apply_node_config(
        &self,
        current: &mut PluginConfig,
        state: &DeviceState,
        settings: &watch::Sender<NodeSettings>,
        previous: &NodeSettings,
        next: &NodeSettings,
    ) -> bool {
        let plan = plan_reload(&current.settings, previous, next);
        for name in &plan.deferred {
            tracing::warn!(
                setting = name,
                "node configuration: {name} changed; it is read only at start and takes effect when the \
                 device plugin restarts (its pod is replaced); keeping the running value"
            );
        }
        if !plan.changes(&current.settings) {
            tracing::info!("node configuration: nothing to apply");
            return false;
        }
        let gpus = match self.backend.devices() {
            Ok(gpus) => gpus,
            Err(err) => {
                tracing::error!(%err, "node configuration: cannot read the GPUs; keeping the running configuration");
                return false;
            }
        };
        let before = current.settings.vgpu_config();
        current.settings = plan.settings;
        let after = current.settings.vgpu_config();
        tracing::info!(
            split = after.device_split,
            cores_scaling = after.cores_scaling,
            memory_scaling = after.memory_scaling,
            memory_factor = after.memory_factor,
            ?before,
            restart_plugins = plan.restart_plugins,
            "node configuration applied"
        );
        settings.send_replace(current.settings.clone());
        state.reconfigure(node_devices(&gpus, &current.settings), &current.settings);
        plan.restart_plugins
    }

    /// Gives the AllocationFailureReschedule controller its cluster access (it runs only with the gate on).
    pub fn with_reschedule_client(mut self, client: Arc<dyn RescheduleClient>) -> Self {
        self.reschedule = Some(client);
        self
    }

    /// Spawns the [`RescheduleController`] when gate `AllocationFailureReschedule` is on (gate off: none,
    /// upstream's behaviour); it stops when `stop` completes. A controller that cannot start (unreadable
    /// checkpoint directory) is logged; the plugins keep serving.
    fn spawn_reschedule(
        &self,
        stop: impl Future<Output = ()> + Send + 'static,
    ) -> Option<tokio::task::JoinHandle<()>> {
        if !self.config.gates.enabled(CoreGate::AllocationFailureReschedule) {
            return None;
        }
        let Some(client) = self.reschedule.clone() else {
            tracing::warn!(
                "AllocationFailureReschedule is on but no reschedule client is wired; no controller runs"
            );
            return None;
        };
        let controller = RescheduleController::new(
            self.config.node_name.clone(),
            self.config.domain.clone(),
            &self.config.manager_dir,
            client,
        );
        Some(tokio::spawn(async move {
            if let Err(err) = controller.run(stop).await {
                tracing::error!(%err, "the reschedule controller could not start");
            }
        }))
    }

    /// Resources of gated plugins that are off: their capacity is removed from the node.
    pub fn stale_resources(&self) -> Vec<String> {
        let mut out = Vec::new();
        if !self.config.gates.enabled(CoreGate::GPUCoreResourcePlugin) {
            out.push(self.config.domain.vgpu_cores());
        }
        if !self.config.gates.enabled(CoreGate::GPUMemoryResourcePlugin) {
            out.push(self.config.domain.vgpu_memory());
        }
        out
    }

    /// Runs until `shutdown` completes; every message on `restart` stops and starts the plugins again.
    /// Ends with an error only when the backend cannot be read at start or a plugin exhausts its crash
    /// budget; cluster errors are logged and retried.
    pub async fn run(
        self,
        shutdown: impl Future<Output = ()>,
        mut restart: mpsc::Receiver<()>,
    ) -> Result<(), ServerError> {
        let config = &self.config;
        let devices = node_devices(&self.backend.devices()?, &config.settings);
        tracing::info!(node = %config.node_name, backend = self.backend.name(), gpus = devices.len(), "devices discovered");
        let state = DeviceState::new(devices, &config.settings);
        if config
            .settings
            .device_list_strategy
            .iter()
            .any(|s| matches!(s, DeviceListStrategy::CdiAnnotations | DeviceListStrategy::CdiCri))
        {
            let (devices, control) = cdi_spec_devices(config, &state.devices());
            let mut specs = vec![crate::cdi::node_spec(
                config.vendor.cdi_kind(),
                &devices,
                &control,
                &config.host_driver_root,
            )];
            if !config.imex_channels.is_empty() {
                specs.push(crate::cdi::imex_spec(&config.imex_channels, &config.host_driver_root));
            }
            for spec in &specs {
                match crate::cdi::write_spec(&config.cdi_root, spec) {
                    Ok(path) => {
                        tracing::info!(spec = %path.display(), devices = spec.devices.len(), "CDI spec written")
                    }
                    Err(err) => tracing::warn!(%err, "could not write the CDI spec"),
                }
            }
        }
        let health = tokio::spawn(state.clone().watch_backend(self.backend.health_events()?));

        let mut publisher = NodePublisher::new(
            config.node_name.clone(),
            config.domain.clone(),
            config.settings.clone(),
            state.clone(),
            Arc::clone(&self.nodes),
        )
        .with_config(self.publisher.clone())
        .with_driver_labels(self.driver.clone())
        .with_gfd_labels(match self.gfd_output {
            GfdOutput::NodeLabels => self.gfd.clone(),
            GfdOutput::NfdFeatureFile(_) => std::collections::BTreeMap::new(),
        })
        .with_stale_resources(self.stale_resources());
        let (settings_tx, settings_rx) = watch::channel(config.settings.clone());
        publisher = publisher.with_live_settings(settings_rx);
        if config.gates.enabled(CoreGate::TopologyAwareGPUAllocation) {
            match self
                .backend
                .topology()
                .map_err(|e| e.to_string())
                .and_then(|m| topology_from_matrix(&m).map_err(|e| format!("link code {} out of range", e.0)))
            {
                Ok(t) => publisher = publisher.with_topology(t),
                Err(err) => {
                    tracing::warn!(%err, "GPU topology unavailable; not publishing node-device-topology")
                }
            }
        }
        // Stops the node-side tasks below: cancelled on the way out, and when this future is dropped.
        let stop = CancellationToken::new();
        let _stop_on_drop = stop.clone().drop_guard();
        let publishing = tokio::spawn(publisher.run(stop.clone().cancelled_owned()));
        let sweeping = (!config.gone_pod_sweep_interval.is_zero()).then(|| {
            let (cluster, config) = (Arc::clone(&self.cluster), config.clone());
            let stop = stop.clone();
            tokio::spawn(async move {
                let mut ticks = tokio::time::interval(config.gone_pod_sweep_interval);
                ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tokio::select! {
                        () = stop.cancelled() => break,
                        _ = ticks.tick() => sweep_gone_pods(cluster.as_ref(), &config, config.gone_pod_grace).await,
                    }
                }
            })
        });
        let rescheduling = self.spawn_reschedule(stop.clone().cancelled_owned());
        let feature_file = match &self.gfd_output {
            GfdOutput::NfdFeatureFile(file) if !self.gfd.is_empty() => {
                tracing::info!(file = %file.path.display(), interval = ?file.interval, labels = self.gfd.len(), "GPU feature labels go to the NFD feature file");
                let writer = FeatureFileWriter::new(file.clone(), self.gfd.clone());
                Some(tokio::spawn(writer.run(stop.clone().cancelled_owned())))
            }
            _ => None,
        };
        // Gate SharedSMUtilizationWatcher: Allocate tells containers to read watcher/sm_util.config, so
        // the sampler must run; a file that cannot be set up stops the daemon.
        let sm_watching = if config.gates.enabled(CoreGate::SharedSMUtilizationWatcher) {
            match SmWatcher::open(Arc::clone(&self.backend), &config.manager_dir) {
                Ok(watcher) => {
                    tracing::info!(file = %watcher.path().display(), period = ?self.sm_watcher_period, "shared SM watcher started");
                    Some(tokio::spawn(watcher.run(self.sm_watcher_period, stop.clone().cancelled_owned())))
                }
                Err(err) => {
                    stop.cancel();
                    health.abort();
                    return Err(ServerError::Config(format!(
                        "SharedSMUtilizationWatcher=true: cannot set up the shared SM watcher file: {err}"
                    )));
                }
            }
        } else {
            None
        };

        let registry = if config.gates.enabled(CoreGate::DevicePluginClientMode) {
            match vgpu_node::registry::serve_registry(config.registry()) {
                Ok(r) => Some(r),
                Err(err) => {
                    stop.cancel();
                    health.abort();
                    return Err(err.into());
                }
            }
        } else {
            None
        };
        let (reload_tx, mut reloads) = mpsc::channel::<NodeSettings>(1);
        let mut previous = None;
        let watching = self.node_config.clone().map(|(source, loaded)| {
            tracing::info!(file = %source.path.display(), interval = ?source.interval, "watching the node configuration file");
            previous = Some(loaded.clone());
            tokio::spawn(source.watch(loaded, reload_tx, stop.clone().cancelled_owned()))
        });
        let mut current = config.clone();
        let mut shutdown = std::pin::pin!(shutdown);
        let result = loop {
            let shared = Arc::new(current.clone());
            let handlers = build_handlers(&shared, &state, Some(Arc::clone(&self.cluster)));
            let manager = PluginManager::new(current.clone(), state.clone(), handlers);
            let (again_tx, again_rx) = tokio::sync::oneshot::channel::<bool>();
            let signal = async {
                let again = loop {
                    tokio::select! {
                        () = &mut shutdown => break false,
                        got = restart.recv() => break got.is_some(),
                        Some(next) = reloads.recv() => {
                            let before = previous.replace(next.clone()).unwrap_or_else(|| next.clone());
                            if self.apply_node_config(&mut current, &state, &settings_tx, &before, &next) {
                                break true;
                            }
                        }
                    }
                };
                let _ = again_tx.send(again);
            };
            let run = manager.run(signal).await;
            let again = again_rx.await.unwrap_or(false);
            match run {
                Err(err) => break Err(err),
                Ok(()) if again => tracing::info!("restarting device plugins"),
                Ok(()) => break Ok(()),
            }
        };
        tracing::info!("shutting down");
        if let Some(registry) = registry {
            registry.stop().await;
        }
        stop.cancel();
        if let Err(err) = publishing.await {
            tracing::warn!(%err, "node publisher task failed");
        }
        if let Some(task) = rescheduling
            && let Err(err) = task.await
        {
            tracing::warn!(%err, "reschedule controller task failed");
        }
        if let Some(task) = feature_file
            && let Err(err) = task.await
        {
            tracing::warn!(%err, "NFD feature file task failed");
        }
        if let Some(task) = sm_watching
            && let Err(err) = task.await
        {
            tracing::warn!(%err, "shared SM watcher task failed");
        }
        if let Some(task) = sweeping
            && let Err(err) = task.await
        {
            tracing::warn!(%err, "gone-pod sweep task failed");
        }
        if let Some(task) = watching
            && let Err(err) = task.await
        {
            tracing::warn!(%err, "node configuration watch task failed");
        }
        // No Allocate can come any more: the files of every pod gone from the node go now, whatever their
        // age (only those older than the pod list: nothing written after it is touched).
        sweep_gone_pods(self.cluster.as_ref(), config, std::time::Duration::ZERO).await;
        health.abort();
        result
    }
}

/// Removes the per-container directories under the manager directory whose pod is not on the node any more
/// and that were last modified at least `grace` before the pods were listed
/// ([`crate::locate::remove_stale_dirs`]). The pods come from the API server; when it cannot be asked
/// (at an uninstall the plugin's ServiceAccount and RBAC go while its pod stops), from the kubelet's
/// pod-resources API ([`LivePods::Names`]). Nothing is removed when neither answers: never on a guess.
pub async fn sweep_gone_pods(cluster: &dyn ClusterClient, config: &PluginConfig, grace: std::time::Duration) {
    let asked = std::time::SystemTime::now();
    let live = match cluster.list_node_pods(&config.node_name).await {
        Ok(pods) => LivePods::Uids(pods.into_iter().map(|p| p.uid).collect()),
        Err(err) => {
            match vgpu_kubelet::podresources::list_pod_resources(
                &config.pod_resources_socket,
                config.pod_resources_timeout,
            )
            .await
            {
                Ok(pods) => {
                    tracing::info!(%err, "cannot list the node's pods: gone pods are judged by the kubelet's pod-resources API");
                    LivePods::from_pod_resources(&pods)
                }
                Err(kubelet) => {
                    tracing::warn!(%err, %kubelet, "cannot list the node's pods: no sweep of gone pods' files");
                    return;
                }
            }
        }
    };
    for removed in crate::locate::remove_stale_dirs(&config.manager_dir, &live, grace, asked) {
        tracing::info!(dir = %removed.display(), "removed the files of a pod that no longer exists");
    }
}
