//! The ResourceSlice publisher against the in-memory store (`MemorySliceStore`): the republish rule round by
//! round (first publish, no-op rounds, health changes bump the generation, repair of slices changed or
//! deleted by others, adoption after a restart, failed writes, shrinking pools), and the `run` loop driven
//! by a real `HealthMonitor` fed through the mock backend's health channel; a proptest drives random
//! sequences of health events, outside edits and failing writes and checks the rule's invariants.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{sync::Arc, time::Duration};

use tokio::sync::watch;
use vgpu_core::{
    backend::{HealthEvent, HealthEventKind, health_channel},
    model::GpuDevice,
};
use vgpu_dra::{
    devices::{AllocatableDevices, DeviceConfig},
    health::{HealthConfig, HealthMonitor, HealthSnapshot},
    slices::{
        SliceConfig,
        publisher::{PublishOutcome, SlicePublisher},
        store::{MemorySliceStore, SliceStore},
    },
};

fn devices(n: u32) -> Arc<AllocatableDevices> {
    let gpus = (0..n)
        .map(|i| {
            (GpuDevice { index: i, uuid: format!("GPU-{i}"), memory_mib: 1024, ..GpuDevice::default() }, i)
        })
        .collect();
    Arc::new(AllocatableDevices::new(&DeviceConfig::default(), gpus, None).unwrap())
}

fn no_health() -> watch::Receiver<HealthSnapshot> {
    watch::channel(HealthSnapshot::unmonitored_default()).1
}

fn generations(store: &MemorySliceStore) -> Vec<i64> {
    store.slices().values().map(|s| s.spec.pool.generation).collect()
}

#[tokio::test]
async fn publishes_once_and_then_only_on_change() {
    let store = MemorySliceStore::new();
    let devices = devices(2);
    let monitor = HealthMonitor::new(HealthConfig::new("manager.nvidia.com", &[]), &devices);
    let mut publisher =
        SlicePublisher::new(store.clone(), SliceConfig::new("node-a"), devices, monitor.subscribe());

    let outcome = publisher.sync().await.unwrap();
    assert_eq!(outcome, PublishOutcome::Published { generation: 1, created: 1, replaced: 0, deleted: 0 });
    assert_eq!(publisher.sync().await.unwrap(), PublishOutcome::Unchanged);
    assert_eq!(store.writes(), 1);

    // An Xid: the device gets its taint, the pool a new generation.
    let xid = HealthEvent {
        index: 1,
        uuid: "GPU-1".into(),
        kind: HealthEventKind::Xid { code: 79 },
        message: String::new(),
    };
    assert!(monitor.apply(&xid));
    let outcome = publisher.sync().await.unwrap();
    assert_eq!(outcome, PublishOutcome::Published { generation: 2, created: 0, replaced: 1, deleted: 0 });
    let slice = store.slices().into_values().next().unwrap();
    let device = &slice.spec.devices.as_ref().unwrap()[1];
    let taint = &device.taints.as_ref().unwrap()[0];
    assert_eq!(
        (taint.key.as_str(), taint.value.as_deref(), taint.effect.as_str()),
        ("manager.nvidia.com/xid", Some("79"), "NoSchedule")
    );
    assert!(slice.spec.devices.as_ref().unwrap()[0].taints.is_none());
    assert_eq!(publisher.sync().await.unwrap(), PublishOutcome::Unchanged);
    assert_eq!(
        *publisher.status().borrow(),
        vgpu_dra::slices::publisher::PublisherStatus { rounds: 4, generation: 2, last_error: None }
    );
}

#[tokio::test]
async fn repairs_slices_others_changed_or_deleted() {
    let store = MemorySliceStore::new();
    let mut publisher =
        SlicePublisher::new(store.clone(), SliceConfig::new("node-a"), devices(1), no_health());
    publisher.sync().await.unwrap();
    let name = store.slices().into_keys().next().unwrap();

    let mut tampered = store.slices()[&name].clone();
    tampered.spec.devices = Some(Vec::new());
    store.put_external(tampered);
    let outcome = publisher.sync().await.unwrap();
    assert_eq!(outcome, PublishOutcome::Published { generation: 2, created: 0, replaced: 1, deleted: 0 });
    assert_eq!(store.slices()[&name].spec.devices.as_ref().unwrap().len(), 1);

    store.delete_external(&name);
    let outcome = publisher.sync().await.unwrap();
    assert_eq!(outcome, PublishOutcome::Published { generation: 3, created: 1, replaced: 0, deleted: 0 });

    // A stray slice of this node and driver (an older layout) is deleted.
    let mut stray = store.slices()[&name].clone();
    stray.metadata.name = Some("node-a-manager.nvidia.com-7".into());
    store.put_external(stray);
    let outcome = publisher.sync().await.unwrap();
    assert_eq!(outcome, PublishOutcome::Published { generation: 4, created: 0, replaced: 1, deleted: 1 });
    assert_eq!(store.slices().len(), 1);
    assert_eq!(generations(&store), [4]);
}

