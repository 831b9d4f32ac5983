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
