//! [`Daemon`]: everything the `vgpu-kubelet-plugin` binary runs, wired from a backend and the cluster seams
//! ([`DaemonCluster`]), as `vgpu_deviceplugin::daemon::Daemon` is for the device plugin. The binary only
//! parses and checks its flags, opens the backend and the Kubernetes client, and hands both here.
//!
//! # Start-up order
//!
//! [`Daemon::new`] refuses to start when an enabled gate's behaviour is not built
//! ([`crate::gates::check_gates`]) or an enabled gate lacks what it needs (see [`DaemonError::Refused`]).
//! [`Daemon::install_modes`] then builds the allocatable devices and the claim modes, in the order their
//! host actions are planned and applied (revert runs newest first):
//!
//! | # | gate | mode ([`ClaimMode::name`]) | devices |
//! |---|---|---|---|
//! | 1 | always | `opaqueConfig`: refuses a config whose sharing strategy's gate is off | the backend's GPUs and vGPUs |
//! | 2 | `DynamicMIG` | `mig` | MIG devices with shared counters |
//! | 3 | `TimeSlicingSettings` | `timeSlicing` | |
//! | 4 | `MPSSupport` | `mps` (one MPS control daemon per claim) | |
//! | 5 | `PassthroughSupport` | | `gpu-vfio-<index>` |
//! | 6 | `FabricManagerPartitioning` | `fabricManager` (before `vfio`: GPUs go back to their driver first) | partition attributes |
//! | 7 | `PassthroughSupport` | `vfio` | |
//! | 8 | `DeviceMetadata` | `deviceMetadata` (last: it describes bound devices) | |
//!
//! [`Daemon::start`] then starts the components in this order ([`Component`], reported by
//! [`RunningDaemon::started`]): the Prepare state (checkpoint recovery) and the MPS daemons of claims still
//! prepared, [`Component::Health`], [`Component::PhysicalGpuStatus`], [`Component::VfioSwitch`],
//! [`Component::Slices`], [`Component::ClientModeRegistry`], [`Component::Nri`], [`Component::Driver`]
//! (both sockets), [`Component::Http`] and [`Component::Healthcheck`]. [`RunningDaemon::stop`] stops the
//! driver first, then every task, the registry, the slice publisher and the HTTP server.

