//! The cache driver at the HTTP layer: a `tower_test` mock API server answers the node and pod lists and
//! watches (JSON lines), and the test checks the exact requests, the cache contents after each step, and
//! readiness.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Request, Response};
use kube::client::Body;
use serde_json::{Value, json};
use tower_test::mock::{Handle, SendResponse};
use vgpu_core::alloc::PodFootprint;
use vgpu_core::clock::{Clock, ManualClock};
use vgpu_core::domain::ResourceDomain;
use vgpu_lease::{Readiness, Role};
use vgpu_scheduler::{CacheDriver, ClusterCache, Pod, WatchConfig};

type ApiHandle = Handle<Request<Body>, Response<Body>>;
type Reply = SendResponse<Response<Body>>;

const NODE_WATCH: &str =
    "/api/v1/nodes?&watch=true&timeoutSeconds=290&allowWatchBookmarks=true&resourceVersion=";
const POD_WATCH: &str =
    "/api/v1/pods?&watch=true&timeoutSeconds=290&allowWatchBookmarks=true&resourceVersion=";

struct Setup {
    cache: Arc<ClusterCache>,
    clock: Arc<ManualClock>,
    readiness: Readiness,
    synced_history: Arc<Mutex<Vec<bool>>>,
    stop: tokio_util::sync::CancellationToken,
    driver: tokio::task::JoinHandle<()>,
    handle: ApiHandle,
}

fn start() -> Setup {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "default");
    let cache = Arc::new(ClusterCache::new(ResourceDomain::default(), 30_000_000_000));
    let clock = Arc::new(ManualClock::new(1_000_000_000_000));
    let readiness = Readiness::new(Role::Standalone);
    let synced_history = Arc::new(Mutex::new(Vec::new()));
    let mut rx = readiness.subscribe();
    let history = synced_history.clone();
    tokio::spawn(async move {
        while rx.changed().await.is_ok() {
            history.lock().unwrap().push(rx.borrow_and_update().0);
        }
    });
    let config = WatchConfig {
        sweep_interval: Duration::from_millis(5),
        backoff_min: Duration::from_millis(5),
        backoff_max: Duration::from_millis(20),
        ..WatchConfig::default()
    };
    let stop = tokio_util::sync::CancellationToken::new();
    let driver = CacheDriver::new(client, cache.clone(), readiness.clone())
        .with_clock(clock.clone())
        .with_config(config)
        .spawn(stop.clone().cancelled_owned());
    Setup { cache, clock, readiness, synced_history, stop, driver, handle }
}

async fn next(handle: &mut ApiHandle) -> (String, Reply) {
    let (request, send) = tokio::time::timeout(Duration::from_secs(10), handle.next_request())
        .await
        .unwrap()
        .expect("a request");
    assert_eq!(request.method(), "GET");
    (request.uri().to_string(), send)
}

fn reply(send: Reply, status: u16, body: Vec<u8>) {
    send.send_response(Response::builder().status(status).body(Body::from(body)).unwrap());
}

fn reply_json(send: Reply, body: &Value) {
    reply(send, 200, serde_json::to_vec(body).unwrap());
}

/// A watch response: one JSON event per line.
fn reply_events(send: Reply, events: &[Value]) {
    let mut body = Vec::new();
    for e in events {
        body.extend(serde_json::to_vec(e).unwrap());
        body.push(b'\n');
    }
    reply(send, 200, body);
}

fn node(name: &str, rv: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "resourceVersion": rv},
        "status": {"allocatable": {"nvidia.com/vgpu-number": "40"}}
    })
}

fn pod(name: &str, rv: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "ns", "uid": format!("u-{name}"), "resourceVersion": rv},
        "spec": {"containers": [{"name": "main"}]},
        "status": {"phase": "Pending"}
    })
}

fn list(kind: &str, rv: &str, items: Vec<Value>, cont: Option<&str>) -> Value {
    let mut meta = json!({"resourceVersion": rv});
    if let Some(c) = cont {
        meta["continue"] = json!(c);
    }
    json!({"apiVersion": "v1", "kind": kind, "metadata": meta, "items": items})
}

fn event(kind: &str, object: Value) -> Value {
    json!({"type": kind, "object": object})
}

fn uids(cache: &ClusterCache) -> Vec<String> {
    let mut v: Vec<String> = cache.pods().iter().map(|p| p.uid.clone()).collect();
    v.sort();
    v
}

