//! Drop-in under vgpu-manager's own Helm charts (issue #32): each of the 6 containers its two charts run
//! (`charts/vgpu-manager`, `charts/vgpu-manager-dra-driver` at commit 3d7f66d, default values, rendered with
//! `helm template --kube-version 1.37.0`) is started with exactly its chart's command line and environment,
//! by vgpu-manager's binary name on `PATH` (our image's links) — the kubelet plugin through the chart's
//! `bash -c '… exec kubelet-plugin "$@"'` wrapper.
//!
//! Every one gets past flag parsing and start-up validation: it then either keeps running (serving, waiting
//! for the API server) or stops for want of a cluster or of GPUs, saying so — never exit 2, never a flag
//! message. The container's mounts are stood in for by folders of a temp dir (the chart's paths rewritten
//! to them), its own network namespace by free loopback ports, the API server by an address nothing
//! listens on.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{
    io::Read,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

/// One container of a chart: vgpu-manager's binary name, its `command` + `args` and `env`, as rendered.
struct Container {
    chart: &'static str,
    name: &'static str,
    /// vgpu-manager's binary, the name our image links to ours.
    upstream: &'static str,
    ours: &'static str,
    argv: &'static [&'static str],
    env: &'static [(&'static str, &'static str)],
}

const DEVICE_PLUGIN_GATES: &str = "--feature-gates=AllocationFailureReschedule=false,DevicePluginClientMode=false,GPUCoreResourcePlugin=false,GPUMemoryResourcePlugin=false,HonorPreAllocatedDeviceIDs=true,SharedSMUtilizationWatcher=true,TopologyAwareGPUAllocation=true,VirtualMemoryTracking=true";

const KUBELET_PLUGIN_SCRIPT: &str = "# Conditionally mask the params file to prevent this container from\n# recreating any missing GPU device nodes. This is necessary, for\n# example, when running under nvkind to limit the set GPUs governed\n# by the plugin even though it has cgroup access to all of them.\nif [ \"${MASK_NVIDIA_DRIVER_PARAMS}\" = \"true\" ]; then\n  cp /proc/driver/nvidia/params root/gpu-params\n  sed -i 's/^ModifyDeviceFiles: 1$/ModifyDeviceFiles: 0/' root/gpu-params\n  mount --bind root/gpu-params /proc/driver/nvidia/params\nfi\nexec kubelet-plugin \"$@\"";

/// Failures that mean "no cluster" (the kubeconfig names 127.0.0.1:1) or "no GPU" (no NVML on this host).
const NO_CLUSTER: &[&str] =
    &["127.0.0.1:1", "Connection refused", "connection refused", "API server", "error trying to connect"];
const NO_GPU: &[&str] = &["opening the device backend", "GPU found", "libnvidia-ml"];

