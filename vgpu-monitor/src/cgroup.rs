//! Container PIDs from the cgroup hierarchy: `cgroup.procs` of the container's cgroup, found from the pod
//! UID, its QoS class and the container ID of the pod status.
//!
//! | hierarchy | driver | pod cgroup under the root |
//! |---|---|---|
//! | v2 (`<root>/cgroup.controllers` exists) | systemd | `kubepods.slice/[kubepods-<qos>.slice/]kubepods-[<qos>-]pod<uid with _>.slice` |
//! | v2 | cgroupfs | `kubepods/[<qos>/]pod<uid>` |
//! | v1 / hybrid | either | the same, under the `devices` controller (`<root>/devices/...`) |
//!
//! `<qos>` is `burstable` or `besteffort`; Guaranteed pods sit directly under `kubepods`. A kubelet with a
//! `cgroupRoot` of its own ([`CgroupLayout::kubelet_cgroup_root`]) puts `kubepods` under it: cgroupfs
//! `/node` → `node/kubepods/...`; systemd `/node.slice` (or `/a.slice/a-b.slice`) names every slice below it
//! with its prefix, as the kubelet does: `node.slice/node-kubepods.slice/node-kubepods-<qos>.slice/...`.
//! The container's cgroup is the child whose name holds the container ID (`cri-containerd-<id>.scope`,
//! `crio-<id>.scope`, `docker-<id>.scope` with systemd; `<id>` with cgroupfs). [`CgroupDriver::Auto`] tries
//! systemd, then cgroupfs. A container not found (not started yet, gone) has no PIDs; that is not an error.

use std::path::{Path, PathBuf};

use vgpu_core::node_config::CgroupDriver;

/// Where the cgroup hierarchy is and how kubelet names pod cgroups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupLayout {
    /// Mount point of the hierarchy (default `/sys/fs/cgroup`).
    pub root: PathBuf,
    /// `--cgroup-driver`.
    pub driver: CgroupDriver,
    /// The kubelet's `cgroupRoot` (`--kubelet-cgroup-root`): `/` (the default) or empty for the top of the
    /// hierarchy, else the cgroup `kubepods` sits under, in the driver's form (`/node` with cgroupfs,
    /// `/node.slice` with systemd).
    pub kubelet_cgroup_root: String,
}

impl Default for CgroupLayout {
    fn default() -> Self {
        Self {
            root: PathBuf::from("/sys/fs/cgroup"),
            driver: CgroupDriver::Auto,
            kubelet_cgroup_root: "/".into(),
        }
    }
}

/// A pod's Quality-of-Service class (`status.qosClass`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QosClass {
    /// Directly under `kubepods`.
    Guaranteed,
    /// Under `burstable`.
    Burstable,
    /// Under `besteffort`.
    BestEffort,
}

impl QosClass {
    /// From `status.qosClass` (missing or unknown: Burstable, the most common for GPU pods with limits only).
    pub fn parse(s: Option<&str>) -> Self {
        match s {
            Some("Guaranteed") => QosClass::Guaranteed,
            Some("BestEffort") => QosClass::BestEffort,
            _ => QosClass::Burstable,
        }
    }

    fn segment(self) -> Option<&'static str> {
        match self {
            QosClass::Guaranteed => None,
            QosClass::Burstable => Some("burstable"),
            QosClass::BestEffort => Some("besteffort"),
        }
    }
}

/// The ID part of a status `containerID` (`containerd://abc` → `abc`).
pub fn container_id(status_id: &str) -> &str {
    status_id.rsplit_once("://").map_or(status_id, |(_, id)| id)
}

impl CgroupLayout {
    /// The hierarchy is cgroup v2 (unified).
    pub fn is_v2(&self) -> bool {
        self.root.join("cgroup.controllers").is_file()
    }

    /// Candidate pod cgroup directories, in the order tried.
    pub fn pod_dirs(&self, pod_uid: &str, qos: QosClass) -> Vec<PathBuf> {
        let base = if self.is_v2() { self.root.clone() } else { self.root.join("devices") };
        let parent = self.kubelet_cgroup_root.trim_matches('/');
        let systemd = || {
            // The kubelet's systemd cgroup names: the components of the parent slice, then kubepods, the QoS
            // class and the pod, each level a slice named by every component so far joined with `-`.
            let mut names: Vec<String> = parent
                .rsplit('/')
                .next()
                .and_then(|last| last.strip_suffix(".slice"))
                .map(|last| last.split('-').map(str::to_owned).collect())
                .unwrap_or_default();
            let mut p = base.join(parent);
            let pod = format!("pod{}", pod_uid.replace('-', "_"));
            for name in ["kubepods"].into_iter().chain(qos.segment()).chain([pod.as_str()]) {
                names.push(name.to_owned());
                p.push(format!("{}.slice", names.join("-")));
            }
            p
        };
        let cgroupfs = || {
            let mut p = base.join(parent).join("kubepods");
            if let Some(q) = qos.segment() {
                p.push(q);
            }
            p.push(format!("pod{pod_uid}"));
            p
        };
        match self.driver {
            CgroupDriver::Systemd => vec![systemd()],
            CgroupDriver::Cgroupfs => vec![cgroupfs()],
            CgroupDriver::Auto => vec![systemd(), cgroupfs()],
        }
    }

    /// The container's cgroup directory, if present.
    pub fn container_dir(&self, pod_uid: &str, qos: QosClass, container_id: &str) -> Option<PathBuf> {
        if container_id.is_empty() {
            return None;
        }
        self.pod_dirs(pod_uid, qos).into_iter().find_map(|pod| find_child(&pod, container_id))
    }

