#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! The real HTTP server on a loopback port, driven with upstream-shaped JSON for every verb.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use vgpu_core::clock::ManualClock;
use vgpu_core::domain::ResourceDomain;
use vgpu_core::model::{NodeDeviceInventory, NodeVgpuConfig};
use vgpu_lease::{Readiness, Role};
use vgpu_scheduler::fixture::{vgpu_node, vgpu_pod};
use vgpu_scheduler::server::{AppState, ServerConfig, router, serve};
use vgpu_scheduler::work::{WorkLimits, WorkPool};
use vgpu_scheduler::{Extender, ExtenderConfig, MemoryCluster, Metrics, Node, Pod};
use vgpu_serve::tls::CertReloader;

const T0: i64 = 1_700_000_000_000_000_000;

fn inventory(gpus: u32, split: u32) -> NodeDeviceInventory {
    let mut inv = NodeDeviceInventory::uniform(gpus, 16384, split).with_type_name("A100");
    // Two GPUs per NUMA node (the NUMA-mode placement below relies on it).
    for d in &mut inv.devices {
        d.numa_node = Some(d.index / 2);
    }
    inv
}

struct Opts {
    nodes: usize,
    gpus: u32,
    split: u32,
    readiness: Readiness,
    extender: ExtenderConfig,
    server: ServerConfig,
    tls: Option<tokio_rustls::TlsAcceptor>,
}

impl Default for Opts {
    fn default() -> Self {
        Self {
            nodes: 3,
            gpus: 2,
            split: 4,
            readiness: Readiness::ready(),
            extender: ExtenderConfig::default(),
            server: ServerConfig::default(),
            tls: None,
        }
    }
}

struct TestServer {
    addr: SocketAddr,
    d: ResourceDomain,
    cluster: MemoryCluster,
    clock: Arc<ManualClock>,
    ext: Arc<Extender<MemoryCluster, ManualClock>>,
    readiness: Readiness,
    inv: NodeDeviceInventory,
    names: Vec<String>,
    pool: Arc<WorkPool>,
    stop: CancellationToken,
    task: Option<tokio::task::JoinHandle<()>>,
}

async fn start(opts: Opts) -> TestServer {
    let d = ResourceDomain::default();
    let cluster = MemoryCluster::new();
    let inv = inventory(opts.gpus, opts.split);
    let names: Vec<String> = (0..opts.nodes).map(|i| format!("n{i}")).collect();
    for n in &names {
        cluster.upsert_node(vgpu_node(n, &inv, &NodeVgpuConfig::default(), None, &d).unwrap());
    }
    let clock = Arc::new(ManualClock::new(T0));
    let metrics = Arc::new(Metrics::new());
    let ext =
        Arc::new(Extender::new(cluster.clone(), clock.clone(), opts.extender).with_observer(metrics.clone()));
    ext.attach();
    ext.sync().await.unwrap();
    let state = AppState::new(ext.clone(), opts.readiness.clone(), metrics)
        .with_limits(&opts.server)
        .with_probes_only_beyond_loopback(opts.server.probes_only_beyond_loopback);
    let pool = state.pool().clone();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = CancellationToken::new();
    let stopped = stop.clone().cancelled_owned();
    let (config, tls) = (opts.server, opts.tls);
    let task = tokio::spawn(async move {
        serve(listener, router(state), tls, &config, stopped).await;
    });
    TestServer {
        addr,
        d,
        cluster,
        clock,
        ext,
        readiness: opts.readiness,
        inv,
        names,
        pool,
        stop,
        task: Some(task),
    }
}

impl TestServer {
    /// Graceful shutdown: the serve task ends.
    async fn stop(mut self) {
        self.stop.cancel();
        tokio::time::timeout(Duration::from_secs(5), self.task.take().unwrap()).await.unwrap().unwrap();
    }

    async fn call(&self, method: Method, path: &str, body: impl Into<Bytes>) -> (StatusCode, String) {
        let stream = TcpStream::connect(self.addr).await.unwrap();
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
        tokio::spawn(conn);
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header("host", "127.0.0.1")
            .header("content-type", "application/json")
            .body(Full::new(body.into()))
            .unwrap();
        let resp = sender.send_request(req).await.unwrap();
        let status = resp.status();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8(body.to_vec()).unwrap())
    }

    async fn post(&self, path: &str, body: &Value) -> (StatusCode, Value) {
        let (status, text) = self.call(Method::POST, path, body.to_string()).await;
        let v = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {status} {text:?}: {e}"));
        (status, v)
    }

    async fn get(&self, path: &str) -> (StatusCode, String) {
        self.call(Method::GET, path, Bytes::new()).await
    }

    fn pod(&self, uid: &str, n: u32, cores: u32, mem: u64, ann: &[(String, String)]) -> Pod {
        self.cluster.upsert_pod(vgpu_pod(uid, n, cores, mem, ann, &self.d))
    }
}

/// A light pod as kube-scheduler sends it: a full `v1.Pod`.
fn pod_json(p: &Pod) -> Value {
    let containers: Vec<Value> = p
        .spec
        .containers
        .iter()
        .map(|c| json!({"name": c.name, "image": "nvcr.io/nvidia/cuda:12.4.0-base", "resources": {"limits": c.limits, "requests": c.limits}}))
        .collect();
    json!({
        "metadata": {
            "name": p.name, "namespace": p.namespace, "uid": p.uid, "resourceVersion": p.resource_version.to_string(),
            "creationTimestamp": "2026-01-01T00:00:00Z", "labels": p.labels, "annotations": p.annotations
        },
        "spec": {"schedulerName": "default-scheduler", "nodeName": p.node_name, "priority": p.priority,
                 "containers": containers},
        "status": {"phase": "Pending", "qosClass": "BestEffort"}
    })
}

fn node_json(n: &Node) -> Value {
    let allocatable: serde_json::Map<String, Value> =
        n.allocatable.iter().map(|(k, v)| (k.clone(), Value::String(v.to_string()))).collect();
    json!({
        "metadata": {"name": n.name, "labels": n.labels, "annotations": n.annotations},
        "status": {"allocatable": allocatable}
    })
}

fn filter_args(pod: &Pod, names: &[String]) -> Value {
    json!({"Pod": pod_json(pod), "Nodes": null, "NodeNames": names})
}

