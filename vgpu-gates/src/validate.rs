//! Rule validation: every Requires and Mutually-exclusive rule, defaults included.

use crate::{
    error::{Fix, ValidationError, Violation},
    registry::Rule,
    set::FeatureGates,
    spec::FeatureGate,
};

/// Above this many distinct unlocked gates in the rules, no whole-set suggestion is searched.
const MAX_SUGGESTION_GATES: usize = 16;

impl<G: FeatureGate> FeatureGates<'_, G> {
    /// Checks every rule of the registry against the effective values (defaults and
    /// `AllAlpha`/`AllBeta` included) and reports all violations at once.
    ///
    /// The result depends only on the effective values, not on the order settings were given.
    pub fn validate(&self) -> Result<(), ValidationError> {
        let violations = self.violations();
        if violations.is_empty() {
            return Ok(());
        }
        Err(ValidationError {
            component: self.registry().component().to_owned(),
            violations,
            suggestion: self.suggestion(),
        })
    }

    /// Every broken rule, in rule order, each with its fix.
    pub fn violations(&self) -> Vec<Violation> {
        let reg = self.registry();
        let mut out = Vec::new();
        for rule in reg.rules() {
            match *rule {
                Rule::Requires { gate, requires } => {
                    if self.enabled(gate) && !self.enabled(requires) {
                        out.push(Violation::Requires {
                            gate: gate.name(),
                            requires: requires.name(),
                            fix: self.fix(&[(requires, true), (gate, false)]),
                        });
                    }
                }
                Rule::MutuallyExclusive(a, b) => {
                    if self.enabled(a) && self.enabled(b) {
                        out.push(Violation::MutuallyExclusive {
                            gate: a.name(),
                            other: b.name(),
                            fix: self.fix(&[(a, false), (b, false)]),
                        });
                    }
                }
            }
        }
        out
    }

    fn fix(&self, candidates: &[(G, bool)]) -> Fix {
        let settable: Vec<(G, bool)> =
            candidates.iter().copied().filter(|(g, _)| !g.spec().lock_to_default).collect();
        let implicit: Vec<(G, bool)> =
            settable.iter().copied().filter(|(g, _)| !self.is_explicit(*g)).collect();
        let chosen = if implicit.is_empty() { settable } else { implicit };
        Fix { options: chosen.into_iter().map(|(g, v)| (g.name(), v)).collect() }
    }

    /// The closest complete setting that satisfies every rule: fewest changes to explicit
    /// settings, then fewest changes, then the first in gate order.
    fn suggestion(&self) -> Option<String> {
        let reg = self.registry();
        let mut idx: Vec<usize> = Vec::new();
        for rule in reg.rules() {
            let (a, b) = match *rule {
                Rule::Requires { gate, requires } => (gate, requires),
                Rule::MutuallyExclusive(a, b) => (a, b),
            };
            for g in [a, b] {
                if let Some(i) = reg.index_of(g)
                    && !reg.spec_at(i).lock_to_default
                    && !idx.contains(&i)
                {
                    idx.push(i);
                }
            }
        }
        idx.sort_unstable();
        if idx.len() > MAX_SUGGESTION_GATES {
            return None;
        }
        let current: Vec<bool> = (0..reg.gates().len()).map(|i| self.value_at(i)).collect();
        let mut best: Option<((u32, u32), u32)> = None;
        let mut values = current.clone();
        for mask in 1u32..(1u32 << idx.len()) {
            let mut explicit_flips = 0;
            for (bit, &i) in idx.iter().enumerate() {
                let flip = mask & (1 << bit) != 0;
                values[i] = current[i] ^ flip;
                if flip && self.explicit_at(i).is_some() {
                    explicit_flips += 1;
                }
            }
            let cost = (explicit_flips, mask.count_ones());
            if best.is_some_and(|(c, _)| c <= cost) {
                continue;
            }
            if satisfies(reg.rules(), |g| reg.index_of(g).is_some_and(|i| values[i])) {
                best = Some((cost, mask));
            }
        }
        let (_, mask) = best?;
        let mut fixed = self.clone();
        for (bit, &i) in idx.iter().enumerate() {
            if mask & (1 << bit) != 0 {
                fixed.set_explicit_at(i, !current[i]);
            }
        }
        Some(fixed.to_string())
    }
}

fn satisfies<G: Copy>(rules: &[Rule<G>], on: impl Fn(G) -> bool) -> bool {
    rules.iter().all(|rule| match *rule {
        Rule::Requires { gate, requires } => !on(gate) || on(requires),
        Rule::MutuallyExclusive(a, b) => !(on(a) && on(b)),
    })
}
