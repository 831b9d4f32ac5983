//! Every boolean flag of every binary takes Go's forms (`vgpu_bins::go_flags`): `--flag`, `--flag=VALUE` with
//! one of `strconv.ParseBool`'s spellings; any other value exits 2 naming the flag and the value, and
//! `--flag VALUE` with a space does not give the flag that value (clap refuses the stray argument).
//!
//! How a flag is proved parsed without a cluster: each binary gets base arguments that make it stop at a
//! known check of its own after clap ("<bin>: ..." on stderr, exit 2); a flag form clap accepted reaches that
//! check, one it refused stops at clap's "error: invalid value ...". Where a flag's value changes which check
//! fails, that is asserted too (true and false really differ).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Output;

use assert_cmd::Command;

/// A binary, arguments that stop it at one of its own checks, what that check says, and its boolean flags.
struct Case {
    bin: &'static str,
    exe: &'static str,
    base: &'static [&'static str],
    stops_at: &'static str,
    flags: &'static [&'static str],
}

const CASES: &[Case] = &[
    Case {
        bin: "vgpu-device-plugin",
        exe: env!("CARGO_BIN_EXE_vgpu-device-plugin"),
        base: &[],
        stops_at: "--node-name (or NODE_NAME) is required",
        flags: &[
            "gds-enabled",
            "mofed-enabled",
            "gdrcopy-enabled",
            "open-kernel-modules",
            "imex-required",
            "gfd-labels",
        ],
    },
    Case {
        bin: "vgpu-scheduler-extender",
        exe: env!("CARGO_BIN_EXE_vgpu-scheduler-extender"),
        base: &["--stuck-grace-period=500ms"],
        stops_at: "invalid value for --stuck-grace-period",
        flags: &["enable-tls", "enable-rbac", "watch-lease", "leader-elect", "success-events"],
    },
    Case {
        bin: "vgpu-device-monitor",
        exe: env!("CARGO_BIN_EXE_vgpu-device-monitor"),
        base: &["--min-scrape-interval=10ms"],
        stops_at: "invalid value for --min-scrape-interval",
        flags: &["enable-rbac", "enable-tls", "enable-dra-monitor"],
    },
    Case {
        bin: "vgpu-kubelet-plugin",
        exe: env!("CARGO_BIN_EXE_vgpu-kubelet-plugin"),
        base: &[],
        stops_at: "--node-name (or NODE_NAME) is required",
        flags: &["physical-gpu-status", "enable-rbac"],
    },
    Case {
        bin: "vgpu-webhook",
        exe: env!("CARGO_BIN_EXE_vgpu-webhook"),
        base: &["--server-bind-port=0"],
        stops_at: "invalid --server-bind-port 0",
        flags: &["dra-admission-enabled", "default-convert2-dra", "combined-resource-claim"],
    },
    Case {
        bin: "vgpu-controller",
        exe: env!("CARGO_BIN_EXE_vgpu-controller"),
        base: &["--server-bind-port=0"],
        stops_at: "invalid --server-bind-port 0",
        flags: &["enable-rbac", "leader-elect"],
    },
    Case {
        bin: "vgpu-node-agent",
        exe: env!("CARGO_BIN_EXE_vgpu-node-agent"),
        base: &["--node-name= "],
        stops_at: "invalid --node-name \"\"",
        flags: &["allow-control-plane", "disable-pci-uevents"],
    },
    Case {
        bin: "vgpu-mig-manager",
        exe: env!("CARGO_BIN_EXE_vgpu-mig-manager"),
        base: &["--node-name= "],
        stops_at: "invalid --node-name \"\"",
        flags: &["gfd-labels"],
    },
];

/// Environment variables that would change what the binaries read.
const CLEARED: &[&str] = &[
    "NODE_NAME",
    "KUBECONFIG",
    "FEATURE_GATES",
    "POD_NAMESPACE",
    "POD_NAME",
    "GDS_ENABLED",
    "MOFED_ENABLED",
    "GDRCOPY_ENABLED",
    "IMEX_REQUIRED",
    "IMEX_CHANNEL_IDS",
    "CGROUP_DRIVER",
    "VENDORS_CONFIGMAP",
    "MIG_CONFIGMAP",
    "MIG_STRATEGY",
    "RUST_LOG",
    "KUBERNETES_SERVICE_HOST",
    "KUBE_API_QPS",
    "KUBE_API_BURST",
];

