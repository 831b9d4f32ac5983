//! Kubelet device IDs (contract §5.2, §5.3).
//!
//! * vnumber: `"<GPU-UUID>::<i>"`, `i` in `0..split`.
//! * vcore / vmemory: `base64.RawURLEncoding(protobuf varint((i << 8) | gpuIndex))` (`util.MakeDeviceID`),
//!   `gpuIndex` in `0..=255`.

/// The separator of vnumber IDs.
pub const SEPARATOR: &str = "::";

/// `"<uuid>::<i>"`.
pub fn vgpu_device_id(uuid: &str, i: u32) -> String {
    format!("{uuid}{SEPARATOR}{i}")
}

/// The GPU UUID of a vnumber ID (the text before the first `::`), `None` when there is no `::`.
pub fn gpu_uuid_of(id: &str) -> Option<&str> {
    id.split_once(SEPARATOR).map(|(uuid, _)| uuid)
}

/// A vcore/vmemory ID could not be built or parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    /// GPU indices above 255 do not fit the 8 low bits.
    #[error("GPU index {0} does not fit a resource device ID (max 255)")]
    GpuIndex(u32),
    /// The text is not unpadded URL-safe base64 of a varint.
    #[error("{0:?} is not a resource device ID")]
    Malformed(String),
}

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// `MakeDeviceID(i, gpuIndex)`.
pub fn resource_device_id(i: u64, gpu_index: u32) -> Result<String, IdError> {
    if gpu_index > 255 {
        return Err(IdError::GpuIndex(gpu_index));
    }
    let mut varint = Vec::with_capacity(10);
    prost::encoding::encode_varint((i << 8) | u64::from(gpu_index), &mut varint);
    Ok(base64_raw_url(&varint))
}

/// Inverse of [`resource_device_id`]: `(i, gpu_index)`.
pub fn parse_resource_device_id(id: &str) -> Result<(u64, u32), IdError> {
    let bad = || IdError::Malformed(id.chars().take(64).collect());
    let bytes = base64_raw_url_decode(id).ok_or_else(bad)?;
    let mut buf = bytes.as_slice();
    let value = prost::encoding::decode_varint(&mut buf).map_err(|_| bad())?;
    if !buf.is_empty() {
        return Err(bad());
    }
    Ok((value >> 8, (value & 0xff) as u32))
}

fn base64_raw_url(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [chunk[0], chunk.get(1).copied().unwrap_or(0), chunk.get(2).copied().unwrap_or(0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        let chars = chunk.len() + 1;
        for k in 0..chars {
            out.push(char::from(ALPHABET[((n >> (18 - 6 * k)) & 63) as usize]));
        }
    }
    out
}

fn base64_raw_url_decode(text: &str) -> Option<Vec<u8>> {
    if text.len() % 4 == 1 || text.len() > 16 {
        return None;
    }
    let mut out = Vec::new();
    for chunk in text.as_bytes().chunks(4) {
        let mut n = 0u32;
        for (k, c) in chunk.iter().enumerate() {
            let v = ALPHABET.iter().position(|a| a == c)? as u32;
            n |= v << (18 - 6 * k);
        }
        let bytes = n.to_be_bytes();
        out.extend_from_slice(bytes.get(1..chunk.len())?);
        // Non-canonical trailing bits are rejected so that each ID has one spelling.
        let used = (chunk.len() - 1) * 8;
        if n & ((1 << (24 - used)) - 1) != 0 {
            return None;
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vnumber_ids() {
        assert_eq!(vgpu_device_id("GPU-a", 3), "GPU-a::3");
        assert_eq!(gpu_uuid_of("GPU-a::3"), Some("GPU-a"));
        assert_eq!(gpu_uuid_of("GPU-a"), None);
    }

    #[test]
    fn resource_ids_match_go() {
        // varint(0) = [0x00] → "AA"; varint(1<<8 | 2) = 258 = [0x82, 0x02] → "ggI".
        assert_eq!(resource_device_id(0, 0).unwrap(), "AA");
        assert_eq!(resource_device_id(1, 2).unwrap(), "ggI");
        assert_eq!(resource_device_id(0, 255).unwrap(), "_wE");
        assert_eq!(resource_device_id(0, 256), Err(IdError::GpuIndex(256)));
        for (i, g) in [(0, 0), (1, 2), (99, 7), (81919, 255), (u64::MAX >> 8, 3)] {
            let id = resource_device_id(i, g).unwrap();
            assert_eq!(parse_resource_device_id(&id).unwrap(), (i, g), "{id}");
        }
        for bad in ["", "A", "AB", "!!", "gg", "AAAAAAAAAAAAAAAAAAAA"] {
            assert!(parse_resource_device_id(bad).is_err(), "{bad}");
        }
    }
}
