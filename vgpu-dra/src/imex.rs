//! IMEX pieces (gate `IMEXDaemonsWithDNSNames`, Beta, default on): the IMEX channel devices a node has, and
//! the IMEX daemon's nodes config, whose peers are stable DNS names (gate on) or raw IPs (gate off), as the
//! upstream NVIDIA DRA driver's `compute-domain-daemon` writes it.
//!
//! | what | where / format |
//! |---|---|
//! | channel major | `/proc/devices`, `Character devices:` section, line `<major> nvidia-caps-imex-channels` ([`channels_major`]) |
//! | channel nodes | `<root>/dev/nvidia-caps-imex-channels/channel<N>` ([`discover_channels`], [`channel_edits`]) |
//! | nodes config, gate on | `compute-domain-daemon-0000` … `compute-domain-daemon-<max-1>`, one per line, static ([`nodes_config`]) |
//! | nodes config, gate off | the IPs of the peers in this node's clique, one per line, in peer order |
//! | hosts file, gate on | every other line kept, then `# Compute Domain Daemon mappings` and `<ip>\t<dns name>` per peer of the clique, sorted by name ([`hosts_file`]) |
//!
//! With DNS names the daemons' config never changes when a peer's pod IP does: only the hosts file is
//! rewritten (and the daemon need not restart), which is why upstream made it the default.
//!
//! **Not built here**: the ComputeDomain CRD, its controller, the per-domain daemon DaemonSet and the
//! `compute-domain` kubelet plugin that hands channels to workloads. This driver publishes no compute
//! domains; this module is the tested groundwork (discovery, the two config formats, atomic writes) they
//! would use.
//!
//! ```
//! use vgpu_dra::imex::{ImexPeer, dns_name, nodes_config};
//!
//! let peers = [ImexPeer { index: 1, ip: "10.0.0.2".parse().unwrap(), clique: "c".into() }];
//! assert_eq!(dns_name(7), "compute-domain-daemon-0007");
//! assert_eq!(nodes_config(&peers, "c", true, 2)?, "compute-domain-daemon-0000\ncompute-domain-daemon-0001\n");
//! assert_eq!(nodes_config(&peers, "c", false, 2)?, "10.0.0.2\n");
//! # Ok::<(), vgpu_dra::imex::ImexError>(())
//! ```

use std::{
    collections::BTreeMap,
    net::IpAddr,
    path::{Path, PathBuf},
};

use vgpu_core::cdi::{ContainerEdits, DeviceNode};

/// The character device name of IMEX channels in `/proc/devices`.
pub const CHANNELS_DEVICE_NAME: &str = "nvidia-caps-imex-channels";
/// The directory of the channel device nodes.
pub const CHANNEL_DIR: &str = "/dev/nvidia-caps-imex-channels";
/// The prefix of the daemons' DNS names.
pub const DNS_NAME_PREFIX: &str = "compute-domain-daemon-";
/// The comment line before the mappings in the hosts file.
pub const HOSTS_HEADER: &str = "# Compute Domain Daemon mappings";

/// Something about IMEX could not be read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ImexError {
    /// A file could not be read or written.
    #[error("{path}: {action}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What was being done.
        action: &'static str,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A peer's index does not fit the domain.
    #[error("IMEX peer {ip} has index {index}, but a domain has at most {max} nodes (indices 0..{max})")]
    Index {
        /// The peer's IP.
        ip: IpAddr,
        /// Its index.
        index: u32,
        /// The domain's size.
        max: u32,
    },
    /// Two peers of one clique have the same index.
    #[error("IMEX peers {first} and {second} both have index {index}")]
    DuplicateIndex {
        /// The index.
        index: u32,
        /// One peer.
        first: IpAddr,
        /// The other.
        second: IpAddr,
    },
}

/// `compute-domain-daemon-<index, 4 digits>`.
pub fn dns_name(index: u32) -> String {
    format!("{DNS_NAME_PREFIX}{index:04}")
}

/// The container path of channel `id`.
pub fn channel_path(id: u32) -> String {
    format!("{CHANNEL_DIR}/channel{id}")
}

