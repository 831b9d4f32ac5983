//! A real Kubernetes node for the e2e tests ([`RealNode`]): the upstream kubelet (the control plane's
//! version) on containerd with Debian's runc and CNI plugins; only the GPU is mocked (by the tests' own
//! device plugins, DRA drivers and NRI plugins, which register with this kubelet and containerd).
//!
//! | piece | what |
//! |---|---|
//! | binaries | `kubelet`, `containerd`, `containerd-shim-runc-v2`, `ctr` and the two image archives from `e2e/build-node.sh`: `$VGPU_E2E_NODE_DIR`, else `${VGPU_E2E_CACHE:-~/.cache/vgpu-e2e}/node-k8s-<ver>_containerd-<ver>` ([`NodeBinaries`]) |
//! | images | [`BUSYBOX_IMAGE`] (Debian's static busybox, applet links in `/bin`) and [`PAUSE_IMAGE`] (the sandbox), imported with `ctr images import`; never pulled: pods use `imagePullPolicy: Never` |
//! | containerd | its own root, state, socket, shim socket folder and runc root under the node folder; CRI with CDI specs read from [`RealNode::cdi_dir`], NRI on [`RealNode::nri_socket`], `restrict_oom_score_adj` (root lacks `CAP_SYS_RESOURCE` on the CI machines), netns mounts under its state folder |
//! | network | a bridge of its own (`vgpue2e<id>`) holding the gateway of a free `10.217.<n>.0/24`, which is also the node's `InternalIP` (the kubelet refuses loopback node IPs); bridge + host-local (state in the node folder) + portmap, loopback by containerd; no masquerading: pods reach the host and each other only |
//! | kubelet | `failCgroupV1: false`, cgroupfs under a cgroup root of its own (`/vgpu-e2e-<id>`), anonymous authentication and `AlwaysAllow` (the API server's kubelet client has no certificate), root folder under the node folder, the environment's admin kubeconfig, image GC and eviction thresholds that never fire; in a mount namespace of its own where the node's device-plugin folder is bound on the compiled-in `/var/lib/kubelet/device-plugins` and tmpfs hide `/var/lib` and `/var/log` (the host's are never written); the node folder is a shared mount, so its volume mounts reach containerd |
//! | kube-proxy | only with [`RealNodeBuilder::kube_proxy`]: iptables mode, the pod network as its cluster CIDR, the environment's admin kubeconfig; with [`crate::TestEnvBuilder::cluster_services`] pods then reach the API server through the `kubernetes` Service, as in-cluster clients do |
//! | teardown | kube-proxy and kubelet stopped, every task and container deleted through `ctr`, containerd stopped, this node's shims and the processes left in its cgroups killed, mounts under the node folder unmounted (deepest first), its iptables chains, bridge, cgroups and CNI cache entries deleted, the kernel settings the kubelet and the bridge plugin change restored, the node folder removed |
//!
//! The API server must reach the kubelet by `InternalIP` (for logs, exec): start the environment with
//! [`env_builder`] (or add [`KUBELET_ADDRESS_TYPES_ARG`] yourself). Declare the node after the
//! environment, so that it is dropped (torn down) first. Run one real node at a time on a host (the e2e
//! tests run one at a time): the kubelet's iptables chains and kernel settings are the host's, and a node's
//! teardown deletes and restores them.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use vgpu_e2e::real_node::{self, RealNode};
//! let Some(binaries) = real_node::locate_or_skip()? else { return Ok(()) }; // "skipped: ..." on stderr
//! let env = real_node::env_builder("my_test").start().await?;
//! let mut node = RealNode::builder().binaries(binaries).feature_gate("DynamicResourceAllocation", true).start(&env).await?;
//! // ... pods with spec.nodeName = node.node_name(), image real_node::BUSYBOX_IMAGE, imagePullPolicy Never ...
//! node.stop()?;
//! env.finish();
//! # Ok(())
//! # }
//! ```

use std::collections::hash_map::RandomState;
use std::collections::{BTreeMap, BTreeSet};
use std::hash::{BuildHasher, Hasher};
use std::io::Write;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use rustix::process::{Pid, Signal};
use serde_json::{Value, json};

use crate::binaries::{K8S_VERSION, default_bin_dir};
use crate::env::{TestEnv, TestEnvBuilder};
use crate::net::free_ports;
use crate::process::{ManagedProcess, log_tail};

/// Environment variable naming the folder `e2e/build-node.sh` built (kubelet, containerd, images).
pub const NODE_DIR_ENV: &str = "VGPU_E2E_NODE_DIR";
/// `github.com/containerd/containerd/v2` version of containerd (see `e2e/node/go.mod`).
pub const CONTAINERD_VERSION: &str = "v2.4.2";
/// The test image: Debian's static busybox with a link per applet in `/bin`, `Cmd ["sh"]`.
pub const BUSYBOX_IMAGE: &str = "registry.local/vgpu-e2e/busybox:1";
/// The sandbox image (containerd's pinned `sandbox` image): `e2e/node/pause` alone.
pub const PAUSE_IMAGE: &str = "registry.local/vgpu-e2e/pause:1";
/// The containerd namespace of the CRI plugin (where the kubelet's pods live).
pub const CRI_NAMESPACE: &str = "k8s.io";
/// The kube-apiserver argument the real node needs: the kubelet is reached at its `InternalIP` (the
/// node name does not resolve). [`env_builder`] adds it.
pub const KUBELET_ADDRESS_TYPES_ARG: &str = "--kubelet-preferred-address-types=InternalIP,Hostname";
/// Where Debian's `containernetworking-plugins` installs the CNI plugins.
pub const CNI_BIN_DIR: &str = "/usr/lib/cni";
/// The node name unless [`RealNodeBuilder::name`] sets another.
pub const DEFAULT_NODE_NAME: &str = "e2e-node";

/// The CNI plugins the node's network uses (`loopback` through containerd's own loopback network).
const CNI_PLUGINS: [&str; 4] = ["bridge", "host-local", "portmap", "loopback"];
/// Searched after `$PATH` for runc, ip, iptables: root's usual folders.
const SYSTEM_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// containerd's limit on the length of its shim socket folder (Linux).
const SHIM_SOCKET_DIR_MAX: usize = 42;
/// The kernel settings the kubelet sets at start (its kernel tunables) and the bridge plugin sets
/// (IPv4 forwarding for the gateway); each is put back at teardown.
const SYSCTLS: [&str; 8] = [
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
    "net/ipv4/ip_forward",
    "net/ipv4/conf/all/route_localnet",
];
const IPTABLES_TABLES: [&str; 3] = ["filter", "nat", "mangle"];
/// Runs the kubelet in a mount namespace of its own (`unshare --mount --propagation unchanged`) where
/// tmpfs hide `/var/lib` and `/var/log`, and the node's device-plugin folder (`$0`) is bound on
/// `/var/lib/kubelet/device-plugins`, the path the kubelet's device manager has compiled in (it ignores
/// `--root-dir`); `/var/log/containers`, its other fixed path, lands in the tmpfs. The kubelet's own
/// mounts (volumes) are under the node folder, a shared mount, so they reach containerd's namespace.
const KUBELET_NAMESPACE_SCRIPT: &str = r#"set -e
for d in /var/lib /var/log; do
  mount --make-private "$(findmnt --noheadings --output TARGET --target "$d")"
  mount -t tmpfs -o mode=0755,size=64m vgpu-e2e-kubelet "$d"
done
mkdir -p /var/lib/kubelet/device-plugins
mount --bind "$0" /var/lib/kubelet/device-plugins
exec "$@"
"#;
/// libcni's result cache (containerd's CRI does not move it).
const CNI_CACHE_DIR: &str = "/var/lib/cni";
/// The first two octets of the pod networks; the third is the first free one.
const POD_NETWORK_PREFIX: [u8; 2] = [10, 217];
const CONTAINERD_START_TIMEOUT: Duration = Duration::from_secs(30);
const KUBELET_START_TIMEOUT: Duration = Duration::from_secs(60);
/// One `ctr`, `ip`, `iptables` or `umount` call.
const COMMAND_TIMEOUT_S: u32 = 30;
/// How long teardown waits for killed processes to leave their cgroups.
const CGROUP_DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// The folder `e2e/build-node.sh` builds into by default:
/// `${VGPU_E2E_CACHE:-${XDG_CACHE_HOME:-~/.cache}/vgpu-e2e}/node-k8s-<ver>_containerd-<ver>`.
///
/// `None` when neither `VGPU_E2E_CACHE`, `XDG_CACHE_HOME` nor `HOME` is set.
pub fn default_node_dir() -> Option<PathBuf> {
    let cache = default_bin_dir()?.parent()?.to_path_buf();
    Some(cache.join(format!("node-k8s-{K8S_VERSION}_containerd-{CONTAINERD_VERSION}")))
}