#[tokio::test]
async fn a_restart_adopts_what_is_published() {
    let store = MemorySliceStore::new();
    let mut first = SlicePublisher::new(store.clone(), SliceConfig::new("node-a"), devices(3), no_health());
    first.sync().await.unwrap();
    first.sync().await.unwrap();
    let writes = store.writes();

    // The API server prints quantities canonically; a restarted plugin must not take that for a change.
    let name = store.slices().into_keys().next().unwrap();
    let mut printed = store.slices()[&name].clone();
    for device in printed.spec.devices.iter_mut().flatten() {
        let memory = device.capacity.as_mut().unwrap().get_mut("memory").unwrap();
        memory.value.0 = "1073741824".into();
    }
    store.put_external(printed);

    let mut second = SlicePublisher::new(store.clone(), SliceConfig::new("node-a"), devices(3), no_health());
    assert_eq!(second.sync().await.unwrap(), PublishOutcome::Adopted { generation: 1 });
    assert_eq!(second.sync().await.unwrap(), PublishOutcome::Unchanged);
    assert_eq!(store.writes(), writes);

    // A restart with one GPU fewer republishes at the next generation.
    let mut third = SlicePublisher::new(store.clone(), SliceConfig::new("node-a"), devices(2), no_health());
    let outcome = third.sync().await.unwrap();
    assert_eq!(outcome, PublishOutcome::Published { generation: 2, created: 0, replaced: 1, deleted: 0 });
}

#[tokio::test]
async fn pools_split_and_shrink_across_slices() {
    let store = MemorySliceStore::new();
    let mut big = SlicePublisher::new(store.clone(), SliceConfig::new("node-a"), devices(130), no_health());
    let outcome = big.sync().await.unwrap();
    assert_eq!(outcome, PublishOutcome::Published { generation: 1, created: 2, replaced: 0, deleted: 0 });
    assert!(store.slices().values().all(|s| s.spec.pool.resource_slice_count == 2));

    let mut small = SlicePublisher::new(store.clone(), SliceConfig::new("node-a"), devices(4), no_health());
    let outcome = small.sync().await.unwrap();
    assert_eq!(outcome, PublishOutcome::Published { generation: 2, created: 0, replaced: 1, deleted: 1 });
    let slices = store.slices();
    assert_eq!(slices.len(), 1);
    let only = slices.values().next().unwrap();
    assert_eq!((only.spec.pool.resource_slice_count, only.spec.devices.as_ref().unwrap().len()), (1, 4));
}

#[tokio::test]
async fn failed_writes_end_the_round_and_the_next_one_finishes() {
    let store = MemorySliceStore::new();
    let mut publisher =
        SlicePublisher::new(store.clone(), SliceConfig::new("node-a"), devices(1), no_health());
    store.fail_next_writes(1);
    let err = publisher.sync().await.unwrap_err();
    assert_eq!(err.to_string(), "ResourceSlice node-a-manager.nvidia.com-0: create: injected failure");
    assert_eq!(publisher.status().borrow().last_error.as_deref(), Some(err.to_string().as_str()));
    let outcome = publisher.sync().await.unwrap();
    assert_eq!(outcome, PublishOutcome::Published { generation: 1, created: 1, replaced: 0, deleted: 0 });
    assert_eq!(publisher.status().borrow().last_error, None);
    assert_eq!(store.list().await.unwrap().len(), 1);
}

