//! Leader election: the state machine over the in-memory Lease store (races, expiry, deadlines, release),
//! the `--watch-lease` mode, the driver loop with its role label, and `KubeLeaseApi` at the HTTP layer.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::client::Body;
use serde_json::{Value, json};
use tower_test::mock::{Handle, SendResponse};
use vgpu_core::clock::{Clock, ManualClock};
use vgpu_kube::error::ClusterError;
use vgpu_lease::leader::{
    self, Elector, KubeLeaseApi, LeaderConfig, LeaderConfigError, LeaderMode, LeaseApi, LeaseTimings,
    LeaseWatcher, MemoryLeases, holder_has_prefix, unique_identity,
};
use vgpu_lease::readiness::{Readiness, Role};

const S: i64 = 1_000_000_000;
/// 2026-01-02T03:04:05Z
const T0: i64 = 1_767_323_045 * S;

fn config(mode: LeaderMode) -> LeaderConfig {
    LeaderConfig {
        mode,
        identity_prefix: "pod-a".into(),
        lease_name: "vgpu-scheduler".into(),
        lease_namespace: "kube-system".into(),
        pod_name: Some("pod-a".into()),
        pod_namespace: Some("kube-system".into()),
        timings: LeaseTimings::default(),
    }
}

fn elector(leases: &MemoryLeases, id: &str, clock: &Arc<ManualClock>) -> Elector<MemoryLeases> {
    Elector::new(leases.clone(), id, &config(LeaderMode::Elect), clock.clone())
}

fn spec(leases: &MemoryLeases) -> LeaseSpec {
    leases.lease().unwrap().spec.unwrap()
}

fn micro(ns: i64) -> MicroTime {
    MicroTime(Timestamp::from_nanosecond(i128::from(ns)).unwrap())
}

fn held_by(holder: &str, renew_ns: i64) -> Lease {
    Lease {
        spec: Some(LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(15),
            renew_time: Some(micro(renew_ns)),
            acquire_time: Some(micro(renew_ns)),
            lease_transitions: Some(3),
            ..LeaseSpec::default()
        }),
        ..Lease::default()
    }
}

#[tokio::test]
async fn two_electors_racing_yield_exactly_one_leader() {
    let clock = Arc::new(ManualClock::new(T0));
    let leases = MemoryLeases::new("kube-system", "vgpu-scheduler");
    let (mut a, mut b) = (elector(&leases, "a", &clock), elector(&leases, "b", &clock));
    // Both read "absent" before either creates: one create wins, the other conflicts.
    let (ra, rb) = tokio::join!(a.tick(), b.tick());
    assert_eq!([ra, rb].iter().filter(|r| **r == Role::Leader).count(), 1, "{ra:?} {rb:?}");
    let leader = if ra == Role::Leader { "a" } else { "b" };
    let s = spec(&leases);
    assert_eq!(s.holder_identity.as_deref(), Some(leader));
    assert_eq!((s.lease_duration_seconds, s.lease_transitions), (Some(15), Some(0)));
    assert_eq!(s.acquire_time, Some(micro(T0)));
    // Renewals keep it; the follower keeps following.
    for i in 1..=10 {
        clock.advance(2 * S);
        let (ra, rb) = tokio::join!(a.tick(), b.tick());
        assert_eq!([ra, rb].iter().filter(|r| **r == Role::Leader).count(), 1);
        let s = spec(&leases);
        assert_eq!(s.holder_identity.as_deref(), Some(leader));
        assert_eq!(s.renew_time, Some(micro(T0 + i * 2 * S)));
        assert_eq!(s.acquire_time, Some(micro(T0)), "renewal keeps the acquire time");
        assert_eq!(s.lease_transitions, Some(0));
    }
}

#[tokio::test]
async fn a_silent_leader_is_replaced_after_expiry() {
    let clock = Arc::new(ManualClock::new(T0));
    let leases = MemoryLeases::new("kube-system", "vgpu-scheduler");
    let (mut a, mut b) = (elector(&leases, "a", &clock), elector(&leases, "b", &clock));
    assert_eq!(a.tick().await, Role::Leader);
    // A stops renewing (e.g. it hangs). B first sees A's record at 2 s and waits out the whole lease duration
    // from there (client-go: expiry runs from the local observation, not from A's renewTime).
    for _ in 0..8 {
        clock.advance(2 * S);
        assert_eq!(b.tick().await, Role::Follower);
    }
    clock.set(T0 + 17 * S);
    assert_eq!(b.tick().await, Role::Follower, "first seen at 2 s + 15 s is not yet past");
    clock.set(T0 + 17 * S + 1_000);
    assert_eq!(b.tick().await, Role::Leader);
    let s = spec(&leases);
    assert_eq!(s.holder_identity.as_deref(), Some("b"));
    assert_eq!(s.lease_transitions, Some(1));
    assert_eq!(s.acquire_time, Some(micro(T0 + 17 * S + 1_000)));
    // A wakes up: it sees B's live lease and steps down at once.
    assert!(a.is_leader());
    assert_eq!(a.tick().await, Role::Follower);
    assert!(!a.is_leader());
}

