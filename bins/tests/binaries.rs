//! Every binary validates its gates first (exit 2 on error, before anything else runs).

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
            .stderr(predicate::str::contains("gate"));
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

/// A valid combination (the spec's Requires / mutually-exclusive rules) with `gate` on.
fn with_gate(gate: &str) -> String {
    match gate {
        "MPSSupport" | "ConsumableShares" => format!("{gate}=true,VGPUSupport=false"),
        "PassthroughSupport" => format!("{gate}=true,VGPUSupport=false,NVMLDeviceHealthCheck=false"),
        "DeviceMetadata" => {
            format!("{gate}=true,PassthroughSupport=true,VGPUSupport=false,NVMLDeviceHealthCheck=false")
        }
        "DynamicMIG" => format!("{gate}=true,NVMLDeviceHealthCheck=false"),
        _ => format!("{gate}=true"),
    }
}

#[test]
fn kubelet_plugin_refuses_every_gate_it_cannot_honour_and_accepts_the_rest() {
    let unbuilt: Vec<String> = vgpu_dra::gates::UNBUILT.iter().map(|(g, _)| g.to_string()).collect();
    for (gate, _) in vgpu_dra::gates::UNBUILT {
        bin("vgpu-kubelet-plugin")
            .args(["--node-name=n1", "--feature-gates", &with_gate(&gate.to_string())])
            .assert()
            .code(2)
            .stderr(predicate::str::contains(format!("feature gate {gate}=true is not supported")));
    }
    // Every other gate passes the check: the next bad flag is what the plugin reports.
    for gate in [
        "TimeSlicingSettings",
        "MPSSupport",
        "DynamicMIG",
        "NRISupport",
        "PassthroughSupport",
        "DeviceMetadata",
        "FabricManagerPartitioning",
        "SharedSMUtilizationWatcher",
        "DevicePluginClientMode",
        "DRAListTypeAttributes",
        "ConsumableShares",
        "ContextualLogging",
        "LoggingAlphaOptions",
        "LoggingBetaOptions",
    ]
    .into_iter()
    .filter(|g| !unbuilt.iter().any(|u| u == g))
    {
        bin("vgpu-kubelet-plugin")
            .args(["--node-name=n1", "--device-memory-ratio=-1", "--feature-gates", &with_gate(gate)])
            .assert()
            .code(2)
            .stderr(predicate::str::contains("invalid --device-memory-ratio -1"))
            .stderr(predicate::str::contains("not supported").not());
    }
    // Together too (the spec allows the pair): past the gate checks, the next flag error is the one shown.
    bin("vgpu-kubelet-plugin")
        .args([
            "--node-name=n1",
            "--device-memory-ratio=-1",
            "--feature-gates",
            "NRISupport=true,DevicePluginClientMode=true",
        ])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("invalid --device-memory-ratio -1"))
        .stderr(predicate::str::contains("not supported").not());
    bin("vgpu-kubelet-plugin")
        .args(["--node-name=n1", "--device-cores-ratio=10", "--device-memory-ratio=-1"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "invalid --device-memory-ratio -1: must be greater than or equal to 0",
        ));
}

/// Gate `LoggingBetaOptions` permits `--logging-format=json` (on by default); off, the plugin refuses that
/// format before logging starts, as upstream's `logsapi.ValidateAndApply`. Text is always permitted.
#[test]
fn kubelet_plugin_json_logging_needs_logging_beta_options() {
    bin("vgpu-kubelet-plugin")
        .env("FEATURE_GATES", "LoggingBetaOptions=false")
        .arg("--logging-format=json")
        .assert()
        .code(2)
        .stderr("vgpu-kubelet-plugin: invalid --logging-format json: Log format json is disabled, see LoggingBetaOptions feature\n");
    for (gates, format) in
        [("LoggingBetaOptions=false", "text"), ("LoggingBetaOptions=true", "json"), ("", "json")]
    {
        bin("vgpu-kubelet-plugin")
            .env("FEATURE_GATES", gates)
            .arg(format!("--logging-format={format}"))
            .assert()
            .code(2)
            .stderr(predicate::str::contains("--node-name (or NODE_NAME) is required"))
            .stderr(predicate::str::contains("LoggingBetaOptions feature").not());
    }
}