use std::{net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use vgpu_core::backend::DeviceBackend;
use vgpu_gates::DraGate;
use vgpu_node::registry::{RegistryConfig, RunningRegistry};
use vgpu_serve::authz::Authorizer;

use crate::{
    claims::ClaimSource,
    config::DriverConfig,
    devices::{AllocatableDevices, DeviceConfig},
    driver::{Driver, RunningDriver},
    endpoint::Readiness,
    fabric::FabricManager,
    health::{HealthConfig, HealthMonitor, HealthSnapshot},
    healthcheck::HealthCheck,
    metrics::DriverMetrics,
    modes::ClaimMode,
    mps::MpsMode,
    nri::NriConfig,
    physical_gpu::PhysicalGpuStore,
    slices::{SliceConfig, publisher::SlicePublisher, store::SliceStore},
    state::{DeviceState, fault::FaultHook},
    vfio_switch::controller::{SwitchCluster, SwitchConfig},
};

/// Why the daemon did not start, or failed while stopping.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DaemonError {
    /// The configuration cannot run: a gate whose behaviour is not built, or an enabled gate without what
    /// it needs (the message says which).
    #[error("{0}")]
    Refused(String),
    /// A start-up step failed (the step in words, the cause as the source).
    #[error("{step}")]
    Step {
        /// What was being done (`opening the prepared-claims checkpoint`, …).
        step: &'static str,
        /// Why it failed.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

fn step<E: std::error::Error + Send + Sync + 'static>(step: &'static str) -> impl FnOnce(E) -> DaemonError {
    move |e| DaemonError::Step { step, source: Box::new(e) }
}

/// `--http-endpoint` and `--metrics-path` ([`crate::endpoint`]).
#[derive(Debug, Clone)]
pub struct HttpConfig {
    /// Where to listen (port 0 picks one; [`RunningDaemon::http_addr`] tells).
    pub addr: SocketAddr,
    /// The metrics path (`/metrics`).
    pub metrics_path: String,
}

/// What the daemon runs, resolved from the flags.
#[derive(Debug)]
pub struct DaemonConfig {
    /// The driver's configuration (paths, ratios, gates).
    pub driver: DriverConfig,
    /// How devices are built from the backend.
    pub devices: DeviceConfig,
    /// Xids treated as application errors, besides the default ones (gate `NVMLDeviceHealthCheck`).
    pub xids: Vec<u64>,
    /// The host's root file system in this container (`PassthroughSupport`, `FabricManagerPartitioning`).
    pub host_root: PathBuf,
    /// The HTTP endpoint (`None`: not served).
    pub http: Option<HttpConfig>,
    /// The gRPC health service's address (`None`: not served).
    pub healthcheck: Option<SocketAddr>,
    /// The NRI plugin's socket and index; required with gate `NRISupport`.
    pub nri: Option<NriConfig>,
    /// The client-mode registry; required with gate `DevicePluginClientMode`.
    pub registry: Option<RegistryConfig>,
    /// `--physical-gpu-status`: the resync period of the PhysicalGPU status sync (`None`: not run).
    pub physical_gpu_resync: Option<Duration>,
    /// The vfio-switch Jobs (gate `PassthroughSupport` with `--vfio-switch-image`; `None`: not run).
    pub vfio_switch: Option<SwitchConfig>,
}

/// The daemon's access to the cluster (the binary gives the Kubernetes ones; tests give in-memory ones).
#[derive(Debug)]
pub struct DaemonCluster<S> {
    /// ResourceClaims and their consumer pods.
    pub claims: Arc<dyn ClaimSource>,
    /// Where the ResourceSlices go.
    pub slices: S,
    /// The owner of the ResourceSlices (this Node), when known.
    pub slice_owner: Option<OwnerReference>,
    /// PhysicalGPU access (needed when [`DaemonConfig::physical_gpu_resync`] is set).
    pub physical_gpus: Option<Arc<dyn PhysicalGpuStore>>,
    /// Job and PhysicalGPU access of the vfio-switch controller (needed with [`DaemonConfig::vfio_switch`]).
    pub switch_cluster: Option<Arc<dyn SwitchCluster>>,
    /// Guards the metrics path (`--enable-rbac`).
    pub authorizer: Option<Arc<Authorizer>>,
}

/// Opens the Fabric Manager client (gate `FabricManagerPartitioning`); called once, at its place in the
/// mode order.
pub type FabricOpener =
    Box<dyn FnOnce() -> Result<Arc<dyn FabricManager>, Box<dyn std::error::Error + Send + Sync>> + Send>;

/// A component of the running daemon, in start-up order (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Component {
    /// The health monitor (gate `NVMLDeviceHealthCheck`).
    Health,
    /// The PhysicalGPU status sync (`--physical-gpu-status`).
    PhysicalGpuStatus,
    /// The vfio-switch controller (gate `PassthroughSupport` with `--vfio-switch-image`).
    VfioSwitch,
    /// The ResourceSlice publisher.
    Slices,
    /// The client-mode registry socket (gate `DevicePluginClientMode`).
    ClientModeRegistry,
    /// The in-process NRI plugin (gate `NRISupport`).
    Nri,
    /// The registration and DRA sockets (and the shared SM watcher, gate `SharedSMUtilizationWatcher`).
    Driver,
    /// `/healthz`, `/readyz` and the metrics path (`--http-endpoint`).
    Http,
    /// `grpc.health.v1` (`--healthcheck-port`).
    Healthcheck,
}

/// The kubelet-plugin process (module docs).
pub struct Daemon {
    config: DaemonConfig,
    backend: Arc<dyn DeviceBackend>,
    fabric: Option<FabricOpener>,
    fault: Option<FaultHook>,
}

impl std::fmt::Debug for Daemon {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Daemon")
            .field("config", &self.config)
            .field("backend", &self.backend.name())
            .finish_non_exhaustive()
    }
}