    /// The PIDs in the container's `cgroup.procs` (empty when the cgroup is not found or unreadable).
    pub fn container_pids(&self, pod_uid: &str, qos: QosClass, container_id: &str) -> Vec<u32> {
        self.container_dir(pod_uid, qos, container_id)
            .and_then(|dir| std::fs::read_to_string(dir.join("cgroup.procs")).ok())
            .map(|text| parse_procs(&text))
            .unwrap_or_default()
    }
}

fn find_child(pod: &Path, id: &str) -> Option<PathBuf> {
    let exact = pod.join(id);
    if exact.is_dir() {
        return Some(exact);
    }
    std::fs::read_dir(pod).ok()?.filter_map(Result::ok).find_map(|e| {
        let name = e.file_name();
        let name = name.to_str()?;
        let stem = name.strip_suffix(".scope").unwrap_or(name);
        (stem.ends_with(id) && stem[..stem.len() - id.len()].ends_with('-')).then(|| e.path())
    })
}

/// PIDs of a `cgroup.procs` text (one per line; anything else ignored).
pub fn parse_procs(text: &str) -> Vec<u32> {
    text.lines().filter_map(|l| l.trim().parse().ok()).collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    const UID: &str = "1b2c-3d";

    fn tree(v2: bool, rel: &str, procs: &str) -> (tempfile::TempDir, CgroupLayout) {
        let dir = tempfile::tempdir().unwrap();
        if v2 {
            std::fs::write(dir.path().join("cgroup.controllers"), "cpu memory").unwrap();
        }
        let c = dir.path().join(rel);
        std::fs::create_dir_all(&c).unwrap();
        std::fs::write(c.join("cgroup.procs"), procs).unwrap();
        let layout = CgroupLayout { root: dir.path().to_path_buf(), ..CgroupLayout::default() };
        (dir, layout)
    }

    #[test]
    fn a_kubelet_cgroup_root_is_honoured_in_both_drivers() {
        for (driver, kubelet_root, rel) in [
            (CgroupDriver::Cgroupfs, "/vgpu-e2e-1", "devices/vgpu-e2e-1/kubepods/besteffort/pod1b2c-3d/abc"),
            (CgroupDriver::Cgroupfs, "/a/b/", "devices/a/b/kubepods/pod1b2c-3d/abc"),
            (
                CgroupDriver::Systemd,
                "/node.slice",
                "devices/node.slice/node-kubepods.slice/node-kubepods-besteffort.slice/node-kubepods-besteffort-pod1b2c_3d.slice/cri-containerd-abc.scope",
            ),
            (
                CgroupDriver::Systemd,
                "/a.slice/a-b.slice",
                "devices/a.slice/a-b.slice/a-b-kubepods.slice/a-b-kubepods-pod1b2c_3d.slice/cri-containerd-abc.scope",
            ),
            (
                CgroupDriver::Systemd,
                "",
                "devices/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1b2c_3d.slice/cri-containerd-abc.scope",
            ),
        ] {
            let (_dir, mut layout) = tree(false, rel, "7\n");
            layout.driver = driver;
            layout.kubelet_cgroup_root = kubelet_root.to_owned();
            let qos = if rel.contains("besteffort") || kubelet_root.is_empty() {
                QosClass::BestEffort
            } else {
                QosClass::Guaranteed
            };
            assert_eq!(layout.container_pids(UID, qos, "abc"), vec![7], "{rel}");
            layout.kubelet_cgroup_root = "/elsewhere".into();
            assert!(layout.container_pids(UID, qos, "abc").is_empty(), "{rel} found under /elsewhere");
        }
    }

    #[test]
    fn every_layout_is_found() {
        for (v2, qos, rel) in [
            (
                true,
                QosClass::Burstable,
                "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1b2c_3d.slice/cri-containerd-abc.scope",
            ),
            (true, QosClass::Guaranteed, "kubepods.slice/kubepods-pod1b2c_3d.slice/crio-abc.scope"),
            (true, QosClass::BestEffort, "kubepods/besteffort/pod1b2c-3d/abc"),
            (false, QosClass::Burstable, "devices/kubepods/burstable/pod1b2c-3d/abc"),
            (
                false,
                QosClass::Guaranteed,
                "devices/kubepods.slice/kubepods-pod1b2c_3d.slice/docker-abc.scope",
            ),
        ] {
            let (_d, layout) = tree(v2, rel, "12\n13\n");
            assert_eq!(layout.container_pids(UID, qos, "abc"), [12, 13], "{rel}");
            // Another container's ID, or the wrong QoS, finds nothing.
            assert!(layout.container_pids(UID, qos, "zzz").is_empty());
            assert!(layout.container_pids(UID, qos, "bc").is_empty(), "{rel}: a suffix of another ID");
        }
    }

    #[test]
    fn the_driver_restricts_the_layouts_tried() {
        let (_d, mut layout) = tree(true, "kubepods/pod1b2c-3d/abc", "5");
        layout.driver = CgroupDriver::Systemd;
        assert!(layout.container_pids(UID, QosClass::Guaranteed, "abc").is_empty());
        layout.driver = CgroupDriver::Cgroupfs;
        assert_eq!(layout.container_pids(UID, QosClass::Guaranteed, "abc"), [5]);
    }

    #[test]
    fn ids_and_procs_parse() {
        assert_eq!(container_id("containerd://abc"), "abc");
        assert_eq!(container_id("abc"), "abc");
        assert_eq!(parse_procs("1\n\n x\n22 \n"), [1, 22]);
        assert_eq!(QosClass::parse(Some("Guaranteed")), QosClass::Guaranteed);
        assert_eq!(QosClass::parse(None), QosClass::Burstable);
    }
}