fn containers() -> Vec<Container> {
    vec![
        Container {
            chart: "vgpu-manager",
            name: "device-plugin/device-plugin",
            upstream: "device-plugin",
            ours: env!("CARGO_BIN_EXE_vgpu-device-plugin"),
            argv: &[
                "device-plugin",
                "--domain=nvidia.com",
                "--kube-api-qps=20",
                "--kube-api-burst=30",
                "--device-list-strategy=envvar",
                "--device-split-count=10",
                "--device-cores-scaling=1",
                "--device-memory-scaling=1",
                "--device-memory-factor=1",
                "--pprof-bind-port=0",
                "--cgroup-driver=auto",
                DEVICE_PLUGIN_GATES,
                "--mofed-enabled=false",
                "--gds-enabled=false",
                "--gdrcopy-enabled=false",
                "--open-kernel-modules=false",
                "--mig-strategy=mixed",
                "--host-driver-root=/",
                "--container-driver-root=/driver-root",
                "--node-config-path=/config/nodeConfig.yaml",
                "--v=3",
            ],
            env: &[
                ("HOST_MANAGER_DIR", "/etc/vgpu-manager"),
                ("NVIDIA_VISIBLE_DEVICES", "all"),
                ("NVIDIA_MIG_MONITOR_DEVICES", "all"),
                ("NVIDIA_DRIVER_CAPABILITIES", "utility,compute"),
                ("DP_ENABLE_HEALTHCHECKS", ""),
                ("DP_DISABLE_HEALTHCHECKS", ""),
                ("KUBE_FEATURE_WatchListClient", "true"),
            ],
        },
        Container {
            chart: "vgpu-manager",
            name: "device-plugin/device-monitor",
            upstream: "device-monitor",
            ours: env!("CARGO_BIN_EXE_vgpu-device-monitor"),
            argv: &[
                "device-monitor",
                "--domain=nvidia.com",
                "--kube-api-qps=20",
                "--kube-api-burst=30",
                "--server-bind-port=3456",
                "--pprof-bind-port=0",
                "--cgroup-driver=auto",
                "--feature-gates=SharedSMUtilizationWatcher=true,VirtualMemoryTracking=true",
                "--node-config-path=/config/nodeConfig.yaml",
                "--enable-rbac=false",
                "--min-scrape-interval=1s",
                "--stuck-grace-period=30s",
                "--container-driver-root=/driver-root",
                "--v=3",
            ],
            env: &[
                ("NVIDIA_VISIBLE_DEVICES", "all"),
                ("NVIDIA_MIG_MONITOR_DEVICES", "all"),
                ("NVIDIA_DRIVER_CAPABILITIES", "utility,compute"),
                ("KUBE_FEATURE_WatchListClient", "true"),
            ],
        },
        Container {
            chart: "vgpu-manager",
            name: "scheduler/device-scheduler",
            upstream: "device-scheduler",
            ours: env!("CARGO_BIN_EXE_vgpu-scheduler-extender"),
            argv: &[
                "device-scheduler",
                "--domain=nvidia.com",
                "--kube-api-qps=20",
                "--kube-api-burst=30",
                "--server-bind-port=3456",
                "--pprof-bind-port=0",
                "--feature-gates=SerializedNodeBind=true,SerializedNodeFilter=true,TopologyAwareGPUAllocation=true",
                "--stuck-grace-period=30s",
                "--watch-lease",
                "--leader-elect-resource-name=vgpu-scheduler",
                "--leader-elect-resource-namespace=default",
                "--v=3",
            ],
            env: &[
                ("POD_NAME", "vm-vgpu-manager-scheduler-7d9f-abcde"),
                ("POD_NAMESPACE", "default"),
                ("KUBE_FEATURE_WatchListClient", "true"),
            ],
        },
        Container {
            chart: "vgpu-manager",
            name: "webhook/device-webhook",
            upstream: "device-webhook",
            ours: env!("CARGO_BIN_EXE_vgpu-webhook"),
            argv: &[
                "device-webhook",
                "--scheduler-name=vgpu-scheduler",
                "--domain=nvidia.com",
                "--server-bind-port=9443",
                "--pprof-bind-port=0",
                "--cert-dir=/tmp/k8s-webhook-server/serving-certs",
                "--tls-cert-name=tls.crt",
                "--tls-key-name=tls.key",
                "--default-node-policy=binpack",
                "--default-device-policy=binpack",
                "--default-topology-mode=numa",
                "--default-runtime-class=",
                "--v=4",
            ],
            env: &[],
        },
        Container {
            chart: "vgpu-manager-dra-driver",
            name: "kubelet-plugin/kubelet-plugin",
            upstream: "kubelet-plugin",
            ours: env!("CARGO_BIN_EXE_vgpu-kubelet-plugin"),
            // The chart's `command: [bash, -c]` + `args` (its first argument becomes `$0`, as in the pod).
            argv: &[
                "bash",
                "-c",
                KUBELET_PLUGIN_SCRIPT,
                "--kube-api-qps=20",
                "--kube-api-burst=30",
                "--nri-plugin-idx=00",
                "--device-cores-ratio=100",
                "--device-memory-ratio=100",
                "-v=5",
            ],
            env: &[
                (
                    "FEATURE_GATES",
                    "ConsumableShares=false,DRAListTypeAttributes=false,DeviceMetadata=false,DevicePluginClientMode=false,DynamicMIG=false,FabricManagerPartitioning=false,NRISupport=false,NVMLDeviceHealthCheck=true,PassthroughSupport=false,SharedSMUtilizationWatcher=true,TimeSlicingSettings=false,VGPUSupport=true",
                ),
                ("MASK_NVIDIA_DRIVER_PARAMS", ""),
                ("NVIDIA_DRIVER_ROOT", "/"),
                ("NVIDIA_VISIBLE_DEVICES", "void"),
                ("CDI_ROOT", "/var/run/cdi"),
                ("HEALTHCHECK_PORT", "4567"),
                ("NVIDIA_DRIVER_CAPABILITIES", "utility,compute"),
                ("NVIDIA_MIG_CONFIG_DEVICES", "all"),
                ("DRIVER_ROOT_CTR_PATH", "/driver-root"),
                ("HOST_MANAGER_DIR", "/etc/vgpu-manager"),
                ("KUBELET_REGISTRAR_DIRECTORY_PATH", "/var/lib/kubelet/plugins_registry"),
                ("KUBELET_PLUGINS_DIRECTORY_PATH", "/var/lib/kubelet/plugins"),
                ("CGROUP_DRIVER", "auto"),
                ("HTTP_ENDPOINT", ":8080"),
                ("METRICS_PATH", "/metrics"),
                ("ADDITIONAL_XIDS_TO_IGNORE", ""),
                ("KUBE_FEATURE_WatchListClient", "true"),
            ],
        },
        Container {
            chart: "vgpu-manager-dra-driver",
            name: "webhook/device-webhook",
            upstream: "device-webhook",
            ours: env!("CARGO_BIN_EXE_vgpu-webhook"),
            argv: &[
                "device-webhook",
                "--kube-api-qps=20",
                "--kube-api-burst=30",
                "--domain=nvidia.com",
                "--server-bind-port=9443",
                "--pprof-bind-port=0",
                "--cert-dir=/tmp/k8s-webhook-server/serving-certs",
                "--tls-cert-name=tls.crt",
                "--tls-key-name=tls.key",
                "--default-topology-mode=link",
                "--vgpu-device-class-name=vgpu-manager",
                "--dra-admission-enabled",
                "--default-convert2-dra",
                "--v=4",
            ],
            env: &[("KUBE_FEATURE_WatchListClient", "true")],
        },
    ]
}

