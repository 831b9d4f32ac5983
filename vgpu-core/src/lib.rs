//! vgpu-core: the shared vocabulary of vgpu, with no Kubernetes client dependency.
//!
//! Pure types and algorithms (sans-IO apart from reading the node config file and sysfs), wire-compatible with the Go
//! project vgpu-manager.
//!
//! # Module map
//!
//! | module | what it holds |
//! |---|---|
//! | [`abi`] | byte-exact shared files: `vgpu.config` ([`abi::vgpu_config`], magic `VGCF`, 8192 bytes) and `devices.json`, written atomically |
//! | [`domain`] | [`ResourceDomain`](domain::ResourceDomain): the configurable `nvidia.com` domain and every resource, annotation and label key built from it |
//! | [`model`] | the domain model: [`GpuDevice`](model::GpuDevice), [`NodeDeviceInventory`](model::NodeDeviceInventory), [`NodeVgpuConfig`](model::NodeVgpuConfig), requests, [`PodDeviceClaim`](model::PodDeviceClaim), policy enums |
//! | [`codec`] | byte-exact codecs for `node-device-register`, `node-config-info`, `pre-allocated`/`real-allocated` and the include/exclude GPU lists |
//! | [`node_config`] | the device plugin's per-node config file (JSONC or YAML) and the effective [`NodeSettings`](node_config::NodeSettings) |
//! | [`backend`] | the vendor-neutral [`DeviceBackend`](backend::DeviceBackend) seam (devices, memory, links, health, processes, MIG) and the mock backend |
//! | [`cdi`] | the CDI spec model, field for field as the CDI specification, and its validation rules ([`validate`](cdi::validate)) |
//! | [`discovery`] | vendor-neutral GPU scan of sysfs, `pci.ids` naming, vendor table, bare-metal detection |
//! | [`alloc`] | vGPU allocation: pod request model, per-node placement (filters, policies, NUMA/link topology), reason codes, node ordering and scores |
//! | [`dra`] | the DRA wire names (driver, CDI kind, capacity and attribute names) the plugin, the webhook and the monitor share |
//! | [`nfd`] | node-feature-discovery local feature files (`features.d/`): encoder, parser, atomic writer |
//! | [`clock`] | the time seam: [`Clock`](clock::Clock) (Unix nanoseconds), the wall clock and a manual clock for tests |
//! | [`topology`] | P2P link types, the `node-device-topology` codec, pair/set scores and the exact best-effort GPU-set optimizer |
//!
//! # Example
//!
//! Decode a node's annotations, check a pod's policy and claim, and re-encode byte for byte:
//!
//! ```
//! use vgpu_core::{
//!     codec::{node_config_info, node_devices, pod_devices},
//!     domain::ResourceDomain,
//!     model::{MemoryPolicy, TopologyMode},
//! };
//!
//! let domain = ResourceDomain::default();
//! assert_eq!(domain.node_device_register(), "nvidia.com/node-device-register");
//!
//! let register = r#"[{"id":0,"type":"NVIDIA GeForce GTX 1050 Ti","uuid":"GPU-49aa2e6a-33f3-99dd-e08b-ea4beb0e0d28","core":100,"memory":8192,"number":10,"numa":0,"mig":false,"busId":"0000:01:00.0","capability":6.1,"healthy":true}]"#;
//! let inventory = node_devices::decode(register)?;
//! assert_eq!(inventory.devices[0].memory_mib, 8192);
//! assert_eq!(node_devices::encode(&inventory)?, register);
//!
//! let config = node_config_info::decode(r#"{"deviceSplit":10,"coresScaling":1,"memoryFactor":1,"memoryScaling":1}"#)?;
//! let policy: MemoryPolicy = "physical".parse()?;
//! assert!(policy.admits(config.memory_scaling));
//! assert!("link-strict".parse::<TopologyMode>()?.is_strict());
//!
//! let claim = pod_devices::decode_pre_allocated("main[0_GPU-49aa2e6a-33f3-99dd-e08b-ea4beb0e0d28_50_4096]")?;
//! assert_eq!(claim.containers[0].devices[0].cores, 50);
//!
//! // Errors name the annotation and what was expected.
//! let err = pod_devices::decode_pre_allocated("main[0_GPU-x_50]").unwrap_err();
//! assert!(err.to_string().starts_with("invalid pre-allocated value"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod abi;
pub mod alloc;
pub mod backend;
pub mod cdi;
pub mod clock;
pub mod codec;
pub mod discovery;
pub mod domain;
pub mod dra;
pub mod gfd;
pub mod model;
pub mod nfd;
pub mod node_config;
pub mod topology;
