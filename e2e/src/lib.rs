//! End-to-end test environment for vgpu, in the spirit of controller-runtime's `envtest`.
//!
//! [`TestEnv`] starts the upstream `etcd` and `kube-apiserver` (built at the versions pinned in
//! `e2e/controlplane/go.mod` by `e2e/build-controlplane.sh`) on free `127.0.0.1` ports, with
//! generated certificates, a static-token admin identity and a service-account signing key. It
//! writes a kubeconfig, waits for `/readyz`, and can start `kube-scheduler` with a
//! `KubeSchedulerConfiguration` whose `vgpu-scheduler` profile calls a scheduler extender
//! ([`ExtenderConfig`]).
//!
//! Everything is torn down when the [`TestEnv`] is dropped (process groups killed, temporary
//! folder removed), also on panic. Unless [`TestEnv::finish`] was called, the logs and
//! configuration files are first copied to `target/e2e-logs/<test>/`.
//!
//! The binaries are found through `VGPU_E2E_BIN_DIR`, or in the build cache
//! (`$VGPU_E2E_CACHE`, default `~/.cache/vgpu-e2e`, subfolder `k8s-<ver>_etcd-<ver>`); see
//! [`Binaries::locate`].
//!
//! [`RealNode`] adds a real node to an environment: the upstream kubelet on containerd, runc and CNI
//! (built by `e2e/build-node.sh`), with only the GPU mocked.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use vgpu_e2e::{ExtenderConfig, TestEnv};
//! let mut env = TestEnv::builder("my_test").start().await?;
//! let client = env.client().await?;
//! env.start_scheduler(&ExtenderConfig::vgpu("http://127.0.0.1:3456/scheduler")).await?;
//! // ... create objects with `client`, assert ...
//! env.finish();
//! # let _ = client;
//! # Ok(())
//! # }
//! ```

mod binaries;
mod certs;
mod env;
pub mod fixtures;
pub mod helm;
pub mod images;
pub mod json_server;
pub mod known_pid;
pub mod kubelet;
mod net;
pub mod nfd;
pub mod plugin_node;
pub mod probe;
mod process;
pub mod prometheus;
pub mod rbac;
pub mod real_node;
mod scheduler;
mod vgpu;
pub mod webhook;

pub use binaries::{BIN_DIR_ENV, Binaries, CACHE_ENV, ETCD_VERSION, K8S_VERSION, default_bin_dir};
pub use env::{TestEnv, TestEnvBuilder};
pub use json_server::JsonServer;
pub use real_node::{RealNode, RealNodeBuilder};
pub use scheduler::{ExtenderConfig, SCHEDULER_NAME, VGPU_RESOURCES, scheduler_configuration};
pub use vgpu::{
    VGPU_BIN_DIR_ENV, free_port, http_get, http_get_with_headers, https_get, vgpu_binary, wait_ready,
    wait_ready_tls,
};
