#!/usr/bin/env python3
"""Helpers of charts/tests/monitoring.sh (python3 with PyYAML).

Subcommands:
  exprs RULES DASHBOARD OUT     every PromQL expression of the rule file and the dashboard (Grafana variables
                                replaced by sample values), written to OUT as a rule file of recording rules, for
                                `promtool check rules` to parse them
  names REPO RULES DASHBOARD    every metric name the rules and dashboard read must be one our Rust code exports
                                (or one of EXTERNAL, EXTERNAL_DCGM); prints them, exits 1 naming the unknown
                                ones; DASHBOARD "-" = none
  dashboard DASHBOARD           the dashboard's layout and wiring: unique panel ids, panels inside the 24-column
                                grid without overlaps, every panel and target on the ${datasource} variable,
                                every target with an expression
  dashboard-test REPO DASHBOARD OUT
                                a `promtool test rules` file asserting that every dashboard expression returns
                                samples (`absent(<expr>)` is empty) on synthetic series carrying the labels that
                                vgpu-monitor/src/metrics.rs's family table documents and the scheduler's families
                                (with the buckets of verb_duration_buckets), plus Prometheus' target labels
  rule-spec RENDERED OUT [NAME] the spec of the PrometheusRule in a `helm template` output, as a rule file
  merge-schema SCHEMA FRAGMENT  puts FRAGMENT at properties.monitoring of the values schema SCHEMA (in place), as
                                bins/tests/chart_gates.rs would
  same-groups A B               the rule files A and B hold the same groups (exit 1 naming the first difference)
  get RENDERED KIND NAME PATH   one field of one rendered object, as JSON (PATH: keys and list indexes joined
                                by "/", e.g. spec/podMetricsEndpoints/0/port)
  verify EXPECTATIONS           checks a file of tab-separated expectations about rendered files, one a line:
                                  kind    FILE KIND NAME            the object is there
                                  nokind  FILE KIND                 no object of that kind
                                  absent  FILE KIND NAME            no such object
                                  field   FILE KIND NAME PATH JSON  the field equals JSON
                                  nofield FILE KIND NAME PATH       the field is absent
                                  same    FILE KIND NAME PATH KIND2 NAME2 PATH2   two fields are equal
                                  subset  FILE KIND NAME PATH KIND2 NAME2 PATH2   the first map is part of the second
                                prints `ok:`/`FAIL:` per line; exits 1 when one failed
"""

import json
import pathlib
import re
import sys

import yaml

# Metric names the rules and dashboard read that are not ours: Prometheus' own scrape health and
# kube-state-metrics' container readiness (the extender alert without scraping).
EXTERNAL = {"up", "kube_pod_container_status_ready"}

# Upstream NVIDIA dcgm-exporter's gauges (default-counters.csv) that charts/gpu-module/files/alerts.yaml reads:
# NVIDIA's names, exported by the dcgm-exporter image, not by our code (the gpu-module chart's DCGM is
# chart-only: no test runs it, it needs a GPU).
EXTERNAL_DCGM = {"DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"}
EXTERNAL |= EXTERNAL_DCGM

PROMQL_WORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
    "offset", "inf", "nan", "atan2",
    # Aggregation operators (`sum by (x) (...)` puts no parenthesis right after the name).
    "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk",
    "quantile", "limitk", "limit_ratio",
}

# Grafana variables of the dashboard and sample values that keep the expression valid PromQL.
GRAFANA_VARS = [
    ("$__rate_interval", "5m"),
    ("$__range", "6h"),
    ("$__interval", "1m"),
    ("$scheduler_namespace", ".*"),
    ("$namespace", ".*"),
    ("$node", ".*"),
]


LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_yaml_docs(path):
    with open(path, encoding="utf-8") as f:
        return [d for d in yaml.load_all(f, Loader=LOADER) if d]


