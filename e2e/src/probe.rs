//! What a container on the real node sees, printed by the container itself: its environment, its mounts,
//! its `/dev`, and (hex-dumped) its `vgpu.config`. The test reads the pod's log through the API server and
//! compares it with what the plugins promised. Also the fake GPU device nodes the node's containers get:
//! character devices with `/dev/null`'s numbers under a temporary driver root, never in the host's `/dev`.

use std::{collections::BTreeMap, path::Path, time::Duration};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Pod;
use kube::{Api, api::LogParams};
use serde_json::{Value, json};

use crate::{RealNode, SCHEDULER_NAME, TestEnv};

/// The shell script a probe container runs (busybox `sh`): prints the sections, then waits for SIGTERM.
/// `vgpu.config` is dumped only when it is mounted.
pub const SCRIPT: &str = "trap 'exit 0' TERM; \
echo '=== env'; env; \
echo '=== mounts'; cat /proc/self/mountinfo; \
echo '=== dev'; ls -l /dev; \
echo '=== vgpu.config'; [ -f /etc/vgpu-manager/config/vgpu.config ] && od -An -tx1 -v /etc/vgpu-manager/config/vgpu.config; \
echo '=== end'; while true; do sleep 1; done";

/// The sections of a probe container's log.
#[derive(Debug, Default, Clone)]
pub struct Probe {
    /// `env`: name → value.
    pub env: BTreeMap<String, String>,
    /// `/proc/self/mountinfo` lines.
    pub mounts: Vec<String>,
    /// `ls -l /dev` lines.
    pub dev: Vec<String>,
    /// The bytes of `/etc/vgpu-manager/config/vgpu.config` (empty when it is not mounted).
    pub vgpu_config: Vec<u8>,
}

impl Probe {
    /// Parses a log of [`SCRIPT`]; fails when the log does not reach its end marker.
    pub fn parse(log: &str) -> Result<Self> {
        let mut probe = Probe::default();
        let mut section = "";
        let mut ended = false;
        for line in log.lines() {
            if let Some(name) = line.strip_prefix("=== ") {
                section = name.trim();
                ended |= section == "end";
                continue;
            }
            match section {
                "env" => {
                    if let Some((k, v)) = line.split_once('=') {
                        probe.env.insert(k.to_owned(), v.to_owned());
                    }
                }
                "mounts" => probe.mounts.push(line.to_owned()),
                "dev" => probe.dev.push(line.to_owned()),
                "vgpu.config" => {
                    for byte in line.split_whitespace() {
                        probe.vgpu_config.push(
                            u8::from_str_radix(byte, 16)
                                .with_context(|| format!("od byte {byte:?} in {line:?}"))?,
                        );
                    }
                }
                _ => {}
            }
        }
        if !ended {
            bail!("the probe's log has no end marker (the container did not finish printing):\n{log}");
        }
        Ok(probe)
    }

    /// Whether something is mounted at `target` in the container.
    pub fn mounted(&self, target: &str) -> bool {
        // mountinfo: id parent major:minor root mount-point options ...
        self.mounts.iter().any(|l| l.split_whitespace().nth(4) == Some(target))
    }

    /// The `ls -l` line of `/dev/<name>`, when present.
    pub fn device(&self, name: &str) -> Option<&str> {
        self.dev.iter().map(String::as_str).find(|l| l.split_whitespace().last() == Some(name))
    }
}

/// Creates `<root>/dev/<name>` for each name as a character device with `/dev/null`'s numbers (1, 3): the
/// fake GPU nodes a container runtime can hand to a container (it refuses anything but a device node).
pub fn fake_device_nodes(root: &Path, names: &[&str]) -> Result<()> {
    let dev = root.join("dev");
    std::fs::create_dir_all(&dev).with_context(|| format!("creating {}", dev.display()))?;
    for name in names {
        let path = dev.join(name);
        let status = std::process::Command::new("mknod")
            .args([path.as_os_str(), "c".as_ref(), "1".as_ref(), "3".as_ref()])
            .status()
            .with_context(|| format!("running mknod for {}", path.display()))?;
        if !status.success() {
            bail!("mknod {} c 1 3 failed: {status}", path.display());
        }
    }
    Ok(())
}

/// A pod for our scheduler whose one container `container` runs [`SCRIPT`] in `image` (never pulled) with
/// `resources` (e.g. `{"limits": {...}}` or `{"claims": [...]}`); `spec` adds fields to the pod spec (e.g.
/// `resourceClaims`).
pub fn pod(
    namespace: &str,
    name: &str,
    container: &str,
    image: &str,
    resources: Value,
    spec: Value,
) -> Result<Pod> {
    let mut pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "schedulerName": SCHEDULER_NAME,
            "terminationGracePeriodSeconds": 2,
            "containers": [{
                "name": container,
                "image": image,
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", SCRIPT],
                "resources": resources,
            }],
        },
    });
    if let (Some(extra), Some(target)) = (spec.as_object(), pod["spec"].as_object_mut()) {
        target.extend(extra.clone());
    }
    Ok(serde_json::from_value(pod)?)
}