/// The kubelet plugin's logging flags also come from the environment, as upstream's (`V`, `VMODULE`,
/// `LOGGING_FORMAT`): JSON lines with the format from `LOGGING_FORMAT`, the gate check reads it too, a bad
/// value names the flag.
#[test]
fn kubelet_plugin_reads_its_logging_flags_from_the_environment() {
    let out = bin("vgpu-kubelet-plugin")
        .env("LOGGING_FORMAT", "json")
        .env("V", "4")
        .env("VMODULE", "vgpu_dra=5")
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    // The gates line is logged as JSON before the node-name check refuses.
    let first = stderr.lines().next().unwrap_or_default();
    assert!(first.starts_with('{') && first.contains("Feature Gates"), "{stderr}");
    bin("vgpu-kubelet-plugin")
        .env("LOGGING_FORMAT", "json")
        .env("FEATURE_GATES", "LoggingBetaOptions=false")
        .assert()
        .code(2)
        .stderr(predicate::str::contains("Log format json is disabled"));
    bin("vgpu-kubelet-plugin")
        .env("VMODULE", "vgpu dra=4")
        .assert()
        .code(2)
        .stderr(predicate::str::contains("invalid --vmodule entry"));
}

/// `--metrics-path` is checked before anything starts, by the same rule the router applies
/// (`vgpu_serve::probes::check_metrics_path`), so a path it cannot serve never half-starts the plugin.
#[test]
fn kubelet_plugin_refuses_a_metrics_path_it_cannot_serve() {
    for (path, reason) in [
        ("metrics", "must start with '/'"),
        ("/readyz", "must differ from /healthz, /readyz and /version"),
        ("/version", "must differ from /healthz, /readyz and /version"),
        ("/:m", "no path segment may start with ':' or '*'"),
    ] {
        bin("vgpu-kubelet-plugin")
            .args(["--node-name=n1", &format!("--metrics-path={path}")])
            .assert()
            .code(2)
            .stderr(predicate::str::contains(format!("invalid --metrics-path {path:?}: {reason}")));
    }
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
    // The DRA collector starts (below); its driver name is checked like the kubelet plugin's.
    device_monitor_dra_collector_starts();
    bin("vgpu-device-monitor")
        .args(["--node-name", "n1", "--enable-dra-monitor", "--driver-name", "gpu"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("--driver-name"));
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

/// `--enable-dra-monitor` on the mock backend against an API server that accepts connections and never
/// answers: the process serves `/healthz`, `/readyz` says 503 (the pod, slice and claim caches cannot sync),
/// and SIGTERM stops it with exit 0.
fn device_monitor_dra_collector_starts() {
    use std::io::{BufRead, Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let api = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://{}\n\
             contexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\n\
             users:\n- name: u\n  user:\n    token: t\n",
            api.local_addr().unwrap()
        ),
    )
    .unwrap();
    let mock = dir.path().join("mock.yaml");
    std::fs::write(&mock, "gpus:\n  - { uuid: GPU-a, name: NVIDIA L4, memoryMiB: 23034 }\n").unwrap();
    let mut child = std::process::Command::new(assert_cmd::cargo::cargo_bin("vgpu-device-monitor"))
        .env_remove("FEATURE_GATES")
        .env_remove("NODE_NAME")
        .env_remove("KUBECONFIG")
        .env("NO_COLOR", "1")
        .args(["--node-name", "n1", "--enable-dra-monitor", "--backend", "mock", "--server-bind-port", "0"])
        .arg("--mock-config")
        .arg(&mock)
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let (mut log, mut port) = (String::new(), None);
    for line in (&mut stderr).lines() {
        let line = line.unwrap();
        log.push_str(&line);
        log.push('\n');
        if line.contains("serving metrics")
            && let Some(rest) = line.split("address=").nth(1)
        {
            let address = rest.split_whitespace().next().unwrap_or_default();
            port = address.rsplit(':').next().and_then(|p| p.parse::<u16>().ok());
            break;
        }
    }
    // Keep draining the log so the process never blocks on a full pipe.
    let drain = std::thread::spawn(move || {
        let mut rest = String::new();
        let _ = stderr.read_to_string(&mut rest);
        rest
    });
    let Some(port) = port else {
        let _ = child.kill();
        panic!("no 'serving metrics' line in the log:\n{log}");
    };
    assert!(log.contains("DRA collector"), "{log}");
    let get = |path: &str| {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(std::time::Duration::from_secs(30))).unwrap();
        write!(s, "GET {path} HTTP/1.1\r\nHost: m\r\nConnection: close\r\n\r\n").unwrap();
        let mut reply = String::new();
        s.read_to_string(&mut reply).unwrap();
        reply
    };
    let health = get("/healthz");
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    let ready = get("/readyz");
    assert!(ready.starts_with("HTTP/1.1 503") && ready.ends_with("pod cache not synced"), "{ready}");
    let status =
        std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
    assert!(status.success());
    let exit = child.wait().unwrap();
    let rest = drain.join().unwrap();
    assert!(exit.success(), "{exit:?}\n{log}{rest}");
    drop(api);
}