def dashboard_exprs(path):
    """(where, expr) of every panel target and query variable, Grafana variables replaced."""
    dash = json.loads(pathlib.Path(path).read_text(encoding="utf-8"))
    out = []

    def walk(panels):
        for p in panels:
            for t in p.get("targets", []):
                if t.get("expr"):
                    out.append((f'panel "{p.get("title")}" {t.get("refId")}', t["expr"]))
            walk(p.get("panels", []))

    walk(dash.get("panels", []))
    for v in dash.get("templating", {}).get("list", []):
        if v.get("type") != "query":
            continue
        q = v["query"]["query"] if isinstance(v.get("query"), dict) else v.get("query", "")
        m = re.fullmatch(r"\s*label_values\(\s*(.+?)\s*,\s*[a-zA-Z_][a-zA-Z0-9_]*\s*\)\s*", q)
        if not m:
            sys.exit(f"dashboard variable {v.get('name')}: expected label_values(<expr>, <label>), got {q!r}")
        out.append((f"variable {v.get('name')}", m.group(1)))
    res = []
    for where, e in out:
        for var, val in GRAFANA_VARS:
            e = e.replace(var, val)
        if "$" in e:
            sys.exit(f"dashboard {where}: unknown Grafana variable in {e!r}")
        res.append((where, e))
    return res


def rule_exprs(path):
    out = []
    for doc in load_yaml_docs(path):
        for g in doc.get("groups", []):
            for r in g.get("rules", []):
                out.append((f'rule {r.get("alert") or r.get("record")}', r["expr"]))
    return out


