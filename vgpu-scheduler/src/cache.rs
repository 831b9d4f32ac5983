//! The cluster cache: decoded nodes and per-node GPU usage kept incrementally from watch events, plus the
//! filter's in-flight reservations.
//!
//! Usage of a node is a [`NodeUsage`] keyed by pod UID. A pod is counted on its planned node (`spec.nodeName`,
//! else `predicate-node`) with its `pre-allocated` (else `real-allocated`) claim while
//! [`should_count`](crate::prealloc::should_count) says so; terminal and deleted pods release. A reservation is
//! taken by the filter under the node's lock in the same critical section as the allocation that chose it, so
//! two filters can never hand out the same capacity; it holds until the bind writes the pre-allocation (the
//! patched pod's own counting replaces it), and is released on a failed bind or expiry. Lock order: index, then node.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use vgpu_core::alloc::{NodeFailure, NodeUsage, PodFootprint, ReasonCode, decode_node};
use vgpu_core::domain::ResourceDomain;
use vgpu_core::model::{PodDeviceClaim, TopologyMode};

use crate::cluster::{Node, Pod, WatchEvent};
use crate::decoded::{DecodedNode, decode_links};
use crate::names::CandidateNames;
use crate::node_index::{NodeEntry, NodeIndex};
use crate::node_state::{NodeSlot, NodeState};
use crate::prealloc::{self, Counting};
use crate::rank_table::{RankTable, RowReader};

#[derive(Debug)]
struct PodRecord {
    pod: Arc<Pod>,
    counted: Option<(String, PodFootprint)>,
    /// Distinct GPU UUIDs of the planned claim, kept only for counted pods in a sibling group.
    uuids: Vec<String>,
}

/// A sibling group for cross-pod alignment: a gang, or the pods of one controller.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Group {
    Gang(String),
    Owner(String),
}

/// The groups a pod is indexed under (its gang and its controller, when set).
/// A pod upsert worked out before the pod index is locked ([`ClusterCache::upsert_pods`]).
struct PodUpdate {
    pod: Pod,
    counted: Option<(String, PodFootprint)>,
    until: Option<i64>,
    groups: Vec<Group>,
    uuids: Vec<String>,
}

fn groups_of(pod: &Pod) -> Vec<Group> {
    let mut g = Vec::new();
    if let Some(gang) = &pod.gang {
        g.push(Group::Gang(gang.clone()));
    }
    if let Some(owner) = &pod.owner_uid {
        g.push(Group::Owner(owner.clone()));
    }
    g
}

/// The group whose members are a pod's siblings: its gang, else its controller.
fn sibling_group(pod: &Pod) -> Option<Group> {
    match (&pod.gang, &pod.owner_uid) {
        (Some(gang), _) => Some(Group::Gang(gang.clone())),
        (None, Some(owner)) => Some(Group::Owner(owner.clone())),
        (None, None) => None,
    }
}

#[derive(Debug, Default)]
struct Index {
    pods: HashMap<String, PodRecord>,
    /// uid → (node, expiry) of the in-flight reservation.
    reservations: HashMap<String, (String, i64)>,
    /// uid → distinct GPU UUIDs of an in-flight reservation of a pod in a sibling group (cross-pod alignment
    /// sees a sibling from its filter on, before its bind writes the pre-allocation).
    reserved_uuids: HashMap<String, Vec<String>>,
    /// (deadline, uid, is_reservation).
    deadlines: BTreeSet<(i64, String, bool)>,
    /// pods whose planned node is not (yet) in the cache.
    orphans: HashMap<String, BTreeSet<String>>,
    /// sibling group → member UIDs.
    groups: HashMap<Group, BTreeSet<String>>,
}

impl Index {
    fn forget_reservation(&mut self, uid: &str) {
        self.reservations.remove(uid);
        self.reserved_uuids.remove(uid);
    }

    fn ungroup(&mut self, group: &Group, uid: &str) {
        if let Some(members) = self.groups.get_mut(group) {
            members.remove(uid);
            if members.is_empty() {
                self.groups.remove(group);
            }
        }
    }
}

fn distinct_uuids(claim: &PodDeviceClaim) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for d in claim.devices() {
        if !out.contains(&d.uuid) {
            out.push(d.uuid.clone());
        }
    }
    out
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Decoded nodes, incremental usage and reservations. Thread-safe; see the module docs.
#[derive(Debug)]
pub struct ClusterCache {
    domain: ResourceDomain,
    grace_ns: i64,
    /// Node slots by name, rank-table rows by name fingerprint ([`crate::node_index`]).
    nodes: RwLock<NodeIndex>,
    /// Every node state's ranking inputs, one dense row each ([`crate::rank_table`]).
    rows: RankTable,
    index: Mutex<Index>,
    /// Whether `node-device-topology` is read (gate `TopologyAwareGPUAllocation`).
    link_topology: bool,
    /// Seeds of the decode-input fingerprints ([`NodeState`]'s `inputs`).
    prints: InputPrints,
}

/// Two independently, randomly seeded hashers: a node's decode-input fingerprint is both hashes side by side.
/// An annotation change goes unnoticed only if the old and new inputs collide in all 128 bits, with
/// probability about 2⁻¹²⁸ per update.
#[derive(Debug, Default)]
struct InputPrints {
    high: foldhash::quality::RandomState,
    low: foldhash::quality::RandomState,
}

impl InputPrints {
    fn of(&self, inputs: &([Option<&String>; 4], bool)) -> u128 {
        use std::hash::BuildHasher;
        (u128::from(self.high.hash_one(inputs)) << 64) | u128::from(self.low.hash_one(inputs))
    }
}

