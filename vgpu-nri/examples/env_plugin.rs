//! A small external NRI plugin: adds `VGPU_EXAMPLE_POD=<pod name>` and a read-only bind mount to every
//! container, prints each event, and exits after `<removes>` RemoveContainer events (default 1),
//! reconnecting whenever the runtime goes away in between.
//!
//! ```text
//! cargo run -p vgpu-nri --example env_plugin -- /var/run/nri 10 1
//! ```
//!
//! Used to check interoperability against upstream's runtime adaptation (containerd/nri
//! `pkg/adaptation`, the code containerd embeds).

use std::{path::PathBuf, sync::Arc};

use tokio::sync::Notify;
use vgpu_nri::{
    api::{Container, ContainerAdjustment, ContainerUpdate, KeyValue, Mount, PodSandbox},
    plugin::{Handler, HookError, Plugin, PluginConfig, PluginIndex},
};

#[derive(Debug, Default)]
struct EnvPlugin {
    removed: Notify,
}

impl Handler for EnvPlugin {
    async fn synchronize(
        &self,
        pods: &[PodSandbox],
        containers: &[Container],
    ) -> Result<Vec<ContainerUpdate>, HookError> {
        println!("SYNC pods={} containers={}", pods.len(), containers.len());
        Ok(Vec::new())
    }

    async fn create_container(
        &self,
        pod: &PodSandbox,
        container: &Container,
    ) -> Result<ContainerAdjustment, HookError> {
        println!(
            "CREATE {}/{} env={:?} annotations={}",
            pod.uid,
            container.name,
            container.env,
            container.annotations.len()
        );
        let mut adjust = ContainerAdjustment::new();
        adjust.env.push(KeyValue {
            key: "VGPU_EXAMPLE_POD".into(),
            value: pod.name.clone(),
            ..KeyValue::default()
        });
        adjust.mounts.push(Mount {
            destination: "/etc/vgpu-example".into(),
            type_: "bind".into(),
            source: format!("/var/lib/vgpu-example/{}", pod.uid),
            options: vec!["ro".into(), "nosuid".into(), "nodev".into(), "bind".into()],
            ..Mount::default()
        });
        // `VGPU_EXAMPLE_PAD=<n>`: one more variable of n bytes (answers larger than a 4096-byte frame).
        if let Some(n) = std::env::var("VGPU_EXAMPLE_PAD").ok().and_then(|v| v.parse::<usize>().ok()) {
            adjust.env.push(KeyValue {
                key: "VGPU_EXAMPLE_PAD".into(),
                value: "x".repeat(n),
                ..KeyValue::default()
            });
        }
        Ok(adjust)
    }

    async fn remove_container(&self, pod: &PodSandbox, container: &Container) -> Result<(), HookError> {
        println!("REMOVE {}/{}", pod.uid, container.name);
        self.removed.notify_one();
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let root = PathBuf::from(args.next().unwrap_or_else(|| "/var/run/nri".to_owned()));
    let index: PluginIndex = args.next().unwrap_or_else(|| "10".to_owned()).parse()?;
    let handler = Arc::new(EnvPlugin::default());
    let plugin = Plugin::new(PluginConfig::new(&root, index), Arc::clone(&handler))?;
    let removes: usize = args.next().unwrap_or_else(|| "1".to_owned()).parse()?;
    let done = Arc::clone(&handler);
    plugin
        .run(async move {
            for _ in 0..removes {
                done.removed.notified().await;
            }
            // Let the last answer reach the runtime.
            tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        })
        .await;
    println!("DONE");
    Ok(())
}