def metric_names(expr):
    """Metric names of a PromQL expression (no parser: strings, label matchers, ranges and grouping
    clauses are removed, then the identifiers that are not functions or keywords are metric names)."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    e = re.sub(r"'(?:[^'\\]|\\.)*'", "''", e)
    e = re.sub(r"\{[^}]*\}", "", e)
    e = re.sub(r"\[[^\]]*\]", "", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", r"\1", e)
    names = set()
    for m in re.finditer(r"(?<![\w.])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?", e):
        word, call = m.group(1), m.group(2)
        if call or word.lower() in PROMQL_WORDS:
            continue
        names.add(word)
    return names


def exported_names(repo):
    """Metric family names our crates export: quoted literals of non-comment lines of */src/**/*.rs, and
    for every `Registry::with_prefix("P")` (or `with_prefix(C)` with `const C: &str = "P"` in the same file)
    file, P_<name> of its `.register("<name>"` calls."""
    literals, prefixed = set(), set()
    for f in sorted(pathlib.Path(repo).glob("*/src/**/*.rs")):
        text = f.read_text(encoding="utf-8", errors="replace")
        code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("//"))
        literals.update(re.findall(r'"([a-z_:][a-z0-9_:]*)"', code))
        consts = dict(re.findall(r'const\s+([A-Z_][A-Z0-9_]*)\s*:\s*&str\s*=\s*"([a-z0-9_]+)"', code))
        prefixes = re.findall(r'Registry::with_prefix\(\s*"([a-z0-9_]+)"\s*\)', code)
        # A prefix named by a `const X: &str = "..."` of the same file.
        prefixes += [consts[c] for c in re.findall(r'Registry::with_prefix\(\s*([A-Z_][A-Z0-9_]*)\s*\)', code) if c in consts]
        for prefix in prefixes:
            for name in re.findall(r'\.register\(\s*"([a-z0-9_]+)"', code):
                prefixed.add(f"{prefix}_{name}")
    return literals, prefixed


def is_exported(name, literals, prefixed):
    candidates = {name}
    for suffix in ("_bucket", "_sum", "_count", "_total", "_created"):
        if name.endswith(suffix):
            candidates.add(name[: -len(suffix)])
    if candidates & prefixed:
        return True
    # Literal family names (collectors that encode their own descriptors).
    return bool(candidates & literals)


def cmd_exprs(rules, dashboard, out):
    items = rule_exprs(rules) + dashboard_exprs(dashboard)
    doc = {"groups": [{"name": "parse-check", "rules": [
        {"record": f"parse_check_{i}", "expr": e} for i, (_, e) in enumerate(items)]}]}
    pathlib.Path(out).write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    print(f"{len(items)} expressions ({rules}, {dashboard})")


def cmd_dashboard(path):
    dash = json.loads(pathlib.Path(path).read_text(encoding="utf-8"))
    errors = []
    if not dash.get("uid") or not dash.get("title"):
        errors.append("no uid or title")
    if not any(v.get("type") == "datasource" and v.get("name") == "datasource"
               for v in dash.get("templating", {}).get("list", [])):
        errors.append("no datasource variable")
    ids, cells = set(), {}
    for p in dash.get("panels", []):
        where = f'panel {p.get("id")} "{p.get("title")}"'
        if p.get("id") in ids:
            errors.append(f"{where}: duplicate id")
        ids.add(p.get("id"))
        g = p.get("gridPos", {})
        x, y, w, h = (g.get(k) for k in ("x", "y", "w", "h"))
        if None in (x, y, w, h) or x < 0 or w < 1 or h < 1 or x + w > 24:
            errors.append(f"{where}: gridPos {g} outside the 24-column grid")
            continue
        for cx in range(x, x + w):
            for cy in range(y, y + h):
                if (cx, cy) in cells:
                    errors.append(f"{where}: overlaps {cells[(cx, cy)]}")
                    break
                cells[(cx, cy)] = where
            else:
                continue
            break
        if p.get("type") == "row":
            continue
        if p.get("datasource", {}).get("uid") != "${datasource}":
            errors.append(f"{where}: datasource is not ${{datasource}}")
        if not p.get("targets"):
            errors.append(f"{where}: no targets")
        for t in p.get("targets", []):
            if t.get("datasource", {}).get("uid") != "${datasource}" or not t.get("expr"):
                errors.append(f"{where} target {t.get('refId')}: no expr or not on ${{datasource}}")
    if errors:
        sys.exit("dashboard " + path + ":\n  " + "\n  ".join(errors))
    print(f"{len(ids)} panels, laid out without overlaps, all on ${{datasource}}")


MONITOR_TARGET = {"job": "vgpu-device-monitor", "namespace": "vgpu", "pod": "dp-1",
                  "instance": "10.0.0.1:3456", "service": "vGPU"}
SCHEDULER_TARGET = {"job": "vgpu-scheduler-extender", "namespace": "vgpu", "pod": "sched-1",
                    "instance": "10.0.1.1:3456"}
SAMPLE_LABELS = {"node": "n1", "device_idx": "0", "device_uuid": "GPU-0", "pod_namespace": "ns",
                 "pod_name": "p", "container_name": "c", "vdevice_idx": "0", "parent_uuid": "GPU-0"}


def monitor_families(repo):
    """(family, [labels]) of the table in vgpu-monitor/src/metrics.rs's module docs."""
    text = (pathlib.Path(repo) / "vgpu-monitor/src/metrics.rs").read_text(encoding="utf-8")
    rows, prev = [], []
    for line in text.splitlines():
        m = re.match(r"^//! \| `([a-z_]+)` \| ([^|]*) \|", line)
        if not m:
            continue
        col = m.group(2).strip()
        if col == "same":
            labels = prev
        else:
            lm = re.match(r"`([a-z_,]+)`", col)
            labels = lm.group(1).split(",") if lm else []
        rows.append((m.group(1), labels))
        prev = labels
    if len(rows) < 20:
        sys.exit(f"vgpu-monitor/src/metrics.rs: expected its family table, found {len(rows)} rows")
    # The table must be the code's: every label it names is a ("label", value) pair of the encoder.
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("//"))
    used = set(re.findall(r'\(\s*"([a-z_]+)"\s*,', code))
    missing = sorted({lb for _, labels in rows for lb in labels} - used)
    if missing:
        sys.exit(f"vgpu-monitor/src/metrics.rs: labels of its family table that the code never sets: {missing}")
    return rows


