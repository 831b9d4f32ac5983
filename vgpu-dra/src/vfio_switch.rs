//! The GPU module's `vfio-switch-<NODE_NAME>-<PCI>` Job (issue #34 item 3): one PCI function moved between
//! the `nvidia` driver and `vfio-pci` through sysfs, by `vgpu-node-agent vfio-switch --pci <addr> --to
//! vfio-pci|nvidia` in the Job's `switch` container. [`controller`] is the NVIDIA adapter's side: it
//! creates and watches those Jobs for the PhysicalGPUs' passthrough wish (`spec.passthrough`, else the
//! GPUClass policy in `status.classPassthrough`) and writes the PhysicalGPU condition `VfioSwitch`.
//!
//! # Steps
//!
//! Every path is under [`SysfsRoots::sys`] (`--sysfs-root`, the host's `/sys` mounted into the Job; tests use
//! a tree in a temporary directory). After each write the switch waits (polling every
//! [`Switcher::poll`], at most [`Switcher::timeout`]) for the state the kernel must reach; the real
//! kernel acts during the write, so the first look sees it.
//!
//! | step | to `vfio-pci` | to `nvidia` | waits for |
//! |---|---|---|---|
//! | 0 | `<dev>/driver` already links to `vfio-pci`: nothing (no write at all) | already on `nvidia`: nothing | |
//! | 1 | `drivers/vfio-pci` absent: load module `vfio-pci` (`chroot <host-root> modprobe vfio-pci`) | | `drivers/vfio-pci` present |
//! | 2 | write `vfio-pci` to `<dev>/driver_override` | write `\n` to `<dev>/driver_override` (clears it) | |
//! | 3 | bound to a driver: write `<bus>` to `<dev>/driver/unbind` | same | `<dev>/driver` gone |
//! | 4 | write `<bus>` to `drivers_probe` (the kernel picks the override) | write `<bus>` to `drivers/nvidia/bind` (to `drivers_probe` when `nvidia` is not registered) | `<dev>/driver` links to the target |
//!
//! Only GPUs on `nvidia`, on `vfio-pci` or unbound are switched: a GPU on another driver (`nouveau`) is
//! refused ([`SwitchError::ForeignDriver`]) rather than taken from it. Errors name the file and what was
//! expected there.
//!
//! # Job names
//!
//! [`job_name`]: `vfio-switch-<node>-<pci>` with the address's `:` and `.` as `-` (`0000:3b:00.0` →
//! `0000-3b-00-0`), lower case; longer than 63 characters (the Job controller copies the name into a label
//! value), it is cut and ends in 10 hex digits of a SHA-256 of the full name, so it stays unique.
//!
//! ```
//! use vgpu_dra::vfio::{SysfsRoots, fake::{FakeSysfs, SimulatedKernel}};
//! use vgpu_dra::vfio_switch::{Outcome, SwitchTarget, Switcher, job_name};
//! use std::sync::Arc;
//!
//! let dir = tempfile::tempdir()?;
//! let roots = SysfsRoots::under(dir.path());
//! let tree = FakeSysfs::new(&roots);
//! tree.add_gpu("0000:3b:00.0", 0x2330, "7", Some("nvidia"))?;
//! tree.add_driver("vfio-pci")?;
//! let switcher = Switcher::new(roots.clone(), Arc::new(SimulatedKernel::new(&roots)));
//! let pci = "0000:3b:00.0".parse()?;
//! assert_eq!(switcher.switch(&pci, SwitchTarget::VfioPci)?, Outcome::Switched { from: "nvidia".into(), to: SwitchTarget::VfioPci });
//! assert_eq!(tree.driver("0000:3b:00.0"), "vfio-pci");
//! assert_eq!(switcher.switch(&pci, SwitchTarget::VfioPci)?, Outcome::AlreadyBound(SwitchTarget::VfioPci));
//! assert_eq!(job_name("worker-1", &pci), "vfio-switch-worker-1-0000-3b-00-0");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod controller;
pub mod usage;

use std::{
    fmt,
    path::{Path, PathBuf},
    str::FromStr,
    sync::Arc,
    time::{Duration, Instant},
};

use vgpu_core::discovery::PciAddress;

