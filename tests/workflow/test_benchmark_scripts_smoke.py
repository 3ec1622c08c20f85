"""`benchmarks/*.py --smoke` for the benchmarks that run Snakemake: each exits 0 at its tiny
size (timing goals reported, not enforced: benchmarks/README.md) and writes its checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.unit.test_benchmarks_smoke import SMOKED_IN_WORKFLOW, run_benchmark

pytestmark = pytest.mark.workflow


@pytest.mark.parametrize("name", SMOKED_IN_WORKFLOW)
def test_smoke_run_exits_0_with_its_sanity_bounds_met(name: str, tmp_path: Path) -> None:
    out = tmp_path / f"{name}.json"
    proc = run_benchmark(name, "--out", str(out), tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    checks = json.loads(out.read_text())["checks"]
    assert checks and all(c["ok"] for c in checks if not c["timing_goal"]), checks
    assert all(c["enforced"] != c["timing_goal"] for c in checks), checks