def series_name(name, labels):
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def cmd_dashboard_test(repo, dashboard, out):
    series = []
    for family, labels in monitor_families(repo):
        ls = dict(MONITOR_TARGET)
        ls.update({k: SAMPLE_LABELS.get(k, "x") for k in labels})
        value = "1" if family.endswith(("_status", "_info", "_present")) else "50"
        series.append({"series": series_name(family, ls), "values": f"{value}x60"})
    # The scheduler's families (vgpu-scheduler/src/metrics.rs); buckets as verb_duration_buckets().
    les = [f"{3 ** i / 10000:g}" for i in range(12)] + ["+Inf"]
    for verb, result in [("filter", "fit"), ("filter", "no_fit"), ("bind", "success")]:
        ls = dict(SCHEDULER_TARGET, verb=verb, result=result)
        series.append({"series": series_name("vgpu_scheduler_verb_total", ls), "values": "0+10x60"})
    ls = dict(SCHEDULER_TARGET, verb="filter", code="InsufficientVGPUSlot")
    series.append({"series": series_name("vgpu_scheduler_node_reject_total", ls), "values": "0+5x60"})
    for verb, stage in [("filter", "total"), ("filter", "node"), ("filter", "device"), ("filter", "lock_wait"),
                        ("bind", "total")]:
        for le in les:
            ls = dict(SCHEDULER_TARGET, verb=verb, stage=stage, le=le)
            inc = "0" if float(le) < 0.0027 else "10"
            series.append({"series": series_name("vgpu_scheduler_verb_duration_seconds_bucket", ls),
                           "values": f"0+{inc}x60"})
    tests = [{"expr": f"absent({e})", "eval_time": "30m", "exp_samples": []}
             for _, e in dashboard_exprs(dashboard)]
    doc = {"evaluation_interval": "1m", "tests": [{
        "name": "every dashboard expression returns samples", "interval": "1m",
        "input_series": series, "promql_expr_test": tests}]}
    pathlib.Path(out).write_text(yaml.safe_dump(doc, sort_keys=False, width=1000), encoding="utf-8")
    print(f"{len(tests)} dashboard expressions over {len(series)} synthetic series")


def cmd_names(repo, rules, dashboard):
    literals, prefixed = exported_names(repo)
    used = {}
    dashboard_items = [] if dashboard == "-" else dashboard_exprs(dashboard)
    for where, e in rule_exprs(rules) + dashboard_items:
        for n in metric_names(e):
            used.setdefault(n, []).append(where)
    if not used:
        sys.exit("no metric names found in the rules and the dashboard")
    bad = []
    for n in sorted(used):
        if n in EXTERNAL_DCGM:
            print(f"  {n}: external (upstream dcgm-exporter)")
        elif n in EXTERNAL:
            print(f"  {n}: external (not ours)")
        elif is_exported(n, literals, prefixed):
            print(f"  {n}: exported")
        else:
            bad.append(f"{n} (used by {', '.join(sorted(set(used[n])))})")
    if bad:
        sys.exit("metric names that our code does not export:\n  " + "\n  ".join(bad))
    print(f"{len(used)} metric names, all exported by our code or listed as external")


def objects(rendered):
    return [d for d in load_yaml_docs(rendered) if isinstance(d, dict) and d.get("kind")]


def cmd_rule_spec(rendered, out, name=None):
    rules = [d for d in objects(rendered) if d["kind"] == "PrometheusRule"
             and (name is None or d["metadata"]["name"] == name)]
    if len(rules) != 1:
        sys.exit(f"expected one PrometheusRule in {rendered}, found {len(rules)}")
    pathlib.Path(out).write_text(yaml.safe_dump(rules[0]["spec"], sort_keys=False), encoding="utf-8")


