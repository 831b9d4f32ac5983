//! `vgpu_dra::daemon`: the mode install order and the component start-up order in code, the start-up
//! refusals, and a daemon started and stopped on a temporary node (mock backend, in-memory cluster).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{sync::Arc, time::Duration};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use vgpu_core::{backend::mock::MockBackend, node_config::CgroupDriver};
use vgpu_dra::{
    claims::InMemoryClaims,
    config::DriverConfig,
    daemon::{Component, Daemon, DaemonCluster, DaemonConfig, DaemonError, FabricOpener, HttpConfig},
    devices::DeviceConfig,
    fabric::FakeFabricManager,
    nri::NriConfig,
    slices::store::MemorySliceStore,
};
use vgpu_node::registry::RegistryConfig;

const MOCK: &str = "gpus:\n  - { uuid: GPU-a, name: NVIDIA A30, memoryMiB: 24576, minor: 0 }\n";

fn config(dir: &std::path::Path, gates: &str) -> DaemonConfig {
    let mut driver = DriverConfig::under("node-1", dir);
    driver.boot_id_path = dir.join("boot_id");
    if !gates.is_empty() {
        driver.gates = vgpu_dra::feature_gates().configure([gates]).unwrap();
    }
    let devices = DeviceConfig {
        vgpu_support: driver.gates.enabled(vgpu_gates::DraGate::VGPUSupport),
        ..DeviceConfig::default()
    };
    DaemonConfig {
        driver,
        devices,
        xids: Vec::new(),
        host_root: dir.join("host-root"),
        http: None,
        healthcheck: None,
        nri: None,
        registry: None,
        physical_gpu_resync: None,
        vfio_switch: None,
    }
}

fn backend() -> Arc<dyn vgpu_core::backend::DeviceBackend> {
    Arc::new(MockBackend::from_yaml_str(MOCK).unwrap())
}

fn fake_fabric() -> FabricOpener {
    Box::new(|| Ok(Arc::new(FakeFabricManager::new(Vec::new())) as Arc<dyn vgpu_dra::fabric::FabricManager>))
}

fn cluster() -> DaemonCluster<MemorySliceStore> {
    DaemonCluster {
        claims: Arc::new(InMemoryClaims::default()),
        slices: MemorySliceStore::new(),
        slice_owner: None,
        physical_gpus: None,
        switch_cluster: None,
        authorizer: None,
    }
}

fn refused(result: Result<Daemon, DaemonError>) -> String {
    match result {
        Err(DaemonError::Refused(why)) => why,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn modes_are_installed_in_their_documented_order() {
    let dir = tempfile::tempdir().unwrap();
    let mut daemon = Daemon::new(config(dir.path(), ""), backend()).unwrap();
    assert_eq!(daemon.install_modes().unwrap().names(), ["opaqueConfig"], "the opaque-config check always");

    let gates = "VGPUSupport=false,TimeSlicingSettings=true,MPSSupport=true,FabricManagerPartitioning=true";
    let mut daemon =
        Daemon::new(config(dir.path(), gates), backend()).unwrap().with_fabric_manager(fake_fabric());
    let installed = daemon.install_modes().unwrap();
    assert_eq!(
        installed.names(),
        ["opaqueConfig", "timeSlicing", "mps", vgpu_dra::fabric::MODE],
        "opaque check, time slicing, MPS, then Fabric Manager (before vfio: revert runs newest first)"
    );
    assert!(installed.mps.is_some(), "the MPS mode is kept for the daemons' restart");
}

#[test]
fn start_up_refusals_name_what_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    // A gate whose behaviour is not built: refused, never accepted and ignored.
    let why = refused(Daemon::new(config(dir.path(), "IMEXDaemonsWithDNSNames=true"), backend()));
    assert!(why.contains("IMEXDaemonsWithDNSNames"), "{why}");
    let why = refused(Daemon::new(config(dir.path(), "NRISupport=true"), backend()));
    assert!(why.contains("NRISupport") && why.contains("NRI socket"), "{why}");
    let why = refused(Daemon::new(config(dir.path(), "DevicePluginClientMode=true"), backend()));
    assert!(why.contains("DevicePluginClientMode") && why.contains("registry"), "{why}");
    let mut with_switch = config(dir.path(), "");
    with_switch.vfio_switch =
        Some(vgpu_dra::vfio_switch::controller::SwitchConfig::new("node-1", "ns", "image:1"));
    let why = refused(Daemon::new(with_switch, backend()));
    assert!(why.contains("PassthroughSupport"), "{why}");
    // Fabric Manager partitioning without a client to open.
    let gates = "FabricManagerPartitioning=true";
    let mut daemon = Daemon::new(config(dir.path(), gates), backend()).unwrap();
    let err = daemon.install_modes().unwrap_err().to_string();
    assert!(err.contains("no Fabric Manager client"), "{err}");
    // A failing opener is a start-up step error naming the step.
    let mut daemon = Daemon::new(config(dir.path(), gates), backend())
        .unwrap()
        .with_fabric_manager(Box::new(|| Err("libnvfm.so.1: not found".into())));
    let err = daemon.install_modes().unwrap_err();
    assert_eq!(err.to_string(), "FabricManagerPartitioning: loading the Fabric Manager client library");
    assert_eq!(std::error::Error::source(&err).unwrap().to_string(), "libnvfm.so.1: not found");
}

async fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut out = String::new();
    stream.read_to_string(&mut out).await.unwrap();
    out
}

