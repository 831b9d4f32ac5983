//! The fuzz entries shared by the cargo-fuzz targets (`fuzz_targets/*.rs`, nightly, libFuzzer) and the stable
//! proptest harness (`vgpu-core/tests/fuzz_entries.rs`, `vgpu-scheduler/tests/fuzz_extender.rs`), which
//! compile these same files through `#[path]`: one function per decoder, so a target and its stable run
//! cannot drift. This library has no libFuzzer dependency.
//!
//! | module | entries |
//! |---|---|
//! | [`decoders`] | `vgpu-core`: annotations, node config files, `vgpu.config`, `devices.json`, quantities |
//! | [`extender`] | `vgpu-scheduler`: the extender's request bodies, through the real router |
//! | [`corpus`] | seeds and byte mutations for the stable harness |

pub mod corpus;
pub mod decoders;
pub mod extender;
