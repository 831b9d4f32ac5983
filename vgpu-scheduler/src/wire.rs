//! The kube-scheduler extender wire types (`k8s.io/kube-scheduler/extender/v1`) and their conversions to and
//! from the [`Extender`](crate::Extender) results.
//!
//! The upstream structs carry no json tags, so the JSON keys are the Go field names (`Pod`, `NodeNames`,
//! `FailedNodes`, …) and nothing is omitted when empty: a nil pointer or map is written as `null`. These types
//! write the same shape. Reading is lenient like Go's decoder: `null` where a list, map or string is expected
//! means empty, unknown keys are ignored, and the all-lowercase spelling of each key is accepted too (Go matches
//! keys case-insensitively; the scheduler itself sends the exact names).
//!
//! Writing a filter answer: [`ExtenderFilterResult::to_json`] writes the same bytes as `serde_json::to_vec`,
//! faster. A live filter over thousands of candidates answers with every rejected node's name and reason,
//! and serde_json checks each byte of each string against its escape table; here a string that needs no
//! escape (every node name: DNS names never do) is checked in one vectorized pass and copied whole, and only
//! strings with a quote, a backslash or a control character go through serde_json.
//!
//! Form of a filter answer: with `nodeCacheCapable: true` the scheduler sends `NodeNames` and reads `NodeNames`
//! back; otherwise it sends `Nodes` (a full `NodeList`) and reads `Nodes`, filtered the same way
//! ([`ExtenderFilterResult::from_result`]).

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ListMeta;
use serde::de::{MapAccess, Visitor};
use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::extender::{BindResult, FilterResult, PreemptResult};
use crate::names::CandidateNames;

/// `MinExtenderPriority`: the lowest prioritize score.
pub const MIN_EXTENDER_PRIORITY: i64 = 0;
/// `MaxExtenderPriority`: the highest prioritize score.
pub const MAX_EXTENDER_PRIORITY: i64 = 10;

/// A request that decodes but cannot be served as sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// A node of `Nodes.items` has no `metadata.name`.
    #[error("ExtenderArgs.Nodes.items[{index}] has no metadata.name; expected every node to be named")]
    UnnamedNode {
        /// Position in `Nodes.items`.
        index: usize,
    },
}

fn none<T>() -> Option<T> {
    None
}

/// A JSON `null` (or an absent field, with `#[serde(default)]`) reads as `T::default()`, as Go's decoder leaves it.
pub(crate) fn null_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Option::unwrap_or_default)
}

fn map_null_values<'de, D, V>(d: D) -> Result<BTreeMap<String, V>, D::Error>
where
    D: Deserializer<'de>,
    V: Default + Deserialize<'de>,
{
    let m = Option::<BTreeMap<String, Option<V>>>::deserialize(d)?;
    Ok(m.unwrap_or_default().into_iter().map(|(k, v)| (k, v.unwrap_or_default())).collect())
}

fn vec_skip_null<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    let v = Option::<Vec<Option<T>>>::deserialize(d)?;
    Ok(v.unwrap_or_default().into_iter().flatten().collect())
}

/// `*v1.NodeList` as the scheduler writes it: `{"metadata":{},"items":[…]}` (type meta usually absent).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeList {
    /// `apiVersion` (`v1` when present).
    #[serde(rename = "apiVersion", default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    /// `kind` (`NodeList` when present).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// `metadata` (always written, as Go does for a struct field).
    #[serde(default, deserialize_with = "null_default")]
    pub metadata: ListMeta,
    /// `items`.
    #[serde(default, deserialize_with = "vec_skip_null")]
    pub items: Vec<Node>,
}

/// `ExtenderArgs`: the body of filter, filter-dryrun and prioritize.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ExtenderArgs<P = Pod> {
    /// `Pod`: the pod being scheduled (k8s-openapi's `Pod` by default; the server decodes an
    /// [`ApiPod`](crate::api_pod::ApiPod), only the fields it reads).
    #[serde(rename = "Pod", alias = "pod", default = "none")]
    pub pod: Option<P>,
    /// `Nodes`: candidate nodes (only when the extender is not `nodeCacheCapable`).
    #[serde(rename = "Nodes", alias = "nodes", default)]
    pub nodes: Option<NodeList>,
    /// `NodeNames`: candidate node names (only when the extender is `nodeCacheCapable`), decoded into one
    /// buffer ([`CandidateNames`]).
    #[serde(rename = "NodeNames", alias = "nodenames", default)]
    pub node_names: Option<CandidateNames>,
}

impl<P> ExtenderArgs<P> {
    /// [`candidate_names`](Self::candidate_names) without copying `NodeNames`: the list is moved out and an empty
    /// one left in its place, so the answer's form ([`ExtenderFilterResult::from_result`]) is unchanged.
    pub fn take_candidate_names(&mut self) -> Result<CandidateNames, WireError> {
        match &mut self.node_names {
            Some(names) => Ok(std::mem::take(names)),
            None => self.candidate_names(),
        }
    }

