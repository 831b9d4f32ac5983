//! `vgpuctl simulate`: stream a seeded mix of vGPU pods through the extender's filter and bind over an
//! in-memory cluster of DGX-like nodes, and report placement, utilization, fragmentation and latency
//! (per stage: module [`stages`](crate::stages)); or, with `--from-cluster`, stream one pod shape through a
//! snapshot of a live cluster (module [`from_cluster`]).

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use serde_json::json;
use vgpu_core::alloc::ReasonCode;
use vgpu_core::backend::DeviceBackend;
use vgpu_core::backend::mock::MockBackend;
use vgpu_core::clock::ManualClock;
use vgpu_core::codec::pod_devices;
use vgpu_core::domain::ResourceDomain;
use vgpu_core::model::{GpuDevice, NodeDeviceInventory, NodeVgpuConfig};
use vgpu_core::topology::{DeviceTopology, GpuLinks};
use vgpu_scheduler::fixture::{topology_of, vgpu_node, vgpu_pod};
use vgpu_scheduler::{CandidateNames, Extender, ExtenderConfig, MemoryCluster};

use crate::from_cluster::{self, FromClusterArgs};
use crate::pod_shape::PodShape;
use crate::progress::Progress;
use crate::stages::StageHistograms;

const DGX: &str = include_str!("../../../../examples/mock/dgx-h100-8gpu.yaml");
const POLICIES: [&str; 3] = ["binpack", "spread", "none"];
const MODES: [&str; 5] = ["none", "numa", "numa-strict", "link", "link-strict"];

/// Arguments of `vgpuctl simulate`.
#[derive(Debug, clap::Args)]
pub struct SimulateArgs {
    /// Nodes in the simulated cluster.
    #[arg(long, default_value_t = 1000)]
    pub nodes: usize,
    /// GPUs per node (taken from the DGX-like mock description, cycled).
    #[arg(long, default_value_t = 8)]
    pub gpus_per_node: usize,
    /// Pods to stream.
    #[arg(long, default_value_t = 5000)]
    pub pods: usize,
    /// Random seed.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Node policy: binpack, spread, none or mix.
    #[arg(long, default_value = "mix", value_parser = parse_policy)]
    pub node_policy: String,
    /// Device policy: binpack, spread, none or mix.
    #[arg(long, default_value = "mix", value_parser = parse_policy)]
    pub device_policy: String,
    /// Topology mode: none, numa, numa-strict, link, link-strict or mix.
    #[arg(long, default_value = "mix", value_parser = parse_mode)]
    pub topology_mode: String,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
    /// Snapshot the live cluster's vGPU nodes and pods (read-only) and stream `--count` pods of the `--pod`
    /// shape through it instead of the synthetic cluster.
    #[arg(long, requires = "pod")]
    pub from_cluster: bool,
    /// Kubeconfig for `--from-cluster` (default: in-cluster config, $KUBECONFIG or ~/.kube/config).
    #[arg(long, value_name = "PATH", requires = "from_cluster")]
    pub kubeconfig: Option<std::path::PathBuf>,
    /// Pod shape for `--from-cluster`: `gpus=<n>[,cores=<pct>][,memory=<n>Mi|Gi|Ti][,topology=<mode>]`
    /// `[,node-policy=<p>][,device-policy=<p>]`.
    #[arg(long, value_name = "SHAPE", value_parser = PodShape::parse, requires = "from_cluster")]
    pub pod: Option<PodShape>,
    /// How many pods of the `--pod` shape to stream (`--from-cluster`).
    #[arg(long, default_value_t = 1, requires = "from_cluster")]
    pub count: usize,
}

fn parse_policy(s: &str) -> Result<String, String> {
    let s = s.to_ascii_lowercase();
    if s == "mix" || POLICIES.contains(&s.as_str()) {
        Ok(s)
    } else {
        Err(format!("expected binpack, spread, none or mix, got {s}"))
    }
}

fn parse_mode(s: &str) -> Result<String, String> {
    let s = s.to_ascii_lowercase();
    if s == "mix" || MODES.contains(&s.as_str()) {
        Ok(s)
    } else {
        Err(format!("expected {} or mix, got {s}", MODES.join(", ")))
    }
}

