//! [`DriverConfig`]: the resolved configuration of the DRA kubelet plugin (what the binary's flags say);
//! nothing below it reads flags or env.
//!
//! | path | default | what |
//! |---|---|---|
//! | [`DriverConfig::registration_socket`] | `/var/lib/kubelet/plugins_registry/manager.nvidia.com-reg.sock` | `pluginregistration.Registration` (the kubelet's plugin watcher dials it) |
//! | [`DriverConfig::dra_socket`] | `/var/lib/kubelet/plugins/manager.nvidia.com/dra.sock` | `DRAPlugin` v1 + v1beta1 and `DRAResourceHealth` v1 + v1alpha1 |
//! | [`DriverConfig::checkpoint_path`] | `/var/lib/kubelet/plugins/manager.nvidia.com/checkpoint.json` | the prepared claims ([`crate::checkpoint`]) |
//! | [`DriverConfig::lock_path`] | `/var/lib/kubelet/plugins/manager.nvidia.com/pu.lock` | the Prepare/Unprepare flock ([`crate::lock`]) |
//! | [`DriverConfig::claim_dir`] | `/etc/vgpu-manager/claims/<claimUID>` | per-claim partitions (written under `manager_dir`, mounted from `host_manager_dir`) |
//! | [`DriverConfig::sm_watcher_file`] | `/etc/vgpu-manager/watcher/sm_util.config` | the shared SM watcher's samples (gate `SharedSMUtilizationWatcher`; mounted read-only into vGPU claims from `host_manager_dir`) |
//! | [`DriverConfig::cdi_spec_path`] | `/etc/cdi/k8s.manager.nvidia.com-claim_<claimUID>.json` | the claim's CDI spec ([`crate::cdi`]) |

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use vgpu_gates::{DraGate, FeatureGates};

/// The kubelet's default plugin-registration directory.
pub const DEFAULT_REGISTRY_DIR: &str = "/var/lib/kubelet/plugins_registry";
/// The kubelet's default plugins directory.
pub const DEFAULT_PLUGINS_DIR: &str = "/var/lib/kubelet/plugins";
/// Default CDI root (`--cdi-root`).
pub const DEFAULT_CDI_ROOT: &str = "/etc/cdi";
/// Default manager directory (`--host-manager-dir`).
pub const DEFAULT_MANAGER_DIR: &str = "/etc/vgpu-manager";
/// Where the kernel publishes this boot's ID.
pub const BOOT_ID_PATH: &str = "/proc/sys/kernel/random/boot_id";
/// Name of the DRA service socket inside the plugin directory.
pub const DRA_SOCKET: &str = "dra.sock";
/// Name of the checkpoint file inside the plugin directory.
pub const CHECKPOINT_FILE: &str = "checkpoint.json";
/// Name of the Prepare/Unprepare lock file inside the plugin directory.
pub const LOCK_FILE: &str = "pu.lock";
/// How long Prepare/Unprepare wait for `pu.lock`.
pub const LOCK_TIMEOUT: Duration = Duration::from_secs(10);
/// How often checkpointed claims are compared with the API (stale-claim sweep).
pub const STALE_SWEEP_INTERVAL: Duration = Duration::from_secs(600);
/// How often the registration socket's presence is checked.
pub const REGISTRATION_GUARD_INTERVAL: Duration = Duration::from_millis(500);

/// The resolved configuration of the DRA kubelet plugin.
#[derive(Debug, Clone)]
pub struct DriverConfig {
    /// The DRA driver name ([`crate::DRIVER_NAME`]).
    pub driver_name: String,
    /// This node's name: the pool name of every device.
    pub node_name: String,
    /// `--kubelet-registrar-directory-path`: where the registration socket goes.
    pub registry_dir: PathBuf,
    /// `--kubelet-plugins-directory-path`: the plugin directory is `<plugins_dir>/<driver_name>`.
    pub plugins_dir: PathBuf,
    /// `--cdi-root`: where the per-claim CDI specs are written.
    pub cdi_root: PathBuf,
    /// `--host-manager-dir`: the manager directory on the host (CDI mount sources).
    pub host_manager_dir: PathBuf,
    /// Where this process sees the manager directory (the claim directories are created there); the same
    /// path as `host_manager_dir` when the DaemonSet mounts it at the same place.
    pub manager_dir: PathBuf,
    /// `--nvidia-driver-root`: the driver root on the host (CDI device-node host paths).
    pub host_driver_root: PathBuf,
    /// `--container-driver-root`: where the host's driver root is mounted in this container (the control
    /// device nodes are looked for there).
    pub container_driver_root: PathBuf,
    /// `--device-cores-ratio`.
    pub cores_ratio: u32,
    /// `--device-memory-ratio` (> 100 = oversold memory).
    pub memory_ratio: u32,
    /// The effective feature gates.
    pub gates: FeatureGates<'static, DraGate>,
    /// Version suffix of `libvgpu-control.so.<version>` under the host manager directory.
    pub library_version: String,
    /// `MANAGER_COMPATIBILITY_MODE` handed to vGPU containers (cgroup mode bits, as the device plugin).
    pub compatibility_mode: i32,
    /// The boot-ID file ([`BOOT_ID_PATH`]).
    pub boot_id_path: PathBuf,
    /// Prepare/Unprepare lock acquire limit ([`LOCK_TIMEOUT`]).
    pub lock_timeout: Duration,
    /// Stale-claim sweep period ([`STALE_SWEEP_INTERVAL`]).
    pub stale_sweep_interval: Duration,
    /// Registration-socket guard period ([`REGISTRATION_GUARD_INTERVAL`]).
    pub registration_guard_interval: Duration,
    /// Sampling period of the shared SM watcher (gate `SharedSMUtilizationWatcher`; default
    /// [`vgpu_node::sm_watcher::DEFAULT_PERIOD`]).
    pub sm_watcher_period: Duration,
}

