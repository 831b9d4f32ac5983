//! The P2P link type codes of the `node-device-topology` annotation.

use std::fmt;

/// Error returned when an integer is not one of the P2P link type codes `0..=24`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("invalid P2P link type code {0}: expected an integer in 0..=24")]
pub struct InvalidLinkType(pub i64);

/// How two GPUs are connected, as carried in the `node-device-topology` annotation.
///
/// The integer values are vgpu-manager's `P2PLinkType` codes (contract §2): `0` unknown, `1..=6` PCIe /
/// board levels from the common ancestor of the two GPUs, `6 + k` for `k` NVLinks (`k` in `1..=18`; higher
/// counts saturate at 18 on the producer side).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum P2PLinkType {
    /// `0`: unknown link.
    Unknown = 0,
    /// `1`: `SYS`, the GPUs hang off different CPUs.
    CrossCpu = 1,
    /// `2`: `NODE`, same CPU (NUMA node), different host bridges.
    SameCpu = 2,
    /// `3`: `PHB`, same PCIe host bridge.
    HostBridge = 3,
    /// `4`: `PXB`, several PCIe switches apart.
    MultiSwitch = 4,
    /// `5`: `PIX`, behind one PCIe switch.
    SingleSwitch = 5,
    /// `6`: on the same board.
    SameBoard = 6,
    /// `7`: one NVLink.
    SingleNvLink = 7,
    /// `8`: two NVLinks.
    TwoNvLinks = 8,
    /// `9`: three NVLinks.
    ThreeNvLinks = 9,
    /// `10`: four NVLinks.
    FourNvLinks = 10,
    /// `11`: five NVLinks.
    FiveNvLinks = 11,
    /// `12`: six NVLinks.
    SixNvLinks = 12,
    /// `13`: seven NVLinks.
    SevenNvLinks = 13,
    /// `14`: eight NVLinks.
    EightNvLinks = 14,
    /// `15`: nine NVLinks.
    NineNvLinks = 15,
    /// `16`: ten NVLinks.
    TenNvLinks = 16,
    /// `17`: eleven NVLinks.
    ElevenNvLinks = 17,
    /// `18`: twelve NVLinks.
    TwelveNvLinks = 18,
    /// `19`: thirteen NVLinks.
    ThirteenNvLinks = 19,
    /// `20`: fourteen NVLinks.
    FourteenNvLinks = 20,
    /// `21`: fifteen NVLinks.
    FifteenNvLinks = 21,
    /// `22`: sixteen NVLinks.
    SixteenNvLinks = 22,
    /// `23`: seventeen NVLinks.
    SeventeenNvLinks = 23,
    /// `24`: eighteen NVLinks.
    EighteenNvLinks = 24,
}

impl P2PLinkType {
    /// Every link type, in code order (`ALL[c]` has code `c`).
    pub const ALL: [P2PLinkType; 25] = [
        Self::Unknown,
        Self::CrossCpu,
        Self::SameCpu,
        Self::HostBridge,
        Self::MultiSwitch,
        Self::SingleSwitch,
        Self::SameBoard,
        Self::SingleNvLink,
        Self::TwoNvLinks,
        Self::ThreeNvLinks,
        Self::FourNvLinks,
        Self::FiveNvLinks,
        Self::SixNvLinks,
        Self::SevenNvLinks,
        Self::EightNvLinks,
        Self::NineNvLinks,
        Self::TenNvLinks,
        Self::ElevenNvLinks,
        Self::TwelveNvLinks,
        Self::ThirteenNvLinks,
        Self::FourteenNvLinks,
        Self::FifteenNvLinks,
        Self::SixteenNvLinks,
        Self::SeventeenNvLinks,
        Self::EighteenNvLinks,
    ];

    /// The most NVLinks a single code can express.
    pub const MAX_NVLINKS: u8 = 18;

    /// The contract's integer code.
    pub const fn code(self) -> u8 {
        self as u8
    }

    /// The link type with this code, if `code` is in `0..=24`.
    pub fn from_code(code: i64) -> Result<Self, InvalidLinkType> {
        usize::try_from(code).ok().and_then(|c| Self::ALL.get(c).copied()).ok_or(InvalidLinkType(code))
    }

    /// The link type for `count` NVLinks (`None` for 0; counts above 18 saturate at 18, as the producer does).
    pub fn nvlinks(count: u32) -> Option<Self> {
        if count == 0 {
            return None;
        }
        let k = count.min(u32::from(Self::MAX_NVLINKS)) as usize;
        Self::ALL.get(6 + k).copied()
    }

    /// Number of NVLinks this code stands for (0 for the PCIe / board levels and unknown).
    pub const fn nvlink_count(self) -> u8 {
        let c = self as u8;
        c.saturating_sub(6)
    }