/// The major number of `name` in the `Character devices:` section of a `/proc/devices` text.
pub fn parse_device_major(proc_devices: &str, name: &str) -> Option<u32> {
    let mut in_char = false;
    for line in proc_devices.lines() {
        let line = line.trim();
        if line.ends_with(':') {
            in_char = line == "Character devices:";
            continue;
        }
        if !in_char {
            continue;
        }
        let mut parts = line.split_whitespace();
        if let (Some(major), Some(dev), None) = (parts.next(), parts.next(), parts.next())
            && dev == name
        {
            return major.parse().ok();
        }
    }
    None
}

/// The IMEX channels' major from `<proc_root>/devices` (`None`: the driver does not register them).
pub fn channels_major(proc_root: &Path) -> Result<Option<u32>, ImexError> {
    let path = proc_root.join("devices");
    let text =
        std::fs::read_to_string(&path).map_err(|source| ImexError::Io { path, action: "read", source })?;
    Ok(parse_device_major(&text, CHANNELS_DEVICE_NAME))
}

/// The channel ids whose nodes exist under `root` (`<root>/dev/nvidia-caps-imex-channels/channel<N>`),
/// sorted; a missing directory is no channel.
pub fn discover_channels(root: &Path) -> Vec<u32> {
    let dir = root.join(CHANNEL_DIR.trim_start_matches('/'));
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut ids: Vec<u32> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.strip_prefix("channel")?.parse().ok())
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// CDI edits that give a container channels `ids`, their host nodes under `host_driver_root`.
pub fn channel_edits(ids: &[u32], host_driver_root: &Path) -> ContainerEdits {
    ContainerEdits {
        device_nodes: ids.iter().map(|id| DeviceNode::under(&channel_path(*id), host_driver_root)).collect(),
        ..ContainerEdits::default()
    }
}

/// One IMEX daemon of a compute domain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImexPeer {
    /// Its index in the domain (its DNS name's number).
    pub index: u32,
    /// Its pod IP.
    pub ip: IpAddr,
    /// Its NVLink clique (only peers of this node's clique are listed).
    pub clique: String,
}

/// The peers of `clique`, each index in `0..max_nodes` and unique, by index.
fn clique_peers<'a>(
    peers: &'a [ImexPeer],
    clique: &str,
    max_nodes: u32,
) -> Result<BTreeMap<u32, &'a ImexPeer>, ImexError> {
    let mut by_index = BTreeMap::new();
    for p in peers.iter().filter(|p| p.clique == clique) {
        if p.index >= max_nodes {
            return Err(ImexError::Index { ip: p.ip, index: p.index, max: max_nodes });
        }
        if let Some(first) = by_index.insert(p.index, p) {
            return Err(ImexError::DuplicateIndex { index: p.index, first: first.ip, second: p.ip });
        }
    }
    Ok(by_index)
}

/// The IMEX daemon's nodes config: with `dns_names` (gate on) the static names of every slot of the domain,
/// otherwise the IPs of the clique's peers in the given order.
pub fn nodes_config(
    peers: &[ImexPeer],
    clique: &str,
    dns_names: bool,
    max_nodes: u32,
) -> Result<String, ImexError> {
    let members = clique_peers(peers, clique, max_nodes)?;
    let mut out = String::new();
    if dns_names {
        for i in 0..max_nodes {
            out.push_str(&dns_name(i));
            out.push('\n');
        }
    } else {
        for p in peers.iter().filter(|p| p.clique == clique && members.contains_key(&p.index)) {
            out.push_str(&p.ip.to_string());
            out.push('\n');
        }
    }
    Ok(out)
}

