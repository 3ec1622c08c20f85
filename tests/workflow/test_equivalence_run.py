"""The equivalence probe end to end on the sim: a candidate that answers wrong tokens at full
speed (config/experiments/equivalence_corrupt_local.yaml) is reported faster, and `outputs
differ` stands beside its speed verdict in the console answer, the report, summary.json and
results.csv; a changed probe reruns the probe, never a cell."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests.helpers import REPO, free_port, run_snakemake

pytestmark = pytest.mark.workflow

CORRUPT = REPO / "config" / "experiments" / "equivalence_corrupt_local.yaml"


def config(directory: Path, run_id: str, **equivalence: object) -> Path:
    raw = yaml.safe_load(CORRUPT.read_text())
    raw["run_id"] = run_id
    raw["engine"]["port"], raw["engine"]["dist_init_port"] = free_port(), free_port()
    raw["engine"]["sim"]["time_scale"] = 0.002
    raw["repeats"] = 2
    raw["equivalence"] = {"lengths": [16], **equivalence}
    path = directory / f"{run_id}-{len(equivalence)}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def test_a_faster_candidate_that_answers_wrong_is_not_better(tmp_path: Path) -> None:
    run_id = f"wf-eq-{uuid.uuid4().hex[:6]}"
    proc = run_snakemake(
        tmp_path, "--cores", "1", "all", "--configfile", str(config(tmp_path, run_id))
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    answer = out[out.index("== servesweep: the answer") :]
    speed = re.search(r"input throughput.*\n.*\+\d+\.\d+% \[[^]]*\] better", answer)
    assert speed, answer  # the candidate is faster ...
    assert "!! WARNING: outputs differ from the baseline in 1 of 1 server config(s)" in answer
    assert "WARNING: outputs differ: moe_runner_backend=flashinfer_mxfp4" in answer
    run = tmp_path / "results" / run_id
    assert "outputs differ" in (run / "report.html").read_text()
    summary = json.loads((run / "summary.json").read_text())
    assert [c["verdict"] for c in summary["equivalence"]["comparisons"]] == ["outputs differ"]
    assert {d.get("outputs") for d in summary["deltas"]} == {"outputs differ"}
    rows = pd.read_csv(run / "results.csv")
    verdicts = dict(zip(rows["moe_runner_backend"], rows["outputs_verdict"], strict=False))
    assert verdicts == {"marlin": "baseline", "flashinfer_mxfp4": "outputs differ"}
    # Each probe ran after its server's start and before its cells, and no cell saw its prompts.
    events = (run / "orchestrator.log").read_text().splitlines()
    for server in {p.stem for p in (run / "equivalence").glob("*.json")}:
        kinds = [
            line.split()[1]
            for line in events
            if f"server={server}" in line or f"cell={server}/" in line
        ]
        assert kinds.index("probe-done") < kinds.index("cell-start"), kinds
    # A changed probe reruns the probes only (up to summary.json, which reads the probes and,
    # through results.csv, every cell; the plots and report after it add nothing here).
    raws = {p: p.stat().st_mtime_ns for p in (run / "raw").rglob("*.jsonl")}
    summary_json = f"results/{run_id}/summary.json"
    changed = config(tmp_path, run_id, output_len=8)
    again = run_snakemake(tmp_path, "--cores", "1", summary_json, "--configfile", str(changed))
    assert again.returncode == 0, (again.stdout + again.stderr)[-3000:]
    assert {p: p.stat().st_mtime_ns for p in (run / "raw").rglob("*.jsonl")} == raws
    probe = json.loads(next((run / "equivalence").glob("*.json")).read_text())
    assert probe["settings"]["output_len"] == 8