/// The node's programs and image archives, as `e2e/build-node.sh` lays them out.
#[derive(Debug, Clone)]
pub struct NodeBinaries {
    /// The folder holding them.
    pub dir: PathBuf,
    /// `kubelet` (k8s [`K8S_VERSION`]).
    pub kubelet: PathBuf,
    /// `kube-proxy` (k8s [`K8S_VERSION`]; started only by [`RealNodeBuilder::kube_proxy`]).
    pub kube_proxy: PathBuf,
    /// `containerd` ([`CONTAINERD_VERSION`]).
    pub containerd: PathBuf,
    /// `containerd-shim-runc-v2`.
    pub containerd_shim: PathBuf,
    /// `ctr`.
    pub ctr: PathBuf,
    /// The OCI archive of [`BUSYBOX_IMAGE`].
    pub busybox_archive: PathBuf,
    /// The OCI archive of [`PAUSE_IMAGE`].
    pub pause_archive: PathBuf,
}

impl NodeBinaries {
    /// The node in `dir`; fails naming the first missing file and how to build it.
    pub fn in_dir(dir: &Path) -> Result<Self> {
        let found = Self {
            dir: dir.to_owned(),
            kubelet: dir.join("kubelet"),
            kube_proxy: dir.join("kube-proxy"),
            containerd: dir.join("containerd"),
            containerd_shim: dir.join("containerd-shim-runc-v2"),
            ctr: dir.join("ctr"),
            busybox_archive: dir.join("busybox.oci.tar"),
            pause_archive: dir.join("pause.oci.tar"),
        };
        for path in [
            &found.kubelet,
            &found.kube_proxy,
            &found.containerd,
            &found.containerd_shim,
            &found.ctr,
            &found.busybox_archive,
            &found.pause_archive,
        ] {
            if !path.is_file() {
                bail!(
                    "real-node file {} is missing; build the node with e2e/build-node.sh (kubelet {K8S_VERSION}, \
                     containerd {CONTAINERD_VERSION}) or point {NODE_DIR_ENV} at the folder it printed",
                    path.display()
                );
            }
        }
        Ok(found)
    }

    /// `$VGPU_E2E_NODE_DIR` when set (an error if the node is not complete there), else the cache folder
    /// of [`default_node_dir`] when the node is complete there; `Ok(None)` when it was never built.
    pub fn locate() -> Result<Option<Self>> {
        if let Some(dir) = std::env::var_os(NODE_DIR_ENV).filter(|v| !v.is_empty()) {
            return Self::in_dir(Path::new(&dir)).map(Some);
        }
        match default_node_dir() {
            Some(dir) => Ok(Self::in_dir(&dir).ok()),
            None => Ok(None),
        }
    }
}

/// Why this host cannot run a real node (not root, no runc, no CNI plugins, no `ip`, no cgroup file
/// system), or `None` when it can.
pub fn host_problem() -> Option<String> {
    if !rustix::process::geteuid().is_root() {
        return Some("the real node needs root (containerd, runc, mounts, cgroups, the bridge)".to_owned());
    }
    if find_program("runc").is_none() {
        return Some("runc not found (Debian package runc; e2e/build-node.sh installs it)".to_owned());
    }
    if let Some(plugin) = CNI_PLUGINS.iter().find(|p| !Path::new(CNI_BIN_DIR).join(p).is_file()) {
        return Some(format!(
            "CNI plugin {CNI_BIN_DIR}/{plugin} not found (Debian package containernetworking-plugins)"
        ));
    }
    if find_program("ip").is_none() {
        return Some("ip not found (Debian package iproute2)".to_owned());
    }
    if let Some(tool) =
        ["unshare", "findmnt", "mount", "umount"].into_iter().find(|t| find_program(t).is_none())
    {
        return Some(format!("{tool} not found (Debian package util-linux or mount)"));
    }
    match mounts() {
        Ok(mounts) if mounts.iter().any(|m| m.fs_type.starts_with("cgroup")) => None,
        Ok(_) => Some("no cgroup file system is mounted".to_owned()),
        Err(e) => Some(format!("cannot read the mount table: {e:#}")),
    }
}

/// The node binaries, or `Ok(None)` after printing `skipped: <reason>` on stderr when they were never
/// built or this host cannot run a node ([`host_problem`]); an error when `$VGPU_E2E_NODE_DIR` is set but
/// incomplete. The start of every real-node test.
pub fn locate_or_skip() -> Result<Option<NodeBinaries>> {
    let reason = match NodeBinaries::locate()? {
        None => format!(
            "the real node is not built: {NODE_DIR_ENV} is unset and {} is incomplete; build it with \
             e2e/build-node.sh (or set {NODE_DIR_ENV})",
            default_node_dir().map_or_else(|| "the cache folder".to_owned(), |d| d.display().to_string())
        ),
        Some(binaries) => match host_problem() {
            None => return Ok(Some(binaries)),
            Some(problem) => format!("this host cannot run the real node: {problem}"),
        },
    };
    // Straight to the stderr handle: the test harness captures `eprintln!` of passing tests.
    let _ = writeln!(std::io::stderr(), "skipped: {reason}");
    Ok(None)
}

/// [`TestEnv::builder`] with [`KUBELET_ADDRESS_TYPES_ARG`]: an environment whose API server reaches
/// the real node's kubelet (pod logs, exec).
pub fn env_builder(name: impl Into<String>) -> TestEnvBuilder {
    TestEnv::builder(name).apiserver_arg(KUBELET_ADDRESS_TYPES_ARG)
}

/// The start of a real-node test with the default node: [`locate_or_skip`], an environment from
/// [`env_builder`] named `name`, and a [`RealNode`] started against it (Ready). `Ok(None)` when the test
/// skips. Bind the pair in this order (`let Some((env, node)) = ...`): the node is then dropped, and torn
/// down, before the environment.
pub async fn start_env_and_node(name: &str) -> Result<Option<(TestEnv, RealNode)>> {
    let Some(binaries) = locate_or_skip()? else { return Ok(None) };
    let env = env_builder(name).start().await?;
    let node = RealNode::builder().binaries(binaries).start(&env).await?;
    Ok(Some((env, node)))
}

/// Configures and starts a [`RealNode`].
#[derive(Debug, Clone)]
pub struct RealNodeBuilder {
    name: String,
    feature_gates: BTreeMap<String, bool>,
    kubelet_config: serde_json::Map<String, Value>,
    kubelet_args: Vec<String>,
    binaries: Option<NodeBinaries>,
    ready_timeout: Duration,
    kube_proxy: bool,
}

impl RealNodeBuilder {
    /// The node name (default [`DEFAULT_NODE_NAME`]; also the kubelet's `--hostname-override`).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// Sets a kubelet feature gate (`featureGates` of its configuration).
    pub fn feature_gate(mut self, name: &str, enabled: bool) -> Self {
        self.feature_gates.insert(name.to_owned(), enabled);
        self
    }

    /// Sets a top-level field of the `KubeletConfiguration` over the node's defaults (e.g.
    /// `("cpuManagerPolicy", json!("static"))`).
    pub fn kubelet_config(mut self, field: &str, value: Value) -> Self {
        self.kubelet_config.insert(field.to_owned(), value);
        self
    }

    /// Also runs kube-proxy (iptables mode) once the node is `Ready`, so that pods reach Services (the
    /// `kubernetes` Service included, with [`crate::TestEnvBuilder::cluster_services`]).
    pub fn kube_proxy(mut self) -> Self {
        self.kube_proxy = true;
        self
    }

