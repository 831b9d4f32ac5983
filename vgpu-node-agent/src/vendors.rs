//! The `gpu-supported-vendors` ConfigMap: which PCI vendors' display controllers count as GPUs.
//!
//! Each `data` value is a vendors document (YAML or JSON; the format of [`vgpu_core::discovery::vendors`]);
//! entries are merged over the built-in table (NVIDIA `10de`, MetaX `9999`), in key order. The sample is
//! `deploy/gpu-module/gpu-supported-vendors.yaml` (checked by `tests/agent.rs`):
//!
//! ```yaml
//! apiVersion: v1
//! kind: ConfigMap
//! metadata:
//!   name: gpu-supported-vendors
//!   namespace: d8-gpu
//! data:
//!   vendors.yaml: |
//!     vendors:
//!       - id: "1002"        # PCI vendor id, hexadecimal, optional 0x prefix
//!         name: amd         # vendor key: the label value and the PhysicalGPU name part
//!         displayName: AMD  # optional
//!       - id: "9999"
//!         enabled: false    # removes a built-in vendor
//! ```
//!
//! | ConfigMap | table used | logged |
//! |---|---|---|
//! | not configured | built-in | nothing |
//! | valid | built-in merged with it | nothing |
//! | missing, unreadable, empty `data`, or any entry invalid | built-in (a bad ConfigMap changes nothing) | one `error!` naming the ConfigMap and the reason, again only when the reason changes |

use std::collections::BTreeMap;

use vgpu_core::discovery::{DiscoveryError, VendorTable};

use vgpu_kube::error::CallError;

use crate::cluster::AgentCluster;

/// Why the vendors ConfigMap was not used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum VendorsError {
    /// The ConfigMap does not exist.
    #[error(
        "vendors ConfigMap {namespace}/{name} not found; using the built-in vendor table (NVIDIA 10de, MetaX 9999)"
    )]
    Missing {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
    /// The ConfigMap could not be read.
    #[error(
        "cannot read the vendors ConfigMap {namespace}/{name}: {source}; using the built-in vendor table"
    )]
    Read {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// The API error.
        #[source]
        source: CallError,
    },
    /// The ConfigMap's data is not a set of vendors documents.
    #[error(
        "invalid vendors ConfigMap {namespace}/{name}: {message} (expected each data value to be a `vendors:` list of {{id, name, displayName, enabled}}); using the built-in vendor table"
    )]
    Invalid {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// What was wrong.
        message: String,
    },
}

/// The built-in table merged with a ConfigMap's `data` (see the module docs).
///
/// ```
/// use std::collections::BTreeMap;
///
/// let data = BTreeMap::from([("v.yaml".to_owned(), "vendors:\n  - id: '1002'\n    name: amd\n".to_owned())]);
/// let table = vgpu_node_agent::vendors::table_from_data("d8-gpu", "gpu-supported-vendors", &data)?;
/// assert_eq!(table.get(0x1002).map(|v| v.key.as_str()), Some("amd"));
/// assert!(table.get(0x10de).is_some());
/// # Ok::<(), vgpu_node_agent::vendors::VendorsError>(())
/// ```
pub fn table_from_data(
    namespace: &str,
    name: &str,
    data: &BTreeMap<String, String>,
) -> Result<VendorTable, VendorsError> {
    let invalid = |message: String| VendorsError::Invalid {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        message,
    };
    if data.is_empty() {
        return Err(invalid("`data` is empty".to_owned()));
    }
    let mut table = VendorTable::builtin();
    for (key, value) in data {
        table.merge_str(value).map_err(|err| invalid(describe(key, &err)))?;
    }
    Ok(table)
}

fn describe(key: &str, err: &DiscoveryError) -> String {
    match err {
        DiscoveryError::VendorsParse { message, .. } => format!("data.{key}: {message}"),
        DiscoveryError::VendorId { value, source, .. } => {
            format!("data.{key}: vendor id {value:?}: {source}")
        }
        other => format!("data.{key}: {other}"),
    }
}

/// Reads the ConfigMap through `cluster` and builds the table; on any problem the built-in table and the
/// reason.
pub async fn load<C: AgentCluster>(
    cluster: &C,
    namespace: &str,
    name: &str,
) -> (VendorTable, Option<VendorsError>) {
    let result = match cluster.config_map_data(namespace, name).await {
        Ok(Some(data)) => table_from_data(namespace, name, &data),
        Ok(None) => Err(VendorsError::Missing { namespace: namespace.to_owned(), name: name.to_owned() }),
        Err(source) => {
            Err(VendorsError::Read { namespace: namespace.to_owned(), name: name.to_owned(), source })
        }
    };
    match result {
        Ok(table) => (table, None),
        Err(err) => (VendorTable::builtin(), Some(err)),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn bad_data_is_named() {
        let data = BTreeMap::from([("v.yaml".to_owned(), "vendors:\n  - id: nvidia\n".to_owned())]);
        let err = table_from_data("ns", "cm", &data).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("ns/cm") && text.contains("data.v.yaml") && text.contains("\"nvidia\""),
            "{text}"
        );
        let err = table_from_data("ns", "cm", &BTreeMap::new()).unwrap_err();
        assert!(err.to_string().contains("`data` is empty"), "{err}");
        let junk = BTreeMap::from([("x".to_owned(), "vendors: 3".to_owned())]);
        assert!(matches!(table_from_data("ns", "cm", &junk), Err(VendorsError::Invalid { .. })));
    }

    #[test]
    fn disabling_a_builtin_vendor() {
        let data =
            BTreeMap::from([("v".to_owned(), "vendors:\n  - id: '9999'\n    enabled: false\n".to_owned())]);
        let table = table_from_data("ns", "cm", &data).unwrap();
        assert!(!table.contains(0x9999));
        assert!(table.contains(0x10de));
    }
}
