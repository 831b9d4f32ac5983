//! `vgpu-device-plugin --backend mock --feature-gates=AllocationFailureReschedule=true` against the real API
//! server (issue #14, contract §5.6): pods whose vGPU allocation failed on the node are evicted (owned by a
//! controller) or deleted and re-created (bare), critical pods are left alone.
//!
//! Set-up as in `device_plugin.rs`: a test kubelet serves `Registration`, the plugin publishes the node,
//! the test advertises the capacity, and our extender under the real kube-scheduler pre-allocates and binds
//! four one-vGPU pods: `bare` and `bare-waiting` (no owner), `trainer-x1` (owned by a ReplicaSet with
//! `replicas: 0`, `controller: true`) and `critical` (`priorityClassName: system-node-critical`, a class
//! the API server creates itself). The scheduler is then stopped, so a re-created pod stays unbound and its
//! metadata can be read as the plugin created it.
//!
//! The test reports the allocation failures as the kubelet does, through the pods' `status`: `Failed` with
//! reason `UnexpectedAdmissionError` and an `Allocate failed due to … Allocate check failed: …` message
//! (admission), for `bare`, `trainer-x1` and `critical`; `Pending` with a container waiting on a
//! `PreStartContainer check failed` message, for `bare-waiting`. Asserted from the API server:
//!
//! * `trainer-x1` is evicted (policy/v1): the pod is gone, a Warning `Evict`/`Evicted` event is recorded.
//!   Its re-creation by the ReplicaSet controller is out of scope here: no controller-manager runs, so
//!   nothing re-creates it (the ReplicaSet asks for zero replicas anyway).
//! * `bare` and `bare-waiting` are deleted (Warning `Recovery`/`Deleted`) and re-created under the same
//!   name (Normal `Recovery`/`Recovered` on the new UID), with the same containers, labels and annotations
//!   of their own, a new UID, no `spec.nodeName`, and none of the `nvidia.com/` scheduling labels and
//!   annotations; the recovery checkpoint (`<manager>/checkpoints/recovery-checkpoint.json`) is empty
//!   afterwards. With kube-scheduler started again, the extender schedules both again.
//! * `critical` keeps its UID, its phase and no `deletionTimestamp`; a Warning `CriticalPod`/`Skipped` event
//!   is recorded.
//!
//! Playing the kubelet on deletion: without a kubelet, a deleted pod that has a `nodeName` stays
//! terminating until someone removes it (the kubelet does, with `gracePeriodSeconds=0`, once the
//! containers stopped). The API server removes a `Failed` pod at once, but `bare-waiting` is `Pending`: it
//! keeps its 30 s grace period, and the test deletes it with `gracePeriodSeconds=0` as soon as it sees the
//! `deletionTimestamp` (the plugin waits for it to be gone before re-creating it).
//!
//! Needs the control-plane binaries and our binaries: run `e2e/run.sh`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::apps::v1::ReplicaSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use serde_json::json;
use vgpu_e2e::TestEnv;
use vgpu_e2e::fixtures::{self, VGPU_MEMORY, VGPU_NUMBER};
use vgpu_e2e::plugin_node::{MockPluginNode, start_vgpu_scheduling};

const NODE: &str = "rs-node";
const NS: &str = "default";
const SPLIT: u32 = 10;
/// Generous: the plugin lists the node's pods every 5 s.
const DEADLINE: Duration = Duration::from_secs(90);
const BARE: [&str; 2] = ["bare", "bare-waiting"];
const OWNED: &str = "trainer-x1";
const CRITICAL: &str = "critical";

/// A one-vGPU pod with a label and an annotation of its own (both must survive a re-creation).
fn pod(name: &str) -> Pod {
    let mut pod = fixtures::vgpu_pod_with(
        NS,
        name,
        &[(VGPU_NUMBER, 1), (VGPU_MEMORY, 1024)],
        &[("example.com/owner-note", "kept")],
    );
    pod.metadata.labels = Some(BTreeMap::from([("app".to_owned(), name.to_owned())]));
    pod
}

/// The kubelet's status for a pod whose device allocation failed at admission.
fn admission_failed() -> serde_json::Value {
    json!({"status": {
        "phase": "Failed",
        "reason": "UnexpectedAdmissionError",
        "message": "Allocate failed due to rpc error: code = Unknown desc = Allocate check failed: \
                    no pod pre-allocated these devices, which is unexpected",
    }})
}

/// The kubelet's status for a pod whose container could not start because PreStartContainer failed.
fn prestart_failed() -> serde_json::Value {
    json!({"status": {
        "phase": "Pending",
        "containerStatuses": [{
            "name": "main",
            "image": "registry.invalid/vgpu-e2e/pause:none",
            "imageID": "",
            "ready": false,
            "started": false,
            "restartCount": 0,
            "state": {"waiting": {
                "reason": "RunContainerError",
                "message": "device plugin PreStartContainer rpc failed: PreStartContainer check failed: \
                            vgpu.config is missing",
            }},
        }],
    }})
}