    /// Appends a raw kubelet argument (later flags win).
    pub fn kubelet_arg(mut self, arg: impl Into<String>) -> Self {
        self.kubelet_args.push(arg.into());
        self
    }

    /// Uses these binaries instead of [`NodeBinaries::locate`].
    pub fn binaries(mut self, binaries: NodeBinaries) -> Self {
        self.binaries = Some(binaries);
        self
    }

    /// How long to wait for the Node to be `Ready` (default 120 s).
    pub fn ready_timeout(mut self, timeout: Duration) -> Self {
        self.ready_timeout = timeout;
        self
    }

    /// Starts containerd, imports the images, starts the kubelet and waits until the Node is `Ready`.
    /// On error everything started so far is torn down.
    pub async fn start(self, env: &TestEnv) -> Result<RealNode> {
        let binaries = match self.binaries.clone() {
            Some(b) => b,
            None => NodeBinaries::locate()?.with_context(|| {
                format!("the real node is not built: run e2e/build-node.sh (or set {NODE_DIR_ENV})")
            })?,
        };
        if let Some(problem) = host_problem() {
            bail!("this host cannot run the real node: {problem}");
        }
        let runc = find_program("runc").context("runc not found")?;
        let id = unique_id();
        let mut dir = env.workdir().join("node");
        if dir.join("s").as_os_str().len() > SHIM_SOCKET_DIR_MAX {
            // A long $TMPDIR: containerd would refuse the shim socket folder.
            dir = std::env::temp_dir().join(format!("vgpu-node-{id}"));
            if dir.join("s").as_os_str().len() > SHIM_SOCKET_DIR_MAX {
                dir = PathBuf::from(format!("/tmp/vgpu-node-{id}"));
            }
        }
        let network = NodeNetwork::choose(&id)?;
        let [kubelet_port, healthz_port] =
            free_ports(2)?.try_into().map_err(|_| anyhow!("free_ports returned a wrong count"))?;
        let path =
            format!("{}:{}:{SYSTEM_PATH}", binaries.dir.display(), std::env::var("PATH").unwrap_or_default());
        let mut node = RealNode {
            name: self.name.clone(),
            log_dir: env.workdir().to_owned(),
            cgroup_root: format!("vgpu-e2e-{id}"),
            host: HostSnapshot::take(),
            process_env: vec![("PATH".to_owned(), path)],
            containerd: None,
            kubelet: None,
            kube_proxy: None,
            containerd_args: Vec::new(),
            kubelet_args: Vec::new(),
            healthz_port,
            kubelet_port,
            sandbox_ids: BTreeSet::new(),
            torn_down: false,
            created_dir: false,
            network,
            binaries,
            dir,
        };
        node.prepare(&runc)?;
        node.start_containerd().await?;
        node.import_images()?;
        node.write_kubelet_config(&self, env)?;
        node.start_kubelet().await?;
        let client = env.client().await?;
        node.wait_ready(&client, self.ready_timeout).await?;
        if self.kube_proxy {
            node.start_kube_proxy(env).await?;
        }
        Ok(node)
    }
}

/// A running node: containerd and the kubelet, registered and `Ready`; see the [module docs](self).
///
/// Dropping it tears everything down (see [`RealNode::stop`], whose errors a drop can only print).
#[derive(Debug)]
pub struct RealNode {
    name: String,
    binaries: NodeBinaries,
    /// The node folder: containerd's and the kubelet's state, configuration, CNI and CDI folders.
    dir: PathBuf,
    created_dir: bool,
    /// The environment's folder, where the logs go (kept with the environment's on failure).
    log_dir: PathBuf,
    /// Relative to each cgroup mount (no leading `/`).
    cgroup_root: String,
    network: NodeNetwork,
    host: HostSnapshot,
    process_env: Vec<(String, String)>,
    containerd: Option<ManagedProcess>,
    kubelet: Option<ManagedProcess>,
    kube_proxy: Option<ManagedProcess>,
    containerd_args: Vec<String>,
    kubelet_args: Vec<String>,
    healthz_port: u16,
    kubelet_port: u16,
    /// Every pod sandbox seen by teardown (their CNI cache entries are removed).
    sandbox_ids: BTreeSet<String>,
    torn_down: bool,
}

impl RealNode {
    /// A builder with the defaults ([`DEFAULT_NODE_NAME`], no feature gates, 120 s to be `Ready`).
    pub fn builder() -> RealNodeBuilder {
        RealNodeBuilder {
            name: DEFAULT_NODE_NAME.to_owned(),
            feature_gates: BTreeMap::new(),
            kubelet_config: serde_json::Map::new(),
            kubelet_args: Vec::new(),
            binaries: None,
            ready_timeout: Duration::from_secs(120),
            kube_proxy: false,
        }
    }

    /// The node's name.
    pub fn node_name(&self) -> &str {
        &self.name
    }

    /// The node's `InternalIP`: the gateway address of its bridge (the kubelet serves there).
    pub fn node_ip(&self) -> Ipv4Addr {
        self.network.gateway
    }

    /// The kubelet's HTTPS port on [`RealNode::node_ip`].
    pub fn kubelet_port(&self) -> u16 {
        self.kubelet_port
    }

    /// The pod network, `10.217.<n>.0/24`.
    pub fn pod_cidr(&self) -> String {
        format!("{}/24", self.network.subnet)
    }

    /// The node folder (containerd's root and state, the kubelet's root, CNI, CDI and NRI folders).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The binaries in use.
    pub fn binaries(&self) -> &NodeBinaries {
        &self.binaries
    }

    /// The kubelet's `--root-dir`.
    pub fn root_dir(&self) -> PathBuf {
        self.dir.join("kubelet")
    }

    /// `<root>/device-plugins`: device plugins put their sockets here; the kubelet's registration
    /// socket is [`RealNode::device_plugin_socket`]. The kubelet sees this folder at the path compiled
    /// into it, `/var/lib/kubelet/device-plugins` (bound there in its own mount namespace only).
    pub fn device_plugin_dir(&self) -> PathBuf {
        self.root_dir().join("device-plugins")
    }

    /// `<root>/device-plugins/kubelet.sock`, the kubelet's device-plugin `Registration` service.
    pub fn device_plugin_socket(&self) -> PathBuf {
        self.device_plugin_dir().join("kubelet.sock")
    }

    /// `<root>/plugins_registry`: where plugins (DRA drivers, CSI) put their registration sockets.
    pub fn plugins_registry_dir(&self) -> PathBuf {
        self.root_dir().join("plugins_registry")
    }

    /// `<root>/plugins`: the plugins' own folders (a DRA driver's `dra.sock`, its checkpoint).
    pub fn plugins_dir(&self) -> PathBuf {
        self.root_dir().join("plugins")
    }

    /// Waits until the Node's status advertises `count` of extended resource `resource` (what the kubelet
    /// posts once a device plugin registered and sent its devices; kube-scheduler holds a pod it finds none
    /// for as unschedulable far longer than a test waits) and returns the Node's allocatable. The error
    /// carries the tail of `component`'s log and the node's logs.
    pub async fn wait_allocatable(
        &self,
        env: &TestEnv,
        resource: &str,
        count: u32,
        component: &str,
        timeout: Duration,
    ) -> Result<BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>> {
        let nodes: kube::Api<Node> = kube::Api::all(env.client().await?);
        let want = count.to_string();
        env.poll(&format!("{count} {resource} allocatable on node {}", self.name), timeout, || async {
            let alloc = nodes.get(&self.name).await.ok()?.status?.allocatable?;
            (alloc.get(resource).map(|q| q.0.as_str()) == Some(want.as_str())).then_some(alloc)
        })
        .await
        .map_err(|e| anyhow!("{e}\n{}\n{}", env.log_tail(component, 40), self.log_tails(40)))
    }

    /// `<root>/pod-resources/kubelet.sock`, the kubelet's PodResources service.
    pub fn pod_resources_socket(&self) -> PathBuf {
        self.root_dir().join("pod-resources").join("kubelet.sock")
    }

    /// The folder containerd reads CDI specs from (its only `cdi_spec_dirs` entry).
    pub fn cdi_dir(&self) -> PathBuf {
        self.dir.join("cdi")
    }

