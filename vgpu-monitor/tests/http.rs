//! The monitor's routes over real HTTP on loopback (`vgpu_serve::http::serve`, a hand-written HTTP/1.1
//! client): `/healthz`, `/readyz` following the pod cache, `/metrics` in Prometheus text and OpenMetrics by
//! `Accept`, the minimum scrape interval (cached body with `X-Rate-Limited: true`, 429 while no page is
//! cached), `--enable-rbac` (401 / 403 / 200 through the in-memory reviewer), and `promtool check metrics`
//! on both formats (skipped, saying so, only where promtool is not installed).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod support;

use std::{
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
        mpsc,
    },
    time::Duration,
};

use k8s_openapi::api::core::v1::Pod;
use support::{Claim, Container, Proc, Reply, get};
use vgpu_core::backend::mock::MockBackend;
use vgpu_monitor::{
    cgroup::CgroupLayout,
    collect::{MonitorConfig, NodeCollector},
    metrics,
    pods::{InMemoryPods, PodSource},
    server::{MonitorServer, ServerConfig},
};
use vgpu_serve::authz::{Authorizer, MemoryReviewer, UserInfo};

/// A pod source whose readiness the test flips, and whose `pods()` can be held until released.
#[derive(Debug)]
struct TestPods {
    inner: InMemoryPods,
    synced: AtomicBool,
    gate: Mutex<Option<(mpsc::Sender<()>, mpsc::Receiver<()>)>>,
}

impl PodSource for TestPods {
    fn pods(&self) -> Vec<Arc<Pod>> {
        if let Some((entered, release)) = self.gate.lock().unwrap().take() {
            entered.send(()).unwrap();
            release.recv().unwrap();
        }
        self.inner.pods()
    }
    fn synced(&self) -> bool {
        self.synced.load(Ordering::SeqCst)
    }
}

struct Served {
    _dir: tempfile::TempDir,
    addr: SocketAddr,
    pods: Arc<TestPods>,
    stop: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

async fn serve(config: ServerConfig) -> Served {
    let dir = tempfile::tempdir().unwrap();
    let (manager, cgroup) = (dir.path().join("manager"), dir.path().join("cgroup"));
    std::fs::create_dir_all(&cgroup).unwrap();
    let c = Container {
        pod: "a".into(),
        namespace: "ns".into(),
        uid: "uid-a".into(),
        name: "main".into(),
        id: "ca".into(),
        pids: vec![100],
        claims: vec![Claim { gpu: 0, cores: 50, memory_mib: 4096 }],
        vmem: None,
    };
    support::write_files(&c, &manager, &cgroup);
    let procs = [Proc { gpu: 0, pid: 100, used_mib: 1024, sm: 40, enc: 0, dec: 0 }];
    let backend = Arc::new(MockBackend::from_yaml_str(&support::mock_yaml(1, &procs)).unwrap());
    let mut mc = MonitorConfig::new("node-1");
    mc.manager_dir = manager;
    mc.cgroup = CgroupLayout { root: cgroup, ..CgroupLayout::default() };
    let pods = Arc::new(TestPods {
        inner: InMemoryPods::new([support::pod(&c)]),
        synced: AtomicBool::new(false),
        gate: Mutex::new(None),
    });
    let collector = Arc::new(NodeCollector::new(mc, backend, pods.clone()));
    let mut registry = metrics::new_registry();
    metrics::register(&mut registry, collector);
    let router = MonitorServer::new(registry, pods.clone(), config).router();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let stopped = stop.clone().cancelled_owned();
    let task = tokio::spawn(async move {
        vgpu_serve::http::serve(listener, router, None, &Default::default(), stopped).await;
    });
    Served { _dir: dir, addr, pods, stop, task }
}

impl Served {
    async fn get(&self, path: &str, headers: &[(&str, &str)]) -> Reply {
        let (addr, path) = (self.addr, path.to_owned());
        let headers: Vec<(String, String)> =
            headers.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        tokio::task::spawn_blocking(move || {
            let h: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            get(addr, &path, &h)
        })
        .await
        .unwrap()
    }

