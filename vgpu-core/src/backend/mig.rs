//! MIG geometry: the profiles each MIG-capable GPU model offers and where their GPU instances may be placed,
//! after NVIDIA's MIG user guide ("Supported MIG Profiles"). Backends use it to check a create request
//! ([`MigModel::check_create`]), the mock backend's MIG state machine and the MIG manager's packing
//! ([`MigModel::pack`]) are built on it.
//!
//! A GPU's memory is cut into `memory_slices` slices (8 on A100/H100/H200, 4 on A30); a GPU instance of a
//! profile occupies `memory_slices` consecutive slices starting at one of the profile's allowed starts, and
//! `compute_slices` of the GPU's compute slices (7, or 4 on A30). Two instances never share a memory slice
//! and their compute slices never add up beyond the GPU's.
//!
//! | model | 1g | 1g (2 slices) | 2g | 3g | 4g | 7g |
//! |---|---|---|---|---|---|---|
//! | A100 40GB | `1g.5gb`(+me) starts 0..=6 | `1g.10gb` 0,2,4,6 | `2g.10gb` 0,2,4 | `3g.20gb` 0,4 | `4g.20gb` 0 | `7g.40gb` 0 |
//! | A100 80GB, H100 80GB | `1g.10gb`(+me) 0..=6 | `1g.20gb` 0,2,4,6 | `2g.20gb` 0,2,4 | `3g.40gb` 0,4 | `4g.40gb` 0 | `7g.80gb` 0 |
//! | H200 141GB | `1g.18gb`(+me) 0..=6 | `1g.35gb` 0,2,4,6 | `2g.35gb` 0,2,4 | `3g.71gb` 0,4 | `4g.71gb` 0 | `7g.141gb` 0 |
//! | A30 24GB (4 slices) | `1g.6gb`(+me) 0..=3 | | `2g.12gb`(+me) 0,2 | | `4g.24gb` 0 | |
//!
//! Profile ids are the GPU instance profile ids `nvidia-smi mig -lgip` prints (19, 20, 15, 14, 9, 5, 0; A30:
//! 14, 21, 5, 6, 0). Instance memory is the model's per-slice memory times the slices (an approximation of
//! what the driver reports, good enough for the mock).

use std::collections::BTreeMap;

use super::types::{MigInstance, MigPlacement, MigProfile, MigProfileInfo};

/// One profile of one GPU model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MigProfileRule {
    /// Profile name, e.g. `3g.40gb`.
    pub name: &'static str,
    /// GPU instance profile id (`nvidia-smi mig -lgip`).
    pub id: u32,
    /// Compute slices.
    pub compute_slices: u32,
    /// Memory slices (the placement size).
    pub memory_slices: u32,
    /// Allowed first memory slices.
    pub starts: &'static [u32],
}

impl MigProfileRule {
    /// The memory slices a placement at `start` occupies, as a bit mask.
    pub fn mask(&self, start: u32) -> u64 {
        slice_mask(start, self.memory_slices)
    }
}

/// A MIG-capable GPU model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MigModel {
    /// Short name, e.g. `A100-80GB`.
    pub name: &'static str,
    /// Memory slices of the GPU.
    pub memory_slices: u32,
    /// Compute slices of the GPU.
    pub compute_slices: u32,
    /// Memory of one slice, MiB (approximate).
    pub slice_memory_mib: u64,
    /// The profiles.
    pub profiles: &'static [MigProfileRule],
}

const STARTS_1: &[u32] = &[0, 1, 2, 3, 4, 5, 6];
const STARTS_2: &[u32] = &[0, 2, 4, 6];
const STARTS_2G: &[u32] = &[0, 2, 4];
const STARTS_3G: &[u32] = &[0, 4];
const STARTS_0: &[u32] = &[0];

