//! Leader election of `vgpu-scheduler-extender` against the real API server (issue #8 §3, third scenario).
//!
//! Two replicas elect on one `coordination.k8s.io/v1` Lease. Exactly one is ready (`/readyz` 200) and
//! holds the Lease; each labels its own pod `vgpu-manager.io/scheduler-role` = `leader`/`follower`.
//! Killing the leader with SIGKILL (it cannot release the Lease) makes the other take over once the lease
//! expires. Assertions read the Lease and the pods back from the API server.
//!
//! Needs the control-plane binaries and our binaries: run `e2e/run.sh`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::PostParams;
use tokio::time::Instant;
use vgpu_e2e::{TestEnv, fixtures, free_port, http_get, vgpu_binary};

const LEASE: &str = "vgpu-scheduler-extender";
const ROLE_LABEL: &str = "vgpu-manager.io/scheduler-role";

struct Replica {
    name: &'static str,
    port: u16,
}

fn start(env: &mut TestEnv, replica: &Replica) {
    let bin = vgpu_binary("vgpu-scheduler-extender").unwrap();
    let args = vec![
        format!("--kubeconfig={}", env.kubeconfig_path().display()),
        format!("--server-bind-port={}", replica.port),
        "--leader-elect".to_owned(),
        format!("--leader-elect-resource-name={LEASE}"),
        "--leader-elect-resource-namespace=default".to_owned(),
    ];
    let vars = [
        ("POD_NAME".to_owned(), replica.name.to_owned()),
        ("POD_NAMESPACE".to_owned(), "default".to_owned()),
        ("RUST_LOG".to_owned(), "info".to_owned()),
    ];
    env.start_process(replica.name, &bin, &args, &vars).unwrap();
}

async fn ready(port: u16) -> bool {
    matches!(http_get(port, "/readyz").await, Ok((200, _)))
}

async fn role_label(pods: &Api<Pod>, name: &str) -> Option<String> {
    pods.get(name).await.ok()?.metadata.labels?.get(ROLE_LABEL).cloned()
}

async fn holder(leases: &Api<Lease>) -> Option<String> {
    leases.get(LEASE).await.ok()?.spec?.holder_identity
}

/// Polls until exactly one of `replicas` is ready, holds the lease and is labelled leader while every other
/// live one is labelled follower; returns the leader's index.
async fn wait_single_leader(
    env: &TestEnv,
    client: &kube::Client,
    replicas: &[&Replica],
    timeout: Duration,
) -> usize {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
    let deadline = Instant::now() + timeout;
    loop {
        let mut readies = Vec::new();
        for r in replicas {
            readies.push(ready(r.port).await);
        }
        let holder = holder(&leases).await;
        let mut labels = Vec::new();
        for r in replicas {
            labels.push(role_label(&pods, r.name).await);
        }
        if readies.iter().filter(|r| **r).count() == 1 {
            let i = readies.iter().position(|r| *r).unwrap_or_default();
            let leader_ok = holder.as_deref().is_some_and(|h| h.starts_with(replicas[i].name))
                && labels[i].as_deref() == Some("leader");
            let followers_ok =
                labels.iter().enumerate().all(|(j, l)| j == i || l.as_deref() == Some("follower"));
            if leader_ok && followers_ok {
                return i;
            }
        }
        if Instant::now() >= deadline {
            let logs: Vec<String> =
                replicas.iter().map(|r| format!("{}:\n{}", r.name, env.log_tail(r.name, 30))).collect();
            panic!(
                "no single leader after {timeout:?}: ready {readies:?}, holder {holder:?}, labels {labels:?}\n{}",
                logs.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the control-plane binaries: run e2e/run.sh"]
async fn one_of_two_extenders_leads_and_the_other_takes_over() {
    let mut env =
        TestEnv::builder("one_of_two_extenders_leads_and_the_other_takes_over").start().await.unwrap();
    let client = env.client().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    // The replicas' own pods (never scheduled: no scheduler runs), which they label with their role.
    for name in ["extender-a", "extender-b"] {
        pods.create(&PostParams::default(), &fixtures::vgpu_pod("default", name, 0)).await.unwrap();
    }
    let a = Replica { name: "extender-a", port: free_port().unwrap() };
    let b = Replica { name: "extender-b", port: free_port().unwrap() };
    start(&mut env, &a);
    start(&mut env, &b);
    let replicas = [&a, &b];
    let first = wait_single_leader(&env, &client, &replicas, Duration::from_secs(60)).await;
    let (leader, survivor) = (replicas[first], replicas[1 - first]);

    // It stays that way (no flapping) for a few renew periods.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(wait_single_leader(&env, &client, &replicas, Duration::from_secs(5)).await, first);

    let killed_at = Instant::now();
    env.kill_process(leader.name).unwrap();
    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
    let transitions_before = leases.get(LEASE).await.unwrap().spec.unwrap().lease_transitions.unwrap_or(0);
    wait_single_leader(&env, &client, &[survivor], Duration::from_secs(60)).await;
    let took_over = killed_at.elapsed();
    let lease = leases.get(LEASE).await.unwrap().spec.unwrap();
    assert!(lease.holder_identity.unwrap().starts_with(survivor.name));
    assert!(lease.lease_transitions.unwrap_or(0) > transitions_before, "leaseTransitions not incremented");
    eprintln!("{} took over {took_over:?} after {} was killed", survivor.name, leader.name);
    // The dead leader's label is stale (it could not clean up); the survivor's is now `leader`.
    assert_eq!(role_label(&pods, survivor.name).await.as_deref(), Some("leader"));
    env.finish();
}
