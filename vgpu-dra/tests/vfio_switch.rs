//! The vfio-switch pieces together, over real files in a temporary directory: [`Switcher`] writing the
//! sysfs files as the Job's container does ([`KernelSysfs`]: plain `open(O_WRONLY|O_TRUNC)` + `write`), a
//! [`PollingKernel`] acting on them from another thread, and the [`SwitchController`] whose Job command is
//! run here in place of the kubelet, its outcome fed back as the Job controller would. The running
//! controller ([`SwitchController::spawn`]) acts on the changes its watch reports, not on a resync period,
//! and its passthrough set reshapes the ResourceSlices a running [`SlicePublisher`] keeps: a GPU wished for
//! passthrough (or on `vfio-pci`) is published only as its `gpu-vfio-<index>` device.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../../vgpu-serve/tests/support/mock_api_server.rs"]
mod mock_api_server;

use std::{sync::Arc, time::Duration};

use vgpu_api::{ConditionStatus, PhysicalGPU, PhysicalGPUSpec, PhysicalGPUStatus};
use vgpu_core::{discovery::PciAddress, model::GpuDevice};
use vgpu_dra::{
    devices::{AllocatableDevices, DeviceConfig},
    health::HealthSnapshot,
    slices::{
        SliceConfig,
        publisher::{PassthroughGpus, SlicePublisher},
        store::MemorySliceStore,
    },
    vfio::{
        KernelSysfs, SysfsRoots,
        fake::{FakeSysfs, PollingKernel},
    },
    vfio_switch::{
        Outcome, SwitchTarget, Switcher,
        controller::{
            CONDITION, DEBOUNCE, JobPhase, KubeSwitchCluster, MAX_DEBOUNCE, MemorySwitchCluster, Step,
            SwitchCluster as _, SwitchConfig, SwitchController, TARGET_ANNOTATION,
        },
    },
};

const GPUS: [&str; 2] = ["0000:3b:00.0", "0000:86:00.0"];

fn node() -> (tempfile::TempDir, FakeSysfs, PollingKernel) {
    let dir = tempfile::tempdir().unwrap();
    let roots = SysfsRoots::under(dir.path());
    let tree = FakeSysfs::new(&roots);
    for (i, bus) in GPUS.iter().enumerate() {
        tree.add_gpu(bus, 0x2330, &i.to_string(), Some("nvidia")).unwrap();
    }
    tree.add_driver("vfio-pci").unwrap();
    let kernel = PollingKernel::start(&roots, Duration::from_millis(5)).unwrap();
    (dir, tree, kernel)
}

fn switcher(tree: &FakeSysfs) -> Switcher {
    Switcher::new(tree.roots().clone(), Arc::new(KernelSysfs))
        .with_timing(Duration::from_secs(5), Duration::from_millis(5))
}

#[test]
fn a_writer_in_another_thread_is_acted_on_by_the_polling_kernel() {
    let (_dir, tree, kernel) = node();
    let s = switcher(&tree);
    let a: PciAddress = GPUS[0].parse().unwrap();
    assert_eq!(
        s.switch(&a, SwitchTarget::VfioPci).unwrap(),
        Outcome::Switched { from: "nvidia".into(), to: SwitchTarget::VfioPci }
    );
    assert_eq!((tree.driver(GPUS[0]).as_str(), tree.driver(GPUS[1]).as_str()), ("vfio-pci", "nvidia"));
    assert_eq!(s.switch(&a, SwitchTarget::VfioPci).unwrap(), Outcome::AlreadyBound(SwitchTarget::VfioPci));
    assert_eq!(
        s.switch(&a, SwitchTarget::Nvidia).unwrap(),
        Outcome::Switched { from: "vfio-pci".into(), to: SwitchTarget::Nvidia }
    );
    assert_eq!(tree.driver(GPUS[0]), "nvidia");
    assert!(kernel.errors().is_empty(), "{:?}", kernel.errors());
    // Each bind file was emptied once acted on, as a write-only sysfs attribute reads back nothing.
    let probe = std::fs::read_to_string(tree.roots().drivers_probe()).unwrap();
    assert!(probe.is_empty(), "{probe:?}");
}

