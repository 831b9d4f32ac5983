//! The vgpu components and their gate registries, exactly as `shared/spec/feature_gates.md`
//! lists them: the Core registry (device-plugin, scheduler-extender, device-monitor) and the
//! DRA registry (kubelet-plugin). The DRA registry also has what upstream's has beyond the spec's table:
//! `ConsumableShares` and Kubernetes' three logging gates ([`DraGate::LOGGING`]), which upstream's
//! `featuregates.FeatureGates()` adds with `logsapi.AddFeatureGates` (component-base v0.37).

use std::{fmt, str::FromStr, sync::LazyLock};

use crate::{
    FeatureGate,
    dynamic::AnyRegistry,
    registry::{Registry, RegistryBuilder},
};

crate::feature_gates! {
    /// Gates of the Core registry (device-plugin, scheduler-extender, device-monitor).
    pub enum CoreGate {
        /// Reports virtual cores (`nvidia.com/vgpu-cores`) to the kubelet.
        GPUCoreResourcePlugin => alpha(false),
        /// Reports virtual memory (`nvidia.com/vgpu-memory`) to the kubelet.
        GPUMemoryResourcePlugin => alpha(false),
        /// Re-arranges nodes and devices for pods whose allocation failed.
        AllocationFailureReschedule => alpha(false),
        /// Publishes (device-plugin) and uses (scheduler) GPU link topology.
        TopologyAwareGPUAllocation => alpha(false),
        /// One shared per-node SM utilization watcher instead of one per container.
        SharedSMUtilizationWatcher => alpha(false),
        /// Tracks virtual (oversubscribed) device memory through local records.
        VirtualMemoryTracking => alpha(false),
        /// Containers register themselves with the device plugin over a unix gRPC socket.
        DevicePluginClientMode => alpha(false),
        /// Preferred allocation follows the device IDs the scheduler picked.
        HonorPreAllocatedDeviceIDs => alpha(false),
        /// Serializes binding per node in the scheduler extender.
        SerializedNodeBind => beta(true),
        /// Serializes the filter step in the scheduler extender.
        SerializedNodeFilter => beta(true),
    }
}

crate::feature_gates! {
    /// Gates of the DRA registry (kubelet-plugin).
    pub enum DraGate {
        /// Mounts the vGPU control library so one GPU can be shared by several claims.
        VGPUSupport => alpha(true),
        /// Watches NVML events and taints unhealthy devices.
        NVMLDeviceHealthCheck => alpha(true),
        /// IMEX daemons addressed by DNS names instead of raw IPs.
        IMEXDaemonsWithDNSNames => beta(true),
        /// Customizable time-slicing settings.
        TimeSlicingSettings => alpha(false),
        /// MPS (Multi-Process Service) support.
        MPSSupport => alpha(false),
        /// Binding GPUs to vfio-pci for passthrough into VMs.
        PassthroughSupport => alpha(false),
        /// MIG partitions created and destroyed to match claims.
        DynamicMIG => alpha(false),
        /// Device metadata files inside the workload (KEP-5304).
        DeviceMetadata => alpha(false),
        /// One shared per-node SM utilization watcher.
        SharedSMUtilizationWatcher => alpha(false),
        /// Containers register themselves with the plugin over a unix gRPC socket.
        DevicePluginClientMode => alpha(false),
        /// Per-container mounts through the NRI CreateContainer hook.
        NRISupport => alpha(false),
        /// Fabric Manager (NVSwitch) partition management.
        FabricManagerPartitioning => alpha(false),
        /// Publishes list-valued DRA device attributes.
        DRAListTypeAttributes => alpha(false),
        /// Whole GPUs shared by several claims through consumable capacity (`--consumable-shares`);
        /// in upstream's registry though the spec's table omits it.
        ConsumableShares => alpha(false),
        /// Kubernetes' logging gate (component-base `logs/api/v1`, Beta since 1.30, on), which upstream's DRA
        /// registry carries: log lines carry the context of the call chain that logs them. Ours: each claim's
        /// Prepare and Unprepare run in a `prepare`/`unprepare` span naming the claim (UID, namespace, name),
        /// so every line logged on its way names it; off, no span: lines carry only their own fields.
        ContextualLogging => beta(true),
        /// Kubernetes' logging gate (component-base `logs/api/v1`, Alpha, off): permits the alpha-quality
        /// logging options (upstream `--log-text-split-stream`, `--log-json-split-stream`,
        /// `--log-text-info-buffer-size`, `--log-json-info-buffer-size`). This build has none of them, so
        /// on or off it permits and refuses nothing; `vgpu_dra::gates::check_logging` refuses such an option
        /// while the gate is off.
        LoggingAlphaOptions => alpha(false),
        /// Kubernetes' logging gate (component-base `logs/api/v1`, Beta, on): permits the beta-quality logging
        /// options, i.e. `--logging-format=json`; off, the kubelet-plugin refuses that format at start-up
        /// (exit 2, "Log format json is disabled, see LoggingBetaOptions feature", as upstream).
        LoggingBetaOptions => beta(true),
    }
}

