//! NVIDIA Fabric Manager's client library `libnvfm.so` through `libloading` (the FM SDK C API), for the DRA
//! plugin's gate `FabricManagerPartitioning`. One of the crate's `unsafe` modules.
//!
//! The declarations follow the FM SDK headers `nv_fm_agent.h` / `nv_fm_types.h`:
//!
//! ```c
//! fmReturn_t fmLibInit(void);                                   // 0 = FM_ST_SUCCESS, errors are negative
//! fmReturn_t fmLibShutdown(void);
//! fmReturn_t fmConnect(fmConnectParams_t *params, fmHandle_t *handle);
//! fmReturn_t fmDisconnect(fmHandle_t handle);
//! fmReturn_t fmGetSupportedFabricPartitions(fmHandle_t handle, fmFabricPartitionList_t *list);
//! fmReturn_t fmActivateFabricPartition(fmHandle_t handle, fmFabricPartitionId_t id);
//! fmReturn_t fmDeactivateFabricPartition(fmHandle_t handle, fmFabricPartitionId_t id);
//!
//! typedef struct { unsigned int version; char addressInfo[256]; unsigned int timeoutMs;
//!                  unsigned int addressIsUnixSocket; enum nvFmApiAddrTypes addressType; } fmConnectParams_v2;
//! typedef struct { unsigned int physicalId; char uuid[80]; char pciBusId[32]; unsigned int numNvLinksAvailable;
//!                  unsigned int maxNumNvLinks; unsigned int nvlinkLineRateMBps; } fmFabricPartitionGpuInfo_t;
//! typedef struct { unsigned int partitionId; unsigned int isActive; unsigned int numGpus;
//!                  fmFabricPartitionGpuInfo_t gpuInfo[16]; } fmFabricPartitionInfo_t;
//! typedef struct { unsigned int version; unsigned int numPartitions; unsigned int maxNumPartitions;
//!                  fmFabricPartitionInfo_t partitionInfo[64]; } fmFabricPartitionList_v2;
//! // versions: sizeof(struct) | (n << 24): connect params n = 2, partition list n = 1
//! ```
//!
//! Each call opens its own connection (`fmConnect` … `fmDisconnect`), as upstream, so an FM restart between
//! calls is harmless; `fmLibInit` runs once at [`NvFm::open`], `fmLibShutdown` on drop. Counts FM reports
//! beyond the arrays' sizes are an error (a header/library mismatch), never truncated.
#![allow(unsafe_code)]

use std::{
    ffi::{c_char, c_int, c_uint, c_void},
    path::{Path, PathBuf},
};

use libloading::Library;

/// The library names tried, in order, when no path is given.
pub const FM_LIBRARIES: [&str; 2] = ["libnvfm.so.1", "libnvfm.so"];
/// FM's default TCP port (`FM_CMD_PORT_NUMBER`).
pub const FM_PORT: u16 = 6666;

const MAX_STR: usize = 256;
const UUID_LEN: usize = 80;
const PCI_LEN: usize = 32;
const MAX_GPUS: usize = 16;
const MAX_PARTITIONS: usize = 64;
const ADDR_INET: c_int = 1;
const ADDR_UNIX: c_int = 2;

/// `fmConnectParams_v2`.
#[repr(C)]
struct RawConnectParams {
    version: c_uint,
    address_info: [c_char; MAX_STR],
    timeout_ms: c_uint,
    address_is_unix_socket: c_uint,
    address_type: c_int,
}

/// `fmFabricPartitionGpuInfo_t`.
#[repr(C)]
#[derive(Clone, Copy)]
#[allow(dead_code, reason = "every field is part of the C layout, not all are read")]
struct RawGpuInfo {
    physical_id: c_uint,
    uuid: [c_char; UUID_LEN],
    pci_bus_id: [c_char; PCI_LEN],
    num_nvlinks_available: c_uint,
    max_num_nvlinks: c_uint,
    nvlink_line_rate_mbps: c_uint,
}

