"""Two checkouts with the same RUN_ID at once on one machine: both finish, neither stops the
other's servers (owner labels, issue 16 part 2)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from servesweep.core.events import read_events
from tests.helpers import REPO, experiment_file

pytestmark = pytest.mark.workflow
RUN = "wf-shared"
SMALL = {"run_id": RUN, "repeats": 2, "workload": {"num_requests": 8}}
NARROW = {
    "BACKENDS_CSV": "marlin,flashinfer_mxfp4",
    "CHUNKED_PREFILL_SIZES_CSV": "8192",
    "CONCURRENCIES_CSV": "8",
}


def _start(workdir: Path) -> subprocess.Popen[str]:
    cfg = experiment_file(workdir, SMALL)
    env = {k: v for k, v in os.environ.items() if k not in ("RUN_ID", "SUITE")} | NARROW
    exe = shutil.which("snakemake")
    assert exe
    # up to results.csv: the servers run (and could be stopped by the other run) in the cells
    table = f"results/{RUN}/results.csv"
    args = [exe, "-s", str(REPO / "Snakefile"), "-d", str(workdir), "--cores", "1", table]
    return subprocess.Popen(
        [*args, "--configfile", str(cfg)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )


def test_two_checkouts_same_run_id_at_once(tmp_path: Path) -> None:
    dirs = [tmp_path / "clone-a", tmp_path / "clone-b"]
    procs = []
    for d in dirs:
        d.mkdir()
        procs.append(_start(d))
    outputs = [p.communicate(timeout=900)[0] for p in procs]
    for proc, out in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, out[-4000:]
    owners = set()
    for d in dirs:
        events = read_events(d / "results" / RUN / "orchestrator.log")
        names = [e for _, e, _ in events]
        assert "stale" not in names, "neither run found (and stopped) a server it did not own"
        assert names.count("start") == 2, names  # one per server config, no restart
        owners |= {f.get("owner") for _, e, f in events if e == "start"}
    assert len(owners) == 2, owners
