//! CDI device names, the `cdi-annotations` device-list strategy (contract §5.2) and the node CDI spec.
//!
//! With `cdi-annotations` a container's devices reach the runtime as one annotation of the
//! `ContainerAllocateResponse`, in the form the CDI annotation convention defines (the NVIDIA device plugin
//! uses the same one):
//!
//! * key `<prefix><plugin-name>_<id>`: `prefix` is `--cdi-annotation-prefix` (default `cdi.k8s.io/`); the
//!   name part `<plugin-name>_<id>` (with `/` in the ID turned into `_`) is at most 63 characters, starts and
//!   ends with a letter or digit and otherwise holds only letters, digits, `_`, `-` and `.`;
//! * value: the fully qualified CDI device names joined by `,`
//!   (`k8s.device-plugin.nvidia.com/gpu=GPU-aaa,k8s.device-plugin.nvidia.com/gpu=GPU-bbb`), then the IMEX
//!   channels (`k8s.device-plugin.nvidia.com/imex-channel=<id>`).
//!
//! The node specs under `--cdi-root` ([`vgpu_core::cdi::Spec`], typed): one file per kind, named by [`spec_file`] — the
//! GPUs' kind from the vendor adapter (NVIDIA `k8s.device-plugin.nvidia.com/gpu`, MetaX
//! `k8s.device-plugin.metax-tech.com/gpu`) and, with IMEX channels, [`IMEX_CHANNEL_KIND`].
//!
//! ```
//! use vgpu_deviceplugin::cdi::{annotation, gpu_device};
//!
//! let (key, value) = annotation("cdi.k8s.io/", "vgpu-device-plugin", "0b1a", &[gpu_device("GPU-a")])?;
//! assert_eq!(key, "cdi.k8s.io/vgpu-device-plugin_0b1a");
//! assert_eq!(value, "k8s.device-plugin.nvidia.com/gpu=GPU-a");
//! # Ok::<(), vgpu_deviceplugin::cdi::CdiError>(())
//! ```

use vgpu_core::cdi::{ContainerEdits, Device, DeviceNode, SPEC_VERSION, Spec};

/// CDI kind (`vendor/class`) of the NVIDIA GPUs the device plugin hands out (the vendor's adapter names
/// the kind in use: [`vgpu_core::backend::VendorAdapter::cdi_kind`]).
pub const GPU_KIND: &str = vgpu_core::backend::vendor::NVIDIA_CDI_KIND;
/// CDI kind of the IMEX channels (NVIDIA only): devices `<kind>=<channel id>`.
pub const IMEX_CHANNEL_KIND: &str = "k8s.device-plugin.nvidia.com/imex-channel";
/// The plugin name in the annotation keys of the vnumber plugin.
pub const VGPU_PLUGIN_NAME: &str = "vgpu-device-plugin";
/// The plugin name in the annotation keys of the MIG plugins.
pub const MIG_PLUGIN_NAME: &str = "vgpu-mig-plugin";
/// Longest name part (`<plugin-name>_<id>`) of an annotation key.
pub const MAX_NAME_LEN: usize = 63;

/// File name of the NVIDIA GPUs' spec under the CDI root ([`spec_file`] of [`GPU_KIND`]).
pub const SPEC_FILE: &str = "k8s.device-plugin.nvidia.com-gpu.json";

/// The spec file name of a kind: `/` turned into `-`, then `.json`.
pub fn spec_file(kind: &str) -> String {
    format!("{}.json", kind.replace('/', "-"))
}

/// One CDI device of the node spec: its name (a GPU or MIG UUID) and its device nodes (container paths).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecDevice {
    /// Device name (`<uuid>`): the part after `=` of the qualified name.
    pub name: String,
    /// Device nodes, container paths (`/dev/nvidia0`, `/dev/nvidia-caps/nvidia-cap12`).
    pub nodes: Vec<String>,
}

/// The node's CDI spec of `kind`: one device per GPU / MIG instance with its device nodes, and the control
/// nodes in the spec-wide edits. Host paths are under `host_driver_root`.
///
/// Only device nodes are described: driver libraries and hooks (what nvidia-container-toolkit's `nvcdi`
/// adds) are not, so the runtime or the image must provide the user-space driver.
pub fn node_spec(
    kind: &str,
    devices: &[SpecDevice],
    control_nodes: &[String],
    host_driver_root: &std::path::Path,
) -> Spec {
    let nodes =
        |paths: &[String]| paths.iter().map(|p| DeviceNode::under(p, host_driver_root)).collect::<Vec<_>>();
    let edits = |paths: &[String]| ContainerEdits { device_nodes: nodes(paths), ..ContainerEdits::default() };
    Spec {
        cdi_version: SPEC_VERSION.to_owned(),
        kind: kind.to_owned(),
        devices: devices
            .iter()
            .map(|d| Device { name: d.name.clone(), container_edits: edits(&d.nodes), ..Device::default() })
            .collect(),
        container_edits: edits(control_nodes),
        ..Spec::default()
    }
}

