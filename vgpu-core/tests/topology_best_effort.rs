//! Best-effort policy: golden answers on public machine layouts, and the exact optimizer checked against a
//! brute-force transcription of the reference enumeration.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "support/oracle.rs"]
mod oracle;

use proptest::prelude::*;
use vgpu_core::alloc::NodeLinks;
use vgpu_core::topology::{
    Allocator, BestEffortPolicy, DeviceTopology, GpuSetError, MAX_AVAILABLE, P2PLinkType, Topology,
};

fn fixture(name: &str) -> Topology {
    let path = format!("{}/tests/fixtures/topology/{name}.json", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap();
    Topology::decode(&text).unwrap()
}

/// Runs the sequential allocator with `size` until it returns nothing; returns every answer, the last empty.
fn sequence(topology: &Topology, size: usize) -> Vec<Vec<usize>> {
    let mut allocator = Allocator::new(topology.clone());
    let mut out = Vec::new();
    loop {
        let got = allocator.allocate(size).unwrap();
        assert_eq!(got.score, topology.set_score(&got.devices).unwrap());
        let done = got.is_empty();
        out.push(got.devices);
        if done || out.len() > 64 {
            return out;
        }
    }
}

fn sets(v: &[&[usize]]) -> Vec<Vec<usize>> {
    let mut out: Vec<Vec<usize>> = v.iter().map(|s| s.to_vec()).collect();
    out.push(Vec::new());
    out
}

#[test]
fn rtx8000_sequences() {
    let t = fixture("rtx8000-4x");
    assert_eq!(sequence(&t, 1), sets(&[&[0], &[1], &[2], &[3]]));
    assert_eq!(sequence(&t, 2), sets(&[&[0, 3], &[1, 2]]));
    assert_eq!(sequence(&t, 4), sets(&[&[0, 1, 2, 3]]));
}

#[test]
fn dgx1_pascal_sequences() {
    let t = fixture("dgx1-pascal");
    assert_eq!(sequence(&t, 1), sets(&[&[0], &[1], &[2], &[3], &[4], &[5], &[6], &[7]]));
    assert_eq!(sequence(&t, 2), sets(&[&[0, 2], &[1, 3], &[4, 6], &[5, 7]]));
    assert_eq!(sequence(&t, 4), sets(&[&[0, 1, 2, 3], &[4, 5, 6, 7]]));
    assert_eq!(sequence(&t, 8), sets(&[&[0, 1, 2, 3, 4, 5, 6, 7]]));
}

#[test]
fn dgx1_volta_sequences() {
    let t = fixture("dgx1-volta");
    assert_eq!(sequence(&t, 1), sets(&[&[0], &[1], &[2], &[3], &[4], &[5], &[6], &[7]]));
    assert_eq!(sequence(&t, 2), sets(&[&[0, 3], &[1, 2], &[4, 7], &[5, 6]]));
    assert_eq!(sequence(&t, 4), sets(&[&[0, 1, 2, 3], &[4, 5, 6, 7]]));
    assert_eq!(sequence(&t, 8), sets(&[&[0, 1, 2, 3, 4, 5, 6, 7]]));
}

#[test]
fn dgx1_volta_best_effort_table() {
    // go-gpuallocator TestBestEffortAllocate (peers.md §3.4).
    let t = fixture("dgx1-volta");
    let p = BestEffortPolicy::new(&t);
    let all: Vec<usize> = (0..8).collect();
    type Row<'a> = (&'a [usize], &'a [usize], usize, &'a [usize]);
    let cases: &[Row<'_>] = &[
        (&[0, 2, 4, 5], &[], 2, &[4, 5]),
        (&[0, 4, 5, 6], &[], 2, &[5, 6]),
        (&[0, 3, 1], &[], 2, &[0, 3]),
        (&[0, 1, 4], &[], 2, &[0, 4]),
        (&all, &[4], 1, &[4]),
        (&all, &[4], 2, &[4, 7]),
        (&all, &[4], 4, &[4, 5, 6, 7]),
        (&[1, 2, 3, 4, 5, 6, 7], &[0, 1, 2, 3], 4, &[]),
        (&all, &[0, 2, 4, 6], 4, &[0, 2, 4, 6]),
        (&all, &[1, 2, 3, 4, 5, 6], 4, &[]),
        (&[1, 2, 3, 4, 5], &[1, 2, 3, 4, 5, 6], 1, &[]),
    ];
    for (available, required, size, expected) in cases {
        let got = p.allocate(available, required, *size).unwrap();
        assert_eq!(&got.devices, expected, "available {available:?} required {required:?} size {size}");
    }
    // The first row is a partition answer, not the best pair: {0,4} scores 210 but {0,2}+{4,5} = 280 wins.
    let best = p.best_partition(&[0, 2, 4, 5], &[], 2).unwrap().unwrap();
    assert_eq!(best.score, 280);
    assert_eq!(best.sets[best.chosen].score, 150);
}

