//! Fuzz entries for the `vgpu-core` decoders: annotations, node config files, the `vgpu.config` and
//! `devices.json` files, quantities.
//!
//! Each entry takes arbitrary bytes, hands them to the decoder in the form its real caller receives
//! (annotation values and node config files are always UTF-8 text by the time they reach the decoder, so
//! the bytes are read lossily; the ABI files are raw bytes), and checks what must always hold:
//!
//! - decoding never panics (an error is a fine answer);
//! - where an encoder exists, decode ⇒ encode ⇒ decode gives the same value and the encoding is stable.
//!
//! A broken property panics: that is how libFuzzer and the proptest harness see it. This file is compiled
//! both by the `vgpu-fuzz` crate (the cargo-fuzz targets) and, through `#[path]`, by
//! `vgpu-core/tests/fuzz_entries.rs` on stable, so the two cannot drift. It may only use `vgpu_core`,
//! `serde_json` and `std` (what that test crate has).
#![allow(clippy::panic)]

use std::borrow::Cow;
use std::path::Path;

use vgpu_core::abi::devices_json;
use vgpu_core::abi::vgpu_config::{DeviceConfig, VgpuConfig};
use vgpu_core::alloc::parse_quantity;
use vgpu_core::codec::device_filter::{IncludeExclude, SubstringList};
use vgpu_core::codec::{node_config_info, node_devices, node_gpu_domain, pod_devices};
use vgpu_core::node_config::{ExcludeDevices, NodeConfigFile, NodeSettings};
use vgpu_core::topology::DeviceTopology;

/// A fuzz entry: arbitrary bytes in, a panic when a property breaks.
pub type Entry = fn(&[u8]);

/// Every entry of this module by fuzz target name (the file `fuzz/fuzz_targets/<name>.rs` and the seeds
/// folder `fuzz/seeds/<name>/`).
pub const TARGETS: &[(&str, Entry)] = &[
    ("node_device_register", node_device_register),
    ("node_config_info", node_config_info),
    ("node_device_topology", node_device_topology),
    ("node_gpu_domain", node_gpu_domain),
    ("pod_devices", pod_devices),
    ("device_filter", device_filter),
    ("node_config_json", node_config_json),
    ("node_config_yaml", node_config_yaml),
    ("exclude_devices", exclude_devices),
    ("vgpu_config", vgpu_config),
    ("devices_json", devices_json),
    ("quantity", quantity),
];

/// Annotation values and config files arrive as UTF-8 text; any bytes map to some such text.
fn text(data: &[u8]) -> Cow<'_, str> {
    String::from_utf8_lossy(data)
}

/// `node-device-register` ([`node_devices::decode`]): round trip and stable encoding.
pub fn node_device_register(data: &[u8]) {
    let text = text(data);
    let Ok(inventory) = node_devices::decode(&text) else { return };
    let canonical = match node_devices::encode(&inventory) {
        Ok(c) => c,
        Err(e) => panic!("a decoded inventory does not encode: {e}"),
    };
    let again = match node_devices::decode(&canonical) {
        Ok(v) => v,
        Err(e) => panic!("an encoded inventory does not decode: {e}: {canonical}"),
    };
    assert_eq!(again, inventory, "round trip changed the inventory: {canonical}");
    assert_eq!(node_devices::encode(&again).ok(), Some(canonical), "encoding is not stable");
}

/// `node-config-info` ([`node_config_info::decode`]): round trip (floats bit for bit) and stable encoding.
pub fn node_config_info(data: &[u8]) {
    let text = text(data);
    let Ok(config) = node_config_info::decode(&text) else { return };
    let canonical = match node_config_info::encode(&config) {
        Ok(c) => c,
        Err(e) => panic!("a decoded config does not encode: {e}"),
    };
    let again = match node_config_info::decode(&canonical) {
        Ok(v) => v,
        Err(e) => panic!("an encoded config does not decode: {e}: {canonical}"),
    };
    assert_eq!(again.device_split, config.device_split, "{canonical}");
    assert_eq!(again.memory_factor, config.memory_factor, "{canonical}");
    assert_eq!(again.cores_scaling.to_bits(), config.cores_scaling.to_bits(), "{canonical}");
    assert_eq!(again.memory_scaling.to_bits(), config.memory_scaling.to_bits(), "{canonical}");
    assert_eq!(node_config_info::encode(&again).ok(), Some(canonical), "encoding is not stable");
}

