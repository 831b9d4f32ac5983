//! GPU-wide sharing settings a backend can change: the compute mode and the time-slice length of CUDA
//! time-slicing ([`super::DeviceBackend::set_compute_mode`], [`super::DeviceBackend::set_time_slice`]).
//!
//! | value | NVML / `nvidia-smi` | used by |
//! |---|---|---|
//! | [`ComputeMode::Default`] | `NVML_COMPUTEMODE_DEFAULT` (0), `nvidia-smi -c DEFAULT` | time-slicing, after MPS |
//! | [`ComputeMode::Prohibited`] | `NVML_COMPUTEMODE_PROHIBITED` (2), `nvidia-smi -c PROHIBITED` | — |
//! | [`ComputeMode::ExclusiveProcess`] | `NVML_COMPUTEMODE_EXCLUSIVE_PROCESS` (3), `nvidia-smi -c EXCLUSIVE_PROCESS` | MPS (only the MPS server opens the GPU) |
//! | [`TimeSlice::Default`] … [`TimeSlice::Long`] | `nvidia-smi compute-policy -i <uuid> --set-timeslice 0…3` (NVML has no call for it) | time-slicing |
//!
//! ```
//! use vgpu_core::backend::{ComputeMode, TimeSlice};
//!
//! assert_eq!("Medium".parse::<TimeSlice>(), Ok(TimeSlice::Medium));
//! assert_eq!(TimeSlice::Long.smi_value(), 3);
//! assert_eq!(ComputeMode::ExclusiveProcess.to_string(), "EXCLUSIVE_PROCESS");
//! ```

use std::{fmt, str::FromStr};

use serde::{Deserialize, Serialize};

/// Who may open a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum ComputeMode {
    /// Any number of processes (the driver time-slices them).
    #[default]
    Default,
    /// No process may create a context.
    Prohibited,
    /// One process at a time (with MPS: the MPS server).
    ExclusiveProcess,
}

impl fmt::Display for ComputeMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Default => "DEFAULT",
            Self::Prohibited => "PROHIBITED",
            Self::ExclusiveProcess => "EXCLUSIVE_PROCESS",
        })
    }
}

/// The length of a time slice when several processes share a GPU (the opaque config's
/// `timeSlicingConfig.interval`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord, Serialize, Deserialize)]
pub enum TimeSlice {
    /// The driver's default.
    #[default]
    Default,
    /// Short slices.
    Short,
    /// Medium slices.
    Medium,
    /// Long slices.
    Long,
}

impl TimeSlice {
    /// Every value, in `nvidia-smi` order.
    pub const ALL: [TimeSlice; 4] = [Self::Default, Self::Short, Self::Medium, Self::Long];

    /// The argument of `nvidia-smi compute-policy --set-timeslice` (0–3).
    pub fn smi_value(self) -> u8 {
        match self {
            Self::Default => 0,
            Self::Short => 1,
            Self::Medium => 2,
            Self::Long => 3,
        }
    }

    /// The API spelling (`Default`, `Short`, `Medium`, `Long`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Default => "Default",
            Self::Short => "Short",
            Self::Medium => "Medium",
            Self::Long => "Long",
        }
    }
}

impl fmt::Display for TimeSlice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The text is not a time-slice interval.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("expected Default|Short|Medium|Long, got {0:?}")]
pub struct UnknownTimeSlice(pub String);

impl FromStr for TimeSlice {
    type Err = UnknownTimeSlice;

    /// Exact spelling, as the API (no case folding: `short` is rejected like any other typo).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL.into_iter().find(|t| t.as_str() == s).ok_or_else(|| UnknownTimeSlice(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_typos_are_named() {
        for t in TimeSlice::ALL {
            assert_eq!(t.to_string().parse::<TimeSlice>(), Ok(t));
        }
        assert_eq!(
            "Fast".parse::<TimeSlice>().unwrap_err().to_string(),
            "expected Default|Short|Medium|Long, got \"Fast\""
        );
        assert!("short".parse::<TimeSlice>().is_err());
        assert_eq!(TimeSlice::ALL.map(TimeSlice::smi_value), [0, 1, 2, 3]);
    }
}