#[tokio::test]
async fn racing_takeover_of_an_expired_lease_has_one_winner() {
    let clock = Arc::new(ManualClock::new(T0));
    let leases = MemoryLeases::new("kube-system", "vgpu-scheduler");
    leases.put(held_by("gone", T0 - 60 * S));
    let mut electors: Vec<_> = ["a", "b", "c"].iter().map(|id| elector(&leases, id, &clock)).collect();
    // However old its renewTime, a record is held for one lease duration after it is first seen.
    for e in &mut electors {
        assert_eq!(e.tick().await, Role::Follower);
    }
    clock.advance(15 * S + 1_000);
    for round in 0..5 {
        let [x, y, z] = &mut electors[..] else { unreachable!() };
        let roles = tokio::join!(x.tick(), y.tick(), z.tick());
        let leaders = [roles.0, roles.1, roles.2].iter().filter(|r| **r == Role::Leader).count();
        assert_eq!(leaders, 1, "round {round}: {roles:?}");
        clock.advance(2 * S);
    }
    let s = spec(&leases);
    assert_eq!(s.lease_transitions, Some(4), "exactly one takeover from `gone`");
    let holder = s.holder_identity.unwrap();
    assert!(electors.iter().all(|e| e.is_leader() == (e.identity() == holder)));
}

#[tokio::test]
async fn a_leader_that_cannot_renew_steps_down_before_the_lease_expires() {
    let clock = Arc::new(ManualClock::new(T0));
    let leases = MemoryLeases::new("kube-system", "vgpu-scheduler");
    let (mut a, mut b) = (elector(&leases, "a", &clock), elector(&leases, "b", &clock));
    assert_eq!(a.tick().await, Role::Leader);
    leases.set_down(true);
    for t in [2, 4, 6, 8, 10] {
        clock.set(T0 + t * S);
        assert_eq!(a.tick().await, Role::Leader, "t = {t} s is within the 10 s renew deadline");
    }
    clock.set(T0 + 11 * S);
    assert_eq!(a.tick().await, Role::Follower);
    leases.set_down(false);
    // Nobody leads between A's step-down (11 s) and the lease's expiry for B, 15 s after B first saw A's last
    // record (12 s).
    clock.set(T0 + 12 * S);
    assert_eq!(b.tick().await, Role::Follower);
    clock.set(T0 + 27 * S);
    assert_eq!(b.tick().await, Role::Follower);
    clock.set(T0 + 27 * S + 1_000);
    assert_eq!(b.tick().await, Role::Leader);
    assert_eq!(a.tick().await, Role::Follower);
}

#[tokio::test]
async fn expiry_is_judged_by_our_clock_not_the_holders() {
    let clock = Arc::new(ManualClock::new(T0));
    let leases = MemoryLeases::new("kube-system", "vgpu-scheduler");
    let mut b = elector(&leases, "b", &clock);
    // The holder's clock is an hour behind ours, but it renews every 2 s: the record keeps changing, so it is
    // alive (comparing its renewTime with our clock would take the lease from a live leader).
    for i in 0..20 {
        leases.put(held_by("skewed-behind", T0 - 3_600 * S + i * 2 * S));
        assert_eq!(b.tick().await, Role::Follower, "renewal {i}");
        clock.advance(2 * S);
    }
    // A holder whose clock is an hour ahead stops renewing: it expires 15 s after we first saw its last record
    // (comparing its renewTime would keep a dead leader for an hour).
    let seen = clock.now_ns();
    leases.put(held_by("skewed-ahead", seen + 3_600 * S));
    assert_eq!(b.tick().await, Role::Follower);
    clock.set(seen + 15 * S);
    assert_eq!(b.tick().await, Role::Follower);
    clock.set(seen + 15 * S + 1_000);
    assert_eq!(b.tick().await, Role::Leader);
    assert_eq!(spec(&leases).holder_identity.as_deref(), Some("b"));
}

