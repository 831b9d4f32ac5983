//! [`FeatureGates`]: the gate values of one component, set from flags, env or maps.

use std::{collections::BTreeMap, fmt};

use crate::{
    error::{Error, GateError, SetError},
    parse::parse_entries,
    registry::{ALL_ALPHA, ALL_BETA, Key, Registry},
    spec::{FeatureGate, Stage},
};

/// The state of one component's gates: what was set explicitly, on top of the registry's
/// defaults.
///
/// Every mutating method is all-or-nothing: when it returns an error the set is unchanged.
/// Two sets are equal when they hold the same explicit settings.
#[derive(Clone, Debug)]
pub struct FeatureGates<'r, G> {
    registry: &'r Registry<G>,
    explicit: Vec<Option<bool>>,
    all_alpha: Option<bool>,
    all_beta: Option<bool>,
}

impl<G: FeatureGate> PartialEq for FeatureGates<'_, G> {
    fn eq(&self, other: &Self) -> bool {
        self.registry.gates() == other.registry.gates()
            && self.explicit == other.explicit
            && self.all_alpha == other.all_alpha
            && self.all_beta == other.all_beta
    }
}

impl<G: FeatureGate> Eq for FeatureGates<'_, G> {}

impl<'r, G: FeatureGate> FeatureGates<'r, G> {
    /// Every gate of `registry` at its default.
    pub fn new(registry: &'r Registry<G>) -> Self {
        Self { registry, explicit: vec![None; registry.gates().len()], all_alpha: None, all_beta: None }
    }

    /// The registry this set belongs to.
    pub fn registry(&self) -> &'r Registry<G> {
        self.registry
    }

    /// Whether `gate` is on. A gate this component does not hold is off.
    pub fn enabled(&self, gate: G) -> bool {
        self.registry.index_of(gate).is_some_and(|i| self.value_at(i))
    }

    /// Whether `gate` was set explicitly (not through a default or `AllAlpha`/`AllBeta`).
    pub fn is_explicit(&self, gate: G) -> bool {
        self.registry.index_of(gate).is_some_and(|i| self.explicit[i].is_some())
    }

    pub(crate) fn value_at(&self, i: usize) -> bool {
        if let Some(v) = self.explicit[i] {
            return v;
        }
        let spec = self.registry.spec_at(i);
        if spec.lock_to_default {
            return spec.default;
        }
        match spec.stage {
            Stage::Alpha => self.all_alpha.unwrap_or(spec.default),
            Stage::Beta => self.all_beta.unwrap_or(spec.default),
            Stage::Ga | Stage::Deprecated => spec.default,
        }
    }

    pub(crate) fn explicit_at(&self, i: usize) -> Option<bool> {
        self.explicit[i]
    }

    pub(crate) fn set_explicit_at(&mut self, i: usize, v: bool) {
        self.explicit[i] = Some(v);
    }

    /// Applies one `--feature-gates` value (`A=true,B=false`) on top of the current state,
    /// as component-base's `Set` does: later entries win, explicitly named gates win over
    /// `AllAlpha`/`AllBeta` whatever the order, and an empty value changes nothing.
    pub fn set(&mut self, value: &str) -> Result<(), SetError> {
        let entries = parse_entries(value)?;
        self.set_from_map(entries)
    }

    /// Applies `(name, value)` pairs, e.g. from a Helm values map.
    pub fn set_from_map<S: AsRef<str>>(
        &mut self,
        entries: impl IntoIterator<Item = (S, bool)>,
    ) -> Result<(), SetError> {
        let mut next = self.clone();
        let mut errors = Vec::new();
        for (name, value) in entries {
            let name = name.as_ref();
            match self.registry.lookup(name) {
                Some(Key::AllAlpha) => next.all_alpha = Some(value),
                Some(Key::AllBeta) => next.all_beta = Some(value),
                Some(Key::Gate(i)) => {
                    let spec = self.registry.spec_at(i);
                    if spec.lock_to_default && value != spec.default {
                        errors.push(GateError::Locked {
                            name: name.to_owned(),
                            value,
                            locked_to: spec.default,
                        });
                    } else {
                        next.explicit[i] = Some(value);
                    }
                }
                None => errors.push(self.registry.unrecognized(name)),
            }
        }
        if errors.is_empty() {
            *self = next;
            Ok(())
        } else {
            Err(SetError::new(errors))
        }
    }

    /// Sets one typed gate.
    pub fn set_gate(&mut self, gate: G, value: bool) -> Result<(), SetError> {
        self.set_from_map([(gate.name(), value)])
    }

    /// Every gate of the component with its effective value, sorted by name.
    pub fn effective(&self) -> BTreeMap<&'static str, bool> {
        (0..self.explicit.len()).map(|i| (self.registry.name_at(i), self.value_at(i))).collect()
    }

    /// The explicit settings (special keys included), sorted by name.
    pub fn overrides(&self) -> BTreeMap<&'static str, bool> {
        let mut out: BTreeMap<&'static str, bool> = self
            .explicit
            .iter()
            .enumerate()
            .filter_map(|(i, v)| v.map(|v| (self.registry.name_at(i), v)))
            .collect();
        if let Some(v) = self.all_alpha {
            out.insert(ALL_ALPHA, v);
        }
        if let Some(v) = self.all_beta {
            out.insert(ALL_BETA, v);
        }
        out
    }

    /// Warnings component-base would log for the explicit settings (Deprecated and GA gates).
    pub fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (i, v) in self.explicit.iter().enumerate() {
            let Some(v) = v else { continue };
            let name = self.registry.name_at(i);
            match self.registry.spec_at(i).stage {
                Stage::Deprecated => out.push(format!(
                    "Setting deprecated feature gate {name}={v}. It will be removed in a future release."
                )),
                Stage::Ga => out.push(format!(
                    "Setting GA feature gate {name}={v}. It will be removed in a future release."
                )),
                Stage::Alpha | Stage::Beta => {}
            }
        }
        out
    }
}