/// What the API server shows under `name` for the pod of UID `uid`: `Some(None)` when no pod has that name,
/// `Some(Some(pod))` when a pod of another UID has it, `None` while the old pod still exists. Plays the
/// kubelet's last step: a terminating old pod is deleted with `gracePeriodSeconds=0` (see the file docs), and
/// `played_kubelet` set.
async fn after_deletion(
    pods: &Api<Pod>,
    name: &str,
    uid: &str,
    played_kubelet: &AtomicBool,
) -> Option<Option<Pod>> {
    match pods.get_opt(name).await.ok()? {
        None => Some(None),
        Some(p) if p.metadata.uid.as_deref() != Some(uid) => Some(Some(p)),
        Some(p) => {
            if p.metadata.deletion_timestamp.is_some() {
                let now = DeleteParams {
                    grace_period_seconds: Some(0),
                    preconditions: Some(Preconditions { uid: Some(uid.to_owned()), resource_version: None }),
                    ..DeleteParams::default()
                };
                // A conflict or 404 means it is already gone: the next look tells.
                let _ = pods.delete(name, &now).await;
                played_kubelet.store(true, Ordering::Relaxed);
            }
            None
        }
    }
}

/// The first event about pod `name` of UID `uid` with this reason and action.
async fn event(events: &Api<Event>, name: &str, uid: &str, reason: &str, action: &str) -> Option<Event> {
    let list = events.list(&ListParams::default()).await.ok()?;
    list.items.into_iter().find(|e| {
        let about = e.regarding.as_ref();
        about.and_then(|r| r.name.as_deref()) == Some(name)
            && about.and_then(|r| r.uid.as_deref()) == Some(uid)
            && e.reason.as_deref() == Some(reason)
            && e.action.as_deref() == Some(action)
    })
}

