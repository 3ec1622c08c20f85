"""The package's import graph: layers pointing downward, no cycles, no Snakemake, the sim reached
through its facades."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "servesweep"
# What the rest of the package may import from the simulator: the planner's estimate, and the
# word-level re-count the builtin client applies to the sim's own text.
SIM_FACADES = {"servesweep.sim.estimate", "servesweep.sim.tokens"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports(path: Path) -> set[str]:
    """servesweep modules `path` imports anywhere (function-local imports included)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return {name for name in found if name in MODULES}


GRAPH = {name: imports(path) - {name} for name, path in MODULES.items()}


def test_no_import_cycle():
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        for dep in GRAPH[node]:
            if dep not in index:
                visit(dep)
                low[node] = min(low[node], low[dep])
            elif dep in stack:
                low[node] = min(low[node], index[dep])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for name in GRAPH:
        if name not in index:
            visit(name)
    assert cycles == []


def test_package_never_imports_snakemake():
    offenders = []
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            if any(n == "snakemake" or n.startswith("snakemake.") for n in names):
                offenders.append(name)
    assert offenders == []


def test_the_workflow_reaches_the_sim_only_through_its_facades():
    reach = {
        (name, dep)
        for name, deps in GRAPH.items()
        if not name.startswith("servesweep.sim")
        for dep in deps
        if dep.startswith("servesweep.sim") and dep not in SIM_FACADES | {"servesweep.sim"}
    }
    assert reach == set()


# The package's layers, lowest first: a module imports only from its own layer or a lower one.
# `sim` is a leaf beside `core` (it imports nothing of servesweep); the root package holds only
# the version.
LAYERS = ("core", "sim", "config", "cluster", "serving", "measure", "analysis", "workflow")


def layer_of(module: str) -> int:
    parts = module.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 else -1


def test_every_module_sits_in_a_layer_folder():
    loose = [name for name in MODULES if name.count(".") == 1 and name.split(".")[1] not in LAYERS]
    assert loose == []


def test_dependencies_point_downward_only():
    upward = sorted(
        f"{name} -> {dep}"
        for name, deps in GRAPH.items()
        for dep in deps
        if layer_of(dep) > layer_of(name)
    )
    assert upward == []


def test_the_sim_imports_nothing_else_of_the_package():
    reach = {
        (name, dep)
        for name, deps in GRAPH.items()
        if name.startswith("servesweep.sim")
        for dep in deps
        if not dep.startswith("servesweep.sim")
    }
    assert reach == set()


def test_the_snakefile_loads_without_pandas_or_numpy():
    """What rules/*.smk import at load time: a dry-run pays no analysis imports (pandas and
    numpy are the table jobs'; docs/performance.md, planning)."""
    import re
    import subprocess
    import sys

    rules = PACKAGE.parents[1] / "rules"
    found = sorted(
        {
            m
            for smk in rules.glob("*.smk")
            for m in re.findall(r"^from (servesweep[\w.]*) import", smk.read_text(), re.M)
        }
    )
    assert "servesweep.analysis.planned" in found, found
    code = (
        f"import sys\nfor m in {found!r}: __import__(m)\n"
        "print(sorted(m for m in ('pandas', 'numpy', 'matplotlib') if m in sys.modules))"
    )
    env = {"PYTHONPATH": str(PACKAGE.parent), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


def test_the_analysis_reads_files_not_the_cluster():
    """The analysis reads the run's files through their formats (core.gpufile, measure.records,
    measure.probefile, core.events), never the modules that reach nodes and servers."""
    reach = sorted(
        f"{name} -> {dep}"
        for name, deps in GRAPH.items()
        if name.startswith("servesweep.analysis")
        for dep in deps
        if layer_of(dep) in (LAYERS.index("cluster"), LAYERS.index("serving"))
    )
    assert reach == []