/// SplitMix64: small, seeded, good enough for workload mixes.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn pick<'a, T>(&mut self, weighted: &'a [(T, u64)]) -> &'a T {
        let total: u64 = weighted.iter().map(|w| w.1).sum();
        let mut r = self.next() % total.max(1);
        for (v, w) in weighted {
            if r < *w {
                return v;
            }
            r -= w;
        }
        &weighted[0].0
    }
    fn choose<'a>(&mut self, fixed: &'a str, all: &'a [&'a str]) -> &'a str {
        if fixed == "mix" { all[(self.next() % all.len() as u64) as usize] } else { fixed }
    }
}

/// Runs the simulation; exit 0, 1 on over-commit, 2 on a setup error.
pub fn run(args: SimulateArgs) -> ExitCode {
    if args.from_cluster {
        let Some(shape) = args.pod.clone() else {
            eprintln!("error: --from-cluster needs --pod <SHAPE>");
            return ExitCode::from(2);
        };
        let fc = FromClusterArgs {
            kubeconfig: args.kubeconfig.clone(),
            shape,
            count: args.count,
            json: args.json,
        };
        return match from_cluster::run(&fc) {
            Ok(text) => crate::output::print(&text, ExitCode::SUCCESS),
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(2)
            }
        };
    }
    match simulate(&args) {
        Ok((text, ok)) => crate::output::print(&text, if ok { ExitCode::SUCCESS } else { ExitCode::from(1) }),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

fn node_template(gpus: usize) -> Result<(Vec<GpuDevice>, DeviceTopology), String> {
    let backend = MockBackend::from_yaml_str(DGX).map_err(|e| e.to_string())?;
    let devices = backend.devices().map_err(|e| e.to_string())?;
    let topo = topology_of(&backend.topology().map_err(|e| e.to_string())?);
    if devices.is_empty() {
        return Err("the mock description has no GPU".into());
    }
    let n = devices.len();
    let out: Vec<GpuDevice> = (0..gpus)
        .map(|i| {
            let mut d = devices[i % n].clone();
            d.index = i as u32;
            d
        })
        .collect();
    let gpus_links = (0..gpus)
        .map(|i| GpuLinks {
            index: i,
            links: (0..gpus)
                .filter(|&j| j != i)
                .filter_map(|j| {
                    let l = topo.gpus.get(i % n)?.links.get(&(j % n))?.clone();
                    Some((j, l))
                })
                .collect(),
        })
        .collect();
    Ok((out, DeviceTopology { gpus: gpus_links }))
}

/// Weighted GPU counts per pod: mostly single GPUs, some 2, 3 and 4, and a tenth asking for a whole node.
/// "Whole node" means every schedulable GPU of the simulated node (7 on the DGX description, whose GPU 7 is
/// in MIG mode), not a fixed 8 that could never fit; counts above the schedulable GPUs are left out.
fn gpu_count_mix(schedulable: usize) -> Vec<(u32, u64)> {
    let whole = u32::try_from(schedulable).unwrap_or(u32::MAX).min(8);
    let mut mix: Vec<(u32, u64)> = Vec::new();
    for (count, weight) in [(1u32, 50u64), (2, 20), (4, 15), (whole, 10), (3, 5)] {
        if count == 0 || count > whole {
            continue;
        }
        // The whole-node count may coincide with a smaller one (e.g. 4 schedulable GPUs): merge weights.
        match mix.iter_mut().find(|(c, _)| *c == count) {
            Some((_, w)) => *w += weight,
            None => mix.push((count, weight)),
        }
    }
    mix
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn simulate(args: &SimulateArgs) -> Result<(String, bool), String> {
    let d = ResourceDomain::default();
    let (template, topology) = node_template(args.gpus_per_node.max(1))?;
    let cluster = MemoryCluster::new().without_event_log();
    let config = ExtenderConfig { emit_events: false, ..ExtenderConfig::default() };
    let clock = Arc::new(ManualClock::new(1_700_000_000_000_000_000));
    let stages = Arc::new(StageHistograms::default());
    let ext = Extender::new(cluster.clone(), clock.clone(), config).with_observer(stages.clone());
    ext.attach();
    let mut names = CandidateNames::with_capacity(args.nodes, args.nodes * 10);
    let mut inventories = BTreeMap::new();
    for n in 0..args.nodes {
        let name = format!("node-{n:05}");
        let devices: Vec<GpuDevice> = template
            .iter()
            .map(|g| {
                let mut g = g.clone();
                g.uuid = format!("GPU-{n:05}-{:02}", g.index);
                g
            })
            .collect();
        let inv = NodeDeviceInventory::new(devices);
        let node = vgpu_node(&name, &inv, &NodeVgpuConfig::default(), Some(&topology), &d)
            .map_err(|e| e.to_string())?;
        cluster.upsert_node(node);
        names.push(&name);
        inventories.insert(name, inv);
    }
    let rt = tokio::runtime::Builder::new_current_thread().build().map_err(|e| e.to_string())?;
    rt.block_on(ext.sync()).map_err(|e| e.to_string())?;

    let mut rng = Rng(args.seed);
    let numbers = gpu_count_mix(template.iter().filter(|g| g.is_schedulable()).count());
    if numbers.is_empty() {
        return Err("the node description has no schedulable GPU".into());
    }
    let cores = [(0u32, 20), (10, 15), (25, 20), (50, 25), (100, 20)];
    let memory = [(0u64, 30), (4096, 20), (8192, 20), (20480, 20), (40960, 10)];
    let mut progress = Progress::new(args.pods as u64, "pods");
    let mut latencies = Vec::with_capacity(args.pods);
    let mut placed = 0usize;
    let mut rejected: BTreeMap<String, usize> = BTreeMap::new();
    let started = Instant::now();
    for i in 0..args.pods {
        let ann = vec![
            (d.node_scheduler_policy(), rng.choose(&args.node_policy, &POLICIES).to_owned()),
            (d.device_scheduler_policy(), rng.choose(&args.device_policy, &POLICIES).to_owned()),
            (d.device_topology_mode(), rng.choose(&args.topology_mode, &MODES).to_owned()),
        ];
        let pod = vgpu_pod(
            &format!("sim-{i}"),
            *rng.pick(&numbers),
            *rng.pick(&cores),
            *rng.pick(&memory),
            &ann,
            &d,
        );
        let pod = cluster.upsert_pod(pod);
        // The server gets the candidates as an owned list from the request body; copying them is not filter time.
        let candidates = names.clone();
        let sched = crate::stages::thread_schedstat();
        let t = Instant::now();
        let r = rt.block_on(ext.filter(Some(&pod), candidates));
        let took = t.elapsed();
        stages.record_sched(sched);
        stages.record("filter", took);
        let tried = r.failed_nodes().filter(|f| f.code != ReasonCode::AlreadyScheduledElsewhere).count();
        stages.record_count("nodes_tried", tried + r.passed().len());
        latencies.push(took.as_nanos() as u64);
        clock.advance(1_000_000);
        if let Some(node) = r.passed().next() {
            let t = Instant::now();
            let b = rt.block_on(ext.bind(&pod.namespace, &pod.name, &pod.uid, node));
            stages.record("bind", t.elapsed());
            if b.error.is_empty() {
                placed += 1;
            } else {
                *rejected.entry(format!("bind: {}", b.error)).or_default() += 1;
            }
        } else if !r.error.is_empty() {
            *rejected.entry(r.error).or_default() += 1;
        } else {
            let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
            for f in r.failed_nodes() {
                *counts.entry(f.reason.as_ref()).or_default() += 1;
            }
            let top =
                counts.into_iter().max_by_key(|(_, c)| *c).map(|(k, _)| k.to_owned()).unwrap_or_default();
            *rejected.entry(top).or_default() += 1;
        }
        progress.inc();
    }
    let elapsed = started.elapsed().as_secs_f64();
    progress.finish();

    // Ground truth from the cluster's bound pods, independent of the cache.
    let mut used: BTreeMap<(String, u32), (u32, u64, u64)> = BTreeMap::new();
    for p in cluster.pods() {
        let (Some(node), Some(v)) = (&p.node_name, p.annotations.get(&d.pre_allocated())) else { continue };
        let claim = pod_devices::decode_pre_allocated(v).map_err(|e| e.to_string())?;
        for c in claim.devices() {
            let e = used.entry((node.clone(), c.index)).or_default();
            e.0 += 1;
            e.1 += c.cores;
            e.2 += c.memory_mib;
        }
    }
    let mut violations = 0usize;
    let (mut cap_c, mut cap_m, mut use_c, mut use_m, mut gpus_used, mut partial) =
        (0u64, 0u64, 0u64, 0u64, 0u64, 0u64);
    for (name, inv) in &inventories {
        for g in inv.schedulable() {
            let u = used.get(&(name.clone(), g.index)).copied().unwrap_or_default();
            if u.0 > g.split_count || u.1 > g.cores || u.2 > g.memory_mib {
                violations += 1;
            }
            cap_c += g.cores;
            cap_m += g.memory_mib;
            use_c += u.1;
            use_m += u.2;
            if u.0 > 0 {
                gpus_used += 1;
                if u.1 < g.cores && u.2 < g.memory_mib {
                    partial += 1;
                }
            }
        }
    }
    // GPUs used by pods but absent from the inventory would be violations too.
    violations +=
        used.keys().filter(|(n, i)| inventories.get(n).and_then(|inv| inv.get(*i)).is_none()).count();
    let mut sorted = latencies.clone();
    sorted.sort_unstable();
    let pct = |a: u64, b: u64| if b == 0 { 0.0 } else { 100.0 * a as f64 / b as f64 };
    let summary = json!({
        "nodes": args.nodes,
        "gpus_per_node": args.gpus_per_node,
        "pods": args.pods,
        "seed": args.seed,
        "gpu_count_mix": numbers.iter().map(|(c, w)| json!({ "gpus": c, "weight": w })).collect::<Vec<_>>(),
        "placed": placed,
        "rejected": rejected.values().sum::<usize>(),
        "rejected_by_reason": rejected,
        "core_utilization_pct": pct(use_c, cap_c),
        "memory_utilization_pct": pct(use_m, cap_m),
        "gpus_in_use": gpus_used,
        "fragmentation_pct": pct(partial, gpus_used),
        "filter_p50_us": percentile(&sorted, 0.5) as f64 / 1000.0,
        "filter_p99_us": percentile(&sorted, 0.99) as f64 / 1000.0,
        "stages": stages.to_json(),
        "counts": stages.counts_json(),
        "filters_per_second": if elapsed > 0.0 { args.pods as f64 / elapsed } else { 0.0 },
        "overcommitted_gpus": violations,
        "overcommit_ok": violations == 0,
    });
    let text = if args.json {
        format!("{summary:#}\n")
    } else {
        let mut s = format!(
            "Simulated {} nodes x {} GPUs, {} pods (seed {})\n",
            args.nodes, args.gpus_per_node, args.pods, args.seed
        );
        let mix: Vec<String> = numbers.iter().map(|(c, w)| format!("{c} GPU x{w}")).collect();
        s.push_str(&format!("  pod mix:   {} (weights; whole node = schedulable GPUs)\n", mix.join(", ")));
        s.push_str(&format!("  placed:    {placed}\n  rejected:  {}\n", rejected.values().sum::<usize>()));
        for (reason, n) in &rejected {
            s.push_str(&format!("    {n:>6}  {reason}\n"));
        }
        s.push_str(&format!(
            "  utilization: cores {:.1}%, memory {:.1}%, {gpus_used} GPUs in use\n",
            pct(use_c, cap_c),
            pct(use_m, cap_m)
        ));
        s.push_str(&format!(
            "  fragmentation: {:.1}% of used GPUs partially filled\n",
            pct(partial, gpus_used)
        ));
        s.push_str(&format!(
            "  filter latency: p50 {:.1} us, p99 {:.1} us, {:.0} filters/s\n",
            percentile(&sorted, 0.5) as f64 / 1000.0,
            percentile(&sorted, 0.99) as f64 / 1000.0,
            if elapsed > 0.0 { args.pods as f64 / elapsed } else { 0.0 }
        ));
        s.push_str("  per-stage latency:\n");
        s.push_str(&stages.to_text());
        s.push_str(&format!(
            "  over-commit check: {}\n",
            if violations == 0 { "ok".to_owned() } else { format!("VIOLATED on {violations} GPUs") }
        ));
        s
    };
    Ok((text, violations == 0))
}

#[cfg(test)]
mod tests {
    use super::gpu_count_mix;

    #[test]
    fn whole_node_requests_fit_the_schedulable_gpus() {
        assert_eq!(gpu_count_mix(8), [(1, 50), (2, 20), (4, 15), (8, 10), (3, 5)]);
        assert_eq!(gpu_count_mix(7), [(1, 50), (2, 20), (4, 15), (7, 10), (3, 5)]);
        assert_eq!(gpu_count_mix(16), [(1, 50), (2, 20), (4, 15), (8, 10), (3, 5)]);
        assert_eq!(gpu_count_mix(4), [(1, 50), (2, 20), (4, 25), (3, 5)]);
        assert_eq!(gpu_count_mix(1), [(1, 60)]);
        assert!(gpu_count_mix(0).is_empty());
    }
}
