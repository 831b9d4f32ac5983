//! vgpu-node: the node runtime shared by the device plugin (`vgpu-deviceplugin`) and the DRA kubelet plugin
//! (`vgpu-dra`): the same code runs in either, whichever of them the node uses.
//!
//! | module | what it holds |
//! |---|---|
//! | [`registry`] | client mode (gate `DevicePluginClientMode`): `VDeviceRegistry` on `<manager-dir>/registry/socket.sock`, callers identified on accept ([`registry::peer`], [`registry::cgroup`]), their container's PIDs → `pids.config`; register UUIDs of DRA claim partitions through a [`RegisterResolver`](registry::RegisterResolver) |
//! | [`api`] | generated tonic/prost code of that registry (package `registry`) |
//! | [`sm_watcher`] | [`SmWatcher`](sm_watcher::SmWatcher) (gate `SharedSMUtilizationWatcher`): samples every GPU once per period and rewrites `watcher/sm_util.config` in place |
//!
//! # Example
//!
//! Serve the registry under a temporary manager directory: the socket appears with mode 0660 and is removed
//! on stop.
//!
//! ```
//! use std::{os::unix::fs::PermissionsExt as _, time::Duration};
//! use vgpu_core::node_config::CgroupDriver;
//! use vgpu_node::registry::{RegistryConfig, serve_registry};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = tempfile::tempdir()?;
//! let config = RegistryConfig {
//!     manager_dir: dir.path().to_path_buf(),
//!     proc_root: "/proc".into(),
//!     cgroup_root: "/sys/fs/cgroup".into(),
//!     cgroup_driver: CgroupDriver::Auto,
//!     poll_interval: Duration::from_millis(40),
//!     poll_timeout: Duration::from_secs(60),
//!     socket_group: None,
//! };
//! let running = serve_registry(config)?;
//! assert_eq!(running.socket, dir.path().join("registry/socket.sock"));
//! assert_eq!(std::fs::metadata(&running.socket)?.permissions().mode() & 0o777, 0o660);
//! let socket = running.socket.clone();
//! running.stop().await;
//! assert!(!socket.exists());
//! # Ok(())
//! # }
//! ```

pub mod api;
pub mod registry;
pub mod sm_watcher;
