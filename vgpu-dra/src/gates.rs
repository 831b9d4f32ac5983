//! Which kubelet-plugin gates this build can honour, checked before anything starts.
//!
//! A gate whose behaviour is not built must never be accepted and ignored: the plugin refuses to start and
//! names the gate. Today every kubelet-plugin gate is built, so the table is empty:
//!
//! | gate | why it is refused |
//! |---|---|
//! | (none) | the last seven were refused until issue #18 built them (see below) |
//!
//! How each gate is honoured:
//!
//! | gate | what it does | where |
//! |---|---|---|
//! | `VGPUSupport` | vGPU vs whole-GPU devices and their CDI edits | [`crate::devices`], [`crate::state`] |
//! | `NVMLDeviceHealthCheck` | device taints and the resource-health stream | [`crate::health`] |
//! | `SharedSMUtilizationWatcher` | the device plugin's node-wide SM watcher ([`vgpu_deviceplugin::sm_watcher::SmWatcher`]) runs on the manager directory; vGPU claims get `EXTERNAL_SM_WATCHER_ENABLED=TRUE` and the read-only `watcher/` mount | [`crate::driver`] |
//! | `DevicePluginClientMode` | the device plugin's registry server ([`vgpu_deviceplugin::registry`]) resolves the partitions' register UUIDs | [`crate::client_mode`] |
//! | `DRAListTypeAttributes`, `ConsumableShares` | how devices are published | [`crate::slices`], [`crate::devices`] |
//! | `TimeSlicingSettings` | opaque `GpuConfig`/`MigDeviceConfig` sharing `TimeSlicing`: the GPU's time slice set on Prepare, `Default` again when its last claim goes (configs decoded by [`crate::opaque`]) | [`crate::sharing`] |
//! | `MPSSupport` | one MPS control daemon per claim, pipe/shm directories, EXCLUSIVE_PROCESS | [`crate::mps`] |
//! | `DynamicMIG` | MIG devices with shared counters; instances created on Prepare, destroyed on Unprepare | [`crate::mig`] |
//! | `PassthroughSupport` | `gpu-vfio-<index>` devices; Prepare binds the GPU to `vfio-pci`, Unprepare rebinds its driver | [`crate::vfio`] |
//! | `DeviceMetadata` | KEP-5304 device metadata files mounted into the workload | [`crate::metadata`] |
//! | `FabricManagerPartitioning` | `gpuModuleID`/`partition<N>` attributes; the claim's Fabric Manager partition activated on Prepare | [`crate::fabric`] |
//! | `NRISupport` | the in-process NRI plugin injects per-container partitions at CreateContainer (with `DevicePluginClientMode` too, the binary refuses to start: per-container partitions have no register UUID for the registry) | [`crate::nri`] |
//! | `IMEXDaemonsWithDNSNames` | the IMEX nodes-config format, DNS names with a hosts file or raw IPs; no compute domains are published yet, so nothing writes that file today | [`crate::imex`] |
//!
//! ```
//! use vgpu_dra::{feature_gates, gates::check_gates};
//!
//! assert!(check_gates(&feature_gates().defaults()).is_ok());
//! let mig = feature_gates().configure(["DynamicMIG=true,NVMLDeviceHealthCheck=false"]).expect("valid combination");
//! assert!(check_gates(&mig).is_ok(), "DynamicMIG is built");
//! assert!(vgpu_dra::gates::UNBUILT.is_empty(), "every kubelet-plugin gate is built");
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

/// The refused gates and their reasons (the table above). Empty: every kubelet-plugin gate is built.
pub const UNBUILT: &[(DraGate, &str)] = &[];

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
    fn every_kubelet_plugin_gate_is_honoured() {
        let registry = crate::feature_gates();
        assert!(check_gates(&registry.defaults()).is_ok());
        // Every gate on in some valid combination (the spec's Requires / mutually-exclusive rules).
        for combination in [
            "VGPUSupport=true,NVMLDeviceHealthCheck=true,DRAListTypeAttributes=true,IMEXDaemonsWithDNSNames=false,SharedSMUtilizationWatcher=true,DevicePluginClientMode=true,NRISupport=true,TimeSlicingSettings=true,FabricManagerPartitioning=true",
            "DynamicMIG=true,NVMLDeviceHealthCheck=false,TimeSlicingSettings=true",
            "MPSSupport=true,VGPUSupport=false,ConsumableShares=true",
            "PassthroughSupport=true,DeviceMetadata=true,VGPUSupport=false,NVMLDeviceHealthCheck=false,FabricManagerPartitioning=true",
        ] {
            let gates = registry.configure([combination]).unwrap();
            assert!(unbuilt_gates(&gates).is_empty(), "{combination}");
            assert!(check_gates(&gates).is_ok(), "{combination}");
        }
    }
}
