//! Every binary validates its gates first (exit 2 on error) and says plainly what is not built yet.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use assert_cmd::Command;
use predicates::prelude::*;

const BINARIES: &[(&str, &str, &str)] = &[
    ("vgpu-device-plugin", "GPUCoreResourcePlugin=true", "VGPUSupport=true"),
    ("vgpu-scheduler-extender", "SerializedNodeBind=false", "GPUCoreResourcePlugin=true"),
    ("vgpu-device-monitor", "VirtualMemoryTracking=true", "SerializedNodeBind=true"),
    ("vgpu-kubelet-plugin", "MPSSupport=true,VGPUSupport=false", "MPSSupport=true"),
];

fn bin(name: &str) -> Command {
    let mut cmd = Command::cargo_bin(name).unwrap();
    cmd.env_remove("FEATURE_GATES").env_remove("NODE_NAME").env_remove("KUBECONFIG");
    cmd
}

#[test]
fn bad_gates_exit_2_before_anything_else() {
    for (name, _, bad) in BINARIES {
        bin(name)
            .arg(format!("--feature-gates={bad}"))
            .assert()
            .code(2)
            .stderr(predicate::str::contains("not implemented").not());
    }
}

#[test]
fn good_gates_then_not_implemented_yet() {
    let done =
        ["vgpu-device-plugin", "vgpu-scheduler-extender", "vgpu-kubelet-plugin", "vgpu-device-monitor"];
    for (name, good, _) in BINARIES.iter().filter(|(name, ..)| !done.contains(name)) {
        bin(name)
            .args(["--feature-gates", good])
            .assert()
            .code(1)
            .stderr(predicate::str::contains(format!("{name}: not implemented yet")));
    }
}

