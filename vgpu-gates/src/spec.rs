//! What a gate is: its [`Stage`], its [`GateSpec`] and the [`FeatureGate`] trait that typed gate
//! identifiers implement.

use std::fmt;

/// Maturity of a feature gate, with the semantics of Kubernetes component-base.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Stage {
    /// Experimental; off by default as a rule, settable, switched by `AllAlpha`.
    Alpha,
    /// Well tested; usually on by default, settable, switched by `AllBeta`.
    Beta,
    /// Generally available: always locked to its default.
    Ga,
    /// Going away: still settable, but setting it yields a warning.
    Deprecated,
}

impl Stage {
    /// The stage as component-base spells it (`Alpha`, `Beta`, `GA`, `Deprecated`).
    pub const fn as_str(self) -> &'static str {
        match self {
            Stage::Alpha => "Alpha",
            Stage::Beta => "Beta",
            Stage::Ga => "GA",
            Stage::Deprecated => "Deprecated",
        }
    }
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Default value, stage and lock of one gate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GateSpec {
    /// Value of the gate when nothing sets it.
    pub default: bool,
    /// Maturity of the gate.
    pub stage: Stage,
    /// When true the gate can only be "set" to its default; any other value is an error.
    pub lock_to_default: bool,
}

impl GateSpec {
    /// An Alpha gate with the given default.
    pub const fn alpha(default: bool) -> Self {
        Self { default, stage: Stage::Alpha, lock_to_default: false }
    }

    /// A Beta gate with the given default.
    pub const fn beta(default: bool) -> Self {
        Self { default, stage: Stage::Beta, lock_to_default: false }
    }

    /// A GA gate: locked to its default.
    pub const fn ga(default: bool) -> Self {
        Self { default, stage: Stage::Ga, lock_to_default: true }
    }

    /// A Deprecated gate with the given default (settable, with a warning).
    pub const fn deprecated(default: bool) -> Self {
        Self { default, stage: Stage::Deprecated, lock_to_default: false }
    }

    /// The same spec, locked to its default.
    pub const fn locked(self) -> Self {
        Self { lock_to_default: true, ..self }
    }
}

/// A typed feature-gate identifier.
///
/// Implement it for a small `Copy` enum (most easily with [`feature_gates!`](crate::feature_gates))
/// and collect the gates of one component in a [`Registry`](crate::Registry).
pub trait FeatureGate: Copy + Eq + fmt::Debug + Send + Sync + 'static {
    /// The gate's name as users write it in `--feature-gates` (`CamelCase`, no `=`, `,` or spaces).
    fn name(self) -> &'static str;
    /// Default, stage and lock of the gate.
    fn spec(self) -> GateSpec;
}

/// Declares a gate enum and implements [`FeatureGate`] for it.
///
/// Each variant names its stage constructor of [`GateSpec`] (`alpha`, `beta`, `ga`, `deprecated`)
/// and its default. The enum also gets an `ALL` constant (declaration order) and `Display`.
///
/// ```
/// vgpu_gates::feature_gates! {
///     /// Gates of my operator.
///     pub enum MyGate {
///         /// Turns on the new reconciler.
///         NewReconciler => alpha(false),
///         /// Emits events for every decision.
///         VerboseEvents => beta(true),
///     }
/// }
/// use vgpu_gates::FeatureGate;
/// assert_eq!(MyGate::ALL.len(), 2);
/// assert_eq!(MyGate::VerboseEvents.name(), "VerboseEvents");
/// assert!(MyGate::VerboseEvents.spec().default);
/// ```
#[macro_export]
macro_rules! feature_gates {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident => $stage:ident ( $default:expr ) ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        $vis enum $name {
            $( $(#[$vmeta])* $variant ),+
        }

        impl $name {
            /// Every gate of this type, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];
        }

        impl $crate::FeatureGate for $name {
            fn name(self) -> &'static str {
                match self { $($name::$variant => stringify!($variant)),+ }
            }
            fn spec(self) -> $crate::GateSpec {
                match self { $($name::$variant => $crate::GateSpec::$stage($default)),+ }
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str($crate::FeatureGate::name(*self))
            }
        }
    };
}
