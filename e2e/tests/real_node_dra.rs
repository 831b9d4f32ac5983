//! The DRA kubelet plugin under the real kubelet (issue #31): `vgpu-kubelet-plugin` on the mock backend
//! registers through the kubelet's plugin watcher (whose `GetInfo` carries the registration socket's path
//! as the HTTP/2 `:authority`: before the fix every claim failed `DRA driver manager.nvidia.com is not
//! registered`), publishes its ResourceSlice, the real kube-scheduler allocates a claim of
//! `{cores: 10, memory: 1Gi}` and binds the pod, the kubelet calls `NodePrepareResources`, containerd
//! injects the claim's CDI spec, and the container prints what it got (`vgpu_e2e::probe`): the share's
//! limits in its env, the runtime files and partition mounted, the GPU's (fake) device node. An Xid written
//! to the mock's live file reaches the pod: the kubelet (`ResourceHealthStatus`, on since 1.36) watches the
//! plugin's `DRAResourceHealth` stream and marks the claim's device `Unhealthy` in the container's
//! `allocatedResourcesStatus`; the GPU's recovery makes it `Healthy` again. Deleting the
//! pod makes the kubelet call `NodeUnprepareResources`: the CDI spec and the claim's partition go.
//!
//! With gate `NRISupport` the plugin first dials a folder without containerd's NRI socket: the claim
//! container is refused by the CDI spec's guard mount (it never runs without a partition) until the socket
//! is linked there; then the plugin registers with containerd's own NRI (enabled on the node) and the
//! kubelet's retry goes through the hook: the
//! container's partition (`claims/<uid>/<podUID>_<ctr>`) and its pod env come from the `CreateContainer`
//! adjustment; after a containerd restart the plugin reconnects and a second claim pod gets them again.
//!
//! Needs the control plane, the real node and root: `e2e/run.sh real_node_dra`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use k8s_openapi::api::{
    core::v1::Pod,
    resource::v1::{ResourceClaim, ResourceSlice},
};
use kube::{
    Api,
    api::{DeleteParams, ListParams, PostParams},
};
use serde_json::json;
use vgpu_core::abi::runtime_files;
use vgpu_e2e::{
    fixtures,
    probe::{self, Probe},
    real_node::{self, RealNode},
    scheduler_configuration, vgpu_binary,
};

const TIMEOUT: Duration = Duration::from_secs(90);
const NAMESPACE: &str = "default";
const PLUGIN: &str = "kubelet-plugin";
const MOCK: &str = "gpus:\n  - { uuid: GPU-DRA-0, name: NVIDIA A30, memoryMiB: 24576, computeCapability: '8.0', minor: 0 }\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the control plane, the real node and root: run e2e/run.sh"]
async fn real_node_registers_the_dra_plugin_and_runs_a_claim_pod() {
    claim_pod_on_the_real_node("real_node_registers_the_dra_plugin_and_runs_a_claim_pod", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the control plane, the real node and root: run e2e/run.sh"]
async fn real_node_nri_runs_the_plugins_hook_and_it_reconnects_after_a_restart() {
    claim_pod_on_the_real_node("real_node_nri_runs_the_plugins_hook_and_it_reconnects_after_a_restart", true)
        .await;
}

/// A claim of `{cores: 10, memory: 1Gi}` and its pod `name` running the probe.
async fn create_claim_pod(client: &kube::Client, node: &RealNode, claim: &str, name: &str) {
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), NAMESPACE);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let capacity = json!({ "requests": { "cores": "10", "memory": "1Gi" } });
    claims
        .create(
            &PostParams::default(),
            &fixtures::dra_claim(NAMESPACE, claim, "vgpu-manager", &capacity).unwrap(),
        )
        .await
        .unwrap();
    let resources = json!({"claims": [{"name": "gpu"}]});
    let spec = json!({"resourceClaims": [{"name": "gpu", "resourceClaimName": claim}]});
    let pod = probe::pod(NAMESPACE, name, "cuda", node.busybox_image(), resources, spec).unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
}