#[test]
fn a_driver_that_never_binds_times_out_naming_the_link_and_what_it_shows() {
    let (_dir, tree, kernel) = node();
    let a: PciAddress = GPUS[0].parse().unwrap();
    switcher(&tree).switch(&a, SwitchTarget::VfioPci).unwrap();
    // The nvidia module goes away: the switch back falls back to drivers_probe, which binds nothing.
    std::fs::remove_dir_all(tree.roots().pci_driver("nvidia")).unwrap();
    let err = switcher(&tree)
        .with_timing(Duration::from_millis(300), Duration::from_millis(5))
        .switch(&a, SwitchTarget::Nvidia)
        .unwrap_err()
        .to_string();
    let link = tree.roots().pci_device(GPUS[0]).join("driver");
    assert!(
        err.starts_with(&format!(
            "{}: expected a link to driver nvidia within 300ms, found no driver",
            link.display()
        )),
        "{err}"
    );
    assert_eq!(kernel.writes().last().map(|w| w.0.as_str()), Some("bus/pci/drivers_probe"));
}

fn gpu(node: &str, name: &str, pci: &str, passthrough: bool) -> PhysicalGPU {
    let mut gpu = PhysicalGPU::new(
        name,
        PhysicalGPUSpec {
            node_name: node.into(),
            index: 0,
            pci_address: pci.into(),
            vendor: "nvidia".into(),
            vendor_id: "10de".into(),
            vendor_name: "NVIDIA".into(),
            device_id: "2330".into(),
            device_name: "H100".into(),
            model: "h100".into(),
            subsystem: None,
            class_code: "030200".into(),
            numa_node: None,
            iommu_group: None,
            passthrough: Some(passthrough),
        },
    );
    gpu.metadata.generation = Some(1);
    gpu.status = Some(PhysicalGPUStatus { driver: Some("nvidia".into()), ..Default::default() });
    gpu
}

/// The value after `flag` in a Job's command.
fn arg<'a>(command: &'a [String], flag: &str) -> &'a str {
    let i = command.iter().position(|a| a == flag).unwrap_or_else(|| panic!("{flag} in {command:?}"));
    &command[i + 1]
}

#[tokio::test]
async fn the_controllers_job_command_switches_the_gpu_and_the_condition_follows() {
    let (_dir, tree, _kernel) = node();
    let cluster = Arc::new(MemorySwitchCluster::default());
    cluster.put_gpu(gpu("w1", "w1-a", GPUS[0], true));
    cluster.put_gpu(gpu("w1", "w1-b", GPUS[1], false));
    cluster.put_gpu(gpu("w2", "w2-a", GPUS[0], true));
    let mut config = SwitchConfig::new("w1", "d8-gpu", "vgpu:1");
    config.container_sys.clone_from(&tree.roots().sys);
    let controller = SwitchController::new(cluster.clone(), config);

    let steps = controller.reconcile_once().await.unwrap();
    assert_eq!(
        steps.len(),
        1,
        "only w1-a wants a switch (w1-b is on nvidia already, w2 is another node): {steps:?}"
    );
    let jobs = cluster.jobs();
    let job = &jobs[0];
    assert_eq!(job.metadata.annotations.as_ref().unwrap()[TARGET_ANNOTATION], "vfio-pci");
    // Play the kubelet: run what the container would run.
    let container = &job.spec.as_ref().unwrap().template.spec.as_ref().unwrap().containers[0];
    let command = container.command.clone().unwrap();
    assert_eq!(&command[1], "vfio-switch");
    let pci: PciAddress = arg(&command, "--pci").parse().unwrap();
    let to: SwitchTarget = arg(&command, "--to").parse().unwrap();
    let roots = SysfsRoots { sys: arg(&command, "--sysfs-root").into(), host_root: "/nonexistent".into() };
    let outcome = Switcher::new(roots, Arc::new(KernelSysfs))
        .with_timing(Duration::from_secs(5), Duration::from_millis(5))
        .switch(&pci, to)
        .unwrap();
    assert_eq!(outcome, Outcome::Switched { from: "nvidia".into(), to: SwitchTarget::VfioPci });
    assert_eq!(tree.driver(GPUS[0]), "vfio-pci");
    // Play the Job controller.
    let name = job.metadata.name.clone().unwrap();
    cluster.set_job_phase("d8-gpu", &name, JobPhase::Succeeded);
    let steps = controller.reconcile_once().await.unwrap();
    assert_eq!(steps.get("w1-a"), Some(&Step::Succeeded(name.clone())));
    let a = cluster.gpu("w1-a").unwrap();
    let condition = a.status.unwrap().conditions.into_iter().find(|c| c.type_ == CONDITION).unwrap();
    assert_eq!(condition.status, ConditionStatus::True);
    assert_eq!(condition.reason.as_deref(), Some("SwitchedToVfioPci"));
    assert_eq!(condition.observed_generation, Some(1));
    assert_eq!(cluster.deleted(), [name]);
    let b = cluster.gpu("w1-b").unwrap();
    let condition = b.status.unwrap().conditions.into_iter().find(|c| c.type_ == CONDITION).unwrap();
    assert_eq!(condition.reason.as_deref(), Some("SwitchedToNvidia"), "already there, said once");
    assert!(cluster.gpu("w2-a").unwrap().status.unwrap().conditions.is_empty(), "another node's GPU");
}

