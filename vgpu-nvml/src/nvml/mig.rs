//! The pure side of NVML MIG control: our profile names to NVML's profile constants, placements, and the
//! typed error of a raw MIG call. The calls themselves are in `mig_ffi` (the one `unsafe` module of
//! [`crate::nvml`]).
//!
//! NVML names GPU instance profiles by a constant (`NVML_GPU_INSTANCE_PROFILE_*`, `nvml.h`); the driver maps
//! it to the profile id `nvidia-smi mig -lgip` shows, and that id is what `nvmlDeviceCreateGpuInstanceWithPlacement`
//! takes. The backend asks `nvmlDeviceGetGpuInstanceProfileInfo` for the id of the constant and refuses to go on
//! when it differs from the id of [`vgpu_core::backend::mig`]'s table (so a wrong mapping can never create a
//! different profile):
//!
//! | profile | memory slices | GPU instance constant | value |
//! |---|---|---|---|
//! | `1g.*` | 1 | `NVML_GPU_INSTANCE_PROFILE_1_SLICE` | 0 |
//! | `1g.*` | 2 (`1g.10gb` A100-40GB, `1g.20gb` H100) | `NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2` | 9 |
//! | `1g.*+me` | any | `NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV1` | 7 |
//! | `2g.*` | any | `NVML_GPU_INSTANCE_PROFILE_2_SLICE` | 1 |
//! | `2g.*+me` | any | `NVML_GPU_INSTANCE_PROFILE_2_SLICE_REV1` | 8 |
//! | `3g.*`, `4g.*`, `7g.*`, `8g.*`, `6g.*` | any | `NVML_GPU_INSTANCE_PROFILE_{3,4,7,8,6}_SLICE` | 2, 3, 4, 5, 6 |
//! | `1g/2g/4g.*+gfx` | any | `NVML_GPU_INSTANCE_PROFILE_{1,2,4}_SLICE_GFX` | 10, 11, 12 |
//! | `1g/2g.*-me` | any | `NVML_GPU_INSTANCE_PROFILE_{1,2}_SLICE_NO_ME` | 13, 14 |
//! | `1g/2g.*+me.all` | any | `NVML_GPU_INSTANCE_PROFILE_{1,2}_SLICE_ALL_ME` | 15, 16 |
//!
//! The compute instance spanning a GPU instance of `Ng` is `NVML_COMPUTE_INSTANCE_PROFILE_N_SLICE` (1, 2, 3, 4,
//! 7, 8, 6 slices → 0, 1, 2, 3, 4, 5, 6), with the shared engine profile
//! (`NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED` = 0).

use vgpu_core::backend::{MigPlacement, MigProfile};

/// `NVML_GPU_INSTANCE_PROFILE_COUNT`: the GPU instance profile constants are `0..17`.
pub const GPU_INSTANCE_PROFILE_COUNT: u32 = 17;
/// `NVML_COMPUTE_INSTANCE_PROFILE_COUNT`: the compute instance profile constants are `0..8`.
pub const COMPUTE_INSTANCE_PROFILE_COUNT: u32 = 8;
/// `NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED`.
pub const COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED: u32 = 0;

/// `NVML_SUCCESS`.
pub const NVML_SUCCESS: u32 = 0;
/// `NVML_ERROR_INVALID_ARGUMENT`.
pub const NVML_ERROR_INVALID_ARGUMENT: u32 = 2;
/// `NVML_ERROR_NOT_SUPPORTED`.
pub const NVML_ERROR_NOT_SUPPORTED: u32 = 3;
/// `NVML_ERROR_NOT_FOUND`.
pub const NVML_ERROR_NOT_FOUND: u32 = 6;

/// The `NVML_GPU_INSTANCE_PROFILE_*` constant of a profile whose GPU instance spans `memory_slices` memory
/// slices (from the model's table), or `None` when NVML has no such profile.
pub fn gpu_instance_profile(profile: &MigProfile, memory_slices: u32) -> Option<u32> {
    let slices = profile.compute_slices;
    match profile.suffix.as_str() {
        "" => match (slices, memory_slices) {
            (1, 2) => Some(9),
            (1, _) => Some(0),
            (2, _) => Some(1),
            (3, _) => Some(2),
            (4, _) => Some(3),
            (7, _) => Some(4),
            (8, _) => Some(5),
            (6, _) => Some(6),
            _ => None,
        },
        "+me" => match slices {
            1 => Some(7),
            2 => Some(8),
            _ => None,
        },
        "+gfx" => match slices {
            1 => Some(10),
            2 => Some(11),
            4 => Some(12),
            _ => None,
        },
        "-me" => match slices {
            1 => Some(13),
            2 => Some(14),
            _ => None,
        },
        "+me.all" => match slices {
            1 => Some(15),
            2 => Some(16),
            _ => None,
        },
        _ => None,
    }
}

/// The `NVML_COMPUTE_INSTANCE_PROFILE_*_SLICE` constant of the compute instance spanning a GPU instance of
/// `compute_slices` slices, or `None` when NVML has none.
pub fn compute_instance_profile(compute_slices: u32) -> Option<u32> {
    match compute_slices {
        1 => Some(0),
        2 => Some(1),
        3 => Some(2),
        4 => Some(3),
        7 => Some(4),
        8 => Some(5),
        6 => Some(6),
        _ => None,
    }
}

/// The `nvmlGpuInstancePlacement_t` of a GPU instance (`start`, `size` memory slices), laid out as in
/// `nvml.h` so that a pointer to it is a pointer to NVML's structure.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawPlacement {
    /// First memory slice.
    pub start: u32,
    /// Number of memory slices.
    pub size: u32,
}

