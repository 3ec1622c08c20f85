"""Narrowing selects what runs; results.csv and summary.json cover every finished cell-repeat
of the run (issue 16 part 7): two narrowed runs in one RUN_ID add up, a third has nothing to do.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from tests.helpers import experiment_file, run_snakemake

pytestmark = pytest.mark.workflow
RUN = "wf-narrow"
SMALL = {
    "run_id": RUN,
    "matrix": {"server": {"chunked_prefill_size": [8192]}, "client": {"concurrency": [4]}},
    "workload": {"num_requests": 4},
    "repeats": 1,
}
# Up to summary.json: the two aggregates narrowing must never shrink (the plots and the report
# after them read only these).
SUMMARY = f"results/{RUN}/summary.json"


def test_narrowed_runs_add_up_and_never_shrink_the_aggregates(tmp_path: Path) -> None:
    cfg = experiment_file(tmp_path, SMALL)
    run_dir = tmp_path / "results" / RUN
    for backend in ("marlin", "flashinfer_mxfp4"):
        env = {"BACKENDS_CSV": backend}
        proc = run_snakemake(tmp_path, "--cores", "1", SUMMARY, "--configfile", str(cfg), env=env)
        assert proc.returncode == 0, proc.stderr[-4000:]
    df = pd.read_csv(run_dir / "results.csv")
    assert sorted(df["moe_runner_backend"]) == ["flashinfer_mxfp4", "marlin"]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["deltas"], "the configured baseline (marlin) is back in the aggregates"
    # Narrowed again to a finished backend: nothing runs, nothing shrinks.
    proc = run_snakemake(
        tmp_path, "--cores", "1", SUMMARY, "--configfile", str(cfg), env={"BACKENDS_CSV": "marlin"}
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "run_cell" not in proc.stdout + proc.stderr
    assert len(pd.read_csv(run_dir / "results.csv")) == 2