def cmd_merge_schema(schema_path, fragment_path):
    schema = json.loads(pathlib.Path(schema_path).read_text(encoding="utf-8"))
    fragment = json.loads(pathlib.Path(fragment_path).read_text(encoding="utf-8"))
    schema.setdefault("properties", {})["monitoring"] = fragment
    pathlib.Path(schema_path).write_text(json.dumps(schema, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def cmd_same_groups(a, b):
    ga = load_yaml_docs(a)[0]["groups"]
    gb = load_yaml_docs(b)[0]["groups"]
    if ga != gb:
        for x, y in zip(json.dumps(ga, indent=1, sort_keys=True).splitlines(),
                        json.dumps(gb, indent=1, sort_keys=True).splitlines()):
            if x != y:
                sys.exit(f"{a} and {b} differ: {x.strip()} vs {y.strip()}")
        sys.exit(f"{a} and {b} differ in length")


_OBJECTS = {}


def find(rendered, kind, name):
    if rendered not in _OBJECTS:
        _OBJECTS[rendered] = objects(rendered)
    for d in _OBJECTS[rendered]:
        if d["kind"] == kind and d["metadata"]["name"] == name:
            return d
    return None


def field(obj, path):
    v = obj
    for part in path.split("/"):
        v = v[int(part)] if isinstance(v, list) else v[part]
    return v


def cmd_get(rendered, kind, name, path):
    d = find(rendered, kind, name)
    if d is None:
        sys.exit(f"no {kind} {name} in {rendered}")
    print(json.dumps(field(d, path), sort_keys=True))


def verify_line(op, args):
    if op == "kind":
        f, kind, name = args
        return find(f, kind, name) is not None, f"{kind} {name}"
    if op == "nokind":
        f, kind = args
        if f not in _OBJECTS:
            _OBJECTS[f] = objects(f)
        return not any(d["kind"] == kind for d in _OBJECTS[f]), f"no {kind} in {pathlib.Path(f).name}"
    if op == "absent":
        f, kind, name = args
        return find(f, kind, name) is None, f"no {kind} {name}"
    f, kind, name, path = args[:4]
    d = find(f, kind, name)
    if d is None:
        return False, f"no {kind} {name}"
    try:
        got = field(d, path)
    except (KeyError, IndexError, TypeError):
        got = KeyError
    if op == "nofield":
        return got is KeyError, f"{kind} {name} has no {path}"
    if got is KeyError:
        return False, f"{kind} {name}: no {path}"
    if op == "field":
        want = json.loads(args[4])
        return got == want, f"{kind} {name} {path} = {json.dumps(want, sort_keys=True)}" + (
            "" if got == want else f" (got {json.dumps(got, sort_keys=True)})")
    if op == "same":
        other = find(f, args[4], args[5])
        want = field(other, args[6]) if other is not None else KeyError
        return got == want, f"{kind} {name} {path} = {args[4]} {args[5]} {args[6]}" + (
            "" if got == want else f" (got {got}, want {want})")
    if op == "subset":
        other = find(f, args[4], args[5])
        sup = field(other, args[6]) if other is not None else {}
        good = isinstance(got, dict) and all(sup.get(k) == v for k, v in got.items())
        return good, f"{kind} {name} {path} ⊆ {args[4]} {args[5]} {args[6]}" + ("" if good else f" ({got} vs {sup})")
    raise SystemExit(f"unknown expectation {op}")


def cmd_verify(expectations):
    fails = 0
    for line in pathlib.Path(expectations).read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        op, *args = line.split("\t")
        good, what = verify_line(op, args)
        if good:
            print(f"  ok: {what}")
        else:
            print(f"  FAIL: {what}", file=sys.stderr)
            fails += 1
    sys.exit(1 if fails else 0)


def main():
    cmds = {
        "exprs": cmd_exprs, "names": cmd_names, "dashboard": cmd_dashboard, "dashboard-test": cmd_dashboard_test, "rule-spec": cmd_rule_spec, "merge-schema": cmd_merge_schema,
        "same-groups": cmd_same_groups, "get": cmd_get, "verify": cmd_verify,
    }
    if len(sys.argv) < 2 or sys.argv[1] not in cmds:
        sys.exit(__doc__)
    cmds[sys.argv[1]](*sys.argv[2:])


if __name__ == "__main__":
    main()
