//! vgpu-dra: the DRA kubelet plugin of vgpu (contract §9): ResourceSlices with consumable vGPU capacity,
//! device health taints and the resource-health stream, NodePrepareResources / NodeUnprepareResources with a
//! crash-safe checkpoint, per-claim CDI specs. The binary `vgpu-kubelet-plugin` only parses flags and wires
//! these modules.
//!
//! # Module map
//!
//! | module | what it holds |
//! |---|---|
//! | [`devices`] | the allocatable device model: GPU → `vgpu-<minor>` / `gpu-<minor>` with `cores` / `memory` / `shares` capacities; consumed capacity → share limits |
//! | [`slices`] | ResourceSlice builder and [`SlicePublisher`](slices::publisher::SlicePublisher) (republish on change, pool generation bumped), DeviceClasses |
//! | [`health`] | backend health events → per-device status and taints ([`HealthMonitor`](health::HealthMonitor), a watch channel) |
//! | [`api`] | generated gRPC code of `grpc.health.v1` (the kubelet APIs, `pluginregistration`, DRA `v1` / `v1beta1`, dra-health `v1` / `v1alpha1`, are in `vgpu-kubelet`) |
//! | [`registration`] | `pluginregistration.Registration` (GetInfo, NotifyRegistrationStatus) |
//! | [`service`] | `DRAPlugin` v1 + v1beta1 and `DRAResourceHealth` v1 + v1alpha1: translation only |
//! | [`daemon`] | [`Daemon`](daemon::Daemon): the whole process the binary runs — the claim modes and the components in their start-up order, the start-up refusals |
//! | [`driver`] | [`Driver`](driver::Driver): both sockets bound atomically, re-bound when removed, the stale-claim sweep, the shared SM watcher (gate `SharedSMUtilizationWatcher`) |
//! | [`state`] | [`DeviceState`](state::DeviceState): Prepare / Unprepare, the claim state machine and the order of side effects |
//! | [`checkpoint`] | `checkpoint.json`: v1/v2 layout, FNV-1a checksum, boot ID |
//! | [`cdi`] | the per-claim CDI spec (typed), device names and their sanitizer |
//! | [`lock`] | `pu.lock`, the node-wide Prepare/Unprepare flock (10 s acquire limit) |
//! | [`claims`] | [`ClaimSource`](claims::ClaimSource): ResourceClaims by namespace/name ([`KubeClaims`](claims::KubeClaims), [`InMemoryClaims`](claims::InMemoryClaims)) |
//! | [`client_mode`] | gate `DevicePluginClientMode`: register UUIDs per vGPU partition, the claim annotations, the registry's resolver ([`RegisterTable`](client_mode::RegisterTable)) |
//! | [`config`] | [`DriverConfig`](config::DriverConfig), the resolved configuration and its paths |
//! | [`gates`] | which gates this build refuses (not built) and why |
//! | [`healthcheck`] | `grpc.health.v1.Health/Check` on `--healthcheck-port`: both sockets answer → `SERVING` |
//! | [`partition`] | partition keys: which consumer containers share a vGPU partition directory (graph walk, `pod-…` / `cg-…` keys) |
//! | [`modes`] | claim modes (time-slicing, MPS, dynamic MIG, VFIO, Fabric Manager, device metadata): host actions planned, recorded in the checkpoint, applied on Prepare and reverted on Unprepare |
//! | [`vfio_switch`] | the GPU module's `vfio-switch-<node>-<pci>` Job: a GPU moved between `nvidia` and `vfio-pci` through sysfs ([`Switcher`](vfio_switch::Switcher)), and the adapter's [`SwitchController`](vfio_switch::controller::SwitchController) that creates those Jobs from `PhysicalGPU.spec.passthrough`, once no claim or process holds the GPU ([`usage`](vfio_switch::usage)) |
//! | [`metrics`] | Prometheus metrics: prepared claims, Prepare/Unprepare counters and durations, slice publishing, device health |
//! | [`endpoint`] | `--http-endpoint`: `/healthz`, `/readyz` ([`Readiness`](endpoint::Readiness): sockets + kubelet registration + NRI), `--metrics-path` ([`metrics`], `process_*`) |
//!
//! # Sockets and files
//!
//! | path (defaults) | what |
//! |---|---|
//! | `/var/lib/kubelet/plugins_registry/manager.nvidia.com-reg.sock` | registration: `GetInfo` → `DRAPlugin`, the driver name, the DRA socket, `v1.DRAPlugin`, `v1beta1.DRAPlugin`, `v1.DRAResourceHealth` |
//! | `/var/lib/kubelet/plugins/manager.nvidia.com/dra.sock` | `NodePrepareResources`, `NodeUnprepareResources`, `NodeWatchResources` |
//! | `/var/lib/kubelet/plugins/manager.nvidia.com/checkpoint.json` | the prepared claims |
//! | `/var/lib/kubelet/plugins/manager.nvidia.com/pu.lock` | Prepare/Unprepare lock |
//! | `<cdi-root>/k8s.manager.nvidia.com-claim_<claimUID>.json` | a prepared claim's CDI spec (`k8s.manager.nvidia.com/claim=<claimUID>-…`) |
//! | `<host-manager-dir>/claims/<claimUID>/<partitionKey>/{config,vgpu_lock,vmem_node,sm_node}` | a vGPU claim's partition, mounted into its containers |
//! | `<manager-dir>/registry/socket.sock` | gate `DevicePluginClientMode`: the device plugin's registry server, resolving the partitions' register UUIDs ([`client_mode`]) |
//!
//! # Prepare and Unprepare
//!
//! A claim goes absent → `PrepareStarted` → `PrepareCompleted` → absent. Prepare records `PrepareStarted`
//! (with the paths it will create) before any side effect, then creates the partition directories, writes
//! the CDI spec and records `PrepareCompleted`; a completed claim is answered from the checkpoint, a started
//! one is rolled back first (and every started one at start-up; every one after a reboot). Unprepare removes
//! the CDI spec, then the claim directory, then the entry; a claim that is not prepared is done. Each claim
//! of a call succeeds or fails on its own. Details: [`state`].
//!
//! # Example
//!
//! A node in a temporary directory: the plugin serves, the test plays the kubelet.
//!
//! ```
//! use std::{path::Path, sync::Arc, time::Duration};
//! use vgpu_core::backend::{NvidiaAdapter, mock::MockBackend};
//! use vgpu_dra::{
//!     claims::{InMemoryClaims, allocated, allocation_result, claim},
//!     config::DriverConfig,
//!     devices::{AllocatableDevices, DeviceConfig},
//!     driver::Driver,
//!     health::HealthSnapshot,
//!     state::DeviceState,
//! };
//! use vgpu_kubelet::{
//!     api::{dra_v1, pluginregistration as pr},
//!     socket::connect_unix,
//! };
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = tempfile::tempdir()?;
//! let mut config = DriverConfig::under("node-1", dir.path());
//! config.boot_id_path = dir.path().join("boot_id");
//! // What the install step puts on the host: vGPU claims are refused without it.
//! vgpu_core::abi::runtime_files::install(&config.manager_dir, &config.library_version, b"")?;
//! let backend = MockBackend::from_yaml_str("gpus:\n  - { uuid: GPU-a, name: NVIDIA A30, memoryMiB: 24576 }\n")?;
//! let devices = Arc::new(AllocatableDevices::from_backend(&backend, &DeviceConfig::default())?);
//! let claims = Arc::new(InMemoryClaims::default());
//! let share = allocation_result("gpu", "manager.nvidia.com", "node-1", "vgpu-0", Some("s1"), &[("cores", "10"), ("memory", "1Gi")]);
//! claims.insert(allocated(claim("ns", "c1", "uid-1"), vec![share], &["pod-uid"]));
//! let config = Arc::new(config);
//! let state = DeviceState::new(config.clone(), devices, Arc::new(NvidiaAdapter), claims).await?;
//! let (_health, feed) = tokio::sync::watch::channel(HealthSnapshot::unmonitored_default());
//! let running = Driver::new(Arc::new(state), feed).serve()?;
//!
//! // The kubelet: GetInfo on the registration socket, then Prepare on the endpoint it names.
//! let channel = connect_unix(&running.registration_socket, Duration::from_secs(5)).await?;
//! let info = pr::registration_client::RegistrationClient::new(channel).get_info(pr::InfoRequest {}).await?.into_inner();
//! let channel = connect_unix(Path::new(&info.endpoint), Duration::from_secs(5)).await?;
//! let claim = dra_v1::Claim { namespace: "ns".into(), uid: "uid-1".into(), name: "c1".into() };
//! let response = dra_v1::dra_plugin_client::DraPluginClient::new(channel)
//!     .node_prepare_resources(dra_v1::NodePrepareResourcesRequest { claims: vec![claim] })
//!     .await?
//!     .into_inner();
//! let device = &response.claims["uid-1"].devices[0];
//! assert_eq!(device.cdi_device_ids, ["k8s.manager.nvidia.com/claim=uid-1-gpu-vgpu-0-share-s1"]);
//! let spec = std::fs::read_to_string(config.cdi_spec_path("uid-1"))?;
//! assert!(spec.contains("CUDA_MEM_LIMIT_0=1024m") && spec.contains("CUDA_CORE_LIMIT_0=10"));
//! running.stop().await?;
//! # Ok(())
//! # }
//! ```
//!
//! The gate registry (its start-up validation: Requires and Mutually-exclusive rules):
//!
//! ```
//! use vgpu_dra::{DRIVER_NAME, feature_gates};
//!
//! assert_eq!(DRIVER_NAME, "manager.nvidia.com");
//! assert!(feature_gates().configure(["DynamicMIG=true"]).is_err(), "NVMLDeviceHealthCheck is on by default");
//! assert!(feature_gates().configure(["DynamicMIG=true,NVMLDeviceHealthCheck=false"]).is_ok());
//! ```

