//! Partition keys (contract §9): which containers of a claim's consumers share a vGPU partition, and the
//! name of its directory `<host-manager-dir>/claims/<claimUID>/<partitionKey>/…`.
//!
//! The containers of the pods a claim is reserved for and the claim's vGPU requests form a graph: a
//! container is linked to every request it uses (`resources.claims[]` naming this claim, either one
//! request or, with no request, every allocated vGPU request of the claim). Each connected component is
//! one partition: its containers share the partition's `config`, `vgpu_lock`, `vmem_node` and `sm_node`
//! directories, so they see one memory and core budget.
//!
//! | component | key |
//! |---|---|
//! | one container | `pod-<sha256(podUID)[:12]>-<kind>/<name>` (`kind` = `app` or `init`; the `/` makes a nested directory) |
//! | several containers | `cg-<sha256(<containers>\|<requests>)[:12]>` (containers as `<podUID>/<kind>/<name>`, sorted, joined by `,`; requests sorted, joined by `,`) |
//! | a request no container uses (claim not yet reserved, pod not readable) | the request name, every character outside `[A-Za-z0-9_.-]` turned into `-` (`unknown` when empty) |
//!
//! A request `main/sub` (a `firstAvailable` sub-request) belongs to its main request `main`.
//!
//! ```
//! use vgpu_dra::partition::{ContainerRef, Kind, group_key, single_key};
//!
//! let main = ContainerRef { pod_uid: "pod-1".into(), kind: Kind::App, name: "main".into() };
//! assert_eq!(single_key(&main), "pod-0f066824e0c3-app/main");
//! let side = ContainerRef { name: "side".into(), ..main.clone() };
//! assert!(group_key(&[main, side], &["gpu".to_owned()]).starts_with("cg-"));
//! ```

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
};

use k8s_openapi::api::{core::v1::Pod, resource::v1::ResourceClaim};

/// The kind of a container in its pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// `spec.initContainers[]` (`init`).
    Init,
    /// `spec.containers[]` (`app`).
    App,
}

impl Kind {
    /// `init` or `app`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Init => "init",
            Self::App => "app",
        }
    }
}

/// A container of a consumer pod.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ContainerRef {
    /// The pod's UID.
    pub pod_uid: String,
    /// Init or app container.
    pub kind: Kind,
    /// The container's name.
    pub name: String,
}

impl ContainerRef {
    /// `<podUID>/<kind>/<name>`: the form hashed into a group key.
    pub fn key(&self) -> String {
        format!("{}/{}/{}", self.pod_uid, self.kind.as_str(), self.name)
    }
}

/// The first 12 hex digits of the SHA-256 of `value`.
pub fn short_hash(value: &str) -> String {
    sha256(value.as_bytes()).iter().take(6).map(|b| format!("{b:02x}")).collect()
}

/// The key of a partition of one container: `pod-<sha256(podUID)[:12]>-<kind>/<name>`.
pub fn single_key(container: &ContainerRef) -> String {
    format!("pod-{}-{}/{}", short_hash(&container.pod_uid), container.kind.as_str(), container.name)
}

/// The key of a partition of several containers: `cg-<sha256(<containers>|<requests>)[:12]>`, both lists
/// sorted (the order given does not matter).
pub fn group_key(containers: &[ContainerRef], requests: &[String]) -> String {
    let containers: BTreeSet<String> = containers.iter().map(ContainerRef::key).collect();
    let requests: BTreeSet<&str> = requests.iter().map(String::as_str).collect();
    let payload = format!(
        "{}|{}",
        containers.into_iter().collect::<Vec<_>>().join(","),
        requests.into_iter().collect::<Vec<_>>().join(",")
    );
    format!("cg-{}", short_hash(&payload))
}

/// The key of a request no container uses: its name with every character outside `[A-Za-z0-9_.-]` turned
/// into `-`, `unknown` when empty.
pub fn fallback_key(request: &str) -> String {
    if request.is_empty() {
        return "unknown".to_owned();
    }
    crate::cdi::sanitize(request)
}

/// The main request of a result's request name (`main/sub` → `main`).
pub fn main_request(request: &str) -> &str {
    request.split_once('/').map_or(request, |(main, _)| main)
}

