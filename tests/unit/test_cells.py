"""Tests of servesweep.cells on the real sim: files appear only for a valid cell-repeat."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from servesweep.cells import check_prerequisites, client_timeout, run_cell
from servesweep.config import RunPaths, cell_repeats, load_experiment
from servesweep.errors import CellFailed, PreflightFailed
from servesweep.events import read_events
from servesweep.records import read_record
from servesweep.runtime import ProcessRuntime
from servesweep.servers import ServerManager
from servesweep.telemetry import read_snapshot
from servesweep.transport import LocalTransport
from tests.helpers import DEFAULT_CONFIG, deep_update, free_port

# Modules the cell job must not import: the fork server serves cells as soon as it has imported
# servesweep.celljob (pandas and seaborn come later, while it is idle), and a cell run without
# the server pays them per cell-repeat; paramiko loads only for SSH clusters (servesweep.ssh)
# and aiohttp only in the client's own process.
HEAVY_MODULES = ("pandas", "numpy", "paramiko", "aiohttp")


def _setup(tmp_path: Path, faults: dict | None = None):
    raw = deep_update(
        yaml.safe_load(DEFAULT_CONFIG.read_text()),
        {
            "run_id": "unit-cells",
            "engine": {
                "port": free_port(),
                "dist_init_port": free_port(),
                "sim": {"time_scale": 0.001, "startup_s": 1, "faults": faults or {}},
            },
            "matrix": {
                "server": {"moe_runner_backend": ["marlin"], "chunked_prefill_size": [8192]},
                "client": {"concurrency": [2]},
            },
            "workload": {"input_len": 1024, "num_requests": 4},
            "repeats": 1,
        },
    )
    exp = load_experiment(raw, {})
    paths = RunPaths(tmp_path / "results" / exp.run_id)
    transport = LocalTransport()
    manager = ServerManager(exp, paths, transport=transport, runtime=ProcessRuntime(transport))
    return exp, paths, manager, cell_repeats(exp)[0]


def test_valid_cell_writes_record_and_gpu_snapshot(tmp_path: Path) -> None:
    exp, paths, manager, cell = _setup(tmp_path)
    try:
        run_cell(exp=exp, cell=cell, paths=paths, manager=manager)
    finally:
        manager.stop_all(reason="test")
    record = read_record(paths.raw(cell))
    assert record.completed == 4 and record.tag == cell.key
    gpu = read_snapshot(paths.gpu(cell))
    assert [row["phase"] for row in gpu] == ["before", "after"]
    assert "nvidia-smi" in gpu[0]["detail"]
    done = [f for _, e, f in read_events(paths.orchestrator_log) if e == "cell-done"]
    assert done[0]["cell"] == cell.key and float(done[0]["client_seconds"]) > 0
    assert not list(paths.raw(cell).parent.glob(".*")), "no temp file left"


def test_invalid_record_leaves_no_raw_file(tmp_path: Path) -> None:
    exp, paths, manager, cell = _setup(tmp_path, {"midstream_error_at": [1]})
    with pytest.raises(CellFailed) as info:
        try:
            run_cell(exp=exp, cell=cell, paths=paths, manager=manager)
        finally:
            manager.stop_all(reason="test")
    assert f"cell {cell.key}" in str(info.value)
    assert str(paths.bench_log(cell)) in str(info.value)
    assert not paths.raw(cell).exists() and not paths.gpu(cell).exists()
    assert paths.bench_log(cell).exists()
    assert [e for _, e, _ in read_events(paths.orchestrator_log)].count("cell-failed") == 1


def test_client_timeout_scales_with_waves(tmp_path: Path) -> None:
    _, _, _, cell = _setup(tmp_path)
    w = cell.client.workload
    assert client_timeout(w) == 2 * w.request_timeout_s + 600


def test_prerequisites_name_missing_evidence(tmp_path: Path) -> None:
    raw = deep_update(yaml.safe_load(DEFAULT_CONFIG.read_text()), {"run_id": "unit-prereq"})
    exp = load_experiment(raw, {})
    paths = RunPaths.for_run(exp, tmp_path / "results")
    with pytest.raises(PreflightFailed, match=r"cell c1: evidence missing: .*preflight\.json"):
        check_prerequisites(exp=exp, paths=paths, cell="c1")
    paths.preflight.parent.mkdir(parents=True)
    paths.preflight.write_text("{}")
    check_prerequisites(exp=exp, paths=paths, cell="c1")


def test_prerequisites_of_docker_runs_include_each_nodes_image_evidence(tmp_path: Path) -> None:
    raw = deep_update(
        yaml.safe_load(DEFAULT_CONFIG.read_text()),
        {"run_id": "unit-prereq", "runtime": {"kind": "docker", "image": "img:1"}},
    )
    exp = load_experiment(raw, {})
    paths = RunPaths.for_run(exp, tmp_path / "results")
    expected = [paths.build(node) for node in exp.cluster.nodes] + [paths.preflight]
    assert paths.prerequisites(exp) == expected


def test_cell_job_imports_no_heavy_modules() -> None:
    code = (
        "import json, sys, servesweep.celljob; "
        f"print(json.dumps([n for n in {list(HEAVY_MODULES)!r} if n in sys.modules]))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    heavy = json.loads(proc.stdout)
    assert not heavy, (
        f"servesweep.celljob imports {', '.join(heavy)}: cells wait for it in the fork server, "
        "and without one every cell-repeat pays it; import it in the function that needs it"
    )
