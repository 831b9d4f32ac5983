#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! Load over loopback: 8 concurrent maximum-size (7 MiB) live filter bodies, each naming ~650k nodes the
//! cluster does not have, while `/healthz` is probed every 50 ms on a new connection.
//!
//! The server runs on its own 2-worker runtime with the default [`WorkLimits`] for this machine; the uploads and
//! the prober run on runtimes of their own, so the probe latencies are the server's. The test prints every
//! probe latency and the process's peak resident memory (`VmHWM` of `/proc/self/status`) before and after.
//!
//! Asserted (nothing about time: latencies are printed, and measured by the criterion benches):
//! - probes: every probe made while the uploads run is answered `200 ok` (at least 5 of them) — the verbs run
//!   on blocking threads, so health checks are not starved (before that change probes took up to 10 s under
//!   this load; the printed median/p95/max show it);
//! - memory: the growth of the peak over the idle process is at most
//!   `max_admitted × B + max_running × K × B + C` with `B` = 7 MiB, `K` = 8 (a running call's decoded request
//!   and answer, at most 8 bodies' worth) and `C` = 64 MiB (the client's shared body, allocator slack).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use vgpu_core::clock::ManualClock;
use vgpu_core::domain::ResourceDomain;
use vgpu_core::model::{NodeDeviceInventory, NodeVgpuConfig};
use vgpu_lease::Readiness;
use vgpu_scheduler::fixture::{vgpu_node, vgpu_pod};
use vgpu_scheduler::server::{AppState, MAX_BODY_BYTES, ServerConfig, router, serve};
use vgpu_scheduler::work::WorkLimits;
use vgpu_scheduler::{Extender, ExtenderConfig, MemoryCluster, Metrics};

const UPLOADS: usize = 8;
const NODES: usize = 100;
const MIB: u64 = 1 << 20;

/// Serves the extender over `cluster` (synced, metrics observed, no events) on a loopback port of `rt`;
/// cancelling the returned token stops the server.
fn start_server(
    rt: &tokio::runtime::Runtime,
    cluster: &MemoryCluster,
    config: ServerConfig,
) -> (SocketAddr, tokio_util::sync::CancellationToken) {
    rt.block_on(async {
        let metrics = Arc::new(Metrics::new());
        let extender = ExtenderConfig { emit_events: false, ..ExtenderConfig::default() };
        let ext =
            Extender::new(cluster.clone(), Arc::new(ManualClock::new(1_700_000_000_000_000_000)), extender)
                .with_observer(metrics.clone());
        ext.attach();
        ext.sync().await.unwrap();
        let state = AppState::new(Arc::new(ext), Readiness::ready(), metrics).with_limits(&config);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = tokio_util::sync::CancellationToken::new();
        let stopped = stop.clone().cancelled_owned();
        tokio::spawn(async move {
            serve(listener, router(state), None, &config, stopped).await;
        });
        (addr, stop)
    })
}

fn vm_hwm_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// A filter body of exactly `MAX_BODY_BYTES`: the pod, the cluster's nodes, then unknown names.
fn max_body(pod: &Value) -> Bytes {
    let head = format!("{{\"Pod\":{pod},\"NodeNames\":[");
    let mut body = head.into_bytes();
    for n in 0..NODES {
        body.extend_from_slice(format!("\"n{n}\",").as_bytes());
    }
    let mut i = 0u64;
    loop {
        let name = format!("\"u{i:x}\",");
        if body.len() + name.len() + 2 > MAX_BODY_BYTES {
            break;
        }
        body.extend_from_slice(name.as_bytes());
        i += 1;
    }
    body.pop();
    body.extend_from_slice(b"]}");
    body.resize(MAX_BODY_BYTES, b' ');
    Bytes::from(body)
}

fn pod_json(name: &str, uid: &str, d: &ResourceDomain) -> Value {
    let mut limits = serde_json::Map::new();
    limits.insert(d.vgpu_number(), json!("1"));
    limits.insert(d.vgpu_cores(), json!("10"));
    json!({
        "metadata": {"name": name, "namespace": "default", "uid": uid},
        "spec": {"containers": [{"name": "main", "resources": {"limits": limits}}]}
    })
}