/// `fmFabricPartitionInfo_t`.
#[repr(C)]
#[derive(Clone, Copy)]
struct RawPartitionInfo {
    partition_id: c_uint,
    is_active: c_uint,
    num_gpus: c_uint,
    gpu_info: [RawGpuInfo; MAX_GPUS],
}

/// `fmFabricPartitionList_v2`.
#[repr(C)]
#[allow(dead_code, reason = "every field is part of the C layout, not all are read")]
struct RawPartitionList {
    version: c_uint,
    num_partitions: c_uint,
    max_num_partitions: c_uint,
    partition_info: [RawPartitionInfo; MAX_PARTITIONS],
}

/// `MAKE_FM_PARAM_VERSION(type, ver)`.
const fn param_version(size: usize, version: u32) -> c_uint {
    (size as c_uint) | (version << 24)
}

/// `fmConnectParams_version` (v2).
const CONNECT_VERSION: c_uint = param_version(std::mem::size_of::<RawConnectParams>(), 2);
/// `fmFabricPartitionList_version` (the v2 struct, version 1).
const LIST_VERSION: c_uint = param_version(std::mem::size_of::<RawPartitionList>(), 1);

type Handle = *mut c_void;
type NoArgFn = unsafe extern "C" fn() -> c_int;
type ConnectFn = unsafe extern "C" fn(*mut RawConnectParams, *mut Handle) -> c_int;
type DisconnectFn = unsafe extern "C" fn(Handle) -> c_int;
type ListFn = unsafe extern "C" fn(Handle, *mut RawPartitionList) -> c_int;
type PartitionFn = unsafe extern "C" fn(Handle, c_uint) -> c_int;

/// An FM failure.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FmError {
    /// The library could not be loaded or lacks a symbol.
    #[error(
        "cannot load the Fabric Manager library {library}: {detail} (install nvidia-fabricmanager's libnvfm.so.1 on the driver root)"
    )]
    Library {
        /// The names or path tried.
        library: String,
        /// The loader's message.
        detail: String,
    },
    /// A call returned an error.
    #[error("{call}: {name} ({code})")]
    Call {
        /// The call, e.g. `fmActivateFabricPartition(3)`.
        call: String,
        /// The `fmReturn_t` name.
        name: &'static str,
        /// The raw code.
        code: i32,
    },
    /// The answer does not fit the header's sizes.
    #[error("{0}")]
    Malformed(String),
    /// The address does not fit `addressInfo`.
    #[error("Fabric Manager address {0:?} is empty, longer than 255 bytes or contains NUL")]
    Address(String),
}

/// The `fmReturn_t` name of a code.
pub fn return_name(code: i32) -> &'static str {
    const NAMES: [&str; 30] = [
        "FM_ST_SUCCESS",
        "FM_ST_BADPARAM",
        "FM_ST_GENERIC_ERROR",
        "FM_ST_NOT_SUPPORTED",
        "FM_ST_UNINITIALIZED",
        "FM_ST_TIMEOUT",
        "FM_ST_VERSION_MISMATCH",
        "FM_ST_IN_USE",
        "FM_ST_NOT_CONFIGURED",
        "FM_ST_CONNECTION_NOT_VALID",
        "FM_ST_NVLINK_ERROR",
        "FM_ST_RESOURCE_BAD",
        "FM_ST_RESOURCE_IN_USE",
        "FM_ST_RESOURCE_NOT_IN_USE",
        "FM_ST_RESOURCE_EXHAUSTED",
        "FM_ST_RESOURCE_NOT_READY",
        "FM_ST_PARTITION_EXISTS",
        "FM_ST_PARTITION_ID_IN_USE",
        "FM_ST_PARTITION_ID_NOT_IN_USE",
        "FM_ST_PARTITION_NAME_IN_USE",
        "FM_ST_PARTITION_NAME_NOT_IN_USE",
        "FM_ST_PARTITION_ID_NAME_MISMATCH",
        "FM_ST_NOT_READY",
        "FM_ST_RESOURCE_USED_IN_THIS_PARTITION",
        "FM_ST_RESOURCE_USED_IN_ANOTHER_PARTITION",
        "FM_ST_PARTITION_MISWIRED_TRUNKS",
        "FM_ST_PARTITION_INSUFFICIENT_TRUNKS",
        "FM_ST_PARTITION_MISSING_SWITCHES",
        "FM_ST_PARTITION_NETWORK_CONFIG_ERROR",
        "FM_ST_PARTITION_ROUTE_PROGRAMMING_ERROR",
    ];
    usize::try_from(code.unsigned_abs())
        .ok()
        .filter(|_| code <= 0)
        .and_then(|i| NAMES.get(i))
        .copied()
        .unwrap_or("unknown fmReturn_t")
}

