//! [`Registry`]: the gates one component accepts, the rules between them, and the hints used
//! to explain an unknown name.

use std::collections::BTreeMap;

use crate::{
    error::{GateError, RegistryError, Unrecognized},
    spec::{FeatureGate, GateSpec},
};

/// Special key that sets every unset Alpha gate.
pub const ALL_ALPHA: &str = "AllAlpha";
/// Special key that sets every unset Beta gate.
pub const ALL_BETA: &str = "AllBeta";

/// A dependency or exclusion rule between two gates of one registry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule<G> {
    /// When `gate` is on, `requires` must be on too.
    Requires {
        /// The dependent gate.
        gate: G,
        /// The gate it needs.
        requires: G,
    },
    /// The two gates may not both be on.
    MutuallyExclusive(G, G),
}

/// What a name means to a registry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Key {
    AllAlpha,
    AllBeta,
    Gate(usize),
}

/// The gates of one component, their rules, and help for unknown names.
///
/// Build one with [`Registry::builder`]; create gate sets from it with [`Registry::defaults`],
/// [`Registry::parse`] or [`Registry::configure`].
#[derive(Clone, Debug)]
pub struct Registry<G> {
    component: String,
    gates: Vec<G>,
    names: Vec<&'static str>,
    rules: Vec<Rule<G>>,
    renamed: BTreeMap<String, String>,
    owners: BTreeMap<String, Vec<String>>,
}

/// Builder of a [`Registry`].
#[derive(Clone, Debug)]
pub struct RegistryBuilder<G> {
    inner: Registry<G>,
}

impl<G: FeatureGate> RegistryBuilder<G> {
    /// Adds one gate.
    pub fn gate(mut self, gate: G) -> Self {
        self.inner.gates.push(gate);
        self
    }

    /// Adds several gates, in order.
    pub fn gates(mut self, gates: impl IntoIterator<Item = G>) -> Self {
        self.inner.gates.extend(gates);
        self
    }

    /// Declares that `gate` needs `requires` to be on.
    pub fn requires(mut self, gate: G, requires: G) -> Self {
        self.inner.rules.push(Rule::Requires { gate, requires });
        self
    }

    /// Declares that `a` and `b` may not both be on.
    pub fn mutually_exclusive(mut self, a: G, b: G) -> Self {
        self.inner.rules.push(Rule::MutuallyExclusive(a, b));
        self
    }

    /// Records that gate `old` was renamed to `new` (used only to explain an unknown name).
    pub fn renamed(mut self, old: impl Into<String>, new: impl Into<String>) -> Self {
        self.inner.renamed.insert(old.into(), new.into());
        self
    }

    /// Records that gate `name` belongs to component `owner` (used only to explain an unknown name).
    pub fn owned_by(mut self, name: impl Into<String>, owner: impl Into<String>) -> Self {
        let owners = self.inner.owners.entry(name.into()).or_default();
        let owner = owner.into();
        if !owners.contains(&owner) {
            owners.push(owner);
        }
        self
    }

    /// Checks the declaration and returns the registry.
    pub fn build(self) -> Result<Registry<G>, RegistryError> {
        let r = self.finish();
        let component = r.component.clone();
        for (i, name) in r.names.iter().enumerate() {
            let bad = name.is_empty()
                || name.contains(['=', ','])
                || name.chars().any(char::is_whitespace)
                || *name == ALL_ALPHA
                || *name == ALL_BETA;
            if bad {
                return Err(RegistryError::InvalidName { component, name: (*name).to_owned() });
            }
            if r.names[..i].contains(name) {
                return Err(RegistryError::Duplicate { component, name: (*name).to_owned() });
            }
        }
        for rule in &r.rules {
            let (a, b) = match *rule {
                Rule::Requires { gate, requires } => (gate, requires),
                Rule::MutuallyExclusive(a, b) => (a, b),
            };
            for g in [a, b] {
                if !r.gates.contains(&g) {
                    return Err(RegistryError::UnknownRuleGate { component, name: g.name().to_owned() });
                }
            }
        }
        Ok(r)
    }

    /// The registry without the declaration checks of [`build`](Self::build); for static
    /// declarations whose `build` is asserted by a test.
    pub(crate) fn finish(self) -> Registry<G> {
        let mut r = self.inner;
        r.names = r.gates.iter().map(|g| g.name()).collect();
        // A gate we hold is not "owned elsewhere" from our point of view.
        let names = r.names.clone();
        r.owners.retain(|name, _| !names.contains(&name.as_str()));
        r
    }
}

impl<G: FeatureGate> Registry<G> {
    /// Starts a registry for `component` (the name used in messages, e.g. `device-plugin`).
    pub fn builder(component: impl Into<String>) -> RegistryBuilder<G> {
        RegistryBuilder {
            inner: Registry {
                component: component.into(),
                gates: Vec::new(),
                names: Vec::new(),
                rules: Vec::new(),
                renamed: BTreeMap::new(),
                owners: BTreeMap::new(),
            },
        }
    }

    /// The component this registry belongs to.
    pub fn component(&self) -> &str {
        &self.component
    }