/// The chart's `nodeConfig.yaml` ConfigMap, default values.
const NODE_CONFIG: &str = "version: v1\nconfigs:\n - nodeName: example\n   cgroupDriver: systemd\n   deviceListStrategy: envvar\n   deviceSplitCount: 5\n   deviceMemoryScaling: 1\n   deviceMemoryFactor: 1\n   deviceCoresScaling: 1\n   excludeDevices: \"4..7\"\n   gdsEnabled: false\n   mofedEnabled: false\n   openKernelModules: false\n";

/// The container's world in a temp dir: mounts, links on PATH, a kubeconfig to an API server that is not
/// there.
struct Sandbox {
    root: tempfile::TempDir,
}

impl Sandbox {
    fn new() -> Self {
        let root = tempfile::tempdir().unwrap();
        let sandbox = Self { root };
        for dir in [
            "bin",
            "config",
            "driver-root",
            "etc/vgpu-manager",
            "var/lib/kubelet/plugins_registry",
            "var/lib/kubelet/plugins",
            "var/lib/kubelet/device-plugins",
            "var/run/cdi",
            "certs",
        ] {
            std::fs::create_dir_all(sandbox.path(dir)).unwrap();
        }
        std::fs::write(sandbox.path("config/nodeConfig.yaml"), NODE_CONFIG).unwrap();
        let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
        std::fs::write(sandbox.path("certs/tls.crt"), cert.cert.pem()).unwrap();
        std::fs::write(sandbox.path("certs/tls.key"), cert.signing_key.serialize_pem()).unwrap();
        std::fs::write(
            sandbox.path("kubeconfig"),
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:1\n    insecure-skip-tls-verify: true\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\nusers:\n- name: u\n  user:\n    token: t\n",
        )
        .unwrap();
        sandbox
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.root.path().join(rel)
    }

    /// A chart path or port, as this sandbox stands it in.
    fn rewrite(&self, value: &str) -> String {
        let mut out = value.to_owned();
        for (chart, here) in [
            ("/config/", "config/"),
            ("/driver-root", "driver-root"),
            ("/etc/vgpu-manager", "etc/vgpu-manager"),
            ("/var/lib/kubelet", "var/lib/kubelet"),
            ("/var/run/cdi", "var/run/cdi"),
            ("/tmp/k8s-webhook-server/serving-certs", "certs"),
        ] {
            if let Some(rest) = out.strip_prefix(chart).map(str::to_owned) {
                out = format!("{}{rest}", self.path(here).display());
            } else if let Some((flag, rest)) = out.split_once('=')
                && let Some(rest) = rest.strip_prefix(chart)
            {
                out = format!("{flag}={}{rest}", self.path(here).display());
            }
        }
        for port in ["3456", "9443", "4567"] {
            if out.ends_with(&format!("-port={port}")) || out == port {
                out = out.replace(port, &free_port().to_string());
            }
        }
        if out == ":8080" {
            out = format!(":{}", free_port());
        }
        out
    }

