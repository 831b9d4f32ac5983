//! Test doubles for [`super`]: a sysfs tree in a directory ([`FakeSysfs`]), a writer that acts on the bind
//! files as the kernel would ([`SimulatedKernel`], deterministic: the symlink moves during the write), and a
//! module loader ([`FakeModules`]). Nothing here touches the real host.
//!
//! | write ([`SimulatedKernel`]) | what the simulated kernel does |
//! |---|---|
//! | `<dev>/driver_override` | stores the value (`(null)` when blank) |
//! | `<dev>/driver/unbind`, `drivers/<d>/unbind` | removes `<dev>/driver` (fails when unbound or bound elsewhere) |
//! | `drivers/<d>/bind` | links `<dev>/driver` → `drivers/<d>` (fails when bound, or when `driver_override` names another driver) |
//! | `drivers_probe` | binds to `driver_override`, else to the device's native driver, when that driver is registered |
//!
//! [`PollingKernel`] is the same kernel for writes made by another process (the `vfio-switch` Job's
//! container, with the tree mounted in): the bind files are plain files there, so a thread looks at them
//! every period, and a non-empty one is emptied and acted on as [`SimulatedKernel`] does. `driver_override`
//! needs no reaction (the kernel only stores it; the bind steps read it).

use std::{
    path::{Path, PathBuf},
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use super::{ModuleLoader, SysfsRoots, SysfsWriter, VFIO_DRIVER, VFIO_MODULE};

/// File in a fake device directory naming the driver `drivers_probe` picks without an override.
pub const NATIVE_DRIVER_FILE: &str = ".native_driver";

/// Builds a sysfs tree under [`SysfsRoots::sys`].
#[derive(Debug, Clone)]
pub struct FakeSysfs {
    roots: SysfsRoots,
}

impl FakeSysfs {
    /// An empty tree (directories are made as devices are added).
    pub fn new(roots: &SysfsRoots) -> Self {
        Self { roots: roots.clone() }
    }

    /// The roots.
    pub fn roots(&self) -> &SysfsRoots {
        &self.roots
    }

    /// Registers driver `name` (`drivers/<name>/{bind,unbind}`).
    pub fn add_driver(&self, name: &str) -> std::io::Result<()> {
        let dir = self.roots.pci_driver(name);
        std::fs::create_dir_all(&dir)?;
        for file in ["bind", "unbind", "new_id"] {
            if !dir.join(file).exists() {
                std::fs::write(dir.join(file), "")?;
            }
        }
        Ok(())
    }

    /// An NVIDIA 3D controller at `bus` (device ID `device_id`, a 32 GiB 64-bit BAR and a 16 MiB 32-bit one)
    /// in IOMMU group `group`, bound to `driver` (also its native driver; `None`: unbound, native `nvidia`).
    pub fn add_gpu(
        &self,
        bus: &str,
        device_id: u16,
        group: &str,
        driver: Option<&str>,
    ) -> std::io::Result<()> {
        let resource = "0x00000000d0000000 0x00000000d0ffffff 0x0000000000040200\n\
                        0x0000004000000000 0x00000047ffffffff 0x000000000014220c\n\
                        0x0000000000000000 0x0000000000000000 0x0000000000000000\n";
        self.add_device(bus, 0x10de, device_id, 0x030200, group, driver, resource)?;
        std::fs::write(self.roots.pci_device(bus).join(NATIVE_DRIVER_FILE), driver.unwrap_or("nvidia"))
    }

    /// Any PCI function (e.g. the GPU's audio function `0x040300`, a bridge `0x060400`) in IOMMU group
    /// `group`, bound to `driver`.
    #[allow(clippy::too_many_arguments)]
    pub fn add_device(
        &self,
        bus: &str,
        vendor: u16,
        device_id: u16,
        class: u32,
        group: &str,
        driver: Option<&str>,
        resource: &str,
    ) -> std::io::Result<()> {
        let sys = &self.roots.sys;
        let real = sys.join("devices/pci0000:00").join(bus);
        std::fs::create_dir_all(&real)?;
        for (file, value) in [
            ("vendor", format!("0x{vendor:04x}\n")),
            ("device", format!("0x{device_id:04x}\n")),
            ("class", format!("0x{class:06x}\n")),
            ("resource", resource.to_owned()),
            ("numa_node", "0\n".to_owned()),
            ("driver_override", "(null)\n".to_owned()),
        ] {
            std::fs::write(real.join(file), value)?;
        }
        std::fs::create_dir_all(self.roots.pci_devices())?;
        if !self.roots.drivers_probe().exists() {
            std::fs::write(self.roots.drivers_probe(), "")?;
        }
        std::os::unix::fs::symlink(&real, self.roots.pci_device(bus))?;
        let group_dir = self.roots.iommu_groups().join(group);
        std::fs::create_dir_all(group_dir.join("devices"))?;
        std::os::unix::fs::symlink(&group_dir, real.join("iommu_group"))?;
        std::os::unix::fs::symlink(&real, group_dir.join("devices").join(bus))?;
        if let Some(driver) = driver {
            self.add_driver(driver)?;
            std::os::unix::fs::symlink(self.roots.pci_driver(driver), real.join("driver"))?;
        }
        Ok(())
    }

    /// The driver `bus` is bound to now (empty: none).
    pub fn driver(&self, bus: &str) -> String {
        super::current_driver(&self.roots, bus).unwrap_or_default()
    }

    /// `driver_override` of `bus`, trimmed (`(null)` when unset).
    pub fn driver_override(&self, bus: &str) -> String {
        std::fs::read_to_string(self.roots.pci_device(bus).join("driver_override"))
            .unwrap_or_default()
            .trim()
            .to_owned()
    }
}

/// One write the simulated kernel received: the path relative to [`SysfsRoots::sys`] and the value.
pub type Write = (String, String);

/// A [`SysfsWriter`] that applies each write to the tree as the kernel would (module table) and records it.
#[derive(Debug)]
pub struct SimulatedKernel {
    roots: SysfsRoots,
    log: Mutex<Vec<Write>>,
    fail: Mutex<Option<String>>,
}

impl SimulatedKernel {
    /// The kernel of `roots`.
    pub fn new(roots: &SysfsRoots) -> Self {
        Self { roots: roots.clone(), log: Mutex::new(Vec::new()), fail: Mutex::new(None) }
    }

    /// Every write so far, in order.
    pub fn writes(&self) -> Vec<Write> {
        self.log.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Forgets the recorded writes.
    pub fn clear(&self) {
        self.log.lock().unwrap_or_else(PoisonError::into_inner).clear();
    }

    /// Makes the next write to a path ending in `suffix` fail (once) with EIO.
    pub fn fail_next(&self, suffix: &str) {
        *self.fail.lock().unwrap_or_else(PoisonError::into_inner) = Some(suffix.to_owned());
    }

    fn relative(&self, path: &Path) -> String {
        path.strip_prefix(&self.roots.sys).unwrap_or(path).display().to_string()
    }

    fn device(&self, bus: &str) -> std::io::Result<PathBuf> {
        let dev = self.roots.pci_device(bus);
        if dev.exists() { Ok(dev) } else { Err(errno(libc_enodev(), &format!("no PCI device {bus}"))) }
    }

    fn bind(&self, bus: &str, driver: &str) -> std::io::Result<()> {
        let dev = self.device(bus)?;
        if std::fs::symlink_metadata(dev.join("driver")).is_ok() {
            return Err(errno(16, &format!("{bus} is already bound")));
        }
        let over = std::fs::read_to_string(dev.join("driver_override")).unwrap_or_default();
        let over = over.trim();
        if !matches!(over, "" | "(null)") && over != driver {
            return Err(errno(libc_enodev(), &format!("{bus} has driver_override {over}, not {driver}")));
        }
        std::os::unix::fs::symlink(self.roots.pci_driver(driver), dev.join("driver"))
    }
}

fn libc_enodev() -> i32 {
    19
}

fn errno(code: i32, what: &str) -> std::io::Error {
    let os = std::io::Error::from_raw_os_error(code);
    std::io::Error::new(os.kind(), format!("{what}: {os}"))
}

impl SysfsWriter for SimulatedKernel {
    fn write(&self, path: &Path, value: &str) -> std::io::Result<()> {
        self.log.lock().unwrap_or_else(PoisonError::into_inner).push((self.relative(path), value.to_owned()));
        let failing = {
            let mut fail = self.fail.lock().unwrap_or_else(PoisonError::into_inner);
            let hit = fail.as_deref().is_some_and(|s| path.to_string_lossy().ends_with(s));
            if hit {
                *fail = None;
            }
            hit
        };
        if failing {
            return Err(errno(5, "injected failure"));
        }
        if !path.exists() {
            return Err(errno(2, &format!("{} does not exist", path.display())));
        }
        let bus = value.trim();
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let parent = path.parent().map(Path::to_path_buf).unwrap_or_default();
        match name.as_str() {
            "driver_override" => {
                let stored = if bus.is_empty() { "(null)\n".to_owned() } else { format!("{bus}\n") };
                std::fs::write(path, stored)
            }
            "unbind" => {
                let dev = self.device(bus)?;
                let link = dev.join("driver");
                let bound = std::fs::canonicalize(&link)
                    .map_err(|_| errno(libc_enodev(), &format!("{bus} is not bound")))?;
                if std::fs::canonicalize(&parent)? != bound {
                    return Err(errno(libc_enodev(), &format!("{bus} is not bound to {}", parent.display())));
                }
                std::fs::remove_file(link)
            }
            "bind" => {
                let driver = parent.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                self.bind(bus, &driver)
            }
            "drivers_probe" => {
                let dev = self.device(bus)?;
                if std::fs::symlink_metadata(dev.join("driver")).is_ok() {
                    return Ok(());
                }
                let over = std::fs::read_to_string(dev.join("driver_override")).unwrap_or_default();
                let native = std::fs::read_to_string(dev.join(NATIVE_DRIVER_FILE)).unwrap_or_default();
                let target = match over.trim() {
                    "" | "(null)" => native.trim().to_owned(),
                    o => o.to_owned(),
                };
                if self.roots.pci_driver(&target).exists() { self.bind(bus, &target) } else { Ok(()) }
            }
            other => Err(errno(22, &format!("the simulated kernel does not handle {other}"))),
        }
    }
}

/// A [`ModuleLoader`] that records the loads; a working one registers `vfio-pci` as modprobe would.
#[derive(Debug)]
pub struct FakeModules {
    roots: SysfsRoots,
    works: bool,
    loads: Mutex<Vec<String>>,
}

impl FakeModules {
    /// A loader whose `vfio-pci` load succeeds (`works`) or fails.
    pub fn new(roots: &SysfsRoots, works: bool) -> Self {
        Self { roots: roots.clone(), works, loads: Mutex::new(Vec::new()) }
    }

    /// The modules asked for, in order.
    pub fn loads(&self) -> Vec<String> {
        self.loads.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

impl ModuleLoader for FakeModules {
    fn load(&self, module: &str) -> Result<(), String> {
        self.loads.lock().unwrap_or_else(PoisonError::into_inner).push(module.to_owned());
        if !self.works {
            return Err(format!("modprobe: FATAL: Module {module} not found"));
        }
        if module == VFIO_DRIVER {
            FakeSysfs::new(&self.roots).add_driver(VFIO_DRIVER).map_err(|e| e.to_string())?;
            std::fs::create_dir_all(self.roots.module(VFIO_MODULE)).map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}

/// A [`SimulatedKernel`] driven by a thread that polls the bind files (module docs), for writers in another
/// process. Stops when dropped.
#[derive(Debug)]
pub struct PollingKernel {
    kernel: Arc<SimulatedKernel>,
    errors: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl PollingKernel {
    /// Starts polling the tree of `roots` every `period` (creates `drivers_probe` when absent).
    pub fn start(roots: &SysfsRoots, period: Duration) -> std::io::Result<Self> {
        let probe = roots.drivers_probe();
        if !probe.exists() {
            std::fs::write(&probe, "")?;
        }
        let kernel = Arc::new(SimulatedKernel::new(roots));
        let errors = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (roots, kernel, errors, stop) = (roots.clone(), kernel.clone(), errors.clone(), stop.clone());
            std::thread::Builder::new().name("polling-kernel".into()).spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    for (path, value) in take_writes(&roots) {
                        if let Err(e) = kernel.write(&path, &value) {
                            let line = format!("{}: write {value:?}: {e}", path.display());
                            errors.lock().unwrap_or_else(PoisonError::into_inner).push(line);
                        }
                    }
                    std::thread::sleep(period);
                }
            })?
        };
        Ok(Self { kernel, errors, stop, thread: Some(thread) })
    }

    /// Every write acted on so far (path relative to the sysfs root, value), in order.
    pub fn writes(&self) -> Vec<Write> {
        self.kernel.writes()
    }

    /// The writes the kernel refused (`<path>: write "<value>": <error>`), in order.
    pub fn errors(&self) -> Vec<String> {
        self.errors.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

impl Drop for PollingKernel {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The non-empty bind files of the tree (`drivers/*/{bind,unbind}`, `drivers_probe`), each emptied, with
/// the value it held (trimmed).
fn take_writes(roots: &SysfsRoots) -> Vec<(PathBuf, String)> {
    let mut files = vec![roots.drivers_probe()];
    let drivers = roots.sys.join("bus/pci/drivers");
    let mut dirs: Vec<PathBuf> =
        std::fs::read_dir(&drivers).into_iter().flatten().flatten().map(|e| e.path()).collect();
    dirs.sort();
    for dir in dirs {
        files.push(dir.join("unbind"));
        files.push(dir.join("bind"));
    }
    let mut taken = Vec::new();
    for file in files {
        let Ok(text) = std::fs::read_to_string(&file) else { continue };
        let value = text.trim();
        if value.is_empty() {
            continue;
        }
        if std::fs::write(&file, "").is_ok() {
            taken.push((file, value.to_owned()));
        }
    }
    taken
}
