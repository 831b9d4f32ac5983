//! vgpu-core: the shared vocabulary of vgpu, with no Kubernetes client dependency.
//!
//! Domain model, annotation codecs (wire-compatible with vgpu-manager), node config, device
//! backends, sysfs/PCI discovery, allocators and topology scoring. Filled in by issues #3 and #4.
//!
//! - [`topology`]: `node-device-topology` codec, link scores, best-effort GPU set allocation.

pub mod topology;
