//! Gate `PassthroughSupport`: whole GPUs handed to a workload (a VM in a pod, KubeVirt) through `vfio-pci`.
//!
//! # Devices
//!
//! [`vfio_devices`] (called once at start-up, after the GPU devices are built) adds one device per NVIDIA
//! GPU PCI function found in sysfs (vendor `0x10de`, class `0x0300xx` VGA or `0x0302xx` 3D controller, not
//! an SR-IOV virtual function), numbered in PCI address order, whatever driver it is bound to now:
//!
//! | field | value |
//! |---|---|
//! | name | `gpu-vfio-<index>` (index in PCI address order, stable across driver changes) |
//! | `type` | `vfio` (DeviceClass `vfio-manager`) |
//! | `uuid` | a name-based UUID (v5, DNS namespace) of the PCI address, as upstream: the same GPU always gets the same one, and NVML's UUID is not readable while the GPU is on `vfio-pci` |
//! | `deviceID`, `vendorID` | `<sysfs>/bus/pci/devices/<bus>/{device,vendor}`, `0x%04x` |
//! | `productName` | the NVML name of the GPU when NVML sees it, else `NVIDIA PCI device 0x<deviceID>` |
//! | `iommuFDEnabled` | `<host-root>/dev/iommu` exists |
//! | capacity `addressableMemory` | the 64-bit memory BARs of `<bus>/resource`, summed and rounded up to a power of two (what a VM must map) |
//!
//! The device's [`GpuInfo`] is the one of the GPU's `gpu-<minor>` device when NVML sees the GPU (same
//! UUID, minor, NUMA node, PCIe root; bus id as sysfs writes it), so the published GPU attributes match; a
//! GPU NVML does not see (already on `vfio-pci` at start-up) gets `minor` and `index` `u32::MAX`.
//!
//! # One GPU, two devices
//!
//! As upstream, the GPU is published twice: as `gpu-<minor>` (used through the NVIDIA driver) and as
//! `gpu-vfio-<index>` (passed through). The published devices are fixed at start-up, so the scheduler may
//! allocate both to different claims. [`VfioMode::plan`] therefore rejects, before anything is done:
//!
//! | claim | rejected when |
//! |---|---|
//! | any | two of its own devices are on the same GPU and one of them is a VFIO device |
//! | with `gpu-vfio-<i>` | another claim (checkpoint, any state) has a device of the same GPU (by PCI address) |
//! | with `gpu-<minor>` | another claim has the GPU's `gpu-vfio-<i>` |
//!
//! What it cannot guarantee: the check sees only claims of this plugin (the checkpoint). A process using
//! the GPU outside Kubernetes is not detected (upstream waits for `fuser` on `/dev/nvidia<minor>` to be
//! quiet and turns persistence mode off first; this build does neither: unbinding a busy GPU blocks in the
//! kernel until its users exit). A rejected claim stays allocated by the scheduler; its pod reports the
//! Prepare error until the other claim is gone.
//!
//! # Host actions
//!
//! One action per VFIO device of the claim, [`VfioAction`]: `{device, busId, originalDriver, iommuGroup,
//! common}`. Sysfs paths are rooted at [`SysfsRoots`] (tests use a tree in a temp dir):
//!
//! | step | apply (bind) | revert (rebind) |
//! |---|---|---|
//! | 0 | already on `vfio-pci`: nothing to do | already on `originalDriver` and no override: nothing to do |
//! | 0a | on `nvidia`: no process under `<host-root>/proc` has `/dev/nvidia<minor>` open (else the claim fails naming the PIDs; upstream waits up to 60 s for `fuser`) | |
//! | 1 | `<sys>/bus/pci/drivers/vfio-pci` absent → [`ModuleLoader::load`] `vfio-pci` (`chroot <host-root> modprobe vfio-pci`) | write `\n` to `<dev>/driver_override` (clears it) |
//! | 2 | IOMMU group `<sys>/kernel/iommu_groups/<g>/devices/*`: every other device unbound, on `vfio-pci`/`pci-stub`, or a bridge (class `0x06xxxx`) | on `vfio-pci`: write `<bus>` to `<dev>/driver/unbind` |
//! | 3 | write `vfio-pci` to `<dev>/driver_override` | write `<bus>` to `<sys>/bus/pci/drivers/<originalDriver>/bind` (or `<sys>/bus/pci/drivers_probe` when that driver is not loaded) |
//! | 4 | bound to a driver: write `<bus>` to `<dev>/driver/unbind` | check `<dev>/driver` is `originalDriver` |
//! | 5 | write `<bus>` to `<sys>/bus/pci/drivers/vfio-pci/bind`; check `<dev>/driver` is `vfio-pci` | |
//!
//! `originalDriver` is the driver the GPU is bound to when the claim is planned; a GPU found unbound or on
//! `vfio-pci` is given back to [`VfioConfig::default_driver`] (`nvidia`). A GPU on any other driver
//! (`nouveau`, …) is refused.
//!
//! CDI edits of an applied action (upstream's legacy IOMMU backend, plus the iommufd nodes when present):
//!
//! | edits | nodes / env |
//! |---|---|
//! | the device's | `/dev/vfio/<group>`; with iommufd also `/dev/vfio/devices/vfio<N>` (from `<dev>/vfio-dev/`) |
//! | claim-wide (first VFIO action only) | `/dev/vfio/vfio`; `/dev/iommu` with iommufd; `NVIDIA_VISIBLE_DEVICES=void` |
//!
//! ```
//! use vgpu_dra::vfio::{SysfsRoots, fake::FakeSysfs};
//!
//! let dir = tempfile::tempdir()?;
//! let roots = SysfsRoots::under(dir.path());
//! let tree = FakeSysfs::new(&roots);
//! tree.add_gpu("0000:3b:00.0", 0x2330, "7", Some("nvidia"))?;
//! assert_eq!(vgpu_dra::vfio::current_driver(&roots, "0000:3b:00.0")?, "nvidia");
//! assert_eq!(vgpu_dra::vfio::uuid_v5_dns("0000:3b:00.0"), "5f36833e-54b9-5234-b457-89cdb0ccb109");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod fake;

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    io::Write as _,
    path::{Path, PathBuf},
    sync::Arc,
};