/// One start-up per Requires / Mutually-exclusive rule of the kubelet plugin's registry: the binary exits 2
/// naming the rule in upstream's words.
#[test]
fn kubelet_plugin_exits_2_on_each_gate_rule() {
    let rules = vgpu_dra::feature_gates().rules();
    assert!(rules.len() >= 10, "the spec's DRA rules: {rules:?}");
    for rule in rules {
        let (gates, message) = match *rule {
            vgpu_gates::Rule::Requires { gate, requires } => (
                format!("{gate}=true,{requires}=false"),
                format!("feature gate {gate} requires {requires} to also be enabled"),
            ),
            vgpu_gates::Rule::MutuallyExclusive(a, b) => (
                format!("{a}=true,{b}=true"),
                format!("feature gate {a} is currently mutually exclusive with {b}"),
            ),
        };
        bin("vgpu-kubelet-plugin")
            .args(["--node-name=n1", "--feature-gates", &gates])
            .assert()
            .code(2)
            .stderr(predicate::str::contains(message));
    }
}

/// Gate `IMEXDaemonsWithDNSNames` (Beta, on by default; no IMEX daemons or ComputeDomain are built): the
/// default is accepted as inert with one log line, an explicit `=true` is refused (exit 2, the message names
/// the gate and why), an explicit `=false` is accepted silently.
#[test]
fn kubelet_plugin_imex_dns_names_default_is_inert_and_explicit_true_is_refused() {
    let inert_line = "gate IMEXDaemonsWithDNSNames=true (the default) does nothing in this build";
    bin("vgpu-kubelet-plugin")
        .assert()
        .code(2)
        .stderr(predicate::str::contains(inert_line))
        .stderr(predicate::str::contains("--node-name (or NODE_NAME) is required"));
    for explicit in
        ["IMEXDaemonsWithDNSNames=true", "IMEXDaemonsWithDNSNames=false,IMEXDaemonsWithDNSNames=true"]
    {
        bin("vgpu-kubelet-plugin")
            .args(["--node-name=n1", "--feature-gates", explicit])
            .assert()
            .code(2)
            .stderr(predicate::str::contains(
                "vgpu-kubelet-plugin: feature gate IMEXDaemonsWithDNSNames=true is not supported: it chooses how IMEX \
                 daemons of a ComputeDomain address each other, and this build has no IMEX daemons and no ComputeDomain",
            ))
            .stderr(predicate::str::contains("(remove it or set IMEXDaemonsWithDNSNames=false)"));
    }
    bin("vgpu-kubelet-plugin")
        .env("FEATURE_GATES", "IMEXDaemonsWithDNSNames=false")
        .assert()
        .code(2)
        .stderr(predicate::str::contains("--node-name (or NODE_NAME) is required"))
        .stderr(predicate::str::contains(inert_line).not())
        .stderr(predicate::str::contains("is not supported").not());
}