/// Waits until pod `name` is `Running`, then until its log holds the whole probe; on time-out the error
/// carries the pod's status, the tail of `component`'s log and the node's logs.
pub async fn running(
    env: &TestEnv,
    node: &RealNode,
    pods: &Api<Pod>,
    name: &str,
    component: &str,
    timeout: Duration,
) -> Result<(Pod, Probe)> {
    let running = env
        .poll(&format!("pod {name} Running"), timeout, || async {
            let pod = pods.get(name).await.ok()?;
            (pod.status.as_ref()?.phase.as_deref() == Some("Running")).then_some(pod)
        })
        .await;
    let pod = match running {
        Ok(pod) => pod,
        Err(e) => bail!(
            "{e}\npod status: {:?}\n{component}:\n{}\n{}",
            pods.get(name).await.ok().and_then(|p| p.status),
            env.log_tail(component, 40),
            node.log_tails(40)
        ),
    };
    let probe = env
        .poll(&format!("the probe log of {name}"), timeout, || async {
            Probe::parse(&pods.logs(name, &LogParams::default()).await.ok()?).ok()
        })
        .await?;
    Ok((pod, probe))
}

/// The host side of a real node's fake GPUs: a driver root whose `dev/` holds `nvidia0..<gpus>`,
/// `nvidiactl` and `nvidia-uvm` ([`fake_device_nodes`]), and the manager directory the plugins share with
/// containers.
#[derive(Debug, Clone)]
pub struct GpuHost {
    /// `--host-driver-root` and `--container-driver-root` of both plugins.
    pub driver_root: std::path::PathBuf,
    /// `--manager-dir` / `--host-manager-dir`.
    pub manager_dir: std::path::PathBuf,
}

impl GpuHost {
    /// Creates `<dir>/driver-root` with `gpus` fake GPU nodes and the control nodes, and `<dir>/manager`
    /// (empty: the runtime files are the test's to install).
    pub fn create(dir: &Path, gpus: u32) -> Result<Self> {
        let driver_root = dir.join("driver-root");
        let names: Vec<String> = (0..gpus)
            .map(|i| format!("nvidia{i}"))
            .chain(["nvidiactl".into(), "nvidia-uvm".into()])
            .collect();
        fake_device_nodes(&driver_root, &names.iter().map(String::as_str).collect::<Vec<_>>())?;
        let manager_dir = dir.join("manager");
        std::fs::create_dir_all(&manager_dir)
            .with_context(|| format!("creating {}", manager_dir.display()))?;
        Ok(Self { driver_root, manager_dir })
    }

    /// `vgpu-device-plugin`'s arguments for `node` with the mock backend described by `mock`: the kubelet's
    /// folders and sockets, this host's folders, the environment's kubeconfig.
    pub fn device_plugin_args(&self, env: &TestEnv, node: &RealNode, mock: &Path) -> Vec<String> {
        let path = |p: &Path| p.display().to_string();
        vec![
            "--backend=mock".to_owned(),
            format!("--mock-config={}", path(mock)),
            format!("--node-name={}", node.node_name()),
            format!("--kubeconfig={}", path(env.kubeconfig_path())),
            format!("--device-plugin-path={}", path(&node.device_plugin_dir())),
            format!("--kubelet-root={}", path(&node.root_dir())),
            format!("--pod-resources-socket={}", path(&node.pod_resources_socket())),
            format!("--manager-dir={}", path(&self.manager_dir)),
            format!("--host-manager-dir={}", path(&self.manager_dir)),
            format!("--host-driver-root={}", path(&self.driver_root)),
            format!("--container-driver-root={}", path(&self.driver_root)),
        ]
    }

    /// `vgpu-kubelet-plugin`'s arguments for `node` with the mock backend described by `mock` (its node name
    /// goes in the `NODE_NAME` env): the kubelet's plugin folders, containerd's CDI folder, this host's
    /// folders, no health-check port.
    pub fn kubelet_plugin_args(&self, env: &TestEnv, node: &RealNode, mock: &Path) -> Vec<String> {
        let path = |p: &Path| p.display().to_string();
        vec![
            "--backend=mock".to_owned(),
            format!("--mock-config={}", path(mock)),
            format!("--kubeconfig={}", path(env.kubeconfig_path())),
            format!("--kubelet-registrar-directory-path={}", path(&node.plugins_registry_dir())),
            format!("--kubelet-plugins-directory-path={}", path(&node.plugins_dir())),
            format!("--cdi-root={}", path(&node.cdi_dir())),
            format!("--host-manager-dir={}", path(&self.manager_dir)),
            format!("--nvidia-driver-root={}", path(&self.driver_root)),
            format!("--container-driver-root={}", path(&self.driver_root)),
            "--healthcheck-port=0".to_owned(),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_sections() {
        let log = "=== env\nA=1\nB=x=y\n=== mounts\n1 0 0:1 / /etc/ld.so.preload ro - x y\n=== dev\n\
                   crw-rw-rw- 1 root root 1, 3 Dec 5 19:00 nvidia0\n=== vgpu.config\n 56 47\n 43 46\n=== end\n";
        let probe = Probe::parse(log).unwrap();
        assert_eq!(probe.env["B"], "x=y");
        assert!(probe.mounted("/etc/ld.so.preload"));
        assert!(!probe.mounted("/etc"));
        assert!(probe.device("nvidia0").unwrap().starts_with('c'));
        assert_eq!(probe.vgpu_config, b"VGCF");
        assert!(Probe::parse("=== env\nA=1\n").is_err());
    }
}