use serde::{Deserialize, Serialize};
use vgpu_core::model::{ComputeCapability, Vendor};

use crate::{
    checkpoint::Checkpoint,
    devices::AllocatableDevice,
    devices::AllocatableDevices,
    devices::Amount,
    devices::DeviceCapacity,
    devices::DeviceExtras,
    devices::ExtraAttribute,
    devices::GpuInfo,
    modes::{ClaimContext, ClaimMode, ModeEdits, ModeError, decode, encode},
};
use vgpu_core::cdi::{ContainerEdits, DeviceNode};
use vgpu_core::dra::DeviceType;

/// The mode's name in recorded actions.
pub const MODE: &str = "vfio";
/// The gate that enables the mode.
pub const GATE: &str = "PassthroughSupport";
/// The passthrough driver (its `/sys/bus/pci/drivers/` name).
pub const VFIO_DRIVER: &str = "vfio-pci";
/// The kernel module that provides [`VFIO_DRIVER`] (`/sys/module/` name).
pub const VFIO_MODULE: &str = "vfio_pci";
/// NVIDIA's PCI vendor ID.
pub const NVIDIA_VENDOR_ID: u16 = 0x10de;
/// Drivers a device sharing the GPU's IOMMU group may be bound to (besides none and bridges).
pub const GROUP_SAFE_DRIVERS: [&str; 2] = [VFIO_DRIVER, "pci-stub"];

/// Errors of VFIO device discovery at start-up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VfioError {
    /// A sysfs file could not be read.
    #[error("{path}: {action}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// What was being done.
        action: &'static str,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A sysfs file does not hold what the kernel writes there.
    #[error("{path}: {value:?} is not {expected}")]
    Parse {
        /// The path.
        path: PathBuf,
        /// What it holds.
        value: String,
        /// What was expected.
        expected: &'static str,
    },
    /// The kernel has no IOMMU groups: passthrough cannot work.
    #[error(
        "feature gate PassthroughSupport needs the IOMMU, but {0} has no groups (enable intel_iommu=on / amd_iommu=on and VT-d/AMD-Vi)"
    )]
    IommuDisabled(PathBuf),
}

fn io_err<'a>(path: &'a Path, action: &'static str) -> impl FnOnce(std::io::Error) -> VfioError + 'a {
    move |source| VfioError::Io { path: path.to_path_buf(), action, source }
}

// === roots ===

/// Where sysfs and the host's root file system are (all VFIO paths are under these).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SysfsRoots {
    /// The host's sysfs as this process sees it (`/sys`: the plugin runs privileged).
    pub sys: PathBuf,
    /// `--host-root` (`HOST_ROOT`): the host's `/` (for `/dev/iommu`, `/sys/module` and the `modprobe`
    /// chroot).
    pub host_root: PathBuf,
}

impl SysfsRoots {
    /// `/sys` and the given host root.
    pub fn new(host_root: impl Into<PathBuf>) -> Self {
        Self { sys: PathBuf::from("/sys"), host_root: host_root.into() }
    }

    /// Both under `root` (`<root>/sys`, host root `<root>`): tests and examples.
    pub fn under(root: &Path) -> Self {
        Self { sys: root.join("sys"), host_root: root.to_path_buf() }
    }

    /// `<sys>/bus/pci/devices`.
    pub fn pci_devices(&self) -> PathBuf {
        self.sys.join("bus/pci/devices")
    }

    /// `<sys>/bus/pci/devices/<bus>`.
    pub fn pci_device(&self, bus: &str) -> PathBuf {
        self.pci_devices().join(bus)
    }

    /// `<sys>/bus/pci/drivers/<driver>`.
    pub fn pci_driver(&self, driver: &str) -> PathBuf {
        self.sys.join("bus/pci/drivers").join(driver)
    }

    /// `<sys>/bus/pci/drivers_probe`.
    pub fn drivers_probe(&self) -> PathBuf {
        self.sys.join("bus/pci/drivers_probe")
    }

    /// `<sys>/kernel/iommu_groups`.
    pub fn iommu_groups(&self) -> PathBuf {
        self.sys.join("kernel/iommu_groups")
    }

    /// `<host-root>/dev/iommu` (present when the kernel has iommufd).
    pub fn dev_iommu(&self) -> PathBuf {
        self.host_root.join("dev/iommu")
    }

