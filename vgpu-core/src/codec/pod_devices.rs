//! `pre-allocated` / `real-allocated`: the text form of a [`PodDeviceClaim`].
//!
//! Grammar (whitespace is stripped before parsing):
//!
//! ```text
//! value     = "" | container *( ";" container )
//! container = name "[" [ claim *( "," claim ) ] "]"
//! claim     = index "_" uuid "_" cores "_" memoryMiB
//! ```
//!
//! Example: `main[0_GPU-aaa_50_4096,1_GPU-bbb_50_4096];side[2_GPU-ccc_100_8192]`. Empty segments between
//! `;` (e.g. a trailing `;` left by appending one container at a time) are skipped. A UUID may itself contain
//! `_`: the first field is the index and the last two are cores and memory. Values over 1 MiB are refused.

use super::{CodecError, gojson};
use crate::model::{ContainerDeviceClaim, DeviceClaim, PodDeviceClaim};

/// Largest value accepted (1 MiB).
pub const MAX_VALUE_LEN: usize = 1 << 20;

/// Decodes a `pre-allocated` value (the error names `pre-allocated`).
pub fn decode_pre_allocated(value: &str) -> Result<PodDeviceClaim, CodecError> {
    decode(super::PRE_ALLOCATED, value)
}

/// Decodes a `real-allocated` value (the error names `real-allocated`).
pub fn decode_real_allocated(value: &str) -> Result<PodDeviceClaim, CodecError> {
    decode(super::REAL_ALLOCATED, value)
}

/// Decodes the text form; `annotation` names the input in errors (`pre-allocated` or `real-allocated`).
///
/// ```
/// use vgpu_core::codec::pod_devices;
/// let v = "main[0_GPU-aaa_50_4096,1_GPU-bbb_50_4096];side[2_GPU-ccc_100_8192]";
/// let claim = pod_devices::decode_pre_allocated(v)?;
/// assert_eq!(claim.containers[1].devices[0].memory_mib, 8192);
/// assert_eq!(pod_devices::encode(&claim)?, v);
/// # Ok::<(), vgpu_core::codec::CodecError>(())
/// ```
pub fn decode(annotation: &'static str, value: &str) -> Result<PodDeviceClaim, CodecError> {
    if value.len() > MAX_VALUE_LEN {
        return Err(CodecError::TooLong { annotation, len: value.len(), max: MAX_VALUE_LEN });
    }
    match Plain::read(value) {
        Some(claim) => Ok(claim),
        None => decode_general(annotation, value),
    }
}

/// A fast reader for values that are printable ASCII without whitespace and follow the grammar. It gives
/// up (`None`) at anything else, leaving the value to [`decode_general`], which strips whitespace and words
/// errors; what it does accept, [`decode_general`] decodes to the same claim. Separators are found with
/// `memchr`-backed searches and the bytes in between checked by loops that vectorise (no early exit).
struct Plain;

impl Plain {
    fn read(text: &str) -> Option<PodDeviceClaim> {
        let mut containers = Vec::new();
        // Empty segments are skipped.
        for segment in text.split(';').filter(|s| !s.is_empty()) {
            let (name, rest) = segment.split_once('[')?;
            let body = rest.strip_suffix(']')?;
            if name.is_empty()
                || !name.bytes().fold(true, |ok, b| ok & plain(b))
                || !body.bytes().fold(true, |ok, b| ok & (plain(b) | (b == b',')))
            {
                return None;
            }
            let mut devices = Vec::new();
            if !body.is_empty() {
                for claim in body.split(',') {
                    devices.push(Self::claim(claim)?);
                }
            }
            containers.push(ContainerDeviceClaim { name: name.to_owned(), devices });
        }
        Some(PodDeviceClaim { containers })
    }

    /// `index_uuid_cores_memory`: the first `_` ends the index, the last two start cores and memory (the
    /// index and numbers are short, so plain loops find those `_`).
    fn claim(claim: &str) -> Option<DeviceClaim> {
        let bytes = claim.as_bytes();
        let first = bytes.iter().position(|&b| b == b'_')?;
        let last = bytes.iter().rposition(|&b| b == b'_')?;
        let second_last = bytes.get(..last)?.iter().rposition(|&b| b == b'_')?;
        // The uuid lies strictly between the first `_` and the second-last one.
        let uuid = claim.get(first + 1..second_last).filter(|uuid| !uuid.is_empty())?;
        Some(DeviceClaim {
            index: u32::try_from(parse_num(claim.get(..first)?)?).ok()?,
            uuid: uuid.to_owned(),
            cores: parse_num(claim.get(second_last + 1..last)?)?,
            memory_mib: parse_num(claim.get(last + 1..)?)?,
        })
    }
}