/// `node-device-topology` ([`DeviceTopology::decode`]): round trip and stable encoding.
pub fn node_device_topology(data: &[u8]) {
    let text = text(data);
    let Ok(topology) = DeviceTopology::decode(&text) else { return };
    let canonical = topology.encode();
    let again = match DeviceTopology::decode(&canonical) {
        Ok(v) => v,
        Err(e) => panic!("an encoded topology does not decode: {e}: {canonical}"),
    };
    assert_eq!(again, topology, "round trip changed the topology: {canonical}");
    assert_eq!(again.encode(), canonical, "encoding is not stable");
}

/// `node-gpu-domain` ([`node_gpu_domain::decode`]): round trip and stable encoding.
pub fn node_gpu_domain(data: &[u8]) {
    let text = text(data);
    let Ok(rails) = node_gpu_domain::decode(&text) else { return };
    let canonical = node_gpu_domain::encode(&rails);
    let again = match node_gpu_domain::decode(&canonical) {
        Ok(v) => v,
        Err(e) => panic!("an encoded rail map does not decode: {e}: {canonical}"),
    };
    assert_eq!(again, rails, "round trip changed the rails: {canonical}");
    assert_eq!(node_gpu_domain::encode(&again), canonical, "encoding is not stable");
}

/// `pre-allocated` / `real-allocated` ([`pod_devices::decode`]): both names decode alike; round trip and
/// stable encoding.
pub fn pod_devices(data: &[u8]) {
    let text = text(data);
    let pre = pod_devices::decode_pre_allocated(&text);
    // Both annotations share one grammar: the same value decodes the same way under either name.
    assert_eq!(pre.as_ref().ok(), pod_devices::decode_real_allocated(&text).as_ref().ok());
    let Ok(claim) = pre else { return };
    let canonical = match pod_devices::encode(&claim) {
        Ok(c) => c,
        Err(e) => panic!("a decoded claim does not encode: {e}"),
    };
    let again = match pod_devices::decode_pre_allocated(&canonical) {
        Ok(v) => v,
        Err(e) => panic!("an encoded claim does not decode: {e}: {canonical}"),
    };
    assert_eq!(again, claim, "round trip changed the claim: {canonical}");
    assert_eq!(pod_devices::encode(&again).ok(), Some(canonical), "encoding is not stable");
}

/// `include-gpu-type` and friends ([`SubstringList::decode`], [`IncludeExclude::decode`]): the first line is
/// the list, the rest a value to match; round trip of the list, matching never panics.
pub fn device_filter(data: &[u8]) {
    let text = text(data);
    let (list, value) = text.split_once('\n').unwrap_or((&text, ""));
    let filter = IncludeExclude::decode(Some(list), Some(value));
    let _ = filter.admits(value);
    let _ = filter.is_unset();
    let Some(parsed) = SubstringList::decode(list) else { return };
    let canonical = parsed.encode();
    let Some(again) = SubstringList::decode(&canonical) else {
        panic!("a canonical list decodes to nothing: {canonical:?}");
    };
    assert_eq!(again, parsed, "round trip changed the list: {canonical:?}");
    assert_eq!(again.encode(), canonical, "encoding is not stable");
    let _ = parsed.matches(value);
}

/// Node config file, JSON with comments ([`NodeConfigFile::parse_json`]; the file is read as UTF-8).
pub fn node_config_json(data: &[u8]) {
    if let Ok(file) = NodeConfigFile::parse_json("fuzz.json", &text(data)) {
        exercise_node_config(&file);
    }
}

/// Node config file, YAML ([`NodeConfigFile::parse_yaml`]; the file is read as UTF-8).
pub fn node_config_yaml(data: &[u8]) {
    if let Ok(file) = NodeConfigFile::parse_yaml("fuzz.yaml", &text(data)) {
        exercise_node_config(&file);
    }
}

/// What the device plugin does with a parsed file: find each spec's node, resolve it over the defaults, and
/// derive the `node-config-info` value; none of it may panic, and what resolves encodes and round trips.
fn exercise_node_config(file: &NodeConfigFile) {
    for spec in file.specs() {
        for node in [spec.node_name.as_str(), "gpu-node-1"] {
            let _ = file.spec_for(node);
            let Ok(settings) = file.resolve(node, NodeSettings::default()) else { continue };
            check_exclude_round_trip(&settings.exclude_devices);
            let info = settings.vgpu_config();
            if let Ok(text) = node_config_info::encode(&info) {
                node_config_info(text.as_bytes());
            }
        }
    }
}

