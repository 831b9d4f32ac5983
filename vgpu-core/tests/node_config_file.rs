//! Node config files (contract §6) read from real files.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;

use vgpu_core::node_config::{
    CgroupDriver, DeviceListStrategy, MigStrategy, NodeConfigError, NodeConfigFile, NodeSettings,
};

fn write(dir: &tempfile::TempDir, name: &str, text: &str) -> PathBuf {
    let p = dir.path().join(name);
    std::fs::write(&p, text).unwrap();
    p
}

const JSON: &str = r#"
// Per-node overrides.
[
  {
    "nodeName": "gpu-node-1", // exact
    "deviceSplitCount": 4,
    "deviceMemoryScaling": 1.5,
    "deviceMemoryFactor": 1024,
    "deviceCoresScaling": 2,
    "excludeDevices": "0-1,GPU-49AA2E6A",
    "deviceListStrategy": ["envvar", "cdi-cri"],
    "gdrcopyEnabled": true,
    "migStrategy": "none",
    "cgroupDriver": "systemd",
    "imex": {"channelIDs": [0], "required": true},
  },
  /* every other gpu node */
  {"nodeName": "gpu-node-.*", "deviceSplitCount": 8, "excludeDevices": [3, "GPU-x"]},
]
"#;

#[test]
fn json_with_comments_exact_then_regex() {
    let dir = tempfile::tempdir().unwrap();
    let file = NodeConfigFile::load(write(&dir, "config.json", JSON)).unwrap();
    let s = file.resolve("gpu-node-1", NodeSettings::default()).unwrap();
    assert_eq!(s.device_split_count, 4);
    assert_eq!(s.device_memory_scaling, 1.5);
    assert_eq!(s.device_memory_factor, 1024);
    assert_eq!(s.device_cores_scaling, 2.0);
    assert!(s.exclude_devices.contains(0, "") && s.exclude_devices.contains(1, ""));
    assert!(s.exclude_devices.contains(7, "gpu-49aa2e6a") && !s.exclude_devices.contains(2, "GPU-1"));
    assert_eq!(s.device_list_strategy, vec![DeviceListStrategy::Envvar, DeviceListStrategy::CdiCri]);
    assert!(s.gdrcopy_enabled, "gdrcopyEnabled from the file is honoured (upstream drops it)");
    assert_eq!(s.mig_strategy, MigStrategy::None);
    assert_eq!(s.cgroup_driver, CgroupDriver::Systemd);
    assert_eq!(s.imex.channel_ids, vec![0]);
    assert!(s.imex.required);

    let s = file.resolve("gpu-node-12", NodeSettings::default()).unwrap();
    assert_eq!(s.device_split_count, 8);
    assert!(s.exclude_devices.contains(3, "") && s.exclude_devices.contains(0, "GPU-X"));
    assert_eq!(s.device_memory_factor, 1, "flag value kept");

    // Anchored: a prefix or suffix match is not enough.
    assert!(file.spec_for("xgpu-node-1").is_none());
    let s = file.resolve("cpu-node", NodeSettings { device_split_count: 6, ..Default::default() }).unwrap();
    assert_eq!(s.device_split_count, 6);
}

#[test]
fn exact_match_beats_earlier_pattern() {
    let dir = tempfile::tempdir().unwrap();
    let text = r#"[{"nodeName": ".*", "deviceSplitCount": 1}, {"nodeName": "n1", "deviceSplitCount": 2}]"#;
    let file = NodeConfigFile::load(write(&dir, "c.json", text)).unwrap();
    assert_eq!(file.resolve("n1", NodeSettings::default()).unwrap().device_split_count, 2);
    assert_eq!(file.resolve("n2", NodeSettings::default()).unwrap().device_split_count, 1);
}