/// The general decoder: strips whitespace, then checks the grammar step by step to word the error.
fn decode_general(annotation: &'static str, value: &str) -> Result<PodDeviceClaim, CodecError> {
    // Only ASCII whitespace or a non-ASCII byte (which may start Unicode whitespace) needs the slow strip.
    let text: std::borrow::Cow<'_, str> = if value.bytes().any(|b| is_ascii_space(b) || !b.is_ascii()) {
        value.chars().filter(|c| !c.is_whitespace()).collect::<String>().into()
    } else {
        value.into()
    };
    let syntax = |location: String, expected: &'static str, found: &str| CodecError::Syntax {
        annotation,
        location,
        expected,
        found: found.to_owned(),
    };
    let mut containers = Vec::new();
    for (pos, segment) in text.split(';').enumerate().filter(|(_, s)| !s.is_empty()) {
        let loc = || format!("container segment {pos}");
        let (name, rest) =
            segment.split_once('[').ok_or_else(|| syntax(loc(), "name[claims] (missing '[')", segment))?;
        if name.is_empty() || name.bytes().any(|b| b == b']' || b == b',') {
            return Err(syntax(loc(), "a non-empty container name before '['", segment));
        }
        let body =
            rest.strip_suffix(']').ok_or_else(|| syntax(loc(), "name[claims] ending with ']'", segment))?;
        if body.bytes().any(|b| b == b'[' || b == b']') {
            return Err(syntax(loc(), "one [...] list per container", segment));
        }
        let mut devices = Vec::new();
        if !body.is_empty() {
            for (ci, claim) in body.split(',').enumerate() {
                let cloc = || format!("container {name:?} claim {ci}");
                devices.push(decode_claim(claim).map_err(|expected| syntax(cloc(), expected, claim))?);
            }
        }
        containers.push(ContainerDeviceClaim { name: name.to_owned(), devices });
    }
    Ok(PodDeviceClaim { containers })
}

/// ASCII whitespace as [`char::is_whitespace`] sees it (which includes the vertical tab `\x0b`).
const fn is_ascii_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t'..=b'\r')
}

fn decode_claim(claim: &str) -> Result<DeviceClaim, &'static str> {
    const SHAPE: &str = "index_uuid_cores_memory";
    let (index, rest) = claim.split_once('_').ok_or(SHAPE)?;
    let (rest, memory) = rest.rsplit_once('_').ok_or(SHAPE)?;
    let (uuid, cores) = rest.rsplit_once('_').ok_or(SHAPE)?;
    if uuid.is_empty() {
        return Err("a non-empty uuid in index_uuid_cores_memory");
    }
    Ok(DeviceClaim {
        index: parse_num(index)
            .and_then(|i| u32::try_from(i).ok())
            .ok_or("a non-negative integer gpu index in index_uuid_cores_memory")?,
        uuid: uuid.to_owned(),
        cores: parse_num(cores).ok_or("a non-negative integer cores in index_uuid_cores_memory")?,
        memory_mib: parse_num(memory)
            .ok_or("a non-negative integer memory (MiB) in index_uuid_cores_memory")?,
    })
}

/// Decimal digits only, `None` on overflow (Go's `strconv.Atoi` would also take a sign; negative values are
/// meaningless here).
fn parse_num(s: &str) -> Option<u64> {
    if s.is_empty() {
        return None;
    }
    s.bytes().try_fold(0u64, |acc, b| {
        let digit = b.checked_sub(b'0').filter(|&d| d <= 9)?;
        acc.checked_mul(10)?.checked_add(u64::from(digit))
    })
}

