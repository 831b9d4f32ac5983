//! The `--pod` shape of `vgpuctl simulate --from-cluster`: comma-separated `key=value` pairs.
//!
//! | key | value | pod field |
//! |---|---|---|
//! | `gpus` | 1..=64 (required) | `<domain>/vgpu-number` limit |
//! | `cores` | 0..=100, percent of a GPU's cores (default 0: no limit) | `<domain>/vgpu-cores` limit |
//! | `memory` | `<n>Mi`, `<n>Gi`, `<n>Ti` or a bare MiB count (default 0: no limit) | `<domain>/vgpu-memory` limit, MiB |
//! | `topology` | `none`, `numa`, `numa-strict`, `link`, `link-strict` | `device-topology-mode` annotation |
//! | `node-policy` | `binpack`, `spread`, `none` | node scheduler policy annotation |
//! | `device-policy` | `binpack`, `spread`, `none` | device scheduler policy annotation |
//!
//! Keys are case-sensitive, each at most once; spaces around keys and values are ignored.

use vgpu_core::domain::ResourceDomain;
use vgpu_scheduler::Pod;
use vgpu_scheduler::fixture::vgpu_pod;

/// Largest `gpus`.
pub const MAX_GPUS: u32 = 64;
const MODES: [&str; 5] = ["none", "numa", "numa-strict", "link", "link-strict"];
const POLICIES: [&str; 3] = ["binpack", "spread", "none"];

/// A parsed `--pod` shape.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodShape {
    /// vGPUs.
    pub gpus: u32,
    /// Cores per vGPU, percent (0: no limit).
    pub cores: u32,
    /// Memory per vGPU, MiB (0: no limit).
    pub memory_mib: u64,
    /// Topology mode, if set.
    pub topology: Option<String>,
    /// Node policy, if set.
    pub node_policy: Option<String>,
    /// Device policy, if set.
    pub device_policy: Option<String>,
}

/// Parses a memory size: `<n>Mi`, `<n>Gi`, `<n>Ti` or a bare MiB count.
fn parse_memory(v: &str) -> Result<u64, String> {
    let (digits, mult) = if let Some(n) = v.strip_suffix("Ti") {
        (n, 1024 * 1024)
    } else if let Some(n) = v.strip_suffix("Gi") {
        (n, 1024)
    } else if let Some(n) = v.strip_suffix("Mi") {
        (n, 1)
    } else {
        (v, 1)
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("memory: expected <n>Mi, <n>Gi, <n>Ti or a MiB count, got {v:?}"));
    }
    digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| format!("memory: {v:?} is too large"))
}

fn parse_u32(key: &str, v: &str, max: u32) -> Result<u32, String> {
    match v.parse::<u32>() {
        Ok(n) if n <= max && v.bytes().all(|b| b.is_ascii_digit()) => Ok(n),
        _ => Err(format!("{key}: expected an integer 0..={max}, got {v:?}")),
    }
}

fn one_of(key: &str, v: &str, allowed: &[&str]) -> Result<String, String> {
    if allowed.contains(&v) {
        Ok(v.to_owned())
    } else {
        Err(format!("{key}: expected one of {}, got {v:?}", allowed.join(", ")))
    }
}