use crate::vfio::{ChrootModprobe, KernelSysfs, ModuleLoader, SysfsRoots, SysfsWriter, VFIO_DRIVER};

/// The NVIDIA kernel driver's name in `/sys/bus/pci/drivers/`.
pub const NVIDIA_DRIVER: &str = "nvidia";
/// The prefix of every switch Job's name.
pub const JOB_PREFIX: &str = "vfio-switch-";
/// The longest Job name (the Job controller copies it into the `batch.kubernetes.io/job-name` label).
pub const MAX_JOB_NAME: usize = 63;
/// How long [`Switcher`] waits for the kernel after a write, by default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// How often [`Switcher`] looks at the state while it waits, by default.
pub const DEFAULT_POLL: Duration = Duration::from_millis(50);

/// The driver a switch moves a GPU to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SwitchTarget {
    /// `vfio-pci`: passed through (a VM owns the GPU).
    VfioPci,
    /// `nvidia`: used through the NVIDIA driver.
    Nvidia,
}

impl SwitchTarget {
    /// The driver's name in sysfs (`vfio-pci`, `nvidia`).
    pub fn driver(self) -> &'static str {
        match self {
            Self::VfioPci => VFIO_DRIVER,
            Self::Nvidia => NVIDIA_DRIVER,
        }
    }

    /// The target of a `spec.passthrough` value.
    pub fn for_passthrough(passthrough: bool) -> Self {
        if passthrough { Self::VfioPci } else { Self::Nvidia }
    }
}

impl fmt::Display for SwitchTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.driver())
    }
}

/// A `--to` value that is neither `vfio-pci` nor `nvidia`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a switch target: expected vfio-pci or nvidia")]
pub struct UnknownTarget(pub String);

impl FromStr for SwitchTarget {
    type Err = UnknownTarget;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            VFIO_DRIVER => Ok(Self::VfioPci),
            NVIDIA_DRIVER => Ok(Self::Nvidia),
            other => Err(UnknownTarget(other.to_owned())),
        }
    }
}

/// What [`Switcher::switch`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The GPU was already on the target driver: nothing was written.
    AlreadyBound(SwitchTarget),
    /// The GPU moved from `from` (empty: it was unbound) to `to`.
    Switched {
        /// The driver before (empty when unbound).
        from: String,
        /// The driver now.
        to: SwitchTarget,
    },
}

/// A switch that could not be done; each names the file and what was expected there.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SwitchError {
    /// The PCI function is not in sysfs.
    #[error("{path}: no such PCI device (expected the device directory of {pci})")]
    NoDevice {
        /// `<sys>/bus/pci/devices/<bus>`.
        path: PathBuf,
        /// The address.
        pci: String,
    },
    /// Reading or writing a sysfs file failed.
    #[error("{path}: {action}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What was being done (`write "vfio-pci"`, `read link`).
        action: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The GPU is on a driver this switch does not take GPUs from.
    #[error(
        "{path}: the device is bound to {driver}; expected nvidia, vfio-pci or no driver (unbind it from {driver} first)"
    )]
    ForeignDriver {
        /// `<dev>/driver`.
        path: PathBuf,
        /// The driver it is on.
        driver: String,
    },
    /// The kernel did not reach the expected state in time.
    #[error("{path}: expected {expected} within {waited:?}, found {found}")]
    Timeout {
        /// The file looked at.
        path: PathBuf,
        /// What it should have shown.
        expected: String,
        /// What it showed last.
        found: String,
        /// How long the switch waited.
        waited: Duration,
    },
    /// Loading the `vfio-pci` module failed.
    #[error("{path} is absent and loading kernel module vfio-pci failed: {message}")]
    ModuleLoad {
        /// `<sys>/bus/pci/drivers/vfio-pci`.
        path: PathBuf,
        /// The loader's message.
        message: String,
    },
}

/// Moves PCI functions between `nvidia` and `vfio-pci` (module docs).
#[derive(Debug, Clone)]
pub struct Switcher {
    roots: SysfsRoots,
    writer: Arc<dyn SysfsWriter>,
    modules: Arc<dyn ModuleLoader>,
    /// How long to wait for the kernel after a write.
    pub timeout: Duration,
    /// How often to look while waiting.
    pub poll: Duration,
}