fn run(exe: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(exe);
    for var in CLEARED {
        cmd.env_remove(var);
    }
    // No ~/.kube/config either: a binary that gets past its checks fails at once for want of a cluster.
    cmd.env("HOME", "/nonexistent")
        .envs(env.iter().copied())
        .args(args)
        .timeout(std::time::Duration::from_secs(60))
        .output()
        .unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Clap accepted the arguments: the binary stopped at its own check.
fn assert_reaches(case: &Case, out: &Output, what: &str) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(2), "{} {what}: {err}", case.bin);
    assert!(
        err.contains(&format!("{}: ", case.bin)) && err.contains(case.stops_at) && !err.contains("Usage:"),
        "{} {what}: expected its own check ({}), got: {err}",
        case.bin,
        case.stops_at
    );
}

#[test]
fn every_go_form_of_every_bool_flag_parses() {
    let mut forms: Vec<String> = vgpu_bins::go_flags::GO_BOOL_FORMS.iter().map(|v| format!("={v}")).collect();
    forms.push(String::new());
    for case in CASES {
        for flag in case.flags {
            for form in &forms {
                let arg = format!("--{flag}{form}");
                let mut args: Vec<&str> = case.base.to_vec();
                args.push(&arg);
                let out = run(case.exe, &args, &[]);
                assert_reaches(case, &out, &arg);
            }
        }
    }
}

#[test]
fn a_wrong_value_exits_2_naming_the_flag_and_the_value() {
    for case in CASES {
        for flag in case.flags {
            // Empty and `true` in any case are what vgpu-manager reads from the environment variables that
            // back some flags (`GDS_ENABLED=`), so those flags take them (`go_flags::parse_go_bool_env`).
            let env_backed = ENV_BACKED.iter().any(|(f, _)| f == flag);
            let bad_values: &[&str] =
                if env_backed { &["maybe", "yes", "on"] } else { &["maybe", "yes", "", "tRUE"] };
            for bad in bad_values {
                let arg = format!("--{flag}={bad}");
                let mut args: Vec<&str> = case.base.to_vec();
                args.push(&arg);
                let out = run(case.exe, &args, &[]);
                let err = stderr(&out);
                assert_eq!(out.status.code(), Some(2), "{} {arg}: {err}", case.bin);
                assert!(
                    err.contains(&format!("invalid value '{bad}' for '--{flag}"))
                        && err.contains(&format!("{bad:?} is not a boolean"))
                        && err.contains("1, t, T, TRUE, true, True, 0, f, F, FALSE, false, False"),
                    "{} {arg}: {err}",
                    case.bin
                );
            }
        }
    }
}

#[test]
fn a_value_after_a_space_is_not_the_flags() {
    for case in CASES {
        for flag in case.flags {
            let mut args: Vec<&str> = case.base.to_vec();
            let arg = format!("--{flag}");
            args.extend([arg.as_str(), "false"]);
            let out = run(case.exe, &args, &[]);
            let err = stderr(&out);
            assert_eq!(out.status.code(), Some(2), "{} {arg} false: {err}", case.bin);
            // vgpu-node-agent has a subcommand (vfio-switch): clap reports the stray word as an unknown one.
            let refused = err.contains("unexpected argument 'false'")
                || err.contains("unrecognized subcommand 'false'");
            assert!(refused, "{} {arg} false: {err}", case.bin);
        }
    }
}

/// Each binary's `--help`: every long option takes a value (`--x <V>`, `--x[=<BOOL>]`) but `--help` and
/// `--version`, so a bool flag declared without the Go form (clap's `--flag` only) shows up here.
#[test]
fn no_bool_flag_is_left_without_the_go_forms() {
    for case in CASES {
        let out = run(case.exe, &["--help"], &[]);
        assert!(out.status.success(), "{} --help", case.bin);
        let help = String::from_utf8(out.stdout).unwrap();
        let bare: Vec<&str> = help
            .lines()
            .map(str::trim_start)
            // Option lines only: `--name ...` or `-x, --name ...` (not the `- value: ...` lists).
            .filter(|l| {
                l.starts_with("--")
                    || (l.len() > 5
                        && l.as_bytes()[0] == b'-'
                        && l.as_bytes()[1].is_ascii_alphanumeric()
                        && &l[2..5] == ", -")
            })
            .filter_map(|l| {
                let long = l.split_whitespace().find(|w| w.starts_with("--"))?;
                let name = long.trim_end_matches(',');
                (!name.contains('[') && !name.contains('=')).then_some((name, l))
            })
            .filter(|(name, line)| {
                let after = line.split_once(name).map_or("", |(_, rest)| rest);
                !after.trim_start().starts_with('<')
            })
            .map(|(name, _)| name)
            .filter(|name| *name != "--help" && *name != "--version")
            .collect();
        assert!(bare.is_empty(), "{}: flags without a value: {bare:?}\n{help}", case.bin);
        for flag in case.flags {
            assert!(help.contains(&format!("--{flag}[=<BOOL>]")), "{}: --{flag}\n{help}", case.bin);
        }
    }
}