/// Polls `check` every 5 ms for up to `limit`; the time it took.
async fn within<T>(limit: Duration, mut check: impl FnMut() -> Option<T>) -> Option<(T, Duration)> {
    let start = std::time::Instant::now();
    while start.elapsed() < limit {
        if let Some(v) = check() {
            return Some((v, start.elapsed()));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    None
}

fn reason_of(cluster: &MemorySwitchCluster, name: &str) -> Option<String> {
    let gpu = cluster.gpu(name)?;
    gpu.status?.conditions.into_iter().find(|c| c.type_ == CONDITION)?.reason
}

#[tokio::test]
async fn the_running_controller_acts_on_watched_changes_without_waiting_for_a_resync() {
    let (_dir, tree, _kernel) = node();
    let cluster = Arc::new(MemorySwitchCluster::default());
    let mut config = SwitchConfig::new("w1", "d8-gpu", "vgpu:1");
    config.container_sys.clone_from(&tree.roots().sys);
    // Neither period can drive this test: only the watched changes can.
    config.resync = Duration::from_secs(3600);
    config.recheck = Duration::from_secs(3600);
    let stop = tokio_util::sync::CancellationToken::new();
    let task = SwitchController::new(cluster.clone(), config).spawn(stop.clone().cancelled_owned());
    tokio::time::sleep(Duration::from_millis(50)).await; // the first pass: no GPU yet

    // A PhysicalGPU appears asking for passthrough: its Job follows.
    cluster.put_gpu(gpu("w1", "w1-a", GPUS[0], true));
    let limit = MAX_DEBOUNCE + Duration::from_secs(1);
    let (job, created_in) = within(limit, || cluster.jobs().into_iter().next()).await.expect("a Job");
    // Play the kubelet, then the Job controller.
    let command = job.spec.unwrap().template.spec.unwrap().containers[0].command.clone().unwrap();
    let pci: PciAddress = arg(&command, "--pci").parse().unwrap();
    let roots = SysfsRoots { sys: arg(&command, "--sysfs-root").into(), host_root: "/nonexistent".into() };
    Switcher::new(roots, Arc::new(KernelSysfs))
        .with_timing(Duration::from_secs(5), Duration::from_millis(5))
        .switch(&pci, SwitchTarget::VfioPci)
        .unwrap();
    let name = job.metadata.name.unwrap();
    cluster.set_job_phase("d8-gpu", &name, JobPhase::Succeeded);
    let (_, done_in) =
        within(limit, || (reason_of(&cluster, "w1-a").as_deref() == Some("SwitchedToVfioPci")).then_some(()))
            .await
            .expect("the condition after the Job succeeded");
    assert!(cluster.jobs().is_empty(), "the finished Job is deleted");
    eprintln!("Job created {created_in:?} after the GPU, condition {done_in:?} after the Job finished");
    assert!(done_in < MAX_DEBOUNCE + DEBOUNCE * 5, "{done_in:?}");

    // A failure is reported as promptly.
    cluster.put_gpu(gpu("w1", "w1-b", GPUS[1], true));
    let (job, _) = within(limit, || cluster.jobs().into_iter().next()).await.expect("a second Job");
    cluster.set_job_phase(
        "d8-gpu",
        &job.metadata.name.unwrap(),
        JobPhase::Failed("exit code 1: boom".into()),
    );
    within(limit, || (reason_of(&cluster, "w1-b").as_deref() == Some("SwitchFailed")).then_some(()))
        .await
        .expect("SwitchFailed after the Job failed");
    stop.cancel();
    tokio::time::timeout(Duration::from_secs(5), task).await.unwrap().unwrap();
}

#[tokio::test]
async fn a_missed_change_is_repaired_by_the_resync() {
    let cluster = Arc::new(MemorySwitchCluster::default());
    cluster.put_gpu(gpu("w1", "w1-a", GPUS[0], true));
    let mut config = SwitchConfig::new("w1", "d8-gpu", "vgpu:1");
    config.resync = Duration::from_millis(300);
    config.recheck = Duration::from_secs(3600);
    let stop = tokio_util::sync::CancellationToken::new();
    let task = SwitchController::new(cluster.clone(), config).spawn(stop.clone().cancelled_owned());
    let (job, _) = within(Duration::from_secs(2), || cluster.jobs().into_iter().next()).await.expect("a Job");
    // The watch misses the Job's completion: the next resync still sees it.
    cluster.silence(true);
    cluster.set_job_phase("d8-gpu", &job.metadata.name.unwrap(), JobPhase::Succeeded);
    within(Duration::from_secs(3), || {
        (reason_of(&cluster, "w1-a").as_deref() == Some("SwitchedToVfioPci")).then_some(())
    })
    .await
    .expect("the resync picked the completion up");
    stop.cancel();
    task.await.unwrap();
}

#[tokio::test]
async fn the_kube_watches_select_this_nodes_jobs_and_gpus() {
    use tokio_stream::StreamExt as _;
    let (client, mut handle) = mock_api_server::mock_client();
    let mut changes = KubeSwitchCluster::new(client).changes("w1", "d8-gpu");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let pump = tokio::spawn(async move {
        while changes.next().await.is_some() {
            if tx.send(()).is_err() {
                return;
            }
        }
    });
    let mut uris = Vec::new();
    for _ in 0..2 {
        let (seen, send) = mock_api_server::next(&mut handle).await;
        assert_eq!(seen.method, "GET");
        uris.push(seen.uri.clone());
        let kind = if seen.uri.contains("/jobs") { "JobList" } else { "PhysicalGPUList" };
        mock_api_server::reply(
            send,
            200,
            &serde_json::json!({"kind": kind, "apiVersion": "v1", "metadata": {"resourceVersion": "7"}, "items": []}),
        );
    }
    uris.sort();
    assert!(
        uris[0].starts_with("/apis/batch/v1/namespaces/d8-gpu/jobs?")
            && uris[0].contains("labelSelector=gpu.deckhouse.io%2Fnode%3Dw1"),
        "{uris:?}"
    );
    assert!(
        uris[1].starts_with("/apis/gpu.deckhouse.io/v1alpha1/physicalgpus?")
            && uris[1].contains("fieldSelector=spec.nodeName%3Dw1"),
        "{uris:?}"
    );
    // The initial lists are changes (a pass reads the current state after a (re)list).
    tokio::time::timeout(Duration::from_secs(5), rx.recv()).await.unwrap().unwrap();
    pump.abort();
}

/// A slice publisher over the two GPUs of `tree` as NVML sees them (their bus ids written by `bus_id`) plus
/// their VFIO devices from sysfs, fed passthrough sets through the returned sender (batch 10 ms, no resync).
fn publisher_of(
    tree: &FakeSysfs,
    bus_id: impl Fn(&str) -> String,
) -> (MemorySliceStore, tokio::sync::watch::Sender<PassthroughGpus>, SlicePublisher<MemorySliceStore>) {
    let gpus = GPUS
        .iter()
        .enumerate()
        .map(|(i, bus)| {
            let i = u32::try_from(i).unwrap();
            (
                GpuDevice {
                    index: i,
                    uuid: format!("GPU-{i}"),
                    memory_mib: 1024,
                    bus_id: bus_id(bus),
                    ..GpuDevice::default()
                },
                i,
            )
        })
        .collect();
    let mut devices = AllocatableDevices::new(&DeviceConfig::default(), gpus, None).unwrap();
    for device in vgpu_dra::vfio::vfio_devices(tree.roots(), &devices).unwrap() {
        devices.add(device).unwrap();
    }
    let store = MemorySliceStore::new();
    let (passthrough_tx, passthrough_rx) = tokio::sync::watch::channel(PassthroughGpus::new());
    let publisher = SlicePublisher::new(
        store.clone(),
        SliceConfig::new("w1"),
        Arc::new(devices),
        tokio::sync::watch::channel(HealthSnapshot::unmonitored_default()).1,
    )
    .with_passthrough(passthrough_rx)
    .with_batch(Duration::from_millis(10))
    .with_resync(Duration::from_secs(3600));
    (store, passthrough_tx, publisher)
}

/// Names of the devices the store's slices publish, sorted.
fn published(store: &MemorySliceStore) -> Vec<String> {
    let mut names: Vec<String> = store
        .slices()
        .values()
        .flat_map(|s| s.spec.devices.iter().flatten().map(|d| d.name.clone()))
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn passthrough_gpus_are_published_only_as_vfio_devices_and_come_back() {
    let (_dir, tree, _kernel) = node();
    // Two GPUs as NVML sees them (bus ids as NVML writes them), plus their VFIO devices from sysfs.
    let (store, passthrough_tx, publisher) = publisher_of(&tree, |bus| format!("0000{}", bus.to_uppercase()));
    let mut status = publisher.status();
    let cluster = Arc::new(MemorySwitchCluster::default());
    let mut config = SwitchConfig::new("w1", "d8-gpu", "vgpu:1");
    config.resync = Duration::from_secs(3600);
    let stop = tokio_util::sync::CancellationToken::new();
    let stopped = || stop.clone().cancelled_owned();
    let publisher = publisher.spawn(stopped());
    let controller =
        SwitchController::new(cluster.clone(), config).with_passthrough_sink(passthrough_tx).spawn(stopped());
    let all = ["gpu-vfio-0", "gpu-vfio-1", "vgpu-0", "vgpu-1"];
    status.wait_for(|s| s.generation >= 1).await.unwrap();
    assert_eq!(published(&store), all);

    // GPU 0 is wished for passthrough: only its VFIO device stays, at once (not on the 1 h resync).
    cluster.put_gpu(gpu("w1", "w1-a", GPUS[0], true));
    let limit = MAX_DEBOUNCE + Duration::from_secs(2);
    let (_, took) =
        within(limit, || (published(&store) == ["gpu-vfio-0", "gpu-vfio-1", "vgpu-1"]).then_some(()))
            .await
            .unwrap_or_else(|| panic!("{:?}", published(&store)));
    eprintln!("republished without vgpu-0 {took:?} after the wish");
    let generation = status.borrow().generation;

    // Switched back to nvidia (wish false, driver nvidia again): the regular device returns.
    let mut back = gpu("w1", "w1-a", GPUS[0], false);
    back.metadata.generation = Some(2);
    cluster.put_gpu(back.clone());
    within(limit, || (published(&store) == all).then_some(())).await.expect("vgpu-0 back");
    assert!(status.borrow().generation > generation);

    // Bound to vfio-pci with no wish at all (a VFIO claim did it): hidden again.
    back.spec.passthrough = None;
    back.status.as_mut().unwrap().driver = Some("vfio-pci".into());
    cluster.put_gpu(back);
    within(limit, || (published(&store) == ["gpu-vfio-0", "gpu-vfio-1", "vgpu-1"]).then_some(()))
        .await
        .expect("hidden while on vfio-pci");
    stop.cancel();
    controller.await.unwrap();
    publisher.await.unwrap();
}

#[tokio::test]
async fn the_first_publication_already_leaves_out_a_passthrough_gpu() {
    let (_dir, tree, _kernel) = node();
    let (store, sink, publisher) = publisher_of(&tree, str::to_owned);
    let mut status = publisher.status();
    let stop = tokio_util::sync::CancellationToken::new();
    let stopped = || stop.clone().cancelled_owned();
    // The publisher starts first; the switch controller's first pass comes later.
    let publisher = publisher.spawn(stopped());
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(status.borrow().rounds, 0, "no round before the first passthrough set");
    let cluster = Arc::new(MemorySwitchCluster::default());
    cluster.put_gpu(gpu("w1", "w1-a", GPUS[0], true));
    let controller = SwitchController::new(cluster, SwitchConfig::new("w1", "d8-gpu", "vgpu:1"))
        .with_passthrough_sink(sink)
        .spawn(stopped());
    status.wait_for(|s| s.generation >= 1).await.unwrap();
    assert_eq!(status.borrow().generation, 1);
    assert_eq!(published(&store), ["gpu-vfio-0", "gpu-vfio-1", "vgpu-1"], "generation 1 never had vgpu-0");
    stop.cancel();
    controller.await.unwrap();
    publisher.await.unwrap();
}
