//! `node-device-register`: the JSON array of `DeviceInfo` the device plugin writes on its Node.
//!
//! Wire form (field order as Go writes it):
//! `[{"id":0,"type":"…","uuid":"GPU-…","core":100,"memory":8192,"number":10,"numa":0,"mig":false,"busId":"0000:01:00.0","capability":6.1,"healthy":true}]`
//!
//! Decoding reads what upstream's `ParseNodeDeviceInfo` (`json.Unmarshal`, then a sort by id) reads, where
//! the meaning is unambiguous:
//!
//! * device entries in any order: they are sorted by `id` (upstream sorts too), so the inventory is in id
//!   order whatever the text order;
//! * keys in any letter case (`ID`, `busid`, `BusId`; an exact match wins), duplicate keys (the last wins),
//!   unknown fields ignored (forward compatibility);
//! * a missing field, or a `null` one, is Go's zero value: `0`, `""`, `false` (so a missing `healthy`
//!   reads as unhealthy and a missing `numa` as node 0, as upstream reads them);
//! * Go's `null` for the whole value (a nil slice) is an empty inventory.
//!
//! It refuses what the Go scheduler accepts but then mishandles (it indexes a slice by `id`): ids that are
//! not `0..n-1` each exactly once, negative numbers, a `numa` other than `-1` (unknown) or a node id, a
//! `capability` that is not `major.minor` with one minor digit, and a `null` in place of a whole device
//! (Go would make it an all-zero device 0). Integers must be JSON integers (`100.0` is an error, as in Go).
//! Errors name the device by its position in the text.

use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, Visitor};

use super::goread::{FieldKey, GoInt, set};
use super::{CodecError, NODE_DEVICE_REGISTER, gojson};
use crate::model::{ComputeCapability, DeviceHealth, GpuDevice, NodeDeviceInventory, Vendor};

const ANNOTATION: &str = NODE_DEVICE_REGISTER;

/// The Go struct `DeviceInfo`, with Go's zero values for what is absent.
#[derive(Debug, Default)]
struct WireDevice {
    id: i64,
    type_name: String,
    uuid: String,
    core: i64,
    memory: i64,
    number: i64,
    numa: i64,
    mig: bool,
    bus_id: String,
    capability: f32,
    healthy: bool,
}

/// Field names on the wire, in [`WireDevice`] order.
const FIELDS: &[&str] =
    &["id", "type", "uuid", "core", "memory", "number", "numa", "mig", "busId", "capability", "healthy"];

impl<'de> Deserialize<'de> for WireDevice {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(DeviceVisitor)
    }
}

struct DeviceVisitor;