fn check(call: impl FnOnce() -> String, code: c_int) -> Result<(), FmError> {
    if code == 0 { Ok(()) } else { Err(FmError::Call { call: call(), name: return_name(code), code }) }
}

fn text(raw: &[c_char]) -> String {
    // `c_char` is `i8` or `u8` depending on the target; `as u8` keeps the byte either way.
    let bytes: Vec<u8> = raw.iter().map(|c| *c as u8).take_while(|b| *b != 0).collect();
    String::from_utf8_lossy(&bytes).trim().to_owned()
}

/// Where FM listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FmTarget {
    /// TCP (`NV_FM_API_ADDR_TYPE_INET`), `addressInfo` as given (`<ipv4>` or `<ipv4>:<port>`).
    Tcp(String),
    /// A unix socket (`NV_FM_API_ADDR_TYPE_UNIX`).
    Unix(PathBuf),
}

/// One GPU of a partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FmPartitionGpu {
    /// `physicalId` (the GPU module ID).
    pub physical_id: u32,
    /// `uuid`.
    pub uuid: String,
    /// `pciBusId`.
    pub pci_bus_id: String,
}

/// One supported partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FmPartition {
    /// `partitionId`.
    pub id: u32,
    /// `isActive`.
    pub active: bool,
    /// `gpuInfo[..numGpus]`.
    pub gpus: Vec<FmPartitionGpu>,
}

/// A loaded and initialised `libnvfm.so`. The function pointers stay valid while `_library` is alive, which
/// is as long as this value.
pub struct NvFm {
    shutdown: NoArgFn,
    connect: ConnectFn,
    disconnect: DisconnectFn,
    list: ListFn,
    activate: PartitionFn,
    deactivate: PartitionFn,
    target: FmTarget,
    timeout_ms: u32,
    _library: Library,
}

impl std::fmt::Debug for NvFm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvFm")
            .field("target", &self.target)
            .field("timeout_ms", &self.timeout_ms)
            .finish_non_exhaustive()
    }
}

fn load(path: &Path) -> Result<Library, String> {
    // SAFETY: loading a shared library runs its initialisers; `libnvfm.so` is NVIDIA's Fabric Manager client
    // library (or a file the operator named), which is what this module is meant to load.
    unsafe { Library::new(path) }.map_err(|e| e.to_string())
}

