//! Which kubelet-plugin gates this build can honour, checked before anything starts.
//!
//! A gate whose behaviour is not built must never be accepted and ignored: the plugin refuses to start and
//! names the gate. Today every kubelet-plugin gate is built except one whose default is on, so
//! [`UNBUILT`] is empty and [`INERT_DEFAULTS`] holds that one:
//!
//! | gate | why it is refused |
//! |---|---|
//! | (none) | the last seven were refused until issue #18 built them (see below) |
//!
//! | gate | default (Beta, on) | explicit `=true` | explicit `=false` |
//! |---|---|---|---|
//! | `IMEXDaemonsWithDNSNames` | accepted as inert: one info line at start-up says so ([`inert_defaults`]) | refused: the plugin exits 2, `feature gate IMEXDaemonsWithDNSNames=true is not supported: …` ([`check_gates`]) | accepted (nothing to turn off) |
//!
//! The gate chooses how IMEX daemons of a ComputeDomain address each other (DNS names with a hosts file, or
//! raw IPs). This build has no IMEX daemons and no ComputeDomain (CRD, controller, daemon DaemonSet): only
//! the groundwork in [`crate::imex`]. So an operator who asks for the gate explicitly is told so instead of
//! getting nothing, while the spec's default (on) — which every unconfigured deployment carries — does not
//! stop the plugin.
//!
//! How each gate is honoured:
//!
//! | gate | what it does | where |
//! |---|---|---|
//! | `VGPUSupport` | vGPU vs whole-GPU devices and their CDI edits | [`crate::devices`], [`crate::state`] |
//! | `NVMLDeviceHealthCheck` | device taints and the resource-health stream | [`crate::health`] |
//! | `SharedSMUtilizationWatcher` | the device plugin's node-wide SM watcher ([`vgpu_node::sm_watcher::SmWatcher`]) runs on the manager directory; vGPU claims get `EXTERNAL_SM_WATCHER_ENABLED=TRUE` and the read-only `watcher/` mount | [`crate::driver`] |
//! | `DevicePluginClientMode` | the device plugin's registry server ([`vgpu_node::registry`]) resolves the partitions' register UUIDs | [`crate::client_mode`] |
//! | `DRAListTypeAttributes`, `ConsumableShares` | how devices are published | [`crate::slices`], [`crate::devices`] |
//! | `TimeSlicingSettings` | opaque `GpuConfig`/`MigDeviceConfig` sharing `TimeSlicing`: the GPU's time slice set on Prepare, `Default` again when its last claim goes (configs decoded by [`crate::opaque`]) | [`crate::sharing`] |
//! | `MPSSupport` | one MPS control daemon per claim, pipe/shm directories, EXCLUSIVE_PROCESS | [`crate::mps`] |
//! | `DynamicMIG` | MIG devices with shared counters; instances created on Prepare, destroyed on Unprepare | [`crate::mig`] |
//! | `PassthroughSupport` | `gpu-vfio-<index>` devices; Prepare binds the GPU to `vfio-pci`, Unprepare rebinds its driver | [`crate::vfio`] |
//! | `DeviceMetadata` | KEP-5304 device metadata files mounted into the workload | [`crate::metadata`] |
//! | `FabricManagerPartitioning` | `gpuModuleID`/`partition<N>` attributes; the claim's Fabric Manager partition activated on Prepare | [`crate::fabric`] |
//! | `NRISupport` | the in-process NRI plugin injects per-container partitions at CreateContainer (with `DevicePluginClientMode` too, each container partition gets its register UUID from the hook: [`crate::nri::NriRegisterResolver`]) | [`crate::nri`] |
//! | `IMEXDaemonsWithDNSNames` | inert by default, refused when set `=true` (table above): the IMEX nodes-config formats exist, but no IMEX daemon or ComputeDomain is built to use them | [`crate::imex`] |
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
//!
//! // IMEXDaemonsWithDNSNames: the default passes (inert, logged), explicit true is refused, false passes.
//! let defaults = feature_gates().defaults();
//! assert_eq!(vgpu_dra::gates::inert_defaults(&defaults).len(), 1);
//! let on = feature_gates().configure(["IMEXDaemonsWithDNSNames=true"]).expect("valid");
//! assert!(check_gates(&on).unwrap_err().starts_with("feature gate IMEXDaemonsWithDNSNames=true is not supported"));
//! let off = feature_gates().configure(["IMEXDaemonsWithDNSNames=false"]).expect("valid");
//! assert!(check_gates(&off).is_ok() && vgpu_dra::gates::inert_defaults(&off).is_empty());
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

