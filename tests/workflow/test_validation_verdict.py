"""Seed 003's criteria on a real run: a missed gate bound and a fatal finding of the final log
scan each fail the run (exit 1, one named line), the records stay; the console is kept in
the run folder, one part per invocation."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from tests.helpers import experiment_file, run_snakemake

pytestmark = pytest.mark.workflow

ONE_CELL = {
    "engine": {"sim": {"time_scale": 0.001, "startup_s": 5}},
    "matrix": {
        "server": {"moe_runner_backend": ["marlin"], "chunked_prefill_size": [8192]},
        "client": {"concurrency": [4]},
    },
    "workload": {"input_len": 2048, "num_requests": 8},
    "repeats": 1,
}
FAILED = "servesweep: ValidationFailed: "


def _run(tmp_path: Path, run_id: str, gate_max: float, *extra: str):
    changes = {
        **ONE_CELL,
        "run_id": run_id,
        "gate": [{"where": {"concurrency": 4}, "bounds": {"ttft_p50_ms": {"max": gate_max}}}],
    }
    cfg = experiment_file(tmp_path, changes)
    return run_snakemake(tmp_path, "--cores", "1", "all", "--configfile", str(cfg), *extra)


def test_a_missed_gate_and_a_fatal_log_finding_fail_the_run_by_name(tmp_path: Path) -> None:
    run_id = f"wf-verdict-{uuid.uuid4().hex[:6]}"
    run_dir = tmp_path / "results" / run_id
    # 1. A bound no cell can meet: exit 1, the bound named, the record kept.
    proc = _run(tmp_path, run_id, 0.001)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-3000:]
    [last] = [ln for ln in proc.stderr.splitlines() if ln.startswith(FAILED)]
    assert (
        "gate missed: moe_runner_backend=marlin, chunked_prefill_size=8192, concurrency=4: " in last
    )
    assert "ttft_p50_ms " in last and ", max 0.001 " in last
    assert "Validation FAILED:" in proc.stdout  # the answer block lists it
    [raw] = list(run_dir.glob("raw/*/*/r1.jsonl"))
    summary = json.loads((run_dir / "summary.json").read_text())
    [missed] = summary["gate"]["missed"]
    assert (missed["metric"], missed["bound"], missed["limit"]) == ("ttft_p50_ms", "max", 0.001)
    assert missed["value"] > 0.001
    # 2. The bound met: the medians rechecked, no cell rerun, exit 0.
    mtime = raw.stat().st_mtime_ns
    proc = _run(tmp_path, run_id, 1e9)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert "Gate: all 1 bounds met" in proc.stdout
    assert raw.stat().st_mtime_ns == mtime
    # 3. A fatal line in a server log at the final scan: exit 1 naming it, its node and log.
    [server_log] = [p for p in run_dir.glob("service/*/*.log") if p.name != "warmup.log"]
    with server_log.open("a") as f:
        f.write("[2026-12-07 10:00:00 TP0] torch.OutOfMemoryError: CUDA out of memory.\n")
    proc = _run(tmp_path, run_id, 1e9, "--forcerun", "scan_logs")
    assert proc.returncode == 1, (proc.stdout + proc.stderr)[-3000:]
    [last] = [ln for ln in proc.stderr.splitlines() if ln.startswith(FAILED)]
    rel = server_log.relative_to(tmp_path)
    assert last.startswith(
        f"{FAILED}fatal log finding cuda_oom on server node {server_log.stem}: {rel} line "
    ), last
    assert raw.exists() and raw.stat().st_mtime_ns == mtime, "the measured record stays"
    # The console of all three invocations, in order, each after its header line.
    console = (run_dir / "console.log").read_text()
    parts = console.split("\n==== ")
    assert len(parts) == 3 and parts[0].startswith("==== "), console[:2000]
    assert "gate missed:" in parts[0] and "Gate: all 1 bounds met" in parts[1]
    assert parts[2].rstrip().endswith(last)
