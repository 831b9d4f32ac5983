//! Physical GPU devices and a node's inventory of them.

use std::fmt;

/// The maker of a GPU. Not part of the `node-device-register` wire form (which is NVIDIA-shaped); device
/// backends fill it in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Vendor {
    /// NVIDIA (NVML backend).
    #[default]
    Nvidia,
    /// MetaX.
    MetaX,
    /// Any other or unknown vendor.
    Other,
}

impl fmt::Display for Vendor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Vendor::Nvidia => "nvidia",
            Vendor::MetaX => "metax",
            Vendor::Other => "other",
        })
    }
}

/// Health of a physical GPU as reported by the device plugin (`healthy` in `node-device-register`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum DeviceHealth {
    /// The GPU can take new allocations.
    #[default]
    Healthy,
    /// The GPU is unhealthy or excluded by the node configuration; it stays registered.
    Unhealthy,
}

impl DeviceHealth {
    /// `true` for [`DeviceHealth::Healthy`].
    pub fn is_healthy(self) -> bool {
        self == DeviceHealth::Healthy
    }

    /// Maps the wire boolean to a health value.
    pub fn from_bool(healthy: bool) -> Self {
        if healthy { DeviceHealth::Healthy } else { DeviceHealth::Unhealthy }
    }
}

/// CUDA compute capability `major.minor` (e.g. 8.6). On the wire it is a `float32` (`6.1`), computed
/// upstream as `major + minor/10`, so `minor` is a single digit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct ComputeCapability {
    /// Major version.
    pub major: u32,
    /// Minor version (0..=9).
    pub minor: u32,
}

impl ComputeCapability {
    /// Builds a capability; returns `None` when `minor > 9` (not representable on the wire).
    pub fn new(major: u32, minor: u32) -> Option<Self> {
        (minor <= 9).then_some(Self { major, minor })
    }

    /// The wire value (`major + minor/10` as `f32`).
    pub fn as_f32(self) -> f32 {
        match self.tenths() {
            // `tenths` and 10 are exact `f32` values, and an `f64` quotient (53 bits >= 2 * 24 + 2) rounded
            // to `f32` is the correctly rounded `f32` quotient (no double-rounding error): the same value as
            // parsing the decimal text, without the text.
            Some(tenths) => (f64::from(tenths) / 10.0) as f32,
            None => self.as_f32_from_text(),
        }
    }

    /// `10 * major + minor` when `minor` is one digit and the result is an exact `f32` (at most 2^24).
    fn tenths(self) -> Option<u32> {
        if self.minor > 9 {
            return None;
        }
        self.major.checked_mul(10).and_then(|t| t.checked_add(self.minor)).filter(|&t| t <= 1 << 24)
    }

    /// The reference form of [`ComputeCapability::as_f32`]: the `f32` nearest to the decimal text
    /// `major.minor` (so that 6.1 is exactly the `f32` nearest to 6.1).
    fn as_f32_from_text(self) -> f32 {
        format!("{}.{}", self.major, self.minor).parse::<f32>().unwrap_or(0.0)
    }

    /// Reads the wire value; `None` unless it is finite, non-negative and exactly `major.minor` with one
    /// minor digit.
    pub fn from_f32(value: f32) -> Option<Self> {
        if !value.is_finite() || !(0.0..4_294_967_296.0).contains(&value) {
            return None;
        }
        let major = value.trunc();
        let minor = ((value - major) * 10.0).round();
        if minor >= 10.0 {
            return None;
        }
        // `as` is exact here: both are integral, in range and non-negative.
        let cap = Self { major: major as u32, minor: minor as u32 };
        (cap.as_f32() == value).then_some(cap)
    }
}

impl fmt::Display for ComputeCapability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// One physical GPU of a node, as the scheduler sees it (one entry of `node-device-register`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct GpuDevice {
    /// Device index on the node, `0..n-1` (`id`). The scheduler uses it as a slice index.
    pub index: u32,
    /// Device UUID, e.g. `GPU-49aa2e6a-33f3-99dd-e08b-ea4beb0e0d28` (`uuid`).
    pub uuid: String,
    /// Product/type name, e.g. `NVIDIA GeForce GTX 1050 Ti` (`type`).
    pub type_name: String,
    /// Maker; not on the wire (decoded devices get [`Vendor::Nvidia`]).
    pub vendor: Vendor,
    /// Schedulable memory in MiB, after memory scaling (`memory`).
    pub memory_mib: u64,
    /// Schedulable cores, `coresScaling × 100` (`core`).
    pub cores: u64,
    /// vGPU slots on this GPU: the node split count (`number`).
    pub split_count: u32,
    /// NUMA node, `None` when unknown (`numa` = -1).
    pub numa_node: Option<u32>,
    /// MIG mode enabled (`mig`); MIG GPUs are not shared as vGPUs.
    pub mig_enabled: bool,
    /// PCI bus id, e.g. `0000:01:00.0` (`busId`).
    pub bus_id: String,
    /// CUDA compute capability (`capability`).
    pub capability: ComputeCapability,
    /// Health (`healthy`).
    pub health: DeviceHealth,
}