    /// The accepted gates, in declaration order.
    pub fn gates(&self) -> &[G] {
        &self.gates
    }

    /// The rules, in declaration order (also the order violations are reported in).
    pub fn rules(&self) -> &[Rule<G>] {
        &self.rules
    }

    /// Whether this registry holds `gate`.
    pub fn contains(&self, gate: G) -> bool {
        self.gates.contains(&gate)
    }

    /// The gate called `name`, if this registry holds it.
    pub fn gate_by_name(&self, name: &str) -> Option<G> {
        self.names.iter().position(|n| *n == name).map(|i| self.gates[i])
    }

    pub(crate) fn index_of(&self, gate: G) -> Option<usize> {
        self.gates.iter().position(|g| *g == gate)
    }

    pub(crate) fn spec_at(&self, i: usize) -> GateSpec {
        self.gates[i].spec()
    }

    pub(crate) fn name_at(&self, i: usize) -> &'static str {
        self.names[i]
    }

    pub(crate) fn lookup(&self, name: &str) -> Option<Key> {
        match name {
            ALL_ALPHA => Some(Key::AllAlpha),
            ALL_BETA => Some(Key::AllBeta),
            _ => self.names.iter().position(|n| *n == name).map(Key::Gate),
        }
    }

    /// The error for an unknown `name`, with every hint this registry can give.
    pub fn unrecognized(&self, name: &str) -> GateError {
        let renamed_to = self.renamed.get(name).cloned();
        let current = renamed_to.as_deref().unwrap_or(name);
        let owners = if self.names.contains(&current) {
            Vec::new()
        } else {
            self.owners.get(current).cloned().unwrap_or_default()
        };
        let did_you_mean = if renamed_to.is_some() { None } else { self.closest(name) };
        let mut accepted = self.names.clone();
        accepted.sort_unstable();
        GateError::Unrecognized(Box::new(Unrecognized {
            name: name.to_owned(),
            component: self.component.clone(),
            renamed_to,
            owners,
            did_you_mean,
            accepted,
        }))
    }

    /// An accepted name equal to `name` ignoring case, or at most two edits away.
    fn closest(&self, name: &str) -> Option<String> {
        if name.is_empty() {
            return None;
        }
        let lower = name.to_ascii_lowercase();
        let candidates = self.names.iter().copied().chain([ALL_ALPHA, ALL_BETA]);
        let mut best: Option<(usize, &str)> = None;
        for cand in candidates {
            let d = edit_distance(&lower, &cand.to_ascii_lowercase());
            if d <= 2 && best.is_none_or(|(bd, _)| d < bd) {
                best = Some((d, cand));
            }
        }
        best.map(|(_, c)| c.to_owned())
    }
}

/// Levenshtein distance over bytes (names are ASCII).
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for (i, ca) in a.iter().enumerate() {
        cur[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let subst = prev[j] + usize::from(ca != cb);
            cur[j + 1] = subst.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    crate::feature_gates! {
        /// Test gates.
        enum T {
            /// a
            Alpha1 => alpha(false),
            /// b
            Beta1 => beta(true),
        }
    }

    #[test]
    fn edit_distance_basics() {
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("same", "same"), 0);
    }

    #[test]
    fn builder_rejects_bad_declarations() {
        let dup = Registry::builder("x").gates([T::Alpha1, T::Alpha1]).build();
        assert!(matches!(dup, Err(RegistryError::Duplicate { .. })));
        let rule = Registry::builder("x").gate(T::Alpha1).requires(T::Alpha1, T::Beta1).build();
        assert!(matches!(rule, Err(RegistryError::UnknownRuleGate { ref name, .. }) if name == "Beta1"));
    }

    #[test]
    fn unknown_name_hints() -> Result<(), RegistryError> {
        let r = Registry::builder("comp")
            .gates(T::ALL.iter().copied())
            .renamed("OldAlpha", "Alpha1")
            .renamed("OldOther", "Elsewhere")
            .owned_by("Elsewhere", "other-comp")
            .owned_by("Alpha1", "other-comp")
            .build()?;
        let text = r.unrecognized("OldAlpha").to_string();
        assert_eq!(
            text,
            "unrecognized feature gate: OldAlpha\n  OldAlpha was renamed to Alpha1; old names are no longer accepted\n  use Alpha1=<true|false> instead\n  comp accepts: Alpha1, Beta1"
        );
        let text = r.unrecognized("OldOther").to_string();
        assert!(text.contains("Elsewhere is a gate of other-comp, not of comp"), "{text}");
        let text = r.unrecognized("Elsewhere").to_string();
        assert!(text.starts_with("unrecognized feature gate: Elsewhere\n"), "{text}");
        assert!(text.contains("Elsewhere is a gate of other-comp, not of comp"), "{text}");
        let text = r.unrecognized("beta1").to_string();
        assert!(text.contains("did you mean Beta1?"), "{text}");
        let text = r.unrecognized("Completely").to_string();
        assert!(!text.contains("did you mean"), "{text}");
        Ok(())
    }
}