/// The partitions of a claim: for each of `requests` (the claim's allocated vGPU main requests) the key of
/// its partition, and for each key the containers in it. `pods` are the claim's consumer pods as read
/// from the API (those not readable are simply absent: their requests fall back to [`fallback_key`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Partitions {
    /// Main request → partition key.
    pub by_request: BTreeMap<String, String>,
    /// Partition key → its containers (empty for a fallback key).
    pub containers: BTreeMap<String, Vec<ContainerRef>>,
}

/// Walks the container ↔ request graph of `claim` over `pods` (see the module docs).
pub fn resolve(claim: &ResourceClaim, requests: &BTreeSet<String>, pods: &[Pod]) -> Partitions {
    let claim_name = claim.metadata.name.as_deref().unwrap_or_default();
    // Undirected edges container ↔ request.
    let mut uses: BTreeMap<ContainerRef, BTreeSet<String>> = BTreeMap::new();
    for pod in pods {
        let Some(pod_uid) = pod.metadata.uid.as_deref() else { continue };
        let Some(spec) = pod.spec.as_ref() else { continue };
        let containers = spec
            .init_containers
            .iter()
            .flatten()
            .map(|c| (Kind::Init, c))
            .chain(spec.containers.iter().map(|c| (Kind::App, c)));
        for (kind, container) in containers {
            let claims = container.resources.as_ref().and_then(|r| r.claims.as_ref());
            for claim_ref in claims.into_iter().flatten() {
                if vgpu_api::pod::actual_claim_name(pod, &claim_ref.name) != Some(claim_name) {
                    continue;
                }
                let used: Vec<String> = match claim_ref.request.as_deref().filter(|r| !r.is_empty()) {
                    Some(r) => requests.get(main_request(r)).cloned().into_iter().collect(),
                    None => requests.iter().cloned().collect(),
                };
                if used.is_empty() {
                    continue;
                }
                let node = ContainerRef { pod_uid: pod_uid.to_owned(), kind, name: container.name.clone() };
                uses.entry(node).or_default().extend(used);
            }
        }
    }
    let mut users: BTreeMap<&str, Vec<&ContainerRef>> = BTreeMap::new();
    for (container, used) in &uses {
        for request in used {
            users.entry(request.as_str()).or_default().push(container);
        }
    }
    let mut out = Partitions::default();
    let mut seen: BTreeSet<&ContainerRef> = BTreeSet::new();
    for start in uses.keys() {
        if seen.contains(start) {
            continue;
        }
        // Depth-first over containers, through the requests they share.
        let mut members: BTreeSet<&ContainerRef> = BTreeSet::new();
        let mut reqs: BTreeSet<&str> = BTreeSet::new();
        let mut stack = vec![start];
        while let Some(container) = stack.pop() {
            if !seen.insert(container) {
                continue;
            }
            members.insert(container);
            for request in uses.get(container).into_iter().flatten() {
                if reqs.insert(request.as_str()) {
                    stack.extend(users.get(request.as_str()).into_iter().flatten().copied());
                }
            }
        }
        let members: Vec<ContainerRef> = members.into_iter().cloned().collect();
        let reqs: Vec<String> = reqs.into_iter().map(str::to_owned).collect();
        let key = match members.as_slice() {
            [one] => single_key(one),
            _ => group_key(&members, &reqs),
        };
        for request in &reqs {
            out.by_request.insert(request.clone(), key.clone());
        }
        out.containers.insert(key, members);
    }
    for request in requests {
        if !out.by_request.contains_key(request) {
            let key = fallback_key(request);
            out.by_request.insert(request.clone(), key.clone());
            out.containers.entry(key).or_default();
        }
    }
    out
}

/// SHA-256 of `data` (the `sha2` crate).
pub fn sha256(data: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(data).into()
}

/// The directories of a partition, each mounted into the partition's containers.
pub const PARTITION_DIRS: [&str; 4] = ["config", "vgpu_lock", "vmem_node", "sm_node"];

/// A partition directory or file could not be made.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {action}: {source}")]
pub struct CreateError {
    /// The path.
    pub path: std::path::PathBuf,
    /// What was being done.
    pub action: &'static str,
    /// The I/O error.
    #[source]
    pub source: std::io::Error,
}