impl DriverConfig {
    /// The defaults for node `node_name` (gates at their defaults).
    pub fn new(node_name: impl Into<String>) -> Self {
        Self {
            driver_name: crate::DRIVER_NAME.to_owned(),
            node_name: node_name.into(),
            registry_dir: PathBuf::from(DEFAULT_REGISTRY_DIR),
            plugins_dir: PathBuf::from(DEFAULT_PLUGINS_DIR),
            cdi_root: PathBuf::from(DEFAULT_CDI_ROOT),
            host_manager_dir: PathBuf::from(DEFAULT_MANAGER_DIR),
            manager_dir: PathBuf::from(DEFAULT_MANAGER_DIR),
            host_driver_root: PathBuf::from("/"),
            container_driver_root: PathBuf::from("/driver-root"),
            cores_ratio: 100,
            memory_ratio: 100,
            gates: crate::feature_gates().defaults(),
            library_version: vgpu_core::abi::runtime_files::DEFAULT_LIBRARY_VERSION.to_owned(),
            compatibility_mode: 2,
            boot_id_path: PathBuf::from(BOOT_ID_PATH),
            lock_timeout: LOCK_TIMEOUT,
            stale_sweep_interval: STALE_SWEEP_INTERVAL,
            registration_guard_interval: REGISTRATION_GUARD_INTERVAL,
            sm_watcher_period: vgpu_node::sm_watcher::DEFAULT_PERIOD,
        }
    }

    /// Every path of the node under `root` (registry, plugins, CDI and manager directories, no driver
    /// root): for tests and examples.
    pub fn under(node_name: impl Into<String>, root: &Path) -> Self {
        let mut config = Self::new(node_name);
        config.registry_dir = root.join("plugins_registry");
        config.plugins_dir = root.join("plugins");
        config.cdi_root = root.join("cdi");
        config.host_manager_dir = root.join("manager");
        config.manager_dir = root.join("manager");
        config.container_driver_root = root.join("driver-root");
        config
    }

    /// `<plugins_dir>/<driver_name>`: the DRA socket, checkpoint and lock.
    pub fn plugin_dir(&self) -> PathBuf {
        self.plugins_dir.join(&self.driver_name)
    }

    /// `<plugins_dir>/<driver_name>/dra.sock`.
    pub fn dra_socket(&self) -> PathBuf {
        self.plugin_dir().join(DRA_SOCKET)
    }

    /// `<registry_dir>/<driver_name>-reg.sock`.
    pub fn registration_socket(&self) -> PathBuf {
        self.registry_dir.join(format!("{}-reg.sock", self.driver_name))
    }

    /// `<plugin_dir>/checkpoint.json`.
    pub fn checkpoint_path(&self) -> PathBuf {
        self.plugin_dir().join(CHECKPOINT_FILE)
    }

    /// `<plugin_dir>/pu.lock`.
    pub fn lock_path(&self) -> PathBuf {
        self.plugin_dir().join(LOCK_FILE)
    }

    /// `<manager_dir>/claims/<claim_uid>`: where this process writes the claim's partitions.
    pub fn claim_dir(&self, claim_uid: &str) -> PathBuf {
        self.manager_dir.join("claims").join(claim_uid)
    }

    /// `<host_manager_dir>/claims/<claim_uid>`: the same directory as the container runtime sees it.
    pub fn host_claim_dir(&self, claim_uid: &str) -> PathBuf {
        self.host_manager_dir.join("claims").join(claim_uid)
    }

    /// `<cdi_root>/`[`crate::cdi::spec_file_name`]`(claim_uid)`.
    pub fn cdi_spec_path(&self, claim_uid: &str) -> PathBuf {
        self.cdi_root.join(crate::cdi::spec_file_name(claim_uid))
    }

    /// Gate `SharedSMUtilizationWatcher`: the plugin runs the node-wide SM watcher on `manager_dir` and vGPU
    /// claims read its samples.
    pub fn sm_watcher(&self) -> bool {
        self.gates.enabled(DraGate::SharedSMUtilizationWatcher)
    }