#[tokio::test]
async fn a_lost_write_does_not_end_leadership_within_the_deadline() {
    let clock = Arc::new(ManualClock::new(T0));
    let leases = MemoryLeases::new("kube-system", "vgpu-scheduler");
    let mut a = elector(&leases, "a", &clock);
    assert_eq!(a.tick().await, Role::Leader);
    leases.fail_next(1);
    clock.advance(2 * S);
    assert_eq!(a.tick().await, Role::Leader);
    clock.advance(2 * S);
    assert_eq!(a.tick().await, Role::Leader);
    assert_eq!(spec(&leases).renew_time, Some(micro(T0 + 4 * S)));
}

#[tokio::test]
async fn release_hands_over_without_waiting_for_expiry() {
    let clock = Arc::new(ManualClock::new(T0));
    let leases = MemoryLeases::new("kube-system", "vgpu-scheduler");
    let (mut a, mut b) = (elector(&leases, "a", &clock), elector(&leases, "b", &clock));
    assert_eq!(a.tick().await, Role::Leader);
    assert_eq!(b.tick().await, Role::Follower);
    clock.advance(S);
    assert!(a.release().await);
    assert!(!a.is_leader());
    let s = spec(&leases);
    assert_eq!(s.holder_identity, None);
    assert_eq!(s.lease_duration_seconds, Some(1));
    assert_eq!(s.lease_transitions, Some(0));
    assert!(!b.release().await, "a follower has nothing to release");
    clock.advance(S);
    assert_eq!(b.tick().await, Role::Leader);
    let s = spec(&leases);
    assert_eq!((s.holder_identity.as_deref(), s.lease_transitions), (Some("b"), Some(1)));
    assert_eq!(s.lease_duration_seconds, Some(15));
}

#[test]
fn prefixes_end_at_a_separator() {
    assert!(holder_has_prefix("sched-1_0f3c", "sched-1"));
    assert!(holder_has_prefix("sched-1", "sched-1"));
    assert!(holder_has_prefix("sched-1-abc_0f3c", "sched"));
    assert!(holder_has_prefix("sched-1_x", "sched-1_"));
    assert!(!holder_has_prefix("sched-10_0f3c", "sched-1"));
    assert!(!holder_has_prefix("other_0f3c", "sched-1"));
    assert!(!holder_has_prefix("anything", ""));
}

#[tokio::test]
async fn watch_mode_follows_the_kube_scheduler_lease() {
    let clock = Arc::new(ManualClock::new(T0));
    let leases = MemoryLeases::new("kube-system", "kube-scheduler");
    let mut w = LeaseWatcher::new(leases.clone(), "pod-a", clock.clone());
    assert_eq!(w.tick().await, Role::Follower, "no lease");
    leases.put(held_by("pod-a_6b1d6c2e-0c56-4a4e-9b1e-2b7c2f0a1d11", T0));
    assert_eq!(w.tick().await, Role::Leader);
    clock.set(T0 + 15 * S);
    assert_eq!(w.tick().await, Role::Leader);
    clock.set(T0 + 16 * S);
    assert_eq!(w.tick().await, Role::Follower, "expired");
    leases.put(held_by("pod-a2_1", T0 + 16 * S));
    assert_eq!(w.tick().await, Role::Follower, "another pod whose name extends ours");
    leases.put(held_by("pod-a_2", T0 + 16 * S));
    assert_eq!(w.tick().await, Role::Leader);
    leases.set_down(true);
    assert_eq!(w.tick().await, Role::Leader, "a failed read keeps the role");
}

#[test]
fn config_validation() {
    assert_eq!(LeaderMode::from_flags(true, true), Err(LeaderConfigError::ConflictingModes));
    assert_eq!(LeaderMode::from_flags(false, false), Ok(LeaderMode::Off));
    assert_eq!(LeaderMode::from_flags(false, true), Ok(LeaderMode::WatchLease));
    let ok = config(LeaderMode::Elect);
    assert_eq!(ok.validate(), Ok(()));
    assert_eq!(ok.initial_role(), Role::Follower);
    assert_eq!(LeaderConfig::off().validate(), Ok(()));
    assert_eq!(LeaderConfig::off().initial_role(), Role::Standalone);
    let with = |f: &dyn Fn(&mut LeaderConfig)| {
        let mut c = ok.clone();
        f(&mut c);
        c.validate()
    };
    assert_eq!(with(&|c| c.lease_name.clear()), Err(LeaderConfigError::MissingLeaseName));
    assert_eq!(with(&|c| c.lease_namespace = " ".into()), Err(LeaderConfigError::MissingLeaseNamespace));
    assert_eq!(with(&|c| c.identity_prefix.clear()), Err(LeaderConfigError::EmptyIdentityPrefix));
    assert!(matches!(
        with(&|c| c.timings.renew_deadline = Duration::from_secs(15)),
        Err(LeaderConfigError::Timings(_))
    ));
    assert!(matches!(
        with(&|c| c.timings.retry_period = Duration::from_secs(9)),
        Err(LeaderConfigError::Timings(_))
    ));
    assert!(matches!(with(&|c| c.timings.retry_period = Duration::ZERO), Err(LeaderConfigError::Timings(_))));
    let id = unique_identity("pod-a");
    assert!(id.starts_with("pod-a_") && id.len() == "pod-a_".len() + 36, "{id}");
    assert_ne!(id, unique_identity("pod-a"));
}

