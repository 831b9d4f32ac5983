//! The real node (`vgpu_e2e::real_node`): the upstream kubelet on containerd, runc and the CNI plugins
//! registers with the API server and goes `Ready`; a busybox pod runs with a pod IP, its log is read
//! through the API server (which reaches the kubelet), it is deleted and its sandbox and container leave
//! containerd; the teardown leaves no mount, shim, cgroup, bridge or iptables chain on the host.
//!
//! Needs the control plane (`e2e/build-controlplane.sh`), the node (`e2e/build-node.sh`) and root; without
//! the node or root it prints `skipped: <reason>` and passes. Run `e2e/run.sh real_node`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, LogParams, PostParams};
use serde_json::json;
use vgpu_e2e::real_node::{self, RealNode};

const POD_TIMEOUT: Duration = Duration::from_secs(60);
/// The kubelet collects dead containers every minute.
const GC_TIMEOUT: Duration = Duration::from_secs(90);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the control plane, the real node and root: run e2e/run.sh"]
async fn real_node_runs_a_busybox_pod_and_cleans_up() {
    let started = Instant::now();
    let Some((env, mut node)) =
        real_node::start_env_and_node("real_node_runs_a_busybox_pod_and_cleans_up").await.unwrap()
    else {
        return;
    };
    let ready_after = started.elapsed();
    let client = env.client().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client, "default");

    // The kubelet's sockets are where the node says they are.
    assert!(node.device_plugin_socket().exists(), "{}", node.device_plugin_socket().display());
    assert!(node.pod_resources_socket().exists(), "{}", node.pod_resources_socket().display());
    assert!(node.plugins_registry_dir().is_dir());
    assert!(node.nri_socket().exists(), "{}", node.nri_socket().display());

    // A pod bound to the node (no scheduler needed) that prints, then waits to be stopped.
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "hello"},
        "spec": {
            "nodeName": node.node_name(),
            "terminationGracePeriodSeconds": 5,
            "containers": [{
                "name": "main",
                "image": node.busybox_image(),
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", "trap 'exit 0' TERM; echo hello from $(hostname); while true; do sleep 1; done"],
            }],
        },
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let pod_ip = env
        .poll("the pod Running with an IP", POD_TIMEOUT, || async {
            let pod = pods.get("hello").await.ok()?;
            let status = pod.status?;
            (status.phase.as_deref() == Some("Running")).then_some(status.pod_ip).flatten()
        })
        .await
        .unwrap_or_else(|e| panic!("{e:#}\n{}", node.log_tails(40)));
    let pod_ip: std::net::Ipv4Addr = pod_ip.parse().unwrap();
    let subnet_prefix = node.pod_cidr().rsplit_once('.').unwrap().0.to_owned();
    assert!(
        pod_ip.to_string().starts_with(&format!("{subnet_prefix}.")),
        "{pod_ip} not in {}",
        node.pod_cidr()
    );

    // The log comes from the kubelet through the API server.
    let log = env
        .poll("the pod's log", POD_TIMEOUT, || async {
            pods.logs("hello", &LogParams::default()).await.ok().filter(|l| l.contains("hello from hello"))
        })
        .await
        .unwrap_or_else(|e| panic!("{e:#}\n{}", node.log_tails(40)));
    assert_eq!(log.trim(), "hello from hello");

    // One sandbox and one container in containerd, both running.
    let containers = node.container_ids().unwrap();
    assert_eq!(containers.len(), 2, "{containers:?}");
    assert_eq!(node.task_ids().unwrap().len(), 2);

    // Deleted through the API: the kubelet stops the container (TERM: the trap exits 0), tears the
    // sandbox down (CNI DEL) and removes both from containerd, then the pod object goes.
    pods.delete("hello", &DeleteParams::default()).await.unwrap();
    env.poll("the pod gone from the API", POD_TIMEOUT, || async {
        matches!(pods.get_opt("hello").await, Ok(None)).then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", node.log_tails(40)));
    // Stopped at once: no task (process) is left in containerd.
    env.poll("the sandbox and container stopped in containerd", POD_TIMEOUT, || async {
        node.task_ids().ok()?.is_empty().then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", node.log_tails(40)));
    let stopped_after = started.elapsed();
    // Removed by the kubelet's container garbage collection, which runs once a minute from its start (the
    // period is compiled in): most of this test's time.
    env.poll("the sandbox and container removed from containerd", GC_TIMEOUT, || async {
        node.container_ids().ok()?.is_empty().then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", node.log_tails(40)));
    let removed_after = started.elapsed();

    // Teardown, checked from the outside too: nothing of the node in the mount table or the process list.
    let dir = node.dir().to_owned();
    let socket = node.containerd_socket().display().to_string();
    node.stop().unwrap();
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let dir_text = dir.display().to_string();
    let mounts: Vec<&str> = mountinfo.lines().filter(|l| l.contains(&dir_text)).collect();
    assert!(mounts.is_empty(), "mounts left under {dir_text}: {mounts:#?}");
    let ps = std::process::Command::new("ps").args(["-eo", "pid,args"]).output().unwrap();
    let ps = String::from_utf8_lossy(&ps.stdout);
    let shims: Vec<&str> = ps.lines().filter(|l| l.contains(&socket) || l.contains(&dir_text)).collect();
    assert!(shims.is_empty(), "processes of the node left: {shims:#?}");
    assert!(node.leftovers().is_empty(), "{:?}", node.leftovers());
    assert!(!dir.exists(), "{} left", dir.display());

    eprintln!(
        "real node: Ready after {:.1}s, pod stopped after {:.1}s, removed after {:.1}s, torn down after {:.1}s",
        ready_after.as_secs_f64(),
        stopped_after.as_secs_f64(),
        removed_after.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    env.finish();
}

/// The teardown of a node killed with its pods running (what a failing test leaves to `Drop`): no CNI
/// teardown, no kubelet clean-up, yet nothing of the node remains, and a second node starts afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the control plane, the real node and root: run e2e/run.sh"]
async fn real_node_teardown_with_running_pods_leaves_nothing() {
    let Some(binaries) = real_node::locate_or_skip().unwrap() else { return };
    let env =
        real_node::env_builder("real_node_teardown_with_running_pods_leaves_nothing").start().await.unwrap();
    let client = env.client().await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client, "default");
    for round in 0..2 {
        let mut node = RealNode::builder().binaries(binaries.clone()).start(&env).await.unwrap();
        let name = format!("sleeper-{round}");
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "nodeName": node.node_name(),
                "containers": [{
                    "name": "main",
                    "image": node.busybox_image(),
                    "imagePullPolicy": "Never",
                    "command": ["sleep", "3600"],
                    "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
                }],
                // A tmpfs the kubelet mounts from its own mount namespace, seen by containerd.
                "volumes": [{"name": "scratch", "emptyDir": {"medium": "Memory"}}],
            },
        }))
        .unwrap();
        pods.create(&PostParams::default(), &pod).await.unwrap();
        env.poll("the pod Running", POD_TIMEOUT, || async {
            let phase = pods.get(&name).await.ok()?.status?.phase?;
            (phase == "Running").then_some(())
        })
        .await
        .unwrap_or_else(|e| panic!("{e:#}\n{}", node.log_tails(40)));
        assert_eq!(node.task_ids().unwrap().len(), 2);

        let dir = node.dir().to_owned();
        node.stop().unwrap();
        assert!(node.leftovers().is_empty(), "{:?}", node.leftovers());
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        assert!(!mountinfo.contains(&dir.display().to_string()), "mounts left under {}", dir.display());
        assert!(!dir.exists());
        // The API still has the pod (no kubelet deletes it now); the next node is a new one.
        pods.delete(&name, &DeleteParams { grace_period_seconds: Some(0), ..Default::default() })
            .await
            .unwrap();
    }
    env.finish();
}
