//! From the selected configuration's per-GPU targets to a plan ([`plan`]), whether the backend already
//! matches it ([`GpuPlan::changes`]), and carrying it out through the backend's MIG calls ([`apply`]).
//!
//! A GPU matches its target when its MIG mode is the wanted one and, with MIG on, its instances are the
//! wanted multiset of profiles (placements may differ: an existing layout that already has the right
//! instances is not rebuilt). A GPU that must change has all of its instances destroyed, its mode set,
//! then the planned instances created at the placements [`MigModel::pack`] chose (largest first).

use std::collections::BTreeMap;

use vgpu_core::backend::{
    BackendError, DeviceBackend, MigLayout, MigMode, MigProfile,
    mig::{MigError, MigModel, PlannedInstance},
};

use crate::config::GpuTarget;

/// The plan for one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuPlan {
    /// The GPU.
    pub index: u32,
    /// MIG mode wanted.
    pub mig_enabled: bool,
    /// The instances to create, by start.
    pub instances: Vec<PlannedInstance>,
    /// Whether the GPU differs from the plan now.
    pub changes: bool,
}

/// The target cannot be met on this node (nothing has been changed).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PlanError {
    /// The backend could not be read.
    #[error("cannot read GPU {index}: {source}")]
    Backend {
        /// The GPU.
        index: u32,
        /// The backend's error.
        #[source]
        source: BackendError,
    },
    /// The target is impossible on this GPU (not MIG-capable, unknown model or profile, does not fit).
    #[error("GPU {index}: {source}")]
    Mig {
        /// The GPU.
        index: u32,
        /// Why.
        #[source]
        source: MigError,
    },
}

/// The instance profiles of a layout as a multiset.
pub fn profile_counts(layout: &MigLayout) -> BTreeMap<MigProfile, u32> {
    let mut counts = BTreeMap::new();
    for instance in &layout.instances {
        *counts.entry(instance.profile.clone()).or_insert(0) += 1;
    }
    counts
}

/// Whether `layout` already is what `target` asks.
pub fn matches(layout: &MigLayout, target: &GpuTarget) -> bool {
    match (layout.mode, target.mig_enabled) {
        (MigMode::NotSupported, wanted) => !wanted,
        (MigMode::Disabled, false) => true,
        (MigMode::Enabled, true) => profile_counts(layout) == target.mig_devices,
        _ => false,
    }
}

/// Whether `layout` already is what `plan` makes: the mode and, with MIG on, the multiset of profiles.
pub fn meets(layout: &MigLayout, plan: &GpuPlan) -> bool {
    if !plan.mig_enabled {
        return layout.mode == MigMode::Disabled;
    }
    let mut wanted: BTreeMap<MigProfile, u32> = BTreeMap::new();
    for planned in &plan.instances {
        let Ok(profile) = planned.rule.name.parse::<MigProfile>() else { return false };
        *wanted.entry(profile).or_insert(0) += 1;
    }
    layout.mode == MigMode::Enabled && profile_counts(layout) == wanted
}

/// Checks every target against the backend and places the instances. Fails, having changed nothing, when
/// any GPU cannot take its target.
pub fn plan(
    backend: &dyn DeviceBackend,
    targets: &BTreeMap<u32, GpuTarget>,
) -> Result<Vec<GpuPlan>, PlanError> {
    let devices = backend.devices().map_err(|source| PlanError::Backend { index: 0, source })?;
    let mut plans = Vec::with_capacity(targets.len());
    for (&index, target) in targets {
        let layout = backend.mig_layout(index).map_err(|source| PlanError::Backend { index, source })?;
        let mig = |source| PlanError::Mig { index, source };
        if layout.mode == MigMode::NotSupported {
            if target.mig_enabled {
                return Err(mig(MigError::NotCapable));
            }
            continue;
        }
        let instances = if target.mig_enabled {
            let device = devices.iter().find(|d| d.index == index).ok_or(PlanError::Backend {
                index,
                source: BackendError::NoSuchDevice { index, count: devices.len() },
            })?;
            let model = MigModel::detect(&device.type_name, device.memory_mib).ok_or_else(|| {
                mig(MigError::UnknownModel { name: device.type_name.clone(), memory_mib: device.memory_mib })
            })?;
            model.pack(&target.mig_devices).map_err(mig)?
        } else {
            Vec::new()
        };
        plans.push(GpuPlan {
            index,
            mig_enabled: target.mig_enabled,
            instances,
            changes: !matches(&layout, target),
        });
    }
    Ok(plans)
}

/// Carrying out a plan failed on one GPU (the GPUs before it are done, this one may be half-way).
#[derive(Debug, thiserror::Error)]
#[error("applying the MIG layout of GPU {index} failed while {step}: {source}")]
pub struct ApplyError {
    /// The GPU.
    pub index: u32,
    /// What was being done (`destroying GPU instance 3`, `enabling MIG`, `creating 1g.10gb at 2`).
    pub step: String,
    /// The backend's error.
    #[source]
    pub source: BackendError,
}

