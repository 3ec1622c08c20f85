"""A failed request (HTTP 500, or an error inside a 200 stream) aborts the run cleanly."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest

from servesweep.cluster.runtime import ProcessRuntime
from servesweep.cluster.transport import LocalTransport
from servesweep.config.load import load_experiment_file
from servesweep.core.events import read_events
from tests.helpers import experiment_file, run_snakemake

pytestmark = pytest.mark.workflow

SMALL = {
    "engine": {"sim": {"time_scale": 0.001, "startup_s": 5}},
    "matrix": {
        "server": {"moe_runner_backend": ["marlin"], "chunked_prefill_size": [8192]},
        "client": {"concurrency": [4]},
    },
    "workload": {"input_len": 2048, "num_requests": 8},
    "repeats": 2,
}


@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        ({"http_500_at": [2]}, "500"),
        ({"midstream_error_at": [3]}, "error"),
    ],
)
def test_failed_request_aborts_and_leaves_no_raw_file(
    tmp_path: Path, fault: dict, expected: str
) -> None:
    run_id = f"wf-fault-{uuid.uuid4().hex[:6]}"  # its own: leftovers are its own
    cfg = experiment_file(
        tmp_path,
        {
            **SMALL,
            "run_id": run_id,
            "engine": {**SMALL["engine"], "sim": {**SMALL["engine"]["sim"], "faults": fault}},
        },
    )
    proc = run_snakemake(tmp_path, "--cores", "1", "all", "--configfile", str(cfg))
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    run_dir = tmp_path / "results" / run_id
    # Cells of one server config run in any order: the first one to run meets the fault.
    match = re.search(r"servesweep: CellFailed: cell (\S+/\S+/r\d+):", out)
    assert match, out[-3000:]
    cell = match.group(1)
    assert cell.startswith("moe_runner_backend~marlin,chunked_prefill_size~8192/concurrency~4/r")
    assert expected in out
    assert f"results/{run_id}/bench/{cell}.log" in out
    # The console gets the one-line reason once, not the logs: no client table, no progress.
    assert len(re.findall(r"^servesweep: CellFailed: ", out, re.M)) == 1, out[-3000:]
    assert "Serving Benchmark Result" not in out and "it/s]" not in out, out[-3000:]
    assert not (run_dir / "raw" / f"{cell}.jsonl").exists()
    assert not (run_dir / "gpu" / f"{cell}.csv").exists()
    assert (run_dir / "bench" / f"{cell}.log").exists(), "the bench log is kept for diagnosis"
    events = [e for _, e, _ in read_events(run_dir / "orchestrator.log")]
    assert "cell-failed" in events
    assert events[-1] == "stop", "onerror stopped the server"
    exp = load_experiment_file(cfg)
    runtime = ProcessRuntime(LocalTransport())
    assert runtime.find("local", {"run": exp.run_id}) == [], "no server process is left"