/// Encodes the text form. Fails when a container name or UUID is empty or contains a character the grammar
/// reserves (`[ ] ; ,` or whitespace), so that every encoded value
/// decodes back to the same claim.
pub fn encode(claim: &PodDeviceClaim) -> Result<String, CodecError> {
    // Name, brackets and separator per container; uuid, three numbers (at most 20 digits) and separators
    // per claim.
    let capacity = claim
        .containers
        .iter()
        .map(|c| c.name.len() + 3 + c.devices.iter().map(|d| d.uuid.len() + 64).sum::<usize>())
        .sum();
    let mut out = String::with_capacity(capacity);
    for (pos, c) in claim.containers.iter().enumerate() {
        check_token(pos, "container name", &c.name)?;
        if pos > 0 {
            out.push(';');
        }
        out.push_str(&c.name);
        out.push('[');
        for (i, d) in c.devices.iter().enumerate() {
            check_token(pos, "uuid", &d.uuid)?;
            if i > 0 {
                out.push(',');
            }
            gojson::write_u64(&mut out, u64::from(d.index));
            out.push('_');
            out.push_str(&d.uuid);
            out.push('_');
            gojson::write_u64(&mut out, d.cores);
            out.push('_');
            gojson::write_u64(&mut out, d.memory_mib);
        }
        out.push(']');
    }
    Ok(out)
}

/// Printable ASCII other than the reserved characters, as comparisons that vectorise.
fn plain(b: u8) -> bool {
    (b > b' ') & (b < 0x7f) & (b != b'[') & (b != b']') & (b != b';') & (b != b',')
}

/// A character the grammar reserves in names and UUIDs.
const fn is_reserved(c: char) -> bool {
    matches!(c, '[' | ']' | ';' | ',')
}

