//! Seeds and byte mutations for the stable harness (the proptest tests that run the fuzz entries without
//! libFuzzer). `std` only: compiled by the `vgpu-fuzz` crate and, through `#[path]`, by the stable tests.

use std::path::{Path, PathBuf};

/// The checked-in seeds folder (`fuzz/seeds/`), from a crate one level below the repository root.
pub fn seeds_root(manifest_dir: &str) -> PathBuf {
    Path::new(manifest_dir).join("..").join("fuzz").join("seeds")
}

/// The seeds of one target (`<root>/<target>/*`, in file-name order); empty when the folder is missing.
pub fn seeds(root: &Path, target: &str) -> Vec<Vec<u8>> {
    let Ok(dir) = std::fs::read_dir(root.join(target)) else { return Vec::new() };
    let mut paths: Vec<PathBuf> =
        dir.filter_map(Result::ok).map(|e| e.path()).filter(|p| p.is_file()).collect();
    paths.sort();
    paths.into_iter().filter_map(|p| std::fs::read(p).ok()).collect()
}

/// Fragments worth inserting: JSON structure and edge values, the annotation grammars' separators, YAML and
/// comment markers, numbers at the limits, escapes, and bytes that are not UTF-8.
pub const TOKENS: &[&[u8]] = &[
    b"null",
    b"true",
    b"{",
    b"}",
    b"[",
    b"]",
    b"\"",
    b",",
    b":",
    b";",
    b"_",
    b"-",
    b"..",
    b"\\",
    b"\\u0000",
    b"\\ud800",
    b"\\\"",
    b"-1",
    b"0",
    b"1e309",
    b"-0.0",
    b"0.5",
    b"4294967296",
    b"9223372036854775808",
    b"18446744073709551616",
    b"Ki",
    b"Ei",
    b"m",
    b"//",
    b"/*",
    b"*/",
    b"\n",
    b"\r\n",
    b"\t",
    b" ",
    b"---\n",
    b"- ",
    b"&a",
    b"*a",
    b"!!binary ",
    b"~",
    b"{}",
    b"[]",
    b"\"\"",
    b"{\"a\":",
    b"[[[[[[[[",
    b"GPU-",
    b"\xff",
    b"\xc3\xa9",
    b"\xe2\x80\xa8",
    b"\"Pod\"",
    b"\"pod\"",
    b"\"NodeNames\"",
    b"\"nodenames\"",
    b"\"Nodes\"",
    b"\"PodUID\"",
    b"\"Node\"",
    b"\"NodeNameToMetaVictims\"",
    b"\"Pods\"",
    b"\"UID\"",
    b"\"metadata\"",
    b"\"annotations\"",
    b"\"resources\"",
    b"\"limits\"",
    b"\"nodeName\"",
    b"\"excludeDevices\"",
];

/// One edit of [`mutate`]: `kind` picks the edit, `at` the position (modulo the length), `arg` a byte, a
/// token or a length.
pub type Edit = (u8, u32, u32);

/// Applies `edits` to `seed` in order: flip bits, set, insert or delete a byte, insert a [`TOKENS`] entry,
/// duplicate or delete a run, truncate, or splice in a run of `donor` (another seed).
pub fn mutate(seed: &[u8], donor: &[u8], edits: &[Edit]) -> Vec<u8> {
    let mut data = seed.to_vec();
    for &(kind, at, arg) in edits {
        let len = data.len();
        let pos = at as usize % (len + 1);
        let run = (arg as usize % 64) + 1;
        match kind % 10 {
            0 if pos < len => data[pos] ^= (arg as u8) | 1,
            1 if pos < len => data[pos] = arg as u8,
            2 => data.insert(pos, arg as u8),
            3 if pos < len => {
                data.remove(pos);
            }
            4 | 5 => {
                let token = TOKENS[arg as usize % TOKENS.len()];
                data.splice(pos..pos, token.iter().copied());
            }
            6 => {
                let end = (pos + run).min(len);
                let copy = data[pos..end].to_vec();
                data.splice(pos..pos, copy);
            }
            7 => {
                let end = (pos + run).min(len);
                data.drain(pos..end);
            }
            8 => data.truncate(pos),
            9 if !donor.is_empty() => {
                let from = arg as usize % donor.len();
                let end = (from + run).min(donor.len());
                data.splice(pos..pos, donor[from..end].iter().copied());
            }
            _ => {}
        }
    }
    data
}