/// Makes partition `part` (Prepare's per-partition directories, or the NRI hook's per-container ones): the
/// [`PARTITION_DIRS`] with mode 0777 (the containers' processes, of any user, write them) and an empty
/// `config/pids.config` unless one exists. Idempotent.
///
/// A symbolic link planted at one of the directories' paths is refused (its target's mode is left alone):
/// the error's action is `set mode 0777` and its source wraps the
/// [`PermsError`](vgpu_core::abi::perms::PermsError) (`std::io::Error::get_ref` downcasts to it).
pub fn create(part: &std::path::Path) -> Result<(), CreateError> {
    use vgpu_core::abi::perms::{PermsError, create_dir_all_mode};
    for sub in PARTITION_DIRS {
        let dir = part.join(sub);
        create_dir_all_mode(&dir, 0o777).map_err(|e| match e {
            PermsError::Io { path, action: "create directory", source } => {
                CreateError { path, action: "create directory", source }
            }
            other => CreateError {
                path: other.path().to_path_buf(),
                action: "set mode 0777",
                source: std::io::Error::other(other),
            },
        })?;
    }
    let pids = part.join("config").join("pids.config");
    if !pids.exists() {
        vgpu_core::abi::atomic::write_atomic(&pids, b"", 0o644).map_err(|e| CreateError {
            path: pids.clone(),
            action: "create",
            source: std::io::Error::other(e.to_string()),
        })?;
    }
    Ok(())
}

/// The name, under a claim's host directory, of the source of [`guard_mount`]: a path that is never made.
pub const GUARD_SOURCE: &str = "no-partition--the-NRI-hook-did-not-run";

/// The claim's CDI spec mount that keeps a container the NRI hook missed from starting: a bind of
/// `<host claim dir>/`[`GUARD_SOURCE`] (which never exists, so runc fails the container's creation and the
/// kubelet retries it) on `/etc/vgpu-manager/config`, the path of the hook's own partition mount, which
/// replaces it (NRI removes a spec mount whose destination an adjustment mounts).
pub fn guard_mount(host_claim: &Path) -> vgpu_core::cdi::Mount {
    vgpu_core::cdi::Mount::bind(crate::cdi::CONTAINER_CONFIG_DIR, &host_claim.join(GUARD_SOURCE), true)
}

