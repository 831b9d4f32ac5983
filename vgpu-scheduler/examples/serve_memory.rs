//! Serves the extender protocol over an in-memory cluster of four vGPU nodes.
//!
//! ```text
//! cargo run -p vgpu-scheduler --example serve_memory -- 127.0.0.1:3456
//! curl -s localhost:3456/readyz; curl -s localhost:3456/version
//! curl -s -XPOST localhost:3456/scheduler/filter -d '{"Pod":{"metadata":{"name":"p","namespace":"default",
//!   "uid":"u"},"spec":{"containers":[{"name":"main","resources":{"limits":{"nvidia.com/vgpu-number":"1"}}}]}},
//!   "NodeNames":["n0","n1","n2","n3"]}'
//! curl -s localhost:3456/metrics
//! ```
//!
//! The filter patches the pre-allocation into the in-memory cluster, so the pod must exist there: the example
//! creates pod `default/p` (uid `u`) asking for one vGPU. Stops on Ctrl-C, or after the number of seconds
//! given as second argument.

use std::sync::Arc;
use std::time::Duration;

use vgpu_core::clock::SystemClock;
use vgpu_core::domain::ResourceDomain;
use vgpu_core::model::{NodeDeviceInventory, NodeVgpuConfig};
use vgpu_lease::Readiness;
use vgpu_scheduler::fixture::{vgpu_node, vgpu_pod};
use vgpu_scheduler::server::{AppState, ServerConfig};
use vgpu_scheduler::{Extender, ExtenderConfig, MemoryCluster, Metrics};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let bind_address = match args.next() {
        Some(a) => {
            a.parse().map_err(|e| format!("listen address {a:?}: {e}; expected e.g. 127.0.0.1:3456"))?
        }
        None => "127.0.0.1:3456".parse()?,
    };
    let stop_after = match args.next() {
        Some(s) => Some(Duration::from_secs(
            s.parse().map_err(|e| format!("seconds {s:?}: {e}; expected a whole number"))?,
        )),
        None => None,
    };

    let d = ResourceDomain::default();
    let cluster = MemoryCluster::new();
    let inventory = NodeDeviceInventory::uniform(4, 40960, 4).with_type_name("A100");
    for n in 0..4 {
        cluster.upsert_node(vgpu_node(&format!("n{n}"), &inventory, &NodeVgpuConfig::default(), None, &d)?);
    }
    let mut pod = vgpu_pod("u", 1, 0, 0, &[], &d);
    pod.name = "p".into();
    cluster.upsert_pod(pod);

    let metrics = Arc::new(Metrics::new());
    let ext = Extender::new(cluster, Arc::new(SystemClock), ExtenderConfig::default())
        .with_observer(metrics.clone());
    ext.attach();
    ext.sync().await?;
    let state = AppState::new(Arc::new(ext), Readiness::ready(), metrics);
    let config = ServerConfig { bind_address, ..ServerConfig::default() };
    println!("serving the extender protocol on http://{bind_address} (Ctrl-C stops)");
    let shutdown = async move {
        match stop_after {
            Some(after) => tokio::time::sleep(after).await,
            None => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    };
    vgpu_scheduler::server::run(config, state, shutdown).await?;
    Ok(())
}