/// The IMEX channels' spec ([`IMEX_CHANNEL_KIND`]): device `<id>` with node
/// `/dev/nvidia-caps-imex-channels/channel<id>`, no spec-wide edits.
pub fn imex_spec(channels: &[u32], host_driver_root: &std::path::Path) -> Spec {
    Spec {
        cdi_version: SPEC_VERSION.to_owned(),
        kind: IMEX_CHANNEL_KIND.to_owned(),
        devices: channels
            .iter()
            .map(|id| Device {
                name: id.to_string(),
                container_edits: ContainerEdits {
                    device_nodes: vec![DeviceNode::under(
                        &crate::config::imex_channel_node(*id),
                        host_driver_root,
                    )],
                    ..ContainerEdits::default()
                },
                ..Device::default()
            })
            .collect(),
        ..Spec::default()
    }
}

/// Writing a CDI spec failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CdiSpecError {
    /// The spec could not be serialised.
    #[error("cannot serialise the CDI spec of kind {kind}: {source}")]
    Serialize {
        /// The spec's kind.
        kind: String,
        /// The serialiser's error.
        #[source]
        source: serde_json::Error,
    },
    /// The directory or file could not be written.
    #[error(transparent)]
    Write(#[from] vgpu_core::abi::AbiError),
}

/// Writes `spec` to `<cdi_root>/`[`spec_file`]`(kind)` atomically (creating `cdi_root`); a spec that
/// cannot be serialised is an error, never an empty file.
pub fn write_spec(cdi_root: &std::path::Path, spec: &Spec) -> Result<std::path::PathBuf, CdiSpecError> {
    let text = serde_json::to_vec_pretty(spec)
        .map_err(|source| CdiSpecError::Serialize { kind: spec.kind.clone(), source })?;
    let path = cdi_root.join(spec_file(&spec.kind));
    std::fs::create_dir_all(cdi_root).map_err(|source| vgpu_core::abi::AbiError::Io {
        path: cdi_root.to_path_buf(),
        action: "create CDI directory",
        source,
    })?;
    vgpu_core::abi::atomic::write_atomic(&path, &text, 0o644)?;
    Ok(path)
}

/// Writes [`node_spec`] of `kind` with [`write_spec`].
pub fn write_node_spec(
    cdi_root: &std::path::Path,
    kind: &str,
    devices: &[SpecDevice],
    control_nodes: &[String],
    host_driver_root: &std::path::Path,
) -> Result<std::path::PathBuf, CdiSpecError> {
    write_spec(cdi_root, &node_spec(kind, devices, control_nodes, host_driver_root))
}

/// A CDI annotation cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CdiError {
    /// The plugin name or ID is empty.
    #[error("CDI annotation: empty {0}")]
    Empty(&'static str),
    /// The name part breaks the convention.
    #[error(
        "CDI annotation name {name:?}: {problem} (expected at most 63 characters of letters, digits, '_', '-', '.', starting and ending with a letter or digit)"
    )]
    Name {
        /// The offending name part.
        name: String,
        /// What is wrong with it.
        problem: &'static str,
    },
    /// No devices to annotate.
    #[error("CDI annotation {0:?}: no devices")]
    NoDevices(String),
}

/// `k8s.device-plugin.nvidia.com/gpu=<uuid>` (NVIDIA's kind; other vendors:
/// [`vgpu_core::backend::VendorAdapter::cdi_device`]).
pub fn gpu_device(uuid: &str) -> String {
    format!("{GPU_KIND}={uuid}")
}

/// `k8s.device-plugin.nvidia.com/imex-channel=<id>`.
pub fn imex_channel_device(id: u32) -> String {
    format!("{IMEX_CHANNEL_KIND}={id}")
}

/// The annotation key `<prefix><plugin_name>_<id>`, validated as the module docs describe.
pub fn annotation_key(prefix: &str, plugin_name: &str, id: &str) -> Result<String, CdiError> {
    if plugin_name.is_empty() {
        return Err(CdiError::Empty("plugin name"));
    }
    if id.is_empty() {
        return Err(CdiError::Empty("device ID"));
    }
    let name = format!("{plugin_name}_{}", id.replace('/', "_"));
    let bad = |problem| Err(CdiError::Name { name: name.clone(), problem });
    if name.len() > MAX_NAME_LEN {
        return bad("too long");
    }
    let bytes = name.as_bytes();
    let alnum = |b: &u8| b.is_ascii_alphanumeric();
    if !bytes.first().is_some_and(alnum) || !bytes.last().is_some_and(alnum) {
        return bad("must start and end with a letter or digit");
    }
    if !bytes.iter().all(|b| alnum(b) || matches!(b, b'_' | b'-' | b'.')) {
        return bad("holds a character other than letters, digits, '_', '-', '.'");
    }
    Ok(format!("{prefix}{name}"))
}

