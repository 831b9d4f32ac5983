//! The CEL selector of the DeviceClass made of a GPUClass: one expression over the device attributes and
//! capacities our DRA drivers publish (contract §9, `vgpu-dra/src/slices.rs`). `A` below is
//! `device.attributes["<driver>"]`, `C` is `device.capacity["<driver>"]`.
//!
//! | GPUClass field | CEL term |
//! |---|---|
//! | `vendor` | `device.driver == "<driver of the vendor>"` |
//! | `sharing.mode: Shared` | `has(A.type) && A.type == "vgpu"` |
//! | `sharing.mode: Exclusive` | `has(A.type) && A.type in ["gpu", "vgpu"]` |
//! | `passthrough: true` (instead of the `sharing` term) | `has(A.type) && A.type == "vfio"` (the `gpu-vfio-<index>` devices of gate `PassthroughSupport`; they carry no `memory` capacity, so `minMemoryMiB` matches none of them) |
//! | `deviceType: a100-sxm4-40gb` | `has(A.productName) && (P == "a100-sxm4-40gb" \|\| P.endsWith("-a100-sxm4-40gb"))`, `P` = `A.productName.lowerAscii().replace(" ", "-").replace("_", "-")` (`NVIDIA A100-SXM4-40GB` → `nvidia-a100-sxm4-40gb`) |
//! | `requirements.minMemoryMiB: 40960` | `has(C.memory) && C.memory.compareTo(quantity("40960Mi")) >= 0` |
//! | `requirements.minComputeCapability: "8.0"` | `has(A.cudaComputeCapability) && A.cudaComputeCapability.compareTo(semver("8.0.0")) >= 0` |
//! | `requirements.capabilities: [x]` | `has(A.x)` (admission only admits CEL identifiers) |
//!
//! Terms are joined with `&&`. Every value from the GPUClass enters the expression as a CEL string literal
//! made by [`vgpu_api::cel::cel_string`] (the quoting the webhook shares), so a product name with quotes
//! or backslashes cannot end the literal; numbers are formatted from integers. `nodeSelector` has no CEL term:
//! a device selector cannot see node labels, so the pod mutation adds it to the pod (see [`crate::admission`]).

use vgpu_api::cel::cel_string;
use vgpu_api::{GPUClassSpec, SharingMode};

/// A compute capability `major.minor` (`8.0`, `9`), parsed.
pub fn parse_compute_capability(value: &str) -> Option<(u32, u32)> {
    let (major, minor) = value.split_once('.').unwrap_or((value, "0"));
    let num = |s: &str| {
        (!s.is_empty() && s.len() <= 4 && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse().ok())
            .flatten()
    };
    Some((num(major)?, num(minor)?))
}

/// Whether `name` may follow `has(A.` (a CEL identifier that is no reserved word).
pub fn is_cel_identifier(name: &str) -> bool {
    const RESERVED: &[&str] = &[
        "true",
        "false",
        "null",
        "in",
        "as",
        "break",
        "const",
        "continue",
        "else",
        "for",
        "function",
        "if",
        "import",
        "let",
        "loop",
        "package",
        "namespace",
        "return",
        "var",
        "void",
        "while",
    ];
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && name.len() <= 63
        && !RESERVED.contains(&name)
}

