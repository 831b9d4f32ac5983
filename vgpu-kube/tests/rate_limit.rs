//! The token bucket on a real client: a `kube::Client` from [`ClientOptions`] against a real HTTP server on
//! loopback (a fake API server answering `GET /api/v1/namespaces/default/configmaps/...`). N requests at
//! QPS q and burst b take at least (N − b) / q; with QPS < 0 nothing waits; `--master` overrides the URL of
//! the kubeconfig.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{
    convert::Infallible,
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use http_body_util::Full;
use hyper::{Request, Response, body::Bytes, server::conn::http1, service::service_fn};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::ConfigMap;
use vgpu_kube::ClientOptions;

/// A fake API server: every GET answers a ConfigMap named after the last path segment; counts requests.
async fn fake_apiserver() -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let count = Arc::new(AtomicUsize::new(0));
    let counted = count.clone();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let counted = counted.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req: Request<hyper::body::Incoming>| {
                    counted.fetch_add(1, Ordering::SeqCst);
                    let name = req.uri().path().rsplit('/').next().unwrap_or_default().to_owned();
                    let body = serde_json::json!({
                        "apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"name": name, "namespace": "default"}
                    });
                    async move {
                        Ok::<_, Infallible>(
                            Response::builder()
                                .header("content-type", "application/json")
                                .body(Full::new(Bytes::from(body.to_string())))
                                .unwrap(),
                        )
                    }
                });
                let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), svc).await;
            });
        }
    });
    (addr, count)
}

fn kubeconfig(dir: &std::path::Path, server: &str) -> std::path::PathBuf {
    let path = dir.join("kubeconfig");
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\n\
         contexts:\n- name: x\n  context:\n    cluster: c\n    user: u\n    namespace: default\n\
         current-context: x\nusers:\n- name: u\n  user:\n    token: t\n"
    );
    std::fs::write(&path, text).unwrap();
    path
}

async fn get_n(options: &ClientOptions, n: usize) -> Duration {
    let client = options.client().await.unwrap();
    let api: kube::Api<ConfigMap> = kube::Api::namespaced(client, "default");
    let start = Instant::now();
    for i in 0..n {
        let cm = api.get(&format!("cm-{i}")).await.unwrap();
        assert_eq!(cm.metadata.name.as_deref(), Some(format!("cm-{i}").as_str()));
    }
    start.elapsed()
}

#[tokio::test]
async fn n_requests_at_qps_q_and_burst_b_take_at_least_n_minus_b_over_q() {
    let (addr, count) = fake_apiserver().await;
    let dir = tempfile::tempdir().unwrap();
    let config = kubeconfig(dir.path(), &format!("http://{addr}"));
    // 13 requests, burst 3, 20 QPS: at least 10 / 20 s.
    let (n, burst, qps) = (13, 3, 20.0);
    let took = get_n(&ClientOptions::new(qps, burst).kubeconfig(&config), n).await;
    let floor = Duration::from_secs_f64((n - burst as usize) as f64 / f64::from(qps));
    assert!(took >= floor, "{n} requests at {qps} QPS burst {burst} took {took:?} < {floor:?}");
    assert_eq!(count.load(Ordering::SeqCst), n);

    // The burst goes at once: b requests well under one period each.
    let took = get_n(&ClientOptions::new(1.0, 5).kubeconfig(&config), 5).await;
    assert!(took < Duration::from_millis(900), "a burst of 5 at 1 QPS took {took:?}");
}

#[tokio::test]
async fn negative_qps_never_waits_and_master_overrides_the_kubeconfig_url() {
    let (addr, count) = fake_apiserver().await;
    let dir = tempfile::tempdir().unwrap();
    // The kubeconfig names a port nothing listens on; --master points at the fake API server.
    let config = kubeconfig(dir.path(), "http://127.0.0.1:1");
    let options = ClientOptions::new(-1.0, 1).kubeconfig(&config).master(format!("http://{addr}"));
    let took = get_n(&options, 50).await;
    // 50 requests at "1 QPS burst 1" would take 49 s; unlimited takes well under.
    assert!(took < Duration::from_secs(10), "unlimited client took {took:?}");
    assert_eq!(count.load(Ordering::SeqCst), 50);
}

#[tokio::test]
async fn bad_flags_name_themselves() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope");
    let err = ClientOptions::new(20.0, 30).kubeconfig(&missing).client().await.err().unwrap();
    assert!(err.to_string().starts_with("reading --kubeconfig"), "{err}");
    let err = ClientOptions::new(f32::NAN, 30).master("http://127.0.0.1:1").client().await.err().unwrap();
    assert!(err.to_string().starts_with("--kube-api-qps NaN"), "{err}");
    let err = ClientOptions::new(20.0, 30).master("ftp://x").client().await.err().unwrap();
    assert!(err.to_string().contains("--master \"ftp://x\""), "{err}");
}