#[test]
fn yaml_versions() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = "version: v1\nconfigs:\n  - nodeName: node-a\n    deviceSplitCount: 5\n    excludeDevices: 0..2,5\n    deviceListStrategy: volume-mounts\n  - nodeName: node-[bc]\n    excludeDevices: [1, GPU-abc]\n    migStrategy: single\n";
    let file = NodeConfigFile::load(write(&dir, "c.yaml", yaml)).unwrap();
    let s = file.resolve("node-a", NodeSettings::default()).unwrap();
    assert_eq!(s.device_split_count, 5);
    assert_eq!(s.exclude_devices.to_string(), "0..2,5");
    assert_eq!(s.device_list_strategy, vec![DeviceListStrategy::VolumeMounts]);
    let s = file.resolve("node-c", NodeSettings::default()).unwrap();
    assert_eq!(s.mig_strategy, MigStrategy::Single);
    assert_eq!(s.exclude_devices.to_string(), "1,GPU-abc");

    let no_version =
        NodeConfigFile::load(write(&dir, "c.yml", "configs:\n- nodeName: x\n  excludeDevices: 2\n")).unwrap();
    assert!(no_version.resolve("x", NodeSettings::default()).unwrap().exclude_devices.contains(2, ""));

    let err = NodeConfigFile::load(write(&dir, "v2.yaml", "version: v2\nconfigs: []\n")).unwrap_err();
    assert_eq!(err.to_string(), "unknown config version: \"v2\" (expected \"v1\")");
}

fn resolve_err(dir: &tempfile::TempDir, name: &str, text: &str) -> String {
    match NodeConfigFile::load(write(dir, name, text)) {
        Ok(f) => f.resolve("n", NodeSettings::default()).unwrap_err().to_string(),
        Err(e) => e.to_string(),
    }
}

#[test]
fn validation_messages_name_field_and_value() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            r#"[{"nodeName":"n","deviceSplitCount":-1}]"#,
            "invalid deviceSplitCount value -1: expected an integer greater than or equal to 0",
        ),
        (
            r#"[{"nodeName":"n","deviceMemoryFactor":0}]"#,
            "invalid deviceMemoryFactor value 0: expected an integer greater than 0",
        ),
        (
            r#"[{"nodeName":"n","deviceMemoryScaling":-0.5}]"#,
            "invalid deviceMemoryScaling value -0.5: expected a number greater than or equal to 0",
        ),
        (
            r#"[{"nodeName":"n","deviceCoresScaling":-2}]"#,
            "invalid deviceCoresScaling value -2: expected a number greater than or equal to 0",
        ),
        (
            r#"[{"nodeName":"n","migStrategy":"all"}]"#,
            "invalid migStrategy value \"all\": expected none, single or mixed",
        ),
        (
            r#"[{"nodeName":"n","deviceListStrategy":"env"}]"#,
            "invalid deviceListStrategy value \"env\": expected envvar, volume-mounts, cdi-annotations or cdi-cri",
        ),
        (
            r#"[{"nodeName":"n","excludeDevices":"3..1"}]"#,
            "invalid excludeDevices value \"3..1\": expected GPU indices, 0..2 / 0-2 ranges or UUIDs",
        ),
        (
            r#"[{"nodeName":"n","imex":{"channelIDs":[-1]}}]"#,
            "invalid imex.channelIDs value -1: expected non-negative channel ids",
        ),
        (
            r#"[{"nodeName":"n(","deviceSplitCount":1}]"#,
            "invalid nodeName \"n(\" in spec 0: not a valid regular expression",
        ),
        (r#"[{"nodeName":"","deviceSplitCount":1}]"#, "invalid nodeName \"\" in spec 0: must not be empty"),
    ];
    for (i, (text, want)) in cases.iter().enumerate() {
        let got = resolve_err(&dir, &format!("case{i}.json"), text);
        assert!(got.starts_with(want), "case {i}: got {got:?}, want prefix {want:?}");
    }
    let got = resolve_err(&dir, "type.json", r#"[{"nodeName":"n","deviceSplitCount":"four"}]"#);
    assert!(got.starts_with("invalid node config ") && got.contains("expected a JSON array"), "{got}");
    let got = resolve_err(&dir, "bad.yaml", "configs: [nodeName: x\n");
    assert!(got.contains("expected {version: v1, configs: [...]}"), "{got}");
}

#[test]
fn file_errors() {
    let dir = tempfile::tempdir().unwrap();
    let e = NodeConfigFile::load(write(&dir, "c.toml", "")).unwrap_err();
    assert!(matches!(e, NodeConfigError::UnsupportedFormat { .. }));
    assert!(e.to_string().starts_with("unsupported config file format: "));
    let e = NodeConfigFile::load(dir.path().join("missing.json")).unwrap_err();
    assert!(matches!(e, NodeConfigError::Io { .. }), "{e}");
}
