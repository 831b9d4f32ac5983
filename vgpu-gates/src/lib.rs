//! Feature-gate registries for the vgpu components.
//!
//! vgpu's components, like vgpu-manager's, switch optional behaviour with
//! `--feature-gates=A=true,B=false`. This crate implements that contract exactly
//! (`shared/spec/feature_gates.md`): two registries (Core for device-plugin, scheduler-extender
//! and device-monitor; DRA for kubelet-plugin), Kubernetes component-base parsing and stage
//! semantics, and the DRA driver's dependency and exclusion rules. It is also a small, reusable
//! abstraction for your own components.
//!
//! # Module map
//! - [`FeatureGate`], [`GateSpec`], [`Stage`], [`feature_gates!`]: declaring gates.
//! - [`Registry`]: the gates a component accepts, with rules and unknown-name hints.
//! - [`FeatureGates`]: a component's gate state; set, render, validate.
//! - [`Component`], [`CoreGate`], [`DraGate`] and the registry functions
//!   ([`device_plugin`], [`scheduler_extender`], [`device_monitor`], [`kubelet_plugin`]): ours.
//! - [`AnyRegistry`]: a type-erased registry for tools that handle every component.
//! - [`parse_values`]: Helm-values-style maps.
//!
//! # Example: checking a kubelet-plugin configuration
//! ```
//! use vgpu_gates::{DraGate, Error, kubelet_plugin};
//!
//! // VGPUSupport is on by default and excludes MPSSupport.
//! let err = kubelet_plugin().configure(["MPSSupport=true"]).unwrap_err();
//! let Error::Validation(v) = err else { panic!("expected a rule violation") };
//! assert_eq!(
//!     v.violations()[0].to_string(),
//!     "feature gate VGPUSupport is currently mutually exclusive with MPSSupport; fix: set VGPUSupport=false"
//! );
//!
//! let gates = kubelet_plugin().configure(["MPSSupport=true,VGPUSupport=false"])?;
//! assert!(gates.enabled(DraGate::MPSSupport));
//! assert_eq!(gates.to_string(), "MPSSupport=true,VGPUSupport=false");
//! # Ok::<(), Error>(())
//! ```
//!
//! # Example: your own component
//! ```
//! vgpu_gates::feature_gates! {
//!     /// Gates of my operator.
//!     pub enum MyGate {
//!         /// A new reconciler.
//!         FastPath => alpha(false),
//!         /// Needed by FastPath.
//!         Caching => beta(true),
//!     }
//! }
//! let registry = vgpu_gates::Registry::builder("my-operator")
//!     .gates(MyGate::ALL.iter().copied())
//!     .requires(MyGate::FastPath, MyGate::Caching)
//!     .build()?;
//! assert!(registry.configure(["FastPath=true,Caching=false"]).is_err());
//! assert!(registry.configure(["FastPath=true"])?.enabled(MyGate::FastPath));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod components;
mod dynamic;
mod error;
mod parse;
mod registry;
mod set;
mod spec;
mod validate;
mod values;

pub use components::{
    Component, CoreGate, DraGate, FEATURE_GATES_ENV, RENAMED_GATES, RegistryKind, UnknownComponent,
    device_monitor, device_plugin, kubelet_plugin, scheduler_extender,
};
pub use dynamic::{AnyRegistry, Configured, GateInfo};
pub use error::{
    Error, Fix, GateError, RegistryError, SetError, Unrecognized, ValidationError, ValuesError, Violation,
};
pub use parse::{parse_bool, parse_entries};
pub use registry::{ALL_ALPHA, ALL_BETA, Registry, RegistryBuilder, Rule};
pub use set::FeatureGates;
pub use spec::{FeatureGate, GateSpec, Stage};
pub use values::parse_values;