/// The bind mounts of a partition whose host directory is `host` (as the CDI partition mounts).
pub fn partition_mounts(host: &Path) -> Vec<vgpu_core::cdi::Mount> {
    vec![
        vgpu_core::cdi::Mount::bind(crate::cdi::CONTAINER_CONFIG_DIR, &host.join("config"), false),
        vgpu_core::cdi::Mount::bind("/tmp/.vgpu_lock", &host.join("vgpu_lock"), false),
        vgpu_core::cdi::Mount::bind("/tmp/.vmem_node", &host.join("vmem_node"), false),
        vgpu_core::cdi::Mount::bind("/tmp/.sm_node", &host.join("sm_node"), false),
        vgpu_core::cdi::Mount::bind(
            &format!("{}/pids.config", crate::cdi::CONTAINER_CONFIG_DIR),
            &host.join("config").join("pids.config"),
            true,
        ),
    ]
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use k8s_openapi::api::core::v1::{
        Container, PodResourceClaim, PodResourceClaimStatus, PodSpec, PodStatus, ResourceClaim as CtrClaim,
        ResourceRequirements,
    };
    use proptest::prelude::*;

    use super::*;

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn sha256_fips_vectors() {
        assert_eq!(hex(&sha256(b"")), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
        assert_eq!(hex(&sha256(b"abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        assert_eq!(
            hex(&sha256(b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"
        );
        assert_eq!(
            hex(&sha256(&[b'a'; 1000])),
            "41edece42d63e8d9bf515a9ba6932e1c20cbc9f5a5d134645adb5db1b9737ea3"
        );
    }

    fn ctr(name: &str, claims: &[(&str, Option<&str>)]) -> Container {
        Container {
            name: name.into(),
            resources: Some(ResourceRequirements {
                claims: Some(
                    claims
                        .iter()
                        .map(|(n, r)| CtrClaim { name: (*n).into(), request: r.map(str::to_owned) })
                        .collect(),
                ),
                ..ResourceRequirements::default()
            }),
            ..Container::default()
        }
    }

    fn pod(uid: &str, init: Vec<Container>, app: Vec<Container>) -> Pod {
        let mut p = Pod::default();
        p.metadata.uid = Some(uid.into());
        p.spec = Some(PodSpec {
            init_containers: Some(init),
            containers: app,
            resource_claims: Some(vec![
                PodResourceClaim {
                    name: "gpu".into(),
                    resource_claim_name: Some("c1".into()),
                    ..Default::default()
                },
                PodResourceClaim {
                    name: "tmpl".into(),
                    resource_claim_template_name: Some("t".into()),
                    ..Default::default()
                },
            ]),
            ..PodSpec::default()
        });
        p.status = Some(PodStatus {
            resource_claim_statuses: Some(vec![PodResourceClaimStatus {
                name: "tmpl".into(),
                resource_claim_name: Some("c2".into()),
            }]),
            ..PodStatus::default()
        });
        p
    }

    fn claim(name: &str) -> ResourceClaim {
        let mut c = ResourceClaim::default();
        c.metadata.name = Some(name.into());
        c
    }

    fn set(items: &[&str]) -> BTreeSet<String> {
        items.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn create_makes_world_writable_dirs_and_refuses_a_planted_symlink() {
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        let dir = tempfile::tempdir().unwrap();
        let part = dir.path().join("part");
        create(&part).unwrap();
        for sub in PARTITION_DIRS {
            assert_eq!(mode(&part.join(sub)), 0o777, "{sub}");
        }
        assert!(part.join("config/pids.config").is_file());

        // A link where a partition directory goes, to a host directory outside: refused, target untouched.
        let outside = tempfile::tempdir().unwrap();
        let target = outside.path().join("host");
        std::fs::create_dir(&target).unwrap();
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o700)).unwrap();
        let part = dir.path().join("planted");
        std::fs::create_dir(&part).unwrap();
        let link = part.join("vmem_node");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let e = create(&part).unwrap_err();
        assert_eq!((e.path.as_path(), e.action), (link.as_path(), "set mode 0777"));
        let inner = e.source.get_ref().and_then(|s| s.downcast_ref::<vgpu_core::abi::perms::PermsError>());
        assert!(matches!(inner, Some(vgpu_core::abi::perms::PermsError::Symlink { .. })), "{e}");
        assert!(e.to_string().contains("is a symbolic link; refusing to change its permissions"), "{e}");
        assert_eq!(mode(&target), 0o700);
    }

    #[test]
    fn keys_have_the_contract_form() {
        let main = ContainerRef { pod_uid: "pod-1".into(), kind: Kind::App, name: "main".into() };
        assert_eq!(short_hash("pod-1"), &hex(&sha256(b"pod-1"))[..12]);
        assert_eq!(single_key(&main), format!("pod-{}-app/main", short_hash("pod-1")));
        let init = ContainerRef { kind: Kind::Init, name: "warm".into(), ..main.clone() };
        let expected = format!("cg-{}", short_hash("pod-1/app/main,pod-1/init/warm|a,b"));
        assert_eq!(group_key(&[main.clone(), init.clone()], &["b".into(), "a".into()]), expected);
        assert_eq!(group_key(&[init, main], &["a".into(), "b".into()]), expected, "order-free");
        assert_eq!(fallback_key("gpu/sub x"), "gpu-sub-x");
        assert_eq!(fallback_key(""), "unknown");
        assert_eq!(main_request("gpu/a100"), "gpu");
    }

    #[test]
    fn the_graph_walk_groups_containers_that_share_requests() {
        let requests = set(&["a", "b", "c", "d"]);
        // p1: main uses a; side uses a and b (shares a with main) → one group {main, side} over {a, b}.
        // p1: init uses c alone → its own single-container partition.
        // d: nobody → fallback.
        let p1 = pod(
            "p1",
            vec![ctr("warm", &[("gpu", Some("c"))])],
            vec![
                ctr("main", &[("gpu", Some("a"))]),
                ctr("side", &[("gpu", Some("a")), ("gpu", Some("b/x"))]),
            ],
        );
        let parts = resolve(&claim("c1"), &requests, &[p1]);
        let main = ContainerRef { pod_uid: "p1".into(), kind: Kind::App, name: "main".into() };
        let side = ContainerRef { name: "side".into(), ..main.clone() };
        let warm = ContainerRef { pod_uid: "p1".into(), kind: Kind::Init, name: "warm".into() };
        let group = group_key(&[main.clone(), side.clone()], &["a".into(), "b".into()]);
        assert_eq!(parts.by_request["a"], group);
        assert_eq!(parts.by_request["b"], group);
        assert_eq!(parts.by_request["c"], single_key(&warm));
        assert_eq!(parts.by_request["d"], "d");
        assert_eq!(parts.containers[&group], [main, side]);
        assert!(parts.containers["d"].is_empty());
    }

    #[test]
    fn a_container_without_a_request_uses_every_request_and_templates_resolve() {
        let requests = set(&["a", "b"]);
        let p = pod("p1", vec![], vec![ctr("main", &[("tmpl", None)]), ctr("other", &[("gpu", None)])]);
        // For claim c2 (from the template), only `main` uses it, and it uses both requests.
        let parts = resolve(&claim("c2"), &requests, std::slice::from_ref(&p));
        let main = ContainerRef { pod_uid: "p1".into(), kind: Kind::App, name: "main".into() };
        assert_eq!(parts.by_request["a"], single_key(&main));
        assert_eq!(parts.by_request["b"], single_key(&main));
        // No consumer read: every request falls back.
        let parts = resolve(&claim("c2"), &requests, &[]);
        assert_eq!(parts.by_request["a"], "a");
        // A request the claim does not have is ignored.
        let p = pod("p1", vec![], vec![ctr("main", &[("gpu", Some("zzz"))])]);
        assert_eq!(resolve(&claim("c1"), &requests, &[p]).by_request["a"], "a");
    }

    proptest! {
        #[test]
        fn keys_are_well_formed_and_order_free(
            uid in "[0-9a-f-]{1,36}",
            names in prop::collection::btree_set("[a-z][a-z0-9-]{0,20}", 1..5),
            reqs in prop::collection::btree_set("[a-z][a-z0-9]{0,8}", 1..4),
        ) {
            let containers: Vec<ContainerRef> = names
                .iter()
                .map(|n| ContainerRef { pod_uid: uid.clone(), kind: Kind::App, name: n.clone() })
                .collect();
            let single = single_key(&containers[0]);
            prop_assert!(single.starts_with("pod-"));
            let hash = &single[4..16];
            prop_assert!(hash.chars().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
            prop_assert_eq!(&single[16..], format!("-app/{}", containers[0].name));
            let reqs: Vec<String> = reqs.into_iter().collect();
            let key = group_key(&containers, &reqs);
            prop_assert_eq!(key.len(), 15);
            prop_assert!(key.starts_with("cg-") && key[3..].chars().all(|c| c.is_ascii_hexdigit()));
            let mut reversed = containers.clone();
            reversed.reverse();
            let mut rreqs = reqs.clone();
            rreqs.reverse();
            prop_assert_eq!(group_key(&reversed, &rreqs), key);
        }

        #[test]
        fn every_request_gets_exactly_one_partition(
            reqs in prop::collection::btree_set("[a-z]{1,4}", 1..6),
            uses in prop::collection::vec((0usize..4, prop::option::of(0usize..6)), 0..8),
        ) {
            let list: Vec<&String> = reqs.iter().collect();
            let app: Vec<Container> = (0..4)
                .map(|i| {
                    let mine: Vec<(&str, Option<&str>)> = uses
                        .iter()
                        .filter(|(c, _)| *c == i)
                        .map(|(_, r)| ("gpu", r.map(|r| list[r % list.len()].as_str())))
                        .collect();
                    ctr(&format!("c{i}"), &mine)
                })
                .collect();
            let parts = resolve(&claim("c1"), &reqs, &[pod("p", vec![], app)]);
            prop_assert_eq!(parts.by_request.keys().collect::<Vec<_>>(), reqs.iter().collect::<Vec<_>>());
            // Containers of one partition never appear in another.
            let mut owner = BTreeMap::new();
            for (key, members) in &parts.containers {
                for m in members {
                    prop_assert!(owner.insert(m.clone(), key.clone()).is_none());
                }
            }
            for key in parts.by_request.values() {
                prop_assert!(parts.containers.contains_key(key));
            }
        }
    }
}