impl<'de> Visitor<'de> for DeviceVisitor {
    type Value = WireDevice;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a device object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<WireDevice, A::Error> {
        let mut w = WireDevice::default();
        let int = |v: Option<GoInt>| v.map(|v| v.0);
        while let Some(field) = map.next_key_seed(FieldKey(FIELDS))? {
            match field {
                Some(0) => set(&mut w.id, int(map.next_value()?)),
                Some(1) => set(&mut w.type_name, map.next_value()?),
                Some(2) => set(&mut w.uuid, map.next_value()?),
                Some(3) => set(&mut w.core, int(map.next_value()?)),
                Some(4) => set(&mut w.memory, int(map.next_value()?)),
                Some(5) => set(&mut w.number, int(map.next_value()?)),
                Some(6) => set(&mut w.numa, int(map.next_value()?)),
                Some(7) => set(&mut w.mig, map.next_value()?),
                Some(8) => set(&mut w.bus_id, map.next_value()?),
                Some(9) => set(&mut w.capability, map.next_value()?),
                Some(10) => set(&mut w.healthy, map.next_value()?),
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(w)
    }
}

fn field_err(position: usize, field: &'static str, expected: &'static str, got: String) -> CodecError {
    CodecError::Field {
        annotation: ANNOTATION,
        location: format!("device at position {position}"),
        field,
        expected,
        got,
    }
}

/// Decodes a `node-device-register` value.
///
/// ```
/// let v = r#"[{"id":0,"type":"NVIDIA A10","uuid":"GPU-1","core":100,"memory":23028,"number":10,"numa":-1,"mig":false,"busId":"0000:17:00.0","capability":8.6,"healthy":true}]"#;
/// let inv = vgpu_core::codec::node_devices::decode(v)?;
/// assert_eq!(inv.devices[0].numa_node, None);
/// assert_eq!(vgpu_core::codec::node_devices::encode(&inv)?, v);
/// # Ok::<(), vgpu_core::codec::CodecError>(())
/// ```
pub fn decode(value: &str) -> Result<NodeDeviceInventory, CodecError> {
    if let Some(devices) = Canonical::read(value) {
        return Ok(NodeDeviceInventory { devices });
    }
    from_wire(decode_wire(value)?)
}

/// The general reader: any JSON Go reads (whitespace, any field order and letter case, escapes, duplicate,
/// missing and unknown fields, `null`).
fn decode_wire(value: &str) -> Result<Vec<WireDevice>, CodecError> {
    let wire: Option<Vec<WireDevice>> = serde_json::from_str(value).map_err(|source| CodecError::Json {
        annotation: ANNOTATION,
        expected: "a JSON array of device objects {id,type,uuid,core,memory,number,numa,mig,busId,capability,healthy}",
        source,
    })?;
    Ok(wire.unwrap_or_default())
}

/// A fast reader for the canonical form, the one Go's `json.Marshal` (and [`encode`]) writes: fields in
/// order, no whitespace, no escapes in strings, integers without leading zeros, capability `major` or
/// `major.minor`. It gives up (`None`) at the first deviation or invalid device, leaving the value to
/// [`decode_wire`] (which words the error); what it does accept, serde reads as the same values.
struct Canonical<'a> {
    text: &'a str,
    pos: usize,
}

impl<'a> Canonical<'a> {
    fn read(text: &'a str) -> Option<Vec<GpuDevice>> {
        let mut r = Canonical { text, pos: 0 };
        r.lit("[")?;
        // A device takes at least 160 bytes of text.
        let mut devices = Vec::with_capacity(text.len() / 160);
        if r.lit("]").is_none() {
            loop {
                let pos = devices.len();
                // Ids out of order are left to the general reader, which sorts.
                devices.push(
                    from_wire_device(pos, r.device()?)
                        .ok()
                        .filter(|d| usize::try_from(d.index).ok() == Some(pos))?,
                );
                if r.lit(",").is_none() {
                    r.lit("]")?;
                    break;
                }
            }
        }
        (r.pos == text.len()).then_some(devices)
    }

    fn device(&mut self) -> Option<WireDevice> {
        self.lit("{\"id\":")?;
        let id = self.int()?;
        self.lit(",\"type\":")?;
        let type_name = self.string()?;
        self.lit(",\"uuid\":")?;
        let uuid = self.string()?;
        self.lit(",\"core\":")?;
        let core = self.int()?;
        self.lit(",\"memory\":")?;
        let memory = self.int()?;
        self.lit(",\"number\":")?;
        let number = self.int()?;
        self.lit(",\"numa\":")?;
        let numa = self.int()?;
        self.lit(",\"mig\":")?;
        let mig = self.bool()?;
        self.lit(",\"busId\":")?;
        let bus_id = self.string()?;
        self.lit(",\"capability\":")?;
        let capability = self.capability()?;
        self.lit(",\"healthy\":")?;
        let healthy = self.bool()?;
        self.lit("}")?;
        Some(WireDevice {
            id,
            type_name: type_name.to_owned(),
            uuid: uuid.to_owned(),
            core,
            memory,
            number,
            numa,
            mig,
            bus_id: bus_id.to_owned(),
            capability,
            healthy,
        })
    }