    /// `<host-root>/sys/module/<module>` (present when the module is loaded).
    pub fn module(&self, module: &str) -> PathBuf {
        self.host_root.join("sys/module").join(module)
    }
}

// === sysfs reads ===

/// The driver `bus` is bound to (the name `<dev>/driver` links to), empty when unbound.
pub fn current_driver(roots: &SysfsRoots, bus: &str) -> Result<String, VfioError> {
    let link = roots.pci_device(bus).join("driver");
    match std::fs::read_link(&link) {
        Ok(target) => Ok(target.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(String::new()),
        Err(source) => Err(VfioError::Io { path: link, action: "read link", source }),
    }
}

/// The IOMMU group of `bus` (the name `<dev>/iommu_group` links to); `None` without one.
pub fn iommu_group(roots: &SysfsRoots, bus: &str) -> Result<Option<String>, VfioError> {
    let link = roots.pci_device(bus).join("iommu_group");
    match std::fs::read_link(&link) {
        Ok(target) => Ok(target.file_name().map(|n| n.to_string_lossy().into_owned())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(VfioError::Io { path: link, action: "read link", source }),
    }
}

fn read_trimmed(path: &Path) -> Result<String, VfioError> {
    std::fs::read_to_string(path).map(|s| s.trim().to_owned()).map_err(io_err(path, "read"))
}

fn read_hex(path: &Path, expected: &'static str) -> Result<u64, VfioError> {
    let text = read_trimmed(path)?;
    u64::from_str_radix(text.trim_start_matches("0x").trim_start_matches("0X"), 16)
        .map_err(|_| VfioError::Parse { path: path.to_path_buf(), value: text, expected })
}

/// The PCI class of `bus` (`0x030200`).
fn pci_class(roots: &SysfsRoots, bus: &str) -> Result<u64, VfioError> {
    read_hex(&roots.pci_device(bus).join("class"), "a hex PCI class such as 0x030200")
}

/// A PCI address as numbers (domain, bus, device, function), for ordering and comparing addresses written
/// differently (`00000000:3B:00.0` from NVML, `0000:3b:00.0` in sysfs).
pub fn parse_bus_id(bus: &str) -> Option<(u32, u8, u8, u8)> {
    let (domain, rest) = bus.trim().split_once(':')?;
    let (bus_no, rest) = rest.split_once(':')?;
    let (device, function) = rest.split_once('.')?;
    Some((
        u32::from_str_radix(domain, 16).ok()?,
        u8::from_str_radix(bus_no, 16).ok()?,
        u8::from_str_radix(device, 16).ok()?,
        u8::from_str_radix(function, 16).ok()?,
    ))
}

/// Whether two PCI addresses name the same function.
pub fn same_bus_id(a: &str, b: &str) -> bool {
    match (parse_bus_id(a), parse_bus_id(b)) {
        (Some(x), Some(y)) => x == y,
        _ => false,
    }
}

/// The 64-bit memory BARs of a PCI `resource` file (`<start> <end> <flags>` per line, the first six lines
/// are the BARs) summed and rounded up to a power of two, as go-nvlib's `GetTotalAddressableMemory`.
pub fn addressable_memory(resource: &str) -> Option<u64> {
    const MEM_TYPE_MASK: u64 = 0x06;
    const MEM_TYPE_64: u64 = 0x04;
    let mut total: u64 = 0;
    for line in resource.lines().take(6) {
        let mut fields = line.split_whitespace().map(|f| u64::from_str_radix(f.trim_start_matches("0x"), 16));
        let (Some(Ok(start)), Some(Ok(end)), Some(Ok(flags))) = (fields.next(), fields.next(), fields.next())
        else {
            return None;
        };
        if end <= start {
            continue;
        }
        if flags & MEM_TYPE_MASK == MEM_TYPE_64 {
            total = total.checked_add(end - start + 1)?;
        }
    }
    if total == 0 { Some(0) } else { total.checked_next_power_of_two() }
}

/// The name-based (v5) UUID of `name` in the DNS namespace, lower-case (upstream's VFIO device UUID:
/// `uuid.NewSHA1(uuid.NameSpaceDNS, busID)`).
pub fn uuid_v5_dns(name: &str) -> String {
    const DNS: [u8; 16] =
        [0x6b, 0xa7, 0xb8, 0x10, 0x9d, 0xad, 0x11, 0xd1, 0x80, 0xb4, 0x00, 0xc0, 0x4f, 0xd4, 0x30, 0xc8];
    let mut input = DNS.to_vec();
    input.extend_from_slice(name.as_bytes());
    let hash = sha1(&input);
    let mut b = [0u8; 16];
    b.copy_from_slice(&hash[..16]);
    b[6] = (b[6] & 0x0f) | 0x50;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &hex[0..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..32])
}

/// SHA-1 of `data`, only for [`uuid_v5_dns`]; not used for anything secret.
fn sha1(data: &[u8]) -> [u8; 20] {
    use sha1::Digest;
    sha1::Sha1::digest(data).into()
}

// === discovery ===

/// One NVIDIA GPU PCI function as sysfs describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PciGpu {
    /// The address as sysfs names it (`0000:3b:00.0`).
    pub bus_id: String,
    /// `device` (PCI device ID).
    pub device_id: u16,
    /// `vendor` (always [`NVIDIA_VENDOR_ID`]).
    pub vendor_id: u16,
    /// The IOMMU group, when the device has one.
    pub iommu_group: Option<String>,
    /// [`addressable_memory`] of its `resource` file.
    pub addressable_memory: u64,
    /// `numa_node` when ≥ 0.
    pub numa_node: Option<u32>,
}