/// The claim modes and the devices they publish, in install order ([`Daemon::install_modes`]).
pub struct InstalledModes {
    /// The allocatable devices (MIG, VFIO devices and partition attributes added by their gates).
    pub devices: Arc<AllocatableDevices>,
    /// The modes, in the order their host actions are planned and applied.
    pub modes: Vec<Arc<dyn ClaimMode>>,
    /// The MPS mode (gate `MPSSupport`): its daemons are restarted for the claims still prepared.
    pub mps: Option<Arc<MpsMode>>,
}

impl std::fmt::Debug for InstalledModes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InstalledModes")
            .field("devices", &self.devices.len())
            .field("modes", &self.names())
            .finish_non_exhaustive()
    }
}

impl InstalledModes {
    /// The modes' names, in install order.
    pub fn names(&self) -> Vec<&'static str> {
        self.modes.iter().map(|m| m.name()).collect()
    }
}

impl Daemon {
    /// A daemon over `config` and `backend`. Refuses ([`DaemonError::Refused`]) an enabled gate whose
    /// behaviour is not built ([`crate::gates::check_gates`]), gate `NRISupport` without
    /// [`DaemonConfig::nri`] and gate `DevicePluginClientMode` without [`DaemonConfig::registry`].
    pub fn new(config: DaemonConfig, backend: Arc<dyn DeviceBackend>) -> Result<Self, DaemonError> {
        let gates = &config.driver.gates;
        crate::gates::check_gates(gates).map_err(DaemonError::Refused)?;
        if config.driver.nri() && config.nri.is_none() {
            return Err(DaemonError::Refused(
                "feature gate NRISupport is enabled but no NRI socket and plugin index were configured"
                    .to_owned(),
            ));
        }
        if config.driver.client_mode() && config.registry.is_none() {
            return Err(DaemonError::Refused(
                "feature gate DevicePluginClientMode is enabled but no client-mode registry was configured"
                    .to_owned(),
            ));
        }
        if config.vfio_switch.is_some() && !gates.enabled(DraGate::PassthroughSupport) {
            return Err(DaemonError::Refused(
                "--vfio-switch-image requires feature gate PassthroughSupport to be enabled".to_owned(),
            ));
        }
        Ok(Self { config, backend, fabric: None, fault: None })
    }

    /// How the Fabric Manager client is opened (gate `FabricManagerPartitioning`; without it the gate
    /// refuses to start).
    #[must_use]
    pub fn with_fabric_manager(mut self, open: FabricOpener) -> Self {
        self.fabric = Some(open);
        self
    }

    /// Installs a fault-injection hook in the Prepare state ([`crate::state::fault`]).
    #[must_use]
    pub fn with_fault_hook(mut self, hook: FaultHook) -> Self {
        self.fault = Some(hook);
        self
    }

    /// The configuration.
    pub fn config(&self) -> &DaemonConfig {
        &self.config
    }

