//! A custom scheduler that embeds vGPU placement over its own node list: decode each node's vgpu-manager
//! annotations, order the nodes as the extender does, place the pod on the first that fits, and produce the
//! `nvidia.com/pre-allocated` value the device plugin admits. No Kubernetes client is involved: the node
//! list, usage and pod come from wherever your scheduler keeps them.
//!
//! Run: `cargo run --example custom_scheduler`.

use vgpu_core::alloc::{
    NodeUsage, NodeView, PodContainer, PodRequest, PodSpec, allocate, decode_node, order_nodes,
};
use vgpu_core::{codec::pod_devices, domain::ResourceDomain};

const CONFIG: &str = r#"{"deviceSplit":10,"coresScaling":1,"memoryFactor":1,"memoryScaling":1}"#;
const L4: &str = r#"[{"id":0,"type":"NVIDIA L4","uuid":"GPU-a0","core":100,"memory":23034,"number":10,"numa":0,"mig":false,"busId":"0000:01:00.0","capability":8.9,"healthy":true}]"#;
const H100: &str = r#"[{"id":0,"type":"NVIDIA H100","uuid":"GPU-b0","core":100,"memory":81559,"number":10,"numa":0,"mig":false,"busId":"0000:1b:00.0","capability":9.0,"healthy":true},{"id":1,"type":"NVIDIA H100","uuid":"GPU-b1","core":100,"memory":81559,"number":10,"numa":0,"mig":false,"busId":"0000:43:00.0","capability":9.0,"healthy":true}]"#;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let d = ResourceDomain::default();
    // Your scheduler's nodes: a name and the two annotations the device plugin publishes on each.
    let nodes = [
        ("gpu-l4", decode_node(Some(L4), Some(CONFIG))?),
        ("gpu-h100", decode_node(Some(H100), Some(CONFIG))?),
    ];
    let usage = NodeUsage::new(); // what already runs there: one PodFootprint per pod
    let views: Vec<NodeView<'_>> = nodes
        .iter()
        .map(|(name, (inventory, config))| NodeView { name, inventory, config, links: None, usage: &usage })
        .collect();
    // The pod: two vGPUs with 30 % of the cores and 40 GiB each, bin-packed.
    let train = PodContainer::app("train").limit(d.vgpu_number(), 2).limit(d.vgpu_cores(), 30);
    let pod = PodSpec::new()
        .annotation(d.node_scheduler_policy(), "binpack")
        .container(train.limit(d.vgpu_memory(), 40960));
    // Order the nodes as the extender does; the first that fits wins.
    let request = PodRequest::from_pod(&pod, &d)?;
    let (node, placed) = order_nodes(&request, &views)
        .into_iter()
        .find_map(|i| allocate(&request, &views[i]).ok().map(|placed| (views[i].name, placed)))
        .ok_or("no node fits the pod")?;
    println!("bind to {node} with {}={}", d.pre_allocated(), pod_devices::encode(&placed.claim)?);
    Ok(())
}
