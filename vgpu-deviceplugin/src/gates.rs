//! Which device-plugin gates this build can honour, checked before anything starts.
//!
//! A gate whose behaviour is not built must never be accepted and ignored (or, worse, half applied): the
//! plugin refuses to start and says why. Today every device-plugin gate is built, so the table is empty:
//!
//! | gate | why it is refused |
//! |---|---|
//! | (none) | `SharedSMUtilizationWatcher` was refused until its sampler existed; it is now [`vgpu_node::sm_watcher`], started by [`Daemon::run`](crate::daemon::Daemon::run) |
//!
//! [`Daemon::new`](crate::daemon::Daemon::new) runs [`check_gates`]; callers that wire
//! [`build_handlers`](crate::build_handlers) themselves should call it too.

use vgpu_gates::{CoreGate, FeatureGates};

use crate::error::ServerError;

/// A gate that is on but whose behaviour this build does not provide.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnbuiltGate {
    /// The gate.
    pub gate: CoreGate,
    /// Why it cannot be honoured, and what to do instead.
    pub reason: &'static str,
}

/// Every gate that is on but not built, with the reason (empty when all enabled gates are honoured).
pub fn unbuilt_gates(gates: &FeatureGates<'_, CoreGate>) -> Vec<UnbuiltGate> {
    UNBUILT.iter().filter(|u| gates.enabled(u.gate)).copied().collect()
}

/// The gates this build cannot honour, with the reason shown when one is on. Empty: every device-plugin
/// gate is built.
pub const UNBUILT: &[UnbuiltGate] = &[];

/// [`unbuilt_gates`] as an error naming every such gate: `Err(ServerError::Config)` when any is on.
pub fn check_gates(gates: &FeatureGates<'_, CoreGate>) -> Result<(), ServerError> {
    let unbuilt = unbuilt_gates(gates);
    if unbuilt.is_empty() {
        return Ok(());
    }
    let text: Vec<String> = unbuilt
        .iter()
        .map(|u| format!("feature gate {}=true is not supported: {}", u.gate, u.reason))
        .collect();
    Err(ServerError::Config(text.join("; ")))
}

/// With [`PluginConfig::whole_gpus`](crate::config::PluginConfig::whole_gpus) no `vgpu-number` plugin runs, and
/// every device-plugin gate acts on it (its allocation, its limits, its extra resources, its client-mode
/// registry, its SM watcher): an enabled one would be accepted and ignored, so it is refused, naming each.
pub fn check_whole_gpus(gates: &FeatureGates<'_, CoreGate>) -> Result<(), ServerError> {
    let on: Vec<String> =
        gates.registry().gates().iter().filter(|g| gates.enabled(**g)).map(ToString::to_string).collect();
    if on.is_empty() {
        return Ok(());
    }
    Err(ServerError::Config(format!(
        "feature gates {} act on the vgpu-number plugin, which --whole-gpus does not serve: turn them off or drop \
         --whole-gpus",
        on.join(", ")
    )))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn whole_gpus_refuse_every_enabled_gate() {
        let registry = crate::feature_gates();
        assert!(check_whole_gpus(&registry.defaults()).is_ok());
        let two =
            registry.configure(["HonorPreAllocatedDeviceIDs=true", "GPUCoreResourcePlugin=true"]).unwrap();
        let err = check_whole_gpus(&two).unwrap_err().to_string();
        assert!(
            err.contains("GPUCoreResourcePlugin, HonorPreAllocatedDeviceIDs") && err.contains("--whole-gpus"),
            "{err}"
        );
    }

    #[test]
    fn every_device_plugin_gate_is_honoured() {
        let registry = crate::feature_gates();
        assert!(check_gates(&registry.defaults()).is_ok());
        let all = registry
            .configure([
                "SharedSMUtilizationWatcher=true",
                "GPUCoreResourcePlugin=true",
                "GPUMemoryResourcePlugin=true",
                "AllocationFailureReschedule=true",
                "TopologyAwareGPUAllocation=true",
                "VirtualMemoryTracking=true",
                "DevicePluginClientMode=true",
                "HonorPreAllocatedDeviceIDs=true",
            ])
            .unwrap();
        assert!(unbuilt_gates(&all).is_empty());
        assert!(check_gates(&all).is_ok());
    }
}