impl NvFm {
    /// Loads `library` (else the first of [`FM_LIBRARIES`] the loader finds), resolves the symbols and calls
    /// `fmLibInit`. Nothing connects yet.
    pub fn open(library: Option<&Path>, target: FmTarget, timeout_ms: u32) -> Result<Self, FmError> {
        let (lib, name) = match library {
            Some(path) => (load(path), path.display().to_string()),
            None => {
                let mut last = Err(String::new());
                for name in FM_LIBRARIES {
                    last = load(Path::new(name));
                    if last.is_ok() {
                        break;
                    }
                }
                (last, FM_LIBRARIES.join(" or "))
            }
        };
        let library = lib.map_err(|detail| FmError::Library { library: name.clone(), detail })?;
        let missing = |detail: libloading::Error| FmError::Library {
            library: name.clone(),
            detail: detail.to_string(),
        };
        // SAFETY: the symbol types match the FM SDK declarations in the module docs. Copying the function
        // pointers out of the `Symbol`s is sound because `library` is stored next to them and outlives them.
        let init: NoArgFn = unsafe { library.get::<NoArgFn>(b"fmLibInit\0") }.map(|s| *s).map_err(missing)?;
        // SAFETY: as above.
        let shutdown: NoArgFn =
            unsafe { library.get::<NoArgFn>(b"fmLibShutdown\0") }.map(|s| *s).map_err(missing)?;
        // SAFETY: as above.
        let connect: ConnectFn =
            unsafe { library.get::<ConnectFn>(b"fmConnect\0") }.map(|s| *s).map_err(missing)?;
        // SAFETY: as above.
        let disconnect: DisconnectFn =
            unsafe { library.get::<DisconnectFn>(b"fmDisconnect\0") }.map(|s| *s).map_err(missing)?;
        // SAFETY: as above.
        let list: ListFn = unsafe { library.get::<ListFn>(b"fmGetSupportedFabricPartitions\0") }
            .map(|s| *s)
            .map_err(missing)?;
        // SAFETY: as above.
        let activate: PartitionFn = unsafe { library.get::<PartitionFn>(b"fmActivateFabricPartition\0") }
            .map(|s| *s)
            .map_err(missing)?;
        // SAFETY: as above.
        let deactivate: PartitionFn = unsafe { library.get::<PartitionFn>(b"fmDeactivateFabricPartition\0") }
            .map(|s| *s)
            .map_err(missing)?;
        // SAFETY: `fmLibInit` takes no arguments; the SDK says to call it once before anything else.
        check(|| "fmLibInit".to_owned(), unsafe { init() })?;
        Ok(Self {
            shutdown,
            connect,
            disconnect,
            list,
            activate,
            deactivate,
            target,
            timeout_ms,
            _library: library,
        })
    }

    fn params(&self) -> Result<RawConnectParams, FmError> {
        let (address, unix) = match &self.target {
            FmTarget::Tcp(a) => (a.clone(), false),
            FmTarget::Unix(p) => (p.display().to_string(), true),
        };
        if address.is_empty() || address.len() >= MAX_STR || address.contains('\0') {
            return Err(FmError::Address(address));
        }
        let mut info = [0 as c_char; MAX_STR];
        for (slot, byte) in info.iter_mut().zip(address.bytes()) {
            *slot = byte as c_char;
        }
        Ok(RawConnectParams {
            version: CONNECT_VERSION,
            address_info: info,
            timeout_ms: self.timeout_ms,
            address_is_unix_socket: c_uint::from(unix),
            address_type: if unix { ADDR_UNIX } else { ADDR_INET },
        })
    }

    /// Runs `call` on a fresh connection, disconnecting afterwards whatever it returned.
    fn with_connection<T>(&self, call: impl FnOnce(Handle) -> Result<T, FmError>) -> Result<T, FmError> {
        let mut params = self.params()?;
        let mut handle: Handle = std::ptr::null_mut();
        // SAFETY: `params` and `handle` are valid, writable values of the declared types during the call.
        check(|| format!("fmConnect({:?})", self.target), unsafe {
            (self.connect)(&mut params, &mut handle)
        })?;
        if handle.is_null() {
            return Err(FmError::Malformed("fmConnect succeeded but returned no handle".to_owned()));
        }
        let result = call(handle);
        // SAFETY: `handle` came from a successful `fmConnect` and is disconnected exactly once.
        let code = unsafe { (self.disconnect)(handle) };
        if code != 0 {
            tracing::warn!(code, name = return_name(code), "fmDisconnect failed");
        }
        result
    }

