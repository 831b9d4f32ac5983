//! The plain-data pod description the request model is built from (no Kubernetes types).

use std::collections::BTreeMap;

use crate::model::ContainerKind;

/// One container of a pod: kind, name and its `resources.limits` as Kubernetes quantity strings.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodContainer {
    /// Container name.
    pub name: String,
    /// Init or app container.
    pub kind: ContainerKind,
    /// Init container with `restartPolicy: Always` (a sidecar); ignored for app containers.
    pub restartable: bool,
    /// Resource name (e.g. `nvidia.com/vgpu-number`) → quantity text (e.g. `2`, `4Ki`).
    pub limits: BTreeMap<String, String>,
}

impl PodContainer {
    /// An app container (`spec.containers`) without limits.
    pub fn app(name: impl Into<String>) -> Self {
        Self { name: name.into(), kind: ContainerKind::App, ..Self::default() }
    }

    /// A sequential (non-restartable) init container.
    pub fn init(name: impl Into<String>) -> Self {
        Self { name: name.into(), kind: ContainerKind::Init, ..Self::default() }
    }

    /// A restartable init container (sidecar).
    pub fn sidecar(name: impl Into<String>) -> Self {
        Self { name: name.into(), kind: ContainerKind::Init, restartable: true, ..Self::default() }
    }

    /// Adds a limit (builder style).
    pub fn limit(mut self, resource: impl Into<String>, quantity: impl ToString) -> Self {
        self.limits.insert(resource.into(), quantity.to_string());
        self
    }
}

/// The parts of a pod the allocator reads: containers (any order of kinds; declaration order kept within a
/// kind) and annotations.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodSpec {
    /// Containers, init and app, each in declaration order.
    pub containers: Vec<PodContainer>,
    /// Pod annotations (full keys, e.g. `nvidia.com/device-topology-mode`).
    pub annotations: BTreeMap<String, String>,
}

impl PodSpec {
    /// An empty pod.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a container (builder style).
    pub fn container(mut self, container: PodContainer) -> Self {
        self.containers.push(container);
        self
    }

    /// Sets an annotation (builder style).
    pub fn annotation(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.annotations.insert(key.into(), value.into());
        self
    }
}

/// Parses an integer Kubernetes quantity: digits with an optional decimal (`k M G T P E`) or binary
/// (`Ki Mi Gi Ti Pi Ei`) suffix, or a milli (`m`) value that is a whole number. `None` for anything else
/// (negative, fractional, overflowing).
///
/// ```
/// use vgpu_core::alloc::parse_quantity;
/// assert_eq!(parse_quantity("4096"), Some(4096));
/// assert_eq!(parse_quantity("2Ki"), Some(2048));
/// assert_eq!(parse_quantity("3000m"), Some(3));
/// assert_eq!(parse_quantity("1.5"), None);
/// ```
pub fn parse_quantity(text: &str) -> Option<u64> {
    let t = text.trim();
    let t = t.strip_prefix('+').unwrap_or(t);
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, suffix) = t.split_at(split);
    if digits.is_empty() {
        return None;
    }
    let value: u64 = digits.parse().ok()?;
    let (mul, div): (u64, u64) = match suffix {
        "" => (1, 1),
        "m" => (1, 1000),
        "k" => (1000, 1),
        "M" => (1_000_000, 1),
        "G" => (1_000_000_000, 1),
        "T" => (1_000_000_000_000, 1),
        "P" => (1_000_000_000_000_000, 1),
        "E" => (1_000_000_000_000_000_000, 1),
        "Ki" => (1 << 10, 1),
        "Mi" => (1 << 20, 1),
        "Gi" => (1 << 30, 1),
        "Ti" => (1 << 40, 1),
        "Pi" => (1 << 50, 1),
        "Ei" => (1 << 60, 1),
        _ => return None,
    };
    if !value.is_multiple_of(div) {
        return None;
    }
    (value / div).checked_mul(mul)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities() {
        assert_eq!(parse_quantity("0"), Some(0));
        assert_eq!(parse_quantity(" 12 "), Some(12));
        assert_eq!(parse_quantity("1k"), Some(1000));
        assert_eq!(parse_quantity("1Gi"), Some(1 << 30));
        assert_eq!(parse_quantity("1500m"), None);
        assert_eq!(parse_quantity("-1"), None);
        assert_eq!(parse_quantity("1x"), None);
        assert_eq!(parse_quantity(""), None);
        assert_eq!(parse_quantity("99999999999999999999"), None);
        assert_eq!(parse_quantity("20E"), None);
    }

    #[test]
    fn builders() {
        let pod = PodSpec::new()
            .container(PodContainer::sidecar("s").limit("a", 1))
            .container(PodContainer::init("i"))
            .container(PodContainer::app("m"))
            .annotation("k", "v");
        assert!(pod.containers[0].restartable && pod.containers[0].kind == ContainerKind::Init);
        assert!(!pod.containers[1].restartable);
        assert_eq!(pod.containers[0].limits["a"], "1");
        assert_eq!(pod.annotations["k"], "v");
    }
}