/// Gates on by default whose behaviour is not built: the default is accepted as inert (and logged), an
/// explicit `=true` is refused like an [`UNBUILT`] gate, an explicit `=false` is accepted.
pub const INERT_DEFAULTS: &[(DraGate, &str)] = &[(
    DraGate::IMEXDaemonsWithDNSNames,
    "it chooses how IMEX daemons of a ComputeDomain address each other, and this build has no IMEX daemons \
     and no ComputeDomain (CRD, controller, daemons), so there is nothing for it to configure",
)];

/// Every gate that is on but not built (empty when all enabled gates are honoured): an [`UNBUILT`] gate that
/// is on, or an [`INERT_DEFAULTS`] gate set `=true` explicitly.
pub fn unbuilt_gates(gates: &FeatureGates<'_, DraGate>) -> Vec<UnbuiltGate> {
    let unbuilt = UNBUILT.iter().filter(|(g, _)| gates.enabled(*g));
    let explicit = INERT_DEFAULTS.iter().filter(|(g, _)| gates.enabled(*g) && gates.is_explicit(*g));
    unbuilt.chain(explicit).map(|&(gate, reason)| UnbuiltGate { gate, reason }).collect()
}

/// The [`INERT_DEFAULTS`] gates that are on by default only (not set explicitly): accepted, and the plugin
/// logs each at start-up as doing nothing.
pub fn inert_defaults(gates: &FeatureGates<'_, DraGate>) -> Vec<UnbuiltGate> {
    INERT_DEFAULTS
        .iter()
        .filter(|(g, _)| gates.enabled(*g) && !gates.is_explicit(*g))
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
            format!(
                "feature gate {}=true is not supported: {} (remove it or set {}=false)",
                u.gate, u.reason, u.gate
            )
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
    fn imex_dns_names_default_is_inert_explicit_true_is_refused() {
        let registry = crate::feature_gates();
        let defaults = registry.defaults();
        assert!(defaults.enabled(DraGate::IMEXDaemonsWithDNSNames), "the spec's default is on");
        assert!(check_gates(&defaults).is_ok());
        let inert = inert_defaults(&defaults);
        assert_eq!(inert.iter().map(|u| u.gate).collect::<Vec<_>>(), [DraGate::IMEXDaemonsWithDNSNames]);
        let on = registry.configure(["IMEXDaemonsWithDNSNames=true"]).unwrap();
        let err = check_gates(&on).unwrap_err();
        assert!(err.starts_with("feature gate IMEXDaemonsWithDNSNames=true is not supported: "), "{err}");
        assert!(err.contains("no IMEX daemons and no ComputeDomain"), "{err}");
        assert!(err.ends_with("(remove it or set IMEXDaemonsWithDNSNames=false)"), "{err}");
        assert!(inert_defaults(&on).is_empty());
        // Later entries win, as component-base's Set: the last value decides.
        let off_again =
            registry.configure(["IMEXDaemonsWithDNSNames=true", "IMEXDaemonsWithDNSNames=false"]).unwrap();
        assert!(check_gates(&off_again).is_ok());
        let off = registry.configure(["IMEXDaemonsWithDNSNames=false"]).unwrap();
        assert!(check_gates(&off).is_ok() && inert_defaults(&off).is_empty());
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
