//! `pre-allocated` / `real-allocated`: decode; on success, encode, decode again and require the same claim
//! and a stable text.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vgpu_core::codec::pod_devices::{decode_pre_allocated, decode_real_allocated, encode};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let pre = decode_pre_allocated(text);
    // Both annotations share one grammar: the same value decodes the same way under either name.
    assert_eq!(pre.as_ref().ok(), decode_real_allocated(text).as_ref().ok());
    let Ok(claim) = pre else { return };
    let canonical = encode(&claim).expect("a decoded claim encodes");
    let again = decode_pre_allocated(&canonical).expect("an encoded claim decodes");
    assert_eq!(again, claim, "round trip changed the claim: {canonical}");
    assert_eq!(encode(&again).expect("encodes"), canonical, "encoding is not stable");
});