    /// Builds the allocatable devices and the claim modes in their install order (module docs). Opens the
    /// Fabric Manager client when its gate is on.
    pub fn install_modes(&mut self) -> Result<InstalledModes, DaemonError> {
        let config = &self.config.driver;
        let gates = &config.gates;
        let backend = &self.backend;
        let mut devices = AllocatableDevices::from_backend(backend.as_ref(), &self.config.devices)
            .map_err(step("building the allocatable devices"))?;
        // The opaque-config check comes first, always: it refuses a config whose sharing strategy's gate is
        // off, with its field path.
        let mut modes: Vec<Arc<dyn ClaimMode>> = vec![Arc::new(crate::opaque::OpaqueConfigCheck)];
        if gates.enabled(DraGate::DynamicMIG) {
            let gpus = crate::mig::publish(&mut devices, backend.as_ref())
                .map_err(step("publishing the MIG devices (DynamicMIG)"))?;
            tracing::info!(
                gpus,
                counter_sets = devices.counter_sets().len(),
                "DynamicMIG: MIG devices published"
            );
            modes.push(Arc::new(crate::mig::MigMode::new(Arc::clone(backend))));
        }
        if gates.enabled(DraGate::TimeSlicingSettings) {
            modes.push(Arc::new(crate::sharing::TimeSlicingMode::new(Arc::clone(backend), config)));
        }
        let mps = if gates.enabled(DraGate::MPSSupport) {
            let control: Arc<dyn crate::mps::MpsDaemonControl> = if backend.name() == "mock" {
                Arc::new(crate::mps::FakeMpsDaemons::default())
            } else {
                Arc::new(crate::mps::ProcessMpsDaemon::under_driver_root(&config.container_driver_root))
            };
            let mode = Arc::new(MpsMode::new(Arc::clone(backend), control, config));
            modes.push(mode.clone());
            Some(mode)
        } else {
            None
        };
        let host_root = &self.config.host_root;
        if gates.enabled(DraGate::PassthroughSupport) {
            let roots = crate::vfio::SysfsRoots::new(host_root);
            let vfio = crate::vfio::vfio_devices(&roots, &devices)
                .map_err(step("PassthroughSupport: discovering the VFIO devices"))?;
            tracing::info!(devices = vfio.len(), "PassthroughSupport: VFIO devices published");
            for device in vfio {
                devices.add(device).map_err(step("PassthroughSupport: adding a VFIO device"))?;
            }
        }
        if gates.enabled(DraGate::FabricManagerPartitioning) {
            if !crate::fabric::has_nvswitch_fabric(host_root).map_err(step("FabricManagerPartitioning"))? {
                tracing::warn!(host_root = %host_root.display(), "FabricManagerPartitioning: no NVSwitch fabric detected");
            }
            let open = self.fabric.take().ok_or_else(|| {
                DaemonError::Refused(
                    "feature gate FabricManagerPartitioning is enabled but no Fabric Manager client was given"
                        .to_owned(),
                )
            })?;
            let fm = open().map_err(|source| DaemonError::Step {
                step: "FabricManagerPartitioning: loading the Fabric Manager client library",
                source,
            })?;
            let partitions = crate::fabric::attach_partitions(fm.as_ref(), &mut devices)
                .map_err(step("FabricManagerPartitioning: reading the Fabric Manager partitions"))?;
            tracing::info!(partitions = partitions.len(), "FabricManagerPartitioning: partitions attached");
            modes.push(Arc::new(crate::fabric::FabricMode::new(fm, config.checkpoint_path())));
        }
        if gates.enabled(DraGate::PassthroughSupport) {
            let vfio = crate::vfio::VfioConfig::host(host_root);
            modes.push(Arc::new(crate::vfio::VfioMode::new(vfio, &devices)));
        }
        let devices = Arc::new(devices);
        if gates.enabled(DraGate::DeviceMetadata) {
            let slice = self.slice_config(None);
            let metadata = crate::metadata::MetadataConfig { slice, devices: Arc::clone(&devices) };
            modes.push(Arc::new(crate::metadata::MetadataMode::new(metadata)));
        }
        Ok(InstalledModes { devices, modes, mps })
    }

    fn slice_config(&self, owner: Option<OwnerReference>) -> SliceConfig {
        let config = &self.config.driver;
        let mut slice = SliceConfig::new(&config.node_name);
        slice.driver.clone_from(&config.driver_name);
        slice.list_type_attributes = config.gates.enabled(DraGate::DRAListTypeAttributes);
        slice.owner = owner;
        slice
    }

