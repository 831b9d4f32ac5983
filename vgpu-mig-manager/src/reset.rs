//! The GPU reset that applies a pending MIG mode ([`apply_with_reset`]) and the node reboot the manager asks
//! for when no reset is possible ([`rebooted_since`], [`request_value`]).
//!
//! On GPUs whose MIG mode change needs a reset (NVML leaves it *pending*; the backends answer
//! [`vgpu_core::backend::mig::MigError::ResetRequired`]), the manager resets the GPU through
//! [`DeviceBackend::reset_gpu`] and goes on with the layout. When the reset is refused (processes hold the
//! GPU, the backend cannot reset, resets are disabled with `--gpu-reset=false`) it requests a reboot:
//!
//! | key | kind | value |
//! |---|---|---|
//! | `nvidia.com/mig.config.state` | label | `reboot-required` |
//! | `nvidia.com/mig.config.reboot-required` | annotation | the node's `status.nodeInfo.bootID` when the reboot was requested (`unknown` when the node reports none) |
//! | `MIGRebootRequired` | Node condition | `True`, reason `MIGModePending`, the message says which GPU and why no reset |
//!
//! A reboot operator (kured with a sentinel command such as
//! `kubectl get node $NODE -o jsonpath='{.status.conditions[?(@.type=="MIGRebootRequired")].status}' | grep -q True`,
//! or any operator selecting nodes by the label) drains and reboots the node. The node stays cordoned and
//! tainted meanwhile. After the reboot (a different boot ID) the manager applies the layout, returns the
//! node, removes the annotation and sets the condition `False` (reason `MIGConfigApplied`). If the mode is
//! still pending after the reboot, the state becomes `failed` (condition `False`, reason
//! `MIGModeStillPending`) and no second reboot is requested while the annotation stays: remove it to allow
//! one.

use std::collections::BTreeSet;

use vgpu_core::backend::DeviceBackend;

use crate::plan::{ApplyError, GpuPlan, apply_leaving_pending};

/// The annotation value when the node reports no boot ID.
pub const UNKNOWN_BOOT_ID: &str = "unknown";

/// Why [`apply_with_reset`] did not finish.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ApplyFailure {
    /// A backend step failed (not a pending mode): state `failed`.
    #[error(transparent)]
    Apply(#[from] ApplyError),
    /// A GPU's MIG mode is pending and the GPU cannot be reset: the node must reboot.
    #[error("{reason}")]
    RebootRequired {
        /// The GPU.
        index: u32,
        /// What is pending and why no reset applies it.
        reason: String,
    },
}

/// Applies `plans` ([`apply_leaving_pending`]); the GPUs left with a pending mode are reset (when
/// `reset_allowed`) and the apply goes on. Each GPU is reset at most once. Returns the GPUs that were reset.
/// When a reset is impossible every changing GPU has had its mode set (pending), so one reboot applies
/// them all.
pub fn apply_with_reset(
    backend: &dyn DeviceBackend,
    plans: &[GpuPlan],
    reset_allowed: bool,
) -> Result<BTreeSet<u32>, ApplyFailure> {
    let mut reset = BTreeSet::new();
    loop {
        let pending = apply_leaving_pending(backend, plans)?;
        if pending.is_empty() {
            return Ok(reset);
        }
        for (index, enabled) in pending {
            let mode = if enabled { "enabled" } else { "disabled" };
            let reboot = |why: String| ApplyFailure::RebootRequired {
                index,
                reason: format!("GPU {index}: MIG mode {mode} is pending and {why}"),
            };
            if !reset_allowed {
                return Err(reboot("GPU resets are disabled (--gpu-reset=false)".to_owned()));
            }
            if !reset.insert(index) {
                return Err(reboot("a GPU reset did not apply it".to_owned()));
            }
            tracing::info!(gpu = index, mode, "resetting the GPU to apply the pending MIG mode");
            if let Err(err) = backend.reset_gpu(index) {
                return Err(reboot(format!("the GPU cannot be reset: {err}")));
            }
        }
    }
}

/// The reboot annotation's value for a node with boot ID `boot_id`.
pub fn request_value(boot_id: &str) -> String {
    let id = boot_id.trim();
    if id.is_empty() { UNKNOWN_BOOT_ID.to_owned() } else { id.to_owned() }
}