fn probe(addr: SocketAddr) -> Duration {
    let t = Instant::now();
    let mut c = TcpStream::connect(addr).unwrap();
    c.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").unwrap();
    let mut reply = String::new();
    c.read_to_string(&mut reply).unwrap();
    let took = t.elapsed();
    assert!(reply.starts_with("HTTP/1.1 200") && reply.ends_with("ok"), "{reply}");
    took
}

#[test]
fn eight_max_size_filters_leave_probes_answered_and_memory_bounded() {
    let d = ResourceDomain::default();
    let cluster = MemoryCluster::new().without_event_log();
    let inv = NodeDeviceInventory::uniform(4, 40960, 10).with_type_name("A100");
    for n in 0..NODES {
        cluster.upsert_node(vgpu_node(&format!("n{n}"), &inv, &NodeVgpuConfig::default(), None, &d).unwrap());
    }
    let bodies: Vec<Bytes> = (0..UPLOADS)
        .map(|i| {
            let (name, uid) = (format!("load-{i}"), format!("uid-{i}"));
            let mut pod = vgpu_pod(&uid, 1, 10, 0, &[], &d);
            pod.name.clone_from(&name);
            cluster.upsert_pod(pod);
            max_body(&pod_json(&name, &uid, &d))
        })
        .collect();
    let server_rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let config = ServerConfig::default();
    let limits: WorkLimits = config.work;
    let (addr, stop) = start_server(&server_rt, &cluster, config);
    let idle_kib = vm_hwm_kib();

    // The prober: its own thread, one probe every 50 ms until the uploads are done.
    let done = Arc::new(AtomicBool::new(false));
    let prober = {
        let done = done.clone();
        std::thread::spawn(move || {
            let mut took = Vec::new();
            while !done.load(Ordering::Acquire) {
                let t = Instant::now();
                took.push(probe(addr));
                std::thread::sleep(Duration::from_millis(50).saturating_sub(t.elapsed()));
            }
            took
        })
    };
    let client_rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let started = Instant::now();
    let answers: Vec<(Duration, usize, Value)> = client_rt.block_on(async {
        let uploads: Vec<_> = bodies
            .into_iter()
            .map(|body| {
                tokio::spawn(async move {
                    let t = Instant::now();
                    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
                    let (mut sender, conn) =
                        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
                    tokio::spawn(conn);
                    let req = Request::post(vgpu_scheduler::FILTER_PATH)
                        .header("host", "127.0.0.1")
                        .header("content-type", "application/json")
                        .body(Full::new(body))
                        .unwrap();
                    let resp = sender.send_request(req).await.unwrap();
                    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
                    (t.elapsed(), bytes.len(), serde_json::from_slice::<Value>(&bytes).unwrap())
                })
            })
            .collect();
        let mut out = Vec::new();
        for u in uploads {
            out.push(u.await.unwrap());
        }
        out
    });
    let wall = started.elapsed();
    done.store(true, Ordering::Release);
    let mut probes = prober.join().unwrap();
    let peak_kib = vm_hwm_kib();
    stop.cancel();
    drop(client_rt);
    drop(server_rt);

    let mut nodes = std::collections::BTreeSet::new();
    for (took, len, r) in &answers {
        assert_eq!(r["Error"], "", "{r}");
        let passed = r["NodeNames"].as_array().unwrap();
        assert_eq!(passed.len(), 1, "{r}");
        nodes.insert(passed[0].as_str().unwrap().to_owned());
        println!("filter answered in {took:?}, {len} bytes");
        assert!(*len < 64 * 1024, "the answer lists the cached nodes only: {len} bytes");
    }
    let in_ms = |d: &Duration| d.as_secs_f64() * 1000.0;
    println!(
        "probe latencies (ms, in order): {:?}",
        probes.iter().map(|d| (in_ms(d) * 10.0).round() / 10.0).collect::<Vec<_>>()
    );
    probes.sort();
    let p95 = probes[(probes.len() * 95).div_ceil(100).saturating_sub(1)];
    let max = *probes.last().unwrap();
    println!(
        "{} probes over {wall:?}: median {:.1} ms, p95 {:.1} ms, max {:.1} ms",
        probes.len(),
        in_ms(&probes[probes.len() / 2]),
        in_ms(&p95),
        in_ms(&max)
    );
    let (b, k, c) = (MAX_BODY_BYTES as u64, 8, 64 * MIB);
    let bound = limits.max_admitted as u64 * b + limits.max_running as u64 * k * b + c;
    let growth = (peak_kib.saturating_sub(idle_kib)) * 1024;
    println!(
        "VmHWM idle {} MiB, peak {} MiB, growth {} MiB; bound {} MiB (max_admitted {} × 7 MiB + max_running {} × {k} × 7 MiB + 64 MiB)",
        idle_kib / 1024,
        peak_kib / 1024,
        growth / MIB,
        bound / MIB,
        limits.max_admitted,
        limits.max_running
    );
    assert!(probes.len() >= 5, "the load lasted long enough to probe: {wall:?}");
    assert!(growth <= bound, "peak memory grew by {} MiB, bound {} MiB", growth / MIB, bound / MIB);
}