impl Switcher {
    /// A switcher writing through `writer`; modules are loaded with `chroot <host-root> modprobe`.
    pub fn new(roots: SysfsRoots, writer: Arc<dyn SysfsWriter>) -> Self {
        let modules = Arc::new(ChrootModprobe { host_root: roots.host_root.clone() });
        Self { roots, writer, modules, timeout: DEFAULT_TIMEOUT, poll: DEFAULT_POLL }
    }

    /// The real kernel under `roots`.
    pub fn host(roots: SysfsRoots) -> Self {
        Self::new(roots, Arc::new(KernelSysfs))
    }

    /// Uses `modules` to load `vfio-pci`.
    pub fn with_modules(mut self, modules: Arc<dyn ModuleLoader>) -> Self {
        self.modules = modules;
        self
    }

    /// Sets the wait limit and the polling period.
    pub fn with_timing(mut self, timeout: Duration, poll: Duration) -> Self {
        self.timeout = timeout;
        self.poll = poll;
        self
    }

    /// The roots.
    pub fn roots(&self) -> &SysfsRoots {
        &self.roots
    }

    /// The driver `pci` is bound to now (empty: none).
    pub fn current_driver(&self, pci: &PciAddress) -> Result<String, SwitchError> {
        let dev = self.device(pci)?;
        read_driver(&dev.join("driver"))
    }

    /// Moves `pci` to `to` (module docs); a GPU already there is left untouched.
    pub fn switch(&self, pci: &PciAddress, to: SwitchTarget) -> Result<Outcome, SwitchError> {
        let dev = self.device(pci)?;
        let bus = pci.to_string();
        let link = dev.join("driver");
        let from = read_driver(&link)?;
        if from == to.driver() {
            return Ok(Outcome::AlreadyBound(to));
        }
        if !from.is_empty() && from != VFIO_DRIVER && from != NVIDIA_DRIVER {
            return Err(SwitchError::ForeignDriver { path: link, driver: from });
        }
        if to == SwitchTarget::VfioPci {
            self.ensure_vfio_driver()?;
        }
        let override_value = match to {
            SwitchTarget::VfioPci => VFIO_DRIVER,
            SwitchTarget::Nvidia => "\n",
        };
        self.write(&dev.join("driver_override"), override_value)?;
        if !from.is_empty() {
            self.write(&link.join("unbind"), &bus)?;
            self.wait(&link, "no driver (unbound)", |driver| driver.is_empty())?;
        }
        let bind = match to {
            SwitchTarget::VfioPci => self.roots.drivers_probe(),
            SwitchTarget::Nvidia => {
                let bind = self.roots.pci_driver(NVIDIA_DRIVER).join("bind");
                if bind.exists() { bind } else { self.roots.drivers_probe() }
            }
        };
        self.write(&bind, &bus)?;
        self.wait(&link, &format!("a link to driver {to}"), |driver| driver == to.driver())?;
        tracing::info!(pci = %bus, from = %from, to = %to, "PCI function switched");
        Ok(Outcome::Switched { from, to })
    }

    fn device(&self, pci: &PciAddress) -> Result<PathBuf, SwitchError> {
        let dev = self.roots.pci_device(&pci.to_string());
        if dev.exists() { Ok(dev) } else { Err(SwitchError::NoDevice { path: dev, pci: pci.to_string() }) }
    }

    fn write(&self, path: &Path, value: &str) -> Result<(), SwitchError> {
        self.writer.write(path, value).map_err(|source| SwitchError::Io {
            path: path.to_path_buf(),
            action: format!("write {:?}", value.trim()),
            source,
        })
    }

    fn ensure_vfio_driver(&self) -> Result<(), SwitchError> {
        let dir = self.roots.pci_driver(VFIO_DRIVER);
        if dir.exists() {
            return Ok(());
        }
        self.modules
            .load(VFIO_DRIVER)
            .map_err(|message| SwitchError::ModuleLoad { path: dir.clone(), message })?;
        let deadline = Instant::now() + self.timeout;
        while !dir.exists() {
            if Instant::now() >= deadline {
                return Err(SwitchError::Timeout {
                    path: dir,
                    expected: "the vfio-pci driver directory after modprobe".into(),
                    found: "nothing".into(),
                    waited: self.timeout,
                });
            }
            std::thread::sleep(self.poll);
        }
        Ok(())
    }

