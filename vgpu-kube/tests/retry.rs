//! [`vgpu_kube::client::without_retry`] on a real client against a real HTTP server on loopback that refuses
//! every request with 429, as kube-apiserver refuses an eviction a PodDisruptionBudget forbids: kube's
//! default client sends it again and again, the client without retry returns the 429 after one request.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{
    convert::Infallible,
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use http_body_util::Full;
use hyper::{Request, Response, body::Bytes, server::conn::http1, service::service_fn};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::ConfigMap;
use vgpu_kube::client::{client_with_bucket, without_retry};
use vgpu_kube::rate_limit::TokenBucket;

/// Answers every request 429 with the Status an eviction refused by a PodDisruptionBudget gets; counts them.
async fn refusing_apiserver() -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let count = Arc::new(AtomicUsize::new(0));
    let counted = count.clone();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let counted = counted.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |_req: Request<hyper::body::Incoming>| {
                    counted.fetch_add(1, Ordering::SeqCst);
                    let body = serde_json::json!({
                        "apiVersion": "v1", "kind": "Status", "status": "Failure", "reason": "TooManyRequests",
                        "code": 429,
                        "message": "Cannot evict pod as it would violate the pod's disruption budget.",
                        "details": {"causes": [{"reason": "DisruptionBudget", "message": "needs 1 healthy pods"}]}
                    });
                    async move {
                        Ok::<_, Infallible>(
                            Response::builder()
                                .status(429)
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

fn config(addr: SocketAddr) -> kube::Config {
    kube::Config::new(format!("http://{addr}").parse().unwrap())
}

async fn get(client: kube::Client) -> Result<ConfigMap, kube::Error> {
    kube::Api::<ConfigMap>::namespaced(client, "default").get("x").await
}

#[tokio::test]
async fn without_retry_a_429_comes_back_after_one_request() {
    let (addr, count) = refusing_apiserver().await;
    let client = client_with_bucket(without_retry(config(addr)), TokenBucket::new(-1.0, 0).unwrap()).unwrap();
    let err = tokio::time::timeout(Duration::from_secs(10), get(client)).await.unwrap().unwrap_err();
    match err {
        kube::Error::Api(status) => assert_eq!(status.code, 429, "{status:?}"),
        other => panic!("expected the API's 429, got {other:?}"),
    }
    assert_eq!(count.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn kubes_default_client_retries_the_429() {
    let (addr, count) = refusing_apiserver().await;
    let client = client_with_bucket(config(addr), TokenBucket::new(-1.0, 0).unwrap()).unwrap();
    // It is still retrying (delays growing to 1000 s) when the test stops waiting.
    assert!(tokio::time::timeout(Duration::from_secs(1), get(client)).await.is_err());
    assert!(count.load(Ordering::SeqCst) >= 3, "{} request(s)", count.load(Ordering::SeqCst));
}