#[test]
fn kubelet_plugin_reads_feature_gates_env_and_the_flag_wins() {
    bin("vgpu-kubelet-plugin")
        .env("FEATURE_GATES", "MPSSupport=true")
        .assert()
        .code(2)
        .stderr(predicate::str::starts_with("feature gate validation failed for kubelet-plugin:"));
    // The flag replaces the env value: no conflict, the run stops at the missing node name.
    bin("vgpu-kubelet-plugin")
        .env("FEATURE_GATES", "MPSSupport=true")
        .args(["--feature-gates", "IMEXDaemonsWithDNSNames=false"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("--node-name (or NODE_NAME) is required"));
    // Core binaries do not read FEATURE_GATES (the device plugin then stops at the missing node name).
    bin("vgpu-device-plugin")
        .env("FEATURE_GATES", "Nope=true")
        .assert()
        .code(2)
        .stderr(predicate::str::contains("--node-name (or NODE_NAME) is required"));
}

#[test]
fn kubelet_plugin_refuses_every_gate_it_cannot_honour() {
    bin("vgpu-kubelet-plugin")
        .args([
            "--node-name=n1",
            "--feature-gates",
            "TimeSlicingSettings=true,DynamicMIG=true,NVMLDeviceHealthCheck=false",
        ])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("feature gate TimeSlicingSettings=true is not supported"))
        .stderr(predicate::str::contains("feature gate DynamicMIG=true is not supported"));
    bin("vgpu-kubelet-plugin")
        .args(["--node-name=n1", "--feature-gates", "MPSSupport=true,VGPUSupport=false"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("MPSSupport=true is not supported"));
    bin("vgpu-kubelet-plugin")
        .args(["--node-name=n1", "--device-cores-ratio=10", "--device-memory-ratio=-1"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "invalid --device-memory-ratio -1: must be greater than or equal to 0",
        ));
}

#[test]
fn device_plugin_good_gates_then_a_clear_configuration_error() {
    bin("vgpu-device-plugin")
        .args(["--feature-gates", "GPUCoreResourcePlugin=true"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("--node-name (or NODE_NAME) is required"));
}

#[test]
fn device_plugin_accepts_the_shared_sm_watcher_gate() {
    // Every device-plugin gate is built: the gates pass and the next check (the node name) speaks.
    bin("vgpu-device-plugin")
        .args(["--feature-gates", "VirtualMemoryTracking=true,SharedSMUtilizationWatcher=true"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("--node-name (or NODE_NAME) is required"))
        .stderr(predicate::str::contains("not supported").not());
}

#[test]
fn device_plugin_bad_flag_values_exit_2_naming_the_flag() {
    for (args, flag) in [
        (&["--device-cores-scaling", "-1"][..], "--device-cores-scaling"),
        (&["--device-memory-factor", "0"][..], "--device-memory-factor"),
        (&["--device-list-strategy", "envvar,bogus"][..], "--device-list-strategy"),
        (&["--mig-strategy", "half"][..], "--mig-strategy"),
        (&["--exclude-devices", "3..1"][..], "--exclude-devices"),
        (&["--backend", "cuda"][..], "--backend"),
        (&["--device-split-count", "ten"][..], "--device-split-count"),
    ] {
        bin("vgpu-device-plugin")
            .args(["--node-name", "n1"])
            .args(args)
            .assert()
            .code(2)
            .stderr(predicate::str::contains(flag));
    }
}

#[test]
fn device_plugin_without_a_cluster_fails_clearly() {
    let home = tempfile::tempdir().unwrap();
    let mock = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/mock/dgx-h100-8gpu.yaml");
    bin("vgpu-device-plugin")
        .env("HOME", home.path())
        .env_remove("KUBERNETES_SERVICE_HOST")
        .args(["--node-name", "n1", "--backend", "mock", "--mock-config", mock])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("no Kubernetes configuration"));
}

#[test]
fn device_plugin_nvml_without_a_driver_fails_clearly() {
    // Only meaningful where no NVIDIA driver is installed.
    if std::path::Path::new("/proc/driver/nvidia/version").exists() {
        return;
    }
    bin("vgpu-device-plugin")
        .args(["--node-name", "n1", "--backend", "nvml"])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("NVIDIA driver library"));
}

#[test]
fn extender_bad_flag_values_exit_2_naming_the_flag() {
    for (args, expected) in [
        (&["--stuck-grace-period", "500ms"][..], "--stuck-grace-period"),
        (&["--stuck-grace-period", "soon"][..], "--stuck-grace-period"),
        (&["--cert-refresh-interval", "5"][..], "--cert-refresh-interval"),
        (&["--leader-elect", "--watch-lease"][..], "--watch-lease"),
        (&["--leader-elect"][..], "--leader-elect"),
        (&["--enable-tls", "--tls-cert-file", "/tmp/c.pem"][..], "--tls-key-file"),
        (&["--server-bind-port", "70000"][..], "--server-bind-port"),
        (&["--client-ca-file", "/tmp/ca.pem"][..], "--client-ca-file"),
        (&["--server-bind-address", "not-an-ip"][..], "--server-bind-address"),
    ] {
        bin("vgpu-scheduler-extender")
            .env_remove("POD_NAMESPACE")
            .env_remove("POD_NAME")
            .args(args)
            .assert()
            .code(2)
            .stderr(predicate::str::contains(expected));
    }
}

#[test]
fn extender_without_a_cluster_fails_clearly() {
    let home = tempfile::tempdir().unwrap();
    bin("vgpu-scheduler-extender")
        .env("HOME", home.path())
        .env_remove("KUBERNETES_SERVICE_HOST")
        .args(["--server-bind-port", "0"])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("no Kubernetes configuration"));
}

#[test]
fn device_monitor_checks_its_flags_after_the_gates() {
    // Good gates, then the node name is required.
    bin("vgpu-device-monitor")
        .args(["--feature-gates", "VirtualMemoryTracking=true,SharedSMUtilizationWatcher=true"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("--node-name (or NODE_NAME) is required"));
    // The DRA collector is refused, saying why (never a silent empty page).
    bin("vgpu-device-monitor")
        .args(["--node-name", "n1", "--enable-dra-monitor"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("--enable-dra-monitor is not available yet"));
    for (args, flag) in [
        (&["--min-scrape-interval", "500ms"][..], "--min-scrape-interval"),
        (&["--min-scrape-interval", "soon"][..], "--min-scrape-interval"),
        (&["--cert-refresh-interval", "0s"][..], "--cert-refresh-interval"),
        (&["--cgroup-driver", "upstart"][..], "--cgroup-driver"),
        (&["--enable-tls"][..], "--enable-tls"),
        (&["--domain", "Bad_Domain"][..], "--domain"),
        (&["--node-config-path", "/nonexistent/node-config.json"][..], "--node-config-path"),
        (&["--server-bind-port", "70000"][..], "--server-bind-port"),
        (&["--backend", "cuda"][..], "--backend"),
    ] {
        bin("vgpu-device-monitor")
            .args(["--node-name", "n1"])
            .args(args)
            .assert()
            .code(2)
            .stderr(predicate::str::contains(flag));
    }
}