    fn link(&self, upstream: &str, ours: &str) {
        let link = self.path("bin").join(upstream);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(ours, link).unwrap();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Exit status (None: still running after `wait`, then killed) and everything it printed.
fn run(sandbox: &Sandbox, c: &Container, wait: Duration) -> (Option<i32>, String) {
    sandbox.link(c.upstream, c.ours);
    let argv: Vec<String> = c
        .argv
        .iter()
        .map(|a| if a.starts_with('#') { (*a).to_owned() } else { sandbox.rewrite(a) })
        .collect();
    let path = format!("{}:{}", sandbox.path("bin").display(), std::env::var("PATH").unwrap_or_default());
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .env_clear()
        .env("PATH", &path)
        .env("NODE_NAME", "gpu-node-1")
        .env("KUBECONFIG", sandbox.path("kubeconfig"))
        .env("HOME", sandbox.path("."))
        .envs(c.env.iter().map(|(k, v)| (*k, sandbox.rewrite(v))))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // `bash` is looked up on the test's PATH (the image has it at /bin/bash).
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("{} {}: {e}", c.chart, c.name));
    let deadline = Instant::now() + wait;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut out = String::new();
    child.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    child.stderr.take().unwrap().read_to_string(&mut out).unwrap();
    (status, out)
}

#[test]
fn each_chart_container_gets_past_start_up_validation() {
    let sandbox = Sandbox::new();
    let mut report = Vec::new();
    for c in containers() {
        let (status, out) = run(&sandbox, &c, Duration::from_secs(4));
        let who = format!(
            "{} {} ({} → {})",
            c.chart,
            c.name,
            c.upstream,
            Path::new(c.ours).file_name().unwrap().to_string_lossy()
        );
        // clap's exit code and messages, and our start-up validation's, never appear.
        assert_ne!(status, Some(2), "{who} refused its chart's command line:\n{out}");
        for refusal in ["unexpected argument", "invalid value", "error: ", "Usage:", "feature gate"] {
            assert!(!out.contains(refusal), "{who} printed {refusal:?}:\n{out}");
        }
        // It started: the gates (where it has any) were accepted and logged.
        if c.argv.iter().any(|a| a.starts_with("--feature-gates"))
            || c.env.iter().any(|(k, _)| *k == "FEATURE_GATES")
        {
            assert!(out.contains("Feature Gates"), "{who} did not get to its gates:\n{out}");
        }
        match status {
            None => report.push(format!("{who}: running after 4 s")),
            Some(code) => {
                // No cluster or no GPU: whichever the component meets first.
                assert!(
                    NO_CLUSTER.iter().chain(NO_GPU).any(|w| out.contains(w)),
                    "{who} exited {code} for another reason than the missing cluster/GPU:\n{out}"
                );
                let last = out.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or_default().to_owned();
                report.push(format!("{who}: exit {code}: {last}"));
            }
        }
    }
    println!("{}", report.join("\n"));
}

/// The mock backend under a chart whose command line is fixed: vgpu-manager's charts take no extra
/// arguments, only extra env (`devicePlugin.devicePlugin.env`, `devicePlugin.deviceMonitor.env`,
/// `kubeletPlugin.containers.plugin.env`), so `VGPU_BACKEND=mock` + `VGPU_MOCK_CONFIG` select it (the e2e test
/// `real_node_upstream_charts` runs vgpu-manager's charts on the real node that way). Each node component,
/// started with its chart's command line plus those two variables, opens the mock GPU and then stops only
/// for want of the cluster — never at the backend (with `auto` on a host without GPUs it stops there).
#[test]
fn node_components_take_the_mock_backend_from_the_chart_env() {
    let sandbox = Sandbox::new();
    let mock = sandbox.path("driver-root/mock.yaml");
    std::fs::write(
        &mock,
        "gpus:\n  - { uuid: GPU-ENV-0, name: NVIDIA A30, memoryMiB: 24576, computeCapability: '8.0', minor: 0 }\n",
    )
    .unwrap();
    let mock: &'static str = mock.display().to_string().leak();
    for c in
        containers().into_iter().filter(|c| c.upstream.contains("plugin") || c.upstream == "device-monitor")
    {
        let mut env = c.env.to_vec();
        env.extend([("VGPU_BACKEND", "mock"), ("VGPU_MOCK_CONFIG", mock)]);
        // Past the backend they would write their node files: into the sandbox's manager directory (the
        // chart's mount point, /etc/vgpu-manager, which the chart command lines leave to the default), never
        // this host's.
        let mut argv = c.argv.to_vec();
        if c.upstream == "device-plugin" {
            argv.push("--manager-dir=/etc/vgpu-manager");
        }
        env.push(("MANAGER_DIR", "/etc/vgpu-manager"));
        let with_mock = Container { env: env.leak(), argv: argv.leak(), ..c };
        let (status, out) = run(&sandbox, &with_mock, Duration::from_secs(4));
        let who = format!("{} {}", with_mock.chart, with_mock.name);
        assert_ne!(status, Some(2), "{who} refused VGPU_BACKEND/VGPU_MOCK_CONFIG:\n{out}");
        assert!(!NO_GPU.iter().any(|w| out.contains(w)), "{who} did not open the mock backend:\n{out}");
        if status.is_some() {
            assert!(NO_CLUSTER.iter().any(|w| out.contains(w)), "{who} stopped for another reason:\n{out}");
        }
    }
}