/// The device plugin's flags that an environment variable also sets, and the variable.
const ENV_BACKED: &[(&str, &str)] = &[
    ("gds-enabled", "GDS_ENABLED"),
    ("mofed-enabled", "MOFED_ENABLED"),
    ("gdrcopy-enabled", "GDRCOPY_ENABLED"),
    ("imex-required", "IMEX_REQUIRED"),
];

#[test]
fn env_backed_bools_take_the_same_forms() {
    let plugin = &CASES[0];
    for (_, var) in ENV_BACKED {
        for value in ["true", "False", "T", "0", "enabled", "DISABLED", " true ", ""] {
            let out = run(plugin.exe, &[], &[(var, value)]);
            assert_reaches(plugin, &out, &format!("{var}={value:?}"));
        }
        let out = run(plugin.exe, &[], &[(var, "maybe")]);
        let err = stderr(&out);
        let flag = format!("--{}", var.to_lowercase().replace('_', "-"));
        assert_eq!(out.status.code(), Some(2), "{var}=maybe: {err}");
        assert!(err.contains("invalid value 'maybe'") && err.contains(&flag), "{var}=maybe: {err}");
    }
}

/// Where a flag's value decides which check fails, `=false` and `=true` really differ.
#[test]
fn true_and_false_are_told_apart() {
    let extender = env!("CARGO_BIN_EXE_vgpu-scheduler-extender");
    let out = run(extender, &["--leader-elect=false"], &[]);
    assert_eq!(out.status.code(), Some(1), "gets as far as the cluster: {}", stderr(&out));
    for on in ["--leader-elect", "--leader-elect=True", "--leader-elect=1"] {
        let out = run(extender, &[on], &[]);
        assert_eq!(out.status.code(), Some(2), "{on}");
        assert!(stderr(&out).contains("--leader-elect-resource-name"), "{on}: {}", stderr(&out));
    }
    // Both lease modes explicitly off and on: only both on conflict.
    let out = run(extender, &["--watch-lease=false", "--leader-elect=t"], &[]);
    assert!(stderr(&out).contains("--leader-elect-resource-name"), "{}", stderr(&out));
    let out = run(extender, &["--watch-lease=T", "--leader-elect=TRUE"], &[]);
    assert!(stderr(&out).contains("mutually exclusive"), "{}", stderr(&out));
    let out = run(extender, &["--enable-tls=TRUE"], &[]);
    assert!(
        stderr(&out).contains("--tls-cert-file and --tls-key-file are both required"),
        "{}",
        stderr(&out)
    );
    let out = run(extender, &["--enable-tls=false", "--client-ca-file=/tmp/ca.pem"], &[]);
    assert!(stderr(&out).contains("--client-ca-file: requires --enable-tls"), "{}", stderr(&out));

    let monitor = env!("CARGO_BIN_EXE_vgpu-device-monitor");
    let out = run(monitor, &["--enable-tls=f"], &[]);
    assert!(stderr(&out).contains("--node-name (or NODE_NAME) is required"), "{}", stderr(&out));
    let out = run(monitor, &["--enable-tls=t"], &[]);
    assert!(
        stderr(&out).contains("--tls-cert-file and --tls-key-file are both required"),
        "{}",
        stderr(&out)
    );

    let webhook = env!("CARGO_BIN_EXE_vgpu-webhook");
    let out = run(webhook, &["--default-convert2-dra=false", "--combined-resource-claim=true"], &[]);
    assert!(
        stderr(&out).contains("--combined-resource-claim requires --default-convert2-dra"),
        "{}",
        stderr(&out)
    );
    // On: the configuration is valid and the webhook gets as far as its missing certificate.
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\nusers: [{name: u, user: {token: t}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n",
    )
    .unwrap();
    let cert_dir = format!("--cert-dir={}", dir.path().display());
    let kubeconfig = format!("--kubeconfig={}", kubeconfig.display());
    let out = run(
        webhook,
        &["--default-convert2-dra=True", "--combined-resource-claim", &cert_dir, &kubeconfig],
        &[],
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("tls.crt"), "{}", stderr(&out));
}
