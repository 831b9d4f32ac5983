//! `vgpuctl topology`: score GPU sets and run the best-effort allocation on a `node-device-topology` file.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use serde::Serialize;
use vgpu_core::topology::{BestEffortPolicy, GpuSetError, Topology};

use crate::input;

/// Longest range (`a-b`) a GPU list may spell out.
const MAX_RANGE: usize = 4096;

/// `vgpuctl topology` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum TopologyCommand {
    /// Best-effort allocation (go-gpuallocator semantics): prints `{"devices":[...],"score":S}`.
    Allocate(AllocateArgs),
    /// Set score of a GPU set: prints `{"score":S}`.
    Score(ScoreArgs),
}

/// Arguments of `vgpuctl topology allocate`.
#[derive(Debug, clap::Args)]
pub struct AllocateArgs {
    /// File holding a `node-device-topology` annotation value (JSON; at most 256 KiB unless --max-bytes).
    #[arg(long, value_name = "FILE")]
    pub topology: PathBuf,
    /// Free GPUs: comma-separated indices and ranges, e.g. `0-3,6`.
    #[arg(long, value_name = "LIST", value_parser = parse_list)]
    pub available: GpuList,
    /// GPUs the set must include (same syntax as `--available`).
    #[arg(long, value_name = "LIST", value_parser = parse_list, default_value = "")]
    pub required: GpuList,
    /// Number of GPUs to allocate.
    #[arg(long, value_name = "N")]
    pub size: usize,
}

/// Arguments of `vgpuctl topology score`.
#[derive(Debug, clap::Args)]
pub struct ScoreArgs {
    /// File holding a `node-device-topology` annotation value (JSON; at most 256 KiB unless --max-bytes).
    #[arg(long, value_name = "FILE")]
    pub topology: PathBuf,
    /// The GPU set: comma-separated indices and ranges, e.g. `0-3`.
    #[arg(long, value_name = "LIST", value_parser = parse_list)]
    pub set: GpuList,
}

/// A parsed GPU index list (order and duplicates kept as given).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GpuList(pub Vec<usize>);

/// Parses `0,2,4-7`: comma-separated indices or inclusive ascending ranges; empty text is the empty list.
pub fn parse_list(text: &str) -> Result<GpuList, String> {
    let mut out = Vec::new();
    if text.trim().is_empty() {
        return Ok(GpuList(out));
    }
    for item in text.split(',') {
        let item = item.trim();
        let index = |s: &str| {
            s.trim().parse::<usize>().map_err(|_| {
                format!(
                    "invalid GPU list {text:?}: {s:?} is not a GPU index (expected a non-negative integer)"
                )
            })
        };
        if item.is_empty() {
            return Err(format!("invalid GPU list {text:?}: empty item (expected indices like 0,2,4-7)"));
        }
        match item.split_once('-') {
            Some((lo, hi)) => {
                let (lo, hi) = (index(lo)?, index(hi)?);
                if lo > hi {
                    return Err(format!("invalid GPU list {text:?}: range {item:?} is descending"));
                }
                if hi - lo >= MAX_RANGE {
                    return Err(format!(
                        "invalid GPU list {text:?}: range {item:?} spans more than {MAX_RANGE} GPUs"
                    ));
                }
                out.extend(lo..=hi);
            }
            None => out.push(index(item)?),
        }
    }
    Ok(GpuList(out))
}

#[derive(Serialize)]
struct AllocateOutput<'a> {
    devices: &'a [usize],
    score: u64,
}

#[derive(Serialize)]
struct ScoreOutput {
    score: u64,
}

/// Runs a `topology` subcommand; exit code 2 on bad input files or lists.
pub fn run(cmd: TopologyCommand, max_bytes: Option<u64>) -> ExitCode {
    match execute(cmd, input::cap(max_bytes, input::ANNOTATION_CAP)) {
        Ok(line) => crate::output::print_line(&line, ExitCode::SUCCESS),
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::from(2)
        }
    }
}

fn execute(cmd: TopologyCommand, cap: u64) -> Result<String, String> {
    match cmd {
        TopologyCommand::Allocate(args) => {
            let topology = load(&args.topology, cap)?;
            let policy = BestEffortPolicy::new(&topology);
            let got = policy
                .allocate(&args.available.0, &args.required.0, args.size)
                .map_err(|e| list_error(&args.available.0, e))?;
            to_json(&AllocateOutput { devices: &got.devices, score: got.score })
        }
        TopologyCommand::Score(args) => {
            let topology = load(&args.topology, cap)?;
            let score = topology.set_score(&args.set.0).map_err(|e| format!("--set: {e}"))?;
            to_json(&ScoreOutput { score })
        }
    }
}

/// Names the option whose list holds the offending GPU.
fn list_error(available: &[usize], e: GpuSetError) -> String {
    let flag = match &e {
        GpuSetError::UnknownGpu { index, .. } if !available.contains(index) => "--required",
        _ => "--available",
    };
    format!("{flag}: {e}")
}

/// Reads the topology file (an annotation value: at most `cap` bytes, read no further) and decodes it.
fn load(path: &Path, cap: u64) -> Result<Topology, String> {
    let text = input::read_file("topology file", path, cap).map_err(|e| e.to_string())?;
    Topology::decode(&text).map_err(|e| format!("invalid topology file {}: {e}", path.display()))
}

fn to_json<T: Serialize>(value: &T) -> Result<String, String> {
    serde_json::to_string(value).map_err(|e| format!("cannot encode output: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists() {
        assert_eq!(parse_list("").unwrap(), GpuList(vec![]));
        assert_eq!(parse_list("0,2, 4-6").unwrap(), GpuList(vec![0, 2, 4, 5, 6]));
        assert_eq!(parse_list("3-3").unwrap(), GpuList(vec![3]));
        assert!(parse_list("0,,1").unwrap_err().contains("empty item"));
        assert!(parse_list("0,x").unwrap_err().contains(r#""x" is not a GPU index"#));
        assert!(parse_list("-1").is_err());
        assert!(parse_list("3-1").unwrap_err().contains("descending"));
        assert!(parse_list("0-99999999").unwrap_err().contains("spans more than"));
    }
}