fn scheduling_keys(map: Option<&BTreeMap<String, String>>) -> Vec<String> {
    map.into_iter().flatten().map(|(k, _)| k.clone()).filter(|k| k.starts_with("nvidia.com/")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the control-plane binaries: run e2e/run.sh"]
async fn reschedule_evicts_recreates_and_spares_critical_pods() {
    let mut env =
        TestEnv::builder("reschedule_evicts_recreates_and_spares_critical_pods").start().await.unwrap();
    let client = env.client().await.unwrap();
    let gate = "--feature-gates=AllocationFailureReschedule=true".to_owned();
    let node = MockPluginNode::start(&mut env, NODE, SPLIT, &[gate]).await.unwrap();
    let extender = start_vgpu_scheduling(&mut env).await.unwrap();

    // The owner of `trainer-x1`: a ReplicaSet that asks for no pod (no controller-manager runs anyway).
    let replica_sets: Api<ReplicaSet> = Api::namespaced(client.clone(), NS);
    let rs: ReplicaSet = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": "trainer", "namespace": NS},
        "spec": {"replicas": 0, "selector": {"matchLabels": {"app": OWNED}},
            "template": {"metadata": {"labels": {"app": OWNED}},
                "spec": {"containers": [{"name": "main", "image": "registry.invalid/vgpu-e2e/pause:none"}]}}},
    }))
    .unwrap();
    let rs = replica_sets.create(&PostParams::default(), &rs).await.unwrap();

    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let mut owned = pod(OWNED);
    owned.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "apps/v1".into(),
        kind: "ReplicaSet".into(),
        name: "trainer".into(),
        uid: rs.metadata.uid.clone().unwrap(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }]);
    let mut critical = pod(CRITICAL);
    critical.spec.as_mut().unwrap().priority_class_name = Some("system-node-critical".into());
    for p in [pod(BARE[0]), pod(BARE[1]), owned, critical] {
        pods.create(&PostParams::default(), &p).await.unwrap();
    }
    let mut before = BTreeMap::new();
    for name in [BARE[0], BARE[1], OWNED, CRITICAL] {
        let bound = fixtures::wait_for_pod_node(&client, NS, name, Duration::from_secs(60)).await.unwrap();
        assert_eq!(bound, NODE);
        let p = pods.get(name).await.unwrap();
        assert!(
            !scheduling_keys(p.metadata.annotations.as_ref()).is_empty(),
            "{name}: the extender wrote no scheduling annotations: {:?}",
            p.metadata.annotations
        );
        before.insert(name, p);
    }
    let uid = |name: &str| before[name].metadata.uid.clone().unwrap();

    // No scheduler from here: a re-created pod stays as the plugin created it.
    env.stop_process("kube-scheduler").unwrap();

    // The kubelet reports the failed allocations (the critical pod's first).
    let status = PatchParams::default();
    for (name, failure) in [
        (CRITICAL, admission_failed()),
        (OWNED, admission_failed()),
        (BARE[0], admission_failed()),
        (BARE[1], prestart_failed()),
    ] {
        pods.patch_status(name, &status, &Patch::Merge(&failure)).await.unwrap();
    }

    // The ReplicaSet's pod: evicted.
    let events: Api<Event> = Api::namespaced(client.clone(), NS);
    let owned_uid = uid(OWNED);
    let played_kubelet = AtomicBool::new(false);
    let left = env
        .poll("trainer-x1 evicted", DEADLINE, || after_deletion(&pods, OWNED, &owned_uid, &played_kubelet))
        .await
        .unwrap();
    assert!(left.is_none(), "nothing re-creates an evicted ReplicaSet pod here: {left:?}");
    env.poll("the Evict event", DEADLINE, || event(&events, OWNED, &owned_uid, "Evict", "Evicted"))
        .await
        .unwrap();

    // The bare pods: deleted and re-created with the same name and spec, unbound, without scheduling metadata.
    let mut recreated = Vec::new();
    for name in BARE {
        let old = &before[name];
        let old_uid = uid(name);
        let played_kubelet = AtomicBool::new(false);
        let new = env
            .poll(&format!("{name} re-created"), DEADLINE, || async {
                after_deletion(&pods, name, &old_uid, &played_kubelet).await.flatten()
            })
            .await
            .unwrap();
        // The API server removes a Failed pod at once; the Pending one waited for the (test) kubelet.
        assert_eq!(played_kubelet.load(Ordering::Relaxed), name == BARE[1], "{name}");
        let new_uid = new.metadata.uid.clone().unwrap();
        assert_ne!(new_uid, old_uid);
        let (old_spec, spec) = (old.spec.as_ref().unwrap(), new.spec.as_ref().unwrap());
        assert_eq!(spec.node_name, None, "{name} was re-created bound");
        assert_eq!(spec.containers, old_spec.containers, "{name}");
        assert_eq!(spec.scheduler_name, old_spec.scheduler_name, "{name}");
        assert_eq!(new.metadata.labels.as_ref().unwrap()["app"], name);
        assert_eq!(new.metadata.annotations.as_ref().unwrap()["example.com/owner-note"], "kept");
        assert_eq!(scheduling_keys(new.metadata.labels.as_ref()), Vec::<String>::new(), "{name}");
        assert_eq!(scheduling_keys(new.metadata.annotations.as_ref()), Vec::<String>::new(), "{name}");
        assert_eq!(new.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Pending"), "{name}");
        env.poll(&format!("{name}: the Deleted event"), DEADLINE, || {
            event(&events, name, &old_uid, "Recovery", "Deleted")
        })
        .await
        .unwrap();
        env.poll(&format!("{name}: the Recovered event"), DEADLINE, || {
            event(&events, name, &new_uid, "Recovery", "Recovered")
        })
        .await
        .unwrap();
        recreated.push(new_uid);
    }
    let checkpoint = node.manager_dir.join("checkpoints/recovery-checkpoint.json");
    env.poll("an empty recovery checkpoint", DEADLINE, || async {
        let Ok(text) = std::fs::read_to_string(&checkpoint) else { return Some(()) };
        let data: serde_json::Value = serde_json::from_str(&text).ok()?;
        data["pods"].as_object().is_none_or(|m| m.is_empty()).then_some(())
    })
    .await
    .unwrap();

    // The critical pod: an event, nothing else.
    let critical_uid = uid(CRITICAL);
    env.poll("the CriticalPod event", DEADLINE, || {
        event(&events, CRITICAL, &critical_uid, "CriticalPod", "Skipped")
    })
    .await
    .unwrap();
    let critical = pods.get(CRITICAL).await.unwrap();
    assert_eq!(critical.metadata.uid.as_deref(), Some(critical_uid.as_str()));
    assert_eq!(critical.metadata.deletion_timestamp, None);
    assert_eq!(critical.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Failed"));
    assert_eq!(critical.spec.as_ref().and_then(|s| s.node_name.as_deref()), Some(NODE));

    // With the scheduler back, our extender places the re-created pods again.
    env.start_scheduler(&extender).await.unwrap();
    for (name, new_uid) in BARE.iter().zip(&recreated) {
        let bound = fixtures::wait_for_pod_node(&client, NS, name, Duration::from_secs(60)).await.unwrap();
        assert_eq!(bound, NODE);
        let p = pods.get(name).await.unwrap();
        assert_eq!(p.metadata.uid.as_ref(), Some(new_uid), "{name} was re-created twice");
        assert!(p.metadata.annotations.unwrap().contains_key("nvidia.com/pre-allocated"), "{name}");
    }
    drop(node);
    env.finish();
}
