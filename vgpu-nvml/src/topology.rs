//! GPU-to-GPU links as the contract's P2P link codes, computed from recorded facts (pure, no NVML).
//!
//! The NVML backend records, per GPU, its PCI bus id and each active NVLink's remote end ([`NvLinkEnd`]),
//! and asks NVML for the PCIe common ancestor of every pair ([`PcieLevel`]); [`build_matrix`] turns that into
//! a [`LinkMatrix`] the way vgpu-manager's `pkg/device/gpuallocator/links/device.go` does (contract §2):
//!
//! * the PCIe entry is the code of the common-ancestor level (`SYS` 1, `NODE` 2, `PHB` 3, `PXB` 4, `PIX` 5,
//!   same board 6), omitted when unknown;
//! * the NVLink entry is `6 + k` for `k` = the number of GPU `a`'s active links whose remote PCI bus id is GPU
//!   `b` (saturating at 18 links); when that is 0 and both GPUs have active links to an NVSwitch,
//!   `k = min(switch links of a, switch links of b)` (the NVSwitch rule);
//! * a pair's list is `[pcie, nvlink]`, PCIe first, unknown entries left out.
//!
//! The codes are those of `vgpu_core::backend::links` (and of `vgpu_core::topology::P2PLinkType`, same
//! numbering).
//!
//! ```
//! use vgpu_nvml::topology::{NvLinkEnd, PcieLevel, RemoteKind, build_matrix, topo_label};
//!
//! let bus = ["0000:18:00.0".to_owned(), "0000:2a:00.0".to_owned()];
//! let switch = |n: usize| vec![NvLinkEnd { remote_bus_id: "0000:c0:00.0".into(), remote: RemoteKind::Switch }; n];
//! let links = [switch(18), switch(18)];
//! let matrix = build_matrix(&bus, &links, |_, _| Some(PcieLevel::Node));
//! assert_eq!(matrix.links(0, 1), &[2, 24]); // NODE + 18 NVLinks through NVSwitch
//! assert_eq!(topo_label(matrix.links(0, 1)), "NV18");
//! ```

use vgpu_core::{
    backend::links::{self, LinkCode, LinkMatrix},
    discovery::PciAddress,
};

/// The PCIe common ancestor of two GPUs (NVML's `nvmlGpuTopologyLevel_t`, MXSML's PCIe levels).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PcieLevel {
    /// On the same board (`NVML_TOPOLOGY_INTERNAL`).
    Internal,
    /// Behind one PCIe switch (`PIX`).
    Single,
    /// Behind several PCIe switches, no host bridge (`PXB`).
    Multiple,
    /// Through one host bridge (`PHB`).
    HostBridge,
    /// Same NUMA node, several host bridges (`NODE`).
    Node,
    /// Across CPU sockets (`SYS`).
    System,
}

impl PcieLevel {
    /// The P2P link code of the level.
    pub fn code(self) -> LinkCode {
        match self {
            Self::Internal => links::LINK_SAME_BOARD,
            Self::Single => links::LINK_SINGLE_SWITCH,
            Self::Multiple => links::LINK_MULTI_SWITCH,
            Self::HostBridge => links::LINK_HOST_BRIDGE,
            Self::Node => links::LINK_SAME_CPU,
            Self::System => links::LINK_CROSS_CPU,
        }
    }

    /// The level of a NUMA comparison, when nothing better is known: same node `NODE`, different `SYS`,
    /// `None` when either is unknown.
    pub fn from_numa(a: Option<u32>, b: Option<u32>) -> Option<Self> {
        Some(if a? == b? { Self::Node } else { Self::System })
    }
}

/// What the remote end of an NVLink is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RemoteKind {
    /// A GPU.
    Gpu,
    /// An NVSwitch.
    Switch,
    /// Something else (an IBM NPU, a CPU).
    Other,
    /// Not known.
    Unknown,
}

/// One active NVLink of a GPU.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct NvLinkEnd {
    /// The remote PCI bus id, normalised with [`normalize_bus_id`] (or as reported when it does not parse).
    pub remote_bus_id: String,
    /// The remote device kind.
    pub remote: RemoteKind,
}

/// PCI vendor id of NVIDIA.
const NVIDIA_VENDOR: u16 = 0x10de;