#[tokio::test]
async fn lists_watches_and_relists_after_410() {
    let Setup { cache, clock, readiness, synced_history, stop, driver, mut handle } = start();

    // 1. Both first lists arrive (in any order); the node list is held back for now.
    let mut node_list = None;
    let mut pod_list = None;
    while node_list.is_none() || pod_list.is_none() {
        let (uri, send) = next(&mut handle).await;
        match uri.as_str() {
            "/api/v1/nodes?&limit=500" => node_list = Some(send),
            "/api/v1/pods?&limit=500" => pod_list = Some(send),
            other => panic!("unexpected {other}"),
        }
    }
    // 2. Pods come in two pages.
    reply_json(pod_list.unwrap(), &list("PodList", "20", vec![pod("a", "15")], Some("page-2")));
    let (uri, send) = next(&mut handle).await;
    assert_eq!(uri, "/api/v1/pods?&limit=500&continue=page-2");
    reply_json(send, &list("PodList", "20", vec![pod("b", "16")], None));

    // 3. The pod watch starts at the list's version; nodes are not listed yet, so not synced.
    let (uri, send) = next(&mut handle).await;
    assert_eq!(uri, format!("{POD_WATCH}20"));
    assert_eq!(uids(&cache), ["u-a", "u-b"]);
    assert!(!readiness.is_synced());
    let mut a = pod("a", "22");
    a["metadata"]["labels"] = json!({"x": "y"});
    reply_events(
        send,
        &[
            event("ADDED", pod("c", "21")),
            event("MODIFIED", a),
            event("DELETED", pod("b", "23")),
            event(
                "BOOKMARK",
                json!({"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": "25"}}),
            ),
        ],
    );
    reply_json(node_list.unwrap(), &list("NodeList", "10", vec![node("n1", "8"), node("n2", "9")], None));

    // 4. The node watch opens at 10 (now synced); the pod watch re-opens after the bookmark at 25.
    let mut held = Vec::new();
    let (mut node_watched, mut pods_rewatched) = (false, false);
    while !node_watched || !pods_rewatched {
        let (uri, send) = next(&mut handle).await;
        if uri == format!("{NODE_WATCH}10") {
            assert!(readiness.is_synced());
            assert_eq!(cache.node_names(), ["n1", "n2"]);
            reply_events(send, &[event("DELETED", node("n2", "11"))]);
            node_watched = true;
        } else if uri == format!("{POD_WATCH}25") {
            assert_eq!(uids(&cache), ["u-a", "u-c"]);
            assert_eq!(cache.pod("u-a").unwrap().labels["x"], "y");
            // The extender writes a pod it just patched (newer than any list to come) and the cache also
            // holds a stale pod whose deletion the driver never saw.
            let now = clock.now_ns();
            cache.upsert_pod(
                Pod { uid: "u-d".into(), name: "d".into(), resource_version: 99, ..Pod::default() },
                now,
            );
            cache.upsert_pod(
                Pod { uid: "u-e".into(), name: "e".into(), resource_version: 24, ..Pod::default() },
                now,
            );
            let gone = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                              "message": "too old resource version: 25 (28)", "reason": "Expired", "code": 410});
            reply_events(send, &[event("ERROR", gone)]);
            pods_rewatched = true;
        } else if uri == format!("{NODE_WATCH}11") {
            held.push(send);
        } else {
            panic!("unexpected {uri}");
        }
    }

    // 5. 410 Gone: the pods are listed again; c and e vanished, d is newer than the list.
    let (mut relisted, mut nodes_deleted) = (false, held.len() == 1);
    while !relisted || !nodes_deleted {
        let (uri, send) = next(&mut handle).await;
        if uri == "/api/v1/pods?&limit=500" {
            reply_json(send, &list("PodList", "30", vec![pod("a", "22")], None));
        } else if uri == format!("{POD_WATCH}30") {
            assert_eq!(uids(&cache), ["u-a", "u-d"]);
            held.push(send);
            relisted = true;
        } else if uri == format!("{NODE_WATCH}11") {
            held.push(send);
            nodes_deleted = true;
        } else {
            panic!("unexpected {uri}");
        }
    }
    assert_eq!(cache.node_names(), ["n1"]);
    // Synced once, never unset by the re-list.
    assert!(readiness.is_synced());
    let history = synced_history.lock().unwrap().clone();
    assert_eq!(history, [true], "{history:?}");

    stop.cancel();
    tokio::time::timeout(Duration::from_secs(5), driver).await.unwrap().unwrap();
    drop(held);
}

