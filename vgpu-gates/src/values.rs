//! Helm-values-style gate maps (`{GateName: bool}`) in YAML or JSON.

use serde_json::Value;

use crate::{error::ValuesError, parse::parse_bool};

/// Reads a gate map from YAML or JSON text.
///
/// The document is either the bare map (`{GateName: bool, ...}`), a map with a `featureGates`
/// key, or a whole chart values file in which the map sits at one of `paths` (dotted, e.g.
/// `devicePlugin.devicePlugin.commands.featureGates`; the first that exists is used). An empty
/// document is an empty map. Values are booleans, the strings Go's `ParseBool` accepts, or 0/1,
/// because that is what the charts render into `--feature-gates`.
///
/// ```
/// let entries = vgpu_gates::parse_values("MPSSupport: true\nVGPUSupport: \"false\"\n", &[])?;
/// assert_eq!(entries, vec![("MPSSupport".to_owned(), true), ("VGPUSupport".to_owned(), false)]);
/// # Ok::<(), vgpu_gates::ValuesError>(())
/// ```
pub fn parse_values(text: &str, paths: &[&str]) -> Result<Vec<(String, bool)>, ValuesError> {
    let doc: Value = if text.trim().is_empty() {
        Value::Null
    } else {
        serde_saphyr::from_str(text).map_err(|e| ValuesError::Syntax(e.to_string()))?
    };
    let not_a_map = || ValuesError::NotAMap { paths: paths.iter().map(|p| (*p).to_owned()).collect() };
    let map = match &doc {
        Value::Null => return Ok(Vec::new()),
        Value::Object(root) => {
            if root.values().all(|v| !v.is_object() && !v.is_array()) {
                root
            } else if let Some(Value::Object(m)) = root.get("featureGates") {
                m
            } else {
                paths.iter().find_map(|p| lookup(&doc, p)).ok_or_else(not_a_map)?
            }
        }
        _ => return Err(not_a_map()),
    };
    map.iter().map(|(k, v)| Ok((k.clone(), to_bool(k, v)?))).collect()
}

fn lookup<'a>(doc: &'a Value, path: &str) -> Option<&'a serde_json::Map<String, Value>> {
    let mut cur = doc;
    for part in path.split('.') {
        cur = cur.get(part)?;
    }
    match cur {
        Value::Object(m) => Some(m),
        _ => None,
    }
}

fn to_bool(gate: &str, v: &Value) -> Result<bool, ValuesError> {
    let parsed = match v {
        Value::Bool(b) => Some(*b),
        Value::String(s) => parse_bool(s.trim()),
        Value::Number(n) => match n.as_u64() {
            Some(0) => Some(false),
            Some(1) => Some(true),
            _ => None,
        },
        Value::Null | Value::Array(_) | Value::Object(_) => None,
    };
    parsed.ok_or_else(|| ValuesError::NotABool { gate: gate.to_owned(), value: v.to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_map_yaml_and_json() -> Result<(), ValuesError> {
        let y = parse_values("A: true\nB: false\n", &[])?;
        let j = parse_values(r#"{"A": true, "B": "0"}"#, &[])?;
        assert_eq!(y, j);
        assert_eq!(parse_values("", &[])?, vec![]);
        assert_eq!(parse_values("{}", &[])?, vec![]);
        Ok(())
    }

    #[test]
    fn chart_values_path() -> Result<(), ValuesError> {
        let text = "devicePlugin:\n  devicePlugin:\n    image: x\n    commands:\n      featureGates:\n        GPUCoreResourcePlugin: true\n";
        let got = parse_values(text, &["devicePlugin.devicePlugin.commands.featureGates"])?;
        assert_eq!(got, vec![("GPUCoreResourcePlugin".to_owned(), true)]);
        let err = parse_values(text, &["scheduler.schedulerExtender.commands.featureGates"]);
        assert_eq!(
            err.map_err(|e| e.to_string()),
            Err("expected a map {GateName: bool} or a chart values file with scheduler.schedulerExtender.commands.featureGates".to_owned())
        );
        Ok(())
    }

    #[test]
    fn bad_values_are_named() {
        let err = parse_values("A: maybe\n", &[]).map_err(|e| e.to_string());
        assert_eq!(err, Err("invalid value of A=\"maybe\": expected a boolean (true or false)".to_owned()));
        assert!(matches!(parse_values("A: 2", &[]), Err(ValuesError::NotABool { .. })));
        assert!(matches!(parse_values("- a\n- b\n", &[]), Err(ValuesError::NotAMap { .. })));
        assert!(matches!(parse_values("a: [b\n", &[]), Err(ValuesError::Syntax(_))));
    }
}