/// `excludeDevices` / `--exclude-devices` ([`ExcludeDevices`] `FromStr`): round trip through `Display`.
pub fn exclude_devices(data: &[u8]) {
    if let Ok(ex) = text(data).parse::<ExcludeDevices>() {
        let _ = ex.contains(0, "GPU-0");
        check_exclude_round_trip(&ex);
    }
}

fn check_exclude_round_trip(ex: &ExcludeDevices) {
    let canonical = ex.to_string();
    match canonical.parse::<ExcludeDevices>() {
        Ok(again) => {
            assert_eq!(&again, ex, "round trip changed the exclusions: {canonical:?}");
            assert_eq!(again.to_string(), canonical, "Display is not stable");
        }
        Err(e) => panic!("a displayed exclusion list does not parse: {e}"),
    }
}

/// `vgpu.config` ([`VgpuConfig::decode`], raw bytes): the encoded image is canonical. A decoded string may not
/// fit its buffer on the way back (a buffer without a terminating NUL, invalid UTF-8 read lossily), so
/// encoding cuts it; the property is on the image: an encoded image decodes, encodes to the same bytes, and
/// decodes to the same config.
pub fn vgpu_config(data: &[u8]) {
    let path = Path::new("vgpu.config");
    let Ok(config) = VgpuConfig::decode(data, path) else { return };
    let image = config.encode();
    let again = match VgpuConfig::decode(&image, path) {
        Ok(v) => v,
        Err(e) => panic!("an encoded vgpu.config does not decode: {e}"),
    };
    let image_again = again.encode();
    assert!(image_again == image, "encoding a decoded image changed it");
    assert_eq!(
        VgpuConfig::decode(&image_again, path).ok().as_ref(),
        Some(&again),
        "round trip changed the config"
    );
    // Numbers survive as they are; a string keeps at least a prefix of itself.
    let numbers = |c: &VgpuConfig| (c.cuda_version, c.compatibility_mode, c.sm_watcher, c.vmem_node);
    assert_eq!(numbers(&again), numbers(&config), "round trip changed a header number");
    let strings = |c: &VgpuConfig| {
        let mut s = vec![&c.driver_version, &c.pod_uid, &c.pod_name, &c.pod_namespace, &c.container_name];
        s.push(&c.register_uuid);
        s.extend(c.devices.iter().map(|d| &d.uuid));
        s.into_iter().cloned().collect::<Vec<String>>()
    };
    for (a, b) in strings(&again).iter().zip(strings(&config)) {
        assert!(b.starts_with(a.as_str()), "round trip turned {b:?} into {a:?}");
    }
    for (a, b) in again.devices.iter().zip(&config.devices) {
        let slot = |d: &DeviceConfig| {
            (d.seq, d.total_memory, d.real_memory, d.hard_core, d.soft_core, d.core_limit, d.hard_limit)
        };
        assert_eq!(slot(a), slot(b), "round trip changed a device slot");
        assert_eq!(
            (a.memory_limit, a.memory_oversold, a.activate),
            (b.memory_limit, b.memory_oversold, b.activate)
        );
    }
}

/// `devices.json` ([`devices_json::decode`], raw bytes): round trip and stable encoding.
pub fn devices_json(data: &[u8]) {
    let path = Path::new("devices.json");
    let Ok(ids) = devices_json::decode(data, path) else { return };
    let canonical = devices_json::encode(&ids);
    let again = match devices_json::decode(canonical.as_bytes(), path) {
        Ok(v) => v,
        Err(e) => panic!("encoded device IDs do not decode: {e}: {canonical}"),
    };
    assert_eq!(again, ids, "round trip changed the IDs: {canonical}");
    assert_eq!(devices_json::encode(&again), canonical, "encoding is not stable");
}

/// Resource quantities ([`parse_quantity`], a Kubernetes quantity string): a parsed value is consistent with
/// its plain decimal form and with the same text padded and signed.
pub fn quantity(data: &[u8]) {
    let text = text(data);
    let Some(value) = parse_quantity(&text) else { return };
    assert_eq!(parse_quantity(&value.to_string()), Some(value), "decimal form of {text:?}");
    let trimmed = text.trim();
    if !trimmed.starts_with('+') {
        assert_eq!(parse_quantity(&format!(" +{trimmed} ")), Some(value), "padded and signed {text:?}");
    }
    if trimmed.bytes().all(|b| b.is_ascii_digit()) {
        assert_eq!(trimmed.parse::<u64>().ok(), Some(value), "plain integer {text:?}");
    }
}
