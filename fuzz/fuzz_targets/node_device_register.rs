//! `node-device-register`: decode; on success, encode, decode again and require the same inventory and a
//! stable (canonical) text.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vgpu_core::codec::node_devices::{decode, encode};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(inventory) = decode(text) else { return };
    let canonical = encode(&inventory).expect("a decoded inventory encodes");
    let again = decode(&canonical).expect("an encoded inventory decodes");
    assert_eq!(again, inventory, "round trip changed the inventory: {canonical}");
    assert_eq!(encode(&again).expect("encodes"), canonical, "encoding is not stable");
});
