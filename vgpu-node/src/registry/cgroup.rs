//! The cgroup of a process, as the registry reads it: which line of `/proc/<pid>/cgroup` names it
//! ([`cgroup_path_of`], per [`is_unified`]) and the pod UID in that path ([`pod_uid_from_cgroup_path`]).

use std::path::Path;

use vgpu_core::node_config::CgroupDriver;

/// The pod UID in a cgroup path, per `driver` (auto tries systemd, then cgroupfs).
pub fn pod_uid_from_cgroup_path(path: &str, driver: CgroupDriver) -> Option<String> {
    let systemd = || {
        path.split('/').find_map(|part| {
            let slice = part.strip_suffix(".slice")?;
            let (_, uid) = slice.rsplit_once("-pod")?;
            (!uid.is_empty() && slice.starts_with("kubepods")).then(|| uid.replace('_', "-"))
        })
    };
    let cgroupfs = || {
        let mut parts = path.split('/').skip_while(|p| !p.starts_with("kubepods"));
        parts.find_map(|part| part.strip_prefix("pod").filter(|u| !u.is_empty()).map(str::to_owned))
    };
    match driver {
        CgroupDriver::Systemd => systemd(),
        CgroupDriver::Cgroupfs => cgroupfs(),
        CgroupDriver::Auto => systemd().or_else(cgroupfs),
    }
}

/// The cgroup path of a process from its `/proc/<pid>/cgroup` text, and whether it is a cgroup v2 path.
///
/// On a unified (cgroup v2 only) host (`unified`: [`is_unified`] of the cgroup mount) that is the `0::<path>`
/// entry. Otherwise it is the v1 `memory` controller's: a hybrid host also lists `0::<path>`, but for the
/// unified hierarchy mounted beside the v1 controllers (`<mount>/unified`), which the kubelet does not
/// manage, so that entry is never read there.
pub fn cgroup_path_of(text: &str, unified: bool) -> Option<(String, bool)> {
    text.lines().find_map(|line| {
        let mut fields = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (fields.next(), fields.next(), fields.next()) else {
            return None;
        };
        let wanted = if unified {
            id == "0" && controllers.is_empty()
        } else {
            controllers.split(',').any(|c| c == "memory")
        };
        wanted.then(|| (path.to_owned(), unified))
    })
}

/// Whether the cgroup mount at `cgroup_root` (e.g. `/sys/fs/cgroup`) is a unified cgroup v2 hierarchy (it
/// has `cgroup.controllers`), rather than v1 or hybrid controllers.
pub fn is_unified(cgroup_root: &Path) -> bool {
    cgroup_root.join("cgroup.controllers").is_file()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_uids_from_cgroup_paths() {
        let systemd = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0b1a_22cd_4e5f.slice/cri-containerd-abc.scope";
        let guaranteed = "/kubepods.slice/kubepods-pod0b1a_22cd.slice/cri-containerd-abc.scope";
        let cgroupfs = "/kubepods/besteffort/pod0b1a-22cd-4e5f/abc";
        assert_eq!(
            pod_uid_from_cgroup_path(systemd, CgroupDriver::Systemd).as_deref(),
            Some("0b1a-22cd-4e5f")
        );
        assert_eq!(pod_uid_from_cgroup_path(guaranteed, CgroupDriver::Auto).as_deref(), Some("0b1a-22cd"));
        assert_eq!(
            pod_uid_from_cgroup_path(cgroupfs, CgroupDriver::Cgroupfs).as_deref(),
            Some("0b1a-22cd-4e5f")
        );
        assert_eq!(pod_uid_from_cgroup_path(cgroupfs, CgroupDriver::Auto).as_deref(), Some("0b1a-22cd-4e5f"));
        // The driver decides the form.
        assert_eq!(pod_uid_from_cgroup_path(systemd, CgroupDriver::Cgroupfs), None);
        assert_eq!(pod_uid_from_cgroup_path(cgroupfs, CgroupDriver::Systemd), None);
        assert_eq!(pod_uid_from_cgroup_path("/user.slice/user-1000.slice", CgroupDriver::Auto), None);
        assert_eq!(pod_uid_from_cgroup_path("/system.slice/podman.service", CgroupDriver::Auto), None);
    }

    #[test]
    fn cgroup_file_v2_on_unified_hosts_memory_elsewhere() {
        assert_eq!(cgroup_path_of("0::/kubepods/x\n", true), Some(("/kubepods/x".to_owned(), true)));
        let v1 = "12:cpu,cpuacct:/kubepods/a\n5:memory:/kubepods/b\n1:name=systemd:/kubepods/c\n";
        assert_eq!(cgroup_path_of(v1, false), Some(("/kubepods/b".to_owned(), false)));
        // A hybrid host lists the unified hierarchy too (first or last): the memory controller's path counts.
        for hybrid in [
            "0::/system.slice/containerd.service\n4:memory:/kubepods/besteffort/pod1/c\n",
            "4:memory:/kubepods/besteffort/pod1/c\n0::/system.slice/containerd.service\n",
        ] {
            assert_eq!(
                cgroup_path_of(hybrid, false),
                Some(("/kubepods/besteffort/pod1/c".to_owned(), false)),
                "{hybrid}"
            );
        }
        assert_eq!(cgroup_path_of(v1, true), None, "no v2 entry on a unified host");
        assert_eq!(cgroup_path_of("0::/kubepods/x\n", false), None, "no memory controller on a v1 host");
        assert_eq!(cgroup_path_of("garbage", false), None);
        let dir = tempfile::tempdir().unwrap();
        assert!(!is_unified(dir.path()));
        std::fs::write(dir.path().join("cgroup.controllers"), "cpu memory\n").unwrap();
        assert!(is_unified(dir.path()));
    }
}
