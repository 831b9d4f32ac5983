//! The pure step of the passthrough policy: from the GPUClasses each PhysicalGPU matches, the class wish
//! the controller writes as `status.classPassthrough` and its condition `PassthroughPolicy`
//! ([`class_passthrough`]). The NVIDIA adapter reads the wish (`spec.passthrough` first, see
//! [`vgpu_api::PhysicalGPU::passthrough_wish`]) and switches the GPU; the controller never writes `spec`.
//!
//! Matching is the DeviceClass matching of [`crate::desired`] (vendor, model, memory, compute capability,
//! node labels): a class's `DesiredClass::matched` GPUs. Classes without `spec.passthrough` do not take
//! part.
//!
//! | matching classes with `spec.passthrough` | `classPassthrough` | `PassthroughPolicy` (status, reason) |
//! |---|---|---|
//! | none | absent | absent |
//! | all `true` (or all `false`) | `true` (`false`) | `True`, [`REASON_AGREED`] (the classes, and whether `spec.passthrough` overrides them) |
//! | some `true`, some `false` | absent: nothing is switched | `False`, [`REASON_CONFLICT`] (the classes on each side) |
//!
//! A GPU's own `spec.passthrough` does not change what is written (it only changes what the message says):
//! the classes' verdict stays visible, and clearing `spec.passthrough` hands the decision back to them.

use std::collections::BTreeMap;

use kube::ResourceExt;
use vgpu_api::{Condition, ConditionStatus, GPUClass, PhysicalGPU};

use crate::desired::DesiredClass;

/// The PhysicalGPU condition the controller owns for the policy.
pub const CONDITION: &str = "PassthroughPolicy";
/// Reason: every matching class with a wish says the same.
pub const REASON_AGREED: &str = "ClassesAgree";
/// Reason: matching classes disagree; nothing is switched.
pub const REASON_CONFLICT: &str = "ConflictingClasses";

/// The controller's passthrough fields of one PhysicalGPU.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PassthroughPolicy {
    /// `status.classPassthrough`.
    pub wish: Option<bool>,
    /// Condition [`CONDITION`]; `None`: no class has a wish for this GPU (the condition is removed).
    pub condition: Option<Condition>,
}

