//! Values a [`super::DeviceBackend`] reports besides the devices themselves.

use std::{fmt, str::FromStr};

/// Device memory of one GPU, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct MemoryUsage {
    /// Total memory.
    pub total_bytes: u64,
    /// Memory in use.
    pub used_bytes: u64,
}

impl MemoryUsage {
    /// Free memory (`total - used`, never negative).
    pub fn free_bytes(&self) -> u64 {
        self.total_bytes.saturating_sub(self.used_bytes)
    }
}

/// A process running on a GPU.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GpuProcess {
    /// Host PID.
    pub pid: u32,
    /// Device memory used by the process, in bytes (`None` when the driver does not say, e.g. under MIG
    /// without privileges).
    pub used_memory_bytes: Option<u64>,
    /// Compute or graphics context.
    pub kind: ProcessKind,
}

/// The kind of GPU context of a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ProcessKind {
    /// A compute (CUDA, MACA, ...) context.
    #[default]
    Compute,
    /// A graphics context.
    Graphics,
}

/// One utilization sample of one process on one GPU (as `nvmlProcessUtilizationSample_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ProcessUtilizationSample {
    /// Host PID.
    pub pid: u32,
    /// Sample time, microseconds since the Unix epoch.
    pub timestamp_us: u64,
    /// Streaming-multiprocessor (compute) utilization, percent.
    pub sm_percent: u32,
    /// Memory-controller utilization, percent.
    pub memory_percent: u32,
    /// Encoder utilization, percent.
    pub encoder_percent: u32,
    /// Decoder utilization, percent.
    pub decoder_percent: u32,
}

/// MIG mode of a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum MigMode {
    /// The GPU cannot be partitioned.
    #[default]
    NotSupported,
    /// Supported, off.
    Disabled,
    /// On: the GPU is split into the instances of its [`MigLayout`].
    Enabled,
}

impl fmt::Display for MigMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::NotSupported => "NotSupported",
            Self::Disabled => "Disabled",
            Self::Enabled => "Enabled",
        })
    }
}

/// A MIG profile name `<slices>g.<memory>gb` (optionally with a `+me`-like suffix), e.g. `1g.10gb`, `3g.40gb`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MigProfile {
    /// Compute slices (`g` count).
    pub compute_slices: u32,
    /// Memory in GB as named by the profile.
    pub memory_gb: u32,
    /// Anything after the memory part, e.g. `+me` (empty normally).
    pub suffix: String,
}

/// The text is not a MIG profile name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a MIG profile like 1g.10gb")]
pub struct MigProfileError(pub String);

impl FromStr for MigProfile {
    type Err = MigProfileError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || MigProfileError(crate::discovery::fields::excerpt(s));
        let (slices, rest) = s.trim().split_once("g.").ok_or_else(err)?;
        let gb_at = rest.find("gb").ok_or_else(err)?;
        let (memory, suffix) = (rest.get(..gb_at).ok_or_else(err)?, rest.get(gb_at + 2..).ok_or_else(err)?);
        let digits = |t: &str| !t.is_empty() && t.len() <= 6 && t.bytes().all(|b| b.is_ascii_digit());
        if !digits(slices) || !digits(memory) {
            return Err(err());
        }
        let compute_slices = slices.parse().map_err(|_| err())?;
        let memory_gb = memory.parse().map_err(|_| err())?;
        if compute_slices == 0 {
            return Err(err());
        }
        Ok(Self { compute_slices, memory_gb, suffix: suffix.to_owned() })
    }
}

impl fmt::Display for MigProfile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}g.{}gb{}", self.compute_slices, self.memory_gb, self.suffix)
    }
}

/// One MIG device (a GPU instance with one compute instance).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MigInstance {
    /// MIG device UUID (`MIG-...`).
    pub uuid: String,
    /// Profile.
    pub profile: MigProfile,
    /// GPU instance id.
    pub gpu_instance_id: u32,
    /// Compute instance id.
    pub compute_instance_id: u32,
    /// First memory slice of the placement.
    pub placement_start: u32,
    /// Number of memory slices of the placement.
    pub placement_size: u32,
    /// Memory of the instance, MiB.
    pub memory_mib: u64,
    /// Memory in use inside the instance, bytes; `None` when the backend cannot tell (the monitor then
    /// exports no usage series for the instance).
    pub memory_used_bytes: Option<u64>,
}

/// Where a GPU instance sits: `size` memory slices from `start`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MigPlacement {
    /// First memory slice.
    pub start: u32,
    /// Number of memory slices.
    pub size: u32,
}

/// A MIG profile a GPU offers, with its allowed placements ([`super::DeviceBackend::mig_profiles`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MigProfileInfo {
    /// The profile.
    pub profile: MigProfile,
    /// GPU instance profile id (`nvidia-smi mig -lgip`).
    pub profile_id: u32,
    /// Compute slices.
    pub compute_slices: u32,
    /// Memory slices.
    pub memory_slices: u32,
    /// Memory of one instance, MiB.
    pub memory_mib: u64,
    /// Every placement an instance of this profile may take on an empty GPU.
    pub placements: Vec<MigPlacement>,
}

/// The driver versions a backend reports (written to `vgpu.config` and the node labels).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct DriverVersions {
    /// Driver version, e.g. `570.86.10`.
    pub driver_version: String,
    /// CUDA driver API version `(major, minor)`, e.g. `(12, 8)`, when known.
    pub cuda_version: Option<(u32, u32)>,
}

/// The MIG state of one GPU.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct MigLayout {
    /// Current mode.
    pub mode: MigMode,
    /// The MIG devices (empty unless [`MigMode::Enabled`]).
    pub instances: Vec<MigInstance>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mig_profiles() {
        let p: MigProfile = "1g.10gb".parse().unwrap();
        assert_eq!((p.compute_slices, p.memory_gb, p.suffix.as_str()), (1, 10, ""));
        let p: MigProfile = "1g.10gb+me".parse().unwrap();
        assert_eq!(p.to_string(), "1g.10gb+me");
        for bad in ["", "g.10gb", "1g.gb", "0g.5gb", "1g10gb", "xg.10gb", "1g.10", "99999999g.1gb"] {
            assert!(bad.parse::<MigProfile>().is_err(), "{bad}");
        }
    }

    #[test]
    fn free_memory_saturates() {
        assert_eq!(MemoryUsage { total_bytes: 10, used_bytes: 4 }.free_bytes(), 6);
        assert_eq!(MemoryUsage { total_bytes: 1, used_bytes: 4 }.free_bytes(), 0);
    }
}
