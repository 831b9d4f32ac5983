//! vgpu-core: the shared vocabulary of vgpu, with no Kubernetes client dependency.
//!
//! Domain model, annotation codecs (wire-compatible with vgpu-manager), node config, device
//! backends, sysfs/PCI discovery, allocators and topology scoring.

pub mod codec;
pub mod domain;
pub mod model;
pub mod node_config;
