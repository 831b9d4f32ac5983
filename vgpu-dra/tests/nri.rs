//! Gate `NRISupport` end to end at the state + NRI layer: a node in a temporary directory (mock backend,
//! in-memory claims, real checkpoint and CDI files), `DeviceState` preparing vGPU claims with the gate on
//! and off, and the in-process NRI plugin driven by the NRI runtime side over a real unix socket: the
//! CreateContainer adjustment carries the per-container partition mounts and `VGPU_POD_*` env, the
//! directories exist, stale library files are gone, RemoveContainer drops the cache entry, Synchronize
//! re-fills it, Unprepare removes every partition with the claim directory.
//!
//! NRISupport records no host action at Prepare (the partitions are made at CreateContainer, under the
//! claim directory Prepare records), so there is no fault point of its own to crash at.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::{sync::Arc, time::Duration};

use support::{DRIVER, NODE, TestNode};
use vgpu_core::backend::NvidiaAdapter;
use vgpu_dra::claims::ClaimRef;
use vgpu_dra::{
    claims::{allocated, allocation_result, claim},
    nri::{NriConfig, NriHook},
    state::DeviceState,
};
use vgpu_gates::DraGate;
use vgpu_nri::{
    api::{Container, PodSandbox},
    runtime::RuntimeSide,
};

const WAIT: Duration = Duration::from_secs(10);

/// The node's state with NRISupport `on`, and claim `ns/shared` (UID `u-shared`) holding one vGPU share
/// reserved for two pods.
async fn node_state(node: &TestNode, on: bool) -> Arc<DeviceState> {
    let mut config = (*node.config).clone();
    config.gates.set_gate(DraGate::NRISupport, on).unwrap();
    let share =
        allocation_result("gpu", DRIVER, NODE, "vgpu-0", Some("s1"), &[("cores", "30"), ("memory", "2Gi")]);
    node.claims.insert(allocated(claim("ns", "shared", "u-shared"), vec![share], &["pod-a", "pod-b"]));
    Arc::new(
        DeviceState::new(
            Arc::new(config),
            Arc::clone(&node.devices),
            Arc::new(NvidiaAdapter),
            node.claims.clone(),
        )
        .await
        .unwrap(),
    )
}

fn pod(uid: &str, name: &str) -> PodSandbox {
    PodSandbox {
        id: format!("sandbox-{uid}"),
        uid: uid.into(),
        name: name.into(),
        namespace: "ns".into(),
        ..Default::default()
    }
}

fn container(pod: &PodSandbox, name: &str, claim: Option<&str>) -> Container {
    let mut env =
        vec!["PATH=/usr/bin".to_owned(), "LD_PRELOAD=/etc/vgpu-manager/driver/libvgpu-control.so".to_owned()];
    if let Some(uid) = claim {
        env.push(format!("MANAGER_VGPU_CLAIM_UID={uid}"));
    }
    Container {
        id: format!("ctr-{name}"),
        pod_sandbox_id: pod.id.clone(),
        name: name.into(),
        env,
        ..Default::default()
    }
}

#[tokio::test]
async fn gate_off_the_partition_is_per_claim_and_mounted_through_cdi() {
    let node = TestNode::new();
    let state = node_state(&node, false).await;
    let err = state.prepare(&[ClaimRef::new("ns", "shared", "u-shared")]).await["u-shared"]
        .as_ref()
        .unwrap_err()
        .to_string();
    assert!(err.contains("cannot be used for multiple Pods"), "{err}");
    node.claims.insert(allocated(
        claim("ns", "single", "u-single"),
        vec![allocation_result("gpu", DRIVER, NODE, "vgpu-1", Some("s2"), &[("cores", "30")])],
        &["pod-a"],
    ));
    assert!(state.prepare(&[ClaimRef::new("ns", "single", "u-single")]).await["u-single"].is_ok());
    let spec = std::fs::read_to_string(node.config.cdi_spec_path("u-single")).unwrap();
    assert!(spec.contains("/tmp/.vgpu_lock") && spec.contains("/etc/vgpu-manager/config/pids.config"));
    assert!(!spec.contains(vgpu_dra::partition::GUARD_SOURCE), "no NRI guard without NRI");
    let parts = std::fs::read_dir(node.config.claim_dir("u-single")).unwrap().count();
    assert_eq!(parts, 1, "one partition made at Prepare");
}

