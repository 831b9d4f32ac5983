//! The configurable resource/annotation domain (`--domain`, default `nvidia.com`) and every key built
//! from it (contract §2).

use std::fmt;

/// The default domain.
pub const DEFAULT_DOMAIN: &str = "nvidia.com";

/// Label on namespaces/objects the admission webhook ignores (not domain-dependent).
pub const IGNORE_WEBHOOK_LABEL: &str = "vgpu-manager.io/ignore-webhook";
/// Pod annotation holding the original vGPU resources of a pod converted to DRA.
pub const ORIGINAL_RESOURCES_ANNOTATION: &str = "vgpu-manager.io/original-resources";
/// Label on generated ResourceClaims naming the owner (`<ns>-<pod>`).
pub const OWNER_KEY_LABEL: &str = "vgpu-manager.io/owner-key";
/// Label on generated ResourceClaims with the creation time in milliseconds.
pub const CREATE_TIMESTAMP_LABEL: &str = "vgpu-manager.io/create-timestamp";
/// Scheduler pod label `leader`/`follower`.
pub const SCHEDULER_ROLE_LABEL: &str = "vgpu-manager.io/scheduler-role";

/// A domain that is not a usable DNS subdomain.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid domain {value:?}: expected a DNS subdomain such as \"nvidia.com\" (lower-case letters, digits, '-' and '.', at most 253 characters)"
)]
pub struct InvalidDomain {
    /// The rejected input.
    pub value: String,
}

/// The domain of every vGPU resource name and annotation/label key, e.g. `nvidia.com`.
///
/// ```
/// use vgpu_core::domain::ResourceDomain;
/// let d = ResourceDomain::new("example.com")?;
/// assert_eq!(d.vgpu_number(), "example.com/vgpu-number");
/// assert_eq!(d.mig_resource("1g.5gb+me"), "example.com/mig-1g.5gb.me");
/// # Ok::<(), vgpu_core::domain::InvalidDomain>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ResourceDomain(String);

impl Default for ResourceDomain {
    fn default() -> Self {
        ResourceDomain(DEFAULT_DOMAIN.to_owned())
    }
}

impl fmt::Display for ResourceDomain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for ResourceDomain {
    type Err = InvalidDomain;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ResourceDomain::new(s)
    }
}

