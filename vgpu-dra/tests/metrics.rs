//! The kubelet plugin's HTTP endpoint over real HTTP/1.1 on loopback (listener bound to port 0 and kept):
//! `/healthz`, `/readyz` (503 until the test kubelet registers the plugin over the real registration socket,
//! 503 again when a socket file is gone), the metrics page after real Prepare/Unprepare calls over the DRA
//! socket (prepared-claims gauge, per-result counters, duration histogram, `process_*`), unknown paths 404;
//! `--enable-rbac` (401 / 403 / 200 through the in-memory reviewer, probes open) and the per-device health
//! state set following the health monitor.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::{net::SocketAddr, sync::Arc, time::Duration};

use support::TestNode;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};
use vgpu_dra::{
    driver::Driver,
    endpoint::{self, Readiness},
    metrics::{self, DriverMetrics},
};
use vgpu_kubelet::api::{dra_v1, pluginregistration as pr};
use vgpu_kubelet::socket::connect_unix;

/// One `GET` over a fresh connection: (status, content type, body).
async fn get(addr: SocketAddr, path: &str) -> (u16, String, String) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let text = String::from_utf8(raw).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    let content_type =
        head.lines().find_map(|l| l.strip_prefix("content-type: ")).unwrap_or_default().to_owned();
    (status, content_type, body.to_owned())
}

fn claim(name: &str, uid: &str) -> dra_v1::Claim {
    dra_v1::Claim { namespace: "ns".into(), uid: uid.into(), name: name.into() }
}

/// The value of the sample line that starts with `series ` (exact series, labels included).
fn value(page: &str, series: &str) -> f64 {
    page.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("no series {series} in\n{page}"))
        .parse()
        .unwrap()
}

#[tokio::test]
async fn health_readiness_and_metrics_over_http() {
    let mut node = TestNode::new();
    // No socket guard during the test: a removed socket stays removed.
    let mut config = (*node.config).clone();
    config.registration_guard_interval = Duration::from_secs(3600);
    node.config = Arc::new(config);
    node.add_vgpu_claim("c1", "u1", "vgpu-0", "s1", "10", "1Gi");
    node.add_vgpu_claim("c2", "u2", "vgpu-1", "s2", "20", "2Gi");
    let metrics = Arc::new(DriverMetrics::new());
    let state = Arc::new(node.state_with(None).await.with_metrics(Arc::clone(&metrics)));
    let running = Driver::new(state, node.health.subscribe()).serve().unwrap();

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let server = tokio::spawn(endpoint::serve(
        listener,
        Arc::clone(&metrics),
        Readiness::of(&running),
        "/custom/metrics",
        None,
        stop.clone().cancelled_owned(),
    ));

    assert_eq!(get(addr, "/healthz").await.0, 200);
    let (status, _, body) = get(addr, "/readyz").await;
    assert_eq!((status, body.as_str()), (503, "the kubelet has not reported the plugin's registration yet"));
    assert_eq!(get(addr, "/metrics").await.0, 404, "only the configured metrics path serves metrics");

    // The kubelet registers the plugin over the registration socket.
    let channel = connect_unix(&running.registration_socket, Duration::from_secs(5)).await.unwrap();
    let mut registration = pr::registration_client::RegistrationClient::new(channel);
    registration.get_info(pr::InfoRequest {}).await.unwrap();
    registration
        .notify_registration_status(pr::RegistrationStatus { plugin_registered: true, error: String::new() })
        .await
        .unwrap();
    let (status, _, body) = get(addr, "/readyz").await;
    assert_eq!((status, body.as_str()), (200, "ok"));

    // Prepare two good claims and a missing one, then unprepare one, over the DRA socket.
    let channel = connect_unix(&running.dra_socket, Duration::from_secs(5)).await.unwrap();
    let mut dra = dra_v1::dra_plugin_client::DraPluginClient::new(channel);
    let prepared = dra
        .node_prepare_resources(dra_v1::NodePrepareResourcesRequest {
            claims: vec![claim("c1", "u1"), claim("c2", "u2"), claim("gone", "u3")],
        })
        .await
        .unwrap()
        .into_inner();
    assert!(prepared.claims["u1"].error.is_empty() && !prepared.claims["u3"].error.is_empty());
    let (status, content_type, page) = get(addr, "/custom/metrics").await;
    assert_eq!(status, 200);
    assert_eq!(content_type, metrics::CONTENT_TYPE);
    assert_eq!(value(&page, "vgpu_kubelet_plugin_prepared_claims"), 2.0);
    let ops = |op: &str, result: &str| {
        value(
            &page,
            &format!("vgpu_kubelet_plugin_claim_operations_total{{operation=\"{op}\",result=\"{result}\"}}"),
        )
    };
    assert_eq!((ops("prepare", "success"), ops("prepare", "failure")), (2.0, 1.0));
    assert_eq!((ops("unprepare", "success"), ops("unprepare", "failure")), (0.0, 0.0));
    assert_eq!(
        value(&page, "vgpu_kubelet_plugin_request_duration_seconds_count{operation=\"prepare\"}"),
        1.0
    );
    assert!(value(&page, "vgpu_kubelet_plugin_request_duration_seconds_sum{operation=\"prepare\"}") > 0.0);
    assert!(page.contains("# TYPE process_cpu_seconds counter"), "{page}");
    assert!(value(&page, "process_open_fds") > 0.0);
    assert!(page.ends_with("# EOF\n"));

    dra.node_unprepare_resources(dra_v1::NodeUnprepareResourcesRequest { claims: vec![claim("c1", "u1")] })
        .await
        .unwrap();
    let page = get(addr, "/custom/metrics").await.2;
    assert_eq!(value(&page, "vgpu_kubelet_plugin_prepared_claims"), 1.0);
    assert_eq!(
        value(
            &page,
            "vgpu_kubelet_plugin_claim_operations_total{operation=\"unprepare\",result=\"success\"}"
        ),
        1.0
    );
    assert_eq!(
        value(&page, "vgpu_kubelet_plugin_request_duration_seconds_count{operation=\"unprepare\"}"),
        1.0
    );

    // A socket file that is gone makes the plugin unready (until the guard binds it again).
    std::fs::remove_file(&running.dra_socket).unwrap();
    let (status, _, body) = get(addr, "/readyz").await;
    assert_eq!(status, 503);
    assert!(body.starts_with("socket ") && body.ends_with("dra.sock is not served"), "{body}");

    stop.cancel();
    server.await.unwrap().unwrap();
    running.stop().await.unwrap();
}