#[tokio::test]
async fn create_container_injects_a_per_container_partition_over_the_socket() {
    let node = TestNode::new();
    let state = node_state(&node, true).await;
    let prepared = state.prepare(&[ClaimRef::new("ns", "shared", "u-shared")]).await;
    assert!(
        prepared["u-shared"].is_ok(),
        "two pods may share a vGPU claim with NRI: {:?}",
        prepared["u-shared"]
    );
    let spec = std::fs::read_to_string(node.config.cdi_spec_path("u-shared")).unwrap();
    assert!(spec.contains("MANAGER_VGPU_CLAIM_UID=u-shared"));
    assert!(!spec.contains("/tmp/.vgpu_lock") && !spec.contains("pids.config"), "no partition mounts in CDI");
    // The guard: a container the hook misses cannot start (its source never exists); the hook's partition
    // mount on the same path replaces it.
    let spec_json: serde_json::Value = serde_json::from_str(&spec).unwrap();
    let guard = node.config.host_claim_dir("u-shared").join(vgpu_dra::partition::GUARD_SOURCE);
    let guards: Vec<_> = spec_json["containerEdits"]["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["containerPath"] == "/etc/vgpu-manager/config")
        .collect();
    assert_eq!(guards.len(), 1, "{spec}");
    assert_eq!(guards[0]["hostPath"], guard.display().to_string());
    assert!(!guard.exists());
    let claim_dir = node.config.claim_dir("u-shared");
    assert_eq!(std::fs::read_dir(&claim_dir).unwrap().count(), 0, "Prepare makes only the claim directory");

    // Stale library files from an earlier run of the same container name.
    let part_a = claim_dir.join("uid-a_main");
    for (dir, file) in [("vmem_node", "vmem_node.config"), ("sm_node", "sm_node.config")] {
        std::fs::create_dir_all(part_a.join(dir)).unwrap();
        std::fs::write(part_a.join(dir).join(file), b"old").unwrap();
    }

    let nri_root = node.path("nri");
    let runtime = RuntimeSide::bind(&nri_root.join("nri.sock")).unwrap();
    let hook = NriHook::new(Arc::clone(&state));
    let cache = hook.cache();
    let plugin =
        vgpu_dra::nri::plugin(hook, &NriConfig { root: nri_root.clone(), index: "05".parse().unwrap() })
            .unwrap();
    let health = plugin.health();
    let stop = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(plugin.run(stop.clone().cancelled_owned()));
    let mut conn = tokio::time::timeout(WAIT, runtime.accept()).await.unwrap().unwrap();
    assert_eq!(conn.registration().plugin_name, "manager.nvidia.com");
    assert_eq!(conn.registration().plugin_idx, "05");
    conn.configure("containerd", "2.1.4").await.unwrap();
    assert!(health.is_healthy());

    let pa = pod("uid-a", "trainer");
    let reply = conn.create_container(&pa, &container(&pa, "main", Some("u-shared"))).await.unwrap().unwrap();
    let adjust = reply.adjust.into_option().unwrap();
    let host = node.config.host_claim_dir("u-shared").join("uid-a_main");
    let mounts: Vec<_> = adjust
        .mounts
        .iter()
        .map(|m| (m.destination.as_str(), m.source.clone(), m.options.join(",")))
        .collect();
    assert_eq!(
        mounts,
        [
            (
                "/etc/vgpu-manager/config",
                host.join("config").display().to_string(),
                "rw,nosuid,nodev,bind".to_owned()
            ),
            (
                "/tmp/.vgpu_lock",
                host.join("vgpu_lock").display().to_string(),
                "rw,nosuid,nodev,bind".to_owned()
            ),
            (
                "/tmp/.vmem_node",
                host.join("vmem_node").display().to_string(),
                "rw,nosuid,nodev,bind".to_owned()
            ),
            ("/tmp/.sm_node", host.join("sm_node").display().to_string(), "rw,nosuid,nodev,bind".to_owned()),
            (
                "/etc/vgpu-manager/config/pids.config",
                host.join("config/pids.config").display().to_string(),
                "ro,nosuid,nodev,bind".to_owned()
            ),
        ]
    );
    assert!(adjust.mounts.iter().all(|m| m.type_ == "bind"));
    let env: Vec<_> = adjust.env.iter().map(|kv| format!("{}={}", kv.key, kv.value)).collect();
    assert_eq!(
        env,
        [
            "VGPU_POD_NAME=trainer",
            "VGPU_POD_NAMESPACE=ns",
            "VGPU_POD_UID=uid-a",
            "VGPU_CONTAINER_NAME=main",
            "MANAGER_CLIENT_REGISTER_UUID="
        ]
    );
    for sub in ["config", "vgpu_lock", "vmem_node", "sm_node"] {
        assert!(part_a.join(sub).is_dir(), "{sub}");
    }
    assert!(part_a.join("config/pids.config").is_file());
    assert!(!part_a.join("vmem_node/vmem_node.config").exists(), "stale vmem ledger deleted");
    assert!(!part_a.join("sm_node/sm_node.config").exists(), "stale SM bucket deleted");
    assert_eq!(cache.lookup("uid-a", "main"), Some(("u-shared".to_owned(), part_a.join("config"))));

    // The container is created again (a restart): same answer, the library's files are fresh again.
    std::fs::write(part_a.join("vmem_node/vmem_node.config"), b"used").unwrap();
    std::fs::write(part_a.join("config/pids.config"), b"1234\n").unwrap();
    let again = conn.create_container(&pa, &container(&pa, "main", Some("u-shared"))).await.unwrap().unwrap();
    assert_eq!(again.adjust.mounts, adjust.mounts);
    assert_eq!(again.adjust.env, adjust.env);
    assert!(!part_a.join("vmem_node/vmem_node.config").exists());
    assert_eq!(std::fs::read(part_a.join("config/pids.config")).unwrap(), b"1234\n", "pids.config is kept");

    // The second pod of the claim gets its own partition.
    let pb = pod("uid-b", "worker");
    let reply = conn.create_container(&pb, &container(&pb, "main", Some("u-shared"))).await.unwrap().unwrap();
    assert_eq!(reply.adjust.mounts.len(), 5);
    assert!(claim_dir.join("uid-b_main/config/pids.config").is_file());
    let mut parts: Vec<_> = std::fs::read_dir(&claim_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    parts.sort();
    assert_eq!(parts, ["uid-a_main", "uid-b_main"]);

    // No claim env, or a claim this node has not prepared: no adjustment, nothing created.
    let pc = pod("uid-c", "other");
    let none = conn.create_container(&pc, &container(&pc, "main", None)).await.unwrap().unwrap();
    assert!(none.adjust.mounts.is_empty() && none.adjust.env.is_empty());
    let foreign =
        conn.create_container(&pc, &container(&pc, "main", Some("u-elsewhere"))).await.unwrap().unwrap();
    assert!(foreign.adjust.mounts.is_empty() && foreign.adjust.env.is_empty());
    assert!(!node.config.claim_dir("u-elsewhere").exists());
    assert_eq!(cache.len(), 2);

    // A name that would leave the claim directory fails the container's creation.
    let bad = pod("uid-d", "x");
    let err =
        conn.create_container(&bad, &container(&bad, "..", Some("u-shared"))).await.unwrap_err().to_string();
    assert!(err.contains("container name \"..\" cannot name a partition directory"), "{err}");

    // RemoveContainer drops the cache entry only.
    assert!(conn.remove_container(&pa, &container(&pa, "main", Some("u-shared"))).await.unwrap());
    assert_eq!(cache.lookup("uid-a", "main"), None);
    assert!(cache.lookup("uid-b", "main").is_some());
    assert!(part_a.is_dir(), "files stay until Unprepare");

    // Unprepare removes the claim directory with every partition.
    conn.close().await;
    stop.cancel();
    tokio::time::timeout(WAIT, task).await.unwrap().unwrap();
    assert!(state.unprepare(&[ClaimRef::new("ns", "shared", "u-shared")]).await["u-shared"].is_ok());
    assert!(!claim_dir.exists());
}

#[tokio::test]
async fn synchronize_refills_the_cache_after_a_plugin_restart() {
    let node = TestNode::new();
    let state = node_state(&node, true).await;
    assert!(state.prepare(&[ClaimRef::new("ns", "shared", "u-shared")]).await["u-shared"].is_ok());
    let existing = node.config.claim_dir("u-shared").join("uid-a_main/config");
    std::fs::create_dir_all(&existing).unwrap();

    let nri_root = node.path("nri");
    let runtime = RuntimeSide::bind(&nri_root.join("nri.sock")).unwrap();
    let hook = NriHook::new(Arc::clone(&state));
    let cache = hook.cache();
    let plugin =
        vgpu_dra::nri::plugin(hook, &NriConfig { root: nri_root, index: "00".parse().unwrap() }).unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(plugin.run(stop.clone().cancelled_owned()));
    let mut conn = tokio::time::timeout(WAIT, runtime.accept()).await.unwrap().unwrap();
    conn.configure("containerd", "2.1.4").await.unwrap();
    let pa = pod("uid-a", "trainer");
    let pz = pod("uid-z", "plain");
    let containers = vec![
        container(&pa, "main", Some("u-shared")),
        container(&pa, "sidecar", Some("u-shared")),
        container(&pz, "main", None),
    ];
    conn.synchronize(vec![pa, pz], containers, 1).await.unwrap();
    assert_eq!(cache.lookup("uid-a", "main"), Some(("u-shared".to_owned(), existing)));
    assert_eq!(cache.len(), 1, "only containers whose partition exists");
    conn.close().await;
    stop.cancel();
    tokio::time::timeout(WAIT, task).await.unwrap().unwrap();
}