    /// `fmGetSupportedFabricPartitions`.
    pub fn partitions(&self) -> Result<Vec<FmPartition>, FmError> {
        self.with_connection(|handle| {
            // The list is 130 KiB: on the heap, zeroed, then the version set.
            let mut raw: Box<RawPartitionList> = Box::new(RawPartitionList {
                version: LIST_VERSION,
                num_partitions: 0,
                max_num_partitions: 0,
                partition_info: [RawPartitionInfo {
                    partition_id: 0,
                    is_active: 0,
                    num_gpus: 0,
                    gpu_info: [RawGpuInfo {
                        physical_id: 0,
                        uuid: [0; UUID_LEN],
                        pci_bus_id: [0; PCI_LEN],
                        num_nvlinks_available: 0,
                        max_num_nvlinks: 0,
                        nvlink_line_rate_mbps: 0,
                    }; MAX_GPUS],
                }; MAX_PARTITIONS],
            });
            // SAFETY: `handle` is connected; `raw` is a valid, writable `fmFabricPartitionList_t` with its
            // version set, alive for the call.
            check(|| "fmGetSupportedFabricPartitions".to_owned(), unsafe { (self.list)(handle, &mut *raw) })?;
            convert(&raw)
        })
    }

    /// `fmActivateFabricPartition`.
    pub fn activate(&self, id: u32) -> Result<(), FmError> {
        self.with_connection(|handle| {
            // SAFETY: `handle` is connected; the partition ID is a plain integer.
            check(|| format!("fmActivateFabricPartition({id})"), unsafe { (self.activate)(handle, id) })
        })
    }

    /// `fmDeactivateFabricPartition`.
    pub fn deactivate(&self, id: u32) -> Result<(), FmError> {
        self.with_connection(|handle| {
            // SAFETY: `handle` is connected; the partition ID is a plain integer.
            check(|| format!("fmDeactivateFabricPartition({id})"), unsafe { (self.deactivate)(handle, id) })
        })
    }
}

fn convert(raw: &RawPartitionList) -> Result<Vec<FmPartition>, FmError> {
    let count = raw.num_partitions as usize;
    let partitions = raw.partition_info.get(..count).ok_or_else(|| {
        FmError::Malformed(format!(
            "FM reported {count} partitions; the header holds at most {MAX_PARTITIONS}"
        ))
    })?;
    partitions
        .iter()
        .map(|p| {
            let gpus = p.gpu_info.get(..p.num_gpus as usize).ok_or_else(|| {
                FmError::Malformed(format!(
                    "FM reported {} GPUs in partition {}; the header holds at most {MAX_GPUS}",
                    p.num_gpus, p.partition_id
                ))
            })?;
            Ok(FmPartition {
                id: p.partition_id,
                active: p.is_active != 0,
                gpus: gpus
                    .iter()
                    .map(|g| FmPartitionGpu {
                        physical_id: g.physical_id,
                        uuid: text(&g.uuid),
                        pci_bus_id: text(&g.pci_bus_id),
                    })
                    .collect(),
            })
        })
        .collect()
}

