//! `vgpu-node-agent` flag validation (every bad flag exits 2 naming it, before any cluster access) and
//! `vgpuctl crds` (the committed CRD files for the default group, another group on request, exit 2 on a bad
//! group), through the built binaries.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use assert_cmd::Command;
use predicates::prelude::*;

fn agent() -> Command {
    let mut cmd = Command::cargo_bin("vgpu-node-agent").unwrap();
    cmd.env_remove("KUBECONFIG").env_remove("NODE_NAME").env_remove("VENDORS_CONFIGMAP");
    cmd
}

#[test]
fn bad_flags_exit_2_naming_the_flag() {
    let cases: &[(&[&str], &str)] = &[
        (&[], "--node-name <NODE_NAME>"),
        (&["--node-name", " "], "invalid --node-name \"\" (NODE_NAME)"),
        (&["--node-name", "w1", "--scan-interval", "5x"], "\"5x\" is not a duration"),
        (&["--node-name", "w1", "--scan-interval", "0s"], "invalid --scan-interval 0s"),
        (&["--node-name", "w1", "--group", "nodots"], "invalid --group: invalid API group \"nodots\""),
        (&["--node-name", "w1", "--label-domain", "UPPER.io"], "invalid --label-domain \"UPPER.io\""),
        (
            &["--node-name", "w1", "--vendors-configmap", "gpu-supported-vendors"],
            "invalid --vendors-configmap",
        ),
    ];
    for (args, message) in cases {
        agent().args(*args).assert().code(2).stderr(predicate::str::contains(*message));
    }
}

#[test]
fn node_name_comes_from_the_environment_and_no_cluster_is_a_clear_error() {
    agent()
        .env("NODE_NAME", "w1")
        .env("HOME", "/nonexistent")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .args(["--kubeconfig", "/nonexistent/kubeconfig"])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("--kubeconfig /nonexistent/kubeconfig"));
}

#[test]
fn vgpuctl_crds_prints_the_committed_files() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/gpu-module/crds");
    let committed = ["physicalgpus.gpu.deckhouse.io.yaml", "gpuclasses.gpu.deckhouse.io.yaml"]
        .map(|f| std::fs::read_to_string(dir.join(f)).unwrap())
        .join("---\n");
    Command::cargo_bin("vgpuctl").unwrap().arg("crds").assert().success().stdout(committed);
    Command::cargo_bin("vgpuctl")
        .unwrap()
        .args(["crds", "--group", "gpu.example.com"])
        .assert()
        .success()
        .stdout(predicate::str::contains("name: gpuclasses.gpu.example.com"));
    Command::cargo_bin("vgpuctl")
        .unwrap()
        .args(["crds", "--group", "bad"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("invalid --group"));
}

/// `vgpu-node-agent vfio-switch` against a fake sysfs in a temporary directory: the binary writes the plain
/// files, a [`PollingKernel`] in this process acts on them as the kernel would.
mod vfio_switch {
    use std::time::Duration;

    use assert_cmd::Command;
    use predicates::prelude::*;
    use vgpu_dra::vfio::{
        SysfsRoots,
        fake::{FakeSysfs, PollingKernel},
    };

    const BUS: &str = "0000:3b:00.0";

    fn switch(roots: &SysfsRoots, to: &str) -> assert_cmd::assert::Assert {
        Command::cargo_bin("vgpu-node-agent")
            .unwrap()
            .env_remove("NODE_NAME")
            .env_remove("PCI_ADDRESS")
            .args(["vfio-switch", "--pci", BUS, "--to", to, "--timeout", "10s", "--sysfs-root"])
            .arg(&roots.sys)
            .arg("--host-root")
            .arg(&roots.host_root)
            .assert()
    }

