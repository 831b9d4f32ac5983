//! The plugin runtime against the runtime side over a real unix socket in a temporary directory:
//! registration, Configure, split Synchronize, CreateContainer's adjustment, RemoveContainer (and its
//! older StateChange form), UpdateContainers from the plugin, hook errors, the runtime restarting (the
//! plugin dials again), and the link health on a manual clock (no 2-minute sleep).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use vgpu_nri::{
    api::{Container, ContainerAdjustment, ContainerUpdate, Event, KeyValue, Mount, PodSandbox},
    health::{Link, ManualClock},
    plugin::{EventMask, Handler, HookError, Plugin, PluginConfig, PluginIndex},
    runtime::RuntimeSide,
};

const WAIT: Duration = Duration::from_secs(10);

#[derive(Debug, Default)]
struct Recorder {
    calls: Mutex<Vec<String>>,
}

impl Recorder {
    fn log(&self, s: String) {
        self.calls.lock().unwrap().push(s);
    }
    fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }
}

impl Handler for Recorder {
    async fn synchronize(
        &self,
        pods: &[PodSandbox],
        containers: &[Container],
    ) -> Result<Vec<ContainerUpdate>, HookError> {
        let names: Vec<_> = containers.iter().map(|c| c.name.as_str()).collect();
        self.log(format!("sync {} pods {}", pods.len(), names.join(",")));
        Ok(Vec::new())
    }

    async fn create_container(
        &self,
        pod: &PodSandbox,
        container: &Container,
    ) -> Result<ContainerAdjustment, HookError> {
        if container.name == "bad" {
            return Err(HookError("container bad is refused".into()));
        }
        self.log(format!("create {}/{}", pod.uid, container.name));
        let mut adjust = ContainerAdjustment::new();
        adjust.mounts.push(Mount {
            destination: "/tmp/x".into(),
            type_: "bind".into(),
            source: format!("/host/{}", container.name),
            options: vec!["rw".into(), "bind".into()],
            ..Default::default()
        });
        adjust.env.push(KeyValue { key: "POD_UID".into(), value: pod.uid.clone(), ..Default::default() });
        Ok(adjust)
    }

    async fn remove_container(&self, pod: &PodSandbox, container: &Container) -> Result<(), HookError> {
        self.log(format!("remove {}/{}", pod.uid, container.name));
        Ok(())
    }
}

fn config(dir: &std::path::Path, idx: &str) -> PluginConfig {
    let mut c = PluginConfig::new(dir, idx.parse::<PluginIndex>().unwrap());
    c.backoff_initial = Duration::from_millis(20);
    c.backoff_max = Duration::from_millis(200);
    c
}

fn pod(uid: &str) -> PodSandbox {
    PodSandbox { uid: uid.into(), name: "p".into(), namespace: "ns".into(), ..Default::default() }
}

fn container(name: &str) -> Container {
    Container { name: name.into(), id: format!("id-{name}"), ..Default::default() }
}

async fn wait_link(rx: &mut tokio::sync::watch::Receiver<Link>, connected: bool) {
    tokio::time::timeout(WAIT, rx.wait_for(|l| matches!(l, Link::Connected) == connected))
        .await
        .expect("link change in time")
        .unwrap();
}

#[tokio::test]
async fn a_full_session_over_the_socket() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = RuntimeSide::bind(&dir.path().join("nri.sock")).unwrap();
    let handler = Arc::new(Recorder::default());
    let plugin = Plugin::new(config(dir.path(), "42"), Arc::clone(&handler)).unwrap();
    let mut link = plugin.health().subscribe();
    let stop = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(plugin.run(stop.clone().cancelled_owned()));

    let mut conn = tokio::time::timeout(WAIT, runtime.accept()).await.unwrap().unwrap();
    let reg = conn.registration();
    assert_eq!((reg.plugin_name.as_str(), reg.plugin_idx.as_str()), ("manager.nvidia.com", "42"));
    assert_eq!(reg.NRI_version, "v0.12.1");
    let events = conn.configure("containerd", "2.1.4").await.unwrap();
    assert_eq!(events, EventMask::of(&[Event::CREATE_CONTAINER, Event::REMOVE_CONTAINER]));
    wait_link(&mut link, true).await;

    // Split synchronization: three parts, one delivery.
    let updates = conn
        .synchronize(vec![pod("u1")], vec![container("a"), container("b"), container("c")], 1)
        .await
        .unwrap();
    assert!(updates.is_empty());

    let reply = conn.create_container(&pod("u1"), &container("main")).await.unwrap().expect("subscribed");
    let adjust = reply.adjust.into_option().expect("an adjustment");
    assert_eq!(adjust.mounts[0].source, "/host/main");
    assert_eq!(adjust.mounts[0].destination, "/tmp/x");
    assert_eq!((adjust.env[0].key.as_str(), adjust.env[0].value.as_str()), ("POD_UID", "u1"));

    let err = conn.create_container(&pod("u1"), &container("bad")).await.unwrap_err();
    assert!(err.to_string().contains("container bad is refused"), "{err}");

    assert!(conn.remove_container(&pod("u1"), &container("main")).await.unwrap());
    conn.state_change(Event::REMOVE_CONTAINER, &pod("u2"), Some(&container("old"))).await.unwrap();
    conn.state_change(Event::START_CONTAINER, &pod("u2"), Some(&container("old"))).await.unwrap();
    assert!(conn.stop_container(&pod("u1"), &container("main")).await.unwrap().is_empty(), "not subscribed");
    conn.shutdown().await.unwrap();

    assert_eq!(
        handler.calls(),
        ["sync 1 pods a,b,c", "create u1/main", "remove u1/main", "remove u2/old"],
        "StateChange(START_CONTAINER) is ignored"
    );
    stop.cancel();
    tokio::time::timeout(WAIT, task).await.unwrap().unwrap();
}

