//! `node-config-info`: decode; on success, encode, decode again and require the same config (floats
//! bit for bit) and a stable text.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vgpu_core::codec::node_config_info::{decode, encode};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(config) = decode(text) else { return };
    let canonical = encode(&config).expect("a decoded config encodes");
    let again = decode(&canonical).expect("an encoded config decodes");
    assert_eq!(again.device_split, config.device_split);
    assert_eq!(again.memory_factor, config.memory_factor);
    assert_eq!(again.cores_scaling.to_bits(), config.cores_scaling.to_bits(), "{canonical}");
    assert_eq!(again.memory_scaling.to_bits(), config.memory_scaling.to_bits(), "{canonical}");
    assert_eq!(encode(&again).expect("encodes"), canonical, "encoding is not stable");
});