/// The canonical `--feature-gates` form: explicit settings sorted by name, `Name=bool` joined
/// by `,` (empty when nothing is set). Parsing it on top of the defaults gives an equal set.
// The registry's constructors of gate sets live here, beside the set they build: `registry` stays below `set`.
impl<G: FeatureGate> Registry<G> {
    /// Every gate at its default, nothing set.
    pub fn defaults(&self) -> FeatureGates<'_, G> {
        FeatureGates::new(self)
    }

    /// Parses one `--feature-gates` value on top of the defaults (no rule validation).
    pub fn parse(&self, value: &str) -> Result<FeatureGates<'_, G>, SetError> {
        let mut gates = self.defaults();
        gates.set(value)?;
        Ok(gates)
    }

    /// Applies each value in order (as repeated `--feature-gates` flags are), then validates
    /// the rules. This is what a component does at start-up.
    pub fn configure<S: AsRef<str>>(
        &self,
        values: impl IntoIterator<Item = S>,
    ) -> Result<FeatureGates<'_, G>, Error> {
        let mut gates = self.defaults();
        for v in values {
            gates.set(v.as_ref())?;
        }
        gates.validate()?;
        Ok(gates)
    }
}

impl<G: FeatureGate> fmt::Display for FeatureGates<'_, G> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (name, value)) in self.overrides().into_iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{name}={value}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RegistryError;

    crate::feature_gates! {
        /// Gates for stage tests.
        enum T {
            /// alpha off
            A => alpha(false),
            /// alpha on
            AOn => alpha(true),
            /// beta on
            B => beta(true),
            /// beta off
            BOff => beta(false),
            /// ga
            G => ga(true),
            /// deprecated
            D => deprecated(false),
        }
    }

    fn reg() -> Result<Registry<T>, RegistryError> {
        Registry::builder("t").gates(T::ALL.iter().copied()).build()
    }

    #[test]
    fn stage_semantics() -> Result<(), Box<dyn std::error::Error>> {
        let r = reg()?;
        let mut g = r.defaults();
        assert!(!g.enabled(T::A) && g.enabled(T::AOn) && g.enabled(T::B) && !g.enabled(T::BOff));
        assert!(g.enabled(T::G) && !g.enabled(T::D));
        g.set("A=true,B=false,D=true,G=true")?;
        assert!(g.enabled(T::A) && !g.enabled(T::B) && g.enabled(T::D));
        assert_eq!(g.warnings().len(), 2, "{:?}", g.warnings());
        let before = g.clone();
        let err = g.set("A=false,G=false").map_err(|e| e.to_string());
        assert_eq!(err, Err("cannot set feature gate G to false, feature is locked to true".into()));
        assert_eq!(g, before, "failed set must not change anything");
        Ok(())
    }

    #[test]
    fn all_alpha_and_all_beta_lose_to_named_gates_in_any_order() -> Result<(), Box<dyn std::error::Error>> {
        let r = reg()?;
        for s in ["AllAlpha=false,A=true", "A=true,AllAlpha=false"] {
            let g = r.parse(s)?;
            assert!(g.enabled(T::A), "{s}");
            assert!(!g.enabled(T::AOn), "{s}: AllAlpha=false turns off an alpha gate that defaults on");
            assert!(g.enabled(T::B) && g.enabled(T::G), "{s}: non-alpha gates untouched");
        }
        for s in ["AllBeta=true,B=false", "B=false,AllBeta=true"] {
            let g = r.parse(s)?;
            assert!(!g.enabled(T::B) && g.enabled(T::BOff) && !g.enabled(T::A), "{s}");
        }
        // A later Set call keeps the earlier explicit setting against a new AllAlpha.
        let mut g = r.parse("A=false")?;
        g.set("AllAlpha=true")?;
        assert!(!g.enabled(T::A) && g.enabled(T::AOn));
        assert!(!g.enabled(T::D), "deprecated gates are not alpha");
        Ok(())
    }

    #[test]
    fn canonical_form_is_sorted_and_round_trips() -> Result<(), Box<dyn std::error::Error>> {
        let r = reg()?;
        let g = r.parse(" D=1 , AllAlpha=t,A=F ")?;
        assert_eq!(g.to_string(), "A=false,AllAlpha=true,D=true");
        assert_eq!(r.parse(&g.to_string())?, g);
        assert_eq!(r.defaults().to_string(), "");
        Ok(())
    }

    #[test]
    fn all_errors_reported_and_state_kept() -> Result<(), Box<dyn std::error::Error>> {
        let r = reg()?;
        let mut g = r.parse("A=true")?;
        let before = g.clone();
        let err = g.set("B=false,Nope=true,G=false").err().ok_or("expected an error")?;
        assert_eq!(err.errors().len(), 2);
        assert!(err.to_string().starts_with("unrecognized feature gate: Nope\n"));
        assert_eq!(g, before);
        Ok(())
    }
}