    fn rest(&self) -> &'a [u8] {
        self.text.as_bytes().get(self.pos..).unwrap_or_default()
    }

    fn lit(&mut self, lit: &str) -> Option<()> {
        self.rest().starts_with(lit.as_bytes()).then(|| self.pos += lit.len())
    }

    fn bool(&mut self) -> Option<bool> {
        if self.lit("true").is_some() { Some(true) } else { self.lit("false").map(|()| false) }
    }

    /// A string with no escape and no control character (serde refuses raw control characters).
    fn string(&mut self) -> Option<&'a str> {
        self.lit("\"")?;
        let start = self.pos;
        loop {
            match self.text.as_bytes().get(self.pos)? {
                b'"' => break,
                &b if b == b'\\' || b < 0x20 => return None,
                _ => self.pos += 1,
            }
        }
        let s = self.text.get(start..self.pos)?;
        self.pos += 1;
        Some(s)
    }

    /// Digits without a leading zero (JSON forbids them) that fit an `i64`.
    fn digits(&mut self) -> Option<i64> {
        let start = self.pos;
        let mut value = 0i64;
        while let Some(&b) = self.text.as_bytes().get(self.pos) {
            let digit = b.wrapping_sub(b'0');
            if digit > 9 {
                break;
            }
            value = value.checked_mul(10)?.checked_add(i64::from(digit))?;
            self.pos += 1;
        }
        let len = self.pos - start;
        // A leading zero is only allowed alone.
        if len == 0 || (len > 1 && self.text.as_bytes().get(start) == Some(&b'0')) {
            return None;
        }
        Some(value)
    }

    /// An integer; a negative zero is left to serde.
    fn int(&mut self) -> Option<i64> {
        if self.lit("-").is_some() {
            return self.digits().filter(|&v| v != 0).map(|v| -v);
        }
        self.digits()
    }

    /// `major` or `major.minor` with one minor digit and a major below 100 000: the `f32` serde reads
    /// (`major` as an integer, else the `f64` quotient `tenths / 10` rounded to `f32`) is exactly
    /// [`ComputeCapability::as_f32`]. Anything else (`6.10`, `6e0`) is left to serde.
    fn capability(&mut self) -> Option<f32> {
        let major = u32::try_from(self.digits()?).ok().filter(|&m| m < 100_000)?;
        let minor = match self.lit(".") {
            Some(()) => {
                let minor = match self.rest() {
                    [d @ b'0'..=b'9', next, ..] if !next.is_ascii_digit() => u32::from(d - b'0'),
                    _ => return None,
                };
                self.pos += 1;
                minor
            }
            None => 0,
        };
        Some(ComputeCapability { major, minor }.as_f32())
    }
}

/// Checks and converts every device, then sorts them by id (as upstream does) and requires ids `0..n-1`.
fn from_wire(wire: Vec<WireDevice>) -> Result<NodeDeviceInventory, CodecError> {
    let n = wire.len();
    let mut devices = wire
        .into_iter()
        .enumerate()
        .map(|(pos, w)| from_wire_device(pos, w).map(|d| (pos, d)))
        .collect::<Result<Vec<_>, _>>()?;
    // Canonical values are already in order; sorting them is one pass.
    devices.sort_by_key(|(_, d)| d.index);
    if let Some((pos, d)) = devices
        .iter()
        .enumerate()
        .find(|(i, (_, d))| usize::try_from(d.index).ok() != Some(*i))
        .map(|(_, x)| x)
    {
        return Err(field_err(*pos, "id", ids_expected(n), d.index.to_string()));
    }
    Ok(NodeDeviceInventory { devices: devices.into_iter().map(|(_, d)| d).collect() })
}

/// What the ids must be, for an error message.
fn ids_expected(n: usize) -> &'static str {
    if n == 1 { "0 (the only device)" } else { "each of 0..n-1 exactly once, n being the number of devices" }
}

