#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
//! A node whose `node-device-topology` has one asymmetric GPU pair keeps the rest of its topology: that pair
//! scores as unlinked, link-mode pods are still placed by the other links, and the pair is logged as a
//! warning once per decode of the annotation (not per filter call).

use std::sync::{Arc, Mutex};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::subscriber::Interest;
use tracing::{Event, Level, Metadata, Subscriber};
use vgpu_core::alloc::ReasonCode;
use vgpu_core::clock::ManualClock;
use vgpu_core::domain::ResourceDomain;
use vgpu_core::model::{NodeDeviceInventory, NodeVgpuConfig};
use vgpu_core::topology::DeviceTopology;
use vgpu_scheduler::fixture::{vgpu_node, vgpu_pod};
use vgpu_scheduler::{ClusterCache, Extender, ExtenderConfig, MemoryCluster};

const T0: i64 = 1_700_000_000_000_000_000;

/// Four GPUs with NVLink (NV4, code 10) between 0-2 and 1-3, SYS (1) elsewhere; then GPU 3 lists `back` for
/// GPU 1 instead of NV4 (`None`: nothing), which makes 1-3 asymmetric.
fn crossed_pairs(back: Option<u8>) -> DeviceTopology {
    let code = |i: usize, j: usize| if i % 2 == j % 2 { 10 } else { 1 };
    let gpus: Vec<String> = (0..4)
        .map(|i| {
            let peers: Vec<String> = (0..4)
                .filter(|&j| j != i)
                .filter_map(|j| {
                    let c = if (i, j) == (3, 1) { back? } else { code(i, j) };
                    Some(format!("\"{j}\":[{c}]"))
                })
                .collect();
            format!("{{\"index\":{i},\"links\":{{{}}}}}", peers.join(","))
        })
        .collect();
    DeviceTopology::decode(&format!("[{}]", gpus.join(","))).unwrap()
}

fn node(topology: &DeviceTopology) -> vgpu_scheduler::Node {
    let inv = NodeDeviceInventory::uniform(4, 16384, 4).with_type_name("H100");
    vgpu_node("n", &inv, &NodeVgpuConfig::default(), Some(topology), &ResourceDomain::default()).unwrap()
}

/// One captured `WARN` event: its message and its other fields, rendered.
#[derive(Debug, Clone, Default)]
struct Warning {
    message: String,
    fields: Vec<(String, String)>,
}

impl Warning {
    fn field(&self, name: &str) -> Option<&str> {
        self.fields.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

impl Visit for Warning {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.message = format!("{value:?}");
        } else {
            self.fields.push((field.name().to_owned(), format!("{value:?}")));
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message = value.to_owned();
        } else {
            self.fields.push((field.name().to_owned(), value.to_owned()));
        }
    }
}

/// A subscriber that keeps the `WARN` events of the thread it is the default of.
#[derive(Clone, Default)]
struct Warnings(Arc<Mutex<Vec<Warning>>>);

impl Warnings {
    fn topology(&self) -> Vec<Warning> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|w| w.message.contains("node-device-topology"))
            .cloned()
            .collect()
    }
}

impl Subscriber for Warnings {
    fn register_callsite(&self, _: &'static Metadata<'static>) -> Interest {
        Interest::sometimes()
    }

    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        *metadata.level() == Level::WARN
    }

    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let mut w = Warning::default();
        event.record(&mut w);
        self.0.lock().unwrap().push(w);
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