    /// Polls `<dev>/driver` until `done` holds for the driver it names (empty: unbound).
    fn wait(&self, link: &Path, expected: &str, done: impl Fn(&str) -> bool) -> Result<(), SwitchError> {
        let start = Instant::now();
        loop {
            let driver = read_driver(link)?;
            if done(&driver) {
                return Ok(());
            }
            if start.elapsed() >= self.timeout {
                let found = if driver.is_empty() {
                    "no driver".to_owned()
                } else {
                    format!("a link to driver {driver}")
                };
                return Err(SwitchError::Timeout {
                    path: link.to_path_buf(),
                    expected: expected.to_owned(),
                    found,
                    waited: self.timeout,
                });
            }
            std::thread::sleep(self.poll);
        }
    }
}

/// The driver a `<dev>/driver` link names (empty when the link is absent).
fn read_driver(link: &Path) -> Result<String, SwitchError> {
    match std::fs::read_link(link) {
        Ok(target) => Ok(target.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(String::new()),
        Err(source) => Err(SwitchError::Io { path: link.to_path_buf(), action: "read link".into(), source }),
    }
}

/// A PCI address as a DNS label part: `0000:3b:00.0` → `0000-3b-00-0`.
pub fn dns_safe_pci(pci: &PciAddress) -> String {
    pci.to_string().replace([':', '.'], "-")
}

/// The switch Job of `pci` on `node` (module docs): a DNS label of at most [`MAX_JOB_NAME`] characters.
pub fn job_name(node: &str, pci: &PciAddress) -> String {
    let node: String = node
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '-' })
        .collect();
    let full = format!("{JOB_PREFIX}{node}-{}", dns_safe_pci(pci));
    if full.len() <= MAX_JOB_NAME {
        return full;
    }
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(full.as_bytes());
    let hash: String = digest.iter().take(5).map(|b| format!("{b:02x}")).collect();
    let keep = MAX_JOB_NAME - hash.len() - 1;
    let head = full[..keep].trim_end_matches('-');
    format!("{head}-{hash}")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use proptest::prelude::*;

    use super::*;
    use crate::vfio::fake::{FakeModules, FakeSysfs, SimulatedKernel};

    const BUS: &str = "0000:3b:00.0";

    fn pci() -> PciAddress {
        BUS.parse().unwrap()
    }

    fn node(driver: Option<&str>, vfio_loaded: bool) -> (tempfile::TempDir, FakeSysfs, Arc<SimulatedKernel>) {
        let dir = tempfile::tempdir().unwrap();
        let roots = SysfsRoots::under(dir.path());
        let tree = FakeSysfs::new(&roots);
        tree.add_gpu(BUS, 0x2330, "7", driver).unwrap();
        tree.add_driver(NVIDIA_DRIVER).unwrap();
        if vfio_loaded {
            tree.add_driver(VFIO_DRIVER).unwrap();
        }
        let kernel = Arc::new(SimulatedKernel::new(&roots));
        (dir, tree, kernel)
    }

    fn switcher(tree: &FakeSysfs, kernel: &Arc<SimulatedKernel>) -> Switcher {
        Switcher::new(tree.roots().clone(), kernel.clone())
            .with_modules(Arc::new(FakeModules::new(tree.roots(), true)))
            .with_timing(Duration::from_millis(200), Duration::from_millis(5))
    }

    fn writes(kernel: &SimulatedKernel) -> Vec<(String, String)> {
        kernel.writes()
    }

    #[test]
    fn to_vfio_writes_override_unbind_probe_in_that_order() {
        let (_dir, tree, kernel) = node(Some("nvidia"), true);
        let out = switcher(&tree, &kernel).switch(&pci(), SwitchTarget::VfioPci).unwrap();
        assert_eq!(out, Outcome::Switched { from: "nvidia".into(), to: SwitchTarget::VfioPci });
        assert_eq!(
            writes(&kernel),
            [
                (format!("bus/pci/devices/{BUS}/driver_override"), "vfio-pci".to_owned()),
                (format!("bus/pci/devices/{BUS}/driver/unbind"), BUS.to_owned()),
                ("bus/pci/drivers_probe".to_owned(), BUS.to_owned()),
            ]
        );
        assert_eq!(tree.driver(BUS), "vfio-pci");
        assert_eq!(tree.driver_override(BUS), "vfio-pci");
    }

    #[test]
    fn to_nvidia_clears_the_override_and_binds_nvidia() {
        let (_dir, tree, kernel) = node(Some("nvidia"), true);
        let s = switcher(&tree, &kernel);
        s.switch(&pci(), SwitchTarget::VfioPci).unwrap();
        kernel.clear();
        let out = s.switch(&pci(), SwitchTarget::Nvidia).unwrap();
        assert_eq!(out, Outcome::Switched { from: "vfio-pci".into(), to: SwitchTarget::Nvidia });
        assert_eq!(
            writes(&kernel),
            [
                (format!("bus/pci/devices/{BUS}/driver_override"), "\n".to_owned()),
                (format!("bus/pci/devices/{BUS}/driver/unbind"), BUS.to_owned()),
                ("bus/pci/drivers/nvidia/bind".to_owned(), BUS.to_owned()),
            ]
        );
        assert_eq!(tree.driver(BUS), "nvidia");
        assert_eq!(tree.driver_override(BUS), "(null)");
    }

    #[test]
    fn already_bound_is_a_no_op_without_writes() {
        for (driver, target) in [("nvidia", SwitchTarget::Nvidia), ("vfio-pci", SwitchTarget::VfioPci)] {
            let (_dir, tree, kernel) = node(Some(driver), true);
            let out = switcher(&tree, &kernel).switch(&pci(), target).unwrap();
            assert_eq!(out, Outcome::AlreadyBound(target));
            assert!(writes(&kernel).is_empty(), "{driver}: {:?}", writes(&kernel));
        }
    }

    #[test]
    fn an_unbound_gpu_is_bound_without_an_unbind() {
        let (_dir, tree, kernel) = node(None, true);
        let out = switcher(&tree, &kernel).switch(&pci(), SwitchTarget::VfioPci).unwrap();
        assert_eq!(out, Outcome::Switched { from: String::new(), to: SwitchTarget::VfioPci });
        assert!(!writes(&kernel).iter().any(|(p, _)| p.ends_with("unbind")));
    }

    #[test]
    fn vfio_pci_is_loaded_when_absent() {
        let (_dir, tree, kernel) = node(Some("nvidia"), false);
        let modules = Arc::new(FakeModules::new(tree.roots(), true));
        let s = switcher(&tree, &kernel).with_modules(modules.clone());
        s.switch(&pci(), SwitchTarget::VfioPci).unwrap();
        assert_eq!(modules.loads(), ["vfio-pci"]);
        let (_dir, tree, kernel) = node(Some("nvidia"), false);
        let s = switcher(&tree, &kernel).with_modules(Arc::new(FakeModules::new(tree.roots(), false)));
        let err = s.switch(&pci(), SwitchTarget::VfioPci).unwrap_err();
        assert!(matches!(err, SwitchError::ModuleLoad { .. }), "{err}");
        assert!(err.to_string().contains("drivers/vfio-pci is absent"), "{err}");
        assert_eq!(tree.driver(BUS), "nvidia", "nothing was unbound");
    }

    #[test]
    fn a_foreign_driver_is_refused_untouched() {
        let (_dir, tree, kernel) = node(Some("nouveau"), true);
        let err = switcher(&tree, &kernel).switch(&pci(), SwitchTarget::VfioPci).unwrap_err();
        assert!(
            err.to_string().contains("bound to nouveau; expected nvidia, vfio-pci or no driver"),
            "{err}"
        );
        assert!(writes(&kernel).is_empty());
    }

    #[test]
    fn a_missing_device_names_its_directory() {
        let (_dir, tree, kernel) = node(Some("nvidia"), true);
        let other: PciAddress = "0000:86:00.0".parse().unwrap();
        let err = switcher(&tree, &kernel).switch(&other, SwitchTarget::VfioPci).unwrap_err();
        assert!(err.to_string().contains("bus/pci/devices/0000:86:00.0: no such PCI device"), "{err}");
    }

    #[test]
    fn a_failed_write_names_the_file_and_value() {
        let (_dir, tree, kernel) = node(Some("nvidia"), true);
        kernel.fail_next("drivers_probe");
        let err = switcher(&tree, &kernel).switch(&pci(), SwitchTarget::VfioPci).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("drivers_probe: write \"0000:3b:00.0\""), "{text}");
    }

    /// A kernel that accepts the writes and does nothing: the switch times out naming the link.
    #[derive(Debug)]
    struct DeafKernel;

    impl SysfsWriter for DeafKernel {
        fn write(&self, _: &Path, _: &str) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_kernel_that_does_not_act_times_out_with_what_was_expected() {
        let (_dir, tree, _) = node(Some("nvidia"), true);
        let s = Switcher::new(tree.roots().clone(), Arc::new(DeafKernel))
            .with_timing(Duration::from_millis(30), Duration::from_millis(5));
        let err = s.switch(&pci(), SwitchTarget::VfioPci).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("/driver: expected no driver (unbound) within"), "{text}");
        assert!(text.contains("found a link to driver nvidia"), "{text}");
    }

    #[test]
    fn targets_parse_and_print() {
        assert_eq!("vfio-pci".parse::<SwitchTarget>().unwrap(), SwitchTarget::VfioPci);
        assert_eq!("nvidia".parse::<SwitchTarget>().unwrap(), SwitchTarget::Nvidia);
        assert_eq!(
            "vfio".parse::<SwitchTarget>().unwrap_err().to_string(),
            "\"vfio\" is not a switch target: expected vfio-pci or nvidia"
        );
        assert_eq!(SwitchTarget::for_passthrough(true).to_string(), "vfio-pci");
        assert_eq!(SwitchTarget::for_passthrough(false).to_string(), "nvidia");
    }

    #[test]
    fn long_names_are_cut_with_a_hash() {
        let long = "n".repeat(80);
        let a = job_name(&long, &pci());
        let b = job_name(&long, &"0000:3b:00.1".parse().unwrap());
        assert_eq!(a.len(), MAX_JOB_NAME);
        assert_ne!(a, b);
        assert_eq!(job_name("Node_A.example", &pci()), "vfio-switch-node-a-example-0000-3b-00-0");
    }

    proptest! {
        #[test]
        fn job_names_are_dns_labels_and_keep_the_address(
            node in "[a-z0-9]([-a-z0-9.]{0,100}[a-z0-9])?",
            domain in 0u32..0x1_0000, bus: u8, device in 0u8..32, function in 0u8..8,
        ) {
            let pci = PciAddress { domain, bus, device, function };
            let name = job_name(&node, &pci);
            prop_assert!(vgpu_api::is_dns_label(&name), "{}", name);
            prop_assert_eq!(&name, &job_name(&node, &pci));
            prop_assert!(name.starts_with(JOB_PREFIX));
            let full = format!("{JOB_PREFIX}{}-{}", node.replace('.', "-"), dns_safe_pci(&pci));
            if full.len() <= MAX_JOB_NAME {
                prop_assert_eq!(name, full);
            }
        }

        #[test]
        fn dns_safe_addresses_round_trip(domain in 0u32..0x1_0000, bus: u8, device in 0u8..32, function in 0u8..8) {
            let pci = PciAddress { domain, bus, device, function };
            let safe = dns_safe_pci(&pci);
            let mut parts = safe.split('-');
            let back = format!(
                "{}:{}:{}.{}",
                parts.next().unwrap(), parts.next().unwrap(), parts.next().unwrap(), parts.next().unwrap()
            );
            prop_assert_eq!(back.parse::<PciAddress>().unwrap(), pci);
        }

        #[test]
        fn targets_parse_only_the_two_drivers(s in "\\PC{0,12}") {
            let parsed = s.parse::<SwitchTarget>();
            prop_assert_eq!(parsed.is_ok(), s == "vfio-pci" || s == "nvidia");
            if let Ok(t) = parsed {
                prop_assert_eq!(t.to_string(), s);
            }
        }
    }
}