    /// The candidate node names: `NodeNames` when sent, else the names of `Nodes.items`, else none.
    pub fn candidate_names(&self) -> Result<CandidateNames, WireError> {
        if let Some(names) = &self.node_names {
            return Ok(names.clone());
        }
        let mut out = CandidateNames::new();
        let Some(list) = &self.nodes else { return Ok(out) };
        for (index, n) in list.items.iter().enumerate() {
            match n.metadata.name.as_deref().filter(|s| !s.is_empty()) {
                Some(name) => out.push(name),
                None => return Err(WireError::UnnamedNode { index }),
            }
        }
        Ok(out)
    }
}

/// A Go `map[string]string` of node name → reason (`FailedNodes`), kept as a list in the order the entries were
/// produced: it is written as a JSON object without building a map, which matters for a live filter answer that
/// rejects thousands of nodes. The names are positions in one [`CandidateNames`] (for a filter answer, the
/// request's own list, moved in: no `String` per node). Reading accepts an object or `null`; a repeated key
/// keeps its last value, as Go's decoder does.
#[derive(Clone, Default)]
pub struct NodeReasons {
    names: CandidateNames,
    /// Position in `names`, reason.
    entries: Vec<(usize, Cow<'static, str>)>,
}

impl NodeReasons {
    /// Entries by position in `names` (each position valid, as [`FilterResult`]'s are).
    pub(crate) fn at_positions(names: CandidateNames, entries: Vec<(usize, Cow<'static, str>)>) -> Self {
        Self { names, entries }
    }

    /// Appends a node and its reason (the caller keeps nodes distinct).
    pub fn push(&mut self, node: &str, reason: impl Into<Cow<'static, str>>) {
        self.names.push(node);
        self.entries.push((self.names.len() - 1, reason.into()));
    }

    /// The reason of a node, if listed.
    pub fn get(&self, node: &str) -> Option<&str> {
        self.iter().find(|(n, _)| *n == node).map(|(_, r)| r)
    }

    /// Number of nodes listed.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no node is listed.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// `(node, reason)` pairs in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = (&str, &str)> + Clone + '_ {
        self.entries.iter().map(|(p, r)| (self.names.get(*p).unwrap_or_default(), r.as_ref()))
    }
}

impl PartialEq for NodeReasons {
    /// The same `(node, reason)` pairs in the same order.
    fn eq(&self, other: &Self) -> bool {
        self.iter().eq(other.iter())
    }
}

impl Eq for NodeReasons {}

impl fmt::Debug for NodeReasons {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl<N: AsRef<str>, R: Into<Cow<'static, str>>> FromIterator<(N, R)> for NodeReasons {
    fn from_iter<I: IntoIterator<Item = (N, R)>>(iter: I) -> Self {
        let mut out = Self::default();
        for (n, r) in iter {
            out.push(n.as_ref(), r);
        }
        out
    }
}

impl Serialize for NodeReasons {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.len()))?;
        for (node, reason) in self.iter() {
            map.serialize_entry(node, reason)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for NodeReasons {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ReasonsVisitor;
        impl<'de> Visitor<'de> for ReasonsVisitor {
            type Value = NodeReasons;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object of node name to reason string, or null")
            }

            fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
                Ok(NodeReasons::default())
            }

            fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
                Ok(NodeReasons::default())
            }

            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
                d.deserialize_map(self)
            }

            fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Self::Value, A::Error> {
                let mut out = NodeReasons::default();
                let mut seen: BTreeMap<String, usize> = BTreeMap::new();
                while let Some((node, reason)) = access.next_entry::<String, Option<String>>()? {
                    let reason = Cow::Owned(reason.unwrap_or_default());
                    match seen.get(&node) {
                        Some(&i) => out.entries[i].1 = reason,
                        None => {
                            seen.insert(node.clone(), out.entries.len());
                            out.push(&node, reason);
                        }
                    }
                }
                Ok(out)
            }
        }
        deserializer.deserialize_option(ReasonsVisitor)
    }
}

/// `ExtenderFilterResult`: the answer of filter and filter-dryrun.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ExtenderFilterResult {
    /// `Nodes`: passed nodes, when the request sent `Nodes`.
    #[serde(rename = "Nodes", alias = "nodes", default)]
    pub nodes: Option<NodeList>,
    /// `NodeNames`: passed node names, when the request sent `NodeNames`.
    #[serde(rename = "NodeNames", alias = "nodenames", default)]
    pub node_names: Option<CandidateNames>,
    /// `FailedNodes`: node → reason.
    #[serde(rename = "FailedNodes", alias = "failednodes", default)]
    pub failed_nodes: NodeReasons,
    /// `FailedAndUnresolvableNodes`: node → reason, where preemption would not help (never set by vgpu).
    #[serde(rename = "FailedAndUnresolvableNodes", alias = "failedandunresolvablenodes", default)]
    pub failed_and_unresolvable_nodes: Option<BTreeMap<String, String>>,
    /// `Error`: whole-call error, `""` on success.
    #[serde(rename = "Error", alias = "error", default, deserialize_with = "null_default")]
    pub error: String,
}