macro_rules! eight_slice_profiles {
    ($one:literal, $one_me:literal, $one_two:literal, $two:literal, $three:literal, $four:literal, $seven:literal) => {
        &[
            MigProfileRule { name: $one, id: 19, compute_slices: 1, memory_slices: 1, starts: STARTS_1 },
            MigProfileRule { name: $one_me, id: 20, compute_slices: 1, memory_slices: 1, starts: STARTS_1 },
            MigProfileRule { name: $one_two, id: 15, compute_slices: 1, memory_slices: 2, starts: STARTS_2 },
            MigProfileRule { name: $two, id: 14, compute_slices: 2, memory_slices: 2, starts: STARTS_2G },
            MigProfileRule { name: $three, id: 9, compute_slices: 3, memory_slices: 4, starts: STARTS_3G },
            MigProfileRule { name: $four, id: 5, compute_slices: 4, memory_slices: 4, starts: STARTS_0 },
            MigProfileRule { name: $seven, id: 0, compute_slices: 7, memory_slices: 8, starts: STARTS_0 },
        ]
    };
}

/// A100 40GB.
pub const A100_40GB: MigModel = MigModel {
    name: "A100-40GB",
    memory_slices: 8,
    compute_slices: 7,
    slice_memory_mib: 4864,
    profiles: eight_slice_profiles!(
        "1g.5gb",
        "1g.5gb+me",
        "1g.10gb",
        "2g.10gb",
        "3g.20gb",
        "4g.20gb",
        "7g.40gb"
    ),
};

/// A100 80GB.
pub const A100_80GB: MigModel = MigModel {
    name: "A100-80GB",
    memory_slices: 8,
    compute_slices: 7,
    slice_memory_mib: 9856,
    profiles: eight_slice_profiles!(
        "1g.10gb",
        "1g.10gb+me",
        "1g.20gb",
        "2g.20gb",
        "3g.40gb",
        "4g.40gb",
        "7g.80gb"
    ),
};

/// H100 80GB (SXM5 and PCIe).
pub const H100_80GB: MigModel = MigModel { name: "H100-80GB", ..A100_80GB };

/// H200 141GB.
pub const H200_141GB: MigModel = MigModel {
    name: "H200-141GB",
    memory_slices: 8,
    compute_slices: 7,
    slice_memory_mib: 17920,
    profiles: eight_slice_profiles!(
        "1g.18gb",
        "1g.18gb+me",
        "1g.35gb",
        "2g.35gb",
        "3g.71gb",
        "4g.71gb",
        "7g.141gb"
    ),
};

/// A30 24GB.
pub const A30_24GB: MigModel = MigModel {
    name: "A30-24GB",
    memory_slices: 4,
    compute_slices: 4,
    slice_memory_mib: 5836,
    profiles: &[
        MigProfileRule { name: "1g.6gb", id: 14, compute_slices: 1, memory_slices: 1, starts: &[0, 1, 2, 3] },
        MigProfileRule {
            name: "1g.6gb+me",
            id: 21,
            compute_slices: 1,
            memory_slices: 1,
            starts: &[0, 1, 2, 3],
        },
        MigProfileRule { name: "2g.12gb", id: 5, compute_slices: 2, memory_slices: 2, starts: &[0, 2] },
        MigProfileRule { name: "2g.12gb+me", id: 6, compute_slices: 2, memory_slices: 2, starts: &[0, 2] },
        MigProfileRule { name: "4g.24gb", id: 0, compute_slices: 4, memory_slices: 4, starts: STARTS_0 },
    ],
};

/// Every model this module knows.
pub const MODELS: &[MigModel] = &[A100_40GB, A100_80GB, H100_80GB, H200_141GB, A30_24GB];

fn slice_mask(start: u32, size: u32) -> u64 {
    if size == 0 || start >= 64 {
        return 0;
    }
    let bits = if size >= 64 { u64::MAX } else { (1u64 << size) - 1 };
    bits.checked_shl(start).unwrap_or(0)
}

