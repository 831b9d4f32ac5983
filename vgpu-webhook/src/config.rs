//! The webhook's resolved configuration (contract §1.4 flags), validated once at start-up.
//!
//! | flag | field | default | accepted |
//! |---|---|---|---|
//! | `--scheduler-name` | [`WebhookConfig::scheduler_name`] | none (leave `schedulerName` alone) | any non-empty name |
//! | `--default-node-policy` | [`WebhookConfig::default_node_policy`] | none | `binpack`, `spread` (case-insensitive) |
//! | `--default-device-policy` | [`WebhookConfig::default_device_policy`] | none | `binpack`, `spread` |
//! | `--default-topology-mode` | [`WebhookConfig::default_topology_mode`] | none | `numa`, `numa-strict`, `link`, `link-strict` |
//! | `--default-runtime-class` | [`WebhookConfig::default_runtime_class`] | none | a DNS subdomain |
//! | `--vgpu-device-class-name` | [`WebhookConfig::device_class_name`] | `vgpu-manager` | a DNS subdomain |
//! | `--dra-admission-enabled` | [`WebhookConfig::dra_admission`] | off | claim-sharing rules in `/pods/validate`, `/resourceclaims/validate` |
//! | `--default-convert2-dra` | [`WebhookConfig::convert_to_dra`] | off | vGPU limits → ResourceClaims (Volcano Jobs: ResourceClaimTemplates) |
//! | `--combined-resource-claim` | [`WebhookConfig::combined_claim`] | off | one claim per pod (per Volcano task); requires `--default-convert2-dra` |
//! | `--domain` | [`WebhookConfig::domain`] | `nvidia.com` | see [`ResourceDomain`] |
//!
//! Upstream ignores a default policy it does not recognise; here [`WebhookConfig::validate`] refuses it, so a
//! typo fails at start-up instead of silently setting nothing.

use vgpu_core::domain::ResourceDomain;
use vgpu_core::model::{SchedulingPolicy, TopologyMode};

/// The default `--vgpu-device-class-name`.
pub const DEFAULT_DEVICE_CLASS_NAME: &str = "vgpu-manager";

/// A flag value the webhook refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A default scheduling policy other than `binpack` or `spread`.
    #[error("invalid --{flag} {value:?}: expected binpack or spread")]
    Policy {
        /// The flag name without dashes.
        flag: &'static str,
        /// The rejected value.
        value: String,
    },
    /// A default topology mode other than the four placement modes.
    #[error("invalid --default-topology-mode {value:?}: expected numa, numa-strict, link or link-strict")]
    TopologyMode {
        /// The rejected value.
        value: String,
    },
    /// A name that is not a DNS subdomain.
    #[error(
        "invalid --{flag} {value:?}: expected a DNS subdomain (lower-case letters, digits, '-' and '.', at most 253 characters)"
    )]
    Name {
        /// The flag name without dashes.
        flag: &'static str,
        /// The rejected value.
        value: String,
    },
    /// `--combined-resource-claim` without `--default-convert2-dra`.
    #[error("--combined-resource-claim requires --default-convert2-dra")]
    CombinedWithoutConvert,
}

/// What the webhook does, resolved from the flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebhookConfig {
    /// The resource/annotation domain (`--domain`).
    pub domain: ResourceDomain,
    /// Set as `spec.schedulerName` on vGPU pods that name no scheduler or `default-scheduler`.
    pub scheduler_name: Option<String>,
    /// `node-scheduler-policy` set on vGPU pods without one.
    pub default_node_policy: Option<SchedulingPolicy>,
    /// `device-scheduler-policy` set on vGPU pods without one.
    pub default_device_policy: Option<SchedulingPolicy>,
    /// `device-topology-mode` set on pods with a multi-GPU container and none.
    pub default_topology_mode: Option<TopologyMode>,
    /// `spec.runtimeClassName` set on vGPU pods without one.
    pub default_runtime_class: Option<String>,
    /// The DeviceClass of generated vGPU ResourceClaims (`--vgpu-device-class-name`).
    pub device_class_name: String,
    /// Enforce the claim-sharing rules (`--dra-admission-enabled`).
    pub dra_admission: bool,
    /// Convert vGPU limits to ResourceClaims (`--default-convert2-dra`).
    pub convert_to_dra: bool,
    /// One ResourceClaim per pod instead of one per container (`--combined-resource-claim`).
    pub combined_claim: bool,
}