/// Whether serde_json writes `s` between quotes unchanged: no `"`, `\` or control character (serde_json's
/// compact formatter escapes exactly those).
fn needs_no_escape(s: &str) -> bool {
    // Without short-circuit, so the loop vectorizes.
    s.bytes().fold(true, |plain, b| plain & (b >= 0x20) & (b != b'"') & (b != b'\\'))
}

/// Whether two strings are equal, comparing the pointers first (the live filter's reasons are the same
/// `&'static` phrase over and over).
fn same_str(a: &str, b: &str) -> bool {
    (a.as_ptr() == b.as_ptr() && a.len() == b.len()) || a == b
}

/// Appends `s` as a JSON string, as serde_json writes it.
fn write_json_str(out: &mut Vec<u8>, s: &str) -> Result<(), serde_json::Error> {
    if needs_no_escape(s) {
        out.reserve(s.len() + 2);
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
        Ok(())
    } else {
        serde_json::to_writer(out, s)
    }
}

/// Appends `name` as a JSON string, as serde_json writes it; `plain`: every name of its list is known to need
/// no escape (one [`needs_no_escape`] over the list's whole text).
fn write_name(out: &mut Vec<u8>, name: &str, plain: bool) -> Result<(), serde_json::Error> {
    if plain {
        out.push(b'"');
        out.extend_from_slice(name.as_bytes());
        out.push(b'"');
        Ok(())
    } else {
        write_json_str(out, name)
    }
}

impl NodeReasons {
    /// Appends the JSON object of these reasons, as serde_json writes it.
    fn write_json(&self, out: &mut Vec<u8>) -> Result<(), serde_json::Error> {
        out.push(b'{');
        let plain = needs_no_escape(self.names.text());
        // The live filter gives most nodes the same phrase: a reason equal to the previous one is copied from
        // the previous one's output.
        let mut last: Option<(&str, std::ops::Range<usize>)> = None;
        for (i, (node, reason)) in self.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            write_name(out, node, plain)?;
            out.push(b':');
            match &last {
                Some((prev, range)) if same_str(prev, reason) => out.extend_from_within(range.clone()),
                _ => {
                    let start = out.len();
                    write_json_str(out, reason)?;
                    last = Some((reason, start..out.len()));
                }
            }
        }
        out.push(b'}');
        Ok(())
    }
}

impl ExtenderFilterResult {
    /// The answer's JSON: exactly the bytes of `serde_json::to_vec(self)`, written faster for the live
    /// filter's long `FailedNodes` (module docs).
    pub fn to_json(&self) -> Result<Vec<u8>, serde_json::Error> {
        let names_len = self.node_names.as_ref().map_or(0, |n| n.text().len() + 3 * n.len());
        let estimate = 128
            + self.error.len()
            + names_len
            + self.failed_nodes.iter().map(|(n, r)| n.len() + r.len() + 6).sum::<usize>();
        let mut out = Vec::with_capacity(estimate);
        out.extend_from_slice(b"{\"Nodes\":");
        serde_json::to_writer(&mut out, &self.nodes)?;
        out.extend_from_slice(b",\"NodeNames\":");
        match &self.node_names {
            None => out.extend_from_slice(b"null"),
            Some(names) => {
                let plain = needs_no_escape(names.text());
                out.push(b'[');
                for (i, n) in names.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    write_name(&mut out, n, plain)?;
                }
                out.push(b']');
            }
        }
        out.extend_from_slice(b",\"FailedNodes\":");
        self.failed_nodes.write_json(&mut out)?;
        out.extend_from_slice(b",\"FailedAndUnresolvableNodes\":");
        serde_json::to_writer(&mut out, &self.failed_and_unresolvable_nodes)?;
        out.extend_from_slice(b",\"Error\":");
        write_json_str(&mut out, &self.error)?;
        out.push(b'}');
        Ok(out)
    }

    /// A whole-call error (every other field `null`), as vgpu-manager answers.
    pub fn error(message: impl Into<String>) -> Self {
        Self { error: message.into(), ..Self::default() }
    }

    /// The answer to `args` from an extender result, in the request's form: `NodeNames` in → `NodeNames` out;
    /// `Nodes` in → the sent node objects that passed, in request order, each once (the first of repeated
    /// objects). An error result carries only `Error`.
    pub fn from_result<P>(args: &ExtenderArgs<P>, result: FilterResult) -> Self {
        if !result.error.is_empty() {
            return Self::error(result.error);
        }
        let passed_names: CandidateNames = result.passed().collect();
        let failed = result.failed.into_iter().map(|f| (f.pos, f.reason)).collect();
        let failed_nodes = NodeReasons::at_positions(result.names, failed);
        let mut out = Self { failed_nodes, ..Self::default() };
        match (&args.node_names, &args.nodes) {
            (None, Some(list)) => {
                // Each passed node once, even if the request repeated its object.
                let mut passed: BTreeSet<&str> = passed_names.iter().collect();
                let items = list
                    .items
                    .iter()
                    .filter(|n| n.metadata.name.as_deref().is_some_and(|name| passed.remove(name)))
                    .cloned()
                    .collect();
                out.nodes = Some(NodeList { metadata: ListMeta::default(), items, ..NodeList::default() });
            }
            _ => out.node_names = Some(passed_names),
        }
        out
    }
}