/// Checks and converts the device at `pos` in the text; its `id` only has to be a possible index here.
fn from_wire_device(pos: usize, w: WireDevice) -> Result<GpuDevice, CodecError> {
    let index = u32::try_from(w.id).map_err(|_| {
        field_err(pos, "id", "a device index 0..n-1 (ids are 0..n-1 in any order)", w.id.to_string())
    })?;
    let cores = u64::try_from(w.core)
        .map_err(|_| field_err(pos, "core", "a non-negative integer", w.core.to_string()))?;
    let memory_mib = u64::try_from(w.memory)
        .map_err(|_| field_err(pos, "memory", "a non-negative integer (MiB)", w.memory.to_string()))?;
    let split_count = u32::try_from(w.number)
        .map_err(|_| field_err(pos, "number", "a non-negative 32-bit integer", w.number.to_string()))?;
    let numa_node = match w.numa {
        -1 => None,
        n => Some(
            u32::try_from(n)
                .map_err(|_| field_err(pos, "numa", "-1 (unknown) or a NUMA node id", n.to_string()))?,
        ),
    };
    let capability = ComputeCapability::from_f32(w.capability).ok_or_else(|| {
        field_err(
            pos,
            "capability",
            "a compute capability major.minor (one minor digit)",
            w.capability.to_string(),
        )
    })?;
    Ok(GpuDevice {
        index,
        uuid: w.uuid,
        type_name: w.type_name,
        vendor: Vendor::Nvidia,
        memory_mib,
        cores,
        split_count,
        numa_node,
        mig_enabled: w.mig,
        bus_id: w.bus_id,
        capability,
        health: DeviceHealth::from_bool(w.healthy),
    })
}

/// Encodes an inventory exactly as Go's `json.Marshal` would. Fails when a device's index is not its position
/// or a number does not fit Go's `int64`.
pub fn encode(inventory: &NodeDeviceInventory) -> Result<String, CodecError> {
    let unencodable = |pos: usize, field: &'static str, problem: String| CodecError::Unencodable {
        annotation: ANNOTATION,
        location: format!("device at position {pos}"),
        field,
        problem,
    };
    // Fixed text plus the numbers of one device is under 200 bytes; the strings are added to that.
    let capacity = inventory
        .devices
        .iter()
        .map(|d| 200 + d.type_name.len() + d.uuid.len() + d.bus_id.len())
        .fold(2, usize::saturating_add);
    let mut out = String::with_capacity(capacity);
    out.push('[');
    for (pos, d) in inventory.devices.iter().enumerate() {
        if usize::try_from(d.index).ok() != Some(pos) {
            return Err(unencodable(pos, "id", format!("is {}, must equal the position", d.index)));
        }
        let core = i64::try_from(d.cores)
            .map_err(|_| unencodable(pos, "core", format!("{} overflows int64", d.cores)))?;
        let memory = i64::try_from(d.memory_mib)
            .map_err(|_| unencodable(pos, "memory", format!("{} overflows int64", d.memory_mib)))?;
        if pos > 0 {
            out.push(',');
        }
        out.push_str("{\"id\":");
        gojson::write_u64(&mut out, u64::from(d.index));
        out.push_str(",\"type\":");
        gojson::write_string(&mut out, &d.type_name);
        out.push_str(",\"uuid\":");
        gojson::write_string(&mut out, &d.uuid);
        out.push_str(",\"core\":");
        gojson::write_i64(&mut out, core);
        out.push_str(",\"memory\":");
        gojson::write_i64(&mut out, memory);
        out.push_str(",\"number\":");
        gojson::write_u64(&mut out, u64::from(d.split_count));
        out.push_str(",\"numa\":");
        gojson::write_i64(&mut out, d.numa_node.map_or(-1, i64::from));
        out.push_str(if d.mig_enabled { ",\"mig\":true,\"busId\":" } else { ",\"mig\":false,\"busId\":" });
        gojson::write_string(&mut out, &d.bus_id);
        out.push_str(",\"capability\":");
        write_capability(&mut out, d.capability)
            .ok_or_else(|| unencodable(pos, "capability", "is not finite".to_owned()))?;
        out.push_str(if d.health.is_healthy() { ",\"healthy\":true}" } else { ",\"healthy\":false}" });
    }
    out.push(']');
    Ok(out)
}