async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..10_000 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::test(start_paused = true)]
async fn run_elects_labels_with_retries_and_releases_on_shutdown() {
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(T0));
    let leases = MemoryLeases::new("kube-system", "vgpu-scheduler");
    leases.fail_label_patches(2);
    let readiness = Readiness::new(Role::Follower);
    readiness.set_synced(true);
    let stop = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(leader::run_with(
        leases.clone(),
        config(LeaderMode::Elect),
        "pod-a_1".into(),
        clock,
        readiness.clone(),
        stop.clone().cancelled_owned(),
    ));
    until("leadership", || readiness.role() == Role::Leader).await;
    assert!(readiness.is_ready());
    until("the label", || !leases.labels().is_empty()).await;
    let label = |v: &str| ("kube-system".to_owned(), "pod-a".to_owned(), v.to_owned());
    assert_eq!(leases.labels(), [label("leader")], "two failures, then one success");
    stop.cancel();
    task.await.unwrap().unwrap();
    assert_eq!(readiness.role(), Role::Follower);
    assert_eq!(spec(&leases).holder_identity, None, "released");
    assert_eq!(leases.labels(), [label("leader"), label("follower")]);
}

#[tokio::test(start_paused = true)]
async fn run_watch_mode_tracks_the_holder_and_skips_labels_without_a_pod() {
    let clock = Arc::new(ManualClock::new(T0));
    let leases = MemoryLeases::new("kube-system", "kube-scheduler");
    leases.put(held_by("pod-a_1", T0));
    let readiness = Readiness::new(Role::Follower);
    let mut cfg = config(LeaderMode::WatchLease);
    cfg.pod_name = None;
    let stop = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(leader::run_with(
        leases.clone(),
        cfg,
        "ignored".into(),
        clock.clone(),
        readiness.clone(),
        stop.clone().cancelled_owned(),
    ));
    until("leadership", || readiness.role() == Role::Leader).await;
    leases.put(held_by("pod-b_1", T0));
    until("follower", || readiness.role() == Role::Follower).await;
    stop.cancel();
    task.await.unwrap().unwrap();
    assert!(leases.labels().is_empty());
    assert_eq!(leases.holder().as_deref(), Some("pod-b_1"), "watch mode never writes the lease");
}

#[tokio::test]
async fn run_rejects_bad_config_and_is_standalone_when_off() {
    let leases = MemoryLeases::new("ns", "l");
    let readiness = Readiness::new(Role::Follower);
    let mut bad = config(LeaderMode::Elect);
    bad.lease_name.clear();
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(T0));
    let err =
        leader::run_with(leases.clone(), bad, "x".into(), clock.clone(), readiness.clone(), async {}).await;
    assert_eq!(err, Err(LeaderConfigError::MissingLeaseName));
    leader::run_with(
        leases,
        LeaderConfig::off(),
        "x".into(),
        clock,
        readiness.clone(),
        std::future::pending(),
    )
    .await
    .unwrap();
    assert_eq!(readiness.role(), Role::Standalone);
}

// === KubeLeaseApi at the HTTP layer ===

type ApiHandle = Handle<Request<Body>, Response<Body>>;

async fn next(
    handle: &mut ApiHandle,
) -> (String, String, Option<String>, Value, SendResponse<Response<Body>>) {
    let (request, send) = handle.next_request().await.expect("a request");
    let method = request.method().to_string();
    let uri = request.uri().to_string();
    let content_type = request.headers().get("content-type").map(|v| v.to_str().unwrap().to_owned());
    let bytes = request.into_body().collect_bytes().await.unwrap();
    let body = if bytes.is_empty() { Value::Null } else { serde_json::from_slice(&bytes).unwrap() };
    (method, uri, content_type, body, send)
}