/// Decides the remote kind of a link.
///
/// `reported` is what the driver says (`nvmlDeviceGetNvLinkRemoteDeviceType`); nvml-wrapper 0.13 always
/// returns `Unknown` there (it writes the answer into a temporary), so when the report is `Unknown` the kind is
/// inferred: a remote bus id that is one of the node's GPUs is a GPU; any other NVIDIA PCI function (vendor id
/// `0x10de` in the low 16 bits of the remote `pci_device_id`) is an NVSwitch; anything else stays unknown.
pub fn classify_remote(
    reported: RemoteKind,
    remote_bus_id: &str,
    remote_pci_device_id: u32,
    gpu_bus_ids: &[String],
) -> RemoteKind {
    if reported != RemoteKind::Unknown {
        return reported;
    }
    if gpu_bus_ids.iter().any(|b| b == remote_bus_id) {
        RemoteKind::Gpu
    } else if remote_pci_device_id & 0xffff == u32::from(NVIDIA_VENDOR) {
        RemoteKind::Switch
    } else {
        RemoteKind::Unknown
    }
}

/// Normalises a PCI bus id to `dddd:bb:dd.f`, lower case (NVML writes `00000000:18:00.0`); `None` when it
/// is not a PCI address.
///
/// ```
/// assert_eq!(vgpu_nvml::topology::normalize_bus_id("00000000:1A:00.0").as_deref(), Some("0000:1a:00.0"));
/// assert_eq!(vgpu_nvml::topology::normalize_bus_id("GPU-1"), None);
/// ```
pub fn normalize_bus_id(bus_id: &str) -> Option<String> {
    bus_id.trim().trim_end_matches('\0').parse::<PciAddress>().ok().map(|a| a.to_string())
}

/// The number of `links` whose remote end is the GPU at `peer_bus_id`.
pub fn nvlinks_to(links: &[NvLinkEnd], peer_bus_id: &str) -> u32 {
    let count =
        links.iter().filter(|l| l.remote != RemoteKind::Switch && l.remote_bus_id == peer_bus_id).count();
    u32::try_from(count).unwrap_or(u32::MAX)
}

/// The number of `links` that end at an NVSwitch.
pub fn switch_links(links: &[NvLinkEnd]) -> u32 {
    let count = links.iter().filter(|l| l.remote == RemoteKind::Switch).count();
    u32::try_from(count).unwrap_or(u32::MAX)
}

/// The NVLink code from GPU `a` (links `a_links`) to GPU `b` (bus id `b_bus_id`, links `b_links`): direct
/// links first, else the NVSwitch rule; `None` when there is no NVLink path.
pub fn nvlink_code(a_links: &[NvLinkEnd], b_bus_id: &str, b_links: &[NvLinkEnd]) -> Option<LinkCode> {
    let mut count = nvlinks_to(a_links, b_bus_id);
    if count == 0 {
        let (sa, sb) = (switch_links(a_links), switch_links(b_links));
        if sa > 0 && sb > 0 {
            count = sa.min(sb);
        }
    }
    let saturated = u8::try_from(count.min(u32::from(links::MAX_NVLINKS))).unwrap_or(links::MAX_NVLINKS);
    links::nvlinks(saturated)
}

/// Builds the link matrix of GPUs with these (normalised) bus ids and active NVLinks; `pcie(i, j)` gives
/// the PCIe common ancestor of a pair (`None` when unknown). Pairs are computed once, from the lower index.
pub fn build_matrix(
    bus_ids: &[String],
    nvlinks: &[Vec<NvLinkEnd>],
    mut pcie: impl FnMut(usize, usize) -> Option<PcieLevel>,
) -> LinkMatrix {
    let n = bus_ids.len();
    let mut matrix = LinkMatrix::new(n);
    let none: &[NvLinkEnd] = &[];
    for i in 0..n {
        for j in (i + 1)..n {
            let mut cell = Vec::with_capacity(2);
            if let Some(level) = pcie(i, j) {
                cell.push(level.code());
            }
            let a = nvlinks.get(i).map_or(none, Vec::as_slice);
            let b = nvlinks.get(j).map_or(none, Vec::as_slice);
            if let Some(code) = bus_ids.get(j).and_then(|bus| nvlink_code(a, bus, b)) {
                cell.push(code);
            }
            matrix.set_pair(i, j, cell);
        }
    }
    matrix
}

/// The `nvidia-smi topo -m` letters of a pair's links: the NVLink entry if any (`NV#`), else the PCIe level
/// (`PIX`, `PXB`, `PHB`, `NODE`, `SYS`, `BOARD`), else `N/A`.
pub fn topo_label(cell: &[LinkCode]) -> String {
    let nvlink = cell.iter().copied().filter(|c| *c > links::LINK_SAME_BOARD).max();
    let pcie =
        cell.iter().copied().filter(|c| (links::LINK_CROSS_CPU..=links::LINK_SAME_BOARD).contains(c)).max();
    match nvlink.or(pcie) {
        Some(code) => links::link_name(code),
        None => "N/A".to_owned(),
    }
}