/// Waits for pod `name` to run and returns its probe.
async fn running_probe(env: &vgpu_e2e::TestEnv, node: &RealNode, pods: &Api<Pod>, name: &str) -> Probe {
    probe::running(env, node, pods, name, PLUGIN, TIMEOUT).await.unwrap_or_else(|e| panic!("{e:#}")).1
}

async fn claim_pod_on_the_real_node(test: &str, nri: bool) {
    let Some((mut env, mut node)) = real_node::start_env_and_node(test).await.unwrap() else { return };
    let client = env.client().await.unwrap();
    env.start_scheduler_with_config(&scheduler_configuration(env.kubeconfig_path(), &[])).await.unwrap();
    fixtures::create_dra_device_classes(&client).await.unwrap();

    let work = env.workdir().join("gpu-host");
    let host = probe::GpuHost::create(&work, 1).unwrap();
    let manager_dir = host.manager_dir.clone();
    runtime_files::install(&manager_dir, "v1.0.0", b"not a real library: busybox is static").unwrap();
    // The live file lets the test report an Xid once the pod runs.
    let live = work.join("live.yaml");
    std::fs::write(work.join("mock.yaml"), format!("{MOCK}liveFile: {}\n", live.display())).unwrap();
    let mut args = host.kubelet_plugin_args(&env, &node, &work.join("mock.yaml"));
    let vars = vec![
        ("NODE_NAME".to_owned(), node.node_name().to_owned()),
        ("RUST_LOG".to_owned(), "info".to_owned()),
        ("FEATURE_GATES".to_owned(), if nri { "NRISupport=true" } else { "" }.to_owned()),
    ];
    // With NRI the plugin first dials a folder without containerd's socket: it is not connected when the
    // first claim container is created. containerd's socket is linked there later.
    let nri_root = work.join("nri");
    if nri {
        std::fs::create_dir_all(&nri_root).unwrap();
        args.push(format!("--nri-root={}", nri_root.display()));
    }
    env.start_process(PLUGIN, &vgpu_binary("vgpu-kubelet-plugin").unwrap(), &args, &vars).unwrap();

    let slices: Api<ResourceSlice> = Api::all(client.clone());
    env.poll("the plugin's ResourceSlice", TIMEOUT, || async {
        let list = slices
            .list(&ListParams::default().fields(&format!("spec.nodeName={}", node.node_name())))
            .await
            .ok()?;
        list.items.into_iter().next()
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", env.log_tail(PLUGIN, 40)));
    // Registered with the kubelet before a pod needs it: a pod the kubelet sees first fails "DRA driver ...
    // is not registered" and is retried only at its next sync, a minute or more later.
    env.poll("the kubelet's registration of the plugin", TIMEOUT, || async {
        let log = std::fs::read_to_string(env.log_path(PLUGIN)).ok()?;
        log.contains("registered with the kubelet").then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}\n{}", env.log_tail(PLUGIN, 40), node.log_tails(40)));

    // A claim of one vGPU share and a pod using it.
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), NAMESPACE);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    create_claim_pod(&client, &node, "share", "cuda").await;
    if nri {
        // The hook cannot run: the claim's CDI spec's guard mount (no such source) fails the container, which
        // never runs without its partition, and the kubelet keeps retrying.
        let statuses = env
            .poll("the claim container refused for want of the NRI hook", TIMEOUT, || async {
                let status = pods.get("cuda").await.ok()?.status?;
                let text = serde_json::to_string(&status.container_statuses?).ok()?;
                text.contains(vgpu_dra::partition::GUARD_SOURCE).then_some(text)
            })
            .await
            .unwrap_or_else(|e| panic!("{e}\n{}\n{}", env.log_tail(PLUGIN, 40), node.log_tails(40)));
        println!("before the hook: {statuses:.600}");
        let pod = pods.get("cuda").await.unwrap();
        let container = pod.status.and_then(|s| s.container_statuses).unwrap().remove(0);
        assert!(!container.ready && container.state.and_then(|s| s.running).is_none(), "{statuses:.600}");
        // containerd's socket appears where the plugin dials: it connects, and the kubelet's next try runs
        // the container through the hook.
        std::os::unix::fs::symlink(node.nri_socket(), nri_root.join("nri.sock")).unwrap();
    }
    let probe = running_probe(&env, &node, &pods, "cuda").await;
    let kubelet_log = std::fs::read_to_string(node.kubelet_log()).unwrap_or_default();
    assert!(!kubelet_log.contains("RegisterPlugin error"), "the kubelet failed a registration first");

    let uid = claims.get("share").await.unwrap().metadata.uid.unwrap();
    for (key, want) in [
        ("CUDA_MEM_LIMIT_0", "1024m"),
        ("CUDA_CORE_LIMIT_0", "10"),
        ("MANAGER_VISIBLE_DEVICE_0", "GPU-DRA-0"),
        ("MANAGER_VGPU_CLAIM_UID", uid.as_str()),
        ("LD_PRELOAD", runtime_files::CONTAINER_LIBRARY),
    ] {
        assert_eq!(probe.env.get(key).map(String::as_str), Some(want), "{key} in {:?}", probe.env);
    }
    for target in ["/etc/ld.so.preload", runtime_files::CONTAINER_LIBRARY, "/etc/vgpu-manager/config"] {
        assert!(probe.mounted(target), "{target} not mounted:\n{}", probe.mounts.join("\n"));
    }
    for name in ["nvidia0", "nvidiactl"] {
        let line = probe.device(name).unwrap_or_else(|| panic!("/dev/{name} missing: {:?}", probe.dev));
        assert!(line.starts_with('c'), "{line}");
    }
    let spec = node.cdi_dir().join(format!("k8s.manager.nvidia.com-claim_{uid}.json"));
    assert!(spec.exists(), "{}", spec.display());
    let claim_dir = manager_dir.join("claims").join(&uid);
    assert!(claim_dir.is_dir(), "{}", claim_dir.display());
    if nri {
        // The CreateContainer adjustment: the pod's env and a partition of this container's own.
        let pod_uid = pods.get("cuda").await.unwrap().metadata.uid.unwrap();
        assert_eq!(probe.env.get("VGPU_POD_UID"), Some(&pod_uid), "{:?}", probe.env);
        assert_eq!(probe.env.get("VGPU_CONTAINER_NAME").map(String::as_str), Some("cuda"));
        assert!(
            claim_dir.join(format!("{pod_uid}_cuda/config/pids.config")).exists(),
            "{}",
            claim_dir.display()
        );

        // containerd restarts: the plugin reconnects, a new container gets the adjustment again.
        node.restart_containerd().await.unwrap();
        // A container created before the plugin is back misses the hook (NRI calls only connected
        // plugins): wait for the second registration.
        let registrations = || {
            let log = std::fs::read_to_string(env.log_path(PLUGIN)).unwrap_or_default();
            log.matches("NRI plugin registered and configured").count()
        };
        env.poll("the NRI plugin registered again", TIMEOUT, || async {
            (registrations() >= 2).then_some(())
        })
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}\n{}", env.log_tail(PLUGIN, 40), node.log_tails(40)));
        create_claim_pod(&client, &node, "share-2", "cuda-2").await;
        let second = running_probe(&env, &node, &pods, "cuda-2").await;
        let pod_uid = pods.get("cuda-2").await.unwrap().metadata.uid.unwrap();
        assert_eq!(
            second.env.get("VGPU_POD_UID"),
            Some(&pod_uid),
            "{:?}\n{}",
            second.env,
            env.log_tail(PLUGIN, 40)
        );
        pods.delete("cuda-2", &DeleteParams::default()).await.unwrap();
    } else {
        // Without NRI the claim's CDI spec carries the one partition; the pod env is the device plugin's.
        assert!(!probe.env.contains_key("VGPU_POD_UID"), "{:?}", probe.env);

        // Device health reaches the pod's status (ResourceHealthStatus, on by default since 1.36): the
        // kubelet watches the plugin's DRAResourceHealth stream and fills the container's
        // allocatedResourcesStatus for the claim's device. An Xid makes it Unhealthy, recovery Healthy again.
        let device_health = |pod: &Pod| -> Vec<(String, String)> {
            let statuses = pod.status.as_ref().and_then(|s| s.container_statuses.clone()).unwrap_or_default();
            statuses
                .iter()
                .flat_map(|c| c.allocated_resources_status.clone().unwrap_or_default())
                .flat_map(|r| r.resources.unwrap_or_default())
                .map(|r| (r.resource_id, r.health.unwrap_or_default()))
                .collect()
        };
        for (events, want) in [
            (r#"[{gpu: 0, kind: xid, xid: 79, message: "fell off the bus"}]"#, "Unhealthy"),
            (
                r#"[{gpu: 0, kind: xid, xid: 79, message: "fell off the bus"}, {gpu: 0, kind: recovered}]"#,
                "Healthy",
            ),
        ] {
            let tmp = work.join("live.yaml.tmp");
            std::fs::write(&tmp, format!("healthEvents: {events}\n")).unwrap();
            std::fs::rename(&tmp, &live).unwrap();
            let seen = env
                .poll(&format!("the claim's device {want} in the pod's status"), TIMEOUT, || async {
                    let health = device_health(&pods.get("cuda").await.ok()?);
                    (!health.is_empty() && health.iter().all(|(_, h)| h == want)).then_some(health)
                })
                .await
                .unwrap_or_else(|e| panic!("{e}\n{}\n{}", env.log_tail(PLUGIN, 40), node.log_tails(40)));
            println!("device health in the pod status: {seen:?}");
            // The kubelet names the device by the claim's CDI device (kind `k8s.manager.nvidia.com/claim`).
            let cdi_device = format!("k8s.manager.nvidia.com/claim={uid}-");
            assert!(seen.iter().all(|(id, _)| id.starts_with(&cdi_device)), "{seen:?}");
        }

        // The plugin is SIGKILLed and started again: the kubelet registers the new one (its registration
        // socket is new), the running pod is untouched, and the Unprepare below reaches the new process,
        // which finds the claim in its checkpoint.
        env.kill_process(PLUGIN).unwrap();
        env.start_process(PLUGIN, &vgpu_binary("vgpu-kubelet-plugin").unwrap(), &args, &vars).unwrap();
        let kubelet_log = node.kubelet_log();
        let registrations = || {
            let log = std::fs::read_to_string(&kubelet_log).unwrap_or_default();
            log.matches("OperationExecutor.RegisterPlugin started").count()
        };
        env.poll("the kubelet registering the restarted plugin", TIMEOUT, || async {
            (registrations() >= 2).then_some(())
        })
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}\n{}", env.log_tail(PLUGIN, 40), node.log_tails(40)));
        let pod = pods.get("cuda").await.unwrap();
        let restarts = pod.status.and_then(|s| s.container_statuses).map(|c| c[0].restart_count);
        assert_eq!(restarts, Some(0));
    }

    // Deleted: the kubelet unprepares the claim.
    pods.delete("cuda", &DeleteParams::default()).await.unwrap();
    // Unprepare removes the spec, then the partition, then the checkpoint entry (the last write).
    let checkpoint = node.plugins_dir().join("manager.nvidia.com/checkpoint.json");
    let recorded = || std::fs::read_to_string(&checkpoint).unwrap_or_default();
    env.poll("the claim unprepared (CDI spec, partition and checkpoint entry removed)", TIMEOUT, || async {
        (!spec.exists() && !claim_dir.exists() && !recorded().contains(&uid)).then_some(())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}\n{}\n{}", recorded(), env.log_tail(PLUGIN, 40), node.log_tails(40)));
    node.stop().unwrap();
    assert!(node.leftovers().is_empty(), "{:?}", node.leftovers());
    env.finish();
}