impl ClusterCache {
    /// An empty cache for a domain and a default stuck grace period; it reads `node-device-topology`
    /// (see [`with_link_topology`](Self::with_link_topology)).
    pub fn new(domain: ResourceDomain, stuck_grace_ns: i64) -> Self {
        Self {
            domain,
            grace_ns: stuck_grace_ns,
            nodes: RwLock::default(),
            rows: RankTable::new(),
            index: Mutex::default(),
            link_topology: true,
            prints: InputPrints::default(),
        }
    }

    /// Whether nodes' `node-device-topology` is read (gate `TopologyAwareGPUAllocation`; set before any node
    /// is added). Off, the annotation is never decoded and its changes never re-decode a node: every node
    /// looks as if it published no link topology, so link fitness is 0 in every rank-table row, link-mode
    /// placement takes its no-topology path and cross-pod alignment finds no NVLink component.
    pub fn with_link_topology(mut self, on: bool) -> Self {
        self.link_topology = on;
        self
    }

    /// Whether nodes' `node-device-topology` is read.
    pub fn link_topology(&self) -> bool {
        self.link_topology
    }

    /// The annotation domain.
    pub fn domain(&self) -> &ResourceDomain {
        &self.domain
    }

    /// The default stuck grace period, ns.
    pub fn grace_ns(&self) -> i64 {
        self.grace_ns
    }

    /// One node's slot.
    pub fn node(&self, name: &str) -> Option<NodeSlot> {
        self.nodes.read().unwrap_or_else(std::sync::PoisonError::into_inner).get(name).map(|e| e.slot.clone())
    }

