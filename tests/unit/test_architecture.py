"""The import graph of the project is one-way: no circles (module-level or inside
functions), evaluators never reach into methods or the runner, and no module imports
another one's private names."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("dpgen_bench", "methods", "evaluators")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


def _imports(name: str, path: Path, known: set[str]) -> list[tuple[str, str | None]]:
    """(imported project module, imported name or None) for every import in the file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, None) for a in node.names if a.name.split(".")[0] in PACKAGES]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.split(".")[0] not in PACKAGES:
                continue
            for a in node.names:
                sub = f"{mod}.{a.name}"
                out.append((sub, None) if sub in known else (mod, a.name))
    return [(m, n) for m, n in out if m in known]


@pytest.fixture(scope="module")
def graph():
    mods = _modules()
    return {name: _imports(name, path, set(mods)) for name, path in mods.items()}


def test_no_import_circles(graph):
    edges = {m: {t for t, _ in deps if t != m} for m, deps in graph.items()}
    # Tarjan's strongly connected components: any component of more than one module is a circle
    index, low, stack, on, comps, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
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
            comps.append(comp)

    for v in sorted(edges):
        if v not in index:
            visit(v)
    circles = [sorted(c) for c in comps if len(c) > 1]
    assert circles == [], f"import circles: {circles}"


def test_evaluators_use_only_public_harness_names(graph):
    for mod, deps in graph.items():
        if not mod.startswith("evaluators"):
            continue
        for target, name in deps:
            assert not target.startswith("methods"), f"{mod} imports {target}: use the registry"
            assert target not in ("dpgen_bench.runner", "dpgen_bench.cli", "dpgen_bench.sweep"), \
                f"{mod} reaches into {target}"
            if target.startswith("dpgen_bench"):
                assert not (name or "").startswith("_"), f"{mod} imports the private {target}.{name}"


def test_the_harness_never_imports_an_evaluator_or_a_method(graph):
    """dpgen_bench is the floor: evaluators and methods build on it, and reach it only through
    the registry (the audit's GAN-Leaks distances live in dpgen_bench.attacks for this)."""
    up = [f"{mod} → {target}" for mod, deps in graph.items() if mod.startswith("dpgen_bench")
          for target, _ in deps if target.split(".")[0] in ("evaluators", "methods")]
    assert up == []


def test_no_module_imports_private_names_of_another(graph):
    bad = [f"{mod} → {target}.{name}" for mod, deps in graph.items() for target, name in deps
           if name and name.startswith("_") and not name.startswith("__") and target != mod]
    assert bad == []


def test_the_graph_sees_imports_inside_functions(graph):
    # evaluators.mia imports the registry and the context inside a function
    assert ("dpgen_bench.context", "TrainingContext") in graph["evaluators.mia"]


def test_the_example_method_is_one_short_file():
    src = (ROOT / "methods" / "dummy.py").read_text()
    assert len(src.splitlines()) < 80
    assert "dummy.py" in (ROOT / "README.md").read_text()


def _tracked_text_files() -> list[Path]:
    """Every file git tracks or would track (else every file outside hidden folders and results/runs), text only."""
    import subprocess

    try:
        listing = ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
        names = subprocess.run(listing, cwd=ROOT, capture_output=True, check=True, timeout=30).stdout.decode()
        paths = [ROOT / n for n in names.split("\0") if n]
    except (OSError, subprocess.SubprocessError):
        paths = [p for p in ROOT.rglob("*") if p.is_file() and not any(
            part.startswith(".") for part in p.relative_to(ROOT).parts) and "results/runs" not in p.as_posix()]
    text = []
    for p in paths:
        try:
            data = p.read_bytes()
        except OSError:  # tracked but deleted in the work tree
            continue
        if b"\0" not in data:
            text.append(p)
    return text


def test_the_project_never_points_to_the_developers_shared_folder():
    # the developers' papers and notes, which users do not have (split so that this file does not match)
    needles = ("../" + "shared", "FACTS" + ".md")
    files = _tracked_text_files()
    names = {p.relative_to(ROOT).as_posix() for p in files}
    assert {"README.md", "Makefile", "pyproject.toml", "tests/unit/test_architecture.py"} <= names
    bad = [f"{p.relative_to(ROOT)}: {n}" for p in files for n in needles
           if n in p.read_text(encoding="utf-8", errors="replace")]
    assert bad == []