/// The hosts file with the clique's peers mapped to their DNS names: lines naming a daemon are replaced,
/// every other line is kept in order.
pub fn hosts_file(
    existing: &str,
    peers: &[ImexPeer],
    clique: &str,
    max_nodes: u32,
) -> Result<String, ImexError> {
    let members = clique_peers(peers, clique, max_nodes)?;
    let mut out = String::new();
    for line in existing.lines() {
        if line.contains(DNS_NAME_PREFIX) || line.trim() == HOSTS_HEADER {
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out.push_str(HOSTS_HEADER);
    out.push('\n');
    for (index, p) in members {
        out.push_str(&format!("{}\t{}\n", p.ip, dns_name(index)));
    }
    Ok(out)
}

/// Writes the nodes config (and, with DNS names, the hosts file) atomically; returns whether either changed.
#[derive(Debug, Clone)]
pub struct NodesConfigWriter {
    /// Gate `IMEXDaemonsWithDNSNames`.
    pub dns_names: bool,
    /// The most nodes a domain has (upstream `--max-nodes-per-imex-domain`).
    pub max_nodes: u32,
    /// The daemon's nodes config file (upstream `/imexd/nodes.cfg`).
    pub nodes_config: PathBuf,
    /// The hosts file the daemon resolves names with (`/etc/hosts` in its container).
    pub hosts: PathBuf,
}

impl NodesConfigWriter {
    /// Brings both files up to date for `clique`'s peers.
    pub fn update(&self, peers: &[ImexPeer], clique: &str) -> Result<bool, ImexError> {
        let mut changed = write_if_changed(
            &self.nodes_config,
            &nodes_config(peers, clique, self.dns_names, self.max_nodes)?,
        )?;
        if self.dns_names {
            let existing = match std::fs::read_to_string(&self.hosts) {
                Ok(text) => text,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
                Err(source) => {
                    return Err(ImexError::Io { path: self.hosts.clone(), action: "read", source });
                }
            };
            changed |= write_if_changed(&self.hosts, &hosts_file(&existing, peers, clique, self.max_nodes)?)?;
        }
        Ok(changed)
    }
}

fn write_if_changed(path: &Path, text: &str) -> Result<bool, ImexError> {
    if std::fs::read_to_string(path).is_ok_and(|old| old == text) {
        return Ok(false);
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|source| ImexError::Io {
            path: dir.to_path_buf(),
            action: "create directory",
            source,
        })?;
    }
    vgpu_core::abi::atomic::write_atomic(path, text.as_bytes(), 0o644).map_err(|e| ImexError::Io {
        path: path.to_path_buf(),
        action: "write atomically",
        source: std::io::Error::other(e.to_string()),
    })?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use proptest::prelude::*;

    use super::*;

    const PROC_DEVICES: &str = "Character devices:\n  1 mem\n195 nvidia-frontend\n234 nvidia-caps-imex-channels\n509 nvidia-caps\n\nBlock devices:\n  7 loop\n259 nvidia-caps-imex-channels\n";

    fn peer(index: u32, ip: &str, clique: &str) -> ImexPeer {
        ImexPeer { index, ip: ip.parse().unwrap(), clique: clique.into() }
    }

    #[test]
    fn the_major_comes_from_the_character_section_only() {
        assert_eq!(parse_device_major(PROC_DEVICES, CHANNELS_DEVICE_NAME), Some(234));
        assert_eq!(parse_device_major(PROC_DEVICES, "loop"), None, "block devices are not looked at");
        assert_eq!(parse_device_major("Character devices:\n195 nvidia\n", CHANNELS_DEVICE_NAME), None);
        let dir = tempfile::tempdir().unwrap();
        assert!(channels_major(dir.path()).unwrap_err().to_string().contains("devices: read"));
        std::fs::write(dir.path().join("devices"), PROC_DEVICES).unwrap();
        assert_eq!(channels_major(dir.path()).unwrap(), Some(234));
    }

    #[test]
    fn channels_are_discovered_under_the_root_and_become_device_nodes() {
        let dir = tempfile::tempdir().unwrap();
        assert!(discover_channels(dir.path()).is_empty());
        let channels = dir.path().join("dev/nvidia-caps-imex-channels");
        std::fs::create_dir_all(&channels).unwrap();
        for name in ["channel10", "channel0", "channelx", "other"] {
            std::fs::write(channels.join(name), "").unwrap();
        }
        let ids = discover_channels(dir.path());
        assert_eq!(ids, [0, 10]);
        let edits = channel_edits(&ids, Path::new("/run/nvidia/driver"));
        assert_eq!(edits.device_nodes[1].path, "/dev/nvidia-caps-imex-channels/channel10");
        assert_eq!(
            edits.device_nodes[1].host_path,
            "/run/nvidia/driver/dev/nvidia-caps-imex-channels/channel10"
        );
    }

    #[test]
    fn nodes_config_lists_dns_names_with_the_gate_and_clique_ips_without() {
        let peers = [peer(2, "10.0.0.3", "c1"), peer(0, "10.0.0.1", "c1"), peer(0, "10.9.9.9", "c2")];
        assert_eq!(
            nodes_config(&peers, "c1", true, 3).unwrap(),
            "compute-domain-daemon-0000\ncompute-domain-daemon-0001\ncompute-domain-daemon-0002\n"
        );
        assert_eq!(nodes_config(&peers, "c1", false, 3).unwrap(), "10.0.0.3\n10.0.0.1\n");
        assert_eq!(
            nodes_config(&peers, "c1", false, 2).unwrap_err().to_string(),
            "IMEX peer 10.0.0.3 has index 2, but a domain has at most 2 nodes (indices 0..2)"
        );
        let dup = [peer(1, "10.0.0.1", "c"), peer(1, "fd00::2", "c")];
        assert!(nodes_config(&dup, "c", true, 4).unwrap_err().to_string().contains("both have index 1"));
    }

    #[test]
    fn hosts_file_keeps_other_lines_and_replaces_the_mappings() {
        let existing = "127.0.0.1\tlocalhost\n# Compute Domain Daemon mappings\n10.0.0.7\tcompute-domain-daemon-0000\n::1 ip6-localhost\n";
        let peers = [peer(1, "10.0.0.2", "c"), peer(0, "10.0.0.1", "c")];
        let text = hosts_file(existing, &peers, "c", 4).unwrap();
        assert_eq!(
            text,
            "127.0.0.1\tlocalhost\n::1 ip6-localhost\n# Compute Domain Daemon mappings\n10.0.0.1\tcompute-domain-daemon-0000\n10.0.0.2\tcompute-domain-daemon-0001\n"
        );
        assert_eq!(hosts_file(&text, &peers, "c", 4).unwrap(), text, "rewriting is stable");
    }

    #[test]
    fn the_writer_follows_the_gate_and_reports_changes() {
        let dir = tempfile::tempdir().unwrap();
        let hosts = dir.path().join("hosts");
        std::fs::write(&hosts, "127.0.0.1 localhost\n").unwrap();
        let on = NodesConfigWriter {
            dns_names: true,
            max_nodes: 2,
            nodes_config: dir.path().join("imexd/nodes.cfg"),
            hosts: hosts.clone(),
        };
        let mut peers = vec![peer(0, "10.0.0.1", "c"), peer(1, "10.0.0.2", "c")];
        assert!(on.update(&peers, "c").unwrap());
        assert!(!on.update(&peers, "c").unwrap(), "nothing new");
        let nodes = std::fs::read_to_string(&on.nodes_config).unwrap();
        // A peer's IP changes: only the hosts file follows, the nodes config stays.
        peers[1].ip = "10.0.0.9".parse().unwrap();
        assert!(on.update(&peers, "c").unwrap());
        assert_eq!(std::fs::read_to_string(&on.nodes_config).unwrap(), nodes);
        assert!(std::fs::read_to_string(&hosts).unwrap().contains("10.0.0.9\tcompute-domain-daemon-0001"));

        let off = NodesConfigWriter { dns_names: false, hosts: dir.path().join("untouched"), ..on.clone() };
        assert!(off.update(&peers, "c").unwrap());
        assert_eq!(std::fs::read_to_string(&off.nodes_config).unwrap(), "10.0.0.1\n10.0.0.9\n");
        assert!(!dir.path().join("untouched").exists(), "no hosts file without DNS names");
    }

    proptest! {
        #[test]
        fn proc_devices_parsing_never_panics_and_finds_what_is_written(text in "\\PC{0,200}", major in 0u32..4096) {
            let _ = parse_device_major(&text, CHANNELS_DEVICE_NAME);
            let written = format!("Character devices:\n{major} {CHANNELS_DEVICE_NAME}\n");
            prop_assert_eq!(parse_device_major(&written, CHANNELS_DEVICE_NAME), Some(major));
        }

        #[test]
        fn dns_nodes_config_has_every_slot(max in 1u32..64) {
            let text = nodes_config(&[], "c", true, max).unwrap();
            prop_assert_eq!(text.lines().count() as u32, max);
            prop_assert!(text.lines().all(|l| l.starts_with(DNS_NAME_PREFIX) && l.len() == DNS_NAME_PREFIX.len() + 4));
        }
    }
}
