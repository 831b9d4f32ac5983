//! Claim modes: what a sharing or isolation mode (time-slicing, MPS, dynamic MIG, VFIO passthrough, Fabric
//! Manager partitions, device metadata) changes on the host for one claim, recorded in the checkpoint before
//! it is done and reverted on Unprepare or rollback.
//!
//! A mode is a [`ClaimMode`]. [`DeviceState`](crate::state::DeviceState) asks every enabled mode, in the
//! order they were installed, to [`plan`](ClaimMode::plan) its host actions for a claim (pure: no side
//! effect; an error fails the claim with nothing done), records them in the claim's `PrepareStarted` entry
//! ([`HostAction`]), then [`apply`](ClaimMode::apply)s them in order, collecting each action's CDI edits
//! ([`ModeEdits`]), and writes the CDI spec. Unprepare and rollback [`revert`](ClaimMode::revert) the
//! recorded actions newest first, before removing the claim's files.
//!
//! | step | what a mode must guarantee |
//! |---|---|
//! | plan | no side effect; the action is plain data (serialised into the checkpoint), enough to apply *and* revert it after a restart |
//! | apply | idempotent: applying an action that is already in effect changes nothing and returns the same edits |
//! | revert | idempotent, and fine for an action that was never applied (a crash may come before or after apply) |
//!
//! A recorded action whose mode is not installed (its gate was turned off while the claim stayed prepared)
//! cannot be reverted: Unprepare fails with [`ModeError::NotInstalled`], naming the gate to turn back on, and
//! keeps the entry, so nothing is silently left behind on the host.
//!
//! ```
//! use std::sync::Arc;
//! use vgpu_dra::modes::{ClaimContext, ClaimMode, ModeEdits, ModeError};
//!
//! /// A mode that sets one env variable per claim and has nothing to undo.
//! #[derive(Debug)]
//! struct Hello;
//!
//! impl ClaimMode for Hello {
//!     fn name(&self) -> &'static str {
//!         "hello"
//!     }
//!     fn gate(&self) -> &'static str {
//!         "None"
//!     }
//!     fn plan(&self, ctx: &ClaimContext<'_>) -> Result<Vec<serde_json::Value>, ModeError> {
//!         Ok(vec![serde_json::json!({ "claim": ctx.claim.uid })])
//!     }
//!     fn apply(&self, _ctx: &ClaimContext<'_>, action: &serde_json::Value) -> Result<ModeEdits, ModeError> {
//!         let mut edits = ModeEdits::default();
//!         edits.common.env.push(format!("HELLO={}", action["claim"].as_str().unwrap_or_default()));
//!         Ok(edits)
//!     }
//!     fn revert(&self, _action: &serde_json::Value) -> Result<(), ModeError> {
//!         Ok(())
//!     }
//! }
//!
//! let modes: Vec<Arc<dyn ClaimMode>> = vec![Arc::new(Hello)];
//! assert_eq!(modes[0].name(), "hello");
//! ```

use std::{collections::BTreeMap, fmt};

use k8s_openapi::api::resource::v1::ResourceClaim;
use serde::{Deserialize, Serialize};

use crate::{claims::ClaimRef, config::DriverConfig, devices::AllocatableDevice};
use vgpu_core::cdi::ContainerEdits;

/// One host action of a claim as the checkpoint records it (`hostActions` of the claim's entry).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostAction {
    /// The mode that planned it ([`ClaimMode::name`]).
    pub mode: String,
    /// The mode's own description of the action.
    pub action: serde_json::Value,
}

/// One allocation result of this driver in a claim, resolved to the device it names.
#[derive(Debug, Clone)]
pub struct ClaimDevice {
    /// The request (`request` or `request/subrequest`) the result satisfies.
    pub request: String,
    /// The device.
    pub device: AllocatableDevice,
    /// The allocation's share ID (devices with `allowMultipleAllocations`).
    pub share_id: Option<String>,
    /// The device's name in the claim's CDI spec (the key of [`ModeEdits::devices`]).
    pub cdi_name: String,
}

/// What a mode sees of a claim while planning and applying.
#[derive(Debug, Clone, Copy)]
pub struct ClaimContext<'a> {
    /// The claim as the kubelet names it.
    pub claim: &'a ClaimRef,
    /// The ResourceClaim as read from the API (its allocation, opaque configs, consumers).
    pub object: &'a ResourceClaim,
    /// This driver's allocation results, in the order of the claim's results.
    pub devices: &'a [ClaimDevice],
    /// The plugin's configuration.
    pub config: &'a DriverConfig,
}

/// CDI edits an applied action contributes to the claim's spec.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModeEdits {
    /// Edits for every container that uses any device of the claim.
    pub common: ContainerEdits,
    /// Edits per device, by [`ClaimDevice::cdi_name`].
    pub devices: BTreeMap<String, ContainerEdits>,
}