/// `HostPriority`: one node's prioritize score.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostPriority {
    /// `Host`: node name.
    #[serde(rename = "Host", alias = "host", default, deserialize_with = "null_default")]
    pub host: String,
    /// `Score`: [`MIN_EXTENDER_PRIORITY`]..=[`MAX_EXTENDER_PRIORITY`].
    #[serde(rename = "Score", alias = "score", default)]
    pub score: i64,
}

/// `HostPriorityList`: the answer of prioritize (a bare JSON array).
pub type HostPriorityList = Vec<HostPriority>;

impl From<crate::extender::HostPriority> for HostPriority {
    fn from(h: crate::extender::HostPriority) -> Self {
        Self { host: h.host, score: h.score.clamp(MIN_EXTENDER_PRIORITY, MAX_EXTENDER_PRIORITY) }
    }
}

/// `ExtenderBindingArgs`: the body of bind.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExtenderBindingArgs {
    /// `PodName`.
    #[serde(rename = "PodName", alias = "podname", default, deserialize_with = "null_default")]
    pub pod_name: String,
    /// `PodNamespace`.
    #[serde(rename = "PodNamespace", alias = "podnamespace", default, deserialize_with = "null_default")]
    pub pod_namespace: String,
    /// `PodUID`.
    #[serde(rename = "PodUID", alias = "poduid", default, deserialize_with = "null_default")]
    pub pod_uid: String,
    /// `Node`: the target node.
    #[serde(rename = "Node", alias = "node", default, deserialize_with = "null_default")]
    pub node: String,
}

/// `ExtenderBindingResult`: the answer of bind.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExtenderBindingResult {
    /// `Error`: `""` on success.
    #[serde(rename = "Error", alias = "error", default, deserialize_with = "null_default")]
    pub error: String,
}

impl From<BindResult> for ExtenderBindingResult {
    fn from(r: BindResult) -> Self {
        Self { error: r.error }
    }
}

/// `Victims`: full victim pods of one node.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Victims {
    /// `Pods`.
    #[serde(rename = "Pods", alias = "pods", default, deserialize_with = "vec_skip_null")]
    pub pods: Vec<Pod>,
    /// `NumPDBViolations`.
    #[serde(
        rename = "NumPDBViolations",
        alias = "numpdbviolations",
        default,
        deserialize_with = "null_default"
    )]
    pub num_pdb_violations: i64,
}

/// `MetaPod`: a victim by UID.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaPod {
    /// `UID`.
    #[serde(rename = "UID", alias = "uid", default, deserialize_with = "null_default")]
    pub uid: String,
}

/// `MetaVictims`: victim UIDs of one node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaVictims {
    /// `Pods`.
    #[serde(rename = "Pods", alias = "pods", default, deserialize_with = "vec_skip_null")]
    pub pods: Vec<MetaPod>,
    /// `NumPDBViolations`.
    #[serde(
        rename = "NumPDBViolations",
        alias = "numpdbviolations",
        default,
        deserialize_with = "null_default"
    )]
    pub num_pdb_violations: i64,
}

/// `ExtenderPreemptionArgs`: the body of preempt.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ExtenderPreemptionArgs {
    /// `Pod`: the preemptor.
    #[serde(rename = "Pod", alias = "pod", default)]
    pub pod: Option<Pod>,
    /// `NodeNameToVictims`: full victims per node (extender not `nodeCacheCapable`).
    #[serde(
        rename = "NodeNameToVictims",
        alias = "nodenametovictims",
        default,
        deserialize_with = "map_null_values"
    )]
    pub node_name_to_victims: BTreeMap<String, Victims>,
    /// `NodeNameToMetaVictims`: victim UIDs per node (extender `nodeCacheCapable`).
    #[serde(
        rename = "NodeNameToMetaVictims",
        alias = "nodenametometavictims",
        default,
        deserialize_with = "map_null_values"
    )]
    pub node_name_to_meta_victims: BTreeMap<String, MetaVictims>,
}

impl ExtenderPreemptionArgs {
    /// Victim UIDs per candidate node, from `NodeNameToMetaVictims` where a node has an entry there, else from
    /// `NodeNameToVictims` (pods without a UID are skipped).
    pub fn victim_uids(&self) -> BTreeMap<String, Vec<String>> {
        let mut out: BTreeMap<String, Vec<String>> = self
            .node_name_to_victims
            .iter()
            .map(|(node, v)| {
                (node.clone(), v.pods.iter().filter_map(|p| p.metadata.uid.clone()).collect::<Vec<_>>())
            })
            .collect();
        for (node, v) in &self.node_name_to_meta_victims {
            out.insert(node.clone(), v.pods.iter().map(|p| p.uid.clone()).collect());
        }
        out
    }

    /// The `NumPDBViolations` the scheduler sent for a node (meta form first), 0 when absent.
    pub fn pdb_violations(&self, node: &str) -> i64 {
        self.node_name_to_meta_victims
            .get(node)
            .map(|v| v.num_pdb_violations)
            .or_else(|| self.node_name_to_victims.get(node).map(|v| v.num_pdb_violations))
            .unwrap_or(0)
    }
}