#[tokio::test]
async fn the_plugin_reconnects_after_the_runtime_restarts_and_health_follows_the_link() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("nri.sock");
    let clock = Arc::new(ManualClock::default());
    let handler = Arc::new(Recorder::default());
    let plugin =
        Plugin::new(config(dir.path(), "00"), Arc::clone(&handler)).unwrap().with_clock(clock.clone());
    let health = plugin.health();
    let mut link = health.subscribe();
    let stop = tokio_util::sync::CancellationToken::new();
    // No runtime yet: the plugin keeps dialing; healthy during the first 2 minutes only.
    let task = tokio::spawn(plugin.run(stop.clone().cancelled_owned()));
    assert!(health.is_healthy());
    clock.advance(Duration::from_secs(121));
    assert!(!health.is_healthy(), "2 minutes without a runtime");

    let runtime = RuntimeSide::bind(&socket).unwrap();
    let mut conn = tokio::time::timeout(WAIT, runtime.accept()).await.unwrap().unwrap();
    conn.configure("containerd", "2.1.4").await.unwrap();
    wait_link(&mut link, true).await;
    assert!(health.is_healthy());
    conn.create_container(&pod("u1"), &container("first")).await.unwrap();

    // The runtime goes away: socket closed, listener dropped.
    conn.close().await;
    drop(runtime);
    wait_link(&mut link, false).await;
    assert!(health.is_healthy(), "just disconnected");
    clock.advance(Duration::from_secs(119));
    assert!(health.is_healthy());
    clock.advance(Duration::from_secs(2));
    assert!(!health.is_healthy(), "disconnected for more than 2 minutes");
    assert!(health.problem().unwrap().contains("disconnected from the runtime for 121s"));

    // It comes back on the same path: the plugin dials again, registers, is configured.
    let runtime = RuntimeSide::bind(&socket).unwrap();
    let mut conn = tokio::time::timeout(WAIT, runtime.accept()).await.unwrap().unwrap();
    assert_eq!(conn.registration().plugin_name, "manager.nvidia.com");
    conn.configure("containerd", "2.1.5").await.unwrap();
    wait_link(&mut link, true).await;
    assert!(health.is_healthy());
    conn.create_container(&pod("u1"), &container("second")).await.unwrap();
    assert_eq!(handler.calls(), ["create u1/first", "create u1/second"]);

    stop.cancel();
    tokio::time::timeout(WAIT, task).await.unwrap().unwrap();
    wait_link(&mut link, false).await;
}

#[tokio::test]
async fn update_containers_reaches_the_runtime() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = RuntimeSide::bind(&dir.path().join("nri.sock")).unwrap();
    let plugin = Plugin::new(config(dir.path(), "01"), Arc::new(Recorder::default())).unwrap();
    let (session, conn) = tokio::join!(plugin.connect(), async {
        let mut conn = runtime.accept().await.unwrap();
        conn.configure("cri-o", "1.34").await.unwrap();
        conn
    });
    let session = session.unwrap();
    let update = ContainerUpdate { container_id: "id-a".into(), ignore_failure: true, ..Default::default() };
    let failed = session.update_containers(vec![update]).await.unwrap();
    assert!(failed.is_empty());
    let seen = conn.next_update(WAIT).await.expect("the runtime got the update");
    assert_eq!(seen.update[0].container_id, "id-a");
    session.close().await;
}

#[tokio::test]
async fn a_plugin_that_is_never_configured_times_out() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = RuntimeSide::bind(&dir.path().join("nri.sock")).unwrap();
    let mut cfg = config(dir.path(), "00");
    cfg.registration_timeout = Duration::from_millis(300);
    let plugin = Plugin::new(cfg, Arc::new(Recorder::default())).unwrap();
    let (session, conn) = tokio::join!(plugin.connect(), runtime.accept());
    let _conn = conn.unwrap();
    let err = session.unwrap_err();
    assert!(err.to_string().contains("Configure after RegisterPlugin"), "{err}");
}

#[test]
fn bad_names_and_indexes_are_refused_before_dialing() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path(), "00");
    cfg.name = "manager/nvidia".into();
    let err = Plugin::new(cfg, Arc::new(Recorder::default())).unwrap_err();
    assert!(err.to_string().contains("invalid plugin name \"manager/nvidia\""), "{err}");
    assert!("0x".parse::<PluginIndex>().is_err());
}
