//! The only `unsafe` code of the crate: calls into MetaX's management library `libmxsml.so` through
//! `libloading`.
//!
//! The signatures and structures follow the MXSML 2.3.1 header (`MxSml.h`):
//!
//! ```c
//! mxSmlReturn_t mxSmlInit(void);                                              // 0 = MXSML_Success
//! unsigned int  mxSmlGetDeviceCount(void);
//! mxSmlReturn_t mxSmlGetDeviceInfo(unsigned int deviceId, mxSmlDeviceInfo_t *info);
//! mxSmlReturn_t mxSmlGetMemoryInfo(unsigned int deviceId, mxSmlMemoryInfo_t *info);   // KiB
//! mxSmlReturn_t mxSmlGetDeviceIpUsage(unsigned int deviceId, mxSmlUsageIp_t ip, int *usage);
//! mxSmlReturn_t mxSmlGetDeviceTopology(unsigned int a, unsigned int b, mxSmlGpuTopologyLevel_t *level);
//!
//! typedef struct { unsigned int deviceId; unsigned int type; char bdfId[32]; unsigned int gpuId;
//!                  unsigned int nodeId; char uuid[96]; unsigned int brand; unsigned int mode;
//!                  char deviceName[32]; } mxSmlDeviceInfo_t;
//! typedef struct { long visVramTotal, visVramUse, vramTotal, vramUse, xttTotal, xttUse; } mxSmlMemoryInfo_t;
//! ```
//!
//! `mxSmlInit`, `mxSmlGetDeviceCount` and `mxSmlGetDeviceInfo` are required; the others are optional (a
//! missing symbol makes that query unsupported). The library is not documented as thread-safe, so the
//! backend serialises every call behind a mutex.
#![allow(unsafe_code)]

use std::{
    ffi::{c_char, c_int, c_long, c_uint},
    path::Path,
};

use libloading::Library;

/// `mxSmlDeviceInfo_t`.
#[repr(C)]
#[allow(dead_code, reason = "every field is part of the C layout, not all are read")]
struct RawDeviceInfo {
    device_id: c_uint,
    device_type: c_uint,
    bdf_id: [c_char; 32],
    gpu_id: c_uint,
    node_id: c_uint,
    uuid: [c_char; 96],
    brand: c_uint,
    mode: c_uint,
    device_name: [c_char; 32],
}

/// `mxSmlMemoryInfo_t` (KiB).
#[repr(C)]
#[allow(dead_code, reason = "every field is part of the C layout, not all are read")]
#[derive(Default)]
struct RawMemoryInfo {
    vis_vram_total: c_long,
    vis_vram_use: c_long,
    vram_total: c_long,
    vram_use: c_long,
    xtt_total: c_long,
    xtt_use: c_long,
}

type InitFn = unsafe extern "C" fn() -> c_uint;
type CountFn = unsafe extern "C" fn() -> c_uint;
type InfoFn = unsafe extern "C" fn(c_uint, *mut RawDeviceInfo) -> c_uint;
type MemoryFn = unsafe extern "C" fn(c_uint, *mut RawMemoryInfo) -> c_uint;
type UsageFn = unsafe extern "C" fn(c_uint, c_uint, *mut c_int) -> c_uint;
type TopologyFn = unsafe extern "C" fn(c_uint, c_uint, *mut c_uint) -> c_uint;

/// `MXSML_Usage_Xcore`.
const USAGE_XCORE: c_uint = 4;

/// Device facts from `mxSmlGetDeviceInfo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DeviceInfo {
    pub(crate) bdf_id: String,
    pub(crate) uuid: String,
    pub(crate) name: String,
    /// `mxSmlDeviceVirtualizationMode_t`: 0 bare metal, 1 PF, 2 VF.
    pub(crate) mode: u32,
}

/// A loaded and initialised `libmxsml.so`. The function pointers stay valid while `_library` is alive, which
/// is as long as this value.
pub(crate) struct MxSml {
    count: CountFn,
    info: InfoFn,
    memory: Option<MemoryFn>,
    usage: Option<UsageFn>,
    topology: Option<TopologyFn>,
    _library: Library,
}

impl std::fmt::Debug for MxSml {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MxSml")
            .field("memory", &self.memory.is_some())
            .field("usage", &self.usage.is_some())
            .field("topology", &self.topology.is_some())
            .finish_non_exhaustive()
    }
}

fn text(raw: &[c_char]) -> String {
    // `c_char` is `i8` or `u8` depending on the target; `as u8` keeps the byte either way.
    let bytes: Vec<u8> = raw.iter().map(|c| *c as u8).take_while(|b| *b != 0).collect();
    String::from_utf8_lossy(&bytes).trim().to_owned()
}

fn check(function: &str, code: c_uint) -> Result<(), String> {
    if code == 0 { Ok(()) } else { Err(format!("{function} returned MXSML error {code}")) }
}