macro_rules! keys {
    ($( $(#[$m:meta])* $fn:ident => $suffix:literal ),+ $(,)?) => {
        $(
            $(#[$m])*
            pub fn $fn(&self) -> String {
                self.key($suffix)
            }
        )+
    };
}

impl ResourceDomain {
    /// Validates a domain: non-empty, ≤ 253 characters, dot-separated labels of `[a-z0-9-]` that neither
    /// start nor end with `-`.
    pub fn new(domain: &str) -> Result<Self, InvalidDomain> {
        let bad = || InvalidDomain { value: domain.to_owned() };
        if domain.is_empty() || domain.len() > 253 {
            return Err(bad());
        }
        for label in domain.split('.') {
            let ok = !label.is_empty()
                && label.len() <= 63
                && label.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-');
            if !ok {
                return Err(bad());
            }
        }
        Ok(ResourceDomain(domain.to_owned()))
    }

    /// The domain text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// `<domain>/<name>`.
    pub fn key(&self, name: &str) -> String {
        // One allocation of the exact size (`format!` grows its buffer two or three times): the scheduler
        // builds a dozen keys per filter call.
        let mut key = String::with_capacity(self.0.len() + 1 + name.len());
        key.push_str(&self.0);
        key.push('/');
        key.push_str(name);
        key
    }

    /// MIG extended resource for a profile (`+` becomes `.`): `<domain>/mig-<profile>`.
    pub fn mig_resource(&self, profile: &str) -> String {
        self.key(&format!("mig-{}", profile.replace('+', ".")))
    }

    // Extended resources.
    keys! {
        /// Resource `vgpu-number`: vGPUs requested.
        vgpu_number => "vgpu-number",
        /// Resource `vgpu-cores`: percent of one GPU per vGPU.
        vgpu_cores => "vgpu-cores",
        /// Resource `vgpu-memory`: memory per vGPU in memory-factor units.
        vgpu_memory => "vgpu-memory",
        /// Native resource `gpu` (DRA extendedResourceName only).
        gpu => "gpu",
    }

    // Node annotations.
    keys! {
        /// Node annotation `node-device-register`: the device inventory JSON.
        node_device_register => "node-device-register",
        /// Node annotation `node-config-info`: the node vGPU config JSON.
        node_config_info => "node-config-info",
        /// Node annotation `node-device-topology`: the GPU link matrix JSON.
        node_device_topology => "node-device-topology",
        /// Node annotation `node-gpu-domain`: GPU UUID → rail map (consumed only).
        node_gpu_domain => "node-gpu-domain",
        /// Deprecated node annotation `node-device-heartbeat` (only deleted).
        node_device_heartbeat => "node-device-heartbeat",
        /// Pod or node annotation `vgpu-compute-policy`.
        vgpu_compute_policy => "vgpu-compute-policy",
    }

    // Node labels.
    keys! {
        /// Node label `node-driver-version`.
        node_driver_version => "node-driver-version",
        /// Node label `node-cuda-version` (`major.minor`).
        node_cuda_version => "node-cuda-version",
        /// Node label `node-cuda-major`.
        node_cuda_major => "node-cuda-major",
        /// Node label `node-cuda-minor`.
        node_cuda_minor => "node-cuda-minor",
    }

    // Pod annotations and labels written by the scheduler / device plugin.
    keys! {
        /// Pod annotation `pre-allocated`: the scheduler's device claim.
        pre_allocated => "pre-allocated",
        /// Pod annotation `real-allocated`: the device plugin's device claim.
        real_allocated => "real-allocated",
        /// Pod annotation `predicate-node`: the node chosen by Filter.
        predicate_node => "predicate-node",
        /// Pod annotation `predicate-time`: UnixNano of Filter/Bind.
        predicate_time => "predicate-time",
        /// Pod label `assigned-phase`.
        assigned_phase => "assigned-phase",
        /// Pod label `metrics-node`.
        metrics_node => "metrics-node",
    }

    // Pod annotations read (user / webhook).
    keys! {
        /// Pod annotation `node-scheduler-policy`.
        node_scheduler_policy => "node-scheduler-policy",
        /// Pod annotation `device-scheduler-policy`.
        device_scheduler_policy => "device-scheduler-policy",
        /// Pod annotation `memory-scheduler-policy`.
        memory_scheduler_policy => "memory-scheduler-policy",
        /// Pod annotation `device-topology-mode`.
        device_topology_mode => "device-topology-mode",
        /// Pod annotation `cross-pod-topology`.
        cross_pod_topology => "cross-pod-topology",
        /// Pod annotation `include-gpu-type`.
        include_gpu_type => "include-gpu-type",
        /// Pod annotation `exclude-gpu-type`.
        exclude_gpu_type => "exclude-gpu-type",
        /// Pod annotation `include-gpu-uuid`.
        include_gpu_uuid => "include-gpu-uuid",
        /// Pod annotation `exclude-gpu-uuid`.
        exclude_gpu_uuid => "exclude-gpu-uuid",
        /// Pod annotation `stuck-grace-period`.
        stuck_grace_period => "stuck-grace-period",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_keys() {
        let d = ResourceDomain::default();
        assert_eq!(d.vgpu_number(), "nvidia.com/vgpu-number");
        assert_eq!(d.vgpu_cores(), "nvidia.com/vgpu-cores");
        assert_eq!(d.vgpu_memory(), "nvidia.com/vgpu-memory");
        assert_eq!(d.node_device_register(), "nvidia.com/node-device-register");
        assert_eq!(d.node_config_info(), "nvidia.com/node-config-info");
        assert_eq!(d.node_device_topology(), "nvidia.com/node-device-topology");
        assert_eq!(d.pre_allocated(), "nvidia.com/pre-allocated");
        assert_eq!(d.real_allocated(), "nvidia.com/real-allocated");
        assert_eq!(d.include_gpu_uuid(), "nvidia.com/include-gpu-uuid");
        assert_eq!(d.mig_resource("1g.10gb+me"), "nvidia.com/mig-1g.10gb.me");
    }

    #[test]
    fn rejects_bad_domains() {
        for bad in ["", "Nvidia.com", "a..b", "-a.com", "a/b", "a b"] {
            let err = ResourceDomain::new(bad).unwrap_err();
            assert_eq!(err.value, bad);
        }
        assert_eq!("example.com".parse::<ResourceDomain>().unwrap().as_str(), "example.com");
    }
}