    /// Starts every component in order (module docs); a failing step stops what was started.
    pub async fn start<S: SliceStore>(
        mut self,
        cluster: DaemonCluster<S>,
    ) -> Result<RunningDaemon, DaemonError> {
        let installed = self.install_modes()?;
        let InstalledModes { devices, modes, mps } = installed;
        let backend = Arc::clone(&self.backend);
        let vendor = backend.vendor_adapter().map_err(step("the backend's vendor adapter"))?;
        tracing::info!(devices = devices.len(), node = %self.config.driver.node_name, driver = %self.config.driver.driver_name, xids = ?self.config.xids, "devices");
        let slice_config = self.slice_config(cluster.slice_owner.clone());
        let Daemon { config, fault, .. } = self;
        let DaemonConfig {
            driver,
            xids,
            http,
            healthcheck,
            nri,
            registry,
            physical_gpu_resync,
            vfio_switch,
            ..
        } = config;
        let driver = Arc::new(driver);
        let metrics = Arc::new(DriverMetrics::new());
        let state =
            DeviceState::with_modes(Arc::clone(&driver), Arc::clone(&devices), vendor, cluster.claims, modes)
                .await
                .map_err(step("opening the prepared-claims checkpoint"))?
                .with_metrics(Arc::clone(&metrics));
        let state = match fault {
            Some(hook) => state.with_fault_hook(hook),
            None => state,
        };
        let state = Arc::new(state);
        // MPS daemons live in this process's container: the claims still prepared get theirs back.
        if let Some(mps) = &mps {
            let checkpoint =
                state.checkpoint().await.map_err(step("reading the checkpoint for the MPS daemons"))?;
            for (claim, result) in mps.restart_daemons(&checkpoint) {
                if let Err(error) = result {
                    tracing::warn!(%claim, %error, "cannot restart the claim's MPS control daemon");
                }
            }
        }

        let mut running = RunningDaemon {
            stop: CancellationToken::new(),
            started: Vec::new(),
            driver: None,
            registry: None,
            publisher: None,
            http: None,
            http_addr: None,
            healthcheck_addr: None,
            state: Arc::clone(&state),
        };
        let stop = running.stop.clone();
        let stopped = move || stop.clone().cancelled_owned();

        // Health (gate NVMLDeviceHealthCheck): backend events → per-device status and taints.
        let (_unmonitored, unmonitored_rx) =
            tokio::sync::watch::channel(HealthSnapshot::unmonitored_default());
        let health = if driver.gates.enabled(DraGate::NVMLDeviceHealthCheck) {
            let monitor = HealthMonitor::new(HealthConfig::new(&driver.driver_name, &xids), &devices);
            let rx = monitor.subscribe();
            monitor.spawn(backend.as_ref(), stopped());
            running.started.push(Component::Health);
            rx
        } else {
            unmonitored_rx
        };
        metrics.set_health(health.clone(), &devices);

        // GPU module: this node's PhysicalGPUs get the driver version, memory, DriverReady and HardwareHealthy.
        if let Some(resync) = physical_gpu_resync {
            let store = cluster.physical_gpus.clone().ok_or_else(|| {
                DaemonError::Refused("--physical-gpu-status needs PhysicalGPU access".to_owned())
            });
            let store = match store {
                Ok(store) => store,
                Err(e) => return Err(running.abort(e).await),
            };
            crate::physical_gpu::StatusSync::new(
                store,
                &driver.node_name,
                Arc::clone(&devices),
                health.clone(),
            )
            .with_driver_probe(Arc::clone(&backend))
            .with_resync(resync)
            .spawn(stopped());
            running.started.push(Component::PhysicalGpuStatus);
        }
        // Gate PassthroughSupport: vfio-switch Jobs for the PhysicalGPUs' passthrough wish; the GPUs wished
        // for passthrough or on vfio-pci are then published only as gpu-vfio-<index>.
        let mut passthrough_gpus = None;
        match (vfio_switch, cluster.switch_cluster.clone()) {
            (Some(switch), Some(switch_cluster)) => {
                tracing::info!(namespace = %switch.namespace, image = %switch.image, "vfio-switch controller started (PassthroughSupport)");
                // A GPU goes to vfio-pci only once no prepared claim and no process holds it.
                let usage = Arc::new(crate::vfio_switch::usage::ClaimsAndProcesses::new(
                    Arc::clone(&state),
                    Arc::clone(&backend),
                ));
                let (sink, gpus) =
                    tokio::sync::watch::channel(crate::slices::publisher::PassthroughGpus::new());
                passthrough_gpus = Some(gpus);
                crate::vfio_switch::controller::SwitchController::new(switch_cluster, switch)
                    .with_usage(usage)
                    .with_passthrough_sink(sink)
                    .spawn(stopped());
                running.started.push(Component::VfioSwitch);
            }
            (Some(_), None) => {
                let e = DaemonError::Refused("the vfio-switch controller needs cluster access".to_owned());
                return Err(running.abort(e).await);
            }
            (None, _) if driver.gates.enabled(DraGate::PassthroughSupport) => {
                tracing::info!("no --vfio-switch-image: PhysicalGPU passthrough wishes are not acted on");
            }
            (None, _) => {}
        }
        let mut publisher =
            SlicePublisher::new(cluster.slices, slice_config, Arc::clone(&devices), health.clone());
        if let Some(gpus) = passthrough_gpus {
            publisher = publisher.with_passthrough(gpus);
        }
        metrics.set_publisher(publisher.status());
        running.publisher = Some(publisher.spawn(stopped()));
        running.started.push(Component::Slices);

        // Gate NRISupport: the hook of the in-process NRI plugin (started below), whose per-container
        // partitions the client-mode registry resolves too.
        let nri = nri.filter(|_| driver.nri()).map(|nri| (crate::nri::NriHook::new(Arc::clone(&state)), nri));

        // Gate DevicePluginClientMode: the device plugin's registry server, resolving register UUIDs through
        // the prepared claims (and, with NRISupport, the hook's container partitions).
        if let Some(registry_config) = registry.filter(|_| driver.client_mode()) {
            let resolver: Arc<dyn vgpu_node::registry::RegisterResolver> = match &nri {
                Some((hook, _)) => {
                    Arc::new(crate::nri::NriRegisterResolver::new(state.register_table(), hook.cache()))
                }
                None => state.register_table(),
            };
            match vgpu_node::registry::serve_registry_with(
                registry_config,
                vgpu_node::registry::GUARD_INTERVAL,
                Some(resolver),
            ) {
                Ok(registry) => {
                    tracing::info!(socket = %registry.socket.display(), "client-mode registry serving (register UUIDs of prepared claims)");
                    running.registry = Some(registry);
                    running.started.push(Component::ClientModeRegistry);
                }
                Err(e) => {
                    return Err(running.abort(step("serving the client-mode registry socket")(e)).await);
                }
            }
        }

        // Gate NRISupport: the in-process NRI plugin gives each container of a vGPU claim its own partition.
        let mut nri_health = None;
        if let Some((hook, nri)) = nri {
            match crate::nri::plugin(hook, &nri) {
                Ok(plugin) => {
                    nri_health = Some(plugin.health());
                    tokio::spawn(plugin.run(stopped()));
                    tracing::info!(socket = %nri.root.join("nri.sock").display(), index = %nri.index.as_str(), "NRI plugin started (NRISupport)");
                    running.started.push(Component::Nri);
                }
                Err(e) => return Err(running.abort(step("starting the NRI plugin")(e)).await),
            }
        }

        // Gate SharedSMUtilizationWatcher: the driver runs the device plugin's SM watcher on this backend.
        let served = match Driver::new(Arc::clone(&state), health)
            .with_sm_watcher(Arc::clone(&backend))
            .serve()
        {
            Ok(served) => served,
            Err(e) => return Err(running.abort(step("serving the registration and DRA sockets")(e)).await),
        };
        let readiness = match &nri_health {
            Some(nri) => Readiness::of(&served).with_nri(nri.clone()),
            None => Readiness::of(&served),
        };
        let check = HealthCheck::new(served.registration_socket.clone(), served.dra_socket.clone());
        let check = match &nri_health {
            Some(nri) => check.with_nri(nri.clone()),
            None => check,
        };
        running.driver = Some(served);
        running.started.push(Component::Driver);
        if let Some(http) = http {
            let listener = match tokio::net::TcpListener::bind(http.addr).await {
                Ok(listener) => listener,
                Err(e) => return Err(running.abort(step("binding --http-endpoint")(e)).await),
            };
            let bound = match listener.local_addr() {
                Ok(bound) => bound,
                Err(e) => return Err(running.abort(step("reading the metrics listener's address")(e)).await),
            };
            running.http_addr = Some(bound);
            let rbac = cluster.authorizer.is_some();
            let authorizer = cluster.authorizer.clone();
            let shutdown = stopped();
            let path = http.metrics_path.clone();
            running.http = Some(tokio::spawn(async move {
                crate::endpoint::serve(listener, metrics, readiness, &path, authorizer, shutdown).await
            }));
            running.started.push(Component::Http);
            tracing::info!(%bound, path = %http.metrics_path, rbac, "metrics, /healthz and /readyz serving");
        }
        if let Some(addr) = healthcheck {
            match crate::healthcheck::serve(check, addr, stopped()).await {
                Ok((bound, _task)) => {
                    running.healthcheck_addr = Some(bound);
                    running.started.push(Component::Healthcheck);
                    tracing::info!(%bound, "gRPC health check (grpc.health.v1) serving");
                }
                Err(e) => return Err(running.abort(step("serving the gRPC health check")(e)).await),
            }
        }
        Ok(running)
    }
}

