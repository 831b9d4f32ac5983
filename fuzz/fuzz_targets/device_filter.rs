//! `include-gpu-type` and friends: decode a comma list; the canonical form decodes to the same list, and
//! matching never panics.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vgpu_core::codec::device_filter::{IncludeExclude, SubstringList};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    // The first line is the list, the rest a value to match against it.
    let (list, value) = text.split_once('\n').unwrap_or((text, ""));
    let filter = IncludeExclude::decode(Some(list), Some(value));
    let _ = filter.admits(value);
    let Some(parsed) = SubstringList::decode(list) else { return };
    let canonical = parsed.encode();
    let again = SubstringList::decode(&canonical).expect("a canonical list is not empty");
    assert_eq!(again, parsed, "round trip changed the list: {canonical:?}");
    assert_eq!(again.encode(), canonical, "encoding is not stable");
    let _ = parsed.matches(value);
});
