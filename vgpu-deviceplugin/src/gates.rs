//! Which device-plugin gates this build can honour, checked before anything starts.
//!
//! A gate whose behaviour is not built must never be accepted and ignored (or, worse, half applied): the
//! plugin refuses to start and says why. Today that is one gate:
//!
//! | gate | why it is refused |
//! |---|---|
//! | `SharedSMUtilizationWatcher` | `Allocate` would tell every container (`EXTERNAL_SM_WATCHER_ENABLED=true`, `sm_watcher=1` in `vgpu.config`, the `watcher/` mount) that a node-wide SM sampler publishes `watcher/sm_util.config`, but the sampler (contract §5.5, §7.3) is not built yet, so the in-container limiter would wait on samples that never come |
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
    let mut out = Vec::new();
    if gates.enabled(CoreGate::SharedSMUtilizationWatcher) {
        out.push(UnbuiltGate {
            gate: CoreGate::SharedSMUtilizationWatcher,
            reason: "the node-wide SM utilization sampler that writes watcher/sm_util.config is not built \
                     yet; containers would be told to wait for samples that never come. Turn the gate off \
                     (SharedSMUtilizationWatcher=false): each container then samples its own SM utilization",
        });
    }
    out
}

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
    fn the_sm_watcher_gate_is_refused_with_its_reason() {
        let registry = crate::feature_gates();
        assert!(check_gates(&registry.defaults()).is_ok());
        let on = registry
            .configure([
                "SharedSMUtilizationWatcher=true",
                "VirtualMemoryTracking=true",
                "DevicePluginClientMode=true",
            ])
            .unwrap();
        let unbuilt = unbuilt_gates(&on);
        assert_eq!(unbuilt.len(), 1);
        assert_eq!(unbuilt[0].gate, CoreGate::SharedSMUtilizationWatcher);
        let err = check_gates(&on).unwrap_err().to_string();
        assert!(err.contains("SharedSMUtilizationWatcher=true is not supported"), "{err}");
        assert!(err.contains("sm_util.config"), "{err}");
        // Every other device-plugin gate is honoured.
        let all_but_sm = registry
            .configure([
                "GPUCoreResourcePlugin=true",
                "GPUMemoryResourcePlugin=true",
                "AllocationFailureReschedule=true",
                "TopologyAwareGPUAllocation=true",
                "VirtualMemoryTracking=true",
                "DevicePluginClientMode=true",
                "HonorPreAllocatedDeviceIDs=true",
            ])
            .unwrap();
        assert!(check_gates(&all_but_sm).is_ok());
    }
}