/// The selector expression of a GPUClass whose vendor publishes under `driver`.
pub fn class_selector(driver: &str, spec: &GPUClassSpec) -> String {
    let d = cel_string(driver);
    let a = format!("device.attributes[{d}]");
    let c = format!("device.capacity[{d}]");
    let mut terms = vec![format!("device.driver == {d}")];
    terms.push(match (spec.passthrough, spec.sharing.mode) {
        (Some(true), _) => format!("has({a}.type) && {a}.type == \"vfio\""),
        (_, SharingMode::Shared) => format!("has({a}.type) && {a}.type == \"vgpu\""),
        (_, SharingMode::Exclusive) => format!("has({a}.type) && {a}.type in [\"gpu\", \"vgpu\"]"),
    });
    if let Some(model) = spec.device_type.as_deref().filter(|m| !m.is_empty()) {
        let p = format!("{a}.productName.lowerAscii().replace(\" \", \"-\").replace(\"_\", \"-\")");
        terms.push(format!(
            "has({a}.productName) && ({p} == {} || {p}.endsWith({}))",
            cel_string(model),
            cel_string(&format!("-{model}"))
        ));
    }
    if let Some(req) = &spec.requirements {
        if let Some(mib) = req.min_memory_mib {
            terms.push(format!("has({c}.memory) && {c}.memory.compareTo(quantity(\"{mib}Mi\")) >= 0"));
        }
        if let Some((major, minor)) = req.min_compute_capability.as_deref().and_then(parse_compute_capability)
        {
            terms.push(format!(
                "has({a}.cudaComputeCapability) && {a}.cudaComputeCapability.compareTo(semver(\"{major}.{minor}.0\")) >= 0"
            ));
        }
        for cap in req.capabilities.iter().filter(|c| is_cel_identifier(c)) {
            terms.push(format!("has({a}.{cap})"));
        }
    }
    terms.join(" && ")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use proptest::prelude::*;
    use vgpu_api::{Requirements, SharingPolicy};

    use super::*;

    fn spec(device_type: Option<&str>) -> GPUClassSpec {
        GPUClassSpec {
            vendor: "nvidia".into(),
            device_type: device_type.map(str::to_owned),
            requirements: None,
            sharing: SharingPolicy { mode: SharingMode::Shared, shares: Some(4) },
            node_selector: None,
            passthrough: None,
        }
    }

    #[test]
    fn a_passthrough_class_selects_the_vfio_devices() {
        let mut s = spec(Some("h100"));
        s.sharing = SharingPolicy { mode: SharingMode::Exclusive, shares: None };
        s.passthrough = Some(true);
        let sel = class_selector("manager.nvidia.com", &s);
        assert!(
            sel.contains(r#"device.attributes["manager.nvidia.com"].type == "vfio""#)
                && !sel.contains("\"gpu\""),
            "{sel}"
        );
        s.passthrough = Some(false);
        assert!(class_selector("manager.nvidia.com", &s).contains(r#"type in ["gpu", "vgpu"]"#));
    }

    #[test]
    fn full_selector_is_pinned() {
        let mut s = spec(Some("a100-sxm4-40gb"));
        s.requirements = Some(Requirements {
            min_memory_mib: Some(40960),
            min_compute_capability: Some("8.0".into()),
            capabilities: vec!["coreRatio".into()],
        });
        let a = r#"device.attributes["manager.nvidia.com"]"#;
        let p = format!(r#"{a}.productName.lowerAscii().replace(" ", "-").replace("_", "-")"#);
        assert_eq!(
            class_selector("manager.nvidia.com", &s),
            format!(
                r#"device.driver == "manager.nvidia.com" && has({a}.type) && {a}.type == "vgpu" && has({a}.productName) && ({p} == "a100-sxm4-40gb" || {p}.endsWith("-a100-sxm4-40gb")) && has(device.capacity["manager.nvidia.com"].memory) && device.capacity["manager.nvidia.com"].memory.compareTo(quantity("40960Mi")) >= 0 && has({a}.cudaComputeCapability) && {a}.cudaComputeCapability.compareTo(semver("8.0.0")) >= 0 && has({a}.coreRatio)"#
            )
        );
        let mut e = spec(None);
        e.sharing = SharingPolicy { mode: SharingMode::Exclusive, shares: None };
        assert_eq!(
            class_selector("gpu.metax-tech.com", &e),
            r#"device.driver == "gpu.metax-tech.com" && has(device.attributes["gpu.metax-tech.com"].type) && device.attributes["gpu.metax-tech.com"].type in ["gpu", "vgpu"]"#
        );
    }

    #[test]
    fn compute_capabilities_and_identifiers() {
        assert_eq!(parse_compute_capability("8.0"), Some((8, 0)));
        assert_eq!(parse_compute_capability("9"), Some((9, 0)));
        for bad in ["", "8.", ".1", "a.b", "8.0.1", "-1"] {
            assert_eq!(parse_compute_capability(bad), None, "{bad}");
        }
        assert!(is_cel_identifier("coreRatio") && is_cel_identifier("_x1"));
        for bad in ["", "1a", "a-b", "in", "a.b", "a\"b"] {
            assert!(!is_cel_identifier(bad), "{bad}");
        }
    }

    /// Reads the CEL string literal at the start of `s` (double quotes; the escapes `cel_string` writes and
    /// CEL's `\\`, `\"`, `\n`, `\r`, `\t`); returns the value and the rest.
    fn read_literal(s: &str) -> Option<(String, &str)> {
        let mut chars = s.char_indices();
        if chars.next()?.1 != '"' {
            return None;
        }
        let mut out = String::new();
        while let Some((i, c)) = chars.next() {
            match c {
                '"' => return Some((out, &s[i + 1..])),
                '\\' => out.push(match chars.next()?.1 {
                    '\\' => '\\',
                    '"' => '"',
                    'n' => '\n',
                    'r' => '\r',
                    't' => '\t',
                    _ => return None,
                }),
                '\n' | '\r' => return None,
                c => out.push(c),
            }
        }
        None
    }

    proptest! {
        /// Whatever the device type, the expression keeps its shape: the literal that follows `== ` reads back
        /// as exactly the device type, and the rest of the expression is the fixed text around it.
        #[test]
        fn device_type_cannot_inject(model in any::<String>()) {
            prop_assume!(!model.is_empty());
            let expr = class_selector("manager.nvidia.com", &spec(Some(&model)));
            let p = r#"device.attributes["manager.nvidia.com"].productName.lowerAscii().replace(" ", "-").replace("_", "-")"#;
            let head = format!(r#"device.driver == "manager.nvidia.com" && has(device.attributes["manager.nvidia.com"].type) && device.attributes["manager.nvidia.com"].type == "vgpu" && has(device.attributes["manager.nvidia.com"].productName) && ({p} == "#);
            let rest = expr.strip_prefix(&head).expect("fixed head");
            let (first, rest) = read_literal(rest).expect("first literal");
            prop_assert_eq!(&first, &model);
            let rest = rest.strip_prefix(&format!(" || {p}.endsWith(")).expect("fixed middle");
            let (second, rest) = read_literal(rest).expect("second literal");
            prop_assert_eq!(second, format!("-{model}"));
            prop_assert_eq!(rest, "))");
        }

        /// Capabilities that are not identifiers never reach the expression.
        #[test]
        fn capabilities_are_identifiers_or_dropped(cap in any::<String>()) {
            let mut s = spec(None);
            s.requirements = Some(Requirements { capabilities: vec![cap.clone()], ..Requirements::default() });
            let expr = class_selector("manager.nvidia.com", &s);
            prop_assert_eq!(expr.contains(&format!(".{cap})")) && !cap.is_empty(), is_cel_identifier(&cap));
        }
    }
}
