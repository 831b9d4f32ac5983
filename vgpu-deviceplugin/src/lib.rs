//! vgpu-deviceplugin: the kubelet device plugin of vgpu (contract §5), wire-compatible with vgpu-manager.
//!
//! # Module map
//!
//! | module | what it holds |
//! |---|---|
//! | [`plugin`] | [`PluginHandler`](plugin::PluginHandler), the thin internal trait behind the generated `DevicePlugin` trait; the vcore / vmemory plugins |
//! | [`mig`] | the MIG plugins (`--mig-strategy single|mixed`): one per profile, `<domain>/mig-<profile>` |
//! | [`vnumber`] | the `vgpu-number` plugin: `<uuid>::<i>` devices, preferred allocation, `Allocate`, `PreStartContainer` |
//! | [`service`] | the generated `DevicePlugin` trait over a handler: translation and the `ListAndWatch` stream |
//! | [`server`] | serving one handler on a unix socket |
//! | [`device_client`] | the client of the client-mode registry (`vgpu_node::registry`; binary `vgpu-device-client`): one `RegisterContainerDevice` call, bounded by a timeout |
//! | [`registration`] | unix-socket gRPC clients: probe our socket, `Register` with the kubelet |
//! | [`manager`] | [`PluginManager`](manager::PluginManager): serve + register every plugin, re-register when `kubelet.sock` is re-created, bounded crash restarts |
//! | [`inventory`] | the advertised GPUs (settings applied) and their health from the backend's event stream |
//! | [`ids`] | kubelet device ID formats |
//! | [`cdi`] | CDI device names, the `cdi-annotations` keys, the node CDI spec (device nodes) |
//! | [`locate`] | which container a `PreStartContainer` is for: pod-resources `List`, kubelet checkpoint; stale directory cleanup |
//! | [`cluster`] | [`ClusterClient`](cluster::ClusterClient) (pods), [`NodeClient`](cluster::NodeClient) (node publishing), [`RescheduleClient`](cluster::RescheduleClient) (evict, delete, recreate); [`InMemoryCluster`](cluster::InMemoryCluster), [`InMemoryPods`](cluster::InMemoryPods) |
//! | [`kube_cluster`] | [`KubeCluster`](kube_cluster::KubeCluster): the three traits over a `kube::Client` |
//! | [`publisher`] | [`NodePublisher`](publisher::NodePublisher): node annotations, driver labels, stale resource removal |
//! | [`feature_file`] | [`GfdOutput`](feature_file::GfdOutput): GPU feature labels on the Node or in node-feature-discovery's feature file ([`FeatureFileWriter`](feature_file::FeatureFileWriter)) |
//! | [`reschedule`] | [`RescheduleController`](reschedule::RescheduleController) (gate `AllocationFailureReschedule`): evict or delete-and-recreate pods whose allocation failed, through a recovery checkpoint |
//! | [`node_config_watch`] | [`NodeConfigSource`](node_config_watch::NodeConfigSource): the node configuration file polled while the plugin runs; [`plan_reload`](node_config_watch::plan_reload): what a new version changes live (device lists, re-registration) and what waits for a restart |
//! | [`daemon`] | [`Daemon`](daemon::Daemon): backend + clients + plugins + publisher, run until shutdown (the binary's body) |
//! | [`gates`] | which enabled gates this build cannot honour: the daemon refuses to start on them |
//! | [`config`] | [`PluginConfig`](config::PluginConfig), the resolved configuration |
//! | [`error`] | [`PluginError`](error::PluginError) (per RPC) and [`ServerError`](error::ServerError) |
//!
//! # Example
//!
//! Serve the plugins of a mock node in a temporary directory (no kubelet there, so `run` keeps retrying
//! registration until shutdown):
//!
//! ```
//! use std::{sync::Arc, time::Duration};
//! use vgpu_core::backend::{DeviceBackend, mock::MockBackend};
//! use vgpu_deviceplugin::{
//!     build_handlers, cluster::InMemoryCluster, config::PluginConfig, inventory::{DeviceState, node_devices},
//!     manager::PluginManager,
//! };
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = std::env::temp_dir().join(format!("vgpu-dp-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&dir)?;
//! let backend = MockBackend::from_yaml_str("gpus:\n  - { uuid: GPU-a, name: L4, memoryMiB: 23034 }\n")?;
//! let mut config = PluginConfig::new("node-1");
//! config.device_plugin_path = dir.clone();
//! config.manager_dir = dir.clone();
//! config.watch_interval = Duration::from_millis(20);
//! let state = DeviceState::new(node_devices(&backend.devices()?, &config.settings), &config.settings);
//! tokio::spawn(state.clone().watch_backend(backend.health_events()?));
//! let config = Arc::new(config);
//! let handlers = build_handlers(&config, &state, Some(Arc::new(InMemoryCluster::default())));
//! assert_eq!(handlers[0].resource_name(), "nvidia.com/vgpu-number");
//! assert_eq!(handlers[0].devices(&state.devices()).len(), 10);
//! PluginManager::new((*config).clone(), state, handlers)
//!     .run(tokio::time::sleep(Duration::from_millis(50)))
//!     .await?;
//! # std::fs::remove_dir_all(&dir)?;
//! # Ok(())
//! # }
//! ```

use std::sync::Arc;

use vgpu_core::node_config::MigStrategy;
use vgpu_gates::CoreGate;

pub mod cdi;
pub mod cluster;
pub mod config;
pub mod daemon;
pub mod device_client;
pub mod error;
pub mod feature_file;
pub mod gates;
pub mod ids;
pub mod inventory;
pub mod kube_cluster;
pub mod locate;
pub mod manager;
pub mod mig;
pub mod node_config_watch;
pub mod plugin;
pub mod publisher;
pub mod registration;
pub mod reschedule;
pub mod server;
pub mod service;
pub mod vnumber;
pub mod whole_gpu;

/// Default `--device-plugin-path`: the kubelet's device-plugin directory.
pub const DEFAULT_DEVICE_PLUGIN_PATH: &str = "/var/lib/kubelet/device-plugins/";
/// The kubelet's registration socket, inside the device-plugin directory.
pub const KUBELET_SOCKET: &str = "kubelet.sock";
/// Socket of the `<domain>/vgpu-number` plugin.
pub const VGPU_SOCKET: &str = "nvidia-vgpu.sock";
/// Socket of the `<domain>/vgpu-cores` plugin (gate `GPUCoreResourcePlugin`).
pub const VGPU_CORE_SOCKET: &str = "nvidia-vgpu-core.sock";
/// Socket of the `<domain>/vgpu-memory` plugin (gate `GPUMemoryResourcePlugin`).
pub const VGPU_MEMORY_SOCKET: &str = "nvidia-vgpu-memory.sock";

/// The device-plugin's feature-gate registry (Core).
pub fn feature_gates() -> &'static vgpu_gates::Registry<vgpu_gates::CoreGate> {
    vgpu_gates::device_plugin()
}

/// The plugins this configuration serves, in order: vnumber, or the whole-GPU plugin with
/// [`config::PluginConfig::whole_gpus`] (either unless `migStrategy: single`), one MIG plugin
/// per profile of `config.mig_devices` (unless `migStrategy: none`), vcore (gate `GPUCoreResourcePlugin`),
/// vmemory (gate `GPUMemoryResourcePlugin`).
pub fn build_handlers(
    config: &Arc<config::PluginConfig>,
    state: &inventory::DeviceState,
    cluster: Option<Arc<dyn cluster::ClusterClient>>,
) -> Vec<Arc<dyn plugin::PluginHandler>> {
    let mut handlers: Vec<Arc<dyn plugin::PluginHandler>> = Vec::new();
    if config.settings.mig_strategy != MigStrategy::Single {
        if config.whole_gpus {
            handlers.push(Arc::new(whole_gpu::WholeGpuPlugin::new(Arc::clone(config), state.clone())));
        } else {
            handlers.push(Arc::new(vnumber::VgpuNumberPlugin::new(
                Arc::clone(config),
                state.clone(),
                cluster,
            )));
        }
    }
    if config.settings.mig_strategy != MigStrategy::None {
        for plugin in mig::mig_plugins(config, &config.mig_devices) {
            handlers.push(Arc::new(plugin));
        }
    }
    if config.gates.enabled(CoreGate::GPUCoreResourcePlugin) {
        handlers.push(Arc::new(plugin::ResourcePlugin::cores(&config.domain)));
    }
    if config.gates.enabled(CoreGate::GPUMemoryResourcePlugin) {
        handlers.push(Arc::new(plugin::ResourcePlugin::memory(
            &config.domain,
            config.settings.device_memory_factor,
        )));
    }
    handlers
}
