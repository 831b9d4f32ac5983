//! PCI addresses in the sysfs form `dddd:bb:dd.f` (domain, bus, device, function).

use std::{fmt, str::FromStr};

/// A PCI address. Orders by domain, bus, device, function (the order GPUs are indexed in).
///
/// ```
/// use vgpu_core::discovery::PciAddress;
///
/// let addr: PciAddress = "0000:3b:00.0".parse().unwrap();
/// assert_eq!(addr.bus, 0x3b);
/// assert_eq!(addr.to_string(), "0000:3b:00.0");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PciAddress {
    /// PCI domain (segment); usually 0, wider than 16 bits on some hosts (VMD).
    pub domain: u32,
    /// Bus number.
    pub bus: u8,
    /// Device (slot) number, 0..=31.
    pub device: u8,
    /// Function number, 0..=7.
    pub function: u8,
}

/// The text is not a PCI address `dddd:bb:dd.f`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a PCI address dddd:bb:dd.f")]
pub struct PciAddressError(pub String);

fn hex_field(text: &str, min: usize, max: usize) -> Option<u32> {
    if text.len() < min || text.len() > max || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u32::from_str_radix(text, 16).ok()
}

impl FromStr for PciAddress {
    type Err = PciAddressError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || PciAddressError(super::fields::excerpt(s));
        let (domain, rest) = s.split_once(':').ok_or_else(err)?;
        let (bus, rest) = rest.split_once(':').ok_or_else(err)?;
        let (device, function) = rest.split_once('.').ok_or_else(err)?;
        let domain = hex_field(domain, 4, 8).ok_or_else(err)?;
        let bus = hex_field(bus, 2, 2).and_then(|b| u8::try_from(b).ok()).ok_or_else(err)?;
        let device =
            hex_field(device, 2, 2).and_then(|d| u8::try_from(d).ok()).filter(|d| *d < 32).ok_or_else(err)?;
        let function = hex_field(function, 1, 1)
            .and_then(|f| u8::try_from(f).ok())
            .filter(|f| *f < 8)
            .ok_or_else(err)?;
        Ok(Self { domain, bus, device, function })
    }
}

impl fmt::Display for PciAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:04x}:{:02x}:{:02x}.{:x}", self.domain, self.bus, self.device, self.function)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parse_and_order() {
        let a: PciAddress = "0000:3b:00.0".parse().unwrap();
        let b: PciAddress = "0000:86:00.0".parse().unwrap();
        let c: PciAddress = "10000:01:1f.7".parse().unwrap();
        assert!(a < b && b < c);
        assert_eq!(c.to_string(), "10000:01:1f.7");
        for bad in
            ["", "0000:3b:00", "0000:3b:20.0", "0000:3b:00.8", "00:3b:00.0", "0000:3b:00.0x", "zzzz:00:00.0"]
        {
            assert!(bad.parse::<PciAddress>().is_err(), "{bad}");
        }
    }

    proptest! {
        #[test]
        fn never_panics(s in any::<String>()) {
            let _ = s.parse::<PciAddress>();
        }

        #[test]
        fn round_trips(domain in 0u32..=0xffff, bus in any::<u8>(), device in 0u8..32, function in 0u8..8) {
            let addr = PciAddress { domain, bus, device, function };
            prop_assert_eq!(addr.to_string().parse::<PciAddress>(), Ok(addr));
        }
    }
}