/// Extender throughput over the in-memory cluster of `examples/serve_memory.rs` (4 nodes × 4 GPUs): live filters
/// of one pod (after the first, the pod holds its pre-allocation: the answer is its node) at concurrency
/// 1, 8 and 64, each client on its own kept-alive connection, 2 s per level. Prints requests/s and the
/// 50th/99th percentile latencies; asserts nothing about time. Run with
/// `cargo test -p vgpu-scheduler --release --test load -- --ignored --nocapture throughput`.
#[test]
#[ignore = "a measurement, not a check"]
fn throughput() {
    let d = ResourceDomain::default();
    let cluster = MemoryCluster::new().without_event_log();
    let inv = NodeDeviceInventory::uniform(4, 40960, 4).with_type_name("A100");
    let names: Vec<String> = (0..4).map(|n| format!("n{n}")).collect();
    for n in &names {
        cluster.upsert_node(vgpu_node(n, &inv, &NodeVgpuConfig::default(), None, &d).unwrap());
    }
    let mut pod = vgpu_pod("u", 1, 0, 0, &[], &d);
    pod.name = "p".into();
    cluster.upsert_pod(pod);
    let server_rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let config = ServerConfig::default();
    let limits = config.work;
    let (addr, stop) = start_server(&server_rt, &cluster, config);
    let body = Bytes::from(json!({"Pod": pod_json("p", "u", &d), "NodeNames": names}).to_string());
    let client_rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    println!("work limits: {limits:?}");
    for concurrency in [1usize, 8, 64] {
        let all: Vec<(Duration, bool)> = client_rt.block_on(async {
            let until = Instant::now() + Duration::from_secs(2);
            let clients: Vec<_> = (0..concurrency)
                .map(|_| {
                    let body = body.clone();
                    tokio::spawn(async move {
                        let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
                        let (mut sender, conn) =
                            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.unwrap();
                        tokio::spawn(conn);
                        let mut lat = Vec::new();
                        while Instant::now() < until {
                            let t = Instant::now();
                            let req = Request::post(vgpu_scheduler::FILTER_PATH)
                                .header("host", "127.0.0.1")
                                .body(Full::new(body.clone()))
                                .unwrap();
                            let resp = sender.send_request(req).await.unwrap();
                            let bytes = resp.into_body().collect().await.unwrap().to_bytes();
                            let r: Value = serde_json::from_slice(&bytes).unwrap();
                            let error = r["Error"].as_str().unwrap_or_default();
                            assert!(error.is_empty() || error.starts_with("extender busy"), "{r}");
                            lat.push((t.elapsed(), error.is_empty()));
                        }
                        lat
                    })
                })
                .collect();
            let mut all = Vec::new();
            for c in clients {
                all.extend(c.await.unwrap());
            }
            all
        });
        let busy = all.iter().filter(|(_, served)| !served).count();
        let mut lat: Vec<Duration> = all.iter().filter(|(_, served)| *served).map(|(t, _)| *t).collect();
        lat.sort();
        let q = |p: usize| lat[(lat.len() * p).div_ceil(100).saturating_sub(1)].as_secs_f64() * 1000.0;
        println!(
            "concurrency {concurrency}: {:.0} requests/s served, p50 {:.2} ms, p99 {:.2} ms ({} served, {busy} refused busy)",
            lat.len() as f64 / 2.0,
            q(50),
            q(99),
            lat.len()
        );
    }
    stop.cancel();
    drop(client_rt);
    drop(server_rt);
}