/// The `(key, value)` annotation for `devices` (fully qualified CDI names).
pub fn annotation(
    prefix: &str,
    plugin_name: &str,
    id: &str,
    devices: &[String],
) -> Result<(String, String), CdiError> {
    let key = annotation_key(prefix, plugin_name, id)?;
    if devices.is_empty() {
        return Err(CdiError::NoDevices(key));
    }
    Ok((key, devices.join(",")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_follow_the_convention() {
        assert_eq!(
            annotation_key("cdi.k8s.io/", VGPU_PLUGIN_NAME, "7f1c8c2e-2a8e-4b0e-9c1d-1c1e5a3f2b10").unwrap(),
            "cdi.k8s.io/vgpu-device-plugin_7f1c8c2e-2a8e-4b0e-9c1d-1c1e5a3f2b10"
        );
        assert_eq!(annotation_key("example.com/", "p", "a/b").unwrap(), "example.com/p_a_b");
        assert_eq!(annotation_key("cdi.k8s.io/", "", "x"), Err(CdiError::Empty("plugin name")));
        assert_eq!(annotation_key("cdi.k8s.io/", "p", ""), Err(CdiError::Empty("device ID")));
        let long = "x".repeat(62);
        assert!(annotation_key("cdi.k8s.io/", "p", &long).unwrap_err().to_string().contains("too long"));
        assert!(annotation_key("cdi.k8s.io/", "p", "a b").is_err());
        assert!(annotation_key("cdi.k8s.io/", "-p", "a").is_err());
        assert!(annotation_key("cdi.k8s.io/", "p", "a-").is_err());
        let (k, v) = annotation("c/", "p", "1", &[gpu_device("GPU-a"), gpu_device("GPU-b")]).unwrap();
        assert_eq!(k, "c/p_1");
        assert_eq!(v, "k8s.device-plugin.nvidia.com/gpu=GPU-a,k8s.device-plugin.nvidia.com/gpu=GPU-b");
        assert_eq!(annotation("c/", "p", "1", &[]), Err(CdiError::NoDevices("c/p_1".into())));
    }

    #[test]
    fn node_spec_is_the_cdi_document_with_the_former_contents() {
        let devices = vec![
            SpecDevice { name: "GPU-a".into(), nodes: vec!["/dev/nvidia3".into()] },
            SpecDevice { name: "GPU-b".into(), nodes: vec![] },
        ];
        let root = std::path::Path::new("/run/nvidia/driver");
        let node = |p: &str| serde_json::json!({"path": p, "hostPath": format!("/run/nvidia/driver{p}")});
        // What the former node-spec writer wrote, but for the CDI specification's `omitempty`: an empty
        // `deviceNodes` list is left out (CDI readers take both the same).
        let former = serde_json::json!({
            "cdiVersion": "0.5.0",
            "kind": GPU_KIND,
            "devices": [
                {"name": "GPU-a", "containerEdits": {"deviceNodes": [node("/dev/nvidia3")]}},
                {"name": "GPU-b", "containerEdits": {}},
            ],
            "containerEdits": {"deviceNodes": [node("/dev/nvidiactl")]},
        });
        let typed = node_spec(GPU_KIND, &devices, &["/dev/nvidiactl".into()], root);
        assert_eq!(serde_json::to_value(&typed).unwrap(), former);
        assert_eq!(spec_file(GPU_KIND), SPEC_FILE);
        let back: Spec = serde_json::from_value(former).unwrap();
        assert_eq!(back, typed);
    }

    #[test]
    fn node_spec_file() {
        let dir = tempfile::tempdir().unwrap();
        let devices = vec![
            SpecDevice { name: "GPU-a".into(), nodes: vec!["/dev/nvidia3".into()] },
            SpecDevice {
                name: "MIG-x".into(),
                nodes: vec!["/dev/nvidia3".into(), "/dev/nvidia-caps/nvidia-cap12".into()],
            },
        ];
        let root = dir.path().join("cdi");
        let path = write_node_spec(
            &root,
            GPU_KIND,
            &devices,
            &["/dev/nvidiactl".into()],
            std::path::Path::new("/run/nvidia/driver"),
        )
        .unwrap();
        assert_eq!(path, root.join("k8s.device-plugin.nvidia.com-gpu.json"));
        let spec: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        assert_eq!(spec["cdiVersion"], "0.5.0");
        assert_eq!(spec["kind"], "k8s.device-plugin.nvidia.com/gpu");
        assert_eq!(spec["devices"][0]["name"], "GPU-a");
        assert_eq!(
            spec["devices"][1]["containerEdits"]["deviceNodes"][1],
            serde_json::json!({"path": "/dev/nvidia-caps/nvidia-cap12", "hostPath": "/run/nvidia/driver/dev/nvidia-caps/nvidia-cap12"})
        );
        assert_eq!(spec["containerEdits"]["deviceNodes"][0]["path"], "/dev/nvidiactl");
    }
}
