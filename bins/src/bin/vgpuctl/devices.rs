//! `vgpuctl devices`: list the GPUs a backend sees, optionally with the `nvidia-smi topo -m` link matrix.

use std::{
    path::{Path, PathBuf},
    process::ExitCode,
};

use serde_json::{Value, json};
use vgpu_core::backend::{BackendKind, DeviceBackend, MigLayout, MockConfigError, mock::MockBackend};
use vgpu_nvml::{
    BackendChoice, SelectOptions, open_backend,
    select::OpenedBackend,
    topology::{render_topo, topo_label},
};

/// Arguments of `vgpuctl devices`.
#[derive(Debug, clap::Args)]
pub struct DevicesArgs {
    /// Backend: auto (by the GPU vendors on the PCI bus), nvml, metax or mock.
    #[arg(long, default_value = "auto", value_parser = parse_choice)]
    pub backend: BackendChoice,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Also print the GPU link matrix (NV#, PIX, PXB, PHB, NODE, SYS; X on the diagonal).
    #[arg(long)]
    pub topology: bool,
    /// The mock node description (YAML or JSON), for --backend mock (at most 4 MiB unless --max-bytes).
    #[arg(long, value_name = "FILE")]
    pub mock_config: Option<PathBuf>,
    /// Where sysfs is mounted (for auto, metax and NUMA nodes).
    #[arg(long, value_name = "DIR")]
    pub sysfs_root: Option<PathBuf>,
}

fn parse_choice(text: &str) -> Result<BackendChoice, String> {
    text.parse().map_err(|e: vgpu_nvml::select::UnknownChoice| e.to_string())
}

/// Lists the devices; exit 0, or 2 with the message on stderr.
pub fn run(args: DevicesArgs, max_bytes: Option<u64>) -> ExitCode {
    match render(&args, crate::input::cap(max_bytes, crate::input::DOCUMENT_CAP)) {
        Ok(text) => crate::output::print(&text, ExitCode::SUCCESS),
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::from(2)
        }
    }
}

fn render(args: &DevicesArgs, cap: u64) -> Result<String, String> {
    let opened = match (args.backend, &args.mock_config) {
        (BackendChoice::Kind(BackendKind::Mock), Some(file)) => open_mock(file, cap)?,
        _ => {
            let mut options = SelectOptions::default();
            if let Some(root) = &args.sysfs_root {
                options = options.with_sysfs_root(root);
            }
            if let Some(file) = &args.mock_config {
                options = options.with_mock_config(file);
            }
            open_backend(args.backend, &options).map_err(|e| e.to_string())?
        }
    };
    for warning in &opened.warnings {
        eprintln!("warning: {warning}");
    }
    if args.json { json_text(&opened, args.topology) } else { table_text(&opened, args.topology) }
}

/// The mock backend from its description file, read through the bounded reader (`open_backend` would read
/// the whole file): `.json` as JSON, anything else as YAML, errors naming the file.
fn open_mock(file: &Path, cap: u64) -> Result<OpenedBackend, String> {
    let text = crate::input::read_file("mock description", file, cap).map_err(|e| e.to_string())?;
    let parsed = if file.extension().is_some_and(|ext| ext.eq_ignore_ascii_case("json")) {
        MockBackend::from_json_str(&text)
    } else {
        MockBackend::from_yaml_str(&text)
    };
    let name = file.display().to_string();
    let backend = parsed
        .map_err(|e| match e {
            MockConfigError::Parse { message, .. } => MockConfigError::Parse { source_name: name, message },
            MockConfigError::Invalid { field, message, .. } => {
                MockConfigError::Invalid { source_name: name, field, message }
            }
            other => other,
        })
        .map_err(|e| e.to_string())?;
    Ok(OpenedBackend {
        backend: Box::new(backend),
        kind: BackendKind::Mock,
        driver: None,
        warnings: Vec::new(),
    })
}

fn mig_text(layout: &MigLayout) -> String {
    match layout.instances.len() {
        0 => layout.mode.to_string(),
        n => format!("{} ({n})", layout.mode),
    }
}