/// Applies the GPUs of `plans` that change: destroy every instance, set the mode, create the instances. A
/// GPU that already [`meets`] its plan is left alone, so applying again after a partial apply (a GPU reset
/// in between) redoes nothing. Stops at the first failure, a mode left pending included
/// ([`MigError::ResetRequired`]).
pub fn apply(backend: &dyn DeviceBackend, plans: &[GpuPlan]) -> Result<(), ApplyError> {
    for plan in plans.iter().filter(|p| p.changes) {
        apply_one(backend, plan)?;
    }
    Ok(())
}

/// As [`apply`], but a GPU whose mode change stays pending does not stop the others (so one reset round or
/// one reboot applies every pending mode): returns the GPUs left pending, with their pending mode (`true`:
/// enabled).
pub fn apply_leaving_pending(
    backend: &dyn DeviceBackend,
    plans: &[GpuPlan],
) -> Result<Vec<(u32, bool)>, ApplyError> {
    let mut pending = Vec::new();
    for plan in plans.iter().filter(|p| p.changes) {
        match apply_one(backend, plan) {
            Ok(()) => {}
            Err(ApplyError {
                index,
                source: BackendError::Mig { source: MigError::ResetRequired { enabled }, .. },
                ..
            }) => pending.push((index, enabled)),
            Err(err) => return Err(err),
        }
    }
    Ok(pending)
}