impl From<MigPlacement> for RawPlacement {
    fn from(placement: MigPlacement) -> Self {
        Self { start: placement.start, size: placement.size }
    }
}

impl From<RawPlacement> for MigPlacement {
    fn from(raw: RawPlacement) -> Self {
        MigPlacement { start: raw.start, size: raw.size }
    }
}

/// What a raw NVML MIG call answered when it failed. It is the source of the
/// [`BackendError::Library`](vgpu_core::backend::BackendError::Library) the backend returns.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MigCallError {
    /// The call returned an error code.
    #[error("GPU {index}: {call} for {subject} returned NVML error {code} ({message})")]
    Failed {
        /// The GPU.
        index: u32,
        /// The NVML function.
        call: &'static str,
        /// What the call was about: `profile 3g.40gb at slice 4`, `GPU instance 2`, ...
        subject: String,
        /// The `nvmlReturn_t` value.
        code: u32,
        /// NVML's meaning of the code.
        message: String,
    },
    /// The loaded NVML library does not export the function.
    #[error("GPU {index}: the loaded NVML library has no {call} (driver older than R450, or not NVML)")]
    Missing {
        /// The GPU.
        index: u32,
        /// The NVML function.
        call: &'static str,
    },
    /// NVML has no profile constant for the profile.
    #[error("GPU {index}: NVML has no GPU instance profile for {profile} ({memory_slices} memory slices)")]
    NoNvmlProfile {
        /// The GPU.
        index: u32,
        /// The profile.
        profile: String,
        /// Its memory slices.
        memory_slices: u32,
    },
    /// The driver's id for the profile constant is not the table's id for the profile.
    #[error(
        "GPU {index}: NVML profile constant {constant} of {profile} has id {found}, but the MIG table says {expected}; refusing to create a different profile"
    )]
    ProfileMismatch {
        /// The GPU.
        index: u32,
        /// The profile.
        profile: String,
        /// The `NVML_GPU_INSTANCE_PROFILE_*` value.
        constant: u32,
        /// The id the driver reported.
        found: u32,
        /// The id of the table.
        expected: u32,
    },
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn p(name: &str) -> MigProfile {
        name.parse().unwrap()
    }

    #[test]
    fn profile_constants_follow_nvml_h() {
        // A100-80GB / H100-80GB tables: name, memory slices, NVML_GPU_INSTANCE_PROFILE_*.
        let cases = [
            ("1g.10gb", 1, 0),
            ("1g.10gb+me", 1, 7),
            ("1g.20gb", 2, 9),
            ("2g.20gb", 2, 1),
            ("3g.40gb", 4, 2),
            ("4g.40gb", 4, 3),
            ("7g.80gb", 8, 4),
            ("1g.5gb", 1, 0),
            ("1g.10gb", 2, 9),
            ("1g.6gb+me", 1, 7),
            ("2g.12gb+me", 2, 8),
            ("1g.18gb-me", 1, 13),
            ("2g.35gb+gfx", 2, 11),
            ("1g.18gb+me.all", 1, 15),
        ];
        for (name, memory_slices, constant) in cases {
            assert_eq!(gpu_instance_profile(&p(name), memory_slices), Some(constant), "{name}");
        }
        assert_eq!(gpu_instance_profile(&p("5g.50gb"), 5), None);
        assert_eq!(gpu_instance_profile(&p("3g.40gb+me"), 4), None);
        assert_eq!(gpu_instance_profile(&p("1g.10gb+xx"), 1), None);
        // Every constant is below NVML_GPU_INSTANCE_PROFILE_COUNT.
        for (name, memory_slices, _) in cases {
            assert!(gpu_instance_profile(&p(name), memory_slices).unwrap() < GPU_INSTANCE_PROFILE_COUNT);
        }
    }

    #[test]
    fn every_table_profile_has_constants() {
        for model in vgpu_core::backend::mig::MODELS {
            for rule in model.profiles {
                let profile = p(rule.name);
                assert!(
                    gpu_instance_profile(&profile, rule.memory_slices).is_some(),
                    "{} {}",
                    model.name,
                    rule.name
                );
                let ci = compute_instance_profile(rule.compute_slices).unwrap();
                assert!(ci < COMPUTE_INSTANCE_PROFILE_COUNT);
            }
        }
    }

    #[test]
    fn compute_constants() {
        let got: Vec<_> = [1, 2, 3, 4, 7, 8, 6].into_iter().map(compute_instance_profile).collect();
        assert_eq!(got, [0, 1, 2, 3, 4, 5, 6].map(Some));
        assert_eq!(compute_instance_profile(5), None);
        assert_eq!(compute_instance_profile(0), None);
    }

    #[test]
    fn placement_layout_and_conversion() {
        assert_eq!(std::mem::size_of::<RawPlacement>(), 8);
        assert_eq!(std::mem::align_of::<RawPlacement>(), 4);
        let raw = RawPlacement::from(MigPlacement { start: 4, size: 2 });
        assert_eq!(raw, RawPlacement { start: 4, size: 2 });
        assert_eq!(MigPlacement::from(raw), MigPlacement { start: 4, size: 2 });
    }

    #[test]
    fn errors_name_gpu_call_subject_and_code() {
        let err = MigCallError::Failed {
            index: 3,
            call: "nvmlDeviceCreateGpuInstanceWithPlacement",
            subject: "profile 3g.40gb at memory slice 4".into(),
            code: 23,
            message: "insufficient resources".into(),
        };
        let text = err.to_string();
        for part in ["GPU 3", "nvmlDeviceCreateGpuInstanceWithPlacement", "3g.40gb", "slice 4", "error 23"] {
            assert!(text.contains(part), "{text}");
        }
    }
}
