//! Policy enums read from pod/node annotations, with the contract's string forms.

use std::{fmt, str::FromStr};

/// A policy annotation value that is not one of the accepted forms.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {kind} {value:?}: expected one of {expected}")]
pub struct ParsePolicyError {
    /// Which policy was being parsed (e.g. `scheduling policy`).
    pub kind: &'static str,
    /// The rejected input.
    pub value: String,
    /// The accepted forms, for the message.
    pub expected: &'static str,
}

macro_rules! string_enum {
    (
        $(#[$meta:meta])*
        $name:ident, $kind:literal, $expected:literal {
            $( $(#[$vmeta:meta])* $variant:ident => $text:literal ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $( $(#[$vmeta])* $variant, )+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The contract's string form.
            pub fn as_str(self) -> &'static str {
                match self {
                    $( $name::$variant => $text, )+
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl FromStr for $name {
            type Err = ParsePolicyError;

            /// Case-insensitive, surrounding whitespace ignored.
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                let t = s.trim();
                $( if t.eq_ignore_ascii_case($text) { return Ok($name::$variant); } )+
                Err(ParsePolicyError { kind: $kind, value: s.to_owned(), expected: $expected })
            }
        }
    };
}

string_enum! {
    /// `vgpu-compute-policy` (pod or node annotation; pod wins): how the control library limits SMs.
    #[derive(Default)]
    ComputePolicy, "compute policy", "fixed, balance, none" {
        /// Hard limit at the requested cores (default).
        #[default]
        Fixed => "fixed",
        /// Let idle capacity be borrowed.
        Balance => "balance",
        /// No core limiting.
        None => "none",
    }
}

string_enum! {
    /// `node-scheduler-policy` / `device-scheduler-policy`: how nodes or GPUs are ordered.
    #[derive(Default)]
    SchedulingPolicy, "scheduling policy", "binpack, spread, none" {
        /// Prefer the fullest node/GPU.
        Binpack => "binpack",
        /// Prefer the emptiest node/GPU.
        Spread => "spread",
        /// Keep the original order (default).
        #[default]
        None => "none",
    }
}

string_enum! {
    /// `device-topology-mode`: how multi-GPU containers are placed.
    #[derive(Default)]
    TopologyMode, "topology mode", "none, numa, numa-strict, link, link-strict" {
        /// No topology preference (default).
        #[default]
        None => "none",
        /// Prefer GPUs of one NUMA node, fall back to crossing NUMA nodes.
        Numa => "numa",
        /// Require GPUs of one NUMA node.
        NumaStrict => "numa-strict",
        /// Prefer the best-linked GPU set (NVLink first), fall back to weaker links.
        Link => "link",
        /// Require an NVLink-connected GPU set.
        LinkStrict => "link-strict",
    }
}

impl ComputePolicy {
    /// The control library's `CUDA_CORE_LIMIT` and `CUDA_CORE_SOFT_LIMIT` of a device share of `cores`
    /// percent: fixed → both = cores, balance → cores and 100, when 0 < cores < 100; otherwise (none, a
    /// whole GPU) both empty.
    pub fn core_limits(self, cores: u64) -> (String, String) {
        if cores == 0 || cores >= 100 {
            return (String::new(), String::new());
        }
        match self {
            ComputePolicy::Fixed => (cores.to_string(), cores.to_string()),
            ComputePolicy::Balance => (cores.to_string(), "100".to_owned()),
            ComputePolicy::None => (String::new(), String::new()),
        }
    }
}

impl TopologyMode {
    /// The mode without its strictness (`numa-strict` → `numa`).
    pub fn base(self) -> Self {
        match self {
            TopologyMode::NumaStrict => TopologyMode::Numa,
            TopologyMode::LinkStrict => TopologyMode::Link,
            other => other,
        }
    }

    /// `true` for the `-strict` modes.
    pub fn is_strict(self) -> bool {
        matches!(self, TopologyMode::NumaStrict | TopologyMode::LinkStrict)
    }
}

/// `memory-scheduler-policy`: which kind of node memory the pod accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemoryPolicy {
    /// Only nodes with virtual (oversubscribed) memory, `memoryScaling > 1`. Parsed from `virt*`.
    Virtual,
    /// Only nodes with physical memory, `memoryScaling <= 1`. Parsed from `phy*`.
    Physical,
}

impl MemoryPolicy {
    /// The canonical string form.
    pub fn as_str(self) -> &'static str {
        match self {
            MemoryPolicy::Virtual => "virtual",
            MemoryPolicy::Physical => "physical",
        }
    }

    /// Whether a node with this memory scaling satisfies the policy.
    pub fn admits(self, memory_scaling: f64) -> bool {
        match self {
            MemoryPolicy::Virtual => memory_scaling > 1.0,
            MemoryPolicy::Physical => memory_scaling <= 1.0,
        }
    }
}

impl fmt::Display for MemoryPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for MemoryPolicy {
    type Err = ParsePolicyError;

    /// Case-insensitive prefix match: `virt…` or `phy…`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim().to_ascii_lowercase();
        if t.starts_with("virt") {
            Ok(MemoryPolicy::Virtual)
        } else if t.starts_with("phy") {
            Ok(MemoryPolicy::Physical)
        } else {
            Err(ParsePolicyError {
                kind: "memory policy",
                value: s.to_owned(),
                expected: "virtual (virt*), physical (phy*)",
            })
        }
    }
}

string_enum! {
    /// The pod label `assigned-phase`.
    AssignedPhase, "assigned phase", "filtering, allocating, succeed, failed" {
        /// The scheduler pre-allocated devices (Filter).
        Filtering => "filtering",
        /// The scheduler is binding the pod.
        Allocating => "allocating",
        /// The device plugin allocated the devices.
        Succeed => "succeed",
        /// Allocation failed.
        Failed => "failed",
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn core_limit_envs() {
        use super::ComputePolicy;
        assert_eq!(ComputePolicy::Fixed.core_limits(30), ("30".into(), "30".into()));
        assert_eq!(ComputePolicy::Balance.core_limits(30), ("30".into(), "100".into()));
        assert_eq!(ComputePolicy::None.core_limits(30), (String::new(), String::new()));
        assert_eq!(ComputePolicy::Fixed.core_limits(100), (String::new(), String::new()));
        assert_eq!(ComputePolicy::Balance.core_limits(0), (String::new(), String::new()));
    }

    use super::*;

    #[test]
    fn string_forms_round_trip() {
        for p in SchedulingPolicy::ALL {
            assert_eq!(p.to_string().parse::<SchedulingPolicy>().unwrap(), *p);
        }
        for p in TopologyMode::ALL {
            assert_eq!(p.to_string().parse::<TopologyMode>().unwrap(), *p);
        }
        for p in ComputePolicy::ALL {
            assert_eq!(p.to_string().parse::<ComputePolicy>().unwrap(), *p);
        }
        for p in AssignedPhase::ALL {
            assert_eq!(p.to_string().parse::<AssignedPhase>().unwrap(), *p);
        }
        assert_eq!("BinPack".parse::<SchedulingPolicy>().unwrap(), SchedulingPolicy::Binpack);
        assert_eq!(TopologyMode::LinkStrict.base(), TopologyMode::Link);
        assert!(TopologyMode::NumaStrict.is_strict());
        assert_eq!("Virtualized".parse::<MemoryPolicy>().unwrap(), MemoryPolicy::Virtual);
        assert_eq!("phys".parse::<MemoryPolicy>().unwrap(), MemoryPolicy::Physical);
        assert!(MemoryPolicy::Virtual.admits(2.0) && !MemoryPolicy::Virtual.admits(1.0));
    }

    #[test]
    fn errors_name_the_value() {
        let err = "packbin".parse::<SchedulingPolicy>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid scheduling policy \"packbin\": expected one of binpack, spread, none"
        );
        assert!("x".parse::<MemoryPolicy>().is_err());
    }
}
