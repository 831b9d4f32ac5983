//! `vgpuctl gates`: list, check and render feature gates (a CLI contract other tools rely on).

use std::{collections::BTreeMap, fmt::Write as _, path::PathBuf, process::ExitCode};

use vgpu_gates::{Component, FEATURE_GATES_ENV, RegistryKind, parse_values};

/// `vgpuctl gates` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum GatesCommand {
    /// Print every gate with its default, stage, registry and owning components.
    List {
        /// Only the gates this component accepts.
        #[arg(long)]
        component: Option<Component>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Validate a gate setting; print the component's effective gates as one JSON object.
    ///
    /// Exit 0 on success; exit 2 with the error(s) on stderr otherwise.
    Check {
        /// One of device-plugin, scheduler-extender, device-monitor, kubelet-plugin.
        #[arg(long)]
        component: Component,
        /// The `--feature-gates` value (`A=true,B=false`); may be repeated, applied in order.
        #[arg(long = "feature-gates", value_name = "GATE=BOOL,...")]
        feature_gates: Vec<String>,
        /// Read FEATURE_GATES from the environment (kubelet-plugin only; --feature-gates wins).
        #[arg(long)]
        from_env: bool,
    },
    /// Turn a Helm-values-style map ({GateName: bool}, YAML or JSON) into a validated
    /// `--feature-gates` string.
    Render {
        /// One of device-plugin, scheduler-extender, device-monitor, kubelet-plugin.
        #[arg(long)]
        component: Component,
        /// The values file: a bare gate map, or a chart values file (at most 4 MiB unless --max-bytes).
        #[arg(long)]
        values: PathBuf,
    },
}

/// Runs a `gates` subcommand.
pub fn run(cmd: GatesCommand, max_bytes: Option<u64>) -> ExitCode {
    let result = match cmd {
        GatesCommand::List { component, json } => list(component, json),
        GatesCommand::Check { component, feature_gates, from_env } => {
            check(component, feature_gates, from_env)
        }
        GatesCommand::Render { component, values } => {
            render(component, &values, crate::input::cap(max_bytes, crate::input::DOCUMENT_CAP))
        }
    };
    match result {
        Ok(text) => crate::output::print(&text, ExitCode::SUCCESS),
        Err(msg) => {
            eprintln!("{msg}");
            ExitCode::from(2)
        }
    }
}

#[derive(serde::Serialize)]
struct Row {
    name: &'static str,
    default: bool,
    stage: &'static str,
    registry: &'static str,
    components: Vec<&'static str>,
}

fn rows(only: Option<Component>) -> Vec<Row> {
    let mut rows = Vec::new();
    for kind in [RegistryKind::Core, RegistryKind::Dra] {
        let members: Vec<Component> =
            Component::ALL.into_iter().filter(|c| c.registry_kind() == kind).collect();
        let mut seen: BTreeMap<&'static str, Row> = BTreeMap::new();
        for c in &members {
            for info in c.registry().gate_infos() {
                seen.entry(info.name)
                    .or_insert_with(|| Row {
                        name: info.name,
                        default: info.spec.default,
                        stage: info.spec.stage.as_str(),
                        registry: kind.as_str(),
                        components: Vec::new(),
                    })
                    .components
                    .push(c.as_str());
            }
        }
        rows.extend(seen.into_values().filter(|r| only.is_none_or(|c| r.components.contains(&c.as_str()))));
    }
    rows.sort_by(|a, b| (a.name, a.registry).cmp(&(b.name, b.registry)));
    rows
}

/// The gate table (or JSON), ready to print.
fn list(only: Option<Component>, json: bool) -> Result<String, String> {
    let rows = rows(only);
    if json {
        let text = serde_json::to_string_pretty(&rows).map_err(|e| format!("cannot render JSON: {e}"))?;
        return Ok(text + "\n");
    }
    let width = rows.iter().map(|r| r.name.len()).max().unwrap_or(4).max(4);
    let mut out =
        format!("{:<width$}  {:<7}  {:<10}  {:<8}  COMPONENTS\n", "NAME", "DEFAULT", "STAGE", "REGISTRY");
    for r in rows {
        let _ = writeln!(
            out,
            "{:<width$}  {:<7}  {:<10}  {:<8}  {}",
            r.name,
            r.default,
            r.stage,
            r.registry,
            r.components.join(",")
        );
    }
    Ok(out)
}

/// The effective gates as one JSON line, ready to print.
fn check(component: Component, flag_values: Vec<String>, from_env: bool) -> Result<String, String> {
    if from_env && !component.reads_env() {
        return Err(format!(
            "--from-env applies only to kubelet-plugin: {component} does not read {FEATURE_GATES_ENV}"
        ));
    }
    let values: Vec<String> = if !flag_values.is_empty() {
        flag_values
    } else if from_env {
        match std::env::var(FEATURE_GATES_ENV) {
            Ok(v) => vec![v],
            Err(std::env::VarError::NotPresent) => Vec::new(),
            Err(std::env::VarError::NotUnicode(_)) => {
                return Err(format!("{FEATURE_GATES_ENV} is not valid UTF-8"));
            }
        }
    } else {
        Vec::new()
    };
    let refs: Vec<&str> = values.iter().map(String::as_str).collect();
    let configured = component.registry().configure_values(&refs).map_err(|e| e.to_string())?;
    for w in &configured.warnings {
        eprintln!("warning: {w}");
    }
    let text =
        serde_json::to_string(&configured.effective).map_err(|e| format!("cannot render JSON: {e}"))?;
    Ok(text + "\n")
}

/// The canonical `--feature-gates` value, ready to print.
fn render(component: Component, path: &std::path::Path, cap: u64) -> Result<String, String> {
    let text = crate::input::read_file("values file", path, cap).map_err(|e| e.to_string())?;
    let entries = parse_values(&text, component.chart_values_paths())
        .map_err(|e| format!("values file {}: {e}", path.display()))?;
    let configured = component.registry().configure_map(&entries).map_err(|e| e.to_string())?;
    for w in &configured.warnings {
        eprintln!("warning: {w}");
    }
    Ok(format!("{}\n", configured.canonical))
}