impl Drop for NvFm {
    fn drop(&mut self) {
        // SAFETY: `fmLibShutdown` takes no arguments and pairs with the `fmLibInit` of `open`.
        let code = unsafe { (self.shutdown)() };
        if code != 0 {
            tracing::warn!(code, name = return_name(code), "fmLibShutdown failed");
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;

    /// A stub `libnvfm.so` in C: it checks the struct versions with its own `sizeof` (so a layout mismatch
    /// fails), allows one open connection at a time (a leaked handle fails the next call), and keeps a
    /// partition table with FM's in-use rule.
    const STUB: &str = r#"
#include <string.h>
typedef struct { unsigned int version; char addressInfo[256]; unsigned int timeoutMs;
                 unsigned int addressIsUnixSocket; int addressType; } fmConnectParams_t;
typedef struct { unsigned int physicalId; char uuid[80]; char pciBusId[32]; unsigned int numNvLinksAvailable;
                 unsigned int maxNumNvLinks; unsigned int nvlinkLineRateMBps; } gpu_t;
typedef struct { unsigned int partitionId; unsigned int isActive; unsigned int numGpus; gpu_t gpuInfo[16]; } part_t;
typedef struct { unsigned int version; unsigned int numPartitions; unsigned int maxNumPartitions;
                 part_t partitionInfo[64]; } list_t;
static int inited, open_handles, active[3];
static int handle_storage;
int fmLibInit(void) { inited = 1; return 0; }
int fmLibShutdown(void) { inited = 0; return 0; }
int fmConnect(fmConnectParams_t *p, void **h) {
  if (!inited) return -4;
  if (p->version != (sizeof(fmConnectParams_t) | (2u << 24))) return -6;
  if (open_handles) return -7;
  int unix_ok = p->addressType == 2 && p->addressIsUnixSocket == 1 && strcmp(p->addressInfo, "/run/fm.sock") == 0;
  int tcp_ok = p->addressType == 1 && p->addressIsUnixSocket == 0 && strcmp(p->addressInfo, "10.0.0.9") == 0;
  if (!unix_ok && !tcp_ok) return -9;
  open_handles = 1; *h = &handle_storage; return 0;
}
int fmDisconnect(void *h) { if (h != &handle_storage || !open_handles) return -1; open_handles = 0; return 0; }
static void gpu(gpu_t *g, unsigned id) {
  memset(g, 0, sizeof *g); g->physicalId = id;
  strcpy(g->uuid, id == 1 ? "GPU-aaaa" : "GPU-bbbb");
  strcpy(g->pciBusId, id == 1 ? "00000000:1B:00.0" : "00000000:43:00.0");
}
int fmGetSupportedFabricPartitions(void *h, list_t *l) {
  if (h != &handle_storage) return -1;
  if (l->version != (sizeof(list_t) | (1u << 24))) return -6;
  l->numPartitions = 3; l->maxNumPartitions = 64;
  l->partitionInfo[0].partitionId = 0; l->partitionInfo[0].numGpus = 2; gpu(&l->partitionInfo[0].gpuInfo[0], 1); gpu(&l->partitionInfo[0].gpuInfo[1], 2);
  l->partitionInfo[1].partitionId = 1; l->partitionInfo[1].numGpus = 1; gpu(&l->partitionInfo[1].gpuInfo[0], 1);
  l->partitionInfo[2].partitionId = 2; l->partitionInfo[2].numGpus = 1; gpu(&l->partitionInfo[2].gpuInfo[0], 2);
  for (int i = 0; i < 3; i++) l->partitionInfo[i].isActive = active[i];
  return 0;
}
int fmActivateFabricPartition(void *h, unsigned id) {
  if (h != &handle_storage) return -1;
  if (id > 2) return -18;
  if (active[id] || (id == 0 && (active[1] || active[2])) || (id != 0 && active[0])) return -12;
  active[id] = 1; return 0;
}
int fmDeactivateFabricPartition(void *h, unsigned id) {
  if (h != &handle_storage) return -1;
  if (id > 2) return -18;
  if (!active[id]) return -13;
  active[id] = 0; return 0;
}
"#;

    fn stub(dir: &Path) -> PathBuf {
        let source = dir.join("nvfm_stub.c");
        std::fs::write(&source, STUB).unwrap();
        let library = dir.join("libnvfm.so.1");
        for compiler in ["cc", "gcc", "clang"] {
            match std::process::Command::new(compiler)
                .args(["-shared", "-fPIC", "-o"])
                .arg(&library)
                .arg(&source)
                .status()
            {
                Ok(status) if status.success() => return library,
                Ok(status) => panic!("{compiler} failed to build the libnvfm.so stub: {status}"),
                Err(_) => continue,
            }
        }
        panic!(
            "no C compiler (cc, gcc or clang) on PATH to build the libnvfm.so stub; install one (Debian: apt-get install gcc)"
        );
    }

    #[test]
    fn layouts_match_the_header() {
        assert_eq!(std::mem::size_of::<RawConnectParams>(), 272);
        assert_eq!(std::mem::size_of::<RawGpuInfo>(), 128);
        assert_eq!(std::mem::size_of::<RawPartitionInfo>(), 12 + 16 * 128);
        assert_eq!(std::mem::size_of::<RawPartitionList>(), 12 + 64 * (12 + 16 * 128));
        assert_eq!(CONNECT_VERSION, 272 | (2 << 24));
        assert_eq!(return_name(0), "FM_ST_SUCCESS");
        assert_eq!(return_name(-7), "FM_ST_IN_USE");
        assert_eq!(return_name(-29), "FM_ST_PARTITION_ROUTE_PROGRAMMING_ERROR");
        assert_eq!(return_name(-30), "unknown fmReturn_t");
        assert_eq!(return_name(3), "unknown fmReturn_t");
    }

    #[test]
    fn a_missing_library_is_a_clear_error() {
        let err =
            NvFm::open(Some(Path::new("/nonexistent/libnvfm.so.1")), FmTarget::Tcp("127.0.0.1".into()), 1000)
                .unwrap_err()
                .to_string();
        assert!(err.starts_with("cannot load the Fabric Manager library /nonexistent/libnvfm.so.1"), "{err}");
    }

    #[test]
    fn talks_to_the_stub_library() {
        let dir = tempfile::tempdir().unwrap();
        let library = stub(dir.path());
        let fm = NvFm::open(Some(&library), FmTarget::Unix("/run/fm.sock".into()), 1000).unwrap();
        let partitions = fm.partitions().unwrap();
        assert_eq!(partitions.len(), 3);
        assert_eq!(
            partitions[0],
            FmPartition {
                id: 0,
                active: false,
                gpus: vec![
                    FmPartitionGpu {
                        physical_id: 1,
                        uuid: "GPU-aaaa".into(),
                        pci_bus_id: "00000000:1B:00.0".into()
                    },
                    FmPartitionGpu {
                        physical_id: 2,
                        uuid: "GPU-bbbb".into(),
                        pci_bus_id: "00000000:43:00.0".into()
                    },
                ],
            }
        );
        fm.activate(1).unwrap();
        let err = fm.activate(0).unwrap_err().to_string();
        assert_eq!(err, "fmActivateFabricPartition(0): FM_ST_RESOURCE_IN_USE (-12)");
        assert!(fm.partitions().unwrap()[1].active);
        fm.deactivate(1).unwrap();
        assert_eq!(
            fm.deactivate(1).unwrap_err().to_string(),
            "fmDeactivateFabricPartition(1): FM_ST_RESOURCE_NOT_IN_USE (-13)"
        );
        assert!(
            fm.partitions().unwrap().iter().all(|p| !p.active),
            "every call disconnected (the stub allows one handle)"
        );
        drop(fm);

        // TCP with the wrong host: fmConnect's error names the target.
        let fm = NvFm::open(Some(&library), FmTarget::Tcp("10.0.0.8".into()), 1000).unwrap();
        let err = fm.partitions().unwrap_err().to_string();
        assert_eq!(err, "fmConnect(Tcp(\"10.0.0.8\")): FM_ST_CONNECTION_NOT_VALID (-9)");
        let fm2 = NvFm::open(Some(&library), FmTarget::Tcp("10.0.0.9".into()), 1000).unwrap();
        assert_eq!(fm2.partitions().unwrap().len(), 3);
        let bad = NvFm::open(Some(&library), FmTarget::Tcp(String::new()), 1000).unwrap();
        assert!(matches!(bad.partitions(), Err(FmError::Address(_))));
    }
}