/// A started [`Daemon`]: [`run_until`](Self::run_until) a signal, or [`stop`](Self::stop) it.
#[derive(Debug)]
pub struct RunningDaemon {
    stop: CancellationToken,
    started: Vec<Component>,
    driver: Option<RunningDriver>,
    registry: Option<RunningRegistry>,
    publisher: Option<JoinHandle<()>>,
    http: Option<JoinHandle<Result<(), crate::endpoint::MetricsError>>>,
    http_addr: Option<SocketAddr>,
    healthcheck_addr: Option<SocketAddr>,
    state: Arc<DeviceState>,
}

impl RunningDaemon {
    /// The components started, in start-up order.
    pub fn started(&self) -> &[Component] {
        &self.started
    }

    /// The served sockets (registration, DRA).
    pub fn driver(&self) -> Option<&RunningDriver> {
        self.driver.as_ref()
    }

    /// The client-mode registry's socket (gate `DevicePluginClientMode`).
    pub fn registry_socket(&self) -> Option<&std::path::Path> {
        self.registry.as_ref().map(|r| r.socket.as_path())
    }

    /// Where the HTTP endpoint listens.
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http_addr
    }

    /// Where the gRPC health service listens.
    pub fn healthcheck_addr(&self) -> Option<SocketAddr> {
        self.healthcheck_addr
    }

    /// The Prepare state.
    pub fn state(&self) -> &Arc<DeviceState> {
        &self.state
    }

    /// Runs until `shutdown` completes or the driver fails, then stops everything.
    pub async fn run_until(
        mut self,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> Result<(), DaemonError> {
        let result = match self.driver.take() {
            Some(driver) => driver.run_until(shutdown).await.map_err(step("serving the DRA sockets")),
            None => Ok(()),
        };
        self.finish().await;
        result
    }

    /// Stops the driver (sockets removed), then every task, the registry, the publisher and the HTTP server.
    pub async fn stop(mut self) -> Result<(), DaemonError> {
        let result = match self.driver.take() {
            Some(driver) => driver.stop().await.map_err(step("stopping the DRA sockets")),
            None => Ok(()),
        };
        self.finish().await;
        result
    }

    async fn abort(mut self, error: DaemonError) -> DaemonError {
        if let Some(driver) = self.driver.take()
            && let Err(e) = driver.stop().await
        {
            tracing::warn!(error = %e, "stopping the DRA sockets");
        }
        self.finish().await;
        error
    }

    async fn finish(self) {
        self.stop.cancel();
        if let Some(registry) = self.registry {
            registry.stop().await;
        }
        if let Some(publisher) = self.publisher
            && let Err(e) = publisher.await
        {
            tracing::warn!(error = %e, "the ResourceSlice publisher task failed");
        }
        if let Some(task) = self.http {
            match task.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "the metrics server failed"),
                Err(e) => tracing::warn!(error = %e, "the metrics server task failed"),
            }
        }
    }
}