impl MxSml {
    /// Loads the library at `path`, resolves the symbols and calls `mxSmlInit`.
    pub(crate) fn load(path: &Path) -> Result<Self, String> {
        // SAFETY: loading a shared library runs its initialisers; `libmxsml.so` is the vendor's management
        // library (or a file the operator named), which is what this backend is meant to load.
        let library = unsafe { Library::new(path) }.map_err(|e| e.to_string())?;
        // SAFETY: the symbol types match the MXSML 2.3.1 declarations in the module docs. Copying the function
        // pointers out of the `Symbol`s is sound because `library` is stored next to them and outlives them.
        let init: InitFn =
            unsafe { library.get::<InitFn>(b"mxSmlInit\0") }.map(|s| *s).map_err(|e| e.to_string())?;
        // SAFETY: as above.
        let count: CountFn = unsafe { library.get::<CountFn>(b"mxSmlGetDeviceCount\0") }
            .map(|s| *s)
            .map_err(|e| e.to_string())?;
        // SAFETY: as above.
        let info: InfoFn = unsafe { library.get::<InfoFn>(b"mxSmlGetDeviceInfo\0") }
            .map(|s| *s)
            .map_err(|e| e.to_string())?;
        // SAFETY: as above; a missing optional symbol is `None`.
        let memory = unsafe { library.get::<MemoryFn>(b"mxSmlGetMemoryInfo\0") }.ok().map(|s| *s);
        // SAFETY: as above.
        let usage = unsafe { library.get::<UsageFn>(b"mxSmlGetDeviceIpUsage\0") }.ok().map(|s| *s);
        // SAFETY: as above.
        let topology = unsafe { library.get::<TopologyFn>(b"mxSmlGetDeviceTopology\0") }.ok().map(|s| *s);
        // SAFETY: `mxSmlInit` takes no arguments; the header says to call it once before anything else.
        check("mxSmlInit", unsafe { init() })?;
        Ok(Self { count, info, memory, usage, topology, _library: library })
    }

    /// `mxSmlGetDeviceCount` (physical and VF devices).
    pub(crate) fn device_count(&self) -> u32 {
        // SAFETY: no arguments; the library is initialised.
        unsafe { (self.count)() }
    }

    /// `mxSmlGetDeviceInfo`.
    pub(crate) fn device_info(&self, device: u32) -> Result<DeviceInfo, String> {
        let mut raw = RawDeviceInfo {
            device_id: 0,
            device_type: 0,
            bdf_id: [0; 32],
            gpu_id: 0,
            node_id: 0,
            uuid: [0; 96],
            brand: 0,
            mode: 0,
            device_name: [0; 32],
        };
        // SAFETY: `raw` is a valid, writable `mxSmlDeviceInfo_t` for the duration of the call.
        check("mxSmlGetDeviceInfo", unsafe { (self.info)(device, &mut raw) })?;
        Ok(DeviceInfo {
            bdf_id: text(&raw.bdf_id),
            uuid: text(&raw.uuid),
            name: text(&raw.device_name),
            mode: raw.mode,
        })
    }

    /// `mxSmlGetMemoryInfo`: `(vramTotal, vramUse)` in KiB; `Ok(None)` without the symbol.
    pub(crate) fn memory_kib(&self, device: u32) -> Result<Option<(u64, u64)>, String> {
        let Some(memory) = self.memory else { return Ok(None) };
        let mut raw = RawMemoryInfo::default();
        // SAFETY: `raw` is a valid, writable `mxSmlMemoryInfo_t` for the duration of the call.
        check("mxSmlGetMemoryInfo", unsafe { memory(device, &mut raw) })?;
        let kib = |v: c_long| u64::try_from(v).unwrap_or(0);
        Ok(Some((kib(raw.vram_total), kib(raw.vram_use))))
    }

    /// `mxSmlGetDeviceIpUsage(XCORE)`: compute utilisation in percent; `Ok(None)` without the symbol.
    pub(crate) fn xcore_usage(&self, device: u32) -> Result<Option<u32>, String> {
        let Some(usage) = self.usage else { return Ok(None) };
        let mut value: c_int = 0;
        // SAFETY: `value` is a valid, writable `int` for the duration of the call.
        check("mxSmlGetDeviceIpUsage", unsafe { usage(device, USAGE_XCORE, &mut value) })?;
        Ok(Some(u32::try_from(value).unwrap_or(0)))
    }

    /// `mxSmlGetDeviceTopology`: the raw `mxSmlGpuTopologyLevel_t`; `Ok(None)` without the symbol.
    pub(crate) fn topology_level(&self, a: u32, b: u32) -> Result<Option<u32>, String> {
        let Some(topology) = self.topology else { return Ok(None) };
        let mut level: c_uint = 0;
        // SAFETY: `level` is a valid, writable `mxSmlGpuTopologyLevel_t` (an unsigned int) during the call.
        check("mxSmlGetDeviceTopology", unsafe { topology(a, b, &mut level) })?;
        Ok(Some(level))
    }
}