/// Renders a matrix as `nvidia-smi topo -m` does: a header row `GPU0 GPU1 ...`, one row per GPU, `X` on the
/// diagonal, columns padded to the widest label.
pub fn render_topo(matrix: &LinkMatrix) -> String {
    let n = matrix.len();
    let labels: Vec<Vec<String>> = (0..n)
        .map(|i| {
            (0..n).map(|j| if i == j { "X".to_owned() } else { topo_label(matrix.links(i, j)) }).collect()
        })
        .collect();
    let heads: Vec<String> = (0..n).map(|i| format!("GPU{i}")).collect();
    let width = labels.iter().flatten().chain(&heads).map(String::len).max().unwrap_or(1);
    let mut out = format!("{:<width$}", "");
    for head in &heads {
        out.push_str(&format!("  {head:<width$}"));
    }
    out = out.trim_end().to_owned();
    out.push('\n');
    for (head, row) in heads.iter().zip(&labels) {
        let mut line = format!("{head:<width$}");
        for label in row {
            line.push_str(&format!("  {label:<width$}"));
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out.push_str("\nLegend: X = self, SYS = across CPU sockets, NODE = same NUMA node, PHB = PCIe host bridge, PXB = several PCIe bridges, PIX = one PCIe bridge, BOARD = same board, NV# = # NVLinks\n");
    out
}

/// The P2P code of an MXSML topology level (`mxSmlGpuTopologyLevel_t`): the PCIe levels as for NVML,
/// `METAXLINK` (5) as one link (code 7, shown `NV1`), `SYSTEM` (6) and `ETH` (7) as `SYS`, anything else
/// unknown (`None`). The MetaXLink mapping is an assumption: the level says "connected by MetaXLink" without a
/// link count.
pub fn metax_level_code(level: u32) -> Option<LinkCode> {
    match level {
        0 => Some(PcieLevel::Internal.code()),
        1 => Some(PcieLevel::Single.code()),
        2 => Some(PcieLevel::Multiple.code()),
        3 => Some(PcieLevel::HostBridge.code()),
        4 => Some(PcieLevel::Node.code()),
        5 => links::nvlinks(1),
        6 | 7 => Some(PcieLevel::System.code()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn end(bus: &str, remote: RemoteKind) -> NvLinkEnd {
        NvLinkEnd { remote_bus_id: bus.to_owned(), remote }
    }

    fn buses(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("0000:{:02x}:00.0", i + 1)).collect()
    }

    #[test]
    fn levels_map_to_contract_codes() {
        let codes: Vec<u8> = [
            PcieLevel::System,
            PcieLevel::Node,
            PcieLevel::HostBridge,
            PcieLevel::Multiple,
            PcieLevel::Single,
            PcieLevel::Internal,
        ]
        .iter()
        .map(|l| l.code())
        .collect();
        assert_eq!(codes, vec![1, 2, 3, 4, 5, 6]);
        assert_eq!(PcieLevel::from_numa(Some(0), Some(0)), Some(PcieLevel::Node));
        assert_eq!(PcieLevel::from_numa(Some(0), Some(1)), Some(PcieLevel::System));
        assert_eq!(PcieLevel::from_numa(None, Some(1)), None);
    }

    #[test]
    fn direct_nvlinks_dgx1_like() {
        // GPU0 has 2 links to GPU1 and 1 to GPU2; GPU1 has 2 links back.
        let bus = buses(3);
        let links = vec![
            vec![end(&bus[1], RemoteKind::Gpu), end(&bus[1], RemoteKind::Gpu), end(&bus[2], RemoteKind::Gpu)],
            vec![end(&bus[0], RemoteKind::Gpu), end(&bus[0], RemoteKind::Gpu)],
            vec![end(&bus[0], RemoteKind::Gpu)],
        ];
        let m = build_matrix(&bus, &links, |i, j| {
            Some(if i / 2 == j / 2 { PcieLevel::Single } else { PcieLevel::System })
        });
        assert_eq!(m.links(0, 1), &[5, 8]);
        assert_eq!(m.links(1, 0), &[5, 8]);
        assert_eq!(m.links(0, 2), &[1, 7]);
        assert_eq!(m.links(1, 2), &[1]);
        assert_eq!(topo_label(m.links(1, 2)), "SYS");
        assert_eq!(topo_label(m.links(0, 1)), "NV2");
    }

    #[test]
    fn nvswitch_rule_uses_min_of_switch_links() {
        let bus = buses(3);
        let sw = |n: usize| vec![end("0000:c0:00.0", RemoteKind::Switch); n];
        let links = vec![sw(12), sw(6), vec![]];
        let m = build_matrix(&bus, &links, |_, _| None);
        assert_eq!(m.links(0, 1), &[6 + 6]);
        assert_eq!(m.links(0, 2), &[] as &[u8]);
        assert_eq!(topo_label(m.links(0, 2)), "N/A");
        // Direct links win over the switch rule.
        let mixed = [vec![end(&bus[1], RemoteKind::Gpu), end("0000:c0:00.0", RemoteKind::Switch)], sw(4)];
        assert_eq!(nvlink_code(&mixed[0], &bus[1], &mixed[1]), Some(7));
    }

    #[test]
    fn counts_saturate_at_18() {
        let links: Vec<NvLinkEnd> = (0..30).map(|_| end("0000:02:00.0", RemoteKind::Gpu)).collect();
        assert_eq!(nvlink_code(&links, "0000:02:00.0", &[]), Some(24));
    }

    #[test]
    fn remote_classification() {
        let gpus = buses(2);
        assert_eq!(classify_remote(RemoteKind::Unknown, &gpus[1], 0x2330_10de, &gpus), RemoteKind::Gpu);
        assert_eq!(
            classify_remote(RemoteKind::Unknown, "0000:c0:00.0", 0x22a3_10de, &gpus),
            RemoteKind::Switch
        );
        assert_eq!(
            classify_remote(RemoteKind::Unknown, "0000:c0:00.0", 0x04ea_1014, &gpus),
            RemoteKind::Unknown
        );
        assert_eq!(classify_remote(RemoteKind::Other, &gpus[1], 0, &gpus), RemoteKind::Other);
    }

    #[test]
    fn render_like_nvidia_smi() {
        let bus = buses(2);
        let m = build_matrix(&bus, &[vec![end(&bus[1], RemoteKind::Gpu)], vec![]], |_, _| {
            Some(PcieLevel::HostBridge)
        });
        let text = render_topo(&m);
        let mut lines = text.lines();
        assert_eq!(lines.next(), Some("      GPU0  GPU1"));
        assert_eq!(lines.next(), Some("GPU0  X     NV1"));
        assert_eq!(lines.next(), Some("GPU1  NV1   X"));
    }

    #[test]
    fn metax_levels() {
        assert_eq!(
            (0..=8).map(metax_level_code).collect::<Vec<_>>(),
            vec![Some(6), Some(5), Some(4), Some(3), Some(2), Some(7), Some(1), Some(1), None]
        );
    }

    proptest! {
        #[test]
        fn matrix_is_symmetric_and_well_formed(
            n in 1usize..7,
            raw in prop::collection::vec(prop::collection::vec((0usize..8, any::<bool>()), 0..20), 7),
            levels in prop::collection::vec(0u8..7, 49),
        ) {
            let bus = buses(n);
            let links: Vec<Vec<NvLinkEnd>> = raw.iter().take(n).map(|ends| ends.iter().map(|(peer, switch)| {
                if *switch { end("0000:f0:00.0", RemoteKind::Switch) } else { end(&format!("0000:{:02x}:00.0", peer + 1), RemoteKind::Gpu) }
            }).collect()).collect();
            let all = [PcieLevel::Internal, PcieLevel::Single, PcieLevel::Multiple, PcieLevel::HostBridge, PcieLevel::Node, PcieLevel::System];
            let m = build_matrix(&bus, &links, |i, j| all.get(usize::from(levels[i * 7 + j])).copied());
            prop_assert_eq!(m.len(), n);
            for i in 0..n {
                prop_assert!(m.links(i, i).is_empty());
                for j in 0..n {
                    prop_assert_eq!(m.links(i, j), m.links(j, i));
                    let cell = m.links(i, j);
                    prop_assert!(cell.len() <= 2);
                    prop_assert!(cell.iter().all(|c| (1..=24).contains(c)));
                    if let [p, v] = cell { prop_assert!(*p <= 6 && *v >= 7); }
                }
            }
        }

        #[test]
        fn normalize_never_panics(s in ".{0,40}") {
            if let Some(n) = normalize_bus_id(&s) {
                prop_assert_eq!(normalize_bus_id(&n), Some(n.clone()));
            }
        }
    }
}
