//! A GPU-to-GPU link matrix as backends report it, coded with [`P2PLinkType`]'s integer codes.
//!
//! The codes and names come from [`crate::topology::P2PLinkType`] (the single source of truth);
//! [`LinkMatrix::to_device_topology`] turns a backend's matrix into the `node-device-topology` value.

use std::fmt;

use crate::topology::{DeviceTopology, GpuLinks, InvalidLinkType, P2PLinkType};

/// One link between two GPUs, coded as go-gpuallocator's `P2PLinkType` (`0` unknown, `1` SYS ... `6` same
/// board, `6 + k` for `k` NVLinks).
pub type LinkCode = u8;

/// No information.
pub const LINK_UNKNOWN: LinkCode = P2PLinkType::Unknown.code();
/// Across CPU sockets (`SYS`).
pub const LINK_CROSS_CPU: LinkCode = P2PLinkType::CrossCpu.code();
/// Same CPU socket / NUMA node, through the interconnect between PCIe host bridges (`NODE`).
pub const LINK_SAME_CPU: LinkCode = P2PLinkType::SameCpu.code();
/// Through a PCIe host bridge (`PHB`).
pub const LINK_HOST_BRIDGE: LinkCode = P2PLinkType::HostBridge.code();
/// Through several PCIe switches (`PXB`).
pub const LINK_MULTI_SWITCH: LinkCode = P2PLinkType::MultiSwitch.code();
/// Through one PCIe switch (`PIX`).
pub const LINK_SINGLE_SWITCH: LinkCode = P2PLinkType::SingleSwitch.code();
/// On the same board (`BOARD`).
pub const LINK_SAME_BOARD: LinkCode = P2PLinkType::SameBoard.code();
/// The largest NVLink count that can be coded.
pub const MAX_NVLINKS: u8 = P2PLinkType::MAX_NVLINKS;

/// The code of `count` NVLinks (1..=18), `None` outside that range (no saturation, unlike
/// [`P2PLinkType::nvlinks`]).
pub fn nvlinks(count: u8) -> Option<LinkCode> {
    if count > MAX_NVLINKS {
        return None;
    }
    P2PLinkType::nvlinks(u32::from(count)).map(P2PLinkType::code)
}

/// Parses an `nvidia-smi topo -m` style name: `SYS`, `NODE`, `PHB`, `PXB`, `PIX`, `BOARD`, `NV1`..`NV18`,
/// or `UNKNOWN` (case-insensitive).
///
/// ```
/// use vgpu_core::backend::links::{parse_link, link_name};
/// assert_eq!(parse_link("NV18").map(link_name), Some("NV18".to_owned()));
/// assert_eq!(parse_link("pix"), Some(5));
/// assert_eq!(parse_link("NV19"), None);
/// ```
pub fn parse_link(name: &str) -> Option<LinkCode> {
    let upper = name.trim().to_ascii_uppercase();
    match upper.as_str() {
        "UNKNOWN" => Some(LINK_UNKNOWN),
        "SYS" => Some(LINK_CROSS_CPU),
        "NODE" => Some(LINK_SAME_CPU),
        "PHB" => Some(LINK_HOST_BRIDGE),
        "PXB" => Some(LINK_MULTI_SWITCH),
        "PIX" => Some(LINK_SINGLE_SWITCH),
        "BOARD" => Some(LINK_SAME_BOARD),
        other => {
            let count = other.strip_prefix("NV")?;
            if count.is_empty() || !count.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            nvlinks(count.parse().ok()?)
        }
    }
}

/// The `nvidia-smi topo -m` style name of a code (`NV<k>` for NVLinks, `CODE<n>` past the known range).
pub fn link_name(code: LinkCode) -> String {
    match P2PLinkType::from_code(i64::from(code)) {
        Ok(P2PLinkType::Unknown) => "UNKNOWN".to_owned(),
        Ok(link) => link.short_name(),
        Err(_) => format!("CODE{code}"),
    }
}

/// The links between every pair of `n` GPUs (by device index): `links(i, j)` lists the links of the pair
/// (e.g. an NVLink bundle plus the PCIe path), symmetric, empty on the diagonal.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct LinkMatrix {
    links: Vec<Vec<Vec<LinkCode>>>,
}

impl LinkMatrix {
    /// A matrix for `n` GPUs with no links.
    pub fn new(n: usize) -> Self {
        Self { links: vec![vec![Vec::new(); n]; n] }
    }