/// `ExtenderPreemptionResult`: the answer of preempt.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExtenderPreemptionResult {
    /// `NodeNameToMetaVictims`: victim UIDs per node that can host the preemptor.
    #[serde(
        rename = "NodeNameToMetaVictims",
        alias = "nodenametometavictims",
        default,
        deserialize_with = "map_null_values"
    )]
    pub node_name_to_meta_victims: BTreeMap<String, MetaVictims>,
}

impl ExtenderPreemptionResult {
    /// The answer to `args` from an extender result. `NumPDBViolations` per node is the count the extender
    /// made against the cluster's budgets ([`PreemptResult::pdb_violations`]); where it has none, the
    /// conservative upper bound of vgpu-manager: `min(sent, kept) + added`, where `kept` counts the sent
    /// victims still chosen and `added` the victims the extender added.
    pub fn from_result(args: &ExtenderPreemptionArgs, result: PreemptResult) -> Self {
        let sent = args.victim_uids();
        let counted = result.pdb_violations;
        let node_name_to_meta_victims = result
            .node_victims
            .into_iter()
            .map(|(node, uids)| {
                let before: BTreeSet<&str> =
                    sent.get(&node).map(|v| v.iter().map(String::as_str).collect()).unwrap_or_default();
                let kept = uids.iter().filter(|u| before.contains(u.as_str())).count();
                let added = uids.len() - kept;
                let kept = i64::try_from(kept).unwrap_or(i64::MAX);
                let added = i64::try_from(added).unwrap_or(i64::MAX);
                let num_pdb_violations = counted
                    .get(&node)
                    .copied()
                    .unwrap_or_else(|| args.pdb_violations(&node).min(kept).saturating_add(added));
                let pods = uids.into_iter().map(|uid| MetaPod { uid }).collect();
                (node, MetaVictims { pods, num_pdb_violations })
            })
            .collect();
        Self { node_name_to_meta_victims }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use vgpu_core::alloc::ReasonCode;

    fn node(name: &str) -> Node {
        let mut n = Node::default();
        n.metadata.name = Some(name.to_owned());
        n
    }

    #[test]
    fn filter_args_node_names_form() {
        let args: ExtenderArgs = serde_json::from_value(json!({
            "Pod": {"metadata": {"name": "p", "namespace": "ns", "uid": "u"}, "spec": {"containers": [{"name": "c"}]}},
            "Nodes": null,
            "NodeNames": ["n1", "n2"]
        }))
        .unwrap();
        assert_eq!(args.pod.as_ref().unwrap().metadata.uid.as_deref(), Some("u"));
        assert_eq!(args.candidate_names().unwrap(), ["n1", "n2"]);
        let mut r = FilterResult::default();
        r.push_short("n1", ReasonCode::InsufficientVgpuSlot);
        r.push_passed("n2");
        let out = serde_json::to_value(ExtenderFilterResult::from_result(&args, r)).unwrap();
        assert_eq!(
            out,
            json!({
                "Nodes": null,
                "NodeNames": ["n2"],
                "FailedNodes": {"n1": "Insufficient vGPU slots"},
                "FailedAndUnresolvableNodes": null,
                "Error": ""
            })
        );
    }

    #[test]
    fn filter_args_nodes_form_answers_with_nodes() {
        let args: ExtenderArgs = serde_json::from_value(json!({
            "Pod": {"metadata": {"name": "p"}},
            "Nodes": {"metadata": {}, "items": [{"metadata": {"name": "a"}}, {"metadata": {"name": "b"}}]}
        }))
        .unwrap();
        assert_eq!(args.node_names, None);
        assert_eq!(args.candidate_names().unwrap(), ["a", "b"]);
        let mut r = FilterResult::default();
        r.push_passed("b");
        let out = ExtenderFilterResult::from_result(&args, r);
        assert_eq!(out.node_names, None);
        assert_eq!(out.nodes.as_ref().unwrap().items, [node("b")]);
        assert_eq!(
            serde_json::to_value(&out).unwrap(),
            json!({
                "Nodes": {"metadata": {}, "items": [{"apiVersion": "v1", "kind": "Node", "metadata": {"name": "b"}}]},
                "NodeNames": null,
                "FailedNodes": {},
                "FailedAndUnresolvableNodes": null,
                "Error": ""
            })
        );
        let unnamed: ExtenderArgs = serde_json::from_value(
            json!({"Nodes": {"items": [{"metadata": {"name": "a"}}, {"metadata": {}}]}}),
        )
        .unwrap();
        assert_eq!(unnamed.candidate_names(), Err(WireError::UnnamedNode { index: 1 }));
        assert_eq!(
            unnamed.candidate_names().unwrap_err().to_string(),
            "ExtenderArgs.Nodes.items[1] has no metadata.name; expected every node to be named"
        );
    }

    #[test]
    fn filter_result_reads_nodes_by_position() {
        let mut a = FilterResult::default();
        a.push_short("n0", ReasonCode::NodeCacheMiss);
        a.push_passed("n1");
        a.push_failed("n2", ReasonCode::InsufficientVgpuSlot, "detail".to_owned());
        assert_eq!(a.node_names(), ["n1"]);
        assert_eq!(a.passed().len(), 1);
        assert_eq!(a.failure("n0"), Some("node missing from cache"));
        assert_eq!(a.failure("n2"), Some("detail"));
        assert_eq!(a.failure("n1"), None);
        let failed: Vec<_> = a.failed_nodes().map(|f| (f.node, f.code)).collect();
        assert_eq!(failed, [("n0", ReasonCode::NodeCacheMiss), ("n2", ReasonCode::InsufficientVgpuSlot)]);
        // Equal by content, whatever order the names went into the buffer.
        let mut b = FilterResult::default();
        b.push_passed("n1");
        b.push_short("n0", ReasonCode::NodeCacheMiss);
        b.push_failed("n2", ReasonCode::InsufficientVgpuSlot, "detail");
        assert_eq!(a, b);
        b.push_passed("n3");
        assert_ne!(a, b);
        assert_eq!(
            format!("{a:?}"),
            r#"FilterResult { node_names: ["n1"], failed_nodes: [FailedNode { node: "n0", code: NodeCacheMiss, reason: "node missing from cache" }, FailedNode { node: "n2", code: InsufficientVgpuSlot, reason: "detail" }], error: "" }"#
        );
        let all = FilterResult::all_passed(["a", "b"].into());
        assert_eq!(all.node_names(), ["a", "b"]);
        assert_eq!(all.failed_nodes().len(), 0);
        assert_eq!(FilterResult::failed_call("x").error, "x");
    }

    #[test]
    fn filter_error_carries_only_error() {
        let args: ExtenderArgs = ExtenderArgs { node_names: Some(["n1"].into()), ..ExtenderArgs::default() };
        let r = FilterResult::failed_call("No schedulable nodes");
        assert_eq!(
            serde_json::to_value(ExtenderFilterResult::from_result(&args, r)).unwrap(),
            json!({"Nodes": null, "NodeNames": null, "FailedNodes": {}, "FailedAndUnresolvableNodes": null,
                   "Error": "No schedulable nodes"})
        );
    }

    #[test]
    fn node_reasons_null_duplicates_and_order() {
        let r: ExtenderFilterResult = serde_json::from_str(r#"{"FailedNodes":null}"#).unwrap();
        assert!(r.failed_nodes.is_empty());
        let r: ExtenderFilterResult =
            serde_json::from_str(r#"{"FailedNodes":{"b":"x","a":null,"b":"y"}}"#).unwrap();
        assert_eq!(r.failed_nodes.iter().collect::<Vec<_>>(), [("b", "y"), ("a", "")]);
        let err = serde_json::from_str::<ExtenderFilterResult>(r#"{"FailedNodes":["a"]}"#).unwrap_err();
        assert!(err.to_string().contains("an object of node name to reason string"), "{err}");
        let written = serde_json::to_string(&NodeReasons::from_iter([("z", "r1"), ("a", "r2")])).unwrap();
        assert_eq!(written, r#"{"z":"r1","a":"r2"}"#);
    }

    proptest::proptest! {
        /// Any list of distinct nodes round-trips through JSON in order, and so does any `FilterResult`'s
        /// answer: its passed and failed nodes read back as they were put in.
        #[test]
        fn node_reasons_round_trip(entries in proptest::collection::btree_map("[a-z0-9.-]{1,12}", ".{0,20}", 0..20)) {
            let mut v: Vec<(String, String)> = entries.into_iter().collect();
            v.reverse();
            let reasons: NodeReasons = v.iter().cloned().collect();
            let back: NodeReasons = serde_json::from_str(&serde_json::to_string(&reasons).unwrap()).unwrap();
            proptest::prop_assert_eq!(&back, &reasons);
            proptest::prop_assert_eq!(back.iter().map(|(n, r)| (n.to_owned(), r.to_owned())).collect::<Vec<_>>(), v.clone());
            // The same entries as a filter's rejections (every other node passed), through the answer.
            let mut r = FilterResult::default();
            for (i, (n, reason)) in v.iter().enumerate() {
                r.push_failed(n, ReasonCode::NodeCacheMiss, reason.clone());
                r.push_passed(&format!("passed-{i}"));
            }
            let args: ExtenderArgs = ExtenderArgs { node_names: Some(CandidateNames::new()), ..ExtenderArgs::default() };
            let out = ExtenderFilterResult::from_result(&args, r);
            proptest::prop_assert_eq!(&out.failed_nodes, &reasons);
            let passed: Vec<String> = (0..v.len()).map(|i| format!("passed-{i}")).collect();
            proptest::prop_assert_eq!(out.node_names.as_ref().unwrap(), &passed);
            let bytes = out.to_json().unwrap();
            proptest::prop_assert_eq!(&bytes, &serde_json::to_vec(&out).unwrap());
            let back: ExtenderFilterResult = serde_json::from_slice(&bytes).unwrap();
            proptest::prop_assert_eq!(back, out);
        }
    }

    fn filter_result() -> impl proptest::strategy::Strategy<Value = ExtenderFilterResult> {
        use proptest::prelude::*;
        // Plain names, and any text (quotes, backslashes, control characters, non-ASCII) for the rest.
        let text =
            prop_oneof!["[a-z0-9.-]{0,12}", ".{0,12}", "[\"\\\\\\x00-\\x1f\\x7f a\\u{e9}\\u{1F600}]{0,8}"];
        let reasons = proptest::collection::vec(
            (text.clone(), prop_oneof![Just("node unschedulable".to_owned()), text.clone()]),
            0..12,
        );
        (
            proptest::option::of(proptest::collection::vec(text.clone(), 0..4)),
            reasons,
            proptest::option::of(proptest::collection::btree_map(text.clone(), text.clone(), 0..3)),
            text.clone(),
            proptest::option::of(proptest::collection::vec(text, 0..3)),
        )
            .prop_map(|(node_names, failed, unresolvable, error, nodes)| ExtenderFilterResult {
                nodes: nodes.map(|names| NodeList {
                    items: names.iter().map(|n| node(n)).collect(),
                    ..NodeList::default()
                }),
                node_names: node_names.map(CandidateNames::from),
                failed_nodes: failed.into_iter().collect(),
                failed_and_unresolvable_nodes: unresolvable,
                error,
            })
    }

    proptest::proptest! {
        /// The fast writer writes exactly serde_json's bytes, whatever the strings hold; and those are the bytes
        /// of the same answer held as plain `Vec<String>` and `BTreeMap`-free pairs (what the types held
        /// before the names moved into one buffer).
        #[test]
        fn to_json_is_serde_json(result in filter_result()) {
            let bytes = result.to_json().unwrap();
            proptest::prop_assert_eq!(&bytes, &serde_json::to_vec(&result).unwrap());
            let failed: Vec<(String, String)> =
                result.failed_nodes.iter().map(|(n, r)| (n.to_owned(), r.to_owned())).collect();
            let mut text = String::from("{");
            for (i, (n, r)) in failed.iter().enumerate() {
                if i > 0 {
                    text.push(',');
                }
                text.push_str(&serde_json::to_string(n).unwrap());
                text.push(':');
                text.push_str(&serde_json::to_string(r).unwrap());
            }
            text.push('}');
            let want = format!(
                "{{\"Nodes\":{},\"NodeNames\":{},\"FailedNodes\":{text},\"FailedAndUnresolvableNodes\":{},\"Error\":{}}}",
                serde_json::to_string(&result.nodes).unwrap(),
                serde_json::to_string(&result.node_names.as_ref().map(CandidateNames::to_vec)).unwrap(),
                serde_json::to_string(&result.failed_and_unresolvable_nodes).unwrap(),
                serde_json::to_string(&result.error).unwrap(),
            );
            proptest::prop_assert_eq!(String::from_utf8(bytes).unwrap(), want);
        }
    }

    #[test]
    fn to_json_of_a_live_answer() {
        let args: ExtenderArgs =
            ExtenderArgs { node_names: Some(CandidateNames::new()), ..ExtenderArgs::default() };
        let mut r = FilterResult::default();
        r.push_short("n0", ReasonCode::AlreadyScheduledElsewhere);
        r.push_passed("n1");
        r.push_short("n2", ReasonCode::AlreadyScheduledElsewhere);
        r.push_short("n\"3", ReasonCode::NodeCacheMiss);
        let out = ExtenderFilterResult::from_result(&args, r);
        let bytes = out.to_json().unwrap();
        assert_eq!(bytes, serde_json::to_vec(&out).unwrap());
        assert_eq!(
            String::from_utf8(bytes.clone()).unwrap(),
            r#"{"Nodes":null,"NodeNames":["n1"],"FailedNodes":{"n0":"pod already scheduled to another node","n2":"pod already scheduled to another node","n\"3":"node missing from cache"},"FailedAndUnresolvableNodes":null,"Error":""}"#
        );
        let back: ExtenderFilterResult = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(back, out);
    }

    #[test]
    fn upstream_types_test_fixtures_decode() {
        // The JSON samples of k8s.io/kube-scheduler/extender/v1 types_test.go.
        let f: ExtenderFilterResult = serde_json::from_str(
            r#"{"NodeNames":["node1"],"FailedNodes":{"foo":"bar"},"FailedAndUnresolvableNodes":{"baz":"qux"},"Error":"myerror"}"#,
        )
        .unwrap();
        assert_eq!(f.node_names.clone().unwrap(), ["node1"]);
        assert_eq!(f.failed_nodes.get("foo"), Some("bar"));
        assert_eq!(f.failed_and_unresolvable_nodes.as_ref().unwrap()["baz"], "qux");
        assert_eq!(f.error, "myerror");
        let b: ExtenderBindingArgs = serde_json::from_str(
            r#"{"PodName":"mypodname","PodNamespace":"mypodnamespace","PodUID":"mypoduid","Node":"mynode"}"#,
        )
        .unwrap();
        assert_eq!(
            b,
            ExtenderBindingArgs {
                pod_name: "mypodname".into(),
                pod_namespace: "mypodnamespace".into(),
                pod_uid: "mypoduid".into(),
                node: "mynode".into()
            }
        );
        assert_eq!(
            serde_json::to_string(&b).unwrap(),
            r#"{"PodName":"mypodname","PodNamespace":"mypodnamespace","PodUID":"mypoduid","Node":"mynode"}"#
        );
        let h: HostPriority = serde_json::from_str(r#"{"Host":"myhost","Score":1}"#).unwrap();
        assert_eq!(h, HostPriority { host: "myhost".into(), score: 1 });
        assert_eq!(serde_json::to_string(&vec![h]).unwrap(), r#"[{"Host":"myhost","Score":1}]"#);
        let p: ExtenderPreemptionResult = serde_json::from_str(
            r#"{"NodeNameToMetaVictims":{"foo":{"Pods":[{"UID":"myuid"}],"NumPDBViolations":1}}}"#,
        )
        .unwrap();
        assert_eq!(p.node_name_to_meta_victims["foo"].pods, [MetaPod { uid: "myuid".into() }]);
        assert_eq!(
            serde_json::to_string(&p).unwrap(),
            r#"{"NodeNameToMetaVictims":{"foo":{"Pods":[{"UID":"myuid"}],"NumPDBViolations":1}}}"#
        );
    }

    #[test]
    fn lower_case_keys_and_nulls_decode() {
        let b: ExtenderBindingArgs =
            serde_json::from_str(r#"{"podname":"p","podnamespace":null,"poduid":"u","node":"n"}"#).unwrap();
        assert_eq!((b.pod_name.as_str(), b.pod_namespace.as_str(), b.node.as_str()), ("p", "", "n"));
        let r: ExtenderBindingResult = serde_json::from_str(r#"{"Error":null}"#).unwrap();
        assert_eq!(r.error, "");
        assert_eq!(serde_json::to_string(&ExtenderBindingResult::default()).unwrap(), r#"{"Error":""}"#);
        let a: ExtenderArgs = serde_json::from_str(r#"{"pod":null,"nodenames":null,"Extra":1}"#).unwrap();
        assert_eq!(a, ExtenderArgs::default());
        assert!(a.candidate_names().unwrap().is_empty());
        let e: ExtenderFilterResult = serde_json::from_str("{}").unwrap();
        assert_eq!(e, ExtenderFilterResult::default());
    }

    #[test]
    fn preemption_args_both_forms_and_result_pdb_bound() {
        let args: ExtenderPreemptionArgs = serde_json::from_value(json!({
            "Pod": {"metadata": {"uid": "pre"}},
            "NodeNameToVictims": {
                "full": {"Pods": [{"metadata": {"uid": "v1"}}, {"metadata": {"name": "no-uid"}}, null], "NumPDBViolations": 2},
                "both": {"Pods": [{"metadata": {"uid": "ignored"}}], "NumPDBViolations": 9},
                "nil": null
            },
            "NodeNameToMetaVictims": {
                "both": {"Pods": [{"UID": "m1"}, {"UID": "m2"}], "NumPDBViolations": 1}
            }
        }))
        .unwrap();
        let uids = args.victim_uids();
        assert_eq!(uids["full"], ["v1"]);
        assert_eq!(uids["both"], ["m1", "m2"]);
        assert_eq!(uids["nil"], Vec::<String>::new());
        assert_eq!(args.pdb_violations("both"), 1);
        assert_eq!(args.pdb_violations("full"), 2);
        assert_eq!(args.pdb_violations("ghost"), 0);
        let result = PreemptResult {
            node_victims: [
                ("full".to_owned(), vec!["v1".to_owned(), "extra".to_owned()]),
                ("both".to_owned(), vec![]),
            ]
            .into(),
            ..PreemptResult::default()
        };
        let out = ExtenderPreemptionResult::from_result(&args, result.clone());
        assert_eq!(
            serde_json::to_value(&out).unwrap(),
            json!({"NodeNameToMetaVictims": {
                "both": {"Pods": [], "NumPDBViolations": 0},
                "full": {"Pods": [{"UID": "v1"}, {"UID": "extra"}], "NumPDBViolations": 2}
            }})
        );
        // A count made against the cluster's budgets replaces the bound.
        let counted = PreemptResult { pdb_violations: [("full".to_owned(), 0)].into(), ..result };
        let out = ExtenderPreemptionResult::from_result(&args, counted);
        assert_eq!(out.node_name_to_meta_victims["full"].num_pdb_violations, 0);
        assert_eq!(out.node_name_to_meta_victims["both"].num_pdb_violations, 0);
        let args: ExtenderPreemptionArgs =
            serde_json::from_str(r#"{"Pod":null,"NodeNameToVictims":null,"NodeNameToMetaVictims":null}"#)
                .unwrap();
        assert_eq!(args, ExtenderPreemptionArgs::default());
    }

    #[test]
    fn host_priority_from_extender_is_clamped() {
        let h = HostPriority::from(crate::extender::HostPriority { host: "n".into(), score: 42 });
        assert_eq!(h.score, MAX_EXTENDER_PRIORITY);
    }
}