impl DraGate {
    /// The three Kubernetes logging gates of the DRA registry (component-base `logs/api/v1`), which take no
    /// part in the DRA driver's dependency and exclusion rules.
    pub const LOGGING: [DraGate; 3] =
        [DraGate::ContextualLogging, DraGate::LoggingAlphaOptions, DraGate::LoggingBetaOptions];
}

/// Environment variable the kubelet-plugin reads its gates from (the flag wins when both are set).
pub const FEATURE_GATES_ENV: &str = "FEATURE_GATES";

/// Old Core gate names and their current names (they are no longer accepted).
pub const RENAMED_GATES: &[(&str, &str)] = &[
    ("CorePlugin", "GPUCoreResourcePlugin"),
    ("MemoryPlugin", "GPUMemoryResourcePlugin"),
    ("Reschedule", "AllocationFailureReschedule"),
    ("GPUTopology", "TopologyAwareGPUAllocation"),
    ("SMWatcher", "SharedSMUtilizationWatcher"),
    ("SerialBindNode", "SerializedNodeBind"),
    ("SerialFilterNode", "SerializedNodeFilter"),
    ("VMemoryNode", "VirtualMemoryTracking"),
    ("ClientMode", "DevicePluginClientMode"),
];

/// Which of the two registries a component uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RegistryKind {
    /// The Core registry ([`CoreGate`]).
    Core,
    /// The DRA driver registry ([`DraGate`]).
    Dra,
}

impl RegistryKind {
    /// `Core` or `DRA`.
    pub const fn as_str(self) -> &'static str {
        match self {
            RegistryKind::Core => "Core",
            RegistryKind::Dra => "DRA",
        }
    }
}

/// A vgpu component that takes `--feature-gates`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Component {
    /// The kubelet device plugin.
    DevicePlugin,
    /// The kube-scheduler extender.
    SchedulerExtender,
    /// The metrics sidecar (Core registry in both deployments).
    DeviceMonitor,
    /// The DRA kubelet plugin.
    KubeletPlugin,
}

impl Component {
    /// Every component.
    pub const ALL: [Component; 4] = [
        Component::DevicePlugin,
        Component::SchedulerExtender,
        Component::DeviceMonitor,
        Component::KubeletPlugin,
    ];

    /// The component's name (`device-plugin`, `scheduler-extender`, `device-monitor`, `kubelet-plugin`).
    pub const fn as_str(self) -> &'static str {
        match self {
            Component::DevicePlugin => "device-plugin",
            Component::SchedulerExtender => "scheduler-extender",
            Component::DeviceMonitor => "device-monitor",
            Component::KubeletPlugin => "kubelet-plugin",
        }
    }

    /// The registry the component uses.
    pub const fn registry_kind(self) -> RegistryKind {
        match self {
            Component::KubeletPlugin => RegistryKind::Dra,
            _ => RegistryKind::Core,
        }
    }

    /// Whether the component also reads [`FEATURE_GATES_ENV`].
    pub const fn reads_env(self) -> bool {
        matches!(self, Component::KubeletPlugin)
    }

    /// The component's registry behind the object-safe [`AnyRegistry`] view.
    pub fn registry(self) -> &'static dyn AnyRegistry {
        match self {
            Component::DevicePlugin => device_plugin(),
            Component::SchedulerExtender => scheduler_extender(),
            Component::DeviceMonitor => device_monitor(),
            Component::KubeletPlugin => kubelet_plugin(),
        }
    }

    /// Where the Helm charts keep this component's gate map (`a.b.c` paths).
    pub const fn chart_values_paths(self) -> &'static [&'static str] {
        match self {
            Component::DevicePlugin => &["devicePlugin.devicePlugin.commands.featureGates"],
            Component::SchedulerExtender => &["scheduler.schedulerExtender.commands.featureGates"],
            Component::DeviceMonitor => &[
                "devicePlugin.deviceMonitor.commands.featureGates",
                "kubeletPlugin.containers.monitor.featureGates",
            ],
            Component::KubeletPlugin => &["kubeletPlugin.containers.plugin.featureGates"],
        }
    }

    fn core_gates(self) -> &'static [CoreGate] {
        use CoreGate::*;
        match self {
            Component::DevicePlugin => &[
                GPUCoreResourcePlugin,
                GPUMemoryResourcePlugin,
                AllocationFailureReschedule,
                TopologyAwareGPUAllocation,
                SharedSMUtilizationWatcher,
                VirtualMemoryTracking,
                DevicePluginClientMode,
                HonorPreAllocatedDeviceIDs,
            ],
            Component::SchedulerExtender => {
                &[SerializedNodeBind, SerializedNodeFilter, TopologyAwareGPUAllocation]
            }
            Component::DeviceMonitor => &[SharedSMUtilizationWatcher, VirtualMemoryTracking],
            Component::KubeletPlugin => &[],
        }
    }

    /// Names of the gates this component accepts, in the spec's order.
    pub fn gate_names(self) -> Vec<&'static str> {
        match self.registry_kind() {
            RegistryKind::Core => self.core_gates().iter().map(|g| g.name()).collect(),
            RegistryKind::Dra => DraGate::ALL.iter().map(|g| g.name()).collect(),
        }
    }
}