    /// Whether this is an NVLink code (`7..=24`).
    pub const fn is_nvlink(self) -> bool {
        self.nvlink_count() > 0
    }

    /// The go-gpuallocator best-effort link weight: SYS 10, NODE 20, PHB 30, PXB 40, PIX 50, same board 60,
    /// `k` NVLinks `100·k`, unknown 0.
    pub const fn weight(self) -> u64 {
        match self {
            Self::Unknown => 0,
            Self::CrossCpu => 10,
            Self::SameCpu => 20,
            Self::HostBridge => 30,
            Self::MultiSwitch => 40,
            Self::SingleSwitch => 50,
            Self::SameBoard => 60,
            other => 100 * other.nvlink_count() as u64,
        }
    }

    /// The contract's (vgpu-manager / NVML) name of this code, e.g. `P2PLinkCrossCPU`, `TwoNVLINKLinks`.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Unknown => "P2PLinkUnknown",
            Self::CrossCpu => "P2PLinkCrossCPU",
            Self::SameCpu => "P2PLinkSameCPU",
            Self::HostBridge => "P2PLinkHostBridge",
            Self::MultiSwitch => "P2PLinkMultiSwitch",
            Self::SingleSwitch => "P2PLinkSingleSwitch",
            Self::SameBoard => "P2PLinkSameBoard",
            Self::SingleNvLink => "SingleNVLINKLink",
            Self::TwoNvLinks => "TwoNVLINKLinks",
            Self::ThreeNvLinks => "ThreeNVLINKLinks",
            Self::FourNvLinks => "FourNVLINKLinks",
            Self::FiveNvLinks => "FiveNVLINKLinks",
            Self::SixNvLinks => "SixNVLINKLinks",
            Self::SevenNvLinks => "SevenNVLINKLinks",
            Self::EightNvLinks => "EightNVLINKLinks",
            Self::NineNvLinks => "NineNVLINKLinks",
            Self::TenNvLinks => "TenNVLINKLinks",
            Self::ElevenNvLinks => "ElevenNVLINKLinks",
            Self::TwelveNvLinks => "TwelveNVLINKLinks",
            Self::ThirteenNvLinks => "ThirteenNVLINKLinks",
            Self::FourteenNvLinks => "FourteenNVLINKLinks",
            Self::FifteenNvLinks => "FifteenNVLINKLinks",
            Self::SixteenNvLinks => "SixteenNVLINKLinks",
            Self::SeventeenNvLinks => "SeventeenNVLINKLinks",
            Self::EighteenNvLinks => "EighteenNVLINKLinks",
        }
    }

    /// The `nvidia-smi topo -m` abbreviation: `SYS`, `NODE`, `PHB`, `PXB`, `PIX`, `BOARD`, `NV<k>`; `X` unknown.
    pub fn short_name(self) -> String {
        match self {
            Self::Unknown => "X".to_owned(),
            Self::CrossCpu => "SYS".to_owned(),
            Self::SameCpu => "NODE".to_owned(),
            Self::HostBridge => "PHB".to_owned(),
            Self::MultiSwitch => "PXB".to_owned(),
            Self::SingleSwitch => "PIX".to_owned(),
            Self::SameBoard => "BOARD".to_owned(),
            other => format!("NV{}", other.nvlink_count()),
        }
    }
}

impl fmt::Display for P2PLinkType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl From<P2PLinkType> for u8 {
    fn from(value: P2PLinkType) -> Self {
        value.code()
    }
}

impl TryFrom<i64> for P2PLinkType {
    type Error = InvalidLinkType;
    fn try_from(value: i64) -> Result<Self, Self::Error> {
        Self::from_code(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_weights() {
        for (c, t) in P2PLinkType::ALL.iter().enumerate() {
            assert_eq!(usize::from(t.code()), c);
            assert_eq!(P2PLinkType::from_code(c as i64), Ok(*t));
        }
        assert_eq!(P2PLinkType::from_code(25), Err(InvalidLinkType(25)));
        assert_eq!(P2PLinkType::from_code(-1), Err(InvalidLinkType(-1)));
        let w: Vec<u64> = P2PLinkType::ALL.iter().map(|t| t.weight()).collect();
        assert_eq!(&w[..8], &[0, 10, 20, 30, 40, 50, 60, 100]);
        assert_eq!(P2PLinkType::EighteenNvLinks.weight(), 1800);
        assert_eq!(P2PLinkType::TwoNvLinks.short_name(), "NV2");
        assert_eq!(P2PLinkType::CrossCpu.to_string(), "P2PLinkCrossCPU");
        assert_eq!(P2PLinkType::nvlinks(0), None);
        assert_eq!(P2PLinkType::nvlinks(2), Some(P2PLinkType::TwoNvLinks));
        assert_eq!(P2PLinkType::nvlinks(40), Some(P2PLinkType::EighteenNvLinks));
    }
}
