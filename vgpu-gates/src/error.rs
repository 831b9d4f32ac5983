//! Errors of parsing, setting and validating feature gates.

use std::fmt;

/// One problem with one entry of a `--feature-gates` value or map.
///
/// The `Display` text of each variant matches Kubernetes component-base, so scripts that grep
/// for it keep working; [`GateError::Unrecognized`] adds help lines after the first line.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GateError {
    /// A token without `=`.
    #[error("missing bool value for {name}")]
    MissingValue {
        /// The token, trimmed.
        name: String,
    },
    /// A value that Go's `strconv.ParseBool` rejects.
    #[error("invalid value of {name}={value}, err: strconv.ParseBool: parsing {value:?}: invalid syntax")]
    InvalidValue {
        /// The gate name as written.
        name: String,
        /// The rejected value, trimmed.
        value: String,
    },
    /// A name this component does not know.
    #[error("{0}")]
    Unrecognized(Box<Unrecognized>),
    /// A locked gate set to a value other than its default.
    #[error("cannot set feature gate {name} to {value}, feature is locked to {locked_to}")]
    Locked {
        /// The gate name.
        name: String,
        /// The requested value.
        value: bool,
        /// The only value the gate accepts.
        locked_to: bool,
    },
}

/// An unknown gate name, with what we know to help the user fix it.
///
/// The first line of its `Display` is exactly `unrecognized feature gate: <name>`; the
/// following lines, each indented by two spaces, give the help.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unrecognized {
    /// The name as written.
    pub name: String,
    /// The component whose registry rejected it.
    pub component: String,
    /// The gate's current name when `name` is an old, renamed one.
    pub renamed_to: Option<String>,
    /// The components that own the gate (the renamed gate's current name, when renamed),
    /// if not this one.
    pub owners: Vec<String>,
    /// A close, accepted name (case or a typo away).
    pub did_you_mean: Option<String>,
    /// Every gate this component accepts, sorted.
    pub accepted: Vec<&'static str>,
}

impl fmt::Display for Unrecognized {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unrecognized feature gate: {}", self.name)?;
        if self.name.is_empty() {
            write!(f, "\n  the gate name before `=` is empty")?;
        }
        let current = self.renamed_to.as_deref().unwrap_or(&self.name);
        if let Some(new) = &self.renamed_to {
            write!(f, "\n  {} was renamed to {new}; old names are no longer accepted", self.name)?;
        }
        if !self.owners.is_empty() {
            write!(f, "\n  {current} is a gate of {}, not of {}", self.owners.join(", "), self.component)?;
        } else if self.renamed_to.is_some() {
            write!(f, "\n  use {current}=<true|false> instead")?;
        }
        if let Some(close) = &self.did_you_mean {
            write!(f, "\n  did you mean {close}?")?;
        }
        if self.accepted.is_empty() {
            write!(f, "\n  {} accepts no feature gates", self.component)
        } else {
            write!(f, "\n  {} accepts: {}", self.component, self.accepted.join(", "))
        }
    }
}

/// A rejected `Set`: every problem found, in input order. Nothing was changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetError {
    errors: Vec<GateError>,
}

impl SetError {
    /// Wraps a non-empty list of problems.
    pub(crate) fn new(errors: Vec<GateError>) -> Self {
        Self { errors }
    }

    /// Every problem, in input order (never empty).
    pub fn errors(&self) -> &[GateError] {
        &self.errors
    }
}

impl From<GateError> for SetError {
    fn from(e: GateError) -> Self {
        Self { errors: vec![e] }
    }
}

impl fmt::Display for SetError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.errors.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for SetError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.errors.first().map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// One way to resolve a [`Violation`]: any one of `options` (a gate name and the value to set).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fix {
    /// Alternatives; applying any one resolves the violation. When some of the gates involved
    /// were not set explicitly, only those are offered (changing a default is the likely fix);
    /// empty when every gate involved is locked.
    pub options: Vec<(&'static str, bool)>,
}

impl fmt::Display for Fix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.options.is_empty() {
            return f.write_str("no fix: the gates involved are locked");
        }
        f.write_str("set ")?;
        for (i, (name, value)) in self.options.iter().enumerate() {
            if i > 0 {
                f.write_str(" or ")?;
            }
            write!(f, "{name}={value}")?;
        }
        Ok(())
    }
}