    async fn stop(self) {
        self.stop.cancel();
        self.task.await.unwrap();
    }
}

fn long_interval() -> ServerConfig {
    ServerConfig { min_scrape_interval: Duration::from_secs(3600), authorizer: None }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_readiness_formats_and_the_scrape_interval() {
    let s = serve(long_interval()).await;
    let r = s.get("/healthz", &[]).await;
    assert_eq!((r.status, r.body.as_str()), (200, "ok"));
    let r = s.get("/readyz", &[]).await;
    assert_eq!((r.status, r.body.as_str()), (503, "pod cache not synced"));
    s.pods.synced.store(true, Ordering::SeqCst);
    assert_eq!(s.get("/readyz", &[]).await.status, 200);
    let r = s.get("/version", &[]).await;
    assert!(r.body.contains(r#""component":"vgpu-device-monitor""#), "{}", r.body);

    // OpenMetrics by Accept (as Prometheus asks for it).
    let accept = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
    let first = s.get("/metrics", &[("Accept", accept)]).await;
    assert_eq!(first.status, 200);
    assert_eq!(first.headers["content-type"], "application/openmetrics-text; version=1.0.0; charset=utf-8");
    assert!(first.body.ends_with("# EOF\n"));
    assert!(first.body.contains(
        "container_vgpu_device_core_utilization_percent{service=\"vGPU\",pod_namespace=\"ns\",pod_name=\"a\""
    ));
    assert!(!first.headers.contains_key("x-rate-limited"));
    // Inside the interval: the cached page, marked, whatever the Accept.
    let again = s.get("/metrics", &[]).await;
    assert_eq!(again.status, 200);
    assert_eq!(again.headers["x-rate-limited"], "true");
    assert_eq!(again.body, first.body);
    assert_eq!(again.headers["content-type"], first.headers["content-type"]);
    s.stop().await;

    // Prometheus text when nothing asks for OpenMetrics.
    let s = serve(ServerConfig::default()).await;
    let r = s.get("/metrics", &[("Accept", "text/plain")]).await;
    assert_eq!(r.headers["content-type"], "text/plain; version=0.0.4; charset=utf-8");
    assert!(!r.body.contains("# EOF"));
    assert!(r.body.contains("# TYPE container_vgpu_device_memory_limit_in_bytes gauge"));
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scrape_inside_the_interval_without_a_cached_page_gets_429() {
    let s = serve(long_interval()).await;
    let (entered_tx, entered_rx) = mpsc::channel();
    let (release_tx, release_rx) = mpsc::channel();
    *s.pods.gate.lock().unwrap() = Some((entered_tx, release_rx));
    let addr = s.addr;
    let first = tokio::task::spawn_blocking(move || get(addr, "/metrics", &[]));
    // The first scrape is inside the collector now; nothing is cached yet.
    tokio::task::spawn_blocking(move || entered_rx.recv().unwrap()).await.unwrap();
    let second = s.get("/metrics", &[]).await;
    assert_eq!(second.status, 429);
    assert_eq!(second.headers["x-rate-limited"], "true");
    release_tx.send(()).unwrap();
    let first = first.await.unwrap();
    assert_eq!(first.status, 200);
    // Now a page is cached.
    let third = s.get("/metrics", &[]).await;
    assert_eq!((third.status, third.headers["x-rate-limited"].as_str()), (200, "true"));
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enable_rbac_answers_401_403_200() {
    let reviewer = Arc::new(MemoryReviewer::new());
    reviewer.add_token("t-prom", UserInfo::new("system:serviceaccount:monitoring:prometheus"));
    reviewer.add_token("t-other", UserInfo::new("system:serviceaccount:default:other"));
    reviewer.allow("system:serviceaccount:monitoring:prometheus", "/metrics", "get");
    let authorizer = Some(Arc::new(Authorizer::new(reviewer)));
    let s = serve(ServerConfig { min_scrape_interval: Duration::from_secs(1), authorizer }).await;
    assert_eq!(s.get("/metrics", &[]).await.status, 401);
    assert_eq!(s.get("/metrics", &[("Authorization", "Bearer t-unknown")]).await.status, 401);
    let r = s.get("/metrics", &[("Authorization", "Bearer t-other")]).await;
    assert_eq!(r.status, 403);
    assert!(r.body.contains("system:serviceaccount:default:other"), "{}", r.body);
    let r = s.get("/metrics", &[("Authorization", "Bearer t-prom")]).await;
    assert_eq!(r.status, 200);
    assert!(r.body.contains("exporter_build_info"));
    // Health stays open.
    assert_eq!(s.get("/healthz", &[]).await.status, 200);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promtool_accepts_both_formats() {
    if !support::promtool_installed() {
        return;
    }
    for accept in ["text/plain", "application/openmetrics-text"] {
        let s = serve(ServerConfig::default()).await;
        let page = s.get("/metrics", &[("Accept", accept)]).await.body;
        s.stop().await;
        support::promtool_check(&page, accept);
    }
}