    /// The number of GPUs.
    pub fn len(&self) -> usize {
        self.links.len()
    }

    /// Whether the matrix has no GPUs.
    pub fn is_empty(&self) -> bool {
        self.links.is_empty()
    }

    /// The links between GPUs `i` and `j` (empty when out of range or `i == j`).
    pub fn links(&self, i: usize, j: usize) -> &[LinkCode] {
        self.links.get(i).and_then(|row| row.get(j)).map_or(&[], Vec::as_slice)
    }

    /// Sets the links of the pair `(i, j)` in both directions. Returns `false` (and changes nothing) when an
    /// index is out of range or `i == j`.
    pub fn set_pair(&mut self, i: usize, j: usize, links: Vec<LinkCode>) -> bool {
        let n = self.len();
        if i == j || i >= n || j >= n {
            return false;
        }
        if let Some(cell) = self.links.get_mut(j).and_then(|row| row.get_mut(i)) {
            cell.clone_from(&links);
        }
        if let Some(cell) = self.links.get_mut(i).and_then(|row| row.get_mut(j)) {
            *cell = links;
        }
        true
    }

    /// The raw `[i][j] -> links` rows.
    pub fn rows(&self) -> &[Vec<Vec<LinkCode>>] {
        &self.links
    }

    /// The `node-device-topology` value of this matrix: per GPU, every peer with at least one link.
    /// Fails on a code outside `0..=24`.
    pub fn to_device_topology(&self) -> Result<DeviceTopology, InvalidLinkType> {
        let mut gpus = Vec::with_capacity(self.len());
        for (index, row) in self.links.iter().enumerate() {
            let mut gpu = GpuLinks { index, ..GpuLinks::default() };
            for (peer, cell) in row.iter().enumerate() {
                if peer == index || cell.is_empty() {
                    continue;
                }
                let links = cell
                    .iter()
                    .map(|c| P2PLinkType::from_code(i64::from(*c)))
                    .collect::<Result<Vec<_>, _>>()?;
                gpu.links.insert(peer, links);
            }
            gpus.push(gpu);
        }
        Ok(DeviceTopology { gpus })
    }
}

impl fmt::Display for LinkMatrix {
    /// An `nvidia-smi topo -m` like table (links joined with `+`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, row) in self.links.iter().enumerate() {
            write!(f, "GPU{i}")?;
            for (j, cell) in row.iter().enumerate() {
                let text = if i == j {
                    "X".to_owned()
                } else {
                    cell.iter().map(|c| link_name(*c)).collect::<Vec<_>>().join("+")
                };
                write!(f, "\t{text}")?;
            }
            writeln!(f)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for code in 0..=(LINK_SAME_BOARD + MAX_NVLINKS) {
            assert_eq!(parse_link(&link_name(code)), Some(code));
        }
        assert_eq!(link_name(200), "CODE200");
        for bad in ["", "NV", "NV0", "NV+1", "NVx", "nv019x", "ETH"] {
            assert_eq!(parse_link(bad), None, "{bad}");
        }
    }

    #[test]
    fn matrix_is_symmetric() {
        let mut m = LinkMatrix::new(3);
        assert!(m.set_pair(0, 2, vec![LINK_CROSS_CPU]));
        assert!(!m.set_pair(1, 1, vec![LINK_CROSS_CPU]));
        assert!(!m.set_pair(0, 3, vec![LINK_CROSS_CPU]));
        assert_eq!(m.links(2, 0), &[LINK_CROSS_CPU]);
        assert_eq!(m.links(5, 0), &[] as &[u8]);
        assert!(m.to_string().contains("GPU0\tX\t\tSYS"));
    }

    #[test]
    fn converts_to_the_topology_annotation() {
        let mut m = LinkMatrix::new(3);
        assert!(m.set_pair(0, 1, vec![LINK_SINGLE_SWITCH, nvlinks(2).unwrap()]));
        assert!(m.set_pair(1, 2, vec![LINK_CROSS_CPU]));
        let topo = m.to_device_topology().unwrap();
        assert_eq!(
            topo.encode(),
            r#"[{"index":0,"links":{"1":[5,8]}},{"index":1,"links":{"0":[5,8],"2":[1]}},{"index":2,"links":{"1":[1]}}]"#
        );
        assert_eq!(DeviceTopology::decode(&topo.encode()).unwrap(), topo);
        assert!(m.set_pair(0, 2, vec![99]));
        assert_eq!(m.to_device_topology(), Err(InvalidLinkType(99)));
    }
}