pub mod api;
pub mod cdi;
pub mod checkpoint;
pub mod claims;
pub mod client_mode;
pub mod config;
pub mod daemon;
pub mod devices;
pub mod driver;
pub mod endpoint;
pub mod fabric;
pub mod gates;
pub mod health;
pub mod healthcheck;
pub mod imex;
pub mod lock;
pub mod metadata;
pub mod metrics;
pub mod mig;
pub mod modes;
pub mod mps;
pub mod nri;
pub mod opaque;
pub mod partition;
pub mod physical_gpu;
pub mod registration;
pub mod service;
pub mod sharing;
pub mod slices;
pub mod state;
pub mod vfio;
pub mod vfio_switch;

/// The DRA driver name.
pub const DRIVER_NAME: &str = vgpu_core::dra::DRIVER_NAME;
/// CDI vendor of the DRA plugin's devices.
pub const CDI_VENDOR: &str = vgpu_core::dra::CDI_VENDOR;
/// CDI class of the DRA plugin's devices.
pub const CDI_CLASS: &str = vgpu_core::dra::CDI_CLASS;
/// Environment variable the plugin reads its gates from.
pub const FEATURE_GATES_ENV: &str = vgpu_gates::FEATURE_GATES_ENV;

/// The kubelet-plugin's feature-gate registry (DRA).
pub fn feature_gates() -> &'static vgpu_gates::Registry<vgpu_gates::DraGate> {
    vgpu_gates::kubelet_plugin()
}