#[test]
fn other_boards() {
    let nvswitch = fixture("hgx-nvswitch-8x");
    assert_eq!(sequence(&nvswitch, 2), sets(&[&[0, 1], &[2, 3], &[4, 5], &[6, 7]]));
    // 8 GPUs in sets of 3: one placeholder; all partitions tie, the first wins.
    assert_eq!(sequence(&nvswitch, 3), sets(&[&[0, 1, 2], &[3, 4, 5]]));
    assert_eq!(
        BestEffortPolicy::new(&nvswitch).allocate(&[0, 1, 2, 3, 4, 5, 6, 7], &[], 3).unwrap().score,
        5400
    );

    let pcie = fixture("pcie-8x");
    assert_eq!(sequence(&pcie, 2), sets(&[&[0, 1], &[2, 3], &[4, 5], &[6, 7]]));
    assert_eq!(sequence(&pcie, 4), sets(&[&[0, 1, 2, 3], &[4, 5, 6, 7]]));

    let bridged = fixture("pcie-bridged-8x");
    assert_eq!(sequence(&bridged, 2), sets(&[&[0, 1], &[2, 3], &[4, 5], &[6, 7]]));
    assert_eq!(sequence(&bridged, 4), sets(&[&[0, 1, 2, 3], &[4, 5, 6, 7]]));
    let p = BestEffortPolicy::new(&bridged);
    // Required GPU 4 joins a bridged pair: {0,1,4}+{2,3,_} and {0,1,_}+{2,3,4} tie at 2500; upstream's order
    // visits the first set (0,1,4) before (0,1,placeholder), so {0,1,4} wins.
    let best = p.best_partition(&[0, 1, 2, 3, 4], &[4], 3).unwrap().unwrap();
    assert_eq!(best.score, 2500);
    assert_eq!(best.sets[best.chosen].devices, vec![0, 1, 4]);
    let o = oracle::best_effort(&bridged, &[0, 1, 2, 3, 4], &[4], 3).unwrap();
    assert_eq!(o.partition[o.chosen], vec![Some(0), Some(1), Some(4)]);

    let islands = fixture("two-islands-16x");
    assert_eq!(sequence(&islands, 8), sets(&[&[0, 1, 2, 3, 4, 5, 6, 7], &[8, 9, 10, 11, 12, 13, 14, 15]]));
    assert_eq!(
        sequence(&islands, 4),
        sets(&[&[0, 1, 2, 3], &[4, 5, 6, 7], &[8, 9, 10, 11], &[12, 13, 14, 15]])
    );
    assert_eq!(sequence(&islands, 16).len(), 2);
    let p = BestEffortPolicy::new(&islands);
    // 6 GPUs left on one island and 2 on the other: sets of 4 stay inside an island.
    let got = p.allocate(&[2, 3, 4, 5, 6, 7, 8, 9], &[], 4).unwrap();
    assert_eq!(got.devices, vec![2, 3, 4, 5]);
}

#[test]
fn padded_upstream_answer_is_replaced_by_a_full_set() {
    // 0-1 share 18 NVLinks; 2, 3, 4 are SYS to each other; no link between the two groups. Five GPUs in sets
    // of 3: one short set (2 GPUs + one placeholder). The best partition is {0,1,_} + {2,3,4} (1830);
    // upstream returns the short {0,1}, we return {2,3,4}.
    let t = Topology::new(&oracle::symmetric(5, |a, b| match (a, b) {
        (0, 1) => vec![P2PLinkType::EighteenNvLinks],
        (0 | 1, _) => vec![],
        _ => vec![P2PLinkType::CrossCpu],
    }))
    .unwrap();
    let p = BestEffortPolicy::new(&t);
    let best = p.best_partition(&[0, 1, 2, 3, 4], &[], 3).unwrap().unwrap();
    assert_eq!(best.score, 1830);
    assert_eq!(best.sets[best.upstream].devices, vec![0, 1]);
    assert_eq!(best.sets[best.upstream].padding, 1);
    assert_eq!(best.sets[best.chosen].devices, vec![2, 3, 4]);
    let got = p.allocate(&[4, 3, 2, 1, 0, 0], &[], 3).unwrap();
    assert_eq!((got.devices, got.score), (vec![2, 3, 4], 30));
    let o = oracle::best_effort(&t, &[0, 1, 2, 3, 4], &[], 3).unwrap();
    assert_eq!((o.upstream, o.chosen), (best.upstream, best.chosen));
}

