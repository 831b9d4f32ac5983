//! Smoke test of kube-scheduler with the vgpu extender configuration, against a fake
//! extender: filter keeps every node, prioritize scores 0, bind posts `pods/binding`.
//!
//! Needs the control-plane binaries (`e2e/build-controlplane.sh`); run with
//! `cargo test -p vgpu-e2e -- --ignored --test-threads=1` or `e2e/run.sh`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Binding, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::PostParams;
use serde_json::{Value, json};
use vgpu_e2e::{ExtenderConfig, JsonServer, TestEnv, fixtures};

type Calls = Arc<Mutex<Vec<(String, Value)>>>;

/// The fake extender: every call is recorded, then answered.
async fn fake_extender(client: kube::Client, calls: Calls) -> JsonServer {
    JsonServer::start(move |path, args| {
        calls.lock().unwrap().push((path.clone(), args.clone()));
        let client = client.clone();
        async move {
            match path.as_str() {
                "/scheduler/filter" => {
                    (200, json!({"NodeNames": args["NodeNames"], "FailedNodes": {}, "Error": ""}))
                }
                "/scheduler/prioritize" => {
                    let names = args["NodeNames"].as_array().cloned().unwrap_or_default();
                    let scores: Vec<Value> = names.iter().map(|n| json!({"Host": n, "Score": 0})).collect();
                    (200, Value::Array(scores))
                }
                "/scheduler/bind" => (200, json!({"Error": bind(client, &args).await})),
                "/scheduler/preempt" => {
                    (200, json!({"NodeNameToMetaVictims": args["NodeNameToMetaVictims"]}))
                }
                _ => (404, json!({"Error": format!("unknown verb {path}")})),
            }
        }
    })
    .await
    .unwrap()
}

/// Binds as the real extender does: `POST pods/<name>/binding`. Returns the error text ("" = ok).
async fn bind(client: kube::Client, args: &Value) -> String {
    let field = |key: &str| args[key].as_str().unwrap_or_default().to_owned();
    let pods: Api<Pod> = Api::namespaced(client, &field("PodNamespace"));
    let binding = Binding {
        metadata: ObjectMeta {
            name: Some(field("PodName")),
            namespace: Some(field("PodNamespace")),
            uid: Some(field("PodUID")),
            ..ObjectMeta::default()
        },
        target: ObjectReference {
            api_version: Some("v1".to_owned()),
            kind: Some("Node".to_owned()),
            name: Some(field("Node")),
            ..ObjectReference::default()
        },
    };
    match pods
        .create_subresource::<_, Value>("binding", &field("PodName"), &PostParams::default(), &binding)
        .await
    {
        Ok(_) => String::new(),
        Err(e) => e.to_string(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the control-plane binaries: run e2e/run.sh"]
async fn scheduler_calls_the_extender_which_binds_the_vgpu_pod() {
    let mut env =
        TestEnv::builder("scheduler_calls_the_extender_which_binds_the_vgpu_pod").start().await.unwrap();
    let client = env.client().await.unwrap();
    fixtures::create_vgpu_node(&client, "gpu-node-1", 4, 10).await.unwrap();

    let calls = Calls::default();
    let extender = fake_extender(client.clone(), Arc::clone(&calls)).await;
    env.start_scheduler(&ExtenderConfig::vgpu(format!("{}/scheduler", extender.url()))).await.unwrap();

    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.create(&PostParams::default(), &fixtures::vgpu_pod("default", "vgpu-pod", 1)).await.unwrap();

    let node =
        fixtures::wait_for_pod_node(&client, "default", "vgpu-pod", Duration::from_secs(90)).await.unwrap();
    assert_eq!(node, "gpu-node-1");

    let calls = calls.lock().unwrap().clone();
    let verbs: Vec<&str> = calls.iter().map(|(path, _)| path.as_str()).collect();
    let filter = calls
        .iter()
        .find(|(path, _)| path == "/scheduler/filter")
        .unwrap_or_else(|| panic!("no filter call; calls: {verbs:?}"));
    assert_eq!(filter.1["NodeNames"], json!(["gpu-node-1"]), "nodeCacheCapable sends NodeNames");
    assert_eq!(filter.1["Pod"]["metadata"]["name"], "vgpu-pod");
    let bind = calls
        .iter()
        .find(|(path, _)| path == "/scheduler/bind")
        .unwrap_or_else(|| panic!("no bind call; calls: {verbs:?}"));
    assert_eq!(bind.1["PodName"], "vgpu-pod");
    assert_eq!(bind.1["Node"], "gpu-node-1");

    // What the extender's bind relies on (`MetadataPatch::with_uid`): a merge patch carrying another
    // `metadata.uid` is refused by kube-apiserver and changes nothing; the pod's own UID patches.
    let uid = pods.get("vgpu-pod").await.unwrap().metadata.uid.unwrap();
    let params = kube::api::PatchParams::default();
    let other = json!({"metadata": {"uid": "00000000-0000-0000-0000-000000000000", "labels": {"e2e": "x"}}});
    let err = pods.patch("vgpu-pod", &params, &kube::api::Patch::Merge(&other)).await.unwrap_err();
    assert!(err.to_string().contains("uid"), "{err}");
    let own = json!({"metadata": {"uid": uid, "labels": {"e2e": "y"}}});
    let patched = pods.patch("vgpu-pod", &params, &kube::api::Patch::Merge(&own)).await.unwrap();
    assert_eq!(patched.metadata.labels.unwrap()["e2e"], "y");

    drop(extender);
    env.finish();
}
