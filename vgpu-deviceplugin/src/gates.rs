//! Which device-plugin gates this build can honour, checked before anything starts.
//!
//! A gate whose behaviour is not built must never be accepted and ignored (or, worse, half applied): the
//! plugin refuses to start and says why. Today every device-plugin gate is built, so the table is empty:
//!
//! | gate | why it is refused |
//! |---|---|
//! | (none) | `SharedSMUtilizationWatcher` was refused until its sampler existed; it is now [`crate::sm_watcher`], started by [`Daemon::run`](crate::daemon::Daemon::run) |
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

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