impl fmt::Display for Component {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An unknown component name.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown component {0:?}: expected one of device-plugin, scheduler-extender, device-monitor, kubelet-plugin"
)]
pub struct UnknownComponent(pub String);

impl FromStr for Component {
    type Err = UnknownComponent;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Component::ALL.into_iter().find(|c| c.as_str() == s).ok_or_else(|| UnknownComponent(s.to_owned()))
    }
}

/// Adds the hints every one of our registries shares: renamed gates and other components' gates.
fn with_hints<G: FeatureGate>(mut b: RegistryBuilder<G>, me: Component) -> RegistryBuilder<G> {
    for (old, new) in RENAMED_GATES {
        b = b.renamed(*old, *new);
    }
    for other in Component::ALL {
        if other != me {
            for name in other.gate_names() {
                b = b.owned_by(name, other.as_str());
            }
        }
    }
    b
}

fn core_builder(c: Component) -> RegistryBuilder<CoreGate> {
    with_hints(Registry::builder(c.as_str()).gates(c.core_gates().iter().copied()), c)
}

fn dra_builder() -> RegistryBuilder<DraGate> {
    use DraGate::*;
    // Upstream's `ValidateFeatureGates` order (violations are reported in it); the spec's
    // DynamicMIG ⊗ NVMLDeviceHealthCheck, which upstream does not check, sits after DynamicMIG ⊗ PassthroughSupport.
    Registry::builder(Component::KubeletPlugin.as_str())
        .gates(DraGate::ALL.iter().copied())
        .mutually_exclusive(VGPUSupport, MPSSupport)
        .mutually_exclusive(VGPUSupport, PassthroughSupport)
        .mutually_exclusive(VGPUSupport, ConsumableShares)
        .requires(SharedSMUtilizationWatcher, VGPUSupport)
        .requires(DevicePluginClientMode, VGPUSupport)
        .requires(NRISupport, VGPUSupport)
        .mutually_exclusive(DynamicMIG, PassthroughSupport)
        .mutually_exclusive(DynamicMIG, NVMLDeviceHealthCheck)
        .mutually_exclusive(DynamicMIG, MPSSupport)
        .mutually_exclusive(PassthroughSupport, NVMLDeviceHealthCheck)
        .requires(DeviceMetadata, PassthroughSupport)
}

// The static declarations are checked by `registries_build` below (`build()` succeeds on each).
static DEVICE_PLUGIN: LazyLock<Registry<CoreGate>> =
    LazyLock::new(|| core_builder(Component::DevicePlugin).finish());
static SCHEDULER_EXTENDER: LazyLock<Registry<CoreGate>> =
    LazyLock::new(|| core_builder(Component::SchedulerExtender).finish());
static DEVICE_MONITOR: LazyLock<Registry<CoreGate>> =
    LazyLock::new(|| core_builder(Component::DeviceMonitor).finish());
static KUBELET_PLUGIN: LazyLock<Registry<DraGate>> =
    LazyLock::new(|| with_hints(dra_builder(), Component::KubeletPlugin).finish());

/// The device-plugin's registry (Core).
pub fn device_plugin() -> &'static Registry<CoreGate> {
    &DEVICE_PLUGIN
}

/// The scheduler-extender's registry (Core).
pub fn scheduler_extender() -> &'static Registry<CoreGate> {
    &SCHEDULER_EXTENDER
}

/// The device-monitor's registry (Core).
pub fn device_monitor() -> &'static Registry<CoreGate> {
    &DEVICE_MONITOR
}

/// The kubelet-plugin's registry (DRA), with the spec's Requires and Mutually-exclusive rules.
pub fn kubelet_plugin() -> &'static Registry<DraGate> {
    &KUBELET_PLUGIN
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RegistryError;

    #[test]
    fn registries_build() -> Result<(), RegistryError> {
        for c in [Component::DevicePlugin, Component::SchedulerExtender, Component::DeviceMonitor] {
            assert_eq!(core_builder(c).build()?.gates().len(), c.gate_names().len());
        }
        let dra = with_hints(dra_builder(), Component::KubeletPlugin).build()?;
        assert_eq!(dra.gates().len(), 17);
        assert_eq!(dra.rules().len(), 11);
        assert_eq!(device_plugin().gates().len(), 8);
        assert_eq!(scheduler_extender().gates().len(), 3);
        assert_eq!(device_monitor().gates().len(), 2);
        Ok(())
    }

    #[test]
    fn component_names_round_trip() {
        for c in Component::ALL {
            assert_eq!(c.as_str().parse::<Component>(), Ok(c));
        }
        assert!("scheduler".parse::<Component>().is_err());
    }
}
