//! The cargo-fuzz entries for the extender's request bodies (`fuzz/src/extender.rs`), run on stable: every
//! seed in `fuzz/seeds/<target>/`, then mutated seeds and arbitrary bytes for a bounded number of cases per
//! target (`fuzz/stable/harness.rs`: `VGPU_FUZZ_CASES`, `VGPU_FUZZ_SECONDS`, `PROPTEST_RNG_SEED`), each one
//! `POST`ed through the real router. The same entry functions are the libFuzzer targets
//! (`fuzz/fuzz_targets/*.rs`), so the two cannot drift; [`targets_match_the_fuzz_crate`] checks that every
//! entry (of both entry modules) has its target, its `[[bin]]` and its seeds, and nothing else is there.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::path::Path;

#[path = "../../fuzz/src/corpus.rs"]
mod corpus;
#[path = "../../fuzz/src/decoders.rs"]
#[allow(dead_code)]
mod decoders;
#[path = "../../fuzz/src/extender.rs"]
mod extender;
#[path = "../../fuzz/stable/harness.rs"]
mod harness;

fn run(target: &str) {
    let (_, entry) = extender::TARGETS.iter().find(|(name, _)| *name == target).expect("a known target");
    harness::run(&corpus::seeds_root(env!("CARGO_MANIFEST_DIR")), target, *entry, harness::cases(1000));
}

#[test]
fn extender_args() {
    run("extender_args");
}

#[test]
fn extender_binding_args() {
    run("extender_binding_args");
}

#[test]
fn extender_preemption_args() {
    run("extender_preemption_args");
}

#[test]
fn targets_match_the_fuzz_crate() {
    let fuzz = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    let entries: BTreeSet<String> =
        decoders::TARGETS.iter().chain(extender::TARGETS).map(|(n, _)| (*n).to_owned()).collect();
    assert_eq!(entries.len(), decoders::TARGETS.len() + extender::TARGETS.len(), "a target name is repeated");
    let stems = |dir: &Path, ext: Option<&str>| -> BTreeSet<String> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| ext.is_none_or(|x| p.extension().is_some_and(|e| e == x)))
            .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
            .collect()
    };
    assert_eq!(stems(&fuzz.join("fuzz_targets"), Some("rs")), entries, "fuzz/fuzz_targets/*.rs");
    assert_eq!(stems(&fuzz.join("seeds"), None), entries, "fuzz/seeds/*/");
    let manifest = std::fs::read_to_string(fuzz.join("Cargo.toml")).unwrap();
    let bins: BTreeSet<String> = manifest
        .split("[[bin]]")
        .skip(1)
        .filter_map(|b| b.lines().find_map(|l| l.trim().strip_prefix("name = ")))
        .map(|n| n.trim_matches('"').to_owned())
        .collect();
    assert_eq!(bins, entries, "[[bin]] targets of fuzz/Cargo.toml");
    for name in &entries {
        let source = std::fs::read_to_string(fuzz.join("fuzz_targets").join(format!("{name}.rs"))).unwrap();
        assert!(
            source.contains(&format!("::{name}(data)")),
            "fuzz_targets/{name}.rs does not call its entry"
        );
    }
}