impl Default for WebhookConfig {
    fn default() -> Self {
        Self {
            domain: ResourceDomain::default(),
            scheduler_name: None,
            default_node_policy: None,
            default_device_policy: None,
            default_topology_mode: None,
            default_runtime_class: None,
            device_class_name: DEFAULT_DEVICE_CLASS_NAME.to_owned(),
            dra_admission: false,
            convert_to_dra: false,
            combined_claim: false,
        }
    }
}

/// Parses a `--default-node-policy` / `--default-device-policy` value: empty → none, else `binpack` or `spread`.
pub fn parse_default_policy(
    flag: &'static str,
    value: &str,
) -> Result<Option<SchedulingPolicy>, ConfigError> {
    if value.trim().is_empty() {
        return Ok(None);
    }
    match value.parse::<SchedulingPolicy>() {
        Ok(p @ (SchedulingPolicy::Binpack | SchedulingPolicy::Spread)) => Ok(Some(p)),
        _ => Err(ConfigError::Policy { flag, value: value.to_owned() }),
    }
}

/// Parses `--default-topology-mode`: empty → none, else one of the four placement modes (`none` is refused: it
/// is the default already).
pub fn parse_default_topology_mode(value: &str) -> Result<Option<TopologyMode>, ConfigError> {
    if value.trim().is_empty() {
        return Ok(None);
    }
    match value.parse::<TopologyMode>() {
        Ok(TopologyMode::None) | Err(_) => Err(ConfigError::TopologyMode { value: value.to_owned() }),
        Ok(mode) => Ok(Some(mode)),
    }
}

/// Whether `name` is a DNS-1123 subdomain (the form of object names such as DeviceClass and RuntimeClass).
pub fn is_dns_subdomain(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

impl WebhookConfig {
    /// Checks the combinations and names the flags cannot check alone.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.combined_claim && !self.convert_to_dra {
            return Err(ConfigError::CombinedWithoutConvert);
        }
        if !is_dns_subdomain(&self.device_class_name) {
            return Err(ConfigError::Name {
                flag: "vgpu-device-class-name",
                value: self.device_class_name.clone(),
            });
        }
        if let Some(rc) = &self.default_runtime_class
            && !is_dns_subdomain(rc)
        {
            return Err(ConfigError::Name { flag: "default-runtime-class", value: rc.clone() });
        }
        if let Some(policy) = self.default_node_policy
            && policy == SchedulingPolicy::None
        {
            return Err(ConfigError::Policy { flag: "default-node-policy", value: policy.to_string() });
        }
        if let Some(policy) = self.default_device_policy
            && policy == SchedulingPolicy::None
        {
            return Err(ConfigError::Policy { flag: "default-device-policy", value: policy.to_string() });
        }
        if self.default_topology_mode == Some(TopologyMode::None) {
            return Err(ConfigError::TopologyMode { value: "none".to_owned() });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn flag_values() {
        assert_eq!(parse_default_policy("default-node-policy", "").unwrap(), None);
        assert_eq!(
            parse_default_policy("default-node-policy", "Binpack").unwrap(),
            Some(SchedulingPolicy::Binpack)
        );
        assert_eq!(
            parse_default_policy("default-device-policy", "none").unwrap_err().to_string(),
            "invalid --default-device-policy \"none\": expected binpack or spread"
        );
        assert_eq!(parse_default_topology_mode("link-strict").unwrap(), Some(TopologyMode::LinkStrict));
        assert_eq!(
            parse_default_topology_mode("ring").unwrap_err().to_string(),
            "invalid --default-topology-mode \"ring\": expected numa, numa-strict, link or link-strict"
        );
        assert!(parse_default_topology_mode("none").is_err());
    }

    #[test]
    fn combinations_and_names() {
        assert_eq!(WebhookConfig::default().validate(), Ok(()));
        let c = WebhookConfig { combined_claim: true, ..WebhookConfig::default() };
        assert_eq!(
            c.validate().unwrap_err().to_string(),
            "--combined-resource-claim requires --default-convert2-dra"
        );
        let c = WebhookConfig { device_class_name: "Bad_Name".into(), ..WebhookConfig::default() };
        assert!(
            c.validate()
                .unwrap_err()
                .to_string()
                .starts_with("invalid --vgpu-device-class-name \"Bad_Name\"")
        );
        let c = WebhookConfig { default_runtime_class: Some("-x".into()), ..WebhookConfig::default() };
        assert!(matches!(c.validate(), Err(ConfigError::Name { flag: "default-runtime-class", .. })));
        assert!(is_dns_subdomain("nvidia.vgpu-1") && !is_dns_subdomain("a..b") && !is_dns_subdomain(""));
    }
}