    fn tree(driver: &str) -> (tempfile::TempDir, FakeSysfs) {
        let dir = tempfile::tempdir().unwrap();
        let tree = FakeSysfs::new(&SysfsRoots::under(dir.path()));
        tree.add_gpu(BUS, 0x2330, "7", Some(driver)).unwrap();
        tree.add_driver("nvidia").unwrap();
        tree.add_driver("vfio-pci").unwrap();
        (dir, tree)
    }

    #[test]
    fn switches_there_and_back_and_is_idempotent() {
        let (_dir, tree) = tree("nvidia");
        let kernel = PollingKernel::start(tree.roots(), Duration::from_millis(10)).unwrap();
        switch(tree.roots(), "vfio-pci")
            .success()
            .stdout(predicate::str::contains("0000:3b:00.0 switched from nvidia to vfio-pci"));
        assert_eq!(tree.driver(BUS), "vfio-pci");
        assert_eq!(tree.driver_override(BUS), "vfio-pci");
        switch(tree.roots(), "vfio-pci")
            .success()
            .stdout(predicate::str::contains("already bound to vfio-pci"));
        switch(tree.roots(), "nvidia")
            .success()
            .stdout(predicate::str::contains("switched from vfio-pci to nvidia"));
        assert_eq!(tree.driver(BUS), "nvidia");
        assert!(matches!(tree.driver_override(BUS).as_str(), "" | "(null)"), "{}", tree.driver_override(BUS));
        assert!(kernel.errors().is_empty(), "{:?}", kernel.errors());
        let acted: Vec<String> = kernel.writes().into_iter().map(|(p, _)| p).collect();
        assert_eq!(
            acted,
            [
                "bus/pci/drivers/nvidia/unbind",
                "bus/pci/drivers_probe",
                "bus/pci/drivers/vfio-pci/unbind",
                "bus/pci/drivers/nvidia/bind"
            ]
        );
    }

    #[test]
    fn errors_name_the_file_and_the_expected_state() {
        let (_dir, tree) = tree("nvidia");
        // No kernel acts on the writes: the unbind never happens.
        Command::cargo_bin("vgpu-node-agent")
            .unwrap()
            .args(["vfio-switch", "--pci", BUS, "--to", "vfio-pci", "--timeout", "200ms", "--sysfs-root"])
            .arg(&tree.roots().sys)
            .assert()
            .code(1)
            .stderr(predicate::str::contains(format!("{BUS}/driver: expected no driver (unbound) within")))
            .stderr(predicate::str::contains("found a link to driver nvidia"));
        Command::cargo_bin("vgpu-node-agent")
            .unwrap()
            .args(["vfio-switch", "--pci", "0000:86:00.0", "--to", "nvidia", "--sysfs-root"])
            .arg(&tree.roots().sys)
            .assert()
            .code(1)
            .stderr(predicate::str::contains("bus/pci/devices/0000:86:00.0: no such PCI device"));
        let (_dir, nouveau) = self::tree("nouveau");
        switch(nouveau.roots(), "vfio-pci")
            .code(1)
            .stderr(predicate::str::contains("bound to nouveau; expected nvidia, vfio-pci or no driver"));
    }

    #[test]
    fn bad_flags_exit_2() {
        let agent = || {
            let mut cmd = Command::cargo_bin("vgpu-node-agent").unwrap();
            cmd.env_remove("NODE_NAME").env_remove("PCI_ADDRESS");
            cmd
        };
        agent()
            .args(["vfio-switch", "--pci", BUS, "--to", "vfio"])
            .assert()
            .code(2)
            .stderr(predicate::str::contains("\"vfio\" is not a switch target: expected vfio-pci or nvidia"));
        agent()
            .args(["vfio-switch", "--pci", "3b:00.0", "--to", "nvidia"])
            .assert()
            .code(2)
            .stderr(predicate::str::contains("\"3b:00.0\" is not a PCI address dddd:bb:dd.f"));
        agent()
            .args(["vfio-switch", "--to", "nvidia"])
            .assert()
            .code(2)
            .stderr(predicate::str::contains("--pci"));
    }
}