/// A MIG request cannot be carried out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MigError {
    /// The GPU model has no MIG table here.
    #[error(
        "{name:?} ({memory_mib} MiB) is not a known MIG-capable model (known: A100 40GB/80GB, H100 80GB, H200, A30)"
    )]
    UnknownModel {
        /// Product name.
        name: String,
        /// Memory of the GPU.
        memory_mib: u64,
    },
    /// The GPU does not support MIG at all.
    #[error("the GPU does not support MIG")]
    NotCapable,
    /// The profile is not one of the model's.
    #[error("profile {profile:?} does not exist on {model} (profiles: {known})")]
    UnknownProfile {
        /// The model.
        model: &'static str,
        /// The profile asked for.
        profile: String,
        /// The model's profiles, comma-separated.
        known: String,
    },
    /// The start is not one of the profile's placements.
    #[error("profile {profile} cannot start at memory slice {start} (allowed starts: {allowed:?})")]
    BadPlacement {
        /// The profile.
        profile: String,
        /// The start asked for.
        start: u32,
        /// The allowed starts.
        allowed: Vec<u32>,
    },
    /// The placement overlaps an existing instance.
    #[error(
        "profile {profile} at memory slices {start}..{end} overlaps GPU instance {other_id} ({other_profile} at {other_start}..{other_end})",
        end = start + size,
        other_end = other_start + other_size
    )]
    Overlap {
        /// The profile asked for.
        profile: String,
        /// Its start.
        start: u32,
        /// Its size.
        size: u32,
        /// The instance in the way.
        other_id: u32,
        /// Its profile.
        other_profile: String,
        /// Its start.
        other_start: u32,
        /// Its size.
        other_size: u32,
    },
    /// Not enough compute slices are left.
    #[error("profile {profile} needs {needed} compute slices but only {free} of {total} are free")]
    ComputeSlices {
        /// The profile.
        profile: String,
        /// Its compute slices.
        needed: u32,
        /// Free compute slices.
        free: u32,
        /// The GPU's compute slices.
        total: u32,
    },
    /// MIG mode is not enabled, so no instance can be created.
    #[error("MIG mode is not enabled")]
    NotEnabled,
    /// MIG mode cannot change while instances exist.
    #[error("cannot change the MIG mode while {count} MIG instance(s) exist; destroy them first")]
    InstancesExist {
        /// How many instances exist.
        count: usize,
    },
    /// No GPU instance has this id.
    #[error("no GPU instance with id {0}")]
    NoSuchInstance(u32),
    /// The mode change was accepted but is pending: it takes effect when the GPU is reset
    /// ([`super::DeviceBackend::reset_gpu`]) or the node rebooted.
    #[error(
        "MIG mode {} is pending: it takes effect after a GPU reset or a node reboot",
        if *enabled { "enabled" } else { "disabled" }
    )]
    ResetRequired {
        /// The pending mode (`true`: MIG enabled).
        enabled: bool,
    },
    /// The requested set of instances does not fit on the GPU in any placement.
    #[error(
        "{request} does not fit on one {model} GPU ({memory_slices} memory slices, {compute_slices} compute slices)"
    )]
    Infeasible {
        /// The request, e.g. `3g.40gb x3`.
        request: String,
        /// The model.
        model: &'static str,
        /// Memory slices of the model.
        memory_slices: u32,
        /// Compute slices of the model.
        compute_slices: u32,
    },
}

/// One planned GPU instance: a profile at a start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlannedInstance {
    /// The profile.
    pub rule: MigProfileRule,
    /// First memory slice.
    pub start: u32,
}