    /// Slots of the named nodes (`None` for a name the cache does not hold), in input order.
    pub fn nodes<'a>(&self, names: impl IntoIterator<Item = &'a str>) -> Vec<Option<NodeSlot>> {
        let map = self.nodes.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        names.into_iter().map(|n| map.get(n).map(|e| e.slot.clone())).collect()
    }

    /// A reader of the rank table (rows by the ids of [`candidate_rows`](Self::candidate_rows)).
    pub fn rank_rows(&self) -> RowReader {
        self.rows.reader()
    }

    /// The rank-table row ids of a candidate list, per input position ([`NO_ROW`](crate::rank_table::NO_ROW) for a name the cache does not
    /// hold): one fingerprint lookup per name (module `node_index`). Ids only, no slot references: ranking
    /// reads rows, and a filter looks up the slots of the few nodes it tries.
    pub fn candidate_rows(&self, names: &CandidateNames) -> Vec<u32> {
        self.candidate_rows_at(names).0
    }

    /// [`candidate_rows`](Self::candidate_rows) and the [`node_generation`](Self::node_generation) they were
    /// resolved at (under the same read lock).
    pub fn candidate_rows_at(&self, names: &CandidateNames) -> (Vec<u32>, u64) {
        let map = self.nodes.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        (map.rows_of(names), map.generation())
    }

    /// A counter that changes whenever a node is added or removed: rows resolved at a generation are still
    /// every name's row while the generation is the same (a node update keeps its row).
    pub fn node_generation(&self) -> u64 {
        self.nodes.read().unwrap_or_else(std::sync::PoisonError::into_inner).generation()
    }

    /// A node's decoded annotations, when it is cached and decoded.
    pub fn decoded(&self, name: &str) -> Option<Arc<DecodedNode>> {
        let slot = self.node(name)?;
        lock(&slot).decoded.as_ref().ok().cloned()
    }

    /// Fills a node's fitness table for a mode into its row (on the locked node, so a concurrent re-decode
    /// cannot leave a stale table behind); the entry for `need`.
    pub fn fill_fitness(&self, name: &str, mode: TopologyMode, need: u32) -> Option<u8> {
        let slot = self.node(name)?;
        lock(&slot).fill_fitness(mode, need)
    }

    fn all_slots(&self) -> Vec<NodeSlot> {
        let map = self.nodes.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        map.iter().map(|(_, e)| e.slot.clone()).collect()
    }

    /// Number of nodes held.
    pub fn node_count(&self) -> usize {
        self.nodes.read().unwrap_or_else(std::sync::PoisonError::into_inner).len()
    }

    /// Every node name, sorted.
    pub fn node_names(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .nodes
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .map(|(n, _)| n.clone())
            .collect();
        v.sort_unstable();
        v
    }

    /// A pod by UID.
    pub fn pod(&self, uid: &str) -> Option<Arc<Pod>> {
        lock(&self.index).pods.get(uid).map(|r| r.pod.clone())
    }

    /// The node a pod is counted on, if any.
    pub fn counted_node(&self, uid: &str) -> Option<String> {
        lock(&self.index).pods.get(uid).and_then(|r| r.counted.as_ref().map(|c| c.0.clone()))
    }

    /// The placements of a pod's gang siblings — pods of the same gang, or, for a pod without a gang, of the same
    /// controller — other than the pod itself, while counted or reserved: (planned node, distinct GPU UUIDs of
    /// the planned claim, or of the reservation a filter took and its bind has not written yet). Served from an index kept on pod events (no scan); empty for a pod with neither gang nor
    /// controller.
    pub fn sibling_placements(&self, pod: &Pod) -> Vec<(String, Vec<String>)> {
        let Some(group) = sibling_group(pod) else { return Vec::new() };
        let idx = lock(&self.index);
        let Some(members) = idx.groups.get(&group) else { return Vec::new() };
        members
            .iter()
            .filter(|u| **u != pod.uid)
            .filter_map(|u| idx.pods.get(u))
            .filter_map(|r| match r.counted.as_ref() {
                Some((node, _)) => (!r.uuids.is_empty()).then(|| (node.clone(), r.uuids.clone())),
                None => {
                    let (node, _) = idx.reservations.get(&r.pod.uid)?;
                    let uuids = idx.reserved_uuids.get(&r.pod.uid)?;
                    Some((node.clone(), uuids.clone()))
                }
            })
            .collect()
    }

    /// Pods counted on a node.
    pub fn pods_on(&self, node: &str) -> Vec<Arc<Pod>> {
        let uids: Vec<String> = match self.node(node) {
            Some(slot) => lock(&slot).pods.iter().cloned().collect(),
            None => return Vec::new(),
        };
        let idx = lock(&self.index);
        uids.iter().filter_map(|u| idx.pods.get(u).map(|r| r.pod.clone())).collect()
    }

    /// Loads a snapshot (initial list).
    pub fn load(&self, nodes: Vec<Node>, pods: Vec<Pod>, now_ns: i64) {
        for n in nodes {
            self.upsert_node(&n);
        }
        for p in pods {
            self.upsert_pod(p, now_ns);
        }
    }

    /// Applies one watch event.
    pub fn apply(&self, event: &WatchEvent, now_ns: i64) {
        match event {
            WatchEvent::NodeUpserted(n) => self.upsert_node(n),
            WatchEvent::NodeDeleted(n) => self.delete_node(n),
            WatchEvent::PodUpserted(p) => self.upsert_pod(p.clone(), now_ns),
            WatchEvent::PodDeleted(p) => self.delete_pod(&p.uid),
        }
    }

    /// What a node's decoded state depends on: the annotations the cache reads (device register, config,
    /// topology unless link topology is off, GPU domain) and whether the node advertises vGPUs.
    fn decode_inputs<'n>(&self, node: &'n Node) -> ([Option<&'n String>; 4], bool) {
        let d = &self.domain;
        let mut raw =
            [d.node_device_register(), d.node_config_info(), d.node_device_topology(), d.node_gpu_domain()]
                .map(|key| node.annotations.get(&key));
        if !self.link_topology {
            raw[2] = None;
        }
        (raw, node.allocatable.get(&d.vgpu_number()).is_some_and(|&n| n > 0))
    }

    fn decode(&self, node: &Node) -> (u128, Result<Arc<DecodedNode>, NodeFailure>) {
        let inputs = self.decode_inputs(node);
        let print = self.prints.of(&inputs);
        let (raw, enabled) = inputs;
        let raw = raw.map(|r| r.map(String::as_str));
        let decoded = if !enabled {
            Err(NodeFailure::new(ReasonCode::NodeNotVgpuEnabled))
        } else {
            decode_node(raw[0], raw[1]).map(|(inv, cfg)| {
                let links = raw[2].and_then(|t| decode_links(&node.name, t));
                DecodedNode::new(inv, cfg, links, raw[3])
            })
        };
        (print, decoded)
    }

    /// Adds or updates a node; usage is kept across updates and re-derived only when the annotations change.
    pub fn upsert_node(&self, node: &Node) {
        if let Some(slot) = self.node(&node.name) {
            let mut s = lock(&slot);
            if s.inputs != self.prints.of(&self.decode_inputs(node)) {
                let (inputs, decoded) = self.decode(node);
                s.inputs = inputs;
                s.decoded = decoded;
                s.row.reset_fitness();
                s.recompute();
            }
            return;
        }
        let (inputs, decoded) = self.decode(node);
        let mut state = NodeState {
            name: node.name.clone(),
            decoded,
            inputs,
            usage: NodeUsage::new(),
            row: self.rows.alloc(),
            reserved: BTreeMap::new(),
            pods: BTreeSet::new(),
        };
        let mut idx = lock(&self.index);
        if let Some(orphans) = idx.orphans.remove(&node.name) {
            for uid in orphans {
                if let Some((n, fp)) = idx.pods.get(&uid).and_then(|r| r.counted.clone())
                    && n == node.name
                {
                    state.usage.insert_pod(uid.clone(), fp);
                    state.pods.insert(uid);
                }
            }
        }
        state.recompute();
        let row = state.row.id();
        let mut map = self.nodes.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        map.insert(node.name.clone(), NodeEntry { slot: Arc::new(Mutex::new(state)), row });
    }

    /// Removes a node; its pods stay indexed and are re-attached if it comes back.
    pub fn delete_node(&self, name: &str) {
        let removed = {
            let mut map = self.nodes.write().unwrap_or_else(std::sync::PoisonError::into_inner);
            map.remove(name)
        };
        if let Some(NodeEntry { slot, .. }) = removed {
            let mut idx = lock(&self.index);
            let s = lock(&slot);
            let pods: Vec<String> = s.pods.iter().cloned().collect();
            idx.orphans.entry(name.to_owned()).or_default().extend(pods);
        }
    }

    fn counting_of(&self, pod: &Pod, now_ns: i64) -> (Option<(String, PodFootprint)>, Option<i64>) {
        if pod.phase.is_terminal() {
            return (None, None);
        }
        let Some(node) = prealloc::planned_node(pod, &self.domain) else { return (None, None) };
        let counting = prealloc::should_count(pod, &self.domain, self.grace_ns);
        if !counting.at(now_ns) {
            return (None, None);
        }
        let Some(claim) = prealloc::planned_claim(pod, &self.domain) else { return (None, None) };
        let until = match counting {
            Counting::Until(t) => Some(t),
            _ => None,
        };
        (Some((node.to_owned(), prealloc::footprint(pod, &claim))), until)
    }

    /// Adds or updates a pod (events older than the held resource version are ignored; version 0 means unknown
    /// and always applies).
    pub fn upsert_pod(&self, pod: Pod, now_ns: i64) {
        let update = self.pod_update(pod, now_ns);
        self.apply_pod_update(&mut lock(&self.index), update);
    }

    /// [`upsert_pod`](Self::upsert_pod) of several pods in order, under one lock of the pod index (a watch
    /// event batch: the events one read of the watch stream brought). What each pod's annotations mean is
    /// worked out before the lock is taken, as for one pod.
    pub fn upsert_pods(&self, pods: impl IntoIterator<Item = Pod>, now_ns: i64) {
        let updates: Vec<PodUpdate> = pods.into_iter().map(|p| self.pod_update(p, now_ns)).collect();
        let mut idx = lock(&self.index);
        for update in updates {
            self.apply_pod_update(&mut idx, update);
        }
    }

    /// The part of a pod upsert that needs no lock: where it counts, until when, its groups and reserved GPUs.
    fn pod_update(&self, pod: Pod, now_ns: i64) -> PodUpdate {
        let (counted, until) = self.counting_of(&pod, now_ns);
        let groups = groups_of(&pod);
        let uuids = match (&counted, groups.is_empty()) {
            (Some(_), false) => {
                prealloc::planned_claim(&pod, &self.domain).map(|c| distinct_uuids(&c)).unwrap_or_default()
            }
            _ => Vec::new(),
        };
        PodUpdate { pod, counted, until, groups, uuids }
    }

    fn apply_pod_update(&self, idx: &mut Index, update: PodUpdate) {
        let PodUpdate { pod, counted, until, groups, uuids } = update;
        let old = idx.pods.get(&pod.uid);
        if let Some(old) = old
            && pod.resource_version != 0
            && old.pod.resource_version > pod.resource_version
        {
            return;
        }
        let old_counted = old.and_then(|r| r.counted.clone());
        let old_groups = old.map(|r| groups_of(&r.pod)).unwrap_or_default();
        let uid = pod.uid.clone();
        for g in old_groups.iter().filter(|g| !groups.contains(g)) {
            idx.ungroup(g, &uid);
        }
        for g in groups {
            idx.groups.entry(g).or_default().insert(uid.clone());
        }
        // Take away the old counting where it moved or vanished.
        if let Some((old_node, _)) = &old_counted
            && counted.as_ref().is_none_or(|(n, _)| n != old_node)
        {
            self.uncount(idx, old_node, &uid);
        }
        if let Some((node, fp)) = &counted {
            // A reservation elsewhere is superseded by the pod's own metadata.
            if let Some((rnode, _)) = idx.reservations.get(&uid).cloned()
                && &rnode != node
            {
                self.drop_reservation(idx, &uid, None);
            }
            idx.forget_reservation(&uid);
            match self.node(node) {
                Some(slot) => {
                    let mut s = lock(&slot);
                    s.reserved.remove(&uid);
                    s.insert(&uid, fp.clone());
                    s.pods.insert(uid.clone());
                }
                None => {
                    idx.orphans.entry(node.clone()).or_default().insert(uid.clone());
                }
            }
            if let Some(t) = until {
                idx.deadlines.insert((t, uid.clone(), false));
            }
        }
        idx.pods.insert(uid, PodRecord { pod: Arc::new(pod), counted, uuids });
    }

    fn uncount(&self, idx: &mut Index, node: &str, uid: &str) {
        if let Some(o) = idx.orphans.get_mut(node) {
            o.remove(uid);
        }
        if let Some(slot) = self.node(node) {
            let mut s = lock(&slot);
            s.pods.remove(uid);
            if !s.reserved.contains_key(uid) {
                s.remove(uid);
            }
        }
    }

    /// Removes a pod and everything it held.
    pub fn delete_pod(&self, uid: &str) {
        let mut idx = lock(&self.index);
        if let Some(rec) = idx.pods.remove(uid) {
            for g in groups_of(&rec.pod) {
                idx.ungroup(&g, uid);
            }
            if let Some((node, _)) = rec.counted {
                self.uncount(&mut idx, &node, uid);
            }
        }
        self.drop_reservation(&mut idx, uid, None);
    }

    /// Takes a reservation on a locked node (the caller just allocated under the same lock).
    pub fn reserve_locked(&self, state: &mut NodeState, uid: &str, footprint: PodFootprint, expires_ns: i64) {
        state.insert(uid, footprint);
        state.reserved.insert(uid.to_owned(), expires_ns);
    }

    /// Records a reservation taken with [`reserve_locked`](Self::reserve_locked) for expiry (call after
    /// releasing the node lock).
    pub fn track_reservation(&self, node: &str, uid: &str, expires_ns: i64) {
        self.track(node, uid, expires_ns, Vec::new());
    }

    /// [`track_reservation`](Self::track_reservation) that also records the reserved GPUs of `claim` (its
    /// distinct UUIDs), so that the pod's siblings align with it
    /// ([`sibling_placements`](Self::sibling_placements)) before its pre-allocation is written.
    pub fn track_reservation_of(&self, node: &str, uid: &str, expires_ns: i64, claim: &PodDeviceClaim) {
        self.track(node, uid, expires_ns, distinct_uuids(claim));
    }

    fn track(&self, node: &str, uid: &str, expires_ns: i64, uuids: Vec<String>) {
        let mut idx = lock(&self.index);
        let still = self.node(node).is_some_and(|s| lock(&s).reserved.get(uid) == Some(&expires_ns));
        if still {
            idx.reservations.insert(uid.to_owned(), (node.to_owned(), expires_ns));
            idx.deadlines.insert((expires_ns, uid.to_owned(), true));
            if uuids.is_empty() {
                idx.reserved_uuids.remove(uid);
            } else {
                idx.reserved_uuids.insert(uid.to_owned(), uuids);
            }
        }
    }

    /// Moves a pod's in-flight reservation to a new expiry (a bind keeps the GPUs while it waits for its turn
    /// and its write). False when the pod holds no reservation.
    pub fn renew_reservation(&self, uid: &str, expires_ns: i64) -> bool {
        let mut idx = lock(&self.index);
        let Some((node, old)) = idx.reservations.get(uid).cloned() else { return false };
        let Some(slot) = self.node(&node) else { return false };
        match lock(&slot).reserved.get_mut(uid) {
            Some(e) if *e == old => *e = expires_ns,
            _ => return false,
        }
        idx.deadlines.remove(&(old, uid.to_owned(), true));
        idx.deadlines.insert((expires_ns, uid.to_owned(), true));
        if let Some(r) = idx.reservations.get_mut(uid) {
            r.1 = expires_ns;
        }
        true
    }

    /// The nodes whose usage counts this pod: where it is counted (planned or bound) and where it holds a
    /// reservation (usually none when a pod is filtered).
    pub fn nodes_counting(&self, uid: &str) -> Vec<String> {
        let idx = lock(&self.index);
        let counted = idx.pods.get(uid).and_then(|r| r.counted.as_ref()).map(|(n, _)| n.clone());
        counted.into_iter().chain(idx.reservations.get(uid).map(|(n, _)| n.clone())).collect()
    }

    /// A pod's in-flight reservation: (node, expiry in Unix ns), while it holds.
    pub fn reservation(&self, uid: &str) -> Option<(String, i64)> {
        lock(&self.index).reservations.get(uid).cloned()
    }

    /// Releases a pod's reservation (patch failure); the pod's own counting, if any, is restored.
    pub fn release(&self, node: &str, uid: &str) {
        let mut idx = lock(&self.index);
        idx.forget_reservation(uid);
        self.release_on(&mut idx, node, uid, None);
    }

    fn drop_reservation(&self, idx: &mut Index, uid: &str, only_if: Option<i64>) {
        if let Some((node, exp)) = idx.reservations.get(uid).cloned()
            && only_if.is_none_or(|t| t == exp)
        {
            idx.forget_reservation(uid);
            self.release_on(idx, &node, uid, Some(exp));
        }
    }

    fn release_on(&self, idx: &mut Index, node: &str, uid: &str, only_if: Option<i64>) {
        let Some(slot) = self.node(node) else { return };
        let mut s = lock(&slot);
        match s.reserved.get(uid) {
            Some(&e) if only_if.is_none_or(|t| t == e) => {
                s.reserved.remove(uid);
                match idx.pods.get(uid).and_then(|r| r.counted.clone()) {
                    Some((n, fp)) if n == node => s.insert(uid, fp),
                    _ => s.remove(uid),
                }
            }
            _ => {}
        }
    }

    /// Expires reservations and stuck pre-allocations whose deadline is before `now_ns`.
    pub fn sweep(&self, now_ns: i64) {
        let mut idx = lock(&self.index);
        while let Some(first) = idx.deadlines.first().cloned() {
            if first.0 >= now_ns {
                break;
            }
            idx.deadlines.pop_first();
            let (t, uid, is_reservation) = first;
            if is_reservation {
                self.drop_reservation(&mut idx, &uid, Some(t));
            } else {
                let pod = idx.pods.get(&uid).map(|r| r.pod.clone());
                if let Some(pod) = pod {
                    let (counted, _) = self.counting_of(&pod, now_ns);
                    if counted.is_none()
                        && let Some(rec) = idx.pods.get_mut(&uid)
                        && let Some((node, _)) = rec.counted.take()
                    {
                        self.uncount(&mut idx, &node, &uid);
                    }
                }
            }
        }
    }

    /// Reservations in flight (for tests and diagnostics).
    pub fn reservation_count(&self) -> usize {
        lock(&self.index).reservations.len()
    }

    /// Pods indexed.
    pub fn pod_count(&self) -> usize {
        lock(&self.index).pods.len()
    }

    /// Every indexed pod (the cache driver compares them with a re-list).
    pub fn pods(&self) -> Vec<Arc<Pod>> {
        lock(&self.index).pods.values().map(|r| r.pod.clone()).collect()
    }

    /// Every node's usage snapshot: (name, decoded node, usage).
    pub fn usage_snapshot(&self) -> Vec<(String, Option<Arc<DecodedNode>>, NodeUsage)> {
        let slots = self.all_slots();
        let mut out: Vec<_> = slots
            .iter()
            .map(|s| {
                let s = lock(s);
                (s.name.clone(), s.decoded.as_ref().ok().cloned(), s.usage.clone())
            })
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// Keys (UIDs) counted per node: pods and reservations.
    pub fn counted(&self) -> BTreeMap<String, usize> {
        let slots = self.all_slots();
        slots
            .iter()
            .map(|s| {
                let s = lock(s);
                (s.name.clone(), s.usage.pod_count())
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use vgpu_core::codec::node_gpu_domain::{self, GpuRails};
    use vgpu_core::model::GpuDevice;
    use vgpu_core::topology::DeviceTopology;

    use vgpu_core::codec::pod_devices;

    use super::*;
    use crate::decoded::FITNESS_LEN;
    use crate::fixture::{vgpu_node, vgpu_pod};
    use crate::rank_table::{NO_ROW, RankInputs, RowFitness, RowStatus};
    use vgpu_core::alloc::{GpuFree, NodeDomains, NodeView, gate_inputs};
    use vgpu_core::model::{NodeDeviceInventory, NodeVgpuConfig};

    #[test]
    fn candidate_rows_follow_node_adds_and_deletes() {
        let cache = ClusterCache::new(ResourceDomain::default(), 0);
        let named = |name: &str| Node { name: name.to_owned(), ..node(None) };
        for n in ["a", "b"] {
            cache.upsert_node(&named(n));
        }
        let row_of = |n: &str| lock(&cache.node(n).unwrap()).row_id();
        let list = |v: &[&str]| CandidateNames::from(v);
        assert_eq!(cache.candidate_rows(&list(&["a", "b", "x"])), [row_of("a"), row_of("b"), NO_ROW]);
        assert_eq!(cache.candidate_rows(&list(&["ab", "x", "b"])), [NO_ROW, NO_ROW, row_of("b")]);
        // A node update keeps its row.
        let a = row_of("a");
        cache.upsert_node(&named("a"));
        assert_eq!(row_of("a"), a);
        cache.upsert_node(&named("x"));
        assert_eq!(cache.candidate_rows(&list(&["x"])), [row_of("x")]);
        let old_b = cache.node("b").unwrap();
        cache.delete_node("b");
        assert_eq!(cache.candidate_rows(&list(&["a", "b"])), [a, NO_ROW]);
        // Deleted and re-added while the old state is still held (an in-flight call): a new row, never the old one.
        cache.upsert_node(&named("b"));
        let readded = cache.candidate_rows(&list(&["b"]))[0];
        assert_ne!(readded, lock(&old_b).row_id());
        assert_eq!(readded, row_of("b"));
        // Once the old state is gone, its row is reused by the next new node.
        let freed = lock(&old_b).row_id();
        drop(old_b);
        cache.upsert_node(&named("c"));
        assert_eq!(row_of("c"), freed);
    }

    fn node(rails: Option<&str>) -> Node {
        let d = ResourceDomain::default();
        let inv = NodeDeviceInventory::new(
            (0..4)
                .map(|i| GpuDevice {
                    index: i,
                    uuid: format!("G{i}"),
                    memory_mib: 1024,
                    cores: 100,
                    split_count: 2,
                    ..Default::default()
                })
                .collect(),
        );
        // NVLink inside 0-1 and inside 2-3.
        let topo = DeviceTopology::decode(
            r#"[{"index":0,"links":{"1":[7]}},{"index":1,"links":{"0":[7]}},
                {"index":2,"links":{"3":[7]}},{"index":3,"links":{"2":[7]}}]"#,
        )
        .unwrap();
        let mut n = vgpu_node("n", &inv, &NodeVgpuConfig::default(), Some(&topo), &d).unwrap();
        if let Some(r) = rails {
            n.annotations.insert(d.node_gpu_domain(), r.to_owned());
        }
        n
    }

    fn domains(cache: &ClusterCache) -> NodeDomains {
        let slot = cache.node("n").unwrap();
        let s = lock(&slot);
        NodeDomains::clone(&s.decoded.as_ref().unwrap().domains)
    }

    #[test]
    fn node_generation_changes_exactly_when_rows_may_move() {
        let cache = ClusterCache::new(ResourceDomain::default(), 0);
        let g0 = cache.node_generation();
        cache.upsert_node(&node(None));
        let g1 = cache.node_generation();
        assert_ne!(g1, g0, "a new node");
        let names = CandidateNames::from(["n", "absent"]);
        let (rows, at) = cache.candidate_rows_at(&names);
        assert_eq!(at, g1);
        assert_ne!(rows[0], NO_ROW);
        assert_eq!(rows[1], NO_ROW);
        // An update (annotations changed, node re-decoded) keeps the row and the generation.
        cache.upsert_node(&node(Some("{not json")));
        assert_eq!(cache.node_generation(), g1);
        assert_eq!(cache.candidate_rows(&names), rows);
        // A delete (and deleting an absent node: no change), then the node again: new generations.
        cache.delete_node("absent");
        assert_eq!(cache.node_generation(), g1);
        cache.delete_node("n");
        let g2 = cache.node_generation();
        assert_ne!(g2, g1);
        cache.upsert_node(&node(None));
        assert_ne!(cache.node_generation(), g2);
    }

    #[test]
    fn domains_are_derived_on_first_read_as_the_eager_form() {
        let cache = ClusterCache::new(ResourceDomain::default(), 0);
        let rails = r#"{"G0":"r0","G1":"r0","G2":"r1","G3":"r1"}"#;
        cache.upsert_node(&node(Some(rails)));
        let d = cache.decoded("n").unwrap();
        assert!(d.domains.domains.get().is_none(), "not derived before the first read");
        let eager =
            NodeDomains::new(&d.inventory, d.links.as_ref(), Some(&node_gpu_domain::decode(rails).unwrap()));
        assert_eq!(*d.domains, eager);
        assert!(d.domains.domains.get().is_some());
    }

    #[test]
    fn node_gpu_domain_is_decoded_per_node_change_and_bad_json_ignored() {
        let cache = ClusterCache::new(ResourceDomain::default(), 0);
        cache.upsert_node(&node(None));
        let plain = domains(&cache);
        assert_eq!(plain.components(), [vec![0, 1], vec![2, 3]]);
        assert_eq!((plain.signature(1), plain.rail_key(2)), (Some("ord:1"), Some("idx:2")));
        // Bad JSON: treated as absent.
        cache.upsert_node(&node(Some("{not json")));
        assert_eq!(domains(&cache), plain);
        // A complete map is used; the node is re-decoded when only this annotation changes.
        let rails: GpuRails = (0..4).map(|i| (format!("G{i}"), format!("r{}", 3 - i))).collect();
        cache.upsert_node(&node(Some(&node_gpu_domain::encode(&rails))));
        let railed = domains(&cache);
        assert_eq!((railed.signature(1), railed.rail_key(2)), (Some("rail:r0,r1"), Some("rail:r1")));
        // A map missing a GPU is not trusted.
        let partial: GpuRails = rails.into_iter().take(3).collect();
        cache.upsert_node(&node(Some(&node_gpu_domain::encode(&partial))));
        assert_eq!(domains(&cache), plain);
    }

    #[test]
    fn link_topology_off_never_decodes_the_topology() {
        let cache = ClusterCache::new(ResourceDomain::default(), 0).with_link_topology(false);
        assert!(!cache.link_topology());
        cache.upsert_node(&node(None));
        let first = cache.decoded("n").unwrap();
        assert!(first.links.is_none());
        assert!(first.domains.components().is_empty());
        assert_eq!(cache.fill_fitness("n", TopologyMode::Link, 2), Some(0), "no topology: fitness 0");
        let row = cache
            .rank_rows()
            .get(lock(&cache.node("n").unwrap()).row_id())
            .unwrap()
            .fitness(TopologyMode::Link, 2);
        assert_eq!(row, RowFitness::Known(0));
        // A change of the topology annotation alone does not re-decode the node.
        let mut changed = node(None);
        changed.annotations.insert(ResourceDomain::default().node_device_topology(), "[]".to_owned());
        cache.upsert_node(&changed);
        assert!(Arc::ptr_eq(&first, &cache.decoded("n").unwrap()));
        // The same node with the gate on has its links and a higher fitness.
        let on = ClusterCache::new(ResourceDomain::default(), 0);
        on.upsert_node(&node(None));
        assert!(on.decoded("n").unwrap().links.is_some());
        assert_eq!(on.fill_fitness("n", TopologyMode::Link, 2), Some(5));
    }

    fn placed(uid: &str, gang: Option<&str>, owner: Option<&str>, claim: Option<&str>) -> Pod {
        let d = ResourceDomain::default();
        let mut p = vgpu_pod(uid, 1, 0, 0, &[], &d);
        p.gang = gang.map(str::to_owned);
        p.owner_uid = owner.map(str::to_owned);
        if let Some(c) = claim {
            p.annotations.insert(d.pre_allocated(), c.to_owned());
            p.annotations.insert(d.predicate_node(), "n".to_owned());
        }
        p
    }

    #[test]
    fn sibling_index_follows_pod_events() {
        let cache = ClusterCache::new(ResourceDomain::default(), 0);
        cache.upsert_node(&node(None));
        let me = placed("me", Some("ns/g"), Some("rs"), None);
        cache.upsert_pod(placed("a", Some("ns/g"), None, Some("main[0_G0_0_1024,1_G1_0_1024]")), 0);
        cache.upsert_pod(placed("b", Some("ns/g"), Some("rs"), Some("main[1_G1_0_1024];x[1_G1_0_1024]")), 0);
        cache.upsert_pod(placed("c", None, Some("rs"), Some("main[2_G2_0_1024]")), 0);
        cache.upsert_pod(placed("d", Some("ns/g"), None, None), 0);
        cache.upsert_pod(me.clone(), 0);
        let mut got = cache.sibling_placements(&me);
        got.sort();
        assert_eq!(
            got,
            [
                ("n".to_owned(), vec!["G0".to_owned(), "G1".to_owned()]),
                ("n".to_owned(), vec!["G1".to_owned()])
            ],
            "gang members only, placed ones only, self excluded, UUIDs distinct"
        );
        // Without a gang, the controller's pods are the siblings.
        let orphan = placed("o", None, Some("rs"), None);
        let mut got: Vec<Vec<String>> = cache.sibling_placements(&orphan).into_iter().map(|p| p.1).collect();
        got.sort();
        assert_eq!(got, [vec!["G1".to_owned()], vec!["G2".to_owned()]]);
        assert!(cache.sibling_placements(&placed("z", None, None, None)).is_empty());
        // Leaving the gang, losing the placement, and deletion all update the index.
        cache.upsert_pod(placed("a", Some("ns/other"), None, Some("main[0_G0_0_1024]")), 0);
        cache.upsert_pod(placed("b", Some("ns/g"), Some("rs"), None), 0);
        assert!(cache.sibling_placements(&me).is_empty());
        assert_eq!(cache.sibling_placements(&placed("q", Some("ns/other"), None, None)).len(), 1);
        cache.delete_pod("a");
        cache.delete_pod("c");
        assert!(cache.sibling_placements(&placed("q", Some("ns/other"), None, None)).is_empty());
        assert!(cache.sibling_placements(&orphan).is_empty());
        assert!(lock(&cache.index).groups.keys().all(|g| *g != Group::Gang("ns/other".into())));
    }

    #[derive(Debug, Clone)]
    enum Op {
        Node(usize, u8),
        DeleteNode(usize),
        Pod(usize, usize, u32, u32),
        DeletePod(usize),
        Reserve(usize, usize, u32),
        Release(usize, usize),
        Sweep(i64),
        Fitness(usize, bool, u32),
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            (0..3usize, 0..4u8).prop_map(|(n, v)| Op::Node(n, v)),
            (0..3usize).prop_map(Op::DeleteNode),
            (0..6usize, 0..3usize, 0..4u32, 0..2u32).prop_map(|(p, n, g, k)| Op::Pod(p, n, g, k)),
            (0..6usize).prop_map(Op::DeletePod),
            (0..6usize, 0..3usize, 0..4u32).prop_map(|(p, n, g)| Op::Reserve(p, n, g)),
            (0..6usize, 0..3usize).prop_map(|(p, n)| Op::Release(p, n)),
            (0..40i64).prop_map(Op::Sweep),
            (0..3usize, any::<bool>(), 0..20u32).prop_map(|(n, l, need)| Op::Fitness(n, l, need)),
        ]
    }

    /// Node variants: 0 and 1 differ in annotations only (rails), 2 in size and memory, 3 is not vGPU-enabled.
    fn variant(name: &str, v: u8) -> Node {
        let d = ResourceDomain::default();
        let mut n = match v {
            0 => node(None),
            1 => node(Some(r#"{"G0":"r0","G1":"r0","G2":"r1","G3":"r1"}"#)),
            _ => vgpu_node(
                "n",
                &NodeDeviceInventory::uniform(6, 2048, 3),
                &NodeVgpuConfig::default(),
                None,
                &d,
            )
            .expect("fixture node encodes"),
        };
        if v == 3 {
            n.allocatable.remove(&d.vgpu_number());
        }
        Node { name: name.to_owned(), ..n }
    }

    fn pod_on(uid: &str, node: &str, gpu: u32, cores: u32) -> Pod {
        let d = ResourceDomain::default();
        let mut p = vgpu_pod(uid, 1, 0, 0, &[], &d);
        let uuid = if gpu < 4 { format!("G{gpu}") } else { format!("GPU-{gpu}") };
        p.annotations.insert(d.pre_allocated(), format!("main[{gpu}_{uuid}_{}_256]", cores * 25));
        p.annotations.insert(d.predicate_node(), node.to_owned());
        p.node_name = Some(node.to_owned());
        p
    }

    /// Every live node's row says what its locked state says, and no two nodes share a row.
    fn check_rows(cache: &ClusterCache) -> Result<(), String> {
        let reader = cache.rank_rows();
        let map = cache.nodes.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut ids = BTreeSet::new();
        for (name, e) in map.iter() {
            let s = lock(&e.slot);
            if s.row_id() != e.row || !ids.insert(e.row) {
                return Err(format!("{name}: row {} in the index, {} in the state", e.row, s.row_id()));
            }
            let row = reader.get(e.row).ok_or(format!("{name}: row {} not readable", e.row))?;
            match (&s.decoded, row.status()) {
                (Ok(d), RowStatus::Ready) => {
                    let view = NodeView {
                        name: &s.name,
                        inventory: &d.inventory,
                        config: &d.config,
                        links: d.links.as_ref(),
                        usage: &s.usage,
                    };
                    let gates = gate_inputs(&view);
                    let checks = d.config.device_split != 0 && d.config.memory_factor != 0;
                    let want = RankInputs {
                        avail: gates.avail,
                        totals: d.totals,
                        key: d.resolve_key(),
                        gates: checks.then_some(gates),
                    };
                    if row.inputs() != want {
                        return Err(format!("{name}: row {:?}, state {want:?}", row.inputs()));
                    }
                    let gpus: Vec<GpuFree> =
                        d.inventory.devices.iter().map(|g| GpuFree::of(g, s.usage.device(g.index))).collect();
                    let lane: Option<Vec<GpuFree>> = row.inputs_with_gpus().1.map(|l| l.iter().collect());
                    if checks && lane.as_ref() != Some(&gpus) {
                        return Err(format!("{name}: lane {lane:?}, state {gpus:?}"));
                    }
                    for mode in [TopologyMode::Link, TopologyMode::Numa] {
                        let table = d.fitness_table(&s.name, mode).ok_or("no table")?;
                        for need in 0..FITNESS_LEN as u32 + 2 {
                            let want = table[(need as usize).min(FITNESS_LEN - 1)];
                            match row.fitness(mode, need) {
                                RowFitness::Unknown => {}
                                RowFitness::Known(f) if f == want => {}
                                other => {
                                    return Err(format!(
                                        "{name}: fitness {mode:?}/{need} {other:?}, want {want}"
                                    ));
                                }
                            }
                        }
                    }
                }
                (Err(f), RowStatus::Failed(c)) if f.code == c => {}
                (state, row) => return Err(format!("{name}: state {state:?}, row {row:?}")),
            }
        }
        Ok(())
    }

    proptest::proptest! {
        /// Under any sequence of node, pod, reservation and sweep events, the rank table mirrors the node states.
        #[test]
        fn rank_rows_follow_node_states(ops in proptest::collection::vec(op(), 1..60)) {
            let cache = ClusterCache::new(ResourceDomain::default(), 10);
            let names = ["n0", "n1", "n2"];
            for (i, op) in ops.into_iter().enumerate() {
                match op {
                    Op::Node(n, v) => cache.upsert_node(&variant(names[n], v)),
                    Op::DeleteNode(n) => cache.delete_node(names[n]),
                    Op::Pod(p, n, g, k) => cache.upsert_pod(pod_on(&format!("p{p}"), names[n], g, k), i as i64),
                    Op::DeletePod(p) => cache.delete_pod(&format!("p{p}")),
                    Op::Reserve(p, n, g) => {
                        if let Some(slot) = cache.node(names[n]) {
                            let uid = format!("p{p}");
                            let claim = pod_devices::decode_pre_allocated(&format!("main[{g}_G{g}_25_256]"))
                                .expect("claim decodes");
                            let fp = PodFootprint::from_claim(&claim);
                            cache.reserve_locked(&mut lock(&slot), &uid, fp, i as i64 + 5);
                            cache.track_reservation(names[n], &uid, i as i64 + 5);
                        }
                    }
                    Op::Release(p, n) => cache.release(names[n], &format!("p{p}")),
                    Op::Sweep(t) => cache.sweep(t),
                    Op::Fitness(n, link, need) => {
                        let mode = if link { TopologyMode::Link } else { TopologyMode::Numa };
                        cache.fill_fitness(names[n], mode, need);
                    }
                }
                if let Err(e) = check_rows(&cache) {
                    return Err(proptest::test_runner::TestCaseError::fail(format!("after op {i}: {e}")));
                }
            }
        }
    }
}