fn check_token(pos: usize, field: &'static str, value: &str) -> Result<(), CodecError> {
    // Fast path: a non-empty token of printable ASCII other than the reserved characters (checked without
    // stopping early, so that the loop vectorises).
    if !value.is_empty() && value.bytes().fold(true, |ok, b| ok & plain(b)) {
        return Ok(());
    }
    let problem = if value.is_empty() {
        Some("is empty".to_owned())
    } else {
        value
            .chars()
            .find(|&c| is_reserved(c) || c.is_whitespace())
            .map(|c| format!("{value:?} contains the reserved character {c:?}"))
    };
    match problem {
        None => Ok(()),
        Some(problem) => Err(CodecError::Unencodable {
            annotation: "pre-allocated/real-allocated",
            location: format!("container {pos}"),
            field,
            problem,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::PRE_ALLOCATED;
    use proptest::prelude::*;

    const EXAMPLE: &str = "main[0_GPU-aaa_50_4096,1_GPU-bbb_50_4096];side[2_GPU-ccc_100_8192]";

    fn dc(index: u32, uuid: &str, cores: u64, memory_mib: u64) -> DeviceClaim {
        DeviceClaim { index, uuid: uuid.into(), cores, memory_mib }
    }

    #[test]
    fn contract_example() {
        let claim = decode_pre_allocated(EXAMPLE).unwrap();
        assert_eq!(
            claim,
            PodDeviceClaim {
                containers: vec![
                    ContainerDeviceClaim {
                        name: "main".into(),
                        devices: vec![dc(0, "GPU-aaa", 50, 4096), dc(1, "GPU-bbb", 50, 4096)]
                    },
                    ContainerDeviceClaim { name: "side".into(), devices: vec![dc(2, "GPU-ccc", 100, 8192)] },
                ]
            }
        );
        assert_eq!(encode(&claim).unwrap(), EXAMPLE);
    }

    #[test]
    fn pinned_forms() {
        // Upstream types_test.go shapes.
        let uuid = "GPU-49aa2e6a-33f3-99dd-e08b-ea4beb0e0d28";
        let one = format!("cont1[0_{uuid}_0_1024]");
        let c = decode_real_allocated(&one).unwrap();
        assert_eq!(c.containers[0].devices[0], dc(0, uuid, 0, 1024));
        assert_eq!(encode(&c).unwrap(), one);
        let empty = decode_real_allocated("cont1[]").unwrap();
        assert!(empty.containers[0].devices.is_empty());
        assert_eq!(encode(&empty).unwrap(), "cont1[]");
        assert!(decode_real_allocated("").unwrap().is_empty());
        assert_eq!(encode(&PodDeviceClaim::default()).unwrap(), "");
        // Whitespace stripped, trailing ';' tolerated, '_' inside a uuid.
        let c = decode_pre_allocated(" main [ 0_GPU-a_b_50_4096 ] ;\n").unwrap();
        assert_eq!(c.containers[0].devices[0].uuid, "GPU-a_b");
        assert_eq!(encode(&c).unwrap(), "main[0_GPU-a_b_50_4096]");
    }

    #[test]
    fn errors_name_annotation_and_place() {
        let e = decode_pre_allocated("main[0_GPU-aaa_x_4096]").unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid pre-allocated value: container \"main\" claim 0: expected a non-negative integer cores in index_uuid_cores_memory, found \"0_GPU-aaa_x_4096\""
        );
        let e = decode_real_allocated("main0_GPU-aaa_50_4096").unwrap_err().to_string();
        assert!(
            e.starts_with("invalid real-allocated value: container segment 0: expected name[claims]"),
            "{e}"
        );
        for bad in
            ["main[", "[0_a_1_2]", "a[0_a_1]", "a[-1_a_1_2]", "a[0__1_2]", "a[]]", "a[[]]", "a[0_u_1_2,]"]
        {
            assert!(decode_pre_allocated(bad).is_err(), "{bad}");
        }
        let long = "a".repeat(MAX_VALUE_LEN + 1);
        assert!(matches!(decode_pre_allocated(&long), Err(CodecError::TooLong { .. })));
        let bad =
            PodDeviceClaim { containers: vec![ContainerDeviceClaim { name: "a b".into(), devices: vec![] }] };
        assert!(encode(&bad).unwrap_err().to_string().contains("reserved character ' '"));
    }

    /// When the single-pass reader takes a value, the general decoder decodes it to the same claim.
    fn plain_agrees(text: &str) -> Result<(), TestCaseError> {
        if let Some(fast) = Plain::read(text) {
            prop_assert_eq!(Some(fast), decode_general(PRE_ALLOCATED, text).ok(), "{}", text);
        }
        Ok(())
    }

    fn arb_claim() -> impl Strategy<Value = PodDeviceClaim> {
        let device = (any::<u32>(), ".{0,12}", any::<u64>(), any::<u64>())
            .prop_map(|(index, uuid, cores, memory_mib)| DeviceClaim { index, uuid, cores, memory_mib });
        let container = (".{0,10}", proptest::collection::vec(device, 0..5))
            .prop_map(|(name, devices)| ContainerDeviceClaim { name, devices });
        proptest::collection::vec(container, 0..5).prop_map(|containers| PodDeviceClaim { containers })
    }

    fn arb_valid_claim() -> impl Strategy<Value = PodDeviceClaim> {
        let device = (any::<u32>(), "GPU-[0-9a-f_-]{1,36}", any::<u64>(), any::<u64>())
            .prop_map(|(index, uuid, cores, memory_mib)| DeviceClaim { index, uuid, cores, memory_mib });
        let container = ("[a-z0-9][a-z0-9-]{0,20}", proptest::collection::vec(device, 0..5))
            .prop_map(|(name, devices)| ContainerDeviceClaim { name, devices });
        proptest::collection::vec(container, 0..17).prop_map(|containers| PodDeviceClaim { containers })
    }

    proptest! {
        #[test]
        fn never_panics(s in ".*") {
            let _ = decode_pre_allocated(&s);
        }

        #[test]
        fn never_panics_on_grammar_like(s in r"([a-z_\[\];,0-9 -]{0,12}){0,6}") {
            let _ = decode_real_allocated(&s);
        }

        #[test]
        fn plain_reader_agrees_with_general(s in r"([a-z_\[\];,0-9 é-]{0,12}){0,6}") {
            plain_agrees(&s)?;
        }

        #[test]
        fn plain_reader_takes_what_encode_writes(claim in arb_valid_claim()) {
            let text = encode(&claim).unwrap();
            prop_assert!(Plain::read(&text).is_some(), "{}", text);
            plain_agrees(&text)?;
        }

        #[test]
        fn round_trip_valid(claim in arb_valid_claim()) {
            let text = encode(&claim).unwrap();
            prop_assert_eq!(decode_pre_allocated(&text).unwrap(), claim);
        }

        #[test]
        fn encode_ok_implies_round_trip(claim in arb_claim()) {
            if let Ok(text) = encode(&claim) {
                prop_assert_eq!(decode_pre_allocated(&text).unwrap(), claim);
            }
        }
    }
}