impl GpuDevice {
    /// A device may take vGPU allocations: healthy and not in MIG mode.
    pub fn is_schedulable(&self) -> bool {
        self.health.is_healthy() && !self.mig_enabled
    }
}

/// All GPUs of one node, ordered by index (`devices[i].index == i`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct NodeDeviceInventory {
    /// The devices, `devices[i].index == i`.
    pub devices: Vec<GpuDevice>,
}

impl NodeDeviceInventory {
    /// Wraps a device list (no validation; the codec validates indices).
    pub fn new(devices: Vec<GpuDevice>) -> Self {
        Self { devices }
    }

    /// `count` identical healthy GPUs on a two-socket node, for tests, examples, benches and simulations: GPU `i`
    /// has UUID `GPU-<i>`, 100 cores, `memory_mib` MiB and `split_count` vGPU slots, and sits on NUMA node 0 in
    /// the first half and 1 in the second. Adjust with [`with_type_name`](Self::with_type_name) and
    /// [`with_uuids`](Self::with_uuids), or edit `devices`.
    ///
    /// ```
    /// use vgpu_core::model::NodeDeviceInventory;
    /// let inv = NodeDeviceInventory::uniform(4, 40960, 10).with_type_name("A100");
    /// assert_eq!(inv.schedulable().count(), 4);
    /// assert_eq!(inv.devices[3].uuid, "GPU-3");
    /// assert_eq!(inv.devices.iter().map(|d| d.numa_node).collect::<Vec<_>>(), [Some(0), Some(0), Some(1), Some(1)]);
    /// ```
    pub fn uniform(count: u32, memory_mib: u64, split_count: u32) -> Self {
        let devices = (0..count)
            .map(|i| GpuDevice {
                index: i,
                uuid: format!("GPU-{i}"),
                memory_mib,
                cores: 100,
                split_count,
                numa_node: Some(u32::from(i >= count.div_ceil(2))),
                health: DeviceHealth::Healthy,
                ..GpuDevice::default()
            })
            .collect();
        Self { devices }
    }

    /// Sets every GPU's type name.
    pub fn with_type_name(mut self, type_name: &str) -> Self {
        for d in &mut self.devices {
            d.type_name = type_name.to_owned();
        }
        self
    }

    /// Sets every GPU's UUID from its index.
    pub fn with_uuids(mut self, uuid: impl Fn(u32) -> String) -> Self {
        for d in &mut self.devices {
            d.uuid = uuid(d.index);
        }
        self
    }

    /// Number of devices.
    pub fn len(&self) -> usize {
        self.devices.len()
    }

    /// `true` when the node has no devices.
    pub fn is_empty(&self) -> bool {
        self.devices.is_empty()
    }

    /// The device with this index.
    pub fn get(&self, index: u32) -> Option<&GpuDevice> {
        self.devices.get(usize::try_from(index).ok()?)
    }

    /// The device with this UUID (case-sensitive).
    pub fn by_uuid(&self, uuid: &str) -> Option<&GpuDevice> {
        self.devices.iter().find(|d| d.uuid == uuid)
    }

    /// Devices that can take vGPU allocations.
    pub fn schedulable(&self) -> impl Iterator<Item = &GpuDevice> {
        self.devices.iter().filter(|d| d.is_schedulable())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capability_round_trip() {
        for (major, minor) in [(6, 1), (8, 0), (8, 9), (10, 0), (12, 1)] {
            let cap = ComputeCapability::new(major, minor).unwrap();
            assert_eq!(ComputeCapability::from_f32(cap.as_f32()), Some(cap));
        }
        assert_eq!(ComputeCapability::from_f32(6.15), None);
        assert_eq!(ComputeCapability::from_f32(-1.0), None);
        assert_eq!(ComputeCapability::from_f32(f32::NAN), None);
        assert_eq!(ComputeCapability::new(1, 10), None);
    }

    #[test]
    fn as_f32_matches_the_decimal_text() {
        // Every capability up to major 10_000, then the edges of the fast path.
        let small = (0..10_000u32).flat_map(|major| (0..10).map(move |minor| (major, minor)));
        let edges = [(1_677_721, 6), (1_677_721, 7), (1_677_722, 0), (u32::MAX, 9), (0, 10), (6, 12)];
        for (major, minor) in small.chain(edges) {
            let cap = ComputeCapability { major, minor };
            assert_eq!(cap.as_f32().to_bits(), cap.as_f32_from_text().to_bits(), "{major}.{minor}");
        }
    }

    proptest::proptest! {
        #[test]
        fn as_f32_matches_the_decimal_text_anywhere(major in 0u32..2_000_000, minor in 0u32..12) {
            let cap = ComputeCapability { major, minor };
            proptest::prop_assert_eq!(cap.as_f32().to_bits(), cap.as_f32_from_text().to_bits());
        }

        #[test]
        fn as_f32_matches_the_decimal_text_any_major(major in proptest::prelude::any::<u32>(), minor in 0u32..10) {
            let cap = ComputeCapability { major, minor };
            proptest::prop_assert_eq!(cap.as_f32().to_bits(), cap.as_f32_from_text().to_bits());
        }
    }
}
