//! # vgpu: GPU sharing and allocation for Kubernetes
//!
//! `vgpu` is the facade over the vgpu crates, in the way the `kube` crate fronts `kube-core`
//! and `kube-client`: depend on it and pick features, or depend on a member crate directly.
//!
//! | feature | re-export | crate |
//! |---|---|---|
//! | `core` (default) | [`core`] | `vgpu-core`: domain model, codecs, node config, backends, allocators |
//! | `gates` (default) | [`gates`] | `vgpu-gates`: feature-gate registries |
//! | `nvml` | `nvml` | `vgpu-nvml`: NVIDIA and MetaX backends |
//! | `deviceplugin` | `deviceplugin` | `vgpu-deviceplugin`: kubelet device plugin |
//! | `scheduler` | `scheduler` | `vgpu-scheduler`: scheduler extender |
//! | `dra` | `dra` | `vgpu-dra`: DRA kubelet plugin |
//! | `serve` | `serve` | `vgpu-serve`: TLS reload and client authentication, TokenReview/SubjectAccessReview |
//! | `monitor` | `monitor` | `vgpu-monitor`: device monitor (per-container and physical GPU metrics) |
//! | `webhook` | `webhook` | `vgpu-webhook`: admission webhook (pod mutation and validation) |
//! | `api` | `api` | `vgpu-api`: GPU module resource types (PhysicalGPU, GPUClass) |
//! | `node-agent` | `node_agent` | `vgpu-node-agent`: GPU module node agent |
//! | `controller` | `controller` | `vgpu-controller`: GPU module controller |
//! | `mig-manager` | `mig_manager` | `vgpu-mig-manager`: MIG manager of the device-plugin mode |
//! | `nri` | `nri` | `vgpu-nri`: NRI plugin runtime over ttrpc (containerd / CRI-O) |
//! | `kubelet` | `kubelet` | `vgpu-kubelet`: the kubelet's gRPC APIs (device plugin, pod-resources, plugin registration, DRA), unix sockets |
//! | `node` | `node` | `vgpu-node`: node runtime shared by the device plugin and the DRA driver (client-mode registry, SM watcher) |
//! | `kube` | `kube` | `vgpu-kube`: Kubernetes client set-up (kubeconfig/in-cluster, client-go's QPS/burst token bucket) |
//! | `lease` | `lease` | `vgpu-lease`: Lease leader election and readiness |
//! | `full` | all of the above | |
//!
//! ```
//! # #[cfg(feature = "gates")] {
//! use vgpu::gates::{CoreGate, scheduler_extender};
//!
//! let gates = scheduler_extender().configure(["SerializedNodeFilter=false"])?;
//! assert!(!gates.enabled(CoreGate::SerializedNodeFilter));
//! assert!(gates.enabled(CoreGate::SerializedNodeBind));
//! # }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "core")]
#[cfg_attr(docsrs, doc(cfg(feature = "core")))]
#[doc(inline)]
pub use vgpu_core as core;

#[cfg(feature = "gates")]
#[cfg_attr(docsrs, doc(cfg(feature = "gates")))]
#[doc(inline)]
pub use vgpu_gates as gates;

#[cfg(feature = "nvml")]
#[cfg_attr(docsrs, doc(cfg(feature = "nvml")))]
#[doc(inline)]
pub use vgpu_nvml as nvml;

#[cfg(feature = "deviceplugin")]
#[cfg_attr(docsrs, doc(cfg(feature = "deviceplugin")))]
#[doc(inline)]
pub use vgpu_deviceplugin as deviceplugin;

#[cfg(feature = "scheduler")]
#[cfg_attr(docsrs, doc(cfg(feature = "scheduler")))]
#[doc(inline)]
pub use vgpu_scheduler as scheduler;

#[cfg(feature = "dra")]
#[cfg_attr(docsrs, doc(cfg(feature = "dra")))]
#[doc(inline)]
pub use vgpu_dra as dra;

#[cfg(feature = "serve")]
#[cfg_attr(docsrs, doc(cfg(feature = "serve")))]
#[doc(inline)]
pub use vgpu_serve as serve;

#[cfg(feature = "monitor")]
#[cfg_attr(docsrs, doc(cfg(feature = "monitor")))]
#[doc(inline)]
pub use vgpu_monitor as monitor;

#[cfg(feature = "webhook")]
#[cfg_attr(docsrs, doc(cfg(feature = "webhook")))]
#[doc(inline)]
pub use vgpu_webhook as webhook;

#[cfg(feature = "api")]
#[cfg_attr(docsrs, doc(cfg(feature = "api")))]
#[doc(inline)]
pub use vgpu_api as api;

#[cfg(feature = "node-agent")]
#[cfg_attr(docsrs, doc(cfg(feature = "node-agent")))]
#[doc(inline)]
pub use vgpu_node_agent as node_agent;

#[cfg(feature = "controller")]
#[cfg_attr(docsrs, doc(cfg(feature = "controller")))]
#[doc(inline)]
pub use vgpu_controller as controller;

#[cfg(feature = "mig-manager")]
#[cfg_attr(docsrs, doc(cfg(feature = "mig-manager")))]
#[doc(inline)]
pub use vgpu_mig_manager as mig_manager;

#[cfg(feature = "nri")]
#[cfg_attr(docsrs, doc(cfg(feature = "nri")))]
#[doc(inline)]
pub use vgpu_nri as nri;

#[cfg(feature = "kubelet")]
#[cfg_attr(docsrs, doc(cfg(feature = "kubelet")))]
#[doc(inline)]
pub use vgpu_kubelet as kubelet;

#[cfg(feature = "node")]
#[cfg_attr(docsrs, doc(cfg(feature = "node")))]
#[doc(inline)]
pub use vgpu_node as node;

#[cfg(feature = "kube")]
#[cfg_attr(docsrs, doc(cfg(feature = "kube")))]
#[doc(inline)]
pub use vgpu_kube as kube;

#[cfg(feature = "lease")]
#[cfg_attr(docsrs, doc(cfg(feature = "lease")))]
#[doc(inline)]
pub use vgpu_lease as lease;