#[test]
fn early_outs_and_errors() {
    let t = fixture("dgx1-volta");
    let p = BestEffortPolicy::new(&t);
    assert!(p.allocate(&[0, 1, 2], &[], 0).unwrap().is_empty());
    assert!(p.allocate(&[0, 1, 2], &[], 4).unwrap().is_empty());
    assert!(p.allocate(&[0, 1, 2], &[0, 1, 2], 2).unwrap().is_empty());
    assert!(p.allocate(&[0, 1, 2], &[5], 2).unwrap().is_empty());
    assert!(p.allocate(&[], &[], 1).unwrap().is_empty());
    assert_eq!(p.allocate(&[0, 8], &[], 1), Err(GpuSetError::UnknownGpu { index: 8, count: 8 }));
    assert_eq!(p.allocate(&[0], &[9], 1), Err(GpuSetError::UnknownGpu { index: 9, count: 8 }));

    let big = Topology::from_pair_scores(70, |_, _| 10);
    let all: Vec<usize> = (0..70).collect();
    assert_eq!(
        BestEffortPolicy::new(&big).allocate(&all, &[], 2),
        Err(GpuSetError::TooManyGpus { count: 70, max: MAX_AVAILABLE })
    );
    // Exactly 64 on a uniform fabric is fine (the bound prunes every alternative).
    let got = BestEffortPolicy::new(&big).allocate(&all[..64], &[], 2).unwrap();
    assert_eq!(got.devices, vec![0, 1]);

    let mut a = Allocator::with_available(t.clone(), &[3, 0, 1, 2]).unwrap();
    assert_eq!(a.allocate_with(&[1], 2).unwrap().devices, vec![1, 2]);
    assert_eq!(a.remaining(), &[0, 3]);
    a.release(&[2, 1]).unwrap();
    assert_eq!(a.remaining(), &[0, 1, 2, 3]);
    assert!(a.release(&[99]).is_err());
}

fn link_list() -> impl Strategy<Value = Vec<P2PLinkType>> {
    let t = |c: usize| P2PLinkType::ALL[c];
    prop_oneof![
        // A small alphabet makes ties common, which is what tie-breaking needs.
        4 => prop_oneof![
            Just(vec![]),
            Just(vec![t(1)]),
            Just(vec![t(2)]),
            Just(vec![t(7)]),
            Just(vec![t(7), t(1)]),
            Just(vec![t(8), t(3)]),
        ],
        1 => proptest::collection::vec((0usize..25).prop_map(t), 0..3),
    ]
}

#[derive(Debug, Clone)]
struct Case {
    topology: DeviceTopology,
    available: Vec<usize>,
    required: Vec<usize>,
    size: usize,
}

fn arb_case() -> impl Strategy<Value = Case> {
    (1usize..=10).prop_flat_map(|n| {
        let pairs = n * (n - 1) / 2;
        (
            proptest::collection::vec(link_list(), pairs),
            proptest::collection::vec(proptest::bool::weighted(0.8), n),
            prop_oneof![3 => Just(vec![]), 2 => proptest::collection::vec(0..n, 1..3)],
            0..=n + 1,
        )
            .prop_map(move |(links, avail, required, size)| {
                let mut it = links.into_iter();
                let topology = oracle::symmetric(n, |_, _| it.next().unwrap_or_default());
                let available = (0..n).filter(|&i| avail[i]).collect();
                Case { topology, available, required, size }
            })
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(160))]

    #[test]
    fn optimizer_matches_reference_enumeration(case in arb_case()) {
        let t = Topology::new(&case.topology).unwrap();
        let mut required = case.required.clone();
        required.sort_unstable();
        required.dedup();
        let got = BestEffortPolicy::new(&t).best_partition(&case.available, &required, case.size).unwrap();
        let want = oracle::best_effort(&t, &case.available, &required, case.size);
        match (got, want) {
            (None, None) => {}
            (Some(got), Some(want)) => {
                prop_assert_eq!(got.score, want.score);
                let want_sets: Vec<(Vec<usize>, usize)> = want
                    .partition
                    .iter()
                    .map(|s| (s.iter().flatten().copied().collect(), s.iter().filter(|x| x.is_none()).count()))
                    .collect();
                let got_sets: Vec<(Vec<usize>, usize)> =
                    got.sets.iter().map(|s| (s.devices.clone(), s.padding)).collect();
                prop_assert_eq!(got_sets, want_sets);
                prop_assert_eq!(got.upstream, want.upstream);
                prop_assert_eq!(got.chosen, want.chosen);

                let alloc = BestEffortPolicy::new(&t).allocate(&case.available, &required, case.size).unwrap();
                prop_assert_eq!(alloc.devices.len(), case.size);
                prop_assert!(required.iter().all(|r| alloc.devices.contains(r)));
                prop_assert_eq!(alloc.score, t.set_score(&alloc.devices).unwrap());
            }
            (got, want) => prop_assert!(false, "optimizer {:?} vs oracle {:?}", got, want),
        }
    }
}

