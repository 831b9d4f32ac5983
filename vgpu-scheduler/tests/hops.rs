#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Task hops per extender call (issue #35 item 4): the real server on its own single-threaded tokio runtime,
//! driven by a blocking HTTP/1.1 client on another thread, one call at a time over one keep-alive connection.
//!
//! The measure is the runtime's `worker_park_count` (a stable tokio metric): between two calls of a
//! sequential client the runtime has nothing to do and parks once. A call whose verb is handed to another
//! thread (a blocking-pool thread) parks it once more while it waits for the answer, and is woken from that
//! thread. So one park per call means the call went from the connection task to the verb and back with no
//! hop; two mean one hop (handing prioritize to a blocking thread, as before issue #35 item 4, measures 2.0).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;

use serde_json::{Value, json};
use vgpu_core::clock::ManualClock;
use vgpu_core::domain::ResourceDomain;
use vgpu_core::model::{NodeDeviceInventory, NodeVgpuConfig};
use vgpu_lease::Readiness;
use vgpu_scheduler::fixture::{vgpu_node, vgpu_pod};
use vgpu_scheduler::server::{AppState, ServerConfig, router, serve};
use vgpu_scheduler::{Extender, ExtenderConfig, MemoryCluster, Metrics, Pod};

const T0: i64 = 1_700_000_000_000_000_000;
const NODES: usize = 100;
const PODS: usize = 40;

/// A pod as kube-scheduler sends it (the fields the extender reads, plus some it skips).
fn pod_json(p: &Pod) -> Value {
    let c = &p.spec.containers[0];
    json!({
        "metadata": {"name": p.name, "namespace": p.namespace, "uid": p.uid, "resourceVersion": "1",
                     "creationTimestamp": "2026-01-01T00:00:00Z", "annotations": p.annotations},
        "spec": {"schedulerName": "default-scheduler", "priority": 0,
                 "containers": [{"name": c.name, "image": "cuda", "resources": {"limits": c.limits}}]},
        "status": {"phase": "Pending"}
    })
}

/// One blocking HTTP/1.1 keep-alive connection.
struct Client {
    out: TcpStream,
    input: BufReader<TcpStream>,
}

impl Client {
    fn connect(addr: SocketAddr) -> Self {
        let out = TcpStream::connect(addr).unwrap();
        out.set_nodelay(true).unwrap();
        let input = BufReader::new(out.try_clone().unwrap());
        Self { out, input }
    }

    /// Posts `body` (one write) and reads the whole answer.
    fn post(&mut self, path: &str, body: &[u8]) -> Value {
        let mut request = format!(
            "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        request.extend_from_slice(body);
        self.out.write_all(&request).unwrap();
        let mut status = String::new();
        self.input.read_line(&mut status).unwrap();
        assert!(status.starts_with("HTTP/1.1 200"), "{path}: {status}");
        let mut length = 0;
        loop {
            let mut line = String::new();
            self.input.read_line(&mut line).unwrap();
            if line == "\r\n" {
                break;
            }
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                length = v.trim().parse().unwrap();
            }
        }
        let mut answer = vec![0; length];
        self.input.read_exact(&mut answer).unwrap();
        serde_json::from_slice(&answer).unwrap()
    }
}

/// Parks of a current-thread runtime so far (its metrics are submitted as it parks, so the count is up to
/// date while it is idle, which is when the client reads it: after an answer, before the next call).
fn parks(rt: &tokio::runtime::Handle) -> u64 {
    rt.metrics().worker_park_count(0)
}