/// Every NVIDIA GPU PCI function under `<sys>/bus/pci/devices` (not virtual functions), in address order.
pub fn pci_gpus(roots: &SysfsRoots) -> Result<Vec<PciGpu>, VfioError> {
    let dir = roots.pci_devices();
    let mut found = Vec::new();
    for entry in std::fs::read_dir(&dir).map_err(io_err(&dir, "list"))? {
        let entry = entry.map_err(io_err(&dir, "list"))?;
        let bus = entry.file_name().to_string_lossy().into_owned();
        let Some(order) = parse_bus_id(&bus) else { continue };
        let path = roots.pci_device(&bus);
        let vendor = read_hex(&path.join("vendor"), "a hex PCI vendor ID such as 0x10de")?;
        if vendor != u64::from(NVIDIA_VENDOR_ID) {
            continue;
        }
        let class = pci_class(roots, &bus)?;
        if !matches!(class >> 8, 0x0300 | 0x0302) || path.join("physfn").exists() {
            continue;
        }
        let device = read_hex(&path.join("device"), "a hex PCI device ID such as 0x2330")?;
        let resource_path = path.join("resource");
        let resource = std::fs::read_to_string(&resource_path).map_err(io_err(&resource_path, "read"))?;
        let addressable_memory = addressable_memory(&resource).ok_or_else(|| VfioError::Parse {
            path: resource_path.clone(),
            value: resource.lines().next().unwrap_or_default().to_owned(),
            expected: "PCI resource lines of three hex numbers",
        })?;
        let numa_node = std::fs::read_to_string(path.join("numa_node"))
            .ok()
            .and_then(|s| s.trim().parse::<i64>().ok())
            .and_then(|n| u32::try_from(n).ok());
        found.push((
            order,
            PciGpu {
                iommu_group: iommu_group(roots, &bus)?,
                bus_id: bus,
                device_id: u16::try_from(device).unwrap_or(u16::MAX),
                vendor_id: NVIDIA_VENDOR_ID,
                addressable_memory,
                numa_node,
            },
        ));
    }
    found.sort_by_key(|(order, _)| *order);
    Ok(found.into_iter().map(|(_, gpu)| gpu).collect())
}

/// Whether the kernel has IOMMU groups (`<sys>/kernel/iommu_groups` non-empty).
pub fn iommu_enabled(roots: &SysfsRoots) -> bool {
    std::fs::read_dir(roots.iommu_groups()).is_ok_and(|mut d| d.next().is_some())
}

/// The VFIO devices of this node (module docs), to [`AllocatableDevices::add`] at start-up; `devices` are
/// the GPU devices already built (each VFIO device takes the GPU info of the device on its PCI address).
/// Fails when the IOMMU is off (gate `PassthroughSupport` cannot work) or sysfs cannot be read.
pub fn vfio_devices(
    roots: &SysfsRoots,
    devices: &AllocatableDevices,
) -> Result<Vec<AllocatableDevice>, VfioError> {
    if !iommu_enabled(roots) {
        return Err(VfioError::IommuDisabled(roots.iommu_groups()));
    }
    let iommufd = roots.dev_iommu().exists();
    let mut out = Vec::new();
    for (index, pci) in pci_gpus(roots)?.into_iter().enumerate() {
        let parent = devices.iter().find(|d| {
            matches!(d.kind, DeviceType::Gpu | DeviceType::Vgpu) && same_bus_id(&d.gpu.bus_id, &pci.bus_id)
        });
        let device_id = format!("0x{:04x}", pci.device_id);
        let gpu = match parent {
            Some(p) => GpuInfo { bus_id: pci.bus_id.clone(), ..p.gpu.clone() },
            None => GpuInfo {
                index: u32::MAX,
                uuid: uuid_v5_dns(&pci.bus_id),
                minor: u32::MAX,
                product_name: format!("NVIDIA PCI device {device_id}"),
                vendor: Vendor::Nvidia,
                memory_bytes: 0,
                bus_id: pci.bus_id.clone(),
                pcie_root: crate::devices::pcie_root(&roots.sys, &pci.bus_id),
                numa_node: pci.numa_node,
                compute_capability: ComputeCapability::default(),
                mig_enabled: false,
            },
        };
        let mut extra = DeviceExtras::default();
        let attrs = &mut extra.attributes;
        attrs.insert("uuid".into(), ExtraAttribute::String(uuid_v5_dns(&pci.bus_id)));
        attrs.insert("deviceID".into(), ExtraAttribute::String(device_id));
        attrs.insert("vendorID".into(), ExtraAttribute::String(format!("0x{:04x}", pci.vendor_id)));
        attrs.insert("productName".into(), ExtraAttribute::String(gpu.product_name.clone()));
        attrs.insert("iommuFDEnabled".into(), ExtraAttribute::Bool(iommufd));
        extra.capacities.insert("addressableMemory".into(), Amount::Bytes(pci.addressable_memory));
        out.push(AllocatableDevice {
            name: format!("gpu-vfio-{index}"),
            kind: DeviceType::Vfio,
            gpu,
            capacity: DeviceCapacity::default(),
            shared: false,
            extra,
        });
    }
    Ok(out)
}

