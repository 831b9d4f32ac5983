#!/usr/bin/env python3
"""Checks the crate layout rules of the workspace (README "Crate map").

1. Arrows only down: a component crate (device plugin, scheduler, DRA driver, monitor, webhook, controller,
   node agent, MIG manager) depends on no other component crate outside `[dev-dependencies]`.
2. No import circle inside a crate: the files of one crate, joined by the `crate::`/`super::`/`self::` paths
   they use, form no cycle (a file that only declares `mod child;` does not import it).

Prints each violation and exits 1 when there is one; `--graph` also prints every crate's file edges.
Usage: scripts/check-layers.py [--graph] [--quiet]
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

COMPONENTS = {
    "vgpu-deviceplugin",
    "vgpu-scheduler",
    "vgpu-dra",
    "vgpu-monitor",
    "vgpu-webhook",
    "vgpu-controller",
    "vgpu-node-agent",
    "vgpu-mig-manager",
}

ROOT = Path(__file__).resolve().parent.parent


def metadata() -> dict:
    out = subprocess.run(
        ["cargo", "metadata", "--no-deps", "--format-version", "1", "--offline"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out)


def component_arrows(meta: dict) -> list[str]:
    bad = []
    for pkg in meta["packages"]:
        if pkg["name"] not in COMPONENTS:
            continue
        for dep in pkg["dependencies"]:
            if dep["name"] in COMPONENTS and dep["kind"] in (None, "build"):
                bad.append(f"{pkg['name']} depends on component crate {dep['name']} (allowed only as a dev-dependency)")
    return bad


# --- import circles ---------------------------------------------------------------------------------------

PATH_RE = re.compile(r"\b(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")
USE_GROUP_RE = re.compile(r"\buse\s+(crate|super|self)((?:::[A-Za-z_][A-Za-z0-9_]*)*)::\{", re.S)
MOD_DECL_RE = re.compile(r"^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+([a-z_][a-z0-9_]*)\s*;", re.M)
INLINE_MOD_RE = re.compile(r"^\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?mod\s+([a-z_][a-z0-9_]*)\s*\{", re.M)


def strip_comments_and_strings(src: str) -> str:
    src = re.sub(r"/\*.*?\*/", " ", src, flags=re.S)
    src = re.sub(r"//[^\n]*", " ", src)
    src = re.sub(r'r#*"(?:.|\n)*?"#*', '""', src)
    src = re.sub(r'"(?:\\.|[^"\\])*"', '""', src)
    return src


def strip_test_modules(src: str) -> str:
    """Drops `#[cfg(test)] mod x { ... }` bodies: test code may reach anywhere in its crate."""
    out = []
    i = 0
    pat = re.compile(r"#\[cfg\(test\)\]\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*\{")
    while True:
        m = pat.search(src, i)
        if not m:
            out.append(src[i:])
            break
        out.append(src[i : m.start()])
        depth = 1
        j = m.end()
        while j < len(src) and depth:
            if src[j] == "{":
                depth += 1
            elif src[j] == "}":
                depth -= 1
            j += 1
        i = j
    return "".join(out)


def crate_files(src_dir: Path) -> dict[tuple[str, ...], Path]:
    """Module path -> file, following `mod x;` declarations from lib.rs."""
    files: dict[tuple[str, ...], Path] = {}

    def visit(path: tuple[str, ...], file: Path) -> None:
        files[path] = file
        text = strip_comments_and_strings(file.read_text())
        if file.name in ("lib.rs", "mod.rs"):
            base = file.parent
        else:
            base = file.parent / file.stem
        for m in MOD_DECL_RE.finditer(text):
            name = m.group(1)
            for cand in (base / f"{name}.rs", base / name / "mod.rs"):
                if cand.exists():
                    visit(path + (name,), cand)
                    break

    lib = src_dir / "lib.rs"
    if lib.exists():
        visit((), lib)
    return files


def resolve(files: dict, path: tuple[str, ...]) -> tuple[str, ...] | None:
    """The longest module prefix of `path` that is a file of the crate."""
    for n in range(len(path), -1, -1):
        if path[:n] in files:
            return path[:n]
    return None


def import_edges(files: dict) -> dict[tuple, set[tuple]]:
    edges: dict[tuple, set[tuple]] = {p: set() for p in files}
    for mod, file in files.items():
        text = strip_test_modules(strip_comments_and_strings(file.read_text()))
        # Paths inside inline (non-test) modules resolve against the inline module; approximate by the file.
        declared_children = {m.group(1) for m in MOD_DECL_RE.finditer(text)}
        targets: list[tuple[str, ...]] = []

        def absolute(root: str, rest: list[str]) -> tuple[str, ...]:
            if root == "crate":
                return tuple(rest)
            if root == "self":
                return mod + tuple(rest)
            # super (possibly repeated: super::super::x)
            base = list(mod[:-1]) if mod else []
            while rest and rest[0] == "super":
                base = base[:-1]
                rest = rest[1:]
            return tuple(base) + tuple(rest)

        for m in PATH_RE.finditer(text):
            rest = [s for s in m.group(2).split("::") if s]
            targets.append(absolute(m.group(1), rest))
        # `use crate::a::{b, c::d}`: each item in the group.
        for m in USE_GROUP_RE.finditer(text):
            prefix = [s for s in m.group(2).split("::") if s]
            depth, j, buf, items = 1, m.end(), "", []
            while j < len(text) and depth:
                ch = text[j]
                if ch == "{":
                    depth += 1
                elif ch == "}":
                    depth -= 1
                if depth == 1 and ch == ",":
                    items.append(buf)
                    buf = ""
                elif depth >= 1:
                    buf += ch
                j += 1
            items.append(buf)
            for item in items:
                first = re.findall(r"[A-Za-z_][A-Za-z0-9_]*", item)
                if first:
                    seg = re.split(r"\s*::\s*", item.strip().split("{")[0].strip(" :"))
                    seg = [s for s in seg if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", s)]
                    targets.append(absolute(m.group(1), prefix + seg))
        for t in targets:
            r = resolve(files, t)
            if r is None or r == mod:
                continue
            # A parent naming its own declared child (`mod x;` + `x::Y`) is an import too; only the bare
            # declaration is not, and that is not matched by PATH_RE.
            edges[mod].add(r)
        del declared_children
    return edges


def cycles(edges: dict) -> list[list[tuple]]:
    """Strongly connected components of more than one file (Tarjan)."""
    index = {}
    low = {}
    stack: list = []
    on = set()
    out = []
    counter = [0]
    sys.setrecursionlimit(10000)

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in edges:
        if v not in index:
            strong(v)
    return out


def main() -> int:
    graph = "--graph" in sys.argv
    quiet = "--quiet" in sys.argv
    meta = metadata()
    problems = component_arrows(meta)
    for pkg in sorted(meta["packages"], key=lambda p: p["name"]):
        src = Path(pkg["manifest_path"]).parent / "src"
        if not (src / "lib.rs").exists():
            continue
        files = crate_files(src)
        edges = import_edges(files)
        if graph:
            for a in sorted(edges):
                for b in sorted(edges[a]):
                    print(f"{pkg['name']}: {'::'.join(a) or 'lib'} -> {'::'.join(b) or 'lib'}")
        for comp in cycles(edges):
            names = ", ".join(os.path.relpath(files[m], ROOT) for m in comp)
            cyc = find_cycle(edges, comp)
            path = " -> ".join("::".join(m) or "lib" for m in cyc)
            problems.append(f"{pkg['name']}: import circle of {len(comp)} files ({names}); e.g. {path}")
    for p in problems:
        print(p)
    if not problems and not quiet:
        print("check-layers: no component crate depends on another; no import circle in any crate")
    return 1 if problems else 0


def find_cycle(edges: dict, comp: list) -> list:
    """One concrete cycle inside a strongly connected component (for the message)."""
    members = set(comp)
    start = comp[0]
    prev = {start: None}
    queue = [start]
    while queue:
        v = queue.pop(0)
        for w in sorted(edges[v]):
            if w not in members:
                continue
            if w == start:
                path = [v]
                while prev[path[-1]] is not None:
                    path.append(prev[path[-1]])
                return list(reversed(path)) + [start]
            if w not in prev:
                prev[w] = v
                queue.append(w)
    return comp


if __name__ == "__main__":
    sys.exit(main())