/// Appends Go's form of the capability's `float32` wire value; `None` if that value is not finite.
///
/// Below major 100 000 with a one-digit minor, the text is `major` or `major.minor`: the `f32` is then
/// within 2^-8 of `major.minor` while any other number with at most one decimal is at least 0.1 away,
/// so no shorter or equally short decimal reads back as the same `f32`. Other values take the general path.
fn write_capability(out: &mut String, cap: ComputeCapability) -> Option<()> {
    if cap.major < 100_000 && cap.minor <= 9 {
        gojson::write_u64(out, u64::from(cap.major));
        if cap.minor != 0 {
            out.push('.');
            gojson::write_u64(out, u64::from(cap.minor));
        }
        return Some(());
    }
    out.push_str(&gojson::format_f32(cap.as_f32())?);
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const EXAMPLE: &str = r#"[{"id":0,"type":"NVIDIA GeForce GTX 1050 Ti","uuid":"GPU-49aa2e6a-33f3-99dd-e08b-ea4beb0e0d28","core":100,"memory":8192,"number":10,"numa":0,"mig":false,"busId":"0000:01:00.0","capability":6.1,"healthy":true}]"#;

    #[test]
    fn contract_example() {
        let inv = decode(EXAMPLE).unwrap();
        assert_eq!(inv.len(), 1);
        let d = &inv.devices[0];
        assert_eq!(d.index, 0);
        assert_eq!(d.type_name, "NVIDIA GeForce GTX 1050 Ti");
        assert_eq!(d.uuid, "GPU-49aa2e6a-33f3-99dd-e08b-ea4beb0e0d28");
        assert_eq!(d.cores, 100);
        assert_eq!(d.memory_mib, 8192);
        assert_eq!(d.split_count, 10);
        assert_eq!(d.numa_node, Some(0));
        assert!(!d.mig_enabled);
        assert_eq!(d.bus_id, "0000:01:00.0");
        assert_eq!(d.capability, ComputeCapability { major: 6, minor: 1 });
        assert_eq!(d.health, DeviceHealth::Healthy);
        assert_eq!(encode(&inv).unwrap(), EXAMPLE);
    }

    #[test]
    fn pinned_forms() {
        assert_eq!(encode(&NodeDeviceInventory::default()).unwrap(), "[]");
        assert!(decode("null").unwrap().is_empty());
        let two = r#"[{"id":0,"type":"A<&>","uuid":"u0","core":200,"memory":0,"number":0,"numa":-1,"mig":true,"busId":"","capability":8,"healthy":false},{"id":1,"type":"B","uuid":"u1","core":100,"memory":81920,"number":4,"numa":1,"mig":false,"busId":"0000:02:00.0","capability":9,"healthy":true}]"#;
        let inv = decode(two).unwrap();
        assert_eq!(inv.devices[0].type_name, "A<&>");
        assert_eq!(inv.devices[0].numa_node, None);
        assert_eq!(encode(&inv).unwrap().replace("\\u003c\\u0026\\u003e", "<&>"), two);
    }

    #[test]
    fn errors_name_annotation_and_field() {
        let bad_id = EXAMPLE.replace("\"id\":0", "\"id\":3");
        assert_eq!(
            decode(&bad_id).unwrap_err().to_string(),
            "invalid node-device-register value: device at position 0: field \"id\" is 3, expected 0 (the only device)"
        );
        let e = decode(&format!("[{},{}]", &EXAMPLE[1..EXAMPLE.len() - 1], &EXAMPLE[1..EXAMPLE.len() - 1]))
            .unwrap_err()
            .to_string();
        assert!(
            e.ends_with("device at position 1: field \"id\" is 0, expected each of 0..n-1 exactly once, n being the number of devices"),
            "{e}"
        );
        let e = decode(&EXAMPLE.replace("\"id\":0", "\"id\":-1")).unwrap_err().to_string();
        assert!(e.contains("field \"id\" is -1, expected a device index"), "{e}");
        let e = decode(&EXAMPLE.replace("\"numa\":0", "\"numa\":-2")).unwrap_err().to_string();
        assert!(e.contains("field \"numa\" is -2"), "{e}");
        let e = decode(&EXAMPLE.replace("\"core\":100", "\"core\":-1")).unwrap_err().to_string();
        assert!(e.contains("field \"core\" is -1"), "{e}");
        let e = decode(&EXAMPLE.replace("6.1", "6.15")).unwrap_err().to_string();
        assert!(e.contains("capability"), "{e}");
        for bad in [
            "{}",
            "",
            "[null]",
            r#"[{"id":0.0}]"#,
            r#"[{"id":"0"}]"#,
            r#"[{"core":1e2}]"#,
            r#"[{"mig":1}]"#,
            r#"[{"uuid":5}]"#,
            r#"[[0,"T4"]]"#,
        ] {
            let e = decode(bad).unwrap_err().to_string();
            assert!(e.starts_with("invalid node-device-register value: expected a JSON array"), "{bad}: {e}");
        }
        let e = decode("[null]").unwrap_err().to_string();
        assert!(e.contains("invalid type: null, expected a device object"), "{e}");
    }

    /// What Go's `json.Unmarshal` (and upstream's sort by id) accepts and means unambiguously decodes here.
    #[test]
    fn go_leniency() {
        let canonical = decode(EXAMPLE).unwrap();
        // Keys in any letter case; duplicates (the last wins); `null` keeps the earlier value.
        let recased = EXAMPLE
            .replace("\"id\"", "\"ID\"")
            .replace("\"busId\"", "\"busid\"")
            .replace("\"capability\"", "\"Capability\"")
            .replace("\"ID\"", "\"type\":\"x\",\"ID\"")
            .replace("\"uuid\"", "\"UUID\":null,\"uuid\"");
        assert_eq!(decode(&recased).unwrap(), canonical);
        let dup = EXAMPLE.replace("\"core\":100", "\"core\":-5,\"Core\":100,\"CORE\":null");
        assert_eq!(decode(&dup).unwrap(), canonical);
        // Missing fields are Go's zero values; unknown fields are skipped.
        let sparse = decode(r#"[{"id":0,"uuid":"GPU-a","extra":{"a":[1]}}]"#).unwrap();
        assert_eq!(
            sparse.devices,
            [GpuDevice {
                index: 0,
                uuid: "GPU-a".into(),
                numa_node: Some(0),
                health: DeviceHealth::from_bool(false),
                ..GpuDevice::default()
            }]
        );
        assert_eq!(decode("[{}]").unwrap().devices[0].uuid, "");
        // Entries in any id order are sorted by id, as upstream does.
        let two = |a: &str, b: &str| {
            format!(
                r#"[{{"id":{a},"type":"","uuid":"GPU-{a}","core":100,"memory":1,"number":1,"numa":-1,"mig":false,"busId":"","capability":8,"healthy":true}},{{"id":{b},"type":"","uuid":"GPU-{b}","core":100,"memory":1,"number":1,"numa":-1,"mig":false,"busId":"","capability":8,"healthy":true}}]"#
            )
        };
        let swapped = decode(&two("1", "0")).unwrap();
        assert_eq!(swapped, decode(&two("0", "1")).unwrap());
        assert_eq!(swapped.devices[1].uuid, "GPU-1");
        assert_eq!(encode(&swapped).unwrap(), two("0", "1"));
        // Go reads `-0` into an int as 0.
        let negative_zero = decode(&two("-0", "1")).unwrap();
        assert_eq!((negative_zero.devices[0].index, negative_zero.devices[0].uuid.as_str()), (0, "GPU--0"));
    }

    pub(crate) fn arb_device() -> impl Strategy<Value = GpuDevice> {
        (
            ".{0,24}",
            ".{0,40}",
            0u64..=i64::MAX as u64,
            0u64..=i64::MAX as u64,
            any::<u32>(),
            proptest::option::of(any::<u32>()),
            any::<bool>(),
            "[0-9a-f:.]{0,16}",
            (0u32..1000, 0u32..10),
            any::<bool>(),
        )
            .prop_map(
                |(type_name, uuid, cores, memory_mib, split_count, numa_node, mig, bus_id, (ma, mi), h)| {
                    GpuDevice {
                        index: 0,
                        uuid,
                        type_name,
                        vendor: Vendor::Nvidia,
                        memory_mib,
                        cores,
                        split_count,
                        numa_node,
                        mig_enabled: mig,
                        bus_id,
                        capability: ComputeCapability { major: ma, minor: mi },
                        health: DeviceHealth::from_bool(h),
                    }
                },
            )
    }

    /// Replacements for one byte of a canonical value, near the edges of what the fast reader takes.
    const EDITS: &[&str] = &[
        "",
        " ",
        "0",
        "1",
        "-",
        "-0",
        ".",
        ".0",
        "e",
        "E1",
        "\"",
        "\\",
        "\\n",
        "\n",
        "\u{1}",
        "00",
        ",",
        "]",
        "}",
        "[",
        "null",
        "true",
        "false",
        "99999999999999999999",
        "é",
        "\u{2028}",
        ".10",
        "1.5e1",
    ];

    /// When the fast reader takes a value, serde takes it too and decodes the same inventory.
    fn readers_agree(text: &str) -> Result<(), TestCaseError> {
        if let Some(devices) = Canonical::read(text) {
            let slow = decode_wire(text).and_then(from_wire);
            prop_assert!(slow.is_ok(), "serde path refuses {text:?}: {:?}", slow.err());
            prop_assert_eq!(Some(NodeDeviceInventory { devices }), slow.ok(), "{}", text);
        }
        Ok(())
    }

    fn capability_text(cap: ComputeCapability) -> Option<String> {
        let mut out = String::new();
        write_capability(&mut out, cap).map(|()| out)
    }

    #[test]
    fn capability_text_matches_go_float32() {
        let small = (0..2_000u32).flat_map(|major| (0..10).map(move |minor| (major, minor)));
        let edges = [(99_999, 9), (100_000, 0), (100_000, 1), (1_048_576, 2), (u32::MAX, 9), (6, 12)];
        for (major, minor) in small.chain(edges) {
            let cap = ComputeCapability { major, minor };
            assert_eq!(capability_text(cap), gojson::format_f32(cap.as_f32()), "{major}.{minor}");
        }
        assert_eq!(capability_text(ComputeCapability { major: 6, minor: 1 }).unwrap(), "6.1");
        assert_eq!(capability_text(ComputeCapability { major: 9, minor: 0 }).unwrap(), "9");
    }

    proptest! {
        #[test]
        fn capability_text_matches_go_float32_anywhere(major in 0u32..300_000, minor in 0u32..12) {
            let cap = ComputeCapability { major, minor };
            prop_assert_eq!(capability_text(cap), gojson::format_f32(cap.as_f32()));
        }

        #[test]
        fn never_panics(s in ".*") {
            let _ = decode(&s);
        }

        #[test]
        fn never_panics_on_jsonish(s in r#"\[\{("[a-zA-Z]{1,10}":(-?[0-9]{1,20}(\.[0-9]{1,3})?|"[^"]{0,5}"|true|null),?){0,12}\}\]"#) {
            let _ = decode(&s);
        }

        #[test]
        fn canonical_reader_takes_what_encode_writes(devs in proptest::collection::vec(arb_device(), 0..17)) {
            // Escapes in strings are the only reason to give up (these majors are all below 100 000).
            let plain = |s: &mut String| s.retain(|c| c >= ' ' && !"\"\\<>&\u{2028}\u{2029}".contains(c));
            let devices = devs.into_iter().enumerate().map(|(i, mut d)| {
                d.index = i as u32;
                plain(&mut d.type_name);
                plain(&mut d.uuid);
                d
            }).collect();
            let text = encode(&NodeDeviceInventory { devices }).unwrap();
            prop_assert!(Canonical::read(&text).is_some());
            readers_agree(&text)?;
        }

        #[test]
        fn canonical_reader_agrees_with_serde_on_edits(
            devs in proptest::collection::vec(arb_device(), 1..4),
            edits in proptest::collection::vec((any::<prop::sample::Index>(), prop::sample::select(EDITS)), 1..4),
        ) {
            let devices = devs.into_iter().enumerate().map(|(i, mut d)| { d.index = i as u32; d }).collect();
            let mut text = encode(&NodeDeviceInventory { devices }).unwrap().into_bytes();
            for (at, with) in edits {
                let at = at.index(text.len());
                text.splice(at..at + 1, with.bytes());
            }
            if let Ok(text) = String::from_utf8(text) {
                readers_agree(&text)?;
            }
        }

        /// Re-cased keys, shuffled members, duplicates (the last wins), `null` duplicates, unknown members and
        /// shuffled devices decode to the same inventory as the canonical text.
        #[test]
        fn go_equivalent_forms_decode_the_same(
            (inv, text) in proptest::collection::vec(arb_device(), 1..6).prop_flat_map(|devs| {
                let devices: Vec<GpuDevice> =
                    devs.into_iter().enumerate().map(|(i, mut d)| { d.index = i as u32; d }).collect();
                let objects: Vec<_> = devices.iter().map(|d| {
                    let s = |v: &str| serde_json::to_string(v).unwrap_or_default();
                    let members = [
                        ("id", d.index.to_string(), "99", true),
                        ("type", s(&d.type_name), "\"decoy\"", true),
                        ("uuid", s(&d.uuid), "\"GPU-decoy\"", true),
                        ("core", d.cores.to_string(), "-1", true),
                        ("memory", d.memory_mib.to_string(), "-1", true),
                        ("number", d.split_count.to_string(), "-1", true),
                        ("numa", d.numa_node.map_or(-1, i64::from).to_string(), "-7", true),
                        ("mig", d.mig_enabled.to_string(), "true", true),
                        ("busId", s(&d.bus_id), "\"decoy\"", true),
                        ("capability", capability_text(d.capability).unwrap_or_default(), "6.15", true),
                        ("healthy", d.health.is_healthy().to_string(), "false", true),
                    ];
                    crate::codec::goread::testing::go_equivalent_object(&members)
                }).collect();
                (Just(NodeDeviceInventory { devices }), objects.prop_shuffle())
            }).prop_map(|(inv, objects)| (inv, format!("[{}]", objects.join(","))))
        ) {
            prop_assert_eq!(decode(&text).unwrap(), inv, "{}", text);
        }

        #[test]
        fn round_trip(devs in proptest::collection::vec(arb_device(), 0..17)) {
            let devices = devs.into_iter().enumerate().map(|(i, mut d)| { d.index = i as u32; d }).collect();
            let inv = NodeDeviceInventory { devices };
            let text = encode(&inv).unwrap();
            prop_assert_eq!(decode(&text).unwrap(), inv.clone());
            // Our output is also what serde_json reads back as the same JSON.
            let reparsed: serde_json::Value = serde_json::from_str(&text).unwrap();
            prop_assert!(reparsed.is_array());
        }
    }
}