#[tokio::test]
async fn components_start_in_order_and_stop() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path(), "");
    config.http = Some(HttpConfig { addr: "127.0.0.1:0".parse().unwrap(), metrics_path: "/metrics".into() });
    config.healthcheck = Some("127.0.0.1:0".parse().unwrap());
    let running = Daemon::new(config, backend()).unwrap().start(cluster()).await.unwrap();
    assert_eq!(
        running.started(),
        [Component::Health, Component::Slices, Component::Driver, Component::Http, Component::Healthcheck]
    );
    let driver = running.driver().unwrap();
    let sockets = [driver.registration_socket.clone(), driver.dra_socket.clone()];
    assert!(sockets.iter().all(|s| s.exists()));
    let answer = http_get(running.http_addr().unwrap(), "/healthz").await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let answer = http_get(running.http_addr().unwrap(), "/readyz").await;
    assert!(answer.starts_with("HTTP/1.1 503") && answer.contains("registration"), "{answer}");
    assert!(running.healthcheck_addr().is_some());
    tokio::time::timeout(Duration::from_secs(20), running.stop()).await.unwrap().unwrap();
    assert!(sockets.iter().all(|s| !s.exists()), "sockets removed on stop");
}

#[tokio::test]
async fn client_mode_and_nri_start_between_the_slices_and_the_driver() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path(), "DevicePluginClientMode=true,NRISupport=true");
    let host = dir.path().join("host");
    std::fs::create_dir_all(host.join("proc")).unwrap();
    std::fs::create_dir_all(host.join("cgroup")).unwrap();
    config.registry = Some(RegistryConfig {
        manager_dir: config.driver.manager_dir.clone(),
        proc_root: host.join("proc"),
        cgroup_root: host.join("cgroup"),
        cgroup_driver: CgroupDriver::Systemd,
        poll_interval: Duration::from_millis(10),
        poll_timeout: Duration::from_millis(300),
        socket_group: None,
    });
    config.nri = Some(NriConfig { root: dir.path().join("nri"), index: "07".parse().unwrap() });
    let running = Daemon::new(config, backend()).unwrap().start(cluster()).await.unwrap();
    assert_eq!(
        running.started(),
        [
            Component::Health,
            Component::Slices,
            Component::ClientModeRegistry,
            Component::Nri,
            Component::Driver
        ]
    );
    let registry = running.registry_socket().unwrap().to_owned();
    assert!(registry.exists());
    tokio::time::timeout(Duration::from_secs(20), running.stop()).await.unwrap().unwrap();
    assert!(!registry.exists(), "the registry socket is removed on stop");
}