impl ModeEdits {
    /// Appends `other`'s edits to these.
    pub fn merge(&mut self, other: ModeEdits) {
        append(&mut self.common, other.common);
        for (name, edits) in other.devices {
            append(self.devices.entry(name).or_default(), edits);
        }
    }
}

/// Appends `from`'s env, device nodes and mounts to `into`.
pub fn append(into: &mut ContainerEdits, from: ContainerEdits) {
    into.env.extend(from.env);
    into.device_nodes.extend(from.device_nodes);
    into.mounts.extend(from.mounts);
}

/// Why a mode could not plan, apply or revert an action.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModeError {
    /// The claim asks for something this mode cannot give (bad opaque config, no matching partition, …):
    /// nothing was done.
    #[error("{mode}: {message}")]
    Claim {
        /// The mode.
        mode: &'static str,
        /// What is wrong, naming the field or device.
        message: String,
    },
    /// A host step failed.
    #[error("{mode}: {step}: {source}")]
    Host {
        /// The mode.
        mode: &'static str,
        /// What was being done (e.g. `bind 0000:3b:00.0 to vfio-pci`).
        step: String,
        /// The cause.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A recorded action is not what the mode writes (checkpoint edited or from another version).
    #[error("{mode}: recorded action {action} cannot be read: {source}")]
    Record {
        /// The mode.
        mode: String,
        /// The action as recorded.
        action: String,
        /// The decode error.
        #[source]
        source: serde_json::Error,
    },
    /// A recorded action's mode is not installed.
    #[error(
        "the claim has a recorded {mode:?} host action but that mode is not enabled; turn feature gate {gate} back on to unprepare it"
    )]
    NotInstalled {
        /// The recorded mode name.
        mode: String,
        /// The gate that enables it (best guess from the name).
        gate: String,
    },
}

impl ModeError {
    /// A [`ModeError::Claim`].
    pub fn claim(mode: &'static str, message: impl Into<String>) -> Self {
        Self::Claim { mode, message: message.into() }
    }

    /// A [`ModeError::Host`].
    pub fn host(
        mode: &'static str,
        step: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Self::Host { mode, step: step.into(), source: source.into() }
    }
}

/// Decodes a recorded action into the mode's own type (a [`ModeError::Record`] when it does not fit).
pub fn decode<T: serde::de::DeserializeOwned>(
    mode: &str,
    action: &serde_json::Value,
) -> Result<T, ModeError> {
    T::deserialize(action).map_err(|source| ModeError::Record {
        mode: mode.to_owned(),
        action: action.to_string(),
        source,
    })
}

/// Encodes a mode's action for the checkpoint.
pub fn encode<T: Serialize>(mode: &'static str, action: &T) -> Result<serde_json::Value, ModeError> {
    serde_json::to_value(action).map_err(|e| ModeError::host(mode, "encode the host action", e))
}

/// A sharing or isolation mode (see the module docs for the contract of each method).
pub trait ClaimMode: Send + Sync + fmt::Debug {
    /// The name recorded with each action (`timeSlicing`, `mps`, `mig`, `vfio`, `fabricManager`, …).
    fn name(&self) -> &'static str;
    /// The feature gate that enables the mode (named when a recorded action cannot be reverted).
    fn gate(&self) -> &'static str;
    /// The claim's actions for this mode, as plain data; no side effect. An empty list: nothing to do.
    fn plan(&self, ctx: &ClaimContext<'_>) -> Result<Vec<serde_json::Value>, ModeError>;
    /// Applies one planned action (idempotent) and returns its CDI edits.
    fn apply(&self, ctx: &ClaimContext<'_>, action: &serde_json::Value) -> Result<ModeEdits, ModeError>;
    /// Reverts one recorded action (idempotent; fine when it was never applied).
    fn revert(&self, action: &serde_json::Value) -> Result<(), ModeError>;
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use vgpu_core::cdi::Mount;

    #[test]
    fn merging_appends_in_order() {
        let mut a = ModeEdits::default();
        a.common.env.push("A=1".into());
        let mut b = ModeEdits::default();
        b.common.env.push("B=2".into());
        b.devices.entry("d".into()).or_default().mounts.push(Mount::bind(
            "/x",
            std::path::Path::new("/y"),
            true,
        ));
        a.merge(b.clone());
        a.merge(b);
        assert_eq!(a.common.env, ["A=1", "B=2", "B=2"]);
        assert_eq!(a.devices["d"].mounts.len(), 2);
    }

    #[test]
    fn records_round_trip_and_bad_ones_are_named() {
        #[derive(Debug, PartialEq, Serialize, Deserialize)]
        struct Bind {
            bus: String,
        }
        let v = encode("vfio", &Bind { bus: "0000:01:00.0".into() }).unwrap();
        assert_eq!(decode::<Bind>("vfio", &v).unwrap(), Bind { bus: "0000:01:00.0".into() });
        let err = decode::<Bind>("vfio", &serde_json::json!({ "bus": 3 })).unwrap_err();
        assert!(err.to_string().starts_with("vfio: recorded action {\"bus\":3} cannot be read"), "{err}");
    }
}