impl PodShape {
    /// Parses `gpus=2,cores=50,memory=8Gi,topology=link`; the error names the pair and what was expected.
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut shape = PodShape::default();
        let mut seen: Vec<&str> = Vec::new();
        let mut gpus = None;
        for pair in s.split(',') {
            let pair = pair.trim();
            if pair.is_empty() {
                return Err(format!("empty pair in {s:?} (expected key=value[,key=value…])"));
            }
            let Some((k, v)) = pair.split_once('=') else {
                return Err(format!("{pair:?}: expected key=value"));
            };
            let (k, v) = (k.trim(), v.trim());
            if seen.contains(&k) {
                return Err(format!("{k}: given twice"));
            }
            match k {
                "gpus" => {
                    let n = parse_u32(k, v, MAX_GPUS)?;
                    if n == 0 {
                        return Err(format!("gpus: expected 1..={MAX_GPUS}, got {v:?}"));
                    }
                    gpus = Some(n);
                }
                "cores" => shape.cores = parse_u32(k, v, 100)?,
                "memory" => shape.memory_mib = parse_memory(v)?,
                "topology" => shape.topology = Some(one_of(k, v, &MODES)?),
                "node-policy" => shape.node_policy = Some(one_of(k, v, &POLICIES)?),
                "device-policy" => shape.device_policy = Some(one_of(k, v, &POLICIES)?),
                other => {
                    return Err(format!(
                        "unknown key {other:?} (expected gpus, cores, memory, topology, node-policy, device-policy)"
                    ));
                }
            }
            seen.push(k);
        }
        shape.gpus = gpus.ok_or_else(|| format!("{s:?}: gpus=<n> is required"))?;
        Ok(shape)
    }

    /// The canonical text of the shape (parses back to the same shape).
    pub fn to_text(&self) -> String {
        let mut s = format!("gpus={}", self.gpus);
        if self.cores > 0 {
            s.push_str(&format!(",cores={}", self.cores));
        }
        if self.memory_mib > 0 {
            s.push_str(&format!(",memory={}Mi", self.memory_mib));
        }
        for (k, v) in [
            ("topology", &self.topology),
            ("node-policy", &self.node_policy),
            ("device-policy", &self.device_policy),
        ] {
            if let Some(v) = v {
                s.push_str(&format!(",{k}={v}"));
            }
        }
        s
    }

    /// A pending pod of this shape, `uid` and name `name` in `namespace`.
    pub fn pod(&self, namespace: &str, name: &str, uid: &str, d: &ResourceDomain) -> Pod {
        let mut ann = Vec::new();
        if let Some(t) = &self.topology {
            ann.push((d.device_topology_mode(), t.clone()));
        }
        if let Some(p) = &self.node_policy {
            ann.push((d.node_scheduler_policy(), p.clone()));
        }
        if let Some(p) = &self.device_policy {
            ann.push((d.device_scheduler_policy(), p.clone()));
        }
        let mut pod = vgpu_pod(uid, self.gpus, self.cores, self.memory_mib, &ann, d);
        pod.namespace = namespace.to_owned();
        pod.name = name.to_owned();
        pod
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn parses_the_documented_example() {
        let s = PodShape::parse("gpus=2,cores=50,memory=8Gi,topology=link").unwrap();
        assert_eq!(
            s,
            PodShape {
                gpus: 2,
                cores: 50,
                memory_mib: 8192,
                topology: Some("link".into()),
                ..PodShape::default()
            }
        );
        assert_eq!(PodShape::parse(" gpus = 1 , memory = 512 ").unwrap().memory_mib, 512);
        assert_eq!(PodShape::parse("gpus=1,memory=1Ti").unwrap().memory_mib, 1024 * 1024);
    }

    #[test]
    fn bad_shapes_name_the_input() {
        for (input, needle) in [
            ("", "empty pair"),
            ("cores=50", "gpus=<n> is required"),
            ("gpus=0", "gpus: expected 1..=64"),
            ("gpus=65", "gpus: expected an integer 0..=64"),
            ("gpus=two", "gpus: expected an integer"),
            ("gpus=+2", "gpus: expected an integer"),
            ("gpus=1,cores=101", "cores: expected an integer 0..=100"),
            ("gpus=1,memory=8G", "memory: expected <n>Mi"),
            ("gpus=1,memory=Gi", "memory: expected <n>Mi"),
            ("gpus=1,memory=99999999999999999Ti", "memory: \"99999999999999999Ti\" is too large"),
            ("gpus=1,topology=ring", "topology: expected one of none, numa"),
            ("gpus=1,node-policy=pack", "node-policy: expected one of binpack"),
            ("gpus=1,gpus=2", "gpus: given twice"),
            ("gpus=1,,cores=2", "empty pair"),
            ("gpus", "\"gpus\": expected key=value"),
            ("gpus=1,colour=red", "unknown key \"colour\""),
        ] {
            let e = PodShape::parse(input).unwrap_err();
            assert!(e.contains(needle), "{input:?}: {e}");
        }
    }

    fn shape() -> impl Strategy<Value = PodShape> {
        let opt = |v: &'static [&'static str]| {
            proptest::option::of(proptest::sample::select(v).prop_map(String::from))
        };
        (1..=MAX_GPUS, 0..=100u32, 0..=1u64 << 30, opt(&MODES), opt(&POLICIES), opt(&POLICIES)).prop_map(
            |(gpus, cores, memory_mib, topology, node_policy, device_policy)| PodShape {
                gpus,
                cores,
                memory_mib,
                topology,
                node_policy,
                device_policy,
            },
        )
    }

    proptest! {
        #[test]
        fn canonical_text_round_trips(s in shape()) {
            prop_assert_eq!(PodShape::parse(&s.to_text()).unwrap(), s);
        }

        #[test]
        fn never_panics_and_errors_are_explained(input in ".{0,60}") {
            if let Err(e) = PodShape::parse(&input) {
                prop_assert!(!e.is_empty());
            }
        }

        #[test]
        fn pairs_parse_in_any_order(s in shape(), seed in any::<u64>()) {
            let text = s.to_text();
            let mut pairs: Vec<&str> = text.split(',').collect();
            let n = pairs.len();
            pairs.rotate_left((seed as usize) % n);
            prop_assert_eq!(PodShape::parse(&pairs.join(",")).unwrap(), s);
        }
    }
}