#[tokio::test]
async fn failed_lists_are_retried_and_reservations_expire() {
    let Setup { cache, clock, readiness, stop, driver, mut handle, .. } = start();
    let mut held = Vec::new();
    let (mut nodes_ok, mut pods_failed, mut pods_ok) = (false, false, false);
    while !(nodes_ok && pods_ok) {
        let (uri, send) = next(&mut handle).await;
        match uri.as_str() {
            "/api/v1/nodes?&limit=500" => {
                reply_json(send, &list("NodeList", "5", vec![node("n1", "5")], None))
            }
            "/api/v1/pods?&limit=500" if !pods_failed => {
                let status = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                    "message": "etcd is down", "reason": "InternalError", "code": 500});
                reply(send, 500, serde_json::to_vec(&status).unwrap());
                pods_failed = true;
            }
            "/api/v1/pods?&limit=500" => reply_json(send, &list("PodList", "6", vec![], None)),
            u if u == format!("{NODE_WATCH}5") => {
                nodes_ok = true;
                held.push(send);
            }
            u if u == format!("{POD_WATCH}6") => {
                assert!(pods_failed);
                pods_ok = true;
                held.push(send);
            }
            other => panic!("unexpected {other}"),
        }
    }
    assert!(readiness.is_synced());

    // A reservation taken by a filter expires through the driver's periodic sweep.
    let expires = clock.now_ns() + 1_000;
    {
        let slot = cache.node("n1").unwrap();
        let mut state = slot.lock().unwrap();
        cache.reserve_locked(&mut state, "u-r", PodFootprint::default(), expires);
    }
    cache.track_reservation("n1", "u-r", expires);
    assert_eq!(cache.reservation_count(), 1);
    tokio::time::sleep(Duration::from_millis(30)).await;
    assert_eq!(cache.reservation_count(), 1, "not expired yet");
    clock.advance(2_000);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while cache.reservation_count() != 0 {
        assert!(tokio::time::Instant::now() < deadline, "the sweep never ran");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    stop.cancel();
    tokio::time::timeout(Duration::from_secs(5), driver).await.unwrap().unwrap();
    drop(held);
}

/// A clock that counts its reads: the pod sink reads it once per round of cache updates.
#[derive(Default)]
struct CountingClock(std::sync::atomic::AtomicUsize);

impl Clock for CountingClock {
    fn now_ns(&self) -> i64 {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        1_000_000_000_000
    }
}

/// Issue #35 item 4: the pod events one read of the watch stream brings (kube-apiserver writes every queued
/// event before it flushes) are applied in rounds of up to 64 under one cache lock, not one round each; the
/// order is kept across a deletion in the middle of the burst.
#[tokio::test]
async fn a_burst_of_pod_events_is_applied_in_few_rounds() {
    const BURST: usize = 200;
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "default");
    let cache = Arc::new(ClusterCache::new(ResourceDomain::default(), 30_000_000_000));
    let clock = Arc::new(CountingClock::default());
    let readiness = Readiness::new(Role::Standalone);
    // No sweep during the test (the sweeper reads the clock too).
    let config = WatchConfig { sweep_interval: Duration::from_secs(3600), ..WatchConfig::default() };
    let stop = tokio_util::sync::CancellationToken::new();
    let driver = CacheDriver::new(client, cache.clone(), readiness.clone())
        .with_clock(clock.clone())
        .with_config(config)
        .spawn(stop.clone().cancelled_owned());
    let mut held = Vec::new();
    let mut reads_before_burst = None;
    while reads_before_burst.is_none() || held.len() < 2 {
        let (uri, send) = next(&mut handle).await;
        if uri == "/api/v1/nodes?&limit=500" {
            reply_json(send, &list("NodeList", "10", vec![node("n1", "8")], None));
        } else if uri == "/api/v1/pods?&limit=500" {
            reply_json(send, &list("PodList", "20", vec![pod("old", "15")], None));
        } else if uri == format!("{NODE_WATCH}10") {
            held.push(send);
        } else if uri == format!("{POD_WATCH}20") {
            reads_before_burst = Some(clock.0.load(std::sync::atomic::Ordering::SeqCst));
            // BURST additions, one modification, the old pod's deletion half-way, and a re-addition of a pod
            // deleted in the same burst: the order decides what the cache holds.
            let mut events: Vec<Value> =
                (0..BURST).map(|i| event("ADDED", pod(&format!("p{i:03}"), &(21 + i).to_string()))).collect();
            events.insert(BURST / 2, event("DELETED", pod("old", "500")));
            events.push(event("DELETED", pod("p000", "501")));
            let mut again = pod("p000", "502");
            again["metadata"]["labels"] = json!({"again": "yes"});
            events.push(event("ADDED", again));
            reply_events(send, &events);
        } else if uri == format!("{POD_WATCH}502") {
            held.push(send);
        } else {
            panic!("unexpected {uri}");
        }
    }
    let rounds = clock.0.load(std::sync::atomic::Ordering::SeqCst) - reads_before_burst.unwrap();
    let held_uids = uids(&cache);
    assert_eq!(held_uids.len(), BURST, "{held_uids:?}");
    assert!(!held_uids.contains(&"u-old".to_owned()));
    assert_eq!(cache.pod("u-p000").unwrap().labels["again"], "yes");
    assert_eq!(cache.pod("u-p199").unwrap().resource_version, 220);
    println!("{} pod events applied in {rounds} rounds of cache updates", BURST + 3);
    // Before issue #35 item 4: one round per added or modified object (202 here, measured with batches of one).
    assert!(rounds <= 12, "{rounds} rounds for {} events in one read", BURST + 3);
    stop.cancel();
    tokio::time::timeout(Duration::from_secs(5), driver).await.unwrap().unwrap();
    drop(held);
}