impl MigModel {
    /// The model of a GPU from its product name and memory (`NVIDIA A100-SXM4-80GB`, `NVIDIA H100 80GB HBM3`,
    /// `NVIDIA H200`, `NVIDIA A30`), or `None` when MIG geometry is unknown for it.
    pub fn detect(type_name: &str, memory_mib: u64) -> Option<&'static MigModel> {
        let name = type_name.to_ascii_uppercase();
        let gib = memory_mib / 1024;
        if name.contains("A100") {
            Some(if gib <= 48 { &MODELS[0] } else { &MODELS[1] })
        } else if name.contains("H100") && gib <= 85 {
            Some(&MODELS[2])
        } else if name.contains("H200") {
            Some(&MODELS[3])
        } else if name.contains("A30") {
            Some(&MODELS[4])
        } else {
            None
        }
    }

    /// The rule of a profile, by its name.
    pub fn rule(&self, profile: &MigProfile) -> Option<&'static MigProfileRule> {
        let name = profile.to_string();
        self.profiles.iter().find(|r| r.name == name)
    }

    /// The rule of a profile, or [`MigError::UnknownProfile`].
    pub fn require_rule(&self, profile: &MigProfile) -> Result<&'static MigProfileRule, MigError> {
        self.rule(profile).ok_or_else(|| MigError::UnknownProfile {
            model: self.name,
            profile: profile.to_string(),
            known: self.profiles.iter().map(|r| r.name).collect::<Vec<_>>().join(", "),
        })
    }

    /// Memory of an instance of `rule`, MiB.
    pub fn instance_memory_mib(&self, rule: &MigProfileRule) -> u64 {
        self.slice_memory_mib.saturating_mul(u64::from(rule.memory_slices))
    }

    /// Every profile with its placements, as [`super::DeviceBackend::mig_profiles`] reports them.
    pub fn profile_infos(&self) -> Vec<MigProfileInfo> {
        self.profiles
            .iter()
            .filter_map(|r| {
                Some(MigProfileInfo {
                    profile: r.name.parse().ok()?,
                    profile_id: r.id,
                    compute_slices: r.compute_slices,
                    memory_slices: r.memory_slices,
                    memory_mib: self.instance_memory_mib(r),
                    placements: r
                        .starts
                        .iter()
                        .map(|&start| MigPlacement { start, size: r.memory_slices })
                        .collect(),
                })
            })
            .collect()
    }

    /// The memory slices `instances` occupy, as a bit mask.
    pub fn occupied(instances: &[MigInstance]) -> u64 {
        instances.iter().fold(0, |m, i| m | slice_mask(i.placement_start, i.placement_size))
    }

    /// Memory slices no instance occupies.
    pub fn free_memory_slices(&self, instances: &[MigInstance]) -> u32 {
        let all = slice_mask(0, self.memory_slices);
        (all & !Self::occupied(instances)).count_ones()
    }

    /// Compute slices no instance uses (instances of unknown profiles count their profile's `g` number).
    pub fn free_compute_slices(&self, instances: &[MigInstance]) -> u32 {
        let used: u32 = instances.iter().map(|i| i.profile.compute_slices).sum();
        self.compute_slices.saturating_sub(used)
    }

    /// Checks that an instance of `profile` may be created at `start` next to `instances`.
    pub fn check_create(
        &self,
        instances: &[MigInstance],
        profile: &MigProfile,
        start: u32,
    ) -> Result<&'static MigProfileRule, MigError> {
        let rule = self.require_rule(profile)?;
        if !rule.starts.contains(&start) {
            return Err(MigError::BadPlacement {
                profile: profile.to_string(),
                start,
                allowed: rule.starts.to_vec(),
            });
        }
        let mask = rule.mask(start);
        if let Some(other) =
            instances.iter().find(|i| slice_mask(i.placement_start, i.placement_size) & mask != 0)
        {
            return Err(MigError::Overlap {
                profile: profile.to_string(),
                start,
                size: rule.memory_slices,
                other_id: other.gpu_instance_id,
                other_profile: other.profile.to_string(),
                other_start: other.placement_start,
                other_size: other.placement_size,
            });
        }
        let free = self.free_compute_slices(instances);
        if rule.compute_slices > free {
            return Err(MigError::ComputeSlices {
                profile: profile.to_string(),
                needed: rule.compute_slices,
                free,
                total: self.compute_slices,
            });
        }
        Ok(rule)
    }

    /// Places `request` (profile → count) on an empty GPU: a deterministic packing, largest profiles first
    /// (more memory slices, then more compute slices, then by name), each at the lowest allowed start that
    /// is free, backtracking when a later profile finds no room. The result is ordered by start.
    pub fn pack(&self, request: &BTreeMap<MigProfile, u32>) -> Result<Vec<PlannedInstance>, MigError> {
        let mut items: Vec<&'static MigProfileRule> = Vec::new();
        for (profile, &count) in request {
            let rule = self.require_rule(profile)?;
            let infeasible = || self.infeasible(request);
            if count > self.memory_slices {
                return Err(infeasible());
            }
            for _ in 0..count {
                items.push(rule);
            }
        }
        items.sort_by(|a, b| {
            b.memory_slices
                .cmp(&a.memory_slices)
                .then(b.compute_slices.cmp(&a.compute_slices))
                .then(a.name.cmp(b.name))
        });
        let memory: u32 = items.iter().map(|r| r.memory_slices).sum();
        let compute: u32 = items.iter().map(|r| r.compute_slices).sum();
        if memory > self.memory_slices || compute > self.compute_slices {
            return Err(self.infeasible(request));
        }
        let mut starts = Vec::with_capacity(items.len());
        if !place(&items, 0, &mut starts) {
            return Err(self.infeasible(request));
        }
        let mut plan: Vec<PlannedInstance> =
            items.iter().zip(starts).map(|(rule, start)| PlannedInstance { rule: **rule, start }).collect();
        plan.sort_by_key(|p| p.start);
        Ok(plan)
    }

    fn infeasible(&self, request: &BTreeMap<MigProfile, u32>) -> MigError {
        MigError::Infeasible {
            request: request.iter().map(|(p, n)| format!("{p} x{n}")).collect::<Vec<_>>().join(", "),
            model: self.name,
            memory_slices: self.memory_slices,
            compute_slices: self.compute_slices,
        }
    }
}

