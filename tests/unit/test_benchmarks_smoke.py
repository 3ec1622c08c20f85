"""`benchmarks/*.py --smoke` without Snakemake (the client, the GPU check with a stub
nvidia-smi): each exits 0, and the GPU check exits 1 naming the bound a flat stub violates. The
benchmarks that run Snakemake are smoked in tests/workflow/test_benchmark_scripts_smoke.py."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS = REPO / "benchmarks"
DATA = REPO / "tests" / "data" / "nvidia-smi-h200-check"
# Every benchmark but the doc maker has a smoke run here or in tests/workflow/.
SMOKED_HERE = ("client", "gpu_sampler_check")
SMOKED_IN_WORKFLOW = ("aggregation", "planning", "orchestration", "large_run", "pools")
# A stub nvidia-smi: one GPU's loop lines; loaded (690 W, 99 %) while the file the benchmark
# names in $STUB_NVIDIA_SMI_LOAD_FILE exists, idle (80 W, 0 %) otherwise; FLAT: always idle.
STUB = """\
#!{python}
import datetime as dt, os, sys, time
FLAT = {flat}
opts = dict(a.lstrip("-").split("=", 1) for a in sys.argv[1:] if "=" in a)
fields = opts["query-gpu"].split(",")
while True:
    f = os.environ.get("STUB_NVIDIA_SMI_LOAD_FILE")
    load = not FLAT and bool(f) and os.path.exists(f)
    v = {{"timestamp": dt.datetime.now(dt.timezone.utc).strftime("%Y/%m/%d %H:%M:%S.%f")[:-3],
         "index": 0, "uuid": "GPU-test", "power.draw": 690.0 if load else 80.0,
         "power.limit": 700.0, "utilization.gpu": 99 if load else 0, "utilization.memory": 0,
         "memory.used": 621, "memory.total": 143771, "clocks.sm": 1980, "clocks.mem": 3201,
         "temperature.gpu": 37, "pstate": "P0"}}
    print(", ".join(str(v.get(k, 0)) for k in fields), flush=True)
    if "loop-ms" not in opts:
        break
    time.sleep(int(opts["loop-ms"]) / 1000)
"""


def run_benchmark(
    name: str, *args: str, tmp_path: Path, path_prefix: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """`python benchmarks/NAME.py --smoke ARGS` with this checkout's package, its JSON in
    tmp_path."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    if path_prefix is not None:
        env["PATH"] = f"{path_prefix}{os.pathsep}{env['PATH']}"
    argv = [sys.executable, str(BENCHMARKS / f"{name}.py"), "--smoke", *args]
    return subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def stub_nvidia_smi(directory: Path, *, flat: bool) -> Path:
    directory.mkdir()
    stub = directory / "nvidia-smi"
    stub.write_text(STUB.format(python=sys.executable, flat=flat))
    stub.chmod(0o755)
    return directory


def test_every_benchmark_has_a_smoke_run() -> None:
    scripts = {p.stem for p in BENCHMARKS.glob("[a-z]*.py")} - {"make_performance_doc"}
    assert scripts == {*SMOKED_HERE, *SMOKED_IN_WORKFLOW}