    /// Gate `DevicePluginClientMode`: containers register their PIDs through the registry socket with their
    /// partition's register UUID (`MANAGER_CLIENT_REGISTER_UUID`) instead of reading `/proc`.
    pub fn client_mode(&self) -> bool {
        self.gates.enabled(DraGate::DevicePluginClientMode)
    }

    /// Gate `NRISupport`: the per-container partition mounts are injected by the NRI hook at
    /// CreateContainer instead of the claim's CDI spec, and a vGPU claim may be shared by several pods.
    pub fn nri(&self) -> bool {
        self.gates.enabled(DraGate::NRISupport)
    }

    /// Gate `ContextualLogging`: each claim's Prepare and Unprepare run in a span naming the claim, so every
    /// line logged on its way carries the claim's UID, namespace and name ([`DriverConfig::claim_span`]).
    pub fn contextual_logging(&self) -> bool {
        self.gates.enabled(DraGate::ContextualLogging)
    }

    /// The span one claim's `operation` runs in: `prepare{claim=<uid> namespace=<ns> name=<name>}` (or
    /// `unprepare{...}`) with gate `ContextualLogging` on; no span with it off (lines carry only their own
    /// fields, as klog's global logger without contextual logging). `namespace` and `name` may be empty
    /// (an Unprepare knows the UID only).
    pub fn claim_span(
        &self,
        operation: crate::metrics::Operation,
        uid: &str,
        namespace: &str,
        name: &str,
    ) -> tracing::Span {
        use crate::metrics::Operation;
        if !self.contextual_logging() {
            return tracing::Span::none();
        }
        match operation {
            Operation::Prepare => {
                tracing::info_span!("prepare", claim = %uid, namespace = %namespace, name = %name)
            }
            Operation::Unprepare => {
                tracing::info_span!("unprepare", claim = %uid, namespace = %namespace, name = %name)
            }
        }
    }

    /// `<manager_dir>/watcher/sm_util.config`: the shared SM watcher's file as this process writes it.
    pub fn sm_watcher_file(&self) -> PathBuf {
        vgpu_node::sm_watcher::SmWatcher::file_path(&self.manager_dir)
    }

    /// `--device-memory-ratio` > 100: the GPUs' memory is oversold.
    pub fn memory_oversold(&self) -> bool {
        self.memory_ratio > 100
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_paths() {
        let c = DriverConfig::new("n1");
        assert_eq!(
            c.registration_socket(),
            Path::new("/var/lib/kubelet/plugins_registry/manager.nvidia.com-reg.sock")
        );
        assert_eq!(c.dra_socket(), Path::new("/var/lib/kubelet/plugins/manager.nvidia.com/dra.sock"));
        assert_eq!(
            c.checkpoint_path(),
            Path::new("/var/lib/kubelet/plugins/manager.nvidia.com/checkpoint.json")
        );
        assert_eq!(c.lock_path(), Path::new("/var/lib/kubelet/plugins/manager.nvidia.com/pu.lock"));
        assert_eq!(c.claim_dir("u1"), Path::new("/etc/vgpu-manager/claims/u1"));
        assert_eq!(c.cdi_spec_path("u1"), Path::new("/etc/cdi/k8s.manager.nvidia.com-claim_u1.json"));
        assert!(!c.memory_oversold());
    }

    /// Records the spans created while it is the default subscriber: name and fields.
    #[derive(Default)]
    struct Spans(std::sync::Mutex<Vec<String>>);

    struct Fields(String);

    impl tracing::field::Visit for Fields {
        fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
            self.0.push_str(&format!(" {}={:?}", field.name(), value));
        }
    }

    impl tracing::Subscriber for Spans {
        fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, span: &tracing::span::Attributes<'_>) -> tracing::span::Id {
            let mut fields = Fields(span.metadata().name().to_owned());
            span.record(&mut fields);
            let mut spans = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            spans.push(fields.0);
            tracing::span::Id::from_u64(spans.len() as u64)
        }
        fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
        fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
        fn event(&self, _: &tracing::Event<'_>) {}
        fn enter(&self, _: &tracing::span::Id) {}
        fn exit(&self, _: &tracing::span::Id) {}
    }

    #[test]
    fn contextual_logging_names_the_claim_in_a_span() {
        use crate::metrics::Operation;
        let spans = std::sync::Arc::new(Spans::default());
        let mut on = DriverConfig::new("n1");
        assert!(on.contextual_logging(), "ContextualLogging is Beta, on by default");
        tracing::subscriber::with_default(spans.clone(), || {
            let span = on.claim_span(Operation::Prepare, "u1", "ns", "c1");
            assert!(!span.is_none());
            let span = on.claim_span(Operation::Unprepare, "u2", "", "");
            assert!(!span.is_none());
            on.gates = crate::feature_gates().configure(["ContextualLogging=false"]).expect("valid");
            assert!(!on.contextual_logging());
            assert!(on.claim_span(Operation::Prepare, "u3", "ns", "c3").is_none());
        });
        let recorded = spans.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        assert_eq!(
            recorded,
            ["prepare claim=u1 namespace=ns name=c1", "unprepare claim=u2 namespace= name="]
        );
    }
}