/// The vfio-switch settings the API server would refuse in every Job are refused at start (exit 2), naming
/// the setting: here a relative `--vfio-switch-host-sysfs`.
#[test]
fn kubelet_plugin_refuses_a_vfio_switch_path_the_api_server_would_refuse() {
    let host_root = tempfile::tempdir().expect("temp dir");
    bin("vgpu-kubelet-plugin")
        .arg(format!("--host-root={}", host_root.path().display()))
        .args([
            "--node-name=n1",
            "--feature-gates=PassthroughSupport=true,VGPUSupport=false,NVMLDeviceHealthCheck=false",
            "--vfio-switch-image=registry.local/vgpu:1",
            "--vfio-switch-namespace=d8-gpu",
            "--vfio-switch-host-sysfs=host/../sys",
        ])
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "--vfio-switch-*: vfio-switch host sysfs \"host/../sys\": expected an absolute path without '.' or '..' components",
        ));
}

/// The shared serving-flag groups (`vgpu_bins::TlsFileArgs`, `WebhookServerArgs`) keep each binary's `--help`
/// order and texts: the extender's `--client-ca-file` and `--enable-rbac` between `--enable-tls` and
/// `--tls-key-file`, the monitor's own `--cert-refresh-interval` text.
#[test]
fn shared_serving_flags_keep_each_binarys_help() {
    let help = |name: &str| {
        let out = bin(name).arg("--help").output().unwrap();
        assert!(out.status.success(), "{name} --help");
        String::from_utf8(out.stdout).unwrap()
    };
    let in_order = |name: &str, text: &str, flags: &[&str]| {
        let at: Vec<usize> = flags
            .iter()
            .map(|f| text.find(&format!("      {f}")).unwrap_or_else(|| panic!("{name}: no {f} in\n{text}")))
            .collect();
        assert!(at.windows(2).all(|w| w[0] < w[1]), "{name}: {flags:?} out of order in\n{text}");
    };
    let extender = help("vgpu-scheduler-extender");
    in_order(
        "vgpu-scheduler-extender",
        &extender,
        &[
            "--server-bind-address",
            "--enable-tls",
            "--client-ca-file",
            "--enable-rbac",
            "--tls-key-file",
            "--tls-cert-file",
            "--cert-refresh-interval",
            "--stuck-grace-period",
        ],
    );
    assert!(
        extender.contains("How often the TLS files are checked for changes (Go duration)\n"),
        "{extender}"
    );
    let monitor = help("vgpu-device-monitor");
    in_order(
        "vgpu-device-monitor",
        &monitor,
        &[
            "--server-bind-port",
            "--enable-rbac",
            "--enable-tls",
            "--tls-key-file",
            "--tls-cert-file",
            "--cert-refresh-interval",
            "--min-scrape-interval",
        ],
    );
    assert!(
        monitor.contains(
            "How often the TLS files are checked for changes (Go duration; taken as is, not multiplied)\n"
        ),
        "{monitor}"
    );
    for name in ["vgpu-controller", "vgpu-webhook"] {
        let text = help(name);
        in_order(
            name,
            &text,
            &[
                "--server-bind-port",
                "--server-bind-address",
                "--cert-dir",
                "--tls-cert-name",
                "--tls-key-name",
            ],
        );
    }
}
