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
//! | `ContextualLogging` (Beta, on) | each claim's Prepare / Unprepare runs in a `prepare` / `unprepare` span naming the claim (UID, namespace, name), so every line logged on its way carries it; off: no span, lines carry only their own fields (klog's global-logger fallback) | [`crate::config::DriverConfig::claim_span`] |
//! | `LoggingBetaOptions` (Beta, on) | permits the beta logging options: `--logging-format=json`; off, the binary refuses that format before logging starts (exit 2) | [`check_logging`] |
//! | `LoggingAlphaOptions` (Alpha, off) | permits the alpha logging options (upstream's `--log-{text,json}-split-stream`, `--log-{text,json}-info-buffer-size`); this build has none of them, so on or off it permits and refuses nothing | [`check_logging`] |
//!
//! The three logging gates are Kubernetes' own (component-base `logs/api/v1`), which upstream's DRA registry
//! adds next to the driver's gates; like upstream's, they take part in no dependency or exclusion rule.
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

/// Gates `LoggingBetaOptions` and `LoggingAlphaOptions`: whether the logging options a start-up uses are
/// permitted, as component-base's `logsapi.Validate` checks them before logging is set up.
///
/// `format` is the `--logging-format` value: `text` is stable (always permitted), `json` is beta (needs
/// `LoggingBetaOptions`); any other name is left to the flag's own parser. `alpha_options` names the
/// alpha-quality logging options that were given (each needs `LoggingAlphaOptions`); this build has none, so
/// its callers pass `&[]`. The error names the option and the gate, in upstream's words.
///
/// ```
/// use vgpu_dra::{feature_gates, gates::check_logging};
///
/// let defaults = feature_gates().defaults();
/// assert!(check_logging(&defaults, "json", &[]).is_ok(), "LoggingBetaOptions is on by default");
/// let off = feature_gates().configure(["LoggingBetaOptions=false"]).expect("valid");
/// assert_eq!(
///     check_logging(&off, "json", &[]).unwrap_err(),
///     "invalid --logging-format json: Log format json is disabled, see LoggingBetaOptions feature"
/// );
/// assert!(check_logging(&off, "text", &[]).is_ok());
/// assert!(check_logging(&defaults, "text", &["--log-json-split-stream"]).is_err(), "LoggingAlphaOptions is off");
/// ```
pub fn check_logging(
    gates: &FeatureGates<'_, DraGate>,
    format: &str,
    alpha_options: &[&str],
) -> Result<(), String> {
    if format == "json" && !gates.enabled(DraGate::LoggingBetaOptions) {
        return Err(format!(
            "invalid --logging-format {format}: Log format {format} is disabled, see {} feature",
            DraGate::LoggingBetaOptions
        ));
    }
    if let Some(option) = alpha_options.first().filter(|_| !gates.enabled(DraGate::LoggingAlphaOptions)) {
        return Err(format!("{option}: Feature {} is disabled", DraGate::LoggingAlphaOptions));
    }
    Ok(())
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
            "ContextualLogging=false,LoggingAlphaOptions=true,LoggingBetaOptions=false",
        ] {
            let gates = registry.configure([combination]).unwrap();
            assert!(unbuilt_gates(&gates).is_empty(), "{combination}");
            assert!(check_gates(&gates).is_ok(), "{combination}");
        }
    }

    #[test]
    fn logging_gates_permit_the_options_they_guard() {
        let registry = crate::feature_gates();
        let defaults = registry.defaults();
        assert!(
            defaults.enabled(DraGate::ContextualLogging) && defaults.enabled(DraGate::LoggingBetaOptions)
        );
        assert!(!defaults.enabled(DraGate::LoggingAlphaOptions));
        for format in ["text", "json"] {
            assert!(check_logging(&defaults, format, &[]).is_ok(), "{format}");
        }
        let beta_off = registry.configure(["LoggingBetaOptions=false"]).unwrap();
        assert!(check_logging(&beta_off, "text", &[]).is_ok());
        assert_eq!(
            check_logging(&beta_off, "json", &[]).unwrap_err(),
            "invalid --logging-format json: Log format json is disabled, see LoggingBetaOptions feature"
        );
        assert_eq!(
            check_logging(&defaults, "text", &["--log-text-split-stream"]).unwrap_err(),
            "--log-text-split-stream: Feature LoggingAlphaOptions is disabled"
        );
        let alpha_on = registry.configure(["LoggingAlphaOptions=true"]).unwrap();
        assert!(check_logging(&alpha_on, "json", &["--log-json-split-stream"]).is_ok());
    }
}
