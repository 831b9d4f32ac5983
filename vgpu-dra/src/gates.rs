//! Which kubelet-plugin gates this build can honour, checked before anything starts.
//!
//! A gate whose behaviour is not built must never be accepted and ignored: the plugin refuses to start and
//! names the gate. Turning any of these off (they are all off by default) starts the plugin.
//!
//! | gate | why it is refused |
//! |---|---|
//! | `TimeSlicingSettings` | per-claim time-slicing configuration (opaque `GpuConfig.sharing`) is not built |
//! | `MPSSupport` | the MPS control daemon per claim is not built |
//! | `PassthroughSupport` | binding GPUs to `vfio-pci` and the `vfio` devices are not built |
//! | `DeviceMetadata` | the device metadata files (KEP-5304) are not written |
//! | `NRISupport` | the NRI `CreateContainer` hook is not built: partitions are mounted through CDI |
//! | `FabricManagerPartitioning` | Fabric Manager partition activation is not built |
//!
//! Honoured: `DynamicMIG` (MIG devices with shared counters, instances created on Prepare and destroyed on
//! Unprepare: [`crate::mig`]), `VGPUSupport` (vGPU vs whole-GPU devices and their CDI edits),
//! `NVMLDeviceHealthCheck` (device taints and the health service), `SharedSMUtilizationWatcher` (the device plugin's node-wide SM watcher,
//! [`vgpu_deviceplugin::sm_watcher::SmWatcher`], runs on the manager directory and vGPU claims get
//! `EXTERNAL_SM_WATCHER_ENABLED=TRUE` and the read-only `watcher/` mount), `DevicePluginClientMode` (the
//! device plugin's registry server, [`vgpu_deviceplugin::registry`], serves the partitions' register UUIDs:
//! [`crate::client_mode`]), `DRAListTypeAttributes` and `ConsumableShares` (how devices are
//! published), and `IMEXDaemonsWithDNSNames`. The last one says how IMEX daemons of a compute domain address
//! each other (DNS names rather than raw IPs); this driver starts no IMEX daemons and publishes no compute
//! domains, so there is no address to write either way: both values are honoured trivially, and the gate
//! keeps its default (`true`) without a warning.
//!
//! ```
//! use vgpu_dra::{feature_gates, gates::check_gates};
//!
//! assert!(check_gates(&feature_gates().defaults()).is_ok());
//! let mig = feature_gates().configure(["DynamicMIG=true,NVMLDeviceHealthCheck=false"]).expect("valid combination");
//! assert!(check_gates(&mig).is_ok(), "DynamicMIG is built");
//! ```

use vgpu_gates::{DraGate, FeatureGates};

/// A gate that is on but whose behaviour this build does not provide.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnbuiltGate {
    /// The gate.
    pub gate: DraGate,
    /// Why it cannot be honoured.
    pub reason: &'static str,
}

/// The refused gates and their reasons (the table above).
pub const UNBUILT: [(DraGate, &str); 6] = [
    (DraGate::TimeSlicingSettings, "per-claim time-slicing settings are not built yet"),
    (DraGate::MPSSupport, "the per-claim MPS control daemon is not built yet"),
    (DraGate::PassthroughSupport, "binding GPUs to vfio-pci (vfio devices) is not built yet"),
    (DraGate::DeviceMetadata, "device metadata files (KEP-5304) are not written yet"),
    (
        DraGate::NRISupport,
        "the NRI CreateContainer hook is not built yet; partitions are mounted through CDI",
    ),
    (DraGate::FabricManagerPartitioning, "Fabric Manager partition activation is not built yet"),
];

/// Every gate that is on but not built (empty when all enabled gates are honoured).
pub fn unbuilt_gates(gates: &FeatureGates<'_, DraGate>) -> Vec<UnbuiltGate> {
    UNBUILT
        .iter()
        .filter(|(g, _)| gates.enabled(*g))
        .map(|&(gate, reason)| UnbuiltGate { gate, reason })
        .collect()
}

/// [`unbuilt_gates`] as one message naming every such gate (`feature gate X=true is not supported: …; …`).
pub fn check_gates(gates: &FeatureGates<'_, DraGate>) -> Result<(), String> {
    let unbuilt = unbuilt_gates(gates);
    if unbuilt.is_empty() {
        return Ok(());
    }
    Err(unbuilt
        .iter()
        .map(|u| {
            format!("feature gate {}=true is not supported: {} (set {}=false)", u.gate, u.reason, u.gate)
        })
        .collect::<Vec<_>>()
        .join("; "))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn every_unbuilt_gate_is_named_and_the_rest_pass() {
        let registry = crate::feature_gates();
        let all_but_health = registry
            .configure([
                "TimeSlicingSettings=true,DynamicMIG=true,NVMLDeviceHealthCheck=false,DeviceMetadata=false",
            ])
            .unwrap();
        let names: Vec<_> = unbuilt_gates(&all_but_health).iter().map(|u| u.gate).collect();
        assert_eq!(names, [DraGate::TimeSlicingSettings], "DynamicMIG is built");
        let err = check_gates(&all_but_health).unwrap_err();
        assert!(
            err.contains("TimeSlicingSettings=true is not supported") && !err.contains("DynamicMIG"),
            "{err}"
        );
        for (gate, _) in UNBUILT {
            let mut gates = registry.defaults();
            gates.set_gate(gate, true).unwrap();
            assert_eq!(unbuilt_gates(&gates).len(), 1, "{gate}");
        }
        let honoured = registry
            .configure(["VGPUSupport=true,NVMLDeviceHealthCheck=true,DRAListTypeAttributes=true,IMEXDaemonsWithDNSNames=false,SharedSMUtilizationWatcher=true,DevicePluginClientMode=true"])
            .unwrap();
        assert!(check_gates(&honoured).is_ok());
        let mig = registry.configure(["DynamicMIG=true,NVMLDeviceHealthCheck=false"]).unwrap();
        assert!(check_gates(&mig).is_ok(), "DynamicMIG is built");
    }
}