/// A symmetric topology of `n` GPUs and a copy where GPU `from` lists `other` (nothing when empty) for GPU
/// `to` instead, chosen so the pair's two directions disagree.
#[derive(Debug, Clone)]
struct AsymmetricCase {
    n: usize,
    symmetric: DeviceTopology,
    asymmetric: DeviceTopology,
    pair: (usize, usize),
}

fn sorted(links: Option<&Vec<P2PLinkType>>) -> Vec<P2PLinkType> {
    let mut v = links.cloned().unwrap_or_default();
    v.sort_unstable();
    v
}

fn arb_asymmetric_case() -> impl Strategy<Value = AsymmetricCase> {
    (2usize..=8).prop_flat_map(|n| {
        (proptest::collection::vec(link_list(), n * (n - 1) / 2), 0..n, 1..n, link_list()).prop_filter_map(
            "the edit leaves the pair symmetric",
            move |(links, from, offset, other)| {
                let to = (from + offset) % n;
                let mut it = links.into_iter();
                let symmetric = oracle::symmetric(n, |_, _| it.next().unwrap_or_default());
                let mut asymmetric = symmetric.clone();
                let row = &mut asymmetric.gpus[from].links;
                if other.is_empty() {
                    row.remove(&to);
                } else {
                    row.insert(to, other);
                }
                let forward = sorted(asymmetric.gpus[from].links.get(&to));
                let backward = sorted(asymmetric.gpus[to].links.get(&from));
                (forward != backward).then_some(AsymmetricCase {
                    n,
                    symmetric,
                    asymmetric,
                    pair: (from.min(to), from.max(to)),
                })
            },
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// One asymmetric pair never drops the topology: the strict constructor refuses it naming the pair, the
    /// lenient one (the scheduler's, through [`NodeLinks`]) scores exactly that pair 0 and keeps every other
    /// pair's score and strongest link.
    #[test]
    fn one_asymmetric_pair_never_drops_the_other_pairs(case in arb_asymmetric_case()) {
        let (a, b) = case.pair;
        let strict = Topology::new(&case.asymmetric).unwrap_err();
        prop_assert!(
            matches!(strict, vgpu_core::topology::TopologyError::Asymmetric { a: x, b: y, .. } if (x, y) == (a, b)),
            "{}", strict
        );
        let want = Topology::new(&case.symmetric).unwrap();
        let got = Topology::new_lenient(&case.asymmetric).unwrap();
        let pairs: Vec<(usize, usize)> = got.asymmetric_pairs().iter().map(|p| (p.a, p.b)).collect();
        prop_assert_eq!(pairs, vec![(a, b)]);
        let want_links = NodeLinks::new(&case.symmetric).unwrap();
        let got_links = NodeLinks::new(&case.asymmetric).unwrap();
        prop_assert_eq!(got_links.asymmetric_pairs(), got.asymmetric_pairs());
        for x in 0..case.n {
            for y in 0..case.n {
                let (gx, gy) = (x as u32, y as u32);
                if (x.min(y), x.max(y)) == (a, b) {
                    prop_assert_eq!(got.pair_score(x, y), Ok(0));
                    prop_assert_eq!(got_links.pair_score(gx, gy), 0);
                    prop_assert_eq!(got_links.strongest(gx, gy), 0);
                } else {
                    prop_assert_eq!(got.pair_score(x, y), want.pair_score(x, y), "pair {}-{}", x, y);
                    prop_assert_eq!(got_links.pair_score(gx, gy), want_links.pair_score(gx, gy));
                    prop_assert_eq!(got_links.strongest(gx, gy), want_links.strongest(gx, gy));
                }
            }
        }
        let all: Vec<usize> = (0..case.n).collect();
        let lost = want.pair_score(a, b).unwrap();
        prop_assert_eq!(got.set_score(&all).unwrap(), want.set_score(&all).unwrap() - lost);
    }
}