    /// containerd's NRI socket, where NRI plugins connect.
    pub fn nri_socket(&self) -> PathBuf {
        self.dir.join("nri").join("nri.sock")
    }

    /// containerd's gRPC socket (the kubelet's `containerRuntimeEndpoint`).
    pub fn containerd_socket(&self) -> PathBuf {
        self.dir.join("containerd.sock")
    }

    /// The cgroup (cgroupfs form, e.g. `/vgpu-e2e-1a2b3c4d`) holding this node's `kubepods` tree.
    pub fn cgroup_root(&self) -> String {
        format!("/{}", self.cgroup_root)
    }

    /// [`BUSYBOX_IMAGE`]: the image of the test pods (with `imagePullPolicy: Never`).
    pub fn busybox_image(&self) -> &'static str {
        BUSYBOX_IMAGE
    }

    /// [`PAUSE_IMAGE`]: the sandbox image.
    pub fn pause_image(&self) -> &'static str {
        PAUSE_IMAGE
    }

    /// The kubelet's log file (in the environment's folder, kept with its logs).
    pub fn kubelet_log(&self) -> PathBuf {
        self.log_dir.join(format!("kubelet-{}.log", self.name))
    }

    /// containerd's log file (in the environment's folder, kept with its logs).
    pub fn containerd_log(&self) -> PathBuf {
        self.log_dir.join(format!("containerd-{}.log", self.name))
    }

    /// The last `lines` lines of the kubelet's and containerd's logs (for assertion messages).
    pub fn log_tails(&self, lines: usize) -> String {
        format!(
            "--- kubelet log:\n{}\n--- containerd log:\n{}",
            log_tail(&self.kubelet_log(), lines),
            log_tail(&self.containerd_log(), lines)
        )
    }

    /// Runs `ctr --address <socket> --namespace k8s.io <args>` and returns its stdout; fails with its
    /// stderr when it exits non-zero.
    pub fn ctr(&self, args: &[&str]) -> Result<String> {
        let socket = self.containerd_socket();
        let mut all: Vec<&str> = vec!["--address", path_str(&socket)?, "--namespace", CRI_NAMESPACE];
        all.extend_from_slice(args);
        run(&self.binaries.ctr, &all)
    }

    /// The ids of containerd's containers in the CRI namespace: every pod sandbox and container.
    pub fn container_ids(&self) -> Result<Vec<String>> {
        Ok(lines(&self.ctr(&["containers", "ls", "--quiet"])?))
    }

    /// The ids of containerd's tasks (running or stopped processes) in the CRI namespace.
    pub fn task_ids(&self) -> Result<Vec<String>> {
        // `tasks ls --quiet` prints the ids only.
        Ok(lines(&self.ctr(&["tasks", "ls", "--quiet"])?))
    }

    /// Restarts the kubelet (SIGTERM, then the same command line) and waits until it serves `/healthz`.
    /// The device-plugin manager forgets every plugin: plugins must register again (the kubelet keeps a
    /// registration back-off per plugin socket path).
    pub async fn restart_kubelet(&mut self) -> Result<()> {
        if let Some(mut kubelet) = self.kubelet.take() {
            kubelet.stop();
        }
        self.start_kubelet().await
    }

    /// Restarts containerd (SIGTERM, then the same command line) and waits until it answers; running
    /// containers survive (their shims are not containerd's children).
    pub async fn restart_containerd(&mut self) -> Result<()> {
        if let Some(mut containerd) = self.containerd.take() {
            containerd.stop();
        }
        self.start_containerd().await
    }

    /// Tears the node down (see the [module docs](self)) and fails listing what could not be cleaned up:
    /// a mount, a process, a chain, a cgroup still there. Only the first call does anything.
    pub fn stop(&mut self) -> Result<()> {
        if self.torn_down {
            return Ok(());
        }
        self.torn_down = true;
        let mut problems = self.teardown();
        problems.extend(self.leftovers());
        if problems.is_empty() {
            return Ok(());
        }
        bail!("real node {} was not torn down cleanly:\n  {}", self.name, problems.join("\n  "))
    }

    /// What this node left on the host: mounts under its folder, its shims and containerd, processes in
    /// its cgroups, its cgroups, bridge and iptables chains, and its folder. Empty after a clean
    /// [`RealNode::stop`].
    pub fn leftovers(&self) -> Vec<String> {
        let mut found = Vec::new();
        match mounts() {
            Ok(mounts) => found.extend(
                mounts
                    .iter()
                    .filter(|m| m.mount_point.starts_with(&self.dir))
                    .map(|m| format!("mount {}", m.mount_point.display())),
            ),
            Err(e) => found.push(format!("cannot read the mount table: {e:#}")),
        }
        found.extend(self.own_processes().into_iter().map(|(pid, cmd)| format!("process {pid}: {cmd}")));
        for dir in self.cgroup_dirs() {
            found.push(format!("cgroup {}", dir.display()));
        }
        if Path::new("/sys/class/net").join(&self.network.bridge).exists() {
            found.push(format!("bridge {}", self.network.bridge));
        }
        for (tool, table, chain) in self.host.new_chains() {
            found.push(format!("{tool} chain {chain} in table {table}"));
        }
        if self.created_dir && self.dir.exists() {
            found.push(format!("folder {}", self.dir.display()));
        }
        found
    }

    // --- start ---------------------------------------------------------------------------------

    fn prepare(&mut self, runc: &Path) -> Result<()> {
        if self.dir.exists() {
            bail!("the node folder {} exists already", self.dir.display());
        }
        self.created_dir = true;
        for sub in
            ["containerd", "run", "tmp", "opt", "s", "cni", "cni-ipam", "cdi", "nri/plugins", "nri/conf.d"]
        {
            let path = self.dir.join(sub);
            std::fs::create_dir_all(&path).with_context(|| format!("creating {}", path.display()))?;
        }
        std::fs::create_dir_all(self.root_dir().join("pki"))?;
        std::fs::create_dir_all(self.dir.join("pod-logs"))?;
        std::fs::create_dir_all(self.device_plugin_dir())?;
        // A shared mount: what the kubelet mounts below it from its own namespace is seen by containerd.
        let dir = path_str(&self.dir)?;
        run(Path::new("mount"), &["--bind", dir, dir])?;
        run(Path::new("mount"), &["--make-shared", dir])?;
        self.create_cgroup_root()?;
        self.network.create()?;
        self.write_cni_config()?;
        self.write_containerd_config(runc)
    }

    /// The kubelet requires its cgroup root to exist in every hierarchy; a cpuset one needs CPUs and
    /// memory nodes before anything can join it.
    fn create_cgroup_root(&self) -> Result<()> {
        for mount in mounts()?.iter().filter(|m| m.fs_type.starts_with("cgroup")) {
            let path = mount.mount_point.join(&self.cgroup_root);
            std::fs::create_dir_all(&path)
                .with_context(|| format!("creating the cgroup {}", path.display()))?;
            if mount.fs_type == "cgroup" && mount.super_options.split(',').any(|o| o == "cpuset") {
                for file in ["cpuset.cpus", "cpuset.mems"] {
                    let value = std::fs::read_to_string(mount.mount_point.join(file))
                        .with_context(|| format!("reading {file} of {}", mount.mount_point.display()))?;
                    std::fs::write(path.join(file), value.trim())
                        .with_context(|| format!("writing {file} of {}", path.display()))?;
                }
            }
        }
        Ok(())
    }

    fn write_cni_config(&self) -> Result<()> {
        let conflist = json!({
            "cniVersion": "1.0.0",
            "name": self.network.name,
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": self.network.bridge,
                    "isGateway": true,
                    "ipMasq": false,
                    "hairpinMode": true,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": self.pod_cidr(), "gateway": self.network.gateway.to_string()}]],
                        "routes": [{"dst": "0.0.0.0/0"}],
                        "dataDir": self.dir.join("cni-ipam"),
                    },
                },
                {"type": "portmap", "capabilities": {"portMappings": true}},
            ],
        });
        let path = self.dir.join("cni").join("10-vgpu-e2e.conflist");
        std::fs::write(&path, serde_json::to_vec_pretty(&conflist)?)
            .with_context(|| format!("writing {}", path.display()))
    }

    fn write_containerd_config(&mut self, runc: &Path) -> Result<()> {
        let d = |sub: &str| toml_str(&self.dir.join(sub));
        let config = format!(
            r#"# containerd of the vgpu e2e real node (written by vgpu_e2e::real_node).
version = 4
root = {root}
state = {state}
temp = {temp}
imports = []

[plugins.'io.containerd.server.v1.grpc']
  address = {socket}
[plugins.'io.containerd.server.v1.ttrpc']
  address = {ttrpc}
[plugins.'io.containerd.internal.v1.opt']
  path = {opt}
[plugins.'io.containerd.image-verifier.v1.bindir']
  bin_dir = {verifiers}
[plugins.'io.containerd.shim.v1.manager']
  socket_dir = {shim_sockets}

[plugins.'io.containerd.nri.v1.nri']
  disable = false
  socket_path = {nri_socket}
  plugin_path = {nri_plugins}
  plugin_config_path = {nri_conf}

[plugins.'io.containerd.cri.v1.images']
  snapshotter = 'overlayfs'
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = {pause}
  [plugins.'io.containerd.cri.v1.images'.registry]
    config_path = ''

[plugins.'io.containerd.cri.v1.runtime']
  # Root lacks CAP_SYS_RESOURCE on the CI machines: never lower a container's oom_score_adj below ours.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  # CDI is always on in containerd 2.x; the specs are read from this folder only.
  cdi_spec_dirs = [{cdi}]
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = 'runc'
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = 'io.containerd.runc.v2'
      runtime_path = {shim}
      sandboxer = 'podsandbox'
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = {runc}
        Root = {runc_root}
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = [{cni_bin}]
    conf_dir = {cni_conf}
    max_conf_num = 1

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = '127.0.0.1'
  stream_server_port = '0'
"#,
            root = d("containerd"),
            state = d("run"),
            temp = d("tmp"),
            socket = toml_str(&self.containerd_socket()),
            ttrpc = toml_str(&self.dir.join("containerd.sock.ttrpc")),
            opt = d("opt"),
            verifiers = d("opt/image-verifier"),
            shim_sockets = d("s"),
            nri_socket = toml_str(&self.nri_socket()),
            nri_plugins = d("nri/plugins"),
            nri_conf = d("nri/conf.d"),
            pause = toml_str(Path::new(PAUSE_IMAGE)),
            cdi = toml_str(&self.cdi_dir()),
            shim = toml_str(&self.binaries.containerd_shim),
            runc = toml_str(runc),
            runc_root = d("run/runc"),
            cni_bin = toml_str(Path::new(CNI_BIN_DIR)),
            cni_conf = d("cni"),
        );
        let path = self.dir.join("containerd.toml");
        std::fs::write(&path, config).with_context(|| format!("writing {}", path.display()))?;
        self.containerd_args = vec![format!("--config={}", path.display())];
        Ok(())
    }

    async fn start_containerd(&mut self) -> Result<()> {
        let name = format!("containerd-{}", self.name);
        let process = ManagedProcess::spawn_with_env(
            &name,
            &self.binaries.containerd,
            &self.containerd_args,
            &self.process_env,
            &self.containerd_log(),
        )?;
        self.containerd = Some(process);
        let deadline = Instant::now() + CONTAINERD_START_TIMEOUT;
        loop {
            if let Some(process) = self.containerd.as_mut() {
                process.check_running()?;
            }
            if self.containerd_socket().exists() && self.ctr(&["version"]).is_ok() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!(
                    "containerd does not answer on {} after {CONTAINERD_START_TIMEOUT:?}:\n{}",
                    self.containerd_socket().display(),
                    log_tail(&self.containerd_log(), 30)
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Imports an OCI image archive (`ctr images import --local`) and returns the names containerd holds
    /// afterwards that it did not before. Pods run it with `imagePullPolicy: Never` (or `IfNotPresent`).
    pub fn import_image_archive(&self, archive: &Path) -> Result<Vec<String>> {
        let before = lines(&self.ctr(&["images", "ls", "--quiet"])?);
        self.ctr(&["images", "import", "--local", path_str(archive)?])
            .with_context(|| format!("importing {}", archive.display()))?;
        let after = lines(&self.ctr(&["images", "ls", "--quiet"])?);
        Ok(after.into_iter().filter(|i| !before.contains(i)).collect())
    }

    fn import_images(&self) -> Result<()> {
        for archive in [&self.binaries.pause_archive, &self.binaries.busybox_archive] {
            self.ctr(&["images", "import", "--local", path_str(archive)?])
                .with_context(|| format!("importing {}", archive.display()))?;
        }
        let images = lines(&self.ctr(&["images", "ls", "--quiet"])?);
        for wanted in [PAUSE_IMAGE, BUSYBOX_IMAGE] {
            if !images.iter().any(|i| i == wanted) {
                bail!("{wanted} is not among containerd's images after the import: {images:?}");
            }
        }
        Ok(())
    }

    fn write_kubelet_config(&mut self, builder: &RealNodeBuilder, env: &TestEnv) -> Result<()> {
        let mut config = json!({
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            // Kubelets from 1.35 on refuse cgroup v1 hosts unless told otherwise.
            "failCgroupV1": false,
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": self.cgroup_root(),
            "containerRuntimeEndpoint": format!("unix://{}", self.containerd_socket().display()),
            "address": self.network.gateway.to_string(),
            "port": self.kubelet_port,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": self.healthz_port,
            // The API server's kubelet client presents no certificate.
            "authentication": {"anonymous": {"enabled": true}, "webhook": {"enabled": false}},
            "authorization": {"mode": "AlwaysAllow"},
            "podLogsDir": self.dir.join("pod-logs"),
            // Nothing is ever collected or evicted for lack of disk or memory on a shared test
            // machine: the host's disk is the node's, and other builds fill it. "0%" turns a disk
            // signal off (the kubelet skips 0% and 100%; kind does the same); a 1% threshold
            // still set DiskPressure, refused pods and failed CI when the host disk was >99% full.
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {
                "memory.available": "1Mi",
                "nodefs.available": "0%",
                "nodefs.inodesFree": "0%",
                "imagefs.available": "0%",
                "imagefs.inodesFree": "0%",
            },
            "failSwapOn": false,
            "featureGates": builder.feature_gates,
        });
        if !Path::new("/etc/resolv.conf").exists() {
            config["resolvConf"] = json!("");
        }
        if let Some(fields) = config.as_object_mut() {
            fields.extend(builder.kubelet_config.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        let path = self.log_dir.join(format!("kubelet-{}-config.json", self.name));
        std::fs::write(&path, serde_json::to_vec_pretty(&config)?)
            .with_context(|| format!("writing {}", path.display()))?;
        let root = self.root_dir();
        self.kubelet_args = vec![
            format!("--config={}", path.display()),
            format!("--kubeconfig={}", env.kubeconfig_path().display()),
            format!("--root-dir={}", root.display()),
            format!("--cert-dir={}", root.join("pki").display()),
            format!("--hostname-override={}", self.name),
            format!("--node-ip={}", self.network.gateway),
            "--v=2".to_owned(),
        ];
        self.kubelet_args.extend(builder.kubelet_args.iter().cloned());
        Ok(())
    }

    async fn start_kubelet(&mut self) -> Result<()> {
        let name = format!("kubelet-{}", self.name);
        let unshare = find_program("unshare").context("unshare not found")?;
        let mut args: Vec<String> = ["--mount", "--propagation", "unchanged", "--", "/bin/sh", "-c"]
            .into_iter()
            .map(str::to_owned)
            .collect();
        args.push(KUBELET_NAMESPACE_SCRIPT.to_owned());
        args.push(self.device_plugin_dir().display().to_string());
        args.push(self.binaries.kubelet.display().to_string());
        args.extend(self.kubelet_args.iter().cloned());
        let process =
            ManagedProcess::spawn_with_env(&name, &unshare, &args, &self.process_env, &self.kubelet_log())?;
        self.kubelet = Some(process);
        let deadline = Instant::now() + KUBELET_START_TIMEOUT;
        loop {
            if let Some(process) = self.kubelet.as_mut() {
                process.check_running()?;
            }
            if let Ok((200, body)) = crate::vgpu::http_get(self.healthz_port, "/healthz").await
                && body.trim() == "ok"
            {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!(
                    "the kubelet does not serve /healthz after {KUBELET_START_TIMEOUT:?}:\n{}",
                    log_tail(&self.kubelet_log(), 40)
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// kube-proxy in iptables mode; returns once it has written its service chains (`KUBE-SERVICES`).
    /// Conntrack settings are left as they are (a shared host); no metrics or health servers.
    async fn start_kube_proxy(&mut self, env: &TestEnv) -> Result<()> {
        let config = json!({
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "mode": "iptables",
            "clientConnection": {"kubeconfig": env.kubeconfig_path()},
            "hostnameOverride": self.name,
            "clusterCIDR": self.pod_cidr(),
            "bindAddress": self.network.gateway.to_string(),
            "healthzBindAddress": "",
            "metricsBindAddress": "",
            "iptables": {"localhostNodePorts": false, "masqueradeAll": false},
            "conntrack": {
                "maxPerCore": 0,
                "min": 0,
                "tcpEstablishedTimeout": "0s",
                "tcpCloseWaitTimeout": "0s",
            },
        });
        let path = self.log_dir.join(format!("kube-proxy-{}-config.json", self.name));
        std::fs::write(&path, serde_json::to_vec_pretty(&config)?)
            .with_context(|| format!("writing {}", path.display()))?;
        let args = vec![format!("--config={}", path.display()), "--v=2".to_owned()];
        let log = self.log_dir.join(format!("kube-proxy-{}.log", self.name));
        let name = format!("kube-proxy-{}", self.name);
        let process =
            ManagedProcess::spawn_with_env(&name, &self.binaries.kube_proxy, &args, &self.process_env, &log)?;
        self.kube_proxy = Some(process);
        let iptables = find_program("iptables").context("iptables not found")?;
        let deadline = Instant::now() + KUBELET_START_TIMEOUT;
        loop {
            if let Some(process) = self.kube_proxy.as_mut() {
                process.check_running()?;
            }
            if let Ok((chains, rules)) = iptables_chains(&iptables, "nat")
                && chains.contains("KUBE-SERVICES")
                && rules.iter().any(|r| r.starts_with("-A KUBE-SERVICES") && r.contains("KUBE-SVC-"))
            {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!(
                    "kube-proxy wrote no service rules after {KUBELET_START_TIMEOUT:?}:\n{}",
                    log_tail(&log, 40)
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn wait_ready(&mut self, client: &kube::Client, timeout: Duration) -> Result<()> {
        let nodes = Api::<Node>::all(client.clone());
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(process) = self.kubelet.as_mut() {
                process.check_running()?;
            }
            if let Some(process) = self.containerd.as_mut() {
                process.check_running()?;
            }
            let node = nodes.get_opt(&self.name).await.context("reading the Node")?;
            let ready = node.as_ref().and_then(|n| n.status.as_ref()?.conditions.as_ref()).and_then(|c| {
                c.iter().find(|c| c.type_ == "Ready").map(|c| (c.status == "True", c.message.clone()))
            });
            match ready {
                Some((true, _)) => return Ok(()),
                state if Instant::now() >= deadline => bail!(
                    "node {} is not Ready after {timeout:?} (Ready condition: {state:?})\n{}",
                    self.name,
                    self.log_tails(30)
                ),
                _ => tokio::time::sleep(Duration::from_millis(250)).await,
            }
        }
    }

    // --- teardown --------------------------------------------------------------------------------

    /// Every step runs even when an earlier one failed; the failures are returned.
    fn teardown(&mut self) -> Vec<String> {
        let mut problems = Vec::new();
        if let Some(mut proxy) = self.kube_proxy.take() {
            proxy.stop();
        }
        if let Some(mut kubelet) = self.kubelet.take() {
            kubelet.stop();
        }
        if let Some(mut containerd) = self.containerd.take() {
            if let Err(e) = self.delete_containers() {
                problems.push(format!("deleting the containers through ctr: {e:#}"));
            }
            containerd.stop();
        }
        // Shims outlive containerd; what runs in the pods' cgroups outlives a killed shim.
        for (pid, _) in self.own_processes() {
            kill(pid);
        }
        problems.extend(self.drain_cgroups());
        problems.extend(self.unmount_all());
        problems.extend(self.network.delete());
        problems.extend(self.host.restore());
        problems.extend(self.remove_cni_cache());
        problems.extend(self.remove_cgroups());
        if self.created_dir
            && self.dir.exists()
            && let Err(e) = std::fs::remove_dir_all(&self.dir)
        {
            problems.push(format!("removing {}: {e}", self.dir.display()));
        }
        problems
    }

    /// Deletes (killing first) every task and container in the CRI namespace, so that the shims clean
    /// up their mounts and exit.
    fn delete_containers(&mut self) -> Result<()> {
        let containers = self.container_ids()?;
        // The sandboxes are the containers running the pause image.
        for id in &containers {
            if let Ok(info) = self.ctr(&["containers", "info", id])
                && let Ok(info) = serde_json::from_str::<Value>(&info)
                && info["Image"].as_str() == Some(PAUSE_IMAGE)
            {
                self.sandbox_ids.insert(id.clone());
            }
        }
        // One by one: a task that exits (or a container removed) between the listing and the delete fails
        // its own command only; what is still listed afterwards is the error.
        for task in self.task_ids()? {
            let _ = self.ctr(&["tasks", "delete", "--force", &task]);
        }
        let tasks = self.task_ids()?;
        if !tasks.is_empty() {
            bail!("tasks still in containerd after deleting them: {tasks:?}");
        }
        for container in &containers {
            let _ = self.ctr(&["containers", "delete", container]);
        }
        let left = self.container_ids()?;
        if !left.is_empty() {
            bail!("containers still in containerd after deleting them: {left:?}");
        }
        Ok(())
    }

    /// This node's containerd and shims (found by the containerd socket on their command line), and
    /// every process in its cgroups.
    fn own_processes(&self) -> Vec<(i32, String)> {
        let socket = self.containerd_socket().display().to_string();
        let config = self.dir.join("containerd.toml").display().to_string();
        let mut found: BTreeMap<i32, String> = BTreeMap::new();
        if let Ok(entries) = std::fs::read_dir("/proc") {
            for entry in entries.flatten() {
                let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                    continue;
                };
                let Ok(raw) = std::fs::read(entry.path().join("cmdline")) else { continue };
                let args: Vec<String> =
                    raw.split(|b| *b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
                let ours = args.iter().any(|a| a == &socket || a.ends_with(&format!("={config}")));
                if ours {
                    found.insert(pid, args.join(" ").trim().to_owned());
                }
            }
        }
        for dir in self.cgroup_dirs() {
            for pid in cgroup_pids(&dir) {
                found.entry(pid).or_insert_with(|| format!("in cgroup {}", dir.display()));
            }
        }
        found.into_iter().collect()
    }

    /// This node's cgroup folders in every hierarchy, deepest first.
    fn cgroup_dirs(&self) -> Vec<PathBuf> {
        let Ok(mounts) = mounts() else { return Vec::new() };
        let mut dirs = Vec::new();
        for mount in mounts.iter().filter(|m| m.fs_type.starts_with("cgroup")) {
            let root = mount.mount_point.join(&self.cgroup_root);
            if root.is_dir() {
                collect_dirs(&root, &mut dirs);
            }
        }
        dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
        dirs.dedup();
        dirs
    }

    /// Kills what is left in this node's cgroups until they are empty.
    fn drain_cgroups(&self) -> Vec<String> {
        let deadline = Instant::now() + CGROUP_DRAIN_TIMEOUT;
        loop {
            let pids: Vec<i32> = self.cgroup_dirs().iter().flat_map(|d| cgroup_pids(d)).collect();
            if pids.is_empty() {
                return Vec::new();
            }
            if Instant::now() >= deadline {
                return vec![format!("processes still in the node's cgroups: {pids:?}")];
            }
            pids.into_iter().for_each(kill);
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn remove_cgroups(&self) -> Vec<String> {
        let mut problems = Vec::new();
        for dir in self.cgroup_dirs() {
            // A cgroup whose last process just died may still be busy for a moment.
            let mut attempt = 0;
            while let Err(e) = std::fs::remove_dir(&dir) {
                attempt += 1;
                if attempt >= 20 {
                    problems.push(format!("removing the cgroup {}: {e}", dir.display()));
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        problems
    }

    /// Unmounts every mount under the node folder, deepest first; lazily when a plain unmount fails.
    fn unmount_all(&self) -> Vec<String> {
        let mut problems = Vec::new();
        // A mount may hide others of the same path: read the table again after each round.
        for _ in 0..10 {
            let mut ours: Vec<PathBuf> = match mounts() {
                Ok(mounts) => {
                    mounts.into_iter().map(|m| m.mount_point).filter(|p| p.starts_with(&self.dir)).collect()
                }
                Err(e) => return vec![format!("reading the mount table: {e:#}")],
            };
            if ours.is_empty() {
                return problems;
            }
            ours.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
            for mount_point in ours {
                let Ok(path) = path_str(&mount_point) else { continue };
                if run(Path::new("umount"), &[path]).is_err()
                    && let Err(e) = run(Path::new("umount"), &["--lazy", path])
                {
                    problems.push(format!("unmounting {path}: {e:#}"));
                }
            }
        }
        problems
    }

    /// Removes libcni's cached results of this node's pods (their sandboxes were never torn down
    /// through CNI when the node is killed with its pods).
    fn remove_cni_cache(&self) -> Vec<String> {
        let results = Path::new(CNI_CACHE_DIR).join("results");
        if let Ok(entries) = std::fs::read_dir(&results) {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                let ours = name.starts_with(&format!("{}-", self.network.name))
                    || self.sandbox_ids.iter().any(|id| name.contains(id.as_str()));
                if ours {
                    let _ = std::fs::remove_file(entry.path());
                }
            }
        }
        if !self.host.cni_cache_existed {
            // Only what this node created, and only when nothing else lives there.
            let _ = std::fs::remove_dir(&results);
            let _ = std::fs::remove_dir(CNI_CACHE_DIR);
        }
        Vec::new()
    }
}

impl Drop for RealNode {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            let _ = writeln!(std::io::stderr(), "vgpu-e2e: {e:#}");
        }
    }
}

/// The node's bridge and pod network.
#[derive(Debug, Clone)]
struct NodeNetwork {
    /// The CNI network name.
    name: String,
    bridge: String,
    subnet: Ipv4Addr,
    gateway: Ipv4Addr,
}

impl NodeNetwork {
    /// The first `10.217.<n>.0/24` that no route of the host overlaps.
    fn choose(id: &str) -> Result<Self> {
        let routes = ipv4_routes()?;
        for third in 0..=u8::MAX {
            let [a, b] = POD_NETWORK_PREFIX;
            let subnet = Ipv4Addr::new(a, b, third, 0);
            let mask = u32::MAX << 8;
            let taken = routes.iter().any(|&(dest, route_mask)| {
                // Two prefixes overlap when they agree on the shorter one's bits (the default route aside).
                let shorter = mask & route_mask;
                route_mask != 0 && u32::from(subnet) & shorter == u32::from(dest) & shorter
            });
            if !taken {
                return Ok(Self {
                    name: format!("vgpu-e2e-{id}"),
                    bridge: format!("vgpue2e{id}"),
                    subnet,
                    gateway: Ipv4Addr::new(a, b, third, 1),
                });
            }
        }
        bail!("every 10.217.<n>.0/24 overlaps a route of this host")
    }

    /// The bridge with the gateway address, before the kubelet starts: the kubelet serves on it, and
    /// the bridge plugin finds it ready.
    fn create(&self) -> Result<()> {
        let cidr = format!("{}/24", self.gateway);
        run(Path::new("ip"), &["link", "add", "name", &self.bridge, "type", "bridge"])?;
        run(Path::new("ip"), &["addr", "add", &cidr, "dev", &self.bridge])?;
        run(Path::new("ip"), &["link", "set", &self.bridge, "up"])?;
        Ok(())
    }

    fn delete(&self) -> Vec<String> {
        if !Path::new("/sys/class/net").join(&self.bridge).exists() {
            return Vec::new();
        }
        match run(Path::new("ip"), &["link", "delete", &self.bridge]) {
            Ok(_) => Vec::new(),
            Err(e) => vec![format!("deleting the bridge {}: {e:#}", self.bridge)],
        }
    }
}

/// What the node may change on the host, as it was before the node started.
#[derive(Debug, Clone)]
struct HostSnapshot {
    sysctls: Vec<(PathBuf, String)>,
    /// (tool, table) → chains.
    chains: BTreeMap<(PathBuf, &'static str), BTreeSet<String>>,
    cni_cache_existed: bool,
}

impl HostSnapshot {
    fn take() -> Self {
        let sysctls = SYSCTLS
            .iter()
            .filter_map(|name| {
                let path = Path::new("/proc/sys").join(name);
                let value = std::fs::read_to_string(&path).ok()?;
                Some((path, value.trim().to_owned()))
            })
            .collect();
        let mut chains = BTreeMap::new();
        for tool in ["iptables", "ip6tables"].iter().filter_map(|t| find_program(t)) {
            for table in IPTABLES_TABLES {
                if let Ok((found, _)) = iptables_chains(&tool, table) {
                    chains.insert((tool.clone(), table), found);
                }
            }
        }
        Self { sysctls, chains, cni_cache_existed: Path::new(CNI_CACHE_DIR).exists() }
    }

    /// Chains that exist now and did not before, as (tool, table, chain).
    fn new_chains(&self) -> Vec<(String, &'static str, String)> {
        let mut found = Vec::new();
        for ((tool, table), before) in &self.chains {
            if let Ok((now, _)) = iptables_chains(tool, table) {
                for chain in now.difference(before) {
                    found.push((tool.display().to_string(), *table, chain.clone()));
                }
            }
        }
        found
    }

    /// Deletes the chains created since (with the rules jumping to them) and puts the kernel settings back.
    fn restore(&self) -> Vec<String> {
        let mut problems = Vec::new();
        for ((tool, table), before) in &self.chains {
            let Ok((now, rules)) = iptables_chains(tool, table) else { continue };
            let new: BTreeSet<&String> = now.difference(before).collect();
            if new.is_empty() {
                continue;
            }
            // Jumps from chains that stay, then the new chains' own rules, then the chains.
            for rule in &rules {
                let args = split_iptables_rule(rule);
                let in_new_chain = args.get(1).is_some_and(|c| new.contains(c));
                let jumps_to_new =
                    args.windows(2).any(|w| (w[0] == "-j" || w[0] == "-g") && new.contains(&w[1]));
                if args.first().map(String::as_str) == Some("-A") && jumps_to_new && !in_new_chain {
                    let mut delete: Vec<&str> = vec!["-w", "5", "-t", table, "-D"];
                    delete.extend(args[1..].iter().map(String::as_str));
                    if let Err(e) = run(tool, &delete) {
                        problems.push(format!("deleting the rule `{rule}`: {e:#}"));
                    }
                }
            }
            for verb in ["-F", "-X"] {
                for chain in &new {
                    if let Err(e) = run(tool, &["-w", "5", "-t", table, verb, chain]) {
                        problems.push(format!("{} {verb} {chain} in {table}: {e:#}", tool.display()));
                    }
                }
            }
        }
        for (path, value) in &self.sysctls {
            let now = std::fs::read_to_string(path).map(|v| v.trim().to_owned()).unwrap_or_default();
            if &now != value
                && let Err(e) = std::fs::write(path, value)
            {
                problems.push(format!("restoring {} to {value}: {e}", path.display()));
            }
        }
        problems
    }
}

/// One line of `/proc/self/mountinfo`.
#[derive(Debug, Clone)]
struct MountEntry {
    mount_point: PathBuf,
    fs_type: String,
    super_options: String,
}

/// The mount table of this process's namespace.
fn mounts() -> Result<Vec<MountEntry>> {
    let table = std::fs::read_to_string("/proc/self/mountinfo").context("reading /proc/self/mountinfo")?;
    Ok(table.lines().filter_map(parse_mountinfo_line).collect())
}

/// `id parent major:minor root mount-point options [optional...] - fstype source super-options`.
fn parse_mountinfo_line(line: &str) -> Option<MountEntry> {
    let (left, right) = line.split_once(" - ")?;
    let mount_point = left.split(' ').nth(4)?;
    let mut right = right.split(' ');
    let fs_type = right.next()?.to_owned();
    let super_options = right.nth(1).unwrap_or_default().to_owned();
    Some(MountEntry { mount_point: PathBuf::from(unescape_octal(mount_point)), fs_type, super_options })
}

/// The kernel writes space, tab, newline and backslash in mount paths as `\ooo`.
fn unescape_octal(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && let Some(octal) = bytes.get(i + 1..i + 4)
            && let Ok(text) = std::str::from_utf8(octal)
            && let Ok(value) = u8::from_str_radix(text, 8)
        {
            out.push(value);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The IPv4 routes of the main table as (destination, mask), from `/proc/net/route`.
fn ipv4_routes() -> Result<Vec<(Ipv4Addr, u32)>> {
    let table = std::fs::read_to_string("/proc/net/route").context("reading /proc/net/route")?;
    let mut routes = Vec::new();
    for line in table.lines().skip(1) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (Some(dest), Some(mask)) = (fields.get(1), fields.get(7)) else { continue };
        // The kernel prints the addresses' bytes in memory order as one native integer.
        let parse = |hex: &str| u32::from_str_radix(hex, 16).map(|v| Ipv4Addr::from(v.to_ne_bytes()));
        if let (Ok(dest), Ok(mask)) = (parse(dest), parse(mask)) {
            routes.push((dest, u32::from(mask)));
        }
    }
    Ok(routes)
}

/// The chains of one iptables table (`-N` lines of `-S`) and its rules (`-A` lines).
fn iptables_chains(tool: &Path, table: &str) -> Result<(BTreeSet<String>, Vec<String>)> {
    let listing = run(tool, &["-w", "5", "-t", table, "-S"])?;
    let mut chains = BTreeSet::new();
    let mut rules = Vec::new();
    for line in listing.lines() {
        if let Some(chain) = line.strip_prefix("-N ") {
            chains.insert(chain.trim().to_owned());
        } else if line.starts_with("-A ") {
            rules.push(line.to_owned());
        }
    }
    Ok((chains, rules))
}

/// Splits a rule as `iptables -S` prints it: words, with `"..."` quoting (and `\"` inside).
fn split_iptables_rule(rule: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut quoted = false;
    let mut chars = rule.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                quoted = !quoted;
                in_word = true;
            }
            '\\' if quoted => {
                if let Some(next) = chars.next() {
                    word.push(next);
                }
            }
            c if c.is_whitespace() && !quoted => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            c => {
                word.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        words.push(word);
    }
    words
}

/// Every folder under `root` (included).
fn collect_dirs(root: &Path, out: &mut Vec<PathBuf>) {
    out.push(root.to_owned());
    if let Ok(entries) = std::fs::read_dir(root) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                collect_dirs(&entry.path(), out);
            }
        }
    }
}

fn cgroup_pids(dir: &Path) -> Vec<i32> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .map(|procs| procs.lines().filter_map(|l| l.trim().parse().ok()).collect())
        .unwrap_or_default()
}

fn kill(pid: i32) {
    if let Some(pid) = Pid::from_raw(pid) {
        // Gone already is fine.
        let _ = rustix::process::kill_process(pid, Signal::KILL);
    }
}

/// `name` in `$PATH` or in root's usual folders.
fn find_program(name: &str) -> Option<PathBuf> {
    let path = std::env::var("PATH").unwrap_or_default();
    path.split(':')
        .chain(SYSTEM_PATH.split(':'))
        .filter(|d| !d.is_empty())
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}

/// Runs `program args` under `timeout` (found in `$PATH` or root's folders when not a path) and returns
/// its stdout; fails with its stderr on a non-zero exit.
fn run(program: &Path, args: &[&str]) -> Result<String> {
    let program = if program.components().count() > 1 {
        program.to_owned()
    } else {
        let name = program.to_string_lossy();
        find_program(&name).with_context(|| format!("{name} not found"))?
    };
    let output = Command::new("timeout")
        .arg("--kill-after=5")
        .arg(COMMAND_TIMEOUT_S.to_string())
        .arg(&program)
        .args(args)
        .output()
        .with_context(|| format!("running {}", program.display()))?;
    if !output.status.success() {
        bail!(
            "`{} {}` failed ({}): {}",
            program.display(),
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

fn lines(text: &str) -> Vec<String> {
    text.lines().map(str::trim).filter(|l| !l.is_empty()).map(str::to_owned).collect()
}

fn path_str(path: &Path) -> Result<&str> {
    path.to_str().with_context(|| format!("{} is not UTF-8", path.display()))
}

/// A TOML basic string: a JSON string literal is one.
fn toml_str(path: &Path) -> String {
    Value::String(path.display().to_string()).to_string()
}

/// 8 hex digits, different for each call.
fn unique_id() -> String {
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    hasher.write_u32(std::process::id());
    format!("{:08x}", hasher.finish() as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_lines_parse_with_escapes_and_optional_fields() {
        let line = "36 35 98:0 /mnt1 /mnt/with\\040space rw,noatime master:1 shared:2 - ext3 /dev/root rw,errors=continue";
        let m = parse_mountinfo_line(line).unwrap();
        assert_eq!(m.mount_point, PathBuf::from("/mnt/with space"));
        assert_eq!(m.fs_type, "ext3");
        assert_eq!(m.super_options, "rw,errors=continue");
        let cg = "30 25 0:26 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset";
        assert_eq!(parse_mountinfo_line(cg).unwrap().super_options, "rw,cpuset");
        assert!(parse_mountinfo_line("garbage").is_none());
    }

    #[test]
    fn iptables_rules_split_like_the_shell() {
        let rule = r#"-A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment "block incoming localnet connections" -j DROP"#;
        let words = split_iptables_rule(rule);
        assert_eq!(words[0], "-A");
        assert_eq!(words[1], "KUBE-FIREWALL");
        assert!(words.contains(&"block incoming localnet connections".to_owned()));
        assert_eq!(words.last().map(String::as_str), Some("DROP"));
        assert_eq!(split_iptables_rule(r#"-A X --comment "a \"b\"" -j Y"#)[3], r#"a "b""#);
    }

    #[test]
    fn ids_are_short_hex_and_names_fit_the_kernel_limits() {
        let (a, b) = (unique_id(), unique_id());
        assert_ne!(a, b);
        assert_eq!(a.len(), 8);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        // Interface names: 15 bytes at most.
        assert!(format!("vgpue2e{a}").len() <= 15);
    }

    #[test]
    fn toml_strings_are_quoted_and_escaped() {
        assert_eq!(toml_str(Path::new("/tmp/a b")), r#""/tmp/a b""#);
        assert_eq!(toml_str(Path::new("/tmp/q\"x")), r#""/tmp/q\"x""#);
    }

    #[test]
    fn missing_node_files_are_reported_with_the_build_hint() {
        let dir = tempfile::tempdir().unwrap();
        let err = NodeBinaries::in_dir(dir.path()).unwrap_err().to_string();
        assert!(err.contains("build-node.sh") && err.contains(NODE_DIR_ENV), "{err}");
    }

    #[test]
    fn the_default_node_dir_names_both_versions() {
        if let Some(dir) = default_node_dir() {
            let name = dir.file_name().unwrap().to_string_lossy().into_owned();
            assert_eq!(name, format!("node-k8s-{K8S_VERSION}_containerd-{CONTAINERD_VERSION}"));
        }
    }

    /// The constant must name the version `e2e/node/go.mod` pins (the build script derives its folder from it).
    #[test]
    fn containerd_version_matches_go_mod() {
        let go_mod = include_str!("../node/go.mod");
        let pinned = go_mod.lines().find_map(|l| {
            let mut words = l.split_whitespace();
            (words.next() == Some("github.com/containerd/containerd/v2")).then(|| words.next()).flatten()
        });
        assert_eq!(pinned, Some(CONTAINERD_VERSION));
    }
}