/// The processes under `proc_root` with `/dev/nvidia<minor>` open, as `<pid> (<comm>)`, in PID order.
/// Processes whose `fd` directory cannot be read (gone, or not permitted) are skipped.
pub fn gpu_users(proc_root: &Path, minor: u32) -> Vec<String> {
    let node = PathBuf::from(format!("/dev/nvidia{minor}"));
    let mut users: Vec<(u64, String)> = Vec::new();
    for entry in std::fs::read_dir(proc_root).into_iter().flatten().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u64>().ok()) else { continue };
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else { continue };
        if fds.flatten().any(|fd| std::fs::read_link(fd.path()).is_ok_and(|t| t == node)) {
            let comm = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
            users.push((pid, format!("{pid} ({})", comm.trim())));
        }
    }
    users.sort();
    users.into_iter().map(|(_, u)| u).collect()
}

// === host seams ===

/// Loads a kernel module on the host.
pub trait ModuleLoader: Send + Sync + fmt::Debug {
    /// Loads `module` (e.g. `vfio-pci`).
    fn load(&self, module: &str) -> Result<(), String>;
}

/// `chroot <host-root> modprobe <module>`, as upstream.
#[derive(Debug, Clone)]
pub struct ChrootModprobe {
    /// The host root.
    pub host_root: PathBuf,
}

impl ModuleLoader for ChrootModprobe {
    fn load(&self, module: &str) -> Result<(), String> {
        let output = std::process::Command::new("chroot")
            .arg(&self.host_root)
            .args(["modprobe", module])
            .output()
            .map_err(|e| format!("chroot {} modprobe {module}: {e}", self.host_root.display()))?;
        if output.status.success() {
            Ok(())
        } else {
            Err(format!(
                "chroot {} modprobe {module}: {}: {}",
                self.host_root.display(),
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            ))
        }
    }
}

/// Writes sysfs attribute files (the kernel acts on the write).
pub trait SysfsWriter: Send + Sync + fmt::Debug {
    /// Writes `value` to the existing file `path`.
    fn write(&self, path: &Path, value: &str) -> std::io::Result<()>;
}

/// The real kernel: opens the attribute for writing (never creates it) and writes the value at once.
#[derive(Debug, Clone, Copy, Default)]
pub struct KernelSysfs;

impl SysfsWriter for KernelSysfs {
    fn write(&self, path: &Path, value: &str) -> std::io::Result<()> {
        // O_TRUNC as a shell's `>` (sysfs ignores it; a plain file standing in for one keeps no old bytes).
        let mut file = std::fs::OpenOptions::new().write(true).truncate(true).open(path)?;
        file.write_all(value.as_bytes())
    }
}

// === mode ===

/// What [`VfioMode`] needs.
#[derive(Debug, Clone)]
pub struct VfioConfig {
    /// Sysfs and host root.
    pub roots: SysfsRoots,
    /// The driver a GPU found unbound or on `vfio-pci` is given back to, and the only other driver a GPU
    /// may be taken from (`nvidia`).
    pub default_driver: String,
    /// Loads `vfio-pci` when its driver directory is absent.
    pub modules: Arc<dyn ModuleLoader>,
    /// Writes the bind files.
    pub sysfs: Arc<dyn SysfsWriter>,
    /// The host's processes (`<host-root>/proc`): a GPU whose `/dev/nvidia<minor>` a process has open is not
    /// unbound from its driver (the unbind would block until they exit); `None` skips the check.
    pub proc_root: Option<PathBuf>,
}

impl VfioConfig {
    /// The real host: `/sys`, `host_root`, `nvidia`, `chroot <host_root> modprobe`, [`KernelSysfs`],
    /// `<host_root>/proc`.
    pub fn host(host_root: impl Into<PathBuf>) -> Self {
        let roots = SysfsRoots::new(host_root);
        let proc_root = Some(roots.host_root.join("proc"));
        Self {
            modules: Arc::new(ChrootModprobe { host_root: roots.host_root.clone() }),
            roots,
            default_driver: "nvidia".to_owned(),
            sysfs: Arc::new(KernelSysfs),
            proc_root,
        }
    }
}

/// One recorded VFIO host action: bind one GPU to `vfio-pci`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VfioAction {
    /// The device (`gpu-vfio-<i>`).
    pub device: String,
    /// Its PCI address as sysfs names it.
    pub bus_id: String,
    /// The driver to give the GPU back to on revert.
    pub original_driver: String,
    /// Its IOMMU group.
    pub iommu_group: String,
    /// Whether this action carries the claim-wide edits (the claim's first VFIO device).
    pub common: bool,
}

/// The `vfio` claim mode (gate `PassthroughSupport`; module docs).
#[derive(Debug)]
pub struct VfioMode {
    config: VfioConfig,
    /// Device name → PCI address, for every published device with one (the overlap check).
    bus_by_device: BTreeMap<String, String>,
    /// Names of the VFIO devices.
    vfio: BTreeSet<String>,
}