#[tokio::test]
async fn run_republishes_after_health_events() {
    let store = MemorySliceStore::new();
    let devices = devices(2);
    let monitor = HealthMonitor::new(HealthConfig::new("manager.nvidia.com", &[]), &devices);
    let publisher =
        SlicePublisher::new(store.clone(), SliceConfig::new("node-a"), devices, monitor.subscribe())
            .with_batch(Duration::ZERO)
            .with_resync(Duration::from_secs(3600));
    let mut status = publisher.status();
    let stop = tokio_util::sync::CancellationToken::new();
    let task = publisher.spawn(stop.clone().cancelled_owned());
    status.wait_for(|s| s.generation == 1).await.unwrap();

    let (tx, events) = health_channel();
    let stop_monitor = tokio_util::sync::CancellationToken::new();
    let monitor_task = tokio::spawn(monitor.run(events, stop_monitor.clone().cancelled_owned()));
    tx.send(HealthEvent {
        index: 0,
        uuid: "GPU-0".into(),
        kind: HealthEventKind::DeviceLost,
        message: "fell off the bus".into(),
    });
    status.wait_for(|s| s.generation == 2).await.unwrap();
    let slice = store.slices().into_values().next().unwrap();
    let taints = slice.spec.devices.as_ref().unwrap()[0].taints.clone().unwrap();
    assert_eq!(taints[0].key, "manager.nvidia.com/gpu-lost");

    // The stream ends: every device is marked unmonitored (taint effect None) and republished.
    drop(tx);
    status.wait_for(|s| s.generation == 3).await.unwrap();
    let slice = store.slices().into_values().next().unwrap();
    for device in slice.spec.devices.as_ref().unwrap() {
        assert!(
            device
                .taints
                .as_ref()
                .unwrap()
                .iter()
                .any(|t| t.key == "manager.nvidia.com/unmonitored" && t.effect == "None")
        );
    }
    stop.cancel();
    task.await.unwrap();
    stop_monitor.cancel();
    monitor_task.await.unwrap();
}

#[derive(Debug, Clone)]
enum Op {
    Health(u32, u8),
    DeleteExternal,
    EditExternal,
    FailWrites(u32),
    Sync,
}

fn op() -> impl proptest::strategy::Strategy<Value = Op> {
    use proptest::prelude::*;
    prop_oneof![
        (0u32..3, 0u8..4).prop_map(|(i, k)| Op::Health(i, k)),
        Just(Op::DeleteExternal),
        Just(Op::EditExternal),
        (1u32..3).prop_map(Op::FailWrites),
        Just(Op::Sync),
    ]
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

    /// After every successful round the store holds exactly the built slices, all at the publisher's
    /// generation; generations never go back and grow with every write; a second round changes nothing.
    #[test]
    fn every_successful_round_leaves_exactly_the_built_set(ops in proptest::collection::vec(op(), 1..30)) {
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        runtime.block_on(async {
            let store = MemorySliceStore::new();
            let devices = devices(3);
            let monitor = HealthMonitor::new(HealthConfig::new("manager.nvidia.com", &[]), &devices);
            let config = SliceConfig::new("node-a");
            let mut publisher = SlicePublisher::new(store.clone(), config.clone(), devices.clone(), monitor.subscribe());
            let mut last_generation = 0;
            for op in ops {
                match op {
                    Op::Health(index, kind) => {
                        let kind = match kind {
                            0 => HealthEventKind::Xid { code: 79 },
                            1 => HealthEventKind::Xid { code: 13 },
                            2 => HealthEventKind::DeviceLost,
                            _ => HealthEventKind::Recovered,
                        };
                        monitor.apply(&HealthEvent { index, uuid: String::new(), kind, message: String::new() });
                    }
                    Op::DeleteExternal => {
                        if let Some(name) = store.slices().into_keys().next() {
                            store.delete_external(&name);
                        }
                    }
                    Op::EditExternal => {
                        if let Some(mut slice) = store.slices().into_values().next() {
                            slice.spec.devices = Some(Vec::new());
                            store.put_external(slice);
                        }
                    }
                    Op::FailWrites(n) => store.fail_next_writes(n),
                    Op::Sync => {
                        let writes = store.writes();
                        let Ok(outcome) = publisher.sync().await else { continue };
                        let generation = publisher.status().borrow().generation;
                        proptest::prop_assert!(generation >= last_generation);
                        if store.writes() > writes {
                            proptest::prop_assert!(generation > last_generation, "{outcome:?}");
                        }
                        last_generation = generation;
                        let want = vgpu_dra::slices::build_slices(&config, &devices, &monitor.snapshot(), generation).unwrap();
                        let have = store.slices();
                        proptest::prop_assert_eq!(have.len(), want.len());
                        for slice in &want {
                            let stored = &have[slice.metadata.name.as_ref().unwrap()];
                            proptest::prop_assert_eq!(&stored.spec, &slice.spec);
                        }
                        let writes = store.writes();
                        proptest::prop_assert_eq!(publisher.sync().await.unwrap(), PublishOutcome::Unchanged);
                        proptest::prop_assert_eq!(store.writes(), writes);
                    }
                }
            }
            Ok(())
        })?;
    }
}