#[tokio::test]
async fn a_failed_registration_is_not_ready() {
    let node = TestNode::new();
    let running = node.serve().await;
    let readiness = Readiness::of(&running);
    let channel = connect_unix(&running.registration_socket, Duration::from_secs(5)).await.unwrap();
    pr::registration_client::RegistrationClient::new(channel)
        .notify_registration_status(pr::RegistrationStatus {
            plugin_registered: false,
            error: "duplicate driver".into(),
        })
        .await
        .unwrap();
    assert_eq!(
        readiness.check().unwrap_err(),
        "the kubelet reported a failed registration: duplicate driver"
    );
    running.stop().await.unwrap();
    assert!(readiness.check().unwrap_err().ends_with("reg.sock is not served"));
}

/// One `GET` with an `Authorization: Bearer` header.
async fn get_with_token(addr: SocketAddr, path: &str, token: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: test\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let text = String::from_utf8(raw).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    (head.split(' ').nth(1).unwrap().parse().unwrap(), body.to_owned())
}

/// `--enable-rbac` over real HTTP: the metrics path answers 401 without a token or with an unknown one, 403 to
/// an authenticated caller without `get` on it, 200 to one with it; `/healthz` and `/readyz` stay open. The
/// page carries the per-device health state set, which follows the health monitor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enable_rbac_guards_metrics_and_health_is_exported() {
    use vgpu_core::backend::{HealthEvent, HealthEventKind};
    use vgpu_serve::authz::{Authorizer, MemoryReviewer, UserInfo};

    let node = TestNode::new();
    let metrics = Arc::new(DriverMetrics::new());
    metrics.set_health(node.health.subscribe(), &node.devices);
    let running = node.serve().await;
    let reviewer = Arc::new(MemoryReviewer::new());
    reviewer.add_token("t-prom", UserInfo::new("system:serviceaccount:monitoring:prometheus"));
    reviewer.add_token("t-other", UserInfo::new("system:serviceaccount:default:other"));
    reviewer.allow("system:serviceaccount:monitoring:prometheus", "/metrics", "get");
    let authorizer = Some(Arc::new(Authorizer::new(reviewer.clone())));

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let server = tokio::spawn(endpoint::serve(
        listener,
        Arc::clone(&metrics),
        Readiness::of(&running),
        "/metrics",
        authorizer,
        stop.clone().cancelled_owned(),
    ));

    assert_eq!(get(addr, "/metrics").await.0, 401, "no token");
    assert_eq!(get_with_token(addr, "/metrics", "t-unknown").await.0, 401);
    let (status, body) = get_with_token(addr, "/metrics", "t-other").await;
    assert_eq!(status, 403);
    assert!(body.contains("system:serviceaccount:default:other"), "{body}");
    let (status, page) = get_with_token(addr, "/metrics", "t-prom").await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(get(addr, "/healthz").await.0, 200, "probes stay open");
    assert_eq!(get(addr, "/readyz").await.0, 503, "open (not registered yet), not 401");
    assert_eq!(get(addr, "/other").await.0, 404, "other paths are not reviewed");

    // Every device: Healthy 1, the others 0, with its UUID.
    assert_eq!(value(&page, "vgpu_kubelet_plugin_device_health_monitored"), 1.0);
    let first = node.devices.iter().next().unwrap();
    let series = |device: &str, uuid: &str, status: &str| {
        format!(
            "vgpu_kubelet_plugin_device_health{{device=\"{device}\",uuid=\"{uuid}\",status=\"{status}\"}}"
        )
    };
    for device in node.devices.iter() {
        assert_eq!(value(&page, &series(&device.name, &device.gpu.uuid, "Healthy")), 1.0);
        assert_eq!(value(&page, &series(&device.name, &device.gpu.uuid, "Unhealthy")), 0.0);
        assert_eq!(value(&page, &series(&device.name, &device.gpu.uuid, "Unknown")), 0.0);
    }
    // An Xid on the first GPU makes its devices Unhealthy at the next scrape.
    let xid = HealthEvent {
        index: first.gpu.index,
        uuid: first.gpu.uuid.clone(),
        kind: HealthEventKind::Xid { code: 79 },
        message: String::new(),
    };
    assert!(node.health.apply(&xid));
    let (status, page) = get_with_token(addr, "/metrics", "t-prom").await;
    assert_eq!(status, 200);
    assert_eq!(value(&page, &series(&first.name, &first.gpu.uuid, "Unhealthy")), 1.0);
    assert_eq!(value(&page, &series(&first.name, &first.gpu.uuid, "Healthy")), 0.0);

    stop.cancel();
    server.await.unwrap().unwrap();
    running.stop().await.unwrap();
}