fn apply_one(backend: &dyn DeviceBackend, plan: &GpuPlan) -> Result<(), ApplyError> {
    let index = plan.index;
    let fail = |step: String| move |source| ApplyError { index, step, source };
    let layout = backend.mig_layout(index).map_err(fail("reading the MIG layout".to_owned()))?;
    if meets(&layout, plan) {
        return Ok(());
    }
    for instance in &layout.instances {
        backend
            .destroy_mig_device(index, instance.gpu_instance_id)
            .map_err(fail(format!("destroying GPU instance {}", instance.gpu_instance_id)))?;
    }
    let verb = if plan.mig_enabled { "enabling MIG" } else { "disabling MIG" };
    backend.set_mig_mode(index, plan.mig_enabled).map_err(fail(verb.to_owned()))?;
    for planned in &plan.instances {
        let profile: MigProfile = planned.rule.name.parse().map_err(|_| ApplyError {
            index,
            step: format!("creating {}", planned.rule.name),
            source: BackendError::NotSupported {
                backend: "mig-manager",
                operation: "an unparsable profile name",
            },
        })?;
        backend
            .create_mig_device(index, &profile, planned.start)
            .map_err(fail(format!("creating {} at memory slice {}", planned.rule.name, planned.start)))?;
    }
    tracing::info!(
        gpu = index,
        mig = plan.mig_enabled,
        instances = plan.instances.len(),
        "MIG layout applied"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use vgpu_core::backend::mock::MockBackend;

    use super::*;

    const NODE: &str = "\
gpus:
  - { uuid: GPU-0, name: NVIDIA A100-SXM4-80GB, memoryMiB: 81920, mig: { mode: Disabled } }
  - { uuid: GPU-1, name: NVIDIA A100-SXM4-80GB, memoryMiB: 81920, mig: { mode: Enabled, instances: [
      { uuid: MIG-x, profile: 7g.80gb, gpuInstanceId: 1, placementStart: 0, placementSize: 8, memoryMiB: 80000 } ] } }
  - { uuid: GPU-2, name: Tesla T4, memoryMiB: 15360 }
";

    fn target(enabled: bool, devices: &[(&str, u32)]) -> GpuTarget {
        GpuTarget {
            mig_enabled: enabled,
            mig_devices: devices.iter().map(|(p, n)| (p.parse().unwrap(), *n)).collect(),
        }
    }

    #[test]
    fn plans_then_applies_only_what_changes() {
        let backend = MockBackend::from_yaml_str(NODE).unwrap();
        let targets: BTreeMap<u32, GpuTarget> = [
            (0, target(true, &[("1g.10gb", 7)])),
            (1, target(true, &[("7g.80gb", 1)])),
            (2, target(false, &[])),
        ]
        .into_iter()
        .collect();
        let plans = plan(&backend, &targets).unwrap();
        assert_eq!(plans.len(), 2, "the T4 cannot do MIG and is asked not to: no plan");
        assert!(plans[0].changes);
        assert!(!plans[1].changes, "GPU 1 already has its 7g.80gb");
        assert_eq!(plans[0].instances.iter().map(|p| p.start).collect::<Vec<_>>(), vec![0, 1, 2, 3, 4, 5, 6]);
        apply(&backend, &plans).unwrap();
        let layout = backend.mig_layout(0).unwrap();
        assert_eq!(layout.mode, MigMode::Enabled);
        assert_eq!(profile_counts(&layout), targets[&0].mig_devices);
        assert_eq!(backend.mig_layout(1).unwrap().instances[0].uuid, "MIG-x", "untouched");
        assert!(plan(&backend, &targets).unwrap().iter().all(|p| !p.changes), "converged");

        // Back to disabled: instances destroyed first, then the mode.
        let off: BTreeMap<u32, GpuTarget> =
            [(0, target(false, &[])), (1, target(false, &[]))].into_iter().collect();
        apply(&backend, &plan(&backend, &off).unwrap()).unwrap();
        assert_eq!(backend.mig_layout(0).unwrap(), MigLayout { mode: MigMode::Disabled, instances: vec![] });
        assert_eq!(backend.mig_layout(1).unwrap().mode, MigMode::Disabled);
    }

    #[test]
    fn impossible_targets_fail_before_any_change() {
        let backend = MockBackend::from_yaml_str(NODE).unwrap();
        let cases = [
            ((0, target(true, &[("1g.10gb", 8)])), "does not fit"),
            ((0, target(true, &[("1g.5gb", 1)])), "profile \"1g.5gb\" does not exist on A100-80GB"),
            ((2, target(true, &[("1g.10gb", 1)])), "GPU 2: the GPU does not support MIG"),
        ];
        for ((index, t), expected) in cases {
            let targets: BTreeMap<u32, GpuTarget> = [(index, t)].into_iter().collect();
            let err = plan(&backend, &targets).unwrap_err().to_string();
            assert!(err.contains(expected), "{err}");
        }
        assert_eq!(backend.mig_layout(0).unwrap().mode, MigMode::Disabled);
    }

    proptest::proptest! {
        /// Any request the planner accepts is applied by the mock state machine without a refusal, and the
        /// GPU then matches it (a second plan changes nothing); a refused request changes nothing.
        #[test]
        fn accepted_plans_apply_and_converge(
            counts in proptest::collection::vec(0u32..4, 7),
            enabled in proptest::prelude::any::<bool>(),
        ) {
            let backend = MockBackend::from_yaml_str(NODE).unwrap();
            let rules = vgpu_core::backend::mig::A100_80GB.profiles;
            let devices: Vec<(&str, u32)> =
                rules.iter().zip(&counts).filter(|(_, n)| enabled && **n > 0).map(|(r, n)| (r.name, *n)).collect();
            let targets: BTreeMap<u32, GpuTarget> =
                [(0, target(enabled, &devices)), (1, target(enabled, &devices))].into_iter().collect();
            let before = (backend.mig_layout(0).unwrap(), backend.mig_layout(1).unwrap());
            match plan(&backend, &targets) {
                Ok(plans) => {
                    apply(&backend, &plans).unwrap();
                    let applied = (backend.mig_layout(0).unwrap(), backend.mig_layout(1).unwrap());
                    apply(&backend, &plans).unwrap();
                    proptest::prop_assert_eq!(
                        &applied,
                        &(backend.mig_layout(0).unwrap(), backend.mig_layout(1).unwrap()),
                        "applying the same plans again changes nothing"
                    );
                    proptest::prop_assert!(plan(&backend, &targets).unwrap().iter().all(|p| !p.changes));
                    for gpu in 0..2 {
                        proptest::prop_assert!(matches(&backend.mig_layout(gpu).unwrap(), &targets[&gpu]));
                    }
                }
                Err(_) => {
                    proptest::prop_assert_eq!(before, (backend.mig_layout(0).unwrap(), backend.mig_layout(1).unwrap()));
                }
            }
        }
    }

    #[test]
    fn apply_reports_the_failing_step() {
        // A backend without MIG control (the trait defaults): the step and the reason are named.
        #[derive(Debug)]
        struct ReadOnly(MockBackend);
        impl DeviceBackend for ReadOnly {
            fn name(&self) -> &'static str {
                "readonly"
            }
            fn devices(&self) -> Result<Vec<vgpu_core::model::GpuDevice>, BackendError> {
                self.0.devices()
            }
            fn memory_usage(&self, i: u32) -> Result<vgpu_core::backend::MemoryUsage, BackendError> {
                self.0.memory_usage(i)
            }
            fn topology(&self) -> Result<vgpu_core::backend::LinkMatrix, BackendError> {
                self.0.topology()
            }
            fn health_events(&self) -> Result<vgpu_core::backend::HealthEvents, BackendError> {
                self.0.health_events()
            }
            fn processes(&self, i: u32) -> Result<Vec<vgpu_core::backend::GpuProcess>, BackendError> {
                self.0.processes(i)
            }
            fn process_utilization(
                &self,
                i: u32,
                s: u64,
            ) -> Result<Vec<vgpu_core::backend::ProcessUtilizationSample>, BackendError> {
                self.0.process_utilization(i, s)
            }
            fn mig_layout(&self, i: u32) -> Result<MigLayout, BackendError> {
                self.0.mig_layout(i)
            }
        }
        let backend = ReadOnly(MockBackend::from_yaml_str(NODE).unwrap());
        let targets: BTreeMap<u32, GpuTarget> = [(0, target(true, &[("3g.40gb", 2)]))].into_iter().collect();
        let plans = plan(&backend, &targets).unwrap();
        let err = apply(&backend, &plans).unwrap_err();
        assert_eq!(
            err.to_string(),
            "applying the MIG layout of GPU 0 failed while enabling MIG: setting the MIG mode is not supported by the readonly backend"
        );
    }
}