fn reply(send: SendResponse<Response<Body>>, status: u16, body: &Value) {
    send.send_response(
        Response::builder().status(status).body(Body::from(serde_json::to_vec(body).unwrap())).unwrap(),
    );
}

const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases";

#[tokio::test]
async fn kube_lease_api_creates_renews_and_labels() {
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let api = KubeLeaseApi::new(kube::Client::new(service, "default"), "kube-system", "vgpu-scheduler");
    let clock = Arc::new(ManualClock::new(T0 + 123_456_789));
    let mut e = Elector::new(api.clone(), "pod-a_1", &config(LeaderMode::Elect), clock.clone());
    let server = tokio::spawn(async move {
        // First tick: absent → create.
        let (m, uri, _, _, send) = next(&mut handle).await;
        assert_eq!((m.as_str(), uri.as_str()), ("GET", &*format!("{LEASES}/vgpu-scheduler")));
        let nf = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404,
                        "message": "leases.coordination.k8s.io \"vgpu-scheduler\" not found"});
        reply(send, 404, &nf);
        let (m, uri, ct, body, send) = next(&mut handle).await;
        assert_eq!((m.as_str(), uri.as_str()), ("POST", &*format!("{LEASES}?")));
        assert_eq!(ct.as_deref(), Some("application/json"));
        let created = json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "vgpu-scheduler", "namespace": "kube-system"},
            "spec": {
                "holderIdentity": "pod-a_1", "leaseDurationSeconds": 15,
                "acquireTime": "2026-01-02T03:04:05.123456Z", "renewTime": "2026-01-02T03:04:05.123456Z",
                "leaseTransitions": 0
            }
        });
        assert_eq!(body, created);
        let mut stored = created.clone();
        stored["metadata"]["resourceVersion"] = json!("500");
        reply(send, 201, &stored);
        // Second tick: ours → replace with the version read.
        let (m, _, _, _, send) = next(&mut handle).await;
        assert_eq!(m, "GET");
        let mut current = stored.clone();
        current["metadata"]["labels"] = json!({"keep": "me"});
        reply(send, 200, &current);
        let (m, uri, ct, body, send) = next(&mut handle).await;
        assert_eq!((m.as_str(), uri.as_str()), ("PUT", &*format!("{LEASES}/vgpu-scheduler?")));
        assert_eq!(ct.as_deref(), Some("application/json"));
        let mut renewed = current.clone();
        renewed["spec"]["renewTime"] = json!("2026-01-02T03:04:07.123456Z");
        assert_eq!(body, renewed);
        let status = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Conflict", "code": 409,
                            "message": "the object has been modified"});
        reply(send, 409, &status);
        // The role label.
        let (m, uri, ct, body, send) = next(&mut handle).await;
        assert_eq!((m.as_str(), uri.as_str()), ("PATCH", "/api/v1/namespaces/kube-system/pods/pod-a?"));
        assert_eq!(ct.as_deref(), Some("application/merge-patch+json"));
        assert_eq!(body, json!({"metadata": {"labels": {"vgpu-manager.io/scheduler-role": "leader"}}}));
        reply(send, 200, &json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "pod-a"}}));
    });
    assert_eq!(e.tick().await, Role::Leader);
    clock.advance(2 * S);
    assert_eq!(e.tick().await, Role::Leader, "one conflict is within the renew deadline");
    api.patch_role_label("kube-system", "pod-a", "leader").await.unwrap();
    server.await.unwrap();
}

#[tokio::test]
async fn kube_lease_api_maps_errors() {
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let api = KubeLeaseApi::new(kube::Client::new(service, "default"), "kube-system", "vgpu-scheduler");
    let server = tokio::spawn(async move {
        let (_, _, _, _, send) = next(&mut handle).await;
        let status = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "AlreadyExists",
                            "code": 409, "message": "already exists"});
        reply(send, 409, &status);
        let (_, _, _, _, send) = next(&mut handle).await;
        let status = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Forbidden",
                            "code": 403, "message": "forbidden"});
        reply(send, 403, &status);
    });
    let err = api.create(&Lease::default()).await.unwrap_err();
    assert!(
        matches!(&err, ClusterError::Conflict(m) if m.starts_with("create lease kube-system/vgpu-scheduler"))
    );
    let err = api.get().await.unwrap_err();
    assert!(matches!(&err, ClusterError::Other(m) if m.contains("forbidden (403)")), "{err:?}");
    server.await.unwrap();
}