/// Whether the node rebooted since a request recorded `requested`: it reports a boot ID, and another.
pub fn rebooted_since(requested: &str, boot_id: &str) -> bool {
    let (requested, now) = (requested.trim(), boot_id.trim());
    requested != UNKNOWN_BOOT_ID && !now.is_empty() && requested != now
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::collections::BTreeMap;

    use vgpu_core::backend::{MigMode, mock::MockBackend};

    use super::*;
    use crate::{config::GpuTarget, plan::plan};

    fn backend(reset: &str, processes: &str) -> MockBackend {
        MockBackend::from_yaml_str(&format!(
            "gpus:\n  - {{ uuid: GPU-0, name: NVIDIA A100-SXM4-80GB, memoryMiB: 81920, mig: {{ mode: Disabled, modeChange: Pending, reset: {reset} }}{processes} }}\n  - {{ uuid: GPU-1, name: NVIDIA A100-SXM4-80GB, memoryMiB: 81920, mig: {{ mode: Disabled }} }}\n"
        ))
        .unwrap()
    }

    fn plans(backend: &MockBackend) -> Vec<GpuPlan> {
        let target = GpuTarget {
            mig_enabled: true,
            mig_devices: [("3g.40gb".parse().unwrap(), 2)].into_iter().collect(),
        };
        let targets: BTreeMap<u32, GpuTarget> = [(0, target.clone()), (1, target)].into_iter().collect();
        plan(backend, &targets).unwrap()
    }

    #[test]
    fn a_reset_applies_the_pending_mode_and_the_layout_goes_on() {
        let backend = backend("Succeeds", "");
        let plans = plans(&backend);
        assert_eq!(apply_with_reset(&backend, &plans, true).unwrap(), BTreeSet::from([0]));
        for gpu in 0..2 {
            let layout = backend.mig_layout(gpu).unwrap();
            assert_eq!((layout.mode, layout.instances.len()), (MigMode::Enabled, 2), "GPU {gpu}");
        }
        assert!(plan(&backend, &BTreeMap::new()).unwrap().is_empty());
    }

    #[test]
    fn impossible_resets_ask_for_a_reboot_naming_why() {
        let cases = [
            (
                "InUse",
                "",
                true,
                "GPU 0: MIG mode enabled is pending and the GPU cannot be reset: GPU 0 cannot be reset: the GPU is in use (mock description: reset: InUse)",
            ),
            (
                "Succeeds",
                ", processes: [ { pid: 9 } ]",
                true,
                "GPU 0: MIG mode enabled is pending and the GPU cannot be reset: GPU 0 cannot be reset: in use by 1 process(es)",
            ),
            (
                "NotSupported",
                "",
                true,
                "GPU 0: MIG mode enabled is pending and the GPU cannot be reset: resetting the GPU is not supported by the mock backend",
            ),
            (
                "Succeeds",
                "",
                false,
                "GPU 0: MIG mode enabled is pending and GPU resets are disabled (--gpu-reset=false)",
            ),
        ];
        for (reset, processes, allowed, reason) in cases {
            let backend = backend(reset, processes);
            match apply_with_reset(&backend, &plans(&backend), allowed) {
                Err(ApplyFailure::RebootRequired { index: 0, reason: r }) => assert_eq!(r, reason),
                other => panic!("{reset}: {other:?}"),
            }
            assert_eq!(backend.pending_mig_mode(0).unwrap(), Some(MigMode::Enabled));
            // After the reboot the same plans finish without a reset.
            backend.reboot().unwrap();
            assert!(apply_with_reset(&backend, &plans(&backend), allowed).unwrap().is_empty());
            assert_eq!(backend.mig_layout(0).unwrap().instances.len(), 2);
        }
    }

    #[test]
    fn boot_ids_tell_a_reboot() {
        assert_eq!(request_value(" "), "unknown");
        assert_eq!(request_value("b-1"), "b-1");
        assert!(rebooted_since("b-1", "b-2"));
        assert!(!rebooted_since("b-1", "b-1"));
        assert!(!rebooted_since("b-1", ""), "no boot ID now: not known to have rebooted");
        assert!(!rebooted_since("unknown", "b-2"), "no boot ID then: cannot tell");
    }

    proptest::proptest! {
        /// A recorded request never counts as a reboot on the same boot, and a request made now never does.
        #[test]
        fn the_current_boot_never_counts_as_a_reboot(id in "\\PC{0,40}") {
            proptest::prop_assert!(!rebooted_since(&request_value(&id), &id));
        }
    }
}
