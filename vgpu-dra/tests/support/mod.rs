//! A node for the DRA plugin tests: temporary kubelet, CDI and manager directories, a mock backend with two
//! GPUs (minors 0 and 1, 24 GiB each), in-memory claims, a boot-ID file, and the plugin's state and servers.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::{
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use vgpu_core::backend::{DeviceBackend, NvidiaAdapter, mock::MockBackend};
use vgpu_dra::{
    claims::{InMemoryClaims, allocated, allocation_result, claim},
    config::DriverConfig,
    devices::{AllocatableDevices, DeviceConfig},
    driver::{Driver, RunningDriver},
    health::{HealthConfig, HealthMonitor},
    state::{
        DeviceState,
        fault::{FaultHook, FaultPoint},
    },
};

pub const NODE: &str = "node-1";
pub const DRIVER: &str = "manager.nvidia.com";
const MOCK: &str = "gpus:\n  - { uuid: GPU-a, name: NVIDIA A30, memoryMiB: 24576, minor: 0 }\n  - { uuid: GPU-b, name: NVIDIA A30, memoryMiB: 24576, minor: 1 }\n";

pub struct TestNode {
    pub dir: tempfile::TempDir,
    pub config: Arc<DriverConfig>,
    pub devices: Arc<AllocatableDevices>,
    pub claims: Arc<InMemoryClaims>,
    /// The devices' health; `apply` a backend event to change it.
    pub health: HealthMonitor,
}

impl TestNode {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut config = DriverConfig::under(NODE, dir.path());
        config.boot_id_path = dir.path().join("boot_id");
        config.registration_guard_interval = Duration::from_millis(20);
        config.stale_sweep_interval = Duration::from_secs(3600);
        std::fs::write(&config.boot_id_path, "boot-1\n").unwrap();
        // The vGPU runtime files an install step puts on the host (Prepare refuses vGPU claims without them).
        vgpu_core::abi::runtime_files::install(&config.manager_dir, &config.library_version, b"").unwrap();
        let backend = MockBackend::from_yaml_str(MOCK).unwrap();
        let devices = AllocatableDevices::from_backend(&backend, &DeviceConfig::default()).unwrap();
        assert!(backend.devices().unwrap().len() == 2);
        let health = HealthMonitor::new(HealthConfig::new(DRIVER, &[]), &devices);
        Self {
            dir,
            config: Arc::new(config),
            devices: Arc::new(devices),
            claims: Arc::new(InMemoryClaims::default()),
            health,
        }
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// Adds claim `ns/<name>` (UID `uid`) allocated one share of `device` with `cores` and `memory`.
    pub fn add_vgpu_claim(
        &self,
        name: &str,
        uid: &str,
        device: &str,
        share: &str,
        cores: &str,
        memory: &str,
    ) {
        let result = allocation_result(
            "gpu",
            DRIVER,
            NODE,
            device,
            Some(share),
            &[("cores", cores), ("memory", memory)],
        );
        self.claims.insert(allocated(claim("ns", name, uid), vec![result], &["pod-1"]));
    }

    pub async fn state(&self) -> Arc<DeviceState> {
        Arc::new(self.state_with(None).await)
    }

    pub async fn state_with(&self, hook: Option<FaultHook>) -> DeviceState {
        let state = DeviceState::new(
            Arc::clone(&self.config),
            Arc::clone(&self.devices),
            Arc::new(NvidiaAdapter),
            self.claims.clone(),
        )
        .await
        .unwrap();
        match hook {
            Some(h) => state.with_fault_hook(h),
            None => state,
        }
    }

    /// The state with claim modes installed (recovery reverts their recorded actions) and an optional hook.
    pub async fn state_with_modes(
        &self,
        hook: Option<FaultHook>,
        modes: Vec<Arc<dyn vgpu_dra::modes::ClaimMode>>,
    ) -> DeviceState {
        open_state(&self.config, &self.devices, self.claims.clone(), modes, hook).await
    }

    pub async fn serve(&self) -> RunningDriver {
        Driver::new(self.state().await, self.health.subscribe()).serve().unwrap()
    }

    /// Every file under the CDI root.
    pub fn cdi_files(&self) -> Vec<String> {
        list(&self.config.cdi_root)
    }

    /// Every claim directory.
    pub fn claim_dirs(&self) -> Vec<String> {
        list(&self.config.manager_dir.join("claims"))
    }
}

fn list(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = match std::fs::read_dir(dir) {
        Ok(entries) => entries.map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect(),
        Err(_) => Vec::new(),
    };
    names.sort();
    names
}

/// [`DeviceState::with_modes`] over `config`, `devices` and `claims` (NVIDIA adapter), with `hook` installed.
pub async fn open_state(
    config: &Arc<DriverConfig>,
    devices: &Arc<AllocatableDevices>,
    claims: Arc<InMemoryClaims>,
    modes: Vec<Arc<dyn vgpu_dra::modes::ClaimMode>>,
    hook: Option<FaultHook>,
) -> DeviceState {
    let state = DeviceState::with_modes(
        Arc::clone(config),
        Arc::clone(devices),
        Arc::new(NvidiaAdapter),
        claims,
        modes,
    )
    .await
    .unwrap();
    match hook {
        Some(h) => state.with_fault_hook(h),
        None => state,
    }
}

/// A fault hook that stops Prepare at `point` once (as a crash would); the flag says whether it fired.
pub fn crash_once(point: FaultPoint) -> (FaultHook, Arc<AtomicBool>) {
    let fired = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&fired);
    let hook: FaultHook = Arc::new(move |at, _uid| at == point && !flag.swap(true, Ordering::SeqCst));
    (hook, fired)
}
