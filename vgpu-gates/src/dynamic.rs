//! [`AnyRegistry`]: an object-safe view of a registry, for code that handles several
//! components whose gate types differ (CLIs, admission checks, config linters).

use std::collections::BTreeMap;

use crate::{Error, FeatureGate, GateSpec, Registry};

/// One gate as data: its name and spec.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GateInfo {
    /// The gate's name.
    pub name: &'static str,
    /// Default, stage and lock.
    pub spec: GateSpec,
}

/// The outcome of configuring a component's gates successfully.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Configured {
    /// Every gate of the component with its effective value.
    pub effective: BTreeMap<&'static str, bool>,
    /// The canonical `--feature-gates` string of the explicit settings.
    pub canonical: String,
    /// Warnings about Deprecated or GA gates that were set.
    pub warnings: Vec<String>,
}

/// A registry whose gate type is erased.
pub trait AnyRegistry: Send + Sync {
    /// The component the registry belongs to.
    fn component(&self) -> &str;
    /// Every accepted gate, in declaration order.
    fn gate_infos(&self) -> Vec<GateInfo>;
    /// Applies `--feature-gates` values in order on top of the defaults, then validates the rules.
    fn configure_values(&self, values: &[&str]) -> Result<Configured, Error>;
    /// Applies `(name, value)` pairs on top of the defaults, then validates the rules.
    fn configure_map(&self, entries: &[(String, bool)]) -> Result<Configured, Error>;
}

impl<G: FeatureGate> AnyRegistry for Registry<G> {
    fn component(&self) -> &str {
        Registry::component(self)
    }

    fn gate_infos(&self) -> Vec<GateInfo> {
        self.gates().iter().map(|g| GateInfo { name: g.name(), spec: g.spec() }).collect()
    }

    fn configure_values(&self, values: &[&str]) -> Result<Configured, Error> {
        let gates = self.configure(values)?;
        Ok(Configured {
            effective: gates.effective(),
            canonical: gates.to_string(),
            warnings: gates.warnings(),
        })
    }

    fn configure_map(&self, entries: &[(String, bool)]) -> Result<Configured, Error> {
        let mut gates = self.defaults();
        gates.set_from_map(entries.iter().map(|(k, v)| (k.as_str(), *v)))?;
        gates.validate()?;
        Ok(Configured {
            effective: gates.effective(),
            canonical: gates.to_string(),
            warnings: gates.warnings(),
        })
    }
}
