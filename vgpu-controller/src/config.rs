//! The controller's resolved configuration ([`ControllerConfig`]): the API group of the GPU module's kinds and
//! the DRA driver of each vendor.
//!
//! | vendor key | DRA driver (default) | source |
//! |---|---|---|
//! | `nvidia` | `manager.nvidia.com` | [`vgpu_core::dra::DRIVER_NAME`], contract §9 |
//! | `metax` | `gpu.metax-tech.com` | [`METAX_DRIVER_NAME`]: our MetaX adapter's driver name (MetaX's domain) |
//!
//! `--driver <vendor>=<driver>` overrides or adds an entry ([`parse_driver_flag`]).
//! `--orphaned-claim-grace-period` sets [`ControllerConfig::orphan_grace`] ([`crate::claims`]).

use std::collections::BTreeMap;
use std::time::Duration;

/// How long a generated ResourceClaim whose pod cannot be found is kept by default ([`crate::claims`]).
pub const DEFAULT_ORPHAN_GRACE: Duration = Duration::from_secs(60);

/// The DRA driver name our MetaX adapter publishes under.
pub const METAX_DRIVER_NAME: &str = "gpu.metax-tech.com";

/// A bad configuration value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A `--driver` value that is not `<vendor>=<driver>`.
    #[error(
        "invalid --driver {0:?}: expected <vendor>=<driver>, a lower-case vendor key and a DNS subdomain driver name, such as metax=gpu.metax-tech.com"
    )]
    Driver(String),
    /// The API group is invalid.
    #[error(transparent)]
    Group(#[from] vgpu_api::GroupError),
}

/// What the controller needs to know about the cluster's conventions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControllerConfig {
    /// The API group of PhysicalGPU and GPUClass (`gpu.deckhouse.io`).
    pub group: String,
    /// Vendor key → DRA driver name.
    pub drivers: BTreeMap<String, String>,
    /// How old a generated ResourceClaim whose pod does not exist must be before it is deleted
    /// ([`crate::claims`]; covers the time between the pod mutation and the pod being stored).
    pub orphan_grace: Duration,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        let drivers = [("nvidia", vgpu_core::dra::DRIVER_NAME), ("metax", METAX_DRIVER_NAME)]
            .into_iter()
            .map(|(v, d)| (v.to_owned(), d.to_owned()))
            .collect();
        Self { group: vgpu_api::DEFAULT_GROUP.to_owned(), drivers, orphan_grace: DEFAULT_ORPHAN_GRACE }
    }
}

impl ControllerConfig {
    /// The default drivers under `group` (checked).
    pub fn with_group(group: &str) -> Result<Self, ConfigError> {
        vgpu_api::validate_group(group)?;
        Ok(Self { group: group.to_owned(), ..Self::default() })
    }

    /// The DRA driver of `vendor`, if the vendor is known.
    pub fn driver(&self, vendor: &str) -> Option<&str> {
        self.drivers.get(vendor).map(String::as_str)
    }

    /// The vendor of DRA driver `driver`, if known.
    pub fn vendor_of_driver(&self, driver: &str) -> Option<&str> {
        self.drivers.iter().find(|(_, d)| d.as_str() == driver).map(|(v, _)| v.as_str())
    }

    /// The name of the DeviceClass made of GPUClass `class`: `<class>.<group>` (`a100-shared.gpu.deckhouse.io`).
    pub fn device_class_name(&self, class: &str) -> String {
        format!("{class}.{}", self.group)
    }

    /// The GPUClass a DeviceClass name was made of, when it has the `.<group>` suffix.
    pub fn class_of_device_class<'a>(&self, device_class: &'a str) -> Option<&'a str> {
        device_class.strip_suffix(self.group.as_str())?.strip_suffix('.').filter(|c| !c.is_empty())
    }

    /// The label naming the GPUClass on DeviceClasses and generated claims (`gpu.deckhouse.io/gpuclass`).
    pub fn class_label(&self) -> String {
        format!("{}/gpuclass", self.group)
    }

    /// The label the pod mutation puts on a pod and on the ResourceClaims it creates for it, with the same
    /// value (`gpu.deckhouse.io/admission-id`): how the controller finds the pod of a claim ([`crate::claims`]).
    pub fn admission_label(&self) -> String {
        format!("{}/admission-id", self.group)
    }
}

/// Parses one `--driver <vendor>=<driver>` value.
pub fn parse_driver_flag(value: &str) -> Result<(String, String), ConfigError> {
    let bad = || ConfigError::Driver(value.to_owned());
    let (vendor, driver) = value.split_once('=').ok_or_else(bad)?;
    let vendor_ok = !vendor.is_empty()
        && vendor.len() <= 63
        && vendor.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    if !vendor_ok || vgpu_api::validate_group(driver).is_err() {
        return Err(bad());
    }
    Ok((vendor.to_owned(), driver.to_owned()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn names_and_drivers() {
        let c = ControllerConfig::default();
        assert_eq!(c.driver("nvidia"), Some("manager.nvidia.com"));
        assert_eq!(c.vendor_of_driver(METAX_DRIVER_NAME), Some("metax"));
        assert_eq!(c.device_class_name("a100-shared"), "a100-shared.gpu.deckhouse.io");
        assert_eq!(c.class_of_device_class("a100-shared.gpu.deckhouse.io"), Some("a100-shared"));
        assert_eq!(c.class_of_device_class("vgpu-manager"), None);
        assert_eq!(c.class_of_device_class(".gpu.deckhouse.io"), None);
        assert_eq!(c.admission_label(), "gpu.deckhouse.io/admission-id");
        assert_eq!(c.orphan_grace, Duration::from_secs(60));
        assert_eq!(parse_driver_flag("amd=gpu.amd.com").unwrap(), ("amd".into(), "gpu.amd.com".into()));
        for bad in ["amd", "=x.y", "AMD=a.b", "amd=nodot"] {
            assert_eq!(parse_driver_flag(bad), Err(ConfigError::Driver(bad.into())), "{bad}");
        }
        assert!(ControllerConfig::with_group("nodots").is_err());
    }
}