fn table_text(opened: &OpenedBackend, with_topology: bool) -> Result<String, String> {
    let backend: &dyn DeviceBackend = opened.backend.as_ref();
    let devices = backend.devices().map_err(|e| e.to_string())?;
    let mut out = format!("Backend: {}", opened.kind);
    if let Some(driver) = &opened.driver {
        out.push_str(&format!(", driver {}", driver.driver_version));
        if let Some((major, minor)) = driver.cuda_version {
            out.push_str(&format!(", CUDA {major}.{minor}"));
        }
    }
    out.push_str(&format!(", {} GPU(s)\n", devices.len()));
    let mut rows = vec![
        ["INDEX", "UUID", "NAME", "MEMORY(MiB)", "USED(MiB)", "BUS-ID", "NUMA", "CC", "MIG"]
            .map(str::to_owned),
    ];
    for gpu in &devices {
        let used = backend
            .memory_usage(gpu.index)
            .map_or_else(|_| "-".to_owned(), |m| (m.used_bytes >> 20).to_string());
        let mig = backend.mig_layout(gpu.index).map_or_else(|_| "-".to_owned(), |l| mig_text(&l));
        rows.push([
            gpu.index.to_string(),
            gpu.uuid.clone(),
            gpu.type_name.clone(),
            gpu.memory_mib.to_string(),
            used,
            gpu.bus_id.clone(),
            gpu.numa_node.map_or_else(|| "-".to_owned(), |n| n.to_string()),
            gpu.capability.to_string(),
            mig,
        ]);
    }
    let mut widths = [0usize; 9];
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    for row in &rows {
        let line: Vec<String> = row.iter().zip(widths).map(|(cell, w)| format!("{cell:<w$}")).collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    if with_topology {
        let matrix = backend.topology().map_err(|e| e.to_string())?;
        out.push('\n');
        out.push_str(&render_topo(&matrix));
    }
    Ok(out)
}

fn json_text(opened: &OpenedBackend, with_topology: bool) -> Result<String, String> {
    let backend: &dyn DeviceBackend = opened.backend.as_ref();
    let devices = backend.devices().map_err(|e| e.to_string())?;
    let mut list = Vec::with_capacity(devices.len());
    for gpu in &devices {
        let memory = backend.memory_usage(gpu.index).ok();
        let mig = backend.mig_layout(gpu.index).ok();
        list.push(json!({
            "index": gpu.index,
            "uuid": gpu.uuid,
            "name": gpu.type_name,
            "vendor": gpu.vendor.to_string(),
            "memoryMiB": gpu.memory_mib,
            "usedMemoryMiB": memory.map(|m| m.used_bytes >> 20),
            "busId": gpu.bus_id,
            "numa": gpu.numa_node,
            "capability": gpu.capability.to_string(),
            "healthy": gpu.health.is_healthy(),
            "mig": mig.as_ref().map(|l| l.mode.to_string()),
            "migDevices": mig.map(|l| l.instances.iter().map(|m| json!({
                "uuid": m.uuid, "profile": m.profile.to_string(), "memoryMiB": m.memory_mib,
            })).collect::<Vec<_>>()).unwrap_or_default(),
        }));
    }
    let mut doc = json!({
        "backend": opened.kind.to_string(),
        "driver": opened.driver.as_ref().map(|d| json!({
            "version": d.driver_version,
            "cuda": d.cuda_version.map(|(major, minor)| format!("{major}.{minor}")),
            "nvml": d.nvml_version,
        })),
        "devices": list,
        "warnings": opened.warnings,
    });
    if with_topology {
        let matrix = backend.topology().map_err(|e| e.to_string())?;
        let n = matrix.len();
        let labels: Vec<Vec<String>> = (0..n)
            .map(|i| {
                (0..n).map(|j| if i == j { "X".to_owned() } else { topo_label(matrix.links(i, j)) }).collect()
            })
            .collect();
        if let Value::Object(map) = &mut doc {
            map.insert("topology".to_owned(), json!({ "matrix": labels, "links": matrix.rows() }));
        }
    }
    serde_json::to_string_pretty(&doc).map(|text| text + "\n").map_err(|e| e.to_string())
}