@pytest.mark.parametrize("cores", ["1", "0,1"])
def test_client_smoke_exits_0_and_measures_the_wrapped_client(tmp_path: Path, cores: str) -> None:
    """Against one sim process, and against two on one port (--server-cores 0,1)."""
    out = tmp_path / "client.json"
    proc = run_benchmark("client", "--out", str(out), "--server-cores", cores, tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["runs"] and all(r["wrapped_process"]["returncode"] == 0 for r in result["runs"])
    assert all(c["ok"] or not c["enforced"] for c in result["checks"])
    assert result["params"]["server_cores"] == [int(c) for c in cores.split(",")]


def test_performance_doc_is_rendered_from_the_committed_results() -> None:
    """docs/performance.md is what make_performance_doc renders from benchmarks/results/ (a
    result file changed without the doc, or the doc edited by hand, fails here)."""
    doc = _doc_module()
    assert doc.render(BENCHMARKS / "results") == (REPO / "docs" / "performance.md").read_text()


def test_gpu_check_smoke_exits_0_with_a_stub_that_follows_the_load(tmp_path: Path) -> None:
    bin_dir = stub_nvidia_smi(tmp_path / "bin", flat=False)
    proc = run_benchmark(
        "gpu_sampler_check", str(tmp_path / "out"), tmp_path=tmp_path, path_prefix=bin_dir
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["load"]["gpu_power_mean_w"] > 2 * summary["idle_before"]["gpu_power_mean_w"]
    assert summary["idle_after"]["gpu_power_peak_w"] == pytest.approx(80.0)


def test_gpu_check_exits_1_when_the_load_stays_at_idle_power(tmp_path: Path) -> None:
    bin_dir = stub_nvidia_smi(tmp_path / "bin", flat=True)
    proc = run_benchmark(
        "gpu_sampler_check", str(tmp_path / "out"), tmp_path=tmp_path, path_prefix=bin_dir
    )
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "FAILED: load power above idle power" in proc.stderr
    assert "FAILED: SM utilisation under load" in proc.stderr


def test_the_idle_phase_after_the_load_holds_no_load_sample() -> None:
    """On the real H200 capture: the first sample after the load's end (406 W: the tail of the
    load) is not idle; the idle phase after the load is back at the idle power before it."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import gpu_sampler_check as check
    finally:
        sys.path.remove(str(BENCHMARKS))
    from servesweep.cluster import gpusampling

    rows = gpusampling.parse_loop_output((DATA / "samples.csv").read_text(), node="local")
    phases = json.loads((DATA / "phases.json").read_text())
    windows = check.phase_windows(phases, sample_times=check.sample_times(rows), interval_s=1.0)
    assert windows["idle_after"][0] >= phases["load_end"] + 1.0
    figures = {p: check.phase_figures(rows, *windows[p]) for p in check.PHASES}
    idle, after = figures["idle_before"], figures["idle_after"]
    assert after["gpu_power_peak_w"] < 130  # no 406 W tail sample
    assert after["gpu_power_mean_w"] == pytest.approx(idle["gpu_power_mean_w"], rel=0.05)
    assert all(c.ok for c in check.checks(figures))


def _doc_module():
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import make_performance_doc as doc
    finally:
        sys.path.remove(str(BENCHMARKS))
    return doc


def test_performance_doc_speaks_of_the_code_and_types_no_figure() -> None:
    """The text lives in the template and names no stop or issue; every measured figure comes
    from the JSON, so the template holds none (a number with a unit: s, x, %, ms, us)."""
    doc = _doc_module()
    text = doc.TEMPLATE.read_text()
    rendered = (REPO / "docs" / "performance.md").read_text()
    for source in (text, rendered):
        assert not re.search(r"\b(stop|issue)s? \d+", source, flags=re.I), re.search(
            r".{40}\b(stop|issue)s? \d+.{40}", source, flags=re.I | re.S
        )
    typed = re.findall(r"\b\d+(?:\.\d+)?\s?(?:s|x|%|ms|us)\b", text)
    assert typed == [], typed


def test_test_suite_under_load_is_filled_from_ci_json(tmp_path: Path) -> None:
    doc = _doc_module()
    results = tmp_path / "results"
    shutil.copytree(BENCHMARKS / "results", results)
    (results / "ci.json").unlink(missing_ok=True)
    assert "## Test suite under load" not in doc.render(results)
    runs = [
        {
            "started": "2026-12-07 21:00 UTC",
            "wall_s": 812.4,
            "load": "stress-ng --cpu 2",
            "passed": 1125,
            "failed": 0,
            "command": "python3 -m pytest -q",
        },
        {
            "started": "2026-12-07 21:20 UTC",
            "wall_s": 798.0,
            "load": 4.2,
            "passed": 1124,
            "failed": 1,
            "command": "python3 -m pytest -q",
        },
    ]
    (results / "ci.json").write_text(json.dumps({"runs": runs, "ci_wall_s": 871.0}))
    text = doc.render(results)
    section = text.split("## Test suite under load", 1)[1]
    assert (
        "| 2026-12-07 21:00 UTC | `python3 -m pytest -q` | stress-ng --cpu 2 | 812 | 1,125 | 0 |"
        in (section)
    )
    assert "| 2026-12-07 21:20 UTC | `python3 -m pytest -q` | 4.20 | 798 | 1,124 | 1 |" in section
    assert "CI wall time: 871 s." in section