impl VfioMode {
    /// The mode over the node's final device list (GPU and VFIO devices).
    pub fn new(config: VfioConfig, devices: &AllocatableDevices) -> Self {
        let bus_by_device = devices
            .iter()
            .filter(|d| !d.gpu.bus_id.is_empty())
            .map(|d| (d.name.clone(), d.gpu.bus_id.clone()))
            .collect();
        let vfio = devices.iter().filter(|d| d.kind == DeviceType::Vfio).map(|d| d.name.clone()).collect();
        Self { config, bus_by_device, vfio }
    }

    fn host(step: impl Into<String>, e: impl fmt::Display) -> ModeError {
        ModeError::host(MODE, step, e.to_string())
    }

    /// Rejects a claim whose devices share a GPU with a VFIO device (its own or another claim's).
    fn check_conflicts(&self, ctx: &ClaimContext<'_>) -> Result<(), ModeError> {
        let bus_of = |name: &str| self.bus_by_device.get(name).and_then(|b| parse_bus_id(b));
        let conflict = |a: &str, b: &str| a != b && (self.vfio.contains(a) || self.vfio.contains(b));
        for (i, d) in ctx.devices.iter().enumerate() {
            let name = d.device.name.as_str();
            let Some(bus) = bus_of(name) else { continue };
            for other in &ctx.devices[..i] {
                if conflict(name, &other.device.name) && bus_of(&other.device.name) == Some(bus) {
                    return Err(ModeError::claim(
                        MODE,
                        format!(
                            "devices {} and {name} are the same GPU ({}); a GPU is either passed through or used through its driver",
                            other.device.name, d.device.gpu.bus_id
                        ),
                    ));
                }
            }
        }
        let path = ctx.config.checkpoint_path();
        let cp = Checkpoint::load(&path).map_err(|e| Self::host("read the checkpoint", e))?;
        for d in ctx.devices {
            let name = d.device.name.as_str();
            let Some(bus) = bus_of(name) else { continue };
            for (uid, other) in cp.claims() {
                if uid == &ctx.claim.uid {
                    continue;
                }
                if let Some(p) = other
                    .prepared_devices
                    .iter()
                    .find(|p| conflict(name, &p.device_name) && bus_of(&p.device_name) == Some(bus))
                {
                    return Err(ModeError::claim(
                        MODE,
                        format!(
                            "device {name} is GPU {} which is prepared as {} for claim {}/{} ({uid}); a GPU is either passed through or used through its driver",
                            d.device.gpu.bus_id, p.device_name, other.namespace, other.name
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The IOMMU viability check: every other device of the group is unbound, on a safe driver or a bridge.
    fn check_group(&self, action: &VfioAction) -> Result<(), ModeError> {
        let roots = &self.config.roots;
        let dir = roots.iommu_groups().join(&action.iommu_group).join("devices");
        let entries = std::fs::read_dir(&dir).map_err(|e| {
            Self::host(
                format!("IOMMU group {} of {}: list {}", action.iommu_group, action.bus_id, dir.display()),
                e,
            )
        })?;
        for entry in entries {
            let entry = entry.map_err(|e| Self::host(format!("list {}", dir.display()), e))?;
            let member = entry.file_name().to_string_lossy().into_owned();
            if same_bus_id(&member, &action.bus_id) {
                continue;
            }
            let driver = current_driver(roots, &member).map_err(|e| Self::host("IOMMU group check", e))?;
            if driver.is_empty() || GROUP_SAFE_DRIVERS.contains(&driver.as_str()) {
                continue;
            }
            let bridge = pci_class(roots, &member).is_ok_and(|c| c >> 16 == 0x06);
            if !bridge {
                return Err(ModeError::claim(
                    MODE,
                    format!(
                        "{}: IOMMU group {} is not viable for passthrough: its device {member} is bound to {driver} (every other device of the group must be unbound, on vfio-pci or pci-stub, or a bridge)",
                        action.device, action.iommu_group
                    ),
                ));
            }
        }
        Ok(())
    }

    fn write(&self, path: &Path, value: &str, step: &str) -> Result<(), ModeError> {
        self.config
            .sysfs
            .write(path, value)
            .map_err(|e| Self::host(format!("{step}: write {:?} to {}", value.trim(), path.display()), e))
    }

    fn driver(&self, bus: &str) -> Result<String, ModeError> {
        current_driver(&self.config.roots, bus)
            .map_err(|e| Self::host(format!("read the driver of {bus}"), e))
    }

    fn edits(&self, ctx: &ClaimContext<'_>, action: &VfioAction) -> ModeEdits {
        let roots = &self.config.roots;
        let iommufd = roots.dev_iommu().exists();
        let node = |path: String| DeviceNode::new(path.clone(), path);
        let mut device = ContainerEdits::default();
        device.device_nodes.push(node(format!("/dev/vfio/{}", action.iommu_group)));
        if iommufd {
            let cdevs = std::fs::read_dir(roots.pci_device(&action.bus_id).join("vfio-dev"));
            let mut names: Vec<String> = cdevs
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("vfio"))
                .collect();
            names.sort();
            device.device_nodes.extend(names.into_iter().map(|n| node(format!("/dev/vfio/devices/{n}"))));
        }
        let mut edits = ModeEdits::default();
        if let Some(d) = ctx.devices.iter().find(|d| d.device.name == action.device) {
            edits.devices.insert(d.cdi_name.clone(), device);
        }
        if action.common {
            edits.common.device_nodes.push(node("/dev/vfio/vfio".to_owned()));
            if iommufd {
                edits.common.device_nodes.push(node("/dev/iommu".to_owned()));
            }
            edits.common.env.push("NVIDIA_VISIBLE_DEVICES=void".to_owned());
        }
        edits
    }

    /// Refuses to unbind a GPU from its driver while a process has its device node open.
    fn check_idle(
        &self,
        ctx: &ClaimContext<'_>,
        action: &VfioAction,
        current: &str,
    ) -> Result<(), ModeError> {
        let Some(proc_root) = &self.config.proc_root else { return Ok(()) };
        if current != self.config.default_driver {
            return Ok(());
        }
        let minor = ctx.devices.iter().find(|d| d.device.name == action.device).map(|d| d.device.gpu.minor);
        let Some(minor) = minor.filter(|m| *m != u32::MAX) else { return Ok(()) };
        let users = gpu_users(proc_root, minor);
        if users.is_empty() {
            return Ok(());
        }
        Err(ModeError::claim(
            MODE,
            format!(
                "{}: GPU {} is in use: /dev/nvidia{minor} is open in PIDs {} (stop them; for nvidia-persistenced turn persistence mode off: nvidia-smi -i {} -pm 0)",
                action.device,
                action.bus_id,
                users.join(", "),
                action.bus_id
            ),
        ))
    }

    /// Makes sure the `vfio-pci` driver is registered, loading its module when it is not.
    fn ensure_driver(&self) -> Result<(), ModeError> {
        let dir = self.config.roots.pci_driver(VFIO_DRIVER);
        if dir.exists() {
            return Ok(());
        }
        self.config
            .modules
            .load(VFIO_DRIVER)
            .map_err(|e| Self::host(format!("load kernel module {VFIO_DRIVER}"), e))?;
        if dir.exists() {
            Ok(())
        } else {
            Err(Self::host(
                format!("load kernel module {VFIO_DRIVER}"),
                format!("{} is still absent after modprobe", dir.display()),
            ))
        }
    }
}

impl ClaimMode for VfioMode {
    fn name(&self) -> &'static str {
        MODE
    }

    fn gate(&self) -> &'static str {
        GATE
    }

    fn plan(&self, ctx: &ClaimContext<'_>) -> Result<Vec<serde_json::Value>, ModeError> {
        self.check_conflicts(ctx)?;
        let roots = &self.config.roots;
        let mut actions = Vec::new();
        for d in ctx.devices.iter().filter(|d| d.device.kind == DeviceType::Vfio) {
            let bus = d.device.gpu.bus_id.clone();
            if !roots.pci_device(&bus).exists() {
                return Err(ModeError::claim(
                    MODE,
                    format!(
                        "{}: PCI device {bus} is not in {}",
                        d.device.name,
                        roots.pci_devices().display()
                    ),
                ));
            }
            let current = self.driver(&bus)?;
            let original = if current.is_empty() || current == VFIO_DRIVER {
                self.config.default_driver.clone()
            } else if current == self.config.default_driver {
                current
            } else {
                return Err(ModeError::claim(
                    MODE,
                    format!(
                        "{}: GPU {bus} is bound to driver {current}; only GPUs on {} or {VFIO_DRIVER} are passed through",
                        d.device.name, self.config.default_driver
                    ),
                ));
            };
            let group = iommu_group(roots, &bus)
                .map_err(|e| Self::host("read the IOMMU group", e))?
                .ok_or_else(|| {
                    ModeError::claim(
                        MODE,
                        format!("{}: GPU {bus} has no IOMMU group (is the IOMMU on?)", d.device.name),
                    )
                })?;
            let action = VfioAction {
                device: d.device.name.clone(),
                bus_id: bus,
                original_driver: original,
                iommu_group: group,
                common: actions.is_empty(),
            };
            actions.push(encode(MODE, &action)?);
        }
        Ok(actions)
    }

    fn apply(&self, ctx: &ClaimContext<'_>, action: &serde_json::Value) -> Result<ModeEdits, ModeError> {
        let action: VfioAction = decode(MODE, action)?;
        let roots = &self.config.roots;
        let bus = action.bus_id.as_str();
        let current = self.driver(bus)?;
        if current != VFIO_DRIVER {
            self.check_idle(ctx, &action, &current)?;
            self.ensure_driver()?;
            self.check_group(&action)?;
            let dev = roots.pci_device(bus);
            self.write(&dev.join("driver_override"), VFIO_DRIVER, &format!("bind {bus} to {VFIO_DRIVER}"))?;
            if !current.is_empty() {
                self.write(&dev.join("driver/unbind"), bus, &format!("unbind {bus} from {current}"))?;
            }
            let bind = roots.pci_driver(VFIO_DRIVER).join("bind");
            self.write(&bind, bus, &format!("bind {bus} to {VFIO_DRIVER}"))?;
            let now = self.driver(bus)?;
            if now != VFIO_DRIVER {
                return Err(Self::host(
                    format!("bind {bus} to {VFIO_DRIVER}"),
                    format!("the device is on {:?} after the bind", now),
                ));
            }
            tracing::info!(device = %action.device, bus, from = %current, "GPU bound to vfio-pci");
        }
        Ok(self.edits(ctx, &action))
    }

    fn revert(&self, action: &serde_json::Value) -> Result<(), ModeError> {
        let action: VfioAction = decode(MODE, action)?;
        let roots = &self.config.roots;
        let bus = action.bus_id.as_str();
        let dev = roots.pci_device(bus);
        let step = format!("give {bus} back to {}", action.original_driver);
        let override_path = dev.join("driver_override");
        let override_now = std::fs::read_to_string(&override_path).unwrap_or_default();
        if !matches!(override_now.trim(), "" | "(null)") {
            self.write(&override_path, "\n", &step)?;
        }
        let current = self.driver(bus)?;
        if current == action.original_driver {
            return Ok(());
        }
        if current == VFIO_DRIVER {
            self.write(&dev.join("driver/unbind"), bus, &format!("unbind {bus} from {VFIO_DRIVER}"))?;
        } else if !current.is_empty() {
            tracing::warn!(device = %action.device, bus, driver = %current, "GPU is on a driver this plugin did not bind; leaving it");
            return Ok(());
        }
        let bind = roots.pci_driver(&action.original_driver).join("bind");
        if bind.exists() {
            self.write(&bind, bus, &step)?;
        } else {
            self.write(&roots.drivers_probe(), bus, &step)?;
        }
        let now = self.driver(bus)?;
        if now != action.original_driver {
            return Err(Self::host(step, format!("the device is on {now:?} after the bind")));
        }
        tracing::info!(device = %action.device, bus, to = %action.original_driver, "GPU given back to its driver");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use proptest::prelude::*;

    #[test]
    fn sha1_vectors() {
        let hex = |b: [u8; 20]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
        assert_eq!(hex(sha1(b"abc")), "a9993e364706816aba3e25717850c26c9cd0d89d");
        assert_eq!(hex(sha1(b"")), "da39a3ee5e6b4b0d3255bfef95601890afd80709");
        assert_eq!(hex(sha1(&[b'a'; 1000])), "291e9a6c66994949b57ba5e650361e98fc36b1ba");
        assert_eq!(uuid_v5_dns("0000:3b:00.0"), "5f36833e-54b9-5234-b457-89cdb0ccb109");
    }

    #[test]
    fn bus_ids_compare_by_value() {
        assert!(same_bus_id("00000000:3B:00.0", "0000:3b:00.0"));
        assert!(!same_bus_id("0000:3b:00.0", "0000:3b:00.1"));
        assert!(!same_bus_id("", ""));
        assert_eq!(parse_bus_id("0000:3b:1f.7"), Some((0, 0x3b, 0x1f, 7)));
        assert_eq!(parse_bus_id("3b:00.0"), None);
    }

    #[test]
    fn addressable_memory_sums_64_bit_bars() {
        // BAR0 16 MiB 32-bit, BAR1 128 GiB 64-bit prefetchable, BAR3 32 MiB 64-bit, an I/O BAR, ROM.
        let resource = "0x00000000d0000000 0x00000000d0ffffff 0x0000000000040200\n\
                        0x0000206000000000 0x0000207fffffffff 0x000000000014220c\n\
                        0x0000000000000000 0x0000000000000000 0x0000000000000000\n\
                        0x0000208000000000 0x0000208001ffffff 0x000000000014220c\n\
                        0x0000000000000000 0x0000000000000000 0x0000000000000000\n\
                        0x000000000000e000 0x000000000000e07f 0x0000000000040101\n\
                        0x0000206000000000 0x0000207fffffffff 0x000000000014220c\n";
        assert_eq!(addressable_memory(resource), Some(256 << 30), "128 GiB + 32 MiB rounds up to 256 GiB");
        assert_eq!(addressable_memory(""), Some(0));
        assert_eq!(addressable_memory("zz 1 2"), None);
    }

    proptest! {
        #[test]
        fn addressable_memory_is_a_power_of_two_at_least_the_sum(sizes in proptest::collection::vec(1u64..1 << 30, 0..6)) {
            let text: String = sizes
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    let start = (i as u64 + 1) << 40;
                    format!("{start:#018x} {:#018x} 0x000000000014220c\n", start + s - 1)
                })
                .collect();
            let total: u64 = sizes.iter().sum();
            let got = addressable_memory(&text).unwrap();
            if total == 0 {
                prop_assert_eq!(got, 0);
            } else {
                prop_assert!(got.is_power_of_two() && got >= total && got / 2 < total);
            }
        }

        #[test]
        fn uuids_are_version_5_and_stable(name in "[0-9a-f:.]{0,20}") {
            let a = uuid_v5_dns(&name);
            prop_assert_eq!(&a, &uuid_v5_dns(&name));
            prop_assert_eq!(a.len(), 36);
            prop_assert_eq!(a.as_bytes()[14], b'5');
            prop_assert!(matches!(a.as_bytes()[19], b'8' | b'9' | b'a' | b'b'));
        }
    }
}