/// A broken dependency or exclusion rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Violation {
    /// Both gates are on, but at most one may be.
    MutuallyExclusive {
        /// The first gate of the rule.
        gate: &'static str,
        /// The second gate of the rule.
        other: &'static str,
        /// How to resolve it.
        fix: Fix,
    },
    /// `gate` is on but the gate it needs is off.
    Requires {
        /// The dependent gate.
        gate: &'static str,
        /// The gate it needs.
        requires: &'static str,
        /// How to resolve it.
        fix: Fix,
    },
}

impl Violation {
    /// How to resolve this violation.
    pub fn fix(&self) -> &Fix {
        match self {
            Violation::MutuallyExclusive { fix, .. } | Violation::Requires { fix, .. } => fix,
        }
    }

    /// The rule's message without the fix, exactly as upstream words it.
    pub fn message(&self) -> String {
        match self {
            Violation::MutuallyExclusive { gate, other, .. } => {
                format!("feature gate {gate} is currently mutually exclusive with {other}")
            }
            Violation::Requires { gate, requires, .. } => {
                format!("feature gate {gate} requires {requires} to also be enabled")
            }
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}; fix: {}", self.message(), self.fix())
    }
}

/// A gate combination that breaks one or more rules of the registry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValidationError {
    pub(crate) component: String,
    pub(crate) violations: Vec<Violation>,
    pub(crate) suggestion: Option<String>,
}

impl ValidationError {
    /// Every violated rule, in the registry's rule order (never empty).
    pub fn violations(&self) -> &[Violation] {
        &self.violations
    }

    /// A complete `--feature-gates` value close to the given one that satisfies every rule,
    /// when one exists (fewest changes to gates the user set explicitly, then fewest changes).
    pub fn suggestion(&self) -> Option<&str> {
        self.suggestion.as_deref()
    }
}

impl fmt::Display for ValidationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "feature gate validation failed for {}:", self.component)?;
        for v in &self.violations {
            write!(f, "\n  {v}")?;
        }
        if let Some(s) = &self.suggestion {
            write!(f, "\n  a combination that satisfies every rule: {s}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ValidationError {}

/// A Helm-values-style gate map that could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ValuesError {
    /// The text is neither YAML nor JSON.
    #[error("not valid YAML or JSON: {0}")]
    Syntax(String),
    /// The document is not a mapping, or has no gate map at the component's chart path.
    #[error("expected a map {{GateName: bool}}{}", paths_hint(.paths))]
    NotAMap {
        /// The chart values paths that were looked at.
        paths: Vec<String>,
    },
    /// A gate's value is not a boolean.
    #[error("invalid value of {gate}={value}: expected a boolean (true or false)")]
    NotABool {
        /// The gate name.
        gate: String,
        /// The value as found, rendered as JSON.
        value: String,
    },
}

fn paths_hint(paths: &[String]) -> String {
    if paths.is_empty() {
        String::new()
    } else {
        format!(" or a chart values file with {}", paths.join(" or "))
    }
}

/// A registry declaration that is inconsistent.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    /// Two gates share a name.
    #[error("registry {component}: gate {name} is declared twice")]
    Duplicate {
        /// The component.
        component: String,
        /// The repeated name.
        name: String,
    },
    /// A name that cannot be written in `--feature-gates` or clashes with a special key.
    #[error(
        "registry {component}: invalid gate name {name:?} (expected a non-empty name without `=`, `,` or whitespace, other than AllAlpha/AllBeta)"
    )]
    InvalidName {
        /// The component.
        component: String,
        /// The bad name.
        name: String,
    },
    /// A rule names a gate the registry does not hold.
    #[error("registry {component}: rule refers to {name}, which is not a gate of this registry")]
    UnknownRuleGate {
        /// The component.
        component: String,
        /// The unknown gate.
        name: String,
    },
}

/// Any error of configuring a component's gates.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The gate string or map was rejected.
    #[error(transparent)]
    Set(#[from] SetError),
    /// The resulting combination breaks a rule.
    #[error(transparent)]
    Validation(#[from] ValidationError),
    /// A values map could not be read.
    #[error(transparent)]
    Values(#[from] ValuesError),
}

impl From<GateError> for Error {
    fn from(e: GateError) -> Self {
        Error::Set(e.into())
    }
}