/// Backtracking placement of `items` (already ordered) over `occupied` slices; pushes the chosen starts.
fn place(items: &[&MigProfileRule], occupied: u64, starts: &mut Vec<u32>) -> bool {
    let Some((first, rest)) = items.split_first() else {
        return true;
    };
    for &start in first.starts {
        let mask = first.mask(start);
        if mask & occupied == 0 {
            starts.push(start);
            if place(rest, occupied | mask, starts) {
                return true;
            }
            starts.pop();
        }
    }
    false
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn profile(name: &str) -> MigProfile {
        name.parse().unwrap()
    }

    fn instance(name: &str, gi: u32, start: u32, size: u32) -> MigInstance {
        MigInstance {
            uuid: format!("MIG-{gi}"),
            profile: profile(name),
            gpu_instance_id: gi,
            compute_instance_id: 0,
            placement_start: start,
            placement_size: size,
            memory_mib: 1,
            memory_used_bytes: None,
        }
    }

    #[test]
    fn detects_models() {
        let name = |n: &str, mib: u64| MigModel::detect(n, mib).map(|m| m.name);
        assert_eq!(name("NVIDIA A100-SXM4-40GB", 40960), Some("A100-40GB"));
        assert_eq!(name("NVIDIA A100-SXM4-80GB", 81920), Some("A100-80GB"));
        assert_eq!(name("NVIDIA H100 80GB HBM3", 81559), Some("H100-80GB"));
        assert_eq!(name("NVIDIA H200", 143771), Some("H200-141GB"));
        assert_eq!(name("NVIDIA A30", 24576), Some("A30-24GB"));
        assert_eq!(name("NVIDIA H100 NVL", 95830), None, "94GB H100 geometry is not tabulated");
        assert_eq!(name("Tesla T4", 15360), None);
    }

    #[test]
    fn placement_rules_of_a100_80gb() {
        let m = &A100_80GB;
        let infos = m.profile_infos();
        let starts = |n: &str| {
            infos
                .iter()
                .find(|i| i.profile.to_string() == n)
                .unwrap()
                .placements
                .iter()
                .map(|p| p.start)
                .collect::<Vec<_>>()
        };
        assert_eq!(starts("1g.10gb"), vec![0, 1, 2, 3, 4, 5, 6]);
        assert_eq!(starts("2g.20gb"), vec![0, 2, 4]);
        assert_eq!(starts("3g.40gb"), vec![0, 4]);
        assert_eq!(starts("4g.40gb"), vec![0]);
        assert_eq!(starts("7g.80gb"), vec![0]);
        assert_eq!(
            m.check_create(&[], &profile("3g.40gb"), 2).unwrap_err().to_string(),
            "profile 3g.40gb cannot start at memory slice 2 (allowed starts: [0, 4])"
        );
        let existing = [instance("3g.40gb", 1, 0, 4)];
        let err = m.check_create(&existing, &profile("2g.20gb"), 2).unwrap_err();
        assert!(matches!(err, MigError::Overlap { other_id: 1, .. }), "{err}");
        assert_eq!(
            m.check_create(&existing, &profile("4g.40gb"), 0).unwrap_err().to_string(),
            "profile 4g.40gb at memory slices 0..4 overlaps GPU instance 1 (3g.40gb at 0..4)"
        );
        assert_eq!(m.check_create(&existing, &profile("3g.40gb"), 4).unwrap().id, 9);
        assert!(matches!(m.check_create(&[], &profile("1g.5gb"), 0), Err(MigError::UnknownProfile { .. })));
        // 4g + 3g = 7 compute slices: then nothing else, even on free memory.
        let full = [instance("4g.40gb", 1, 0, 4), instance("2g.20gb", 2, 4, 2), instance("1g.10gb", 3, 6, 1)];
        assert_eq!(m.free_memory_slices(&full), 1);
        assert!(matches!(m.check_create(&full, &profile("1g.10gb"), 6), Err(MigError::Overlap { .. })));
        let seven = [instance("4g.40gb", 1, 0, 4), instance("3g.40gb", 2, 4, 4)];
        assert_eq!(m.free_compute_slices(&seven), 0);
    }

    #[test]
    fn packing_is_largest_first_and_deterministic() {
        let m = &A100_80GB;
        let req =
            |pairs: &[(&str, u32)]| pairs.iter().map(|(p, n)| (profile(p), *n)).collect::<BTreeMap<_, _>>();
        let starts =
            |plan: Vec<PlannedInstance>| plan.iter().map(|p| (p.rule.name, p.start)).collect::<Vec<_>>();
        assert_eq!(starts(m.pack(&req(&[("1g.10gb", 7)])).unwrap()).len(), 7);
        assert_eq!(
            starts(m.pack(&req(&[("1g.10gb", 1), ("2g.20gb", 1), ("4g.40gb", 1)])).unwrap()),
            vec![("4g.40gb", 0), ("2g.20gb", 4), ("1g.10gb", 6)]
        );
        assert_eq!(starts(m.pack(&req(&[("3g.40gb", 2)])).unwrap()), vec![("3g.40gb", 0), ("3g.40gb", 4)]);
        assert_eq!(
            starts(m.pack(&req(&[("2g.20gb", 3), ("1g.20gb", 1)])).unwrap()),
            vec![("2g.20gb", 0), ("2g.20gb", 2), ("2g.20gb", 4), ("1g.20gb", 6)]
        );
        // Backtracking: 1g.20gb first would take 0..2 and 3g.40gb x2 would not fit; largest first places
        // the 3g at 0 and 4, then nothing is left for the 1g.20gb.
        assert!(m.pack(&req(&[("3g.40gb", 2), ("1g.20gb", 1)])).is_err());
        assert_eq!(
            starts(m.pack(&req(&[("3g.40gb", 1), ("1g.20gb", 2)])).unwrap()),
            vec![("3g.40gb", 0), ("1g.20gb", 4), ("1g.20gb", 6)]
        );
        for bad in [req(&[("1g.10gb", 8)]), req(&[("3g.40gb", 3)]), req(&[("7g.80gb", 1), ("1g.10gb", 1)])] {
            assert!(matches!(m.pack(&bad), Err(MigError::Infeasible { .. })), "{bad:?}");
        }
        assert_eq!(
            m.pack(&req(&[("3g.40gb", 3)])).unwrap_err().to_string(),
            "3g.40gb x3 does not fit on one A100-80GB GPU (8 memory slices, 7 compute slices)"
        );
        assert!(matches!(m.pack(&req(&[("9g.1gb", 1)])), Err(MigError::UnknownProfile { .. })));
        assert!(m.pack(&BTreeMap::new()).unwrap().is_empty());
    }

    proptest::proptest! {
        /// Whatever the request, a successful plan has no overlap, uses allowed starts, and exactly the
        /// requested instances.
        #[test]
        fn packed_plans_are_valid(counts in proptest::collection::vec(0u32..4, 7)) {
            for model in MODELS {
                let request: BTreeMap<MigProfile, u32> = model
                    .profiles
                    .iter()
                    .zip(&counts)
                    .filter(|(_, n)| **n > 0)
                    .map(|(r, n)| (r.name.parse().unwrap(), *n))
                    .collect();
                if let Ok(plan) = model.pack(&request) {
                    let mut occupied = 0u64;
                    for p in &plan {
                        proptest::prop_assert!(p.rule.starts.contains(&p.start));
                        proptest::prop_assert_eq!(occupied & p.rule.mask(p.start), 0);
                        occupied |= p.rule.mask(p.start);
                    }
                    proptest::prop_assert_eq!(plan.len() as u32, request.values().sum::<u32>());
                    proptest::prop_assert!(occupied < (1u64 << model.memory_slices));
                }
            }
        }
    }
}