fn bind_args(pod: &Pod, node: &str) -> Value {
    json!({"PodName": pod.name, "PodNamespace": pod.namespace, "PodUID": pod.uid, "Node": node})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filter_fit_then_bind_then_bind_again() {
    let s = start(Opts::default()).await;
    let binpack = vec![(s.d.node_scheduler_policy(), "binpack".to_string())];
    let pod = s.pod("u1", 1, 50, 4096, &binpack);
    let (status, r) = s.post(vgpu_scheduler::FILTER_PATH, &filter_args(&pod, &s.names)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        r,
        json!({
            "Nodes": null,
            "NodeNames": ["n0"],
            // n1 and n2 were rejected too ("pod already scheduled to another node"), but kube-scheduler drops
            // the rejected nodes once one passes: the live answer leaves them out.
            "FailedNodes": {},
            "FailedAndUnresolvableNodes": null,
            "Error": ""
        })
    );
    let p = s.cluster.pod("default", "pod-u1").unwrap();
    assert!(!p.annotations.contains_key(&s.d.pre_allocated()), "the bind writes the pre-allocation");

    let (status, r) = s.post(vgpu_scheduler::BIND_PATH, &bind_args(&p, "n0")).await;
    assert_eq!((status, r), (StatusCode::OK, json!({"Error": ""})));
    let p = s.cluster.pod("default", "pod-u1").unwrap();
    assert_eq!(p.node_name.as_deref(), Some("n0"));
    assert_eq!(p.annotations[&s.d.pre_allocated()], "main[0_GPU-0_50_4096]");
    assert_eq!(p.labels[&s.d.assigned_phase()], "allocating");

    // Binding a bound pod again (a retry) succeeds without touching it; to another node it fails, and
    // neither marks the pod failed.
    let (status, r) = s.post(vgpu_scheduler::BIND_PATH, &bind_args(&p, "n0")).await;
    assert_eq!((status, r), (StatusCode::OK, json!({"Error": ""})));
    let (status, r) = s.post(vgpu_scheduler::BIND_PATH, &bind_args(&p, "n1")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(r["Error"], "pod has been bound to node \"n0\"");
    let again = s.cluster.pod("default", "pod-u1").unwrap();
    assert_eq!(again.labels[&s.d.assigned_phase()], "allocating");
    assert_eq!(again.resource_version, p.resource_version, "a repeated bind must not patch the pod");
    // And filtering it again is refused.
    let (_, r) = s.post(vgpu_scheduler::FILTER_PATH, &filter_args(&p, &s.names)).await;
    assert_eq!(r["Error"], "pod has been bound to node \"n0\"");
    assert_eq!(r["NodeNames"], Value::Null);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filter_no_fit_unknown_nodes_and_nodes_form() {
    let s = start(Opts { gpus: 1, ..Opts::default() }).await;
    let big = s.pod("big", 2, 0, 0, &[]);
    let mut names = s.names.clone();
    names.push("ghost".into());
    let (status, r) = s.post(vgpu_scheduler::FILTER_PATH, &filter_args(&big, &names)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(r["Error"], "");
    assert_eq!(r["NodeNames"], json!([]));
    assert_eq!(
        r["FailedNodes"],
        json!({"n0": "Insufficient GPU cards", "n1": "Insufficient GPU cards", "n2": "Insufficient GPU cards",
               "ghost": "node missing from cache"})
    );
    let ev = s.cluster.events().pop().unwrap();
    assert_eq!(
        ev.message,
        "0/4 nodes are available: Insufficient GPU cards (n0, n1, n2), node missing from cache (ghost)."
    );

    // nodeCacheCapable=false: full Node objects in, the passing ones out.
    let pod = s.pod("small", 1, 10, 0, &[]);
    let nodes: Vec<Value> = s
        .names
        .iter()
        .map(|n| node_json(&vgpu_node(n, &s.inv, &NodeVgpuConfig::default(), None, &s.d).unwrap()))
        .collect();
    let args = json!({"Pod": pod_json(&pod), "Nodes": {"metadata": {}, "items": nodes}});
    let (_, r) = s.post(vgpu_scheduler::FILTER_PATH, &args).await;
    assert_eq!(r["Error"], "");
    assert_eq!(r["NodeNames"], Value::Null);
    let items = r["Nodes"]["items"].as_array().unwrap();
    assert_eq!(items.len(), 1);
    assert_eq!(items[0]["metadata"], nodes[0]["metadata"], "the node object is echoed whole");
    assert_eq!(items[0]["status"], nodes[0]["status"]);

    // Only unknown nodes; a node list without names is refused.
    let other = s.pod("other", 1, 10, 0, &[]);
    let (_, r) = s.post(vgpu_scheduler::FILTER_PATH, &filter_args(&other, &["x".into(), "y".into()])).await;
    assert_eq!(r["FailedNodes"], json!({"x": "node missing from cache", "y": "node missing from cache"}));
    let args = json!({"Pod": pod_json(&other), "Nodes": {"items": [{"metadata": {}}]}});
    let (_, r) = s.post(vgpu_scheduler::FILTER_PATH, &args).await;
    assert_eq!(
        r["Error"],
        "ExtenderArgs.Nodes.items[0] has no metadata.name; expected every node to be named"
    );
    let (_, r) =
        s.post(vgpu_scheduler::FILTER_PATH, &json!({"Pod": pod_json(&other), "NodeNames": []})).await;
    assert_eq!(r["Error"], "No schedulable nodes");
    let (_, r) = s.post(vgpu_scheduler::FILTER_PATH, &json!({"NodeNames": ["n0"]})).await;
    assert_eq!(r["Error"], "extenderArgs.Pod cannot be empty");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filter_dry_run_has_no_side_effects() {
    let s = start(Opts { gpus: 1, ..Opts::default() }).await;
    let a = s.pod("a", 1, 100, 0, &[]);
    let (_, r) = s.post(vgpu_scheduler::FILTER_PATH, &filter_args(&a, &s.names)).await;
    assert_eq!(r["NodeNames"], json!(["n0"]));
    let events_before = s.cluster.events().len();
    let b = s.pod("b", 1, 100, 0, &[]);
    let (status, r) = s.post(vgpu_scheduler::FILTER_DRYRUN_PATH, &filter_args(&b, &s.names)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(r["Error"], "");
    assert_eq!(r["NodeNames"], json!(["n1", "n2"]), "every feasible node");
    let why = r["FailedNodes"]["n0"].as_str().unwrap();
    assert!(why.starts_with("Insufficient vGPU cores"), "detailed reason: {why}");
    let b = s.cluster.pod("default", "pod-b").unwrap();
    assert!(!b.annotations.contains_key(&s.d.pre_allocated()), "no patch");
    assert_eq!(s.ext.cache().reservation_count(), 1, "a's reservation only");
    assert_eq!(s.cluster.events().len(), events_before, "no event");
    // The live filter still sees n1 and n2 free.
    let (_, r) = s.post(vgpu_scheduler::FILTER_PATH, &filter_args(&b, &s.names)).await;
    assert_eq!(r["NodeNames"], json!(["n1"]));
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prioritize_scores_every_node() {
    let s = start(Opts::default()).await;
    let a = s.pod("a", 1, 80, 8192, &[]);
    s.post(vgpu_scheduler::FILTER_PATH, &filter_args(&a, &s.names[1..2])).await;
    let binpack = vec![(s.d.node_scheduler_policy(), "binpack".to_string())];
    let q = s.pod("q", 1, 10, 1024, &binpack);
    let mut names = s.names.clone();
    names.push("ghost".into());
    let (status, r) = s.post(vgpu_scheduler::PRIORITIZE_PATH, &filter_args(&q, &names)).await;
    assert_eq!(status, StatusCode::OK);
    let list = r.as_array().unwrap();
    assert_eq!(list.len(), 4);
    let hosts: Vec<&str> = list.iter().map(|h| h["Host"].as_str().unwrap()).collect();
    assert_eq!(hosts, ["n0", "n1", "n2", "ghost"]);
    let score = |i: usize| list[i]["Score"].as_i64().unwrap();
    assert!((0..4).all(|i| (0..=10).contains(&score(i))));
    assert!(score(1) > score(0), "binpack prefers the used node: {r}");
    assert_eq!(score(3), 0, "unknown node");
    // Without a pod: 400.
    let (status, text) =
        s.call(Method::POST, vgpu_scheduler::PRIORITIZE_PATH, json!({"NodeNames": ["n0"]}).to_string()).await;
    assert_eq!((status, text.as_str()), (StatusCode::BAD_REQUEST, "extenderArgs.Pod cannot be empty\n"));
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bind_after_the_pre_allocation_expired_fails() {
    let s = start(Opts::default()).await;
    let pod = s.pod("late", 1, 10, 0, &[]);
    let (_, r) = s.post(vgpu_scheduler::FILTER_PATH, &filter_args(&pod, &s.names)).await;
    assert_eq!(r["NodeNames"], json!(["n0"]));
    // The scheduler marked it unschedulable before the predicate, then nothing happened past the grace period.
    let mut p = s.cluster.pod("default", "pod-late").unwrap();
    p.unschedulable_since_ns = Some(T0 - 5_000_000_000);
    let p = s.cluster.upsert_pod(p);
    s.clock.advance(31_000_000_000);
    let (status, r) = s.post(vgpu_scheduler::BIND_PATH, &bind_args(&p, "n0")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(r["Error"], "device pre allocation check failed, unable to bind to node \"n0\"");
    let p = s.cluster.pod("default", "pod-late").unwrap();
    assert_eq!(p.node_name, None);
    assert_eq!(p.labels[&s.d.assigned_phase()], "failed");

    // Other bind failures: wrong node, wrong UID, unknown pod, no node.
    let other = s.pod("o", 1, 10, 0, &[]);
    s.post(vgpu_scheduler::FILTER_PATH, &filter_args(&other, &s.names)).await;
    let (_, r) = s
        .post(
            vgpu_scheduler::BIND_PATH,
            &json!({"PodName": "pod-o", "PodNamespace": "default",
        "PodUID": "not-o", "Node": "n0"}),
        )
        .await;
    assert_eq!(r["Error"], "different uid \"not-o\" from the target pod");
    let (_, r) = s.post(vgpu_scheduler::BIND_PATH, &bind_args(&other, "n2")).await;
    assert_eq!(r["Error"], "predicate node \"n0\" does not match the bound node \"n2\"");
    let (_, r) = s
        .post(
            vgpu_scheduler::BIND_PATH,
            &json!({"PodName": "nope", "PodNamespace": "default",
        "PodUID": "x", "Node": "n0"}),
        )
        .await;
    assert_eq!(r["Error"], "pod default/nope not found");
    let (_, r) = s.post(vgpu_scheduler::BIND_PATH, &bind_args(&other, "")).await;
    assert_eq!(r["Error"], "ExtenderBindingArgs.Node cannot be empty");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preempt_both_victim_forms_and_passthrough() {
    let s = start(Opts { nodes: 2, gpus: 1, ..Opts::default() }).await;
    let mut low = vgpu_pod("low", 1, 100, 0, &[], &s.d);
    low.priority = 1;
    let low = s.cluster.upsert_pod(low);
    let (_, r) = s.post(vgpu_scheduler::FILTER_PATH, &filter_args(&low, &s.names[..1])).await;
    assert_eq!(r["NodeNames"], json!(["n0"]));
    let low = s.cluster.pod("default", "pod-low").unwrap();
    assert_eq!(s.post(vgpu_scheduler::BIND_PATH, &bind_args(&low, "n0")).await.1["Error"], "");
    let mut ds = vgpu_pod("ds", 1, 0, 0, &[], &s.d);
    ds.owner_kind = Some("DaemonSet".into());
    ds.node_name = Some("n1".into());
    s.cluster.upsert_pod(ds);
    let mut hi = vgpu_pod("hi", 1, 100, 0, &[], &s.d);
    hi.priority = 100;

    // nodeCacheCapable: meta victims by UID.
    let args = json!({
        "Pod": pod_json(&hi),
        "NodeNameToVictims": null,
        "NodeNameToMetaVictims": {
            "n0": {"Pods": [], "NumPDBViolations": 0},
            "n1": {"Pods": [{"UID": "ds"}], "NumPDBViolations": 0}
        }
    });
    let (status, r) = s.post(vgpu_scheduler::PREEMPT_PATH, &args).await;
    assert_eq!(status, StatusCode::OK);
    // NumPDBViolations is counted against the cluster's budgets (none here), not bounded.
    assert_eq!(
        r,
        json!({"NodeNameToMetaVictims": {
            "n0": {"Pods": [{"UID": "low"}], "NumPDBViolations": 0},
            "n1": {"Pods": [], "NumPDBViolations": 0}
        }})
    );
    // Full victims form.
    let args = json!({
        "Pod": pod_json(&hi),
        "NodeNameToVictims": {"n0": {"Pods": [pod_json(&low)], "NumPDBViolations": 1}}
    });
    let (_, r) = s.post(vgpu_scheduler::PREEMPT_PATH, &args).await;
    assert_eq!(
        r,
        json!({"NodeNameToMetaVictims": {"n0": {"Pods": [{"UID": "low"}], "NumPDBViolations": 0}}})
    );
    // A pod without vGPUs passes through (the scheduler's count is echoed).
    let plain = json!({"metadata": {"name": "plain", "namespace": "default", "uid": "plain"},
                       "spec": {"containers": [{"name": "c", "image": "busybox"}]}});
    let args = json!({"Pod": plain, "NodeNameToMetaVictims": {"n0": {"Pods": [{"UID": "x"}], "NumPDBViolations": 1}}});
    let (_, r) = s.post(vgpu_scheduler::PREEMPT_PATH, &args).await;
    assert_eq!(r, json!({"NodeNameToMetaVictims": {"n0": {"Pods": [{"UID": "x"}], "NumPDBViolations": 1}}}));

    let (_, m) = s.get("/metrics").await;
    assert!(m.contains(r#"vgpu_scheduler_verb_total{verb="preempt",result="victims"} 2"#), "{m}");
    assert!(m.contains(r#"vgpu_scheduler_verb_total{verb="preempt",result="passthrough"} 1"#));
    assert!(m.contains(r#"vgpu_scheduler_preempt_protected_total{reason="daemonset"} 1"#));
    assert!(m.contains("vgpu_scheduler_preempt_victims_added_count 3"));
    assert!(m.contains(r#"vgpu_scheduler_preempt_victims_added_bucket{le="0.0"} 2"#));
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_bodies_get_protocol_errors() {
    let s = start(Opts::default()).await;
    let filters = [vgpu_scheduler::FILTER_PATH, vgpu_scheduler::FILTER_DRYRUN_PATH];
    let generic = ["", "   ", "{", "not json", "[]", "null", "{} {}", "\u{0}"];
    for body in
        generic.iter().chain(&[r#"{"Pod": 5}"#, r#"{"NodeNames": "n0"}"#, r#"{"Nodes": {"items": 1}}"#])
    {
        for path in filters {
            let (status, text) = s.call(Method::POST, path, *body).await;
            assert_eq!(status, StatusCode::OK, "{path} {body:?}");
            let r: Value = serde_json::from_str(&text).unwrap();
            let e = r["Error"].as_str().unwrap();
            assert!(e.starts_with("malformed ExtenderArgs JSON"), "{path} {body:?}: {e}");
            assert_eq!(r["NodeNames"], Value::Null);
        }
        let (status, text) = s.call(Method::POST, vgpu_scheduler::PRIORITIZE_PATH, *body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
        assert!(text.starts_with("malformed ExtenderArgs JSON"), "{text}");
    }
    for body in generic.iter().chain(&[r#"{"PodName": 1}"#, r#"{"Node": {}}"#]) {
        let (status, text) = s.call(Method::POST, vgpu_scheduler::BIND_PATH, *body).await;
        assert_eq!(status, StatusCode::OK);
        let r: Value = serde_json::from_str(&text).unwrap();
        assert!(
            r["Error"].as_str().unwrap().starts_with("malformed ExtenderBindingArgs JSON"),
            "{body:?}: {r}"
        );
    }
    for body in generic.iter().chain(&[r#"{"Pod": []}"#, r#"{"NodeNameToMetaVictims": {"n0": 3}}"#]) {
        let (status, text) = s.call(Method::POST, vgpu_scheduler::PREEMPT_PATH, *body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body:?}: {text}");
        assert!(text.starts_with("malformed ExtenderPreemptionArgs JSON"), "{text}");
    }
    // Unknown keys are ignored, as Go does.
    let (status, r) = s.post(vgpu_scheduler::FILTER_PATH, &json!({"Extra": 0})).await;
    assert_eq!((status, r["Error"].as_str()), (StatusCode::OK, Some("extenderArgs.Pod cannot be empty")));
    // The message points at the offending field.
    let (_, text) =
        s.call(Method::POST, vgpu_scheduler::FILTER_PATH, r#"{"Pod": {"spec": {"containers": 7}}}"#).await;
    let r: Value = serde_json::from_str(&text).unwrap();
    assert!(
        r["Error"].as_str().unwrap().starts_with("malformed ExtenderArgs JSON at `Pod.spec.containers`"),
        "{r}"
    );
    let (_, text) = s.call(Method::POST, vgpu_scheduler::BIND_PATH, r#"{"PodName": ["x"]}"#).await;
    assert!(text.contains("at `PodName`: invalid type: sequence, expected a string"), "{text}");
    // Wrong method, unknown route.
    assert_eq!(s.get(vgpu_scheduler::FILTER_PATH).await.0, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(s.get("/scheduler/unknown").await.0, StatusCode::NOT_FOUND);
    // Still serving.
    assert_eq!(s.get("/healthz").await, (StatusCode::OK, "ok".to_string()));
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversize_and_slow_bodies_are_refused() {
    let s = start(Opts::default()).await;
    // A declared length over 7 MiB is refused before the body is read.
    let over = vgpu_scheduler::server::MAX_BODY_BYTES + 1;
    // Binds have a limit of their own, 64 KiB (`ExtenderBindingArgs` is four short strings).
    let bind_over = vgpu_scheduler::work::BIND_BODY_BYTES + 1;
    let mut c = TcpStream::connect(s.addr).await.unwrap();
    let head = format!(
        "POST {} HTTP/1.1\r\nhost: x\r\ncontent-length: {bind_over}\r\n\r\n{{",
        vgpu_scheduler::BIND_PATH
    );
    c.write_all(head.as_bytes()).await.unwrap();
    let reply = read_reply(&mut c).await;
    assert!(reply.starts_with("HTTP/1.1 200"), "bind: {reply}");
    assert!(reply.contains("request body exceeds the limit of 65536 bytes"), "bind: {reply}");
    for (path, status) in [
        (vgpu_scheduler::FILTER_PATH, "200"),
        (vgpu_scheduler::FILTER_DRYRUN_PATH, "200"),
        (vgpu_scheduler::PREEMPT_PATH, "413"),
        (vgpu_scheduler::PRIORITIZE_PATH, "413"),
    ] {
        let mut c = TcpStream::connect(s.addr).await.unwrap();
        c.write_all(
            format!("POST {path} HTTP/1.1\r\nhost: x\r\ncontent-length: {over}\r\n\r\n{{").as_bytes(),
        )
        .await
        .unwrap();
        let reply = read_reply(&mut c).await;
        assert!(reply.starts_with(&format!("HTTP/1.1 {status}")), "{path}: {reply}");
        assert!(reply.contains("request body exceeds the limit of 7340032 bytes"), "{path}: {reply}");
    }
    // Exactly at the limit is read (and then judged as JSON).
    let mut at = vec![b' '; vgpu_scheduler::server::MAX_BODY_BYTES - 2];
    at.splice(0..0, b"{}".iter().copied());
    let (_, text) = s.call(Method::POST, vgpu_scheduler::FILTER_PATH, at).await;
    assert_eq!(serde_json::from_str::<Value>(&text).unwrap()["Error"], "extenderArgs.Pod cannot be empty");
    s.stop().await;

    // Small limits and timeouts: a chunked body without a length, a body that never ends, headers that never end.
    let server = ServerConfig {
        max_body_bytes: 1024,
        read_timeout: Duration::from_millis(300),
        header_read_timeout: Duration::from_millis(300),
        ..ServerConfig::default()
    };
    let s = start(Opts { server, ..Opts::default() }).await;
    let mut c = TcpStream::connect(s.addr).await.unwrap();
    c.write_all(b"POST /scheduler/filter HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n")
        .await
        .unwrap();
    for _ in 0..4 {
        let _ = c.write_all(format!("200\r\n{}\r\n", " ".repeat(512)).as_bytes()).await;
    }
    let _ = c.write_all(b"0\r\n\r\n").await;
    let reply = read_reply(&mut c).await;
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    assert!(reply.contains("request body exceeds the limit of 1024 bytes"), "{reply}");

    let mut c = TcpStream::connect(s.addr).await.unwrap();
    c.write_all(b"POST /scheduler/bind HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n{\"Pod")
        .await
        .unwrap();
    let reply = read_reply(&mut c).await;
    assert!(reply.contains("request body not received within 300ms"), "{reply}");

    let mut c = TcpStream::connect(s.addr).await.unwrap();
    c.write_all(b"POST /scheduler/filter HTTP/1.1\r\nhost: x\r\n").await.unwrap();
    let reply = read_reply(&mut c).await;
    assert!(!reply.contains("200 OK"), "connection dropped or refused: {reply}");
    assert_eq!(s.get("/healthz").await.0, StatusCode::OK);
    s.stop().await;
}

/// Reads until the server closes or a full response with a body arrived (3 s at most).
async fn read_reply(c: &mut TcpStream) -> String {
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(3), async {
        let mut chunk = [0u8; 4096];
        loop {
            match c.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
            let text = String::from_utf8_lossy(&buf);
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let len = head
                    .lines()
                    .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length: ").map(str::to_owned))
                    .and_then(|v| v.trim().parse::<usize>().ok());
                if len.is_some_and(|n| body.len() >= n) {
                    break;
                }
            }
        }
    })
    .await;
    String::from_utf8_lossy(&buf).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_synced_refuses_work_and_readyz_tracks_role() {
    let readiness = Readiness::new(Role::Follower);
    let s = start(Opts { readiness: readiness.clone(), ..Opts::default() }).await;
    let pod = s.pod("u", 1, 10, 0, &[]);
    let not_ready = "extender not ready: the cluster cache has not synced yet; retry later";
    let (status, r) = s.post(vgpu_scheduler::FILTER_PATH, &filter_args(&pod, &s.names)).await;
    assert_eq!((status, r["Error"].as_str()), (StatusCode::OK, Some(not_ready)));
    let (status, r) = s.post(vgpu_scheduler::FILTER_DRYRUN_PATH, &filter_args(&pod, &s.names)).await;
    assert_eq!((status, r["Error"].as_str()), (StatusCode::OK, Some(not_ready)));
    let (status, r) = s.post(vgpu_scheduler::BIND_PATH, &bind_args(&pod, "n0")).await;
    assert_eq!((status, r), (StatusCode::OK, json!({"Error": not_ready})));
    let (status, text) = s.call(Method::POST, vgpu_scheduler::PREEMPT_PATH, "{}").await;
    assert_eq!((status, text.trim()), (StatusCode::SERVICE_UNAVAILABLE, not_ready));
    let (status, _) = s.call(Method::POST, vgpu_scheduler::PRIORITIZE_PATH, "{}").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(!s.cluster.pod("default", "pod-u").unwrap().annotations.contains_key(&s.d.pre_allocated()));
    assert_eq!(
        s.get("/readyz").await,
        (StatusCode::INTERNAL_SERVER_ERROR, "not ready: caches not synced\n".to_string())
    );
    assert_eq!(s.get("/healthz").await, (StatusCode::OK, "ok".to_string()));

    s.readiness.set_synced(true);
    assert_eq!(
        s.get("/readyz").await,
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            "not ready: follower (another replica holds the leader lease)\n".into()
        )
    );
    // A synced follower still answers its co-located scheduler.
    let (_, r) = s.post(vgpu_scheduler::FILTER_PATH, &filter_args(&pod, &s.names)).await;
    assert_eq!(r["NodeNames"], json!(["n0"]));
    s.readiness.set_role(Role::Leader);
    assert_eq!(s.get("/readyz").await, (StatusCode::OK, "ok".to_string()));
    let (_, m) = s.get("/metrics").await;
    assert!(m.contains(r#"vgpu_scheduler_verb_total{verb="filter",result="error"} 1"#), "{m}");
    assert!(m.contains(r#"vgpu_scheduler_verb_total{verb="bind",result="error"} 1"#));
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_and_version() {
    let s = start(Opts::default()).await;
    let binpack = vec![(s.d.node_scheduler_policy(), "binpack".to_string())];
    let pod = s.pod("m1", 1, 20, 1024, &binpack);
    s.post(vgpu_scheduler::FILTER_PATH, &filter_args(&pod, &s.names)).await;
    let pod = s.cluster.pod("default", "pod-m1").unwrap();
    s.post(vgpu_scheduler::BIND_PATH, &bind_args(&pod, "n0")).await;
    let numa = vec![
        (s.d.device_topology_mode(), "numa".to_string()),
        (s.d.device_scheduler_policy(), "sideways".to_string()),
    ];
    let two = s.pod("m2", 2, 10, 0, &numa);
    let (_, r) = s.post(vgpu_scheduler::FILTER_PATH, &filter_args(&two, &s.names)).await;
    assert_eq!(r["Error"], "");
    let huge = s.pod("m3", 3, 0, 0, &[]);
    s.post(vgpu_scheduler::FILTER_DRYRUN_PATH, &filter_args(&huge, &s.names)).await;

    let (status, text) = s.get("/metrics").await;
    assert_eq!(status, StatusCode::OK);
    for line in [
        r#"vgpu_scheduler_verb_total{verb="filter",result="fit"} 2"#,
        r#"vgpu_scheduler_verb_total{verb="bind",result="success"} 1"#,
        r#"vgpu_scheduler_verb_total{verb="filter_dryrun",result="no_fit"} 1"#,
        r#"vgpu_scheduler_verb_duration_seconds_count{verb="filter",stage="total"} 2"#,
        r#"vgpu_scheduler_verb_duration_seconds_count{verb="filter",stage="node"} 2"#,
        r#"vgpu_scheduler_verb_duration_seconds_count{verb="filter",stage="device"} 2"#,
        r#"vgpu_scheduler_verb_duration_seconds_count{verb="filter",stage="lock_wait"} 2"#,
        r#"vgpu_scheduler_verb_duration_seconds_count{verb="bind",stage="total"} 1"#,
        r#"vgpu_scheduler_node_reject_total{verb="filter",code="AlreadyScheduledElsewhere"} 3"#,
        r#"vgpu_scheduler_node_reject_total{verb="filter",code="InsufficientVGPUMemory"} 1"#,
        r#"vgpu_scheduler_node_reject_total{verb="filter_dryrun",code="InsufficientGPUCards"} 3"#,
        r#"vgpu_scheduler_pod_policy_total{node_policy="binpack",device_policy="none",topology_mode="none"} 1"#,
        r#"vgpu_scheduler_pod_policy_total{node_policy="none",device_policy="other",topology_mode="numa"} 1"#,
        r#"vgpu_scheduler_topology_placement_total{mode="numa",result="numa"} 1"#,
        "# TYPE vgpu_scheduler_link_search counter",
        "# TYPE vgpu_scheduler_link_search_candidates histogram",
        "# TYPE vgpu_scheduler_crosspod_alignment counter",
        "# TYPE vgpu_scheduler_topology_strict_reject counter",
        "# TYPE process_cpu_seconds counter",
        "# TYPE process_resident_memory_bytes gauge",
        "# EOF",
    ] {
        assert!(text.contains(line), "{line} missing in\n{text}");
    }

    let (status, text) = s.get("/version").await;
    assert_eq!(status, StatusCode::OK);
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(v["component"], "vgpu-scheduler-extender");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_content_type_is_openmetrics() {
    let s = start(Opts::default()).await;
    let stream = TcpStream::connect(s.addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
    tokio::spawn(conn);
    let req = Request::get("/metrics").header("host", "x").body(Full::new(Bytes::new())).unwrap();
    let resp = sender.send_request(req).await.unwrap();
    assert_eq!(resp.headers()["content-type"], vgpu_scheduler::metrics::CONTENT_TYPE);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_filter_bind_streams_over_http_never_overcommit() {
    const STREAMS: usize = 16;
    const PODS: usize = 8;
    let extender = ExtenderConfig {
        serialize_filter: false,
        serialize_bind: false,
        emit_events: false,
        ..Default::default()
    };
    let s = Arc::new(start(Opts { nodes: 4, gpus: 4, split: 3, extender, ..Opts::default() }).await);
    let mut tasks = Vec::new();
    for st in 0..STREAMS {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            let mut placed = 0;
            for i in 0..PODS {
                let k = st * 31 + i * 7;
                let ann =
                    vec![(s.d.node_scheduler_policy(), ["binpack", "spread", "none"][k % 3].to_string())];
                let pod = s.pod(
                    &format!("s{st}-{i}"),
                    1 + (k % 3) as u32,
                    [30, 50, 70][k % 3],
                    [4096, 8192, 0][(k / 3) % 3],
                    &ann,
                );
                let (_, r) = s.post(vgpu_scheduler::FILTER_PATH, &filter_args(&pod, &s.names)).await;
                if let Some(node) = r["NodeNames"].as_array().and_then(|a| a.first()).and_then(Value::as_str)
                {
                    let (_, b) = s.post(vgpu_scheduler::BIND_PATH, &bind_args(&pod, node)).await;
                    if b["Error"] == "" {
                        placed += 1;
                    }
                }
            }
            placed
        }));
    }
    let mut placed = 0;
    for t in tasks {
        placed += t.await.unwrap();
    }
    assert!(placed > 0);
    common::assert_no_overcommit(&s.cluster, &s.ext, &s.inv, &s.d);
    let s = Arc::into_inner(s).unwrap();
    s.stop().await;
}

fn ca_and_leaf(ca: &rcgen::Issuer<'_, rcgen::KeyPair>, name: &str) -> (String, String, Vec<u8>) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
    params.distinguished_name.push(rcgen::DnType::CommonName, name);
    let cert = params.signed_by(&key, ca).unwrap();
    (cert.pem(), key.serialize_pem(), cert.der().to_vec())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_serves_h2_and_rotates_the_certificate() {
    use tokio_rustls::rustls;
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(rcgen::DnType::CommonName, "test CA");
    let ca_cert = ca_params.self_signed(&ca_key).unwrap();
    let ca = rcgen::Issuer::new(ca_params, ca_key);
    let (cert_a, key_a, der_a) = ca_and_leaf(&ca, "leaf A");
    let (cert_b, key_b, der_b) = ca_and_leaf(&ca, "leaf B");

    let dir = tempfile::tempdir().unwrap();
    let (cert_file, key_file) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    std::fs::write(&cert_file, &cert_a).unwrap();
    std::fs::write(&key_file, &key_a).unwrap();
    let reloader = Arc::new(CertReloader::load(&cert_file, &key_file).unwrap());
    let refresher = reloader.spawn_refresher(Duration::from_millis(50));
    let acceptor = vgpu_serve::tls::acceptor(reloader).unwrap();
    let s = start(Opts { tls: Some(acceptor), ..Opts::default() }).await;

    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca_cert.der().clone()).unwrap();
    let mut client = rustls::ClientConfig::builder_with_provider(vgpu_serve::tls::provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    client.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
    let addr = s.addr;
    let handshake = move || {
        let connector = connector.clone();
        async move {
            let tcp = TcpStream::connect(addr).await.unwrap();
            let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
            connector.connect(name, tcp).await.unwrap()
        }
    };
    let presented = |tls: &tokio_rustls::client::TlsStream<TcpStream>| {
        tls.get_ref().1.peer_certificates().unwrap()[0].as_ref().to_vec()
    };

    let tls = handshake().await;
    assert_eq!(presented(&tls), der_a);
    assert_eq!(
        tls.get_ref().1.alpn_protocol(),
        Some(&b"h2"[..]),
        "h2 when the client offers it (kube-scheduler)"
    );
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(conn);
    let req = Request::get("https://localhost/healthz").body(Full::new(Bytes::new())).unwrap();
    let resp = sender.send_request(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.into_body().collect().await.unwrap().to_bytes(), "ok");

    // A bad new certificate keeps the old one.
    std::fs::write(&cert_file, "-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(presented(&handshake().await), der_a);

    // Rotation: the next handshakes present the new certificate.
    std::fs::write(&key_file, &key_b).unwrap();
    std::fs::write(&cert_file, &cert_b).unwrap();
    let mut seen_b = false;
    for _ in 0..100 {
        if presented(&handshake().await) == der_b {
            seen_b = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(seen_b, "rotated certificate never presented");
    // Plain HTTP on a TLS port gets nothing useful back, and the server keeps serving.
    let mut c = TcpStream::connect(s.addr).await.unwrap();
    c.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n").await.unwrap();
    let reply = read_reply(&mut c).await;
    assert!(!reply.contains("200 OK"));
    assert_eq!(presented(&handshake().await), der_b);
    refresher.abort();
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_reports_unusable_tls_files_and_busy_addresses() {
    use vgpu_scheduler::server::{ServerError, run};
    use vgpu_serve::tls::TlsFiles;
    let s = start(Opts::default()).await;
    let state = || AppState::new(s.ext.clone(), s.readiness.clone(), Arc::new(Metrics::new()));
    let config = ServerConfig {
        bind_address: "127.0.0.1:0".parse().unwrap(),
        tls: Some(TlsFiles::new("/nonexistent/tls.crt", "/nonexistent/tls.key")),
        ..ServerConfig::default()
    };
    let e = run(config, state(), async {}).await.unwrap_err();
    assert!(matches!(e, ServerError::Tls(_)), "{e}");
    assert!(e.to_string().starts_with("reading /nonexistent/tls.crt: "), "{e}");
    let config = ServerConfig { bind_address: s.addr, ..ServerConfig::default() };
    let e = run(config, state(), async {}).await.unwrap_err();
    assert!(
        matches!(e, ServerError::Bind { .. }) && e.to_string().starts_with(&format!("binding {}: ", s.addr)),
        "{e}"
    );
    // A free address serves until the shutdown future completes.
    let config = ServerConfig { bind_address: "127.0.0.1:0".parse().unwrap(), ..ServerConfig::default() };
    tokio::time::timeout(
        Duration::from_secs(5),
        run(config, state(), tokio::time::sleep(Duration::from_millis(50))),
    )
    .await
    .unwrap()
    .unwrap();
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixteen_concurrent_filters_of_one_pod_get_one_node_and_the_bind_succeeds() {
    // Spread would move each new filter of the pod to another node if it did not find its own reservation;
    // without the global filter lock nothing but the per-pod lock orders them.
    for serialize_filter in [false, true] {
        let extender = ExtenderConfig { serialize_filter, emit_events: false, ..Default::default() };
        let s = Arc::new(start(Opts { nodes: 4, gpus: 2, extender, ..Opts::default() }).await);
        let spread = vec![(s.d.node_scheduler_policy(), "spread".to_string())];
        let pod = s.pod("one", 1, 30, 1024, &spread);
        let tasks: Vec<_> = (0..16)
            .map(|_| {
                let (s, pod) = (s.clone(), pod.clone());
                tokio::spawn(async move {
                    s.post(vgpu_scheduler::FILTER_PATH, &filter_args(&pod, &s.names)).await
                })
            })
            .collect();
        let mut nodes = std::collections::BTreeSet::new();
        for t in tasks {
            let (status, r) = t.await.unwrap();
            assert_eq!((status, r["Error"].as_str()), (StatusCode::OK, Some("")), "{r}");
            let passed = r["NodeNames"].as_array().unwrap();
            assert_eq!(passed.len(), 1, "{r}");
            nodes.insert(passed[0].as_str().unwrap().to_owned());
        }
        assert_eq!(nodes.len(), 1, "every filter answers the same node: {nodes:?}");
        let node = nodes.pop_first().unwrap();
        // One reservation: the pod is counted on that node only.
        let counted: Vec<String> = s
            .ext
            .cache()
            .usage_snapshot()
            .into_iter()
            .filter(|(_, _, u)| u.contains_pod("one"))
            .map(|(n, _, _)| n)
            .collect();
        assert_eq!(counted, std::slice::from_ref(&node));
        assert_eq!(s.ext.cache().reservation("one").map(|r| r.0), Some(node.clone()));
        assert_eq!(s.ext.pending_count(), 1);
        let p = s.cluster.pod("default", "pod-one").unwrap();
        let (_, b) = s.post(vgpu_scheduler::BIND_PATH, &bind_args(&p, &node)).await;
        assert_eq!(b, json!({"Error": ""}), "serialize_filter={serialize_filter}");
        let p = s.cluster.pod("default", "pod-one").unwrap();
        assert_eq!(p.node_name.as_deref(), Some(node.as_str()));
        assert_eq!(p.annotations[&s.d.predicate_node()], node);
        Arc::into_inner(s).unwrap().stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_names_collapse_and_oversized_lists_answer_cached_nodes_only() {
    let s = start(Opts::default()).await;
    let pod = s.pod("dup", 1, 10, 0, &[]);
    // Repeats: each node once, first occurrence kept, unknown names once.
    let names: Vec<String> = ["n0", "n1", "n0", "ghost", "n1", "ghost", "n2"].map(String::from).to_vec();
    let (_, text) =
        s.call(Method::POST, vgpu_scheduler::FILTER_DRYRUN_PATH, filter_args(&pod, &names).to_string()).await;
    assert_eq!(text.matches("\"ghost\"").count(), 1, "{text}");
    let r: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(r["NodeNames"], json!(["n0", "n1", "n2"]));
    assert_eq!(r["FailedNodes"], json!({"ghost": "node missing from cache"}));
    let (_, text) =
        s.call(Method::POST, vgpu_scheduler::FILTER_PATH, filter_args(&pod, &names).to_string()).await;
    let r: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(r["NodeNames"], json!(["n0"]));
    assert_eq!(text.matches("\"n0\"").count(), 1, "n0 passes and never fails too: {text}");
    assert_eq!(r["FailedNodes"], json!({}), "a node passed: no rejected nodes in the live answer");
    let (_, r) = s.post(vgpu_scheduler::PRIORITIZE_PATH, &filter_args(&pod, &names)).await;
    let hosts: Vec<&str> = r.as_array().unwrap().iter().map(|h| h["Host"].as_str().unwrap()).collect();
    assert_eq!(hosts, ["n0", "n1", "ghost", "n2"], "scored once each");

    // Over the bound (3 nodes + 3/8 + 256): unknown names are dropped, the cached nodes answered.
    let bound = vgpu_scheduler::extender::candidate_bound(3);
    assert_eq!(bound, 259);
    let mut many: Vec<String> = (0..bound).map(|i| format!("ghost-{i}")).collect();
    many.extend(["n2", "n1", "n2"].map(String::from));
    let other = s.pod("many", 1, 10, 0, &[]);
    let (_, r) = s.post(vgpu_scheduler::FILTER_DRYRUN_PATH, &filter_args(&other, &many)).await;
    assert_eq!((r["NodeNames"].clone(), r["FailedNodes"].clone()), (json!(["n2", "n1"]), json!({})));
    let (_, r) = s.post(vgpu_scheduler::FILTER_PATH, &filter_args(&other, &many)).await;
    assert_eq!((r["NodeNames"].clone(), r["FailedNodes"].clone()), (json!(["n2"]), json!({})));
    let (_, r) = s.post(vgpu_scheduler::PRIORITIZE_PATH, &filter_args(&other, &many)).await;
    assert_eq!(r.as_array().unwrap().len(), 2, "{r}");
    // Only unknown names, oversized: nothing to schedule on.
    let ghosts: Vec<String> = (0..=bound).map(|i| format!("ghost-{i}")).collect();
    let (_, r) = s.post(vgpu_scheduler::FILTER_PATH, &filter_args(&other, &ghosts)).await;
    assert_eq!(r["Error"], "No schedulable nodes");

    // Nodes form with a repeated node object: the passing object once.
    let third = s.pod("third", 1, 10, 0, &[]);
    let n0 = node_json(&vgpu_node("n0", &s.inv, &NodeVgpuConfig::default(), None, &s.d).unwrap());
    let args = json!({"Pod": pod_json(&third), "Nodes": {"metadata": {}, "items": [n0.clone(), n0]}});
    let (_, r) = s.post(vgpu_scheduler::FILTER_DRYRUN_PATH, &args).await;
    assert_eq!(r["Nodes"]["items"].as_array().unwrap().len(), 1, "{r}");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn syntax_errors_name_line_and_column_and_invalid_pods_are_400_on_prioritize() {
    let s = start(Opts::default()).await;
    let body = "{\n  \"Pod\": {\"metadata\": {\"name\": \"p\"}},\n  \"NodeNames\": [\"n0\" \"n1\"]\n}";
    let (_, text) = s.call(Method::POST, vgpu_scheduler::FILTER_PATH, body).await;
    let r: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        r["Error"],
        "malformed ExtenderArgs JSON: syntax error at line 3 column 22 (in `NodeNames`): expected `,` or `]`"
    );
    let (status, text) =
        s.call(Method::POST, vgpu_scheduler::PREEMPT_PATH, "{\"Pod\": {\"metadata\": nope}}").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(
        text,
        "malformed ExtenderPreemptionArgs JSON: syntax error at line 1 column 23 (in `Pod.metadata`): expected ident\n"
    );
    let (_, text) = s.call(Method::POST, vgpu_scheduler::BIND_PATH, "{\"PodName\": \"x\",").await;
    assert!(text.contains("syntax error at line 1 column 16: EOF while parsing a value"), "{text}");
    assert!(!text.contains('?'), "{text}");

    // A bad quantity: prioritize says why (400) instead of scoring every node 0; filter says the same.
    let mut bad = pod_json(&s.pod("bad", 1, 10, 0, &[]));
    bad["spec"]["containers"][0]["resources"]["limits"][s.d.vgpu_number()] = json!("1x");
    let args = json!({"Pod": bad, "NodeNames": s.names});
    let (status, text) = s.call(Method::POST, vgpu_scheduler::PRIORITIZE_PATH, args.to_string()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{text}");
    let why = format!(
        "container main has an invalid {} quantity \"1x\": expected a non-negative integer",
        s.d.vgpu_number()
    );
    assert_eq!(text, format!("pod default/pod-bad: {why}\n"));
    let (_, r) = s.post(vgpu_scheduler::FILTER_PATH, &args).await;
    assert_eq!(r["Error"], why.as_str());
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_request_deadline_counts_from_its_first_byte() {
    // Deadline 2 s from the first byte. The client sends a first line, waits 1.5 s, completes the headers and
    // starts a body it never finishes: the answer comes 2 s after the first byte (counting from the headers,
    // as before, it came 3.5 s after). Timed with a generous margin for a busy machine: under 3 s.
    let server = ServerConfig {
        read_timeout: Duration::from_secs(2),
        header_read_timeout: Duration::from_secs(10),
        ..ServerConfig::default()
    };
    let s = start(Opts { server, ..Opts::default() }).await;
    let mut c = TcpStream::connect(s.addr).await.unwrap();
    let first = std::time::Instant::now();
    c.write_all(b"POST /scheduler/bind HTTP/1.1\r\n").await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    c.write_all(b"host: x\r\ncontent-length: 100\r\n\r\n{\"Pod").await.unwrap();
    let reply = read_reply(&mut c).await;
    let took = first.elapsed();
    assert!(reply.contains("request body not received within 2s of the request's first byte"), "{reply}");
    assert!(took < Duration::from_secs(3), "answered {took:?} after the first byte");

    // Idle time on a kept-alive connection does not count: the second request starts at its own first byte.
    let mut c = TcpStream::connect(s.addr).await.unwrap();
    let body = r#"{"PodName":"nope","PodNamespace":"default","PodUID":"u","Node":"n0"}"#;
    let request =
        format!("POST /scheduler/bind HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n", body.len());
    c.write_all(format!("{request}{body}").as_bytes()).await.unwrap();
    let reply = read_reply(&mut c).await;
    assert!(reply.starts_with("HTTP/1.1 200") && reply.contains("not found"), "{reply}");
    tokio::time::sleep(Duration::from_millis(1200)).await;
    c.write_all(request.as_bytes()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    c.write_all(body.as_bytes()).await.unwrap();
    let reply = read_reply(&mut c).await;
    assert!(reply.starts_with("HTTP/1.1 200") && reply.contains("not found"), "{reply}");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_server_refuses_verbs_with_retry_after_and_still_answers_probes() {
    let server = ServerConfig {
        work: WorkLimits {
            max_running: 1,
            max_admitted: 1,
            queue_timeout: Duration::from_millis(200),
            ..WorkLimits::default()
        },
        ..ServerConfig::default()
    };
    let s = start(Opts { server, ..Opts::default() }).await;
    let pod = s.pod("b", 1, 10, 0, &[]);
    let args = filter_args(&pod, &s.names).to_string();
    // A call whose body is still arriving holds the only admission slot.
    let mut slow = TcpStream::connect(s.addr).await.unwrap();
    slow.write_all(
        format!("POST /scheduler/filter HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n{{", args.len())
            .as_bytes(),
    )
    .await
    .unwrap();
    while s.pool.in_flight() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let busy = "extender busy: 1 verb calls already in progress; retry later";
    // A bind is not refused: binds have admission slots of their own (the pod is unknown here, so it fails
    // on its arguments, not as busy).
    let mut c = TcpStream::connect(s.addr).await.unwrap();
    let path = vgpu_scheduler::BIND_PATH;
    c.write_all(format!("POST {path} HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{{}}").as_bytes())
        .await
        .unwrap();
    let reply = read_reply(&mut c).await;
    assert!(reply.contains("\"Error\":\"ExtenderBindingArgs.Node cannot be empty\""), "{path}: {reply}");
    for path in [vgpu_scheduler::FILTER_PATH, vgpu_scheduler::FILTER_DRYRUN_PATH] {
        let mut c = TcpStream::connect(s.addr).await.unwrap();
        c.write_all(format!("POST {path} HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{{}}").as_bytes())
            .await
            .unwrap();
        let reply = read_reply(&mut c).await;
        assert!(reply.starts_with("HTTP/1.1 200"), "{path}: {reply}");
        assert!(reply.to_ascii_lowercase().contains("retry-after: 1\r\n"), "{path}: {reply}");
        assert!(reply.contains(&format!("\"Error\":\"{busy}\"")), "{path}: {reply}");
    }
    for path in [vgpu_scheduler::PRIORITIZE_PATH, vgpu_scheduler::PREEMPT_PATH] {
        let mut c = TcpStream::connect(s.addr).await.unwrap();
        c.write_all(format!("POST {path} HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{{}}").as_bytes())
            .await
            .unwrap();
        let reply = read_reply(&mut c).await;
        assert!(reply.starts_with("HTTP/1.1 503"), "{path}: {reply}");
        assert!(reply.to_ascii_lowercase().contains("retry-after: 1\r\n"), "{path}: {reply}");
        assert!(reply.ends_with(&format!("{busy}\n")), "{path}: {reply}");
    }
    for probe in ["/healthz", "/readyz", "/metrics", "/version"] {
        assert_eq!(s.get(probe).await.0, StatusCode::OK, "{probe}");
    }
    // The slow call completes and is served; the slot is free again.
    slow.write_all(&args.as_bytes()[1..]).await.unwrap();
    let reply = read_reply(&mut slow).await;
    assert!(reply.contains("\"NodeNames\":[\"n0\"]"), "{reply}");
    while s.pool.in_flight() > 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let (_, r) = s.post(vgpu_scheduler::PRIORITIZE_PATH, &filter_args(&pod, &s.names)).await;
    assert_eq!(r.as_array().unwrap().len(), 3);
    let (_, m) = s.get("/metrics").await;
    assert!(m.contains(r#"vgpu_scheduler_verb_total{verb="filter",result="error"} 1"#), "{m}");
    s.stop().await;
}

/// The extender's default listener (`0.0.0.0`, issue #32: vgpu-manager's chart probes the `device-scheduler`
/// container's port on the pod IP): callers beyond loopback get the probes only, loopback callers (kube-scheduler
/// beside it) everything. Over real TCP from loopback, then through the router with the peer address a
/// connection from the pod network would carry (and without any).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beyond_loopback_only_the_probes_answer() {
    let server = ServerConfig { probes_only_beyond_loopback: true, ..ServerConfig::default() };
    let s = start(Opts { server, ..Opts::default() }).await;
    // Loopback (what `serve` records for this connection): every route.
    assert_eq!(s.get("/version").await.0, StatusCode::OK);
    let pod = s.pod("l1", 1, 20, 1024, &[]);
    let (status, r) = s.post(vgpu_scheduler::FILTER_PATH, &filter_args(&pod, &s.names)).await;
    assert_eq!((status, r["Error"].as_str()), (StatusCode::OK, Some("")), "{r}");

    let app = router(
        AppState::new(s.ext.clone(), s.readiness.clone(), Arc::new(Metrics::new()))
            .with_probes_only_beyond_loopback(true),
    );
    let call = |path: &'static str, peer: Option<SocketAddr>| {
        let app = app.clone();
        async move {
            use hyper::service::Service as _;
            let mut req = Request::builder()
                .method(if path.starts_with("/scheduler") { Method::POST } else { Method::GET })
                .uri(path)
                .body(Full::new(Bytes::from_static(b"{}")))
                .unwrap();
            if let Some(peer) = peer {
                req.extensions_mut().insert(axum::extract::ConnectInfo(peer));
            }
            let resp = hyper_util::service::TowerToHyperService::new(app).call(req).await.unwrap();
            let status = resp.status();
            (
                status,
                String::from_utf8(resp.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap(),
            )
        }
    };
    let pod_network: SocketAddr = "10.217.0.1:40000".parse().unwrap();
    for path in ["/healthz", "/readyz"] {
        assert_eq!(call(path, Some(pod_network)).await.0, StatusCode::OK, "{path}");
        assert_eq!(call(path, None).await.0, StatusCode::OK, "{path}");
    }
    for path in ["/version", "/metrics", vgpu_scheduler::FILTER_PATH, vgpu_scheduler::BIND_PATH] {
        let (status, text) = call(path, Some(pod_network)).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{path}: {text}");
        assert!(text.contains("only /healthz and /readyz"), "{path}: {text}");
        assert_eq!(call(path, None).await.0, StatusCode::FORBIDDEN, "{path} without a peer address");
    }
    for loopback in ["127.0.0.1:40000", "[::1]:40000"] {
        assert_eq!(call("/version", Some(loopback.parse().unwrap())).await.0, StatusCode::OK, "{loopback}");
    }
    s.stop().await;
}