/// The policy of every GPU some class with `spec.passthrough` matches (module docs), by PhysicalGPU name;
/// GPUs left out have no class wish.
pub fn class_passthrough(
    gpus: &[PhysicalGPU],
    classes: &[GPUClass],
    desired: &[DesiredClass],
) -> BTreeMap<String, PassthroughPolicy> {
    // GPU name -> (classes asking for passthrough, classes asking against), each sorted.
    let mut votes: BTreeMap<&str, (Vec<String>, Vec<String>)> = BTreeMap::new();
    for class in classes {
        let Some(wish) = class.spec.passthrough else { continue };
        let name = class.name_any();
        for d in desired.iter().filter(|d| d.class == name) {
            for gpu in &d.matched {
                let (yes, no) = votes.entry(gpu.as_str()).or_default();
                if wish { yes.push(name.clone()) } else { no.push(name.clone()) }
            }
        }
    }
    let mut out = BTreeMap::new();
    for gpu in gpus {
        let name = gpu.name_any();
        let Some((yes, no)) = votes.get_mut(name.as_str()) else { continue };
        yes.sort();
        no.sort();
        let own = gpu.spec.passthrough;
        let (wish, status, reason, mut message) = match (yes.is_empty(), no.is_empty()) {
            (false, false) => (
                None,
                ConditionStatus::False,
                REASON_CONFLICT,
                format!(
                    "GPUClasses disagree on passthrough: true from {}, false from {}",
                    yes.join(", "),
                    no.join(", ")
                ),
            ),
            (false, true) => (
                Some(true),
                ConditionStatus::True,
                REASON_AGREED,
                format!("passthrough true from GPUClass {}", yes.join(", ")),
            ),
            _ => (
                Some(false),
                ConditionStatus::True,
                REASON_AGREED,
                format!("passthrough false from GPUClass {}", no.join(", ")),
            ),
        };
        match own {
            Some(own) if wish != Some(own) => {
                message.push_str(&format!("; spec.passthrough {own} decides"));
            }
            None if wish.is_none() => {
                message.push_str("; the driver is left as it is until they agree or spec.passthrough is set");
            }
            _ => {}
        }
        let condition = Condition {
            type_: CONDITION.to_owned(),
            status,
            reason: Some(reason.to_owned()),
            message: Some(message),
            last_transition_time: None,
            observed_generation: gpu.metadata.generation,
        };
        out.insert(name, PassthroughPolicy { wish, condition: Some(condition) });
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::config::ControllerConfig;
    use crate::desired::{NodeLabels, desired_classes};
    use crate::fixture;

    fn policy(gpus: &[PhysicalGPU], classes: &[GPUClass]) -> BTreeMap<String, PassthroughPolicy> {
        let desired = desired_classes(&ControllerConfig::default(), classes, gpus, &NodeLabels::new());
        class_passthrough(gpus, classes, &desired)
    }

    fn with(mut class: GPUClass, passthrough: Option<bool>) -> GPUClass {
        class.spec.passthrough = passthrough;
        class
    }

    fn reason(p: &PassthroughPolicy) -> (ConditionStatus, &str) {
        let c = p.condition.as_ref().unwrap();
        (c.status, c.reason.as_deref().unwrap())
    }

    #[test]
    fn a_passthrough_class_asks_for_the_gpus_it_matches_only() {
        let gpus = [
            fixture::gpu("w1", 0, "nvidia", "h100", Some(81920)),
            fixture::gpu("w1", 1, "nvidia", "t4", Some(15360)),
            fixture::gpu("w1", 2, "metax", "c500", Some(65536)),
        ];
        let classes = [
            with(fixture::class("vm", "nvidia", Some("h100"), None), Some(true)),
            fixture::class("any", "nvidia", None, Some(4)),
        ];
        let p = policy(&gpus, &classes);
        assert_eq!(p.keys().collect::<Vec<_>>(), ["w1-0-nvidia"], "only the h100 has a class wish");
        let h100 = &p["w1-0-nvidia"];
        assert_eq!(h100.wish, Some(true));
        assert_eq!(reason(h100), (ConditionStatus::True, REASON_AGREED));
        assert_eq!(
            h100.condition.as_ref().unwrap().message.as_deref(),
            Some("passthrough true from GPUClass vm")
        );
    }

    #[test]
    fn disagreeing_classes_leave_no_wish_and_say_why() {
        let gpus = [fixture::gpu("w1", 0, "nvidia", "h100", Some(81920))];
        let classes = [
            with(fixture::class("vm-b", "nvidia", Some("h100"), None), Some(true)),
            with(fixture::class("vm-a", "nvidia", None, None), Some(true)),
            with(fixture::class("shared", "nvidia", None, Some(4)), Some(false)),
        ];
        let p = &policy(&gpus, &classes)["w1-0-nvidia"];
        assert_eq!(p.wish, None);
        assert_eq!(reason(p), (ConditionStatus::False, REASON_CONFLICT));
        assert_eq!(
            p.condition.as_ref().unwrap().message.as_deref(),
            Some(
                "GPUClasses disagree on passthrough: true from vm-a, vm-b, false from shared; the driver is left as it is until they agree or spec.passthrough is set"
            )
        );
        // The GPU's own spec decides: the message says so, the class verdict stays.
        let mut own = gpus[0].clone();
        own.spec.passthrough = Some(false);
        let p = &policy(&[own], &classes)["w1-0-nvidia"];
        assert_eq!(p.wish, None);
        assert!(
            p.condition
                .as_ref()
                .unwrap()
                .message
                .as_deref()
                .unwrap()
                .ends_with("; spec.passthrough false decides")
        );
    }

    #[test]
    fn agreeing_false_is_a_wish_too() {
        let gpus = [fixture::gpu("w1", 0, "nvidia", "h100", Some(81920))];
        let classes = [
            with(fixture::class("a", "nvidia", None, None), Some(false)),
            with(fixture::class("b", "nvidia", None, Some(2)), Some(false)),
        ];
        let p = &policy(&gpus, &classes)["w1-0-nvidia"];
        assert_eq!(p.wish, Some(false));
        assert_eq!(reason(p), (ConditionStatus::True, REASON_AGREED));
    }

    #[test]
    fn classes_without_a_wish_take_no_part() {
        let gpus = [fixture::gpu("w1", 0, "nvidia", "h100", Some(81920))];
        let classes =
            [fixture::class("a", "nvidia", None, None), fixture::class("b", "nvidia", None, Some(2))];
        assert!(policy(&gpus, &classes).is_empty());
    }
}