#[test]
fn asymmetric_pair_scores_zero_and_the_node_keeps_its_topology() {
    let warnings = Warnings::default();
    tracing::subscriber::with_default(warnings.clone(), || {
        let cache = ClusterCache::new(ResourceDomain::default(), 0);
        // Different link types each way (NV4 from 1, SYS from 3).
        cache.upsert_node(&node(&crossed_pairs(Some(1))));
        let links = cache.decoded("n").unwrap().links.clone().expect("the topology is kept");
        assert_eq!(links.pair_score(1, 3), 0);
        assert_eq!(links.strongest(3, 1), 0);
        assert_eq!(links.pair_score(0, 2), 400);
        assert_eq!(links.pair_score(0, 1), 10);
        let w = warnings.topology();
        assert_eq!(w.len(), 1, "{w:?}");
        assert_eq!(w[0].field("node"), Some("n"));
        assert_eq!((w[0].field("gpu_a"), w[0].field("gpu_b")), (Some("1"), Some("3")));
        assert!(w[0].message.contains("asymmetric links between GPU 1 and GPU 3"), "{}", w[0].message);

        // The same annotations again: not decoded again, no new warning.
        cache.upsert_node(&node(&crossed_pairs(Some(1))));
        assert_eq!(warnings.topology().len(), 1);
        // A changed annotation (3 lists nothing for 1): decoded again, warned again.
        cache.upsert_node(&node(&crossed_pairs(None)));
        let w = warnings.topology();
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(w[1].message.contains("asymmetric links between GPU 1 and GPU 3"), "{}", w[1].message);
        assert_eq!(cache.decoded("n").unwrap().links.as_ref().unwrap().pair_score(0, 2), 400);
        // A consistent annotation: no warning.
        cache.upsert_node(&node(&crossed_pairs(Some(10))));
        assert_eq!(warnings.topology().len(), 2);
        assert_eq!(cache.decoded("n").unwrap().links.as_ref().unwrap().pair_score(1, 3), 400);
        // Any other inconsistency still drops the whole topology (and says so).
        let mut bad = crossed_pairs(Some(10));
        bad.gpus[0].links.insert(0, vec![vgpu_core::topology::P2PLinkType::ALL[10]]);
        cache.upsert_node(&node(&bad));
        assert!(cache.decoded("n").unwrap().links.is_none());
        let w = warnings.topology();
        assert_eq!(w.len(), 3, "{w:?}");
        assert!(w[2].message.contains("invalid"), "{}", w[2].message);
        assert!(w[2].field("error").unwrap().contains("GPU 0 lists links to itself"), "{w:?}");
    });
}

#[test]
fn link_pods_are_placed_by_the_symmetric_links_and_warned_about_once() {
    let warnings = Warnings::default();
    tracing::subscriber::with_default(warnings.clone(), || {
        let d = ResourceDomain::default();
        let cluster = MemoryCluster::new();
        cluster.upsert_node(node(&crossed_pairs(Some(1))));
        let gates = vgpu_gates::scheduler_extender().configure(["TopologyAwareGPUAllocation=true"]).unwrap();
        let ext = Extender::new(
            cluster.clone(),
            Arc::new(ManualClock::new(T0)),
            ExtenderConfig::from_gates(&gates),
        );
        ext.attach();
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(ext.sync()).unwrap();
        assert!(ext.cache().decoded("n").unwrap().links.is_some(), "the topology is not dropped");

        let pod = |uid: &str, mode: &str| {
            let ann = [
                (d.device_topology_mode(), mode.to_owned()),
                (d.device_scheduler_policy(), "none".to_owned()),
            ];
            cluster.upsert_pod(vgpu_pod(uid, 2, 10, 1024, &ann, &d))
        };
        let gpus =
            |uid: &str| -> Vec<u32> { ext.placed_claim(uid).unwrap().devices().map(|d| d.index).collect() };
        // link-strict: the NVLink pair 0-2 (1-3 counts as unlinked, so it is the only NVLink pair).
        for uid in ["a", "b", "c"] {
            let p = pod(uid, "link-strict");
            let r = rt.block_on(ext.filter(Some(&p), vec!["n".to_owned()]));
            assert_eq!(r.node_names(), ["n"], "{uid}");
            assert_eq!(gpus(uid), [0, 2], "{uid}");
        }
        // Three GPUs link-strict: no NVLink component that large; the node still has a topology (a dropped one
        // would be "node has no GPU link topology").
        let three = cluster.upsert_pod(vgpu_pod(
            "e",
            3,
            10,
            1024,
            &[
                (d.device_topology_mode(), "link-strict".to_owned()),
                (d.device_scheduler_policy(), "none".to_owned()),
            ],
            &d,
        ));
        let r = rt.block_on(ext.filter(Some(&three), vec!["n".to_owned()]));
        assert!(r.node_names().is_empty());
        let failed = r.failed_nodes().next().unwrap();
        assert_eq!(failed.code, ReasonCode::LinkTopologyUnsatisfied);
        let dry = ext.filter_dry_run(Some(&three), vec!["n".to_owned()]);
        let detail = dry.failure("n").unwrap();
        assert!(detail.contains("largest NVLink component 2"), "{detail}");
        // Five filter calls, one decode: one warning naming the node and the pair.
        let w = warnings.topology();
        assert_eq!(w.len(), 1, "{w:?}");
        assert_eq!(w[0].field("node"), Some("n"));
        assert_eq!((w[0].field("gpu_a"), w[0].field("gpu_b")), (Some("1"), Some("3")));
    });
}