#[test]
fn filter_prioritize_and_bind_take_no_task_hop() {
    let d = ResourceDomain::default();
    let cluster = MemoryCluster::new().without_event_log();
    let inventory = NodeDeviceInventory::uniform(8, 81559, 10);
    let names: Vec<String> = (0..NODES).map(|n| format!("node-{n:03}")).collect();
    for n in &names {
        cluster.upsert_node(vgpu_node(n, &inventory, &NodeVgpuConfig::default(), None, &d).unwrap());
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let handle = rt.handle().clone();
    let clock = Arc::new(ManualClock::new(T0));
    let ext = Arc::new(Extender::new(cluster.clone(), clock, ExtenderConfig::default()));
    ext.attach();
    rt.block_on(ext.sync()).unwrap();
    let state = AppState::new(ext, Readiness::ready(), Arc::new(Metrics::new()));
    let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let stopped = stop.clone().cancelled_owned();
    let server = std::thread::spawn(move || {
        rt.block_on(serve(listener, router(state), None, &ServerConfig::default(), stopped));
    });

    let mut client = Client::connect(addr);
    let binpack = [(d.node_scheduler_policy(), "binpack".to_string())];
    let pods: Vec<(Pod, Vec<u8>)> = (0..=PODS)
        .map(|i| {
            let pod = cluster.upsert_pod(vgpu_pod(&format!("u{i}"), 2, 50, 16384, &binpack, &d));
            let args = json!({"Pod": pod_json(&pod), "Nodes": null, "NodeNames": names});
            (pod, serde_json::to_vec(&args).unwrap())
        })
        .collect();
    // The first pod warms the connection up (accept, first reads), uncounted.
    let (warm, pods) = pods.split_first().unwrap();
    let filtered = client.post(vgpu_scheduler::FILTER_PATH, &warm.1);
    let bind_args = |pod: &Pod, answer: &Value| {
        let node = answer["NodeNames"][0].as_str().unwrap_or_else(|| panic!("{answer}"));
        let bind =
            json!({"PodName": pod.name, "PodNamespace": pod.namespace, "PodUID": pod.uid, "Node": node});
        serde_json::to_vec(&bind).unwrap()
    };
    client.post(vgpu_scheduler::BIND_PATH, &bind_args(&warm.0, &filtered));
    // One verb at a time over every pod, as kube-scheduler's calls come (filter, prioritize, bind): the parks
    // of each run of calls over the calls. (Counted per run rather than per call: the runtime may park just
    // after the client has read an answer, so a single call's park can show in its successor's count.)
    let mut per_call: Vec<(&str, f64)> = Vec::new();
    let mut run = |verb: &'static str, calls: &mut dyn FnMut(&mut Client)| {
        let before = parks(&handle);
        calls(&mut client);
        per_call.push((verb, (parks(&handle) - before) as f64 / PODS as f64));
    };
    let mut answers = Vec::new();
    run("filter", &mut |c| {
        answers = pods.iter().map(|(_, args)| c.post(vgpu_scheduler::FILTER_PATH, args)).collect();
    });
    run("prioritize", &mut |c| {
        for (_, args) in pods {
            let scores = c.post(vgpu_scheduler::PRIORITIZE_PATH, args);
            assert_eq!(scores.as_array().map(Vec::len), Some(NODES), "{scores}");
        }
    });
    let binds: Vec<Vec<u8>> = pods.iter().zip(&answers).map(|((pod, _), a)| bind_args(pod, a)).collect();
    run("bind", &mut |c| {
        for args in &binds {
            let bound = c.post(vgpu_scheduler::BIND_PATH, args);
            assert_eq!(bound["Error"], "", "{bound}");
        }
    });
    stop.cancel();
    drop(client);
    server.join().unwrap();

    for (verb, parks) in &per_call {
        println!("{verb}: {parks:.2} runtime parks per call");
    }
    let of = |verb: &str| per_call.iter().find(|c| c.0 == verb).map(|c| c.1).unwrap();
    // One park per call: waiting for the client's next call. A hop would add one; a stray wake-up (a timer, a
    // late TCP segment) is allowed once in a while.
    for verb in ["filter", "prioritize", "bind"] {
        assert!(
            of(verb) <= 1.25,
            "{verb}: {:.2} parks per call, expected 1 (no task hop): {per_call:?}",
            of(verb)
        );
    }
}
