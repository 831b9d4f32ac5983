//! Checks against a real NVIDIA driver: `cargo test -p vgpu-nvml -- --ignored` on a GPU machine
//! (`scripts/gpu-check.sh`). They are ignored by default because they need the driver.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{process::Command, time::Duration};

use vgpu_core::backend::{BackendError, DeviceBackend, health::RecvError};
use vgpu_nvml::{NvmlBackend, NvmlOptions, topology::normalize_bus_id};

fn backend() -> NvmlBackend {
    NvmlBackend::new(NvmlOptions::default()).unwrap_or_else(|e| panic!("NVML did not initialise: {e}"))
}

/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, lower-case hex.
fn is_gpu_uuid(uuid: &str) -> bool {
    let Some(rest) = uuid.strip_prefix("GPU-") else { return false };
    let groups: Vec<&str> = rest.split('-').collect();
    groups.iter().map(|g| g.len()).eq([8, 4, 4, 4, 12])
        && groups.iter().all(|g| g.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// `nvidia-smi --query-gpu=pci.bus_id --format=csv,noheader`, normalised; `None` without nvidia-smi.
fn smi_bus_ids() -> Option<Vec<String>> {
    let out =
        Command::new("nvidia-smi").args(["--query-gpu=pci.bus_id", "--format=csv,noheader"]).output().ok()?;
    assert!(out.status.success(), "nvidia-smi failed: {}", String::from_utf8_lossy(&out.stderr));
    Some(String::from_utf8_lossy(&out.stdout).lines().filter_map(normalize_bus_id).collect())
}

#[test]
#[ignore = "needs an NVIDIA GPU and driver"]
fn devices_have_real_values() {
    let backend = backend();
    let devices = backend.devices().unwrap();
    assert!(!devices.is_empty(), "NVML sees no GPU");
    for (i, gpu) in devices.iter().enumerate() {
        assert_eq!(gpu.index as usize, i);
        assert!(is_gpu_uuid(&gpu.uuid), "bad UUID {:?}", gpu.uuid);
        assert!(gpu.memory_mib > 0, "GPU {i} has no memory");
        assert!(!gpu.type_name.is_empty());
        assert!(normalize_bus_id(&gpu.bus_id).as_deref() == Some(gpu.bus_id.as_str()), "{}", gpu.bus_id);
        assert!(gpu.capability.major >= 3, "compute capability {}", gpu.capability);
        let memory = backend.memory_usage(gpu.index).unwrap();
        assert!(memory.total_bytes > 0 && memory.used_bytes <= memory.total_bytes);
        assert_eq!(memory.total_bytes >> 20, gpu.memory_mib);
        backend.minor_number(gpu.index).unwrap();
        let pci_id = backend.pci_device_id(gpu.index).unwrap();
        assert_eq!(
            pci_id & 0xFFFF,
            0x10DE,
            "GPU {i}: PCI device id {pci_id:#010X} is not NVIDIA's vendor id"
        );
        backend.processes(gpu.index).unwrap();
        backend.mig_layout(gpu.index).unwrap();
        match backend.process_utilization(gpu.index, 0) {
            Ok(_) | Err(BackendError::NotSupported { .. }) => {}
            Err(e) => panic!("process utilization: {e}"),
        }
        eprintln!(
            "GPU {i}: {} {} {} MiB bus {} numa {:?} cc {}",
            gpu.uuid, gpu.type_name, gpu.memory_mib, gpu.bus_id, gpu.numa_node, gpu.capability
        );
    }
    if let Some(smi) = smi_bus_ids() {
        let ours: Vec<String> = devices.iter().map(|d| d.bus_id.clone()).collect();
        assert_eq!(ours, smi, "bus ids differ from nvidia-smi");
    } else {
        eprintln!("nvidia-smi not found: bus ids not cross-checked");
    }
    assert!(backend.devices().unwrap().get(devices.len()).is_none());
    assert!(matches!(backend.memory_usage(devices.len() as u32), Err(BackendError::NoSuchDevice { .. })));
}

#[test]
#[ignore = "needs an NVIDIA GPU and driver"]
fn driver_and_topology() {
    let backend = backend();
    let driver = backend.driver_info().unwrap();
    assert!(driver.driver_version.split('.').count() >= 2, "driver version {:?}", driver.driver_version);
    assert!(driver.cuda_version.is_some_and(|(major, _)| major >= 10), "{:?}", driver.cuda_version);
    let n = backend.devices().unwrap().len();
    let matrix = backend.topology().unwrap();
    assert_eq!(matrix.len(), n);
    for i in 0..n {
        assert!(matrix.links(i, i).is_empty());
        for j in 0..n {
            assert_eq!(matrix.links(i, j), matrix.links(j, i));
            if i != j {
                assert!(!matrix.links(i, j).is_empty(), "no PCIe level for GPUs {i} and {j}");
            }
        }
    }
    eprintln!("driver {driver:?}\n{}", vgpu_nvml::topology::render_topo(&matrix));
}

#[test]
#[ignore = "needs an NVIDIA GPU and driver"]
fn health_stream_opens_and_stays_quiet() {
    let backend = NvmlBackend::new(NvmlOptions { event_wait_ms: 200, ..NvmlOptions::default() }).unwrap();
    let events = backend.health_events().unwrap();
    // A healthy idle GPU reports nothing within a second; the stream stays open.
    match events.recv_timeout(Duration::from_secs(1)) {
        Err(RecvError::Empty) => {}
        other => panic!("unexpected health event on an idle GPU: {other:?}"),
    }
    drop(events);
}
