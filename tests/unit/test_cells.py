"""Tests of servesweep.measure.cells on the real sim: files appear only for a valid cell-repeat."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import yaml

from servesweep.cluster.access import open_cluster
from servesweep.config.load import load_experiment
from servesweep.config.matrix import cell_repeats, image_key, workload_key
from servesweep.config.paths import RunPaths
from servesweep.config.schema import SaturationConfig
from servesweep.core.errors import CellFailed, ClientError, ConfigError, PreflightFailed
from servesweep.core.events import read_events
from servesweep.core.gpufile import parse_timestamp, read_snapshot
from servesweep.measure import provenance
from servesweep.measure.cells import (
    _check_client,
    check_prerequisites,
    run_cell,
    warn_gpu_gaps,
)
from servesweep.measure.client import CLOCK_KEY, client_labels, client_timeout, client_usage
from servesweep.measure.loadgen import usage
from servesweep.measure.locks import server_lock
from servesweep.measure.records import BenchRecord, read_record
from servesweep.serving.servers import ServerManager
from tests.helpers import DEFAULT_CONFIG, deep_update, free_port
from tests.support.runs import REC_0523

# Modules the cell job (servesweep.workflow.jobs, scripts/run_cell.py) must not import: every
# cell-repeat's process pays them; paramiko loads only for SSH clusters (servesweep.cluster.ssh) and
# aiohttp only in the client's own process.
HEAVY_MODULES = ("pandas", "numpy", "paramiko", "aiohttp")


def _setup(tmp_path: Path, faults: dict | None = None, server: dict | None = None):
    raw = deep_update(
        yaml.safe_load(DEFAULT_CONFIG.read_text()),
        {
            # Its own run id: a cell stops any client left with its labels (run, pool,
            # owner) before starting one, so tests on parallel workers must not share them.
            "run_id": f"unit-cells-{uuid.uuid4().hex[:6]}",
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
            "server": server or {},
        },
    )
    exp = load_experiment(raw, {})
    paths = RunPaths(tmp_path / "results" / exp.run_id)
    manager = ServerManager(exp, paths, cluster=open_cluster(exp))
    return exp, paths, manager, cell_repeats(exp)[0]


def test_valid_cell_writes_record_and_gpu_snapshot(tmp_path: Path) -> None:
    exp, paths, manager, cell = _setup(tmp_path)
    try:
        run_cell(exp=exp, cell=cell, manager=manager, **_files(paths, cell))
    finally:
        manager.stop_all(reason="test")
    record = read_record(paths.raw(cell))
    assert record.completed == 4 and record.tag == cell.key
    gpu = read_snapshot(paths.gpu(cell))
    phases = [row["phase"] for row in gpu]
    # in time order, the after rows last (a file cut at any line lacks some: `incomplete`)
    assert phases[:4] == ["before", "clock", "window-start", "window-end"]
    assert phases[-1] == "after"
    assert set(phases[4:-1]) == {"sample"} and len(phases) > 5  # the sim's curve
    assert {row["status"] for row in gpu[4:-1]} == {"simulated"}
    assert "nvidia-smi" in gpu[0]["detail"]
    # the wrapper's figures of the client process, from the last line of its bench log
    process = (record.model_extra or {})[usage.RECORD_KEY]
    assert process["returncode"] == 0 and process["wall_s"] > 0 and process["cpu_user_s"] > 0
    assert paths.bench_log(cell).read_text().splitlines()[-1].startswith(usage.MARK)
    done = [f for _, e, f in read_events(paths.orchestrator_log) if e == "cell-done"]
    assert done[0]["cell"] == cell.key and float(done[0]["client_seconds"]) > 0
    assert not list(paths.raw(cell).parent.glob(".*")), "no temp file left"


def test_invalid_record_leaves_no_raw_file(tmp_path: Path) -> None:
    exp, paths, manager, cell = _setup(tmp_path, {"midstream_error_at": [1]})
    with pytest.raises(CellFailed) as info:
        try:
            run_cell(exp=exp, cell=cell, manager=manager, **_files(paths, cell))
        finally:
            manager.stop_all(reason="test")
    assert f"cell {cell.key}" in str(info.value)
    assert str(paths.bench_log(cell)) in str(info.value)
    assert not paths.raw(cell).exists() and not paths.gpu(cell).exists()
    assert paths.bench_log(cell).exists()
    assert [e for _, e, _ in read_events(paths.orchestrator_log)].count("cell-failed") == 1


def test_a_failed_attempt_keeps_its_bench_log_under_its_own_name(tmp_path: Path) -> None:
    """The error (and orchestrator.log's cell-failed) names a copy of the failed attempt's
    bench log, which the cell's valid rerun does not overwrite."""
    exp, paths, manager, cell = _setup(tmp_path, {"midstream_error_at": [1]})
    try:
        with pytest.raises(CellFailed) as info:
            run_cell(exp=exp, cell=cell, manager=manager, **_files(paths, cell))
        log = paths.bench_log(cell)
        (kept,) = log.parent.glob(f"{log.name}.failed-*")
        text = str(info.value)
        assert str(kept) in text and text.count(str(log)) == text.count(str(kept)), text
        failed = [f for _, e, f in read_events(paths.orchestrator_log) if e == "cell-failed"]
        assert str(kept) in failed[0]["error"]
        attempt = kept.read_text()
        assert attempt == log.read_text()
        # the fault was the server's first request only: the rerun on the same server is valid
        run_cell(exp=exp, cell=cell, manager=manager, **_files(paths, cell))
    finally:
        manager.stop_all(reason="test")
    assert paths.raw(cell).exists()
    assert kept.read_text() == attempt != log.read_text()


def test_an_interrupted_cell_job_stops_the_client_it_started(tmp_path: Path) -> None:
    """Ctrl-C or SIGTERM that reaches the cell job but not its client (an SSH node's container,
    a client that half-handles it) leaves no client behind: the job stops it on the way out."""
    exp, paths, manager, cell = _setup(tmp_path, {"hang_at": [1, 2, 3, 4]})
    # The server hangs on purpose: its stall watchdog (120 s by default) must not end the cell
    # before this test's own deadline does.
    exp = exp.model_copy(
        update={"validation": exp.validation.model_copy(update={"stall_timeout_s": 600.0})}
    )
    node = exp.cluster.nodes[0]
    labels = client_labels(exp=exp, manager=manager)
    interrupted: list[str] = []
    seen: list[str] = []  # each search's outcome, for the failure message

    def interrupt_once_the_client_runs() -> None:
        deadline = time.monotonic() + 120
        while not interrupted and time.monotonic() < deadline:
            started = time.monotonic()
            try:
                interrupted.extend(manager.runtime.find(node, labels))
                seen.append(f"{len(interrupted)} in {time.monotonic() - started:.1f}s")
            except Exception as exc:  # noqa: BLE001 (reported by the assertion below)
                seen.append(f"{type(exc).__name__}: {exc}")
            time.sleep(0.1)
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)  # this process only

    # Ctrl-C as a terminal delivers it, whatever handler an earlier test in this worker left.
    found_handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    thread = threading.Thread(target=interrupt_once_the_client_runs, daemon=True)
    thread.start()
    try:
        with pytest.raises(KeyboardInterrupt, match=f"cell {cell.key} interrupted"):
            run_cell(exp=exp, cell=cell, manager=manager, **_files(paths, cell))
        left = manager.runtime.find(node, labels)  # before the server stops (the client would end)
    finally:
        thread.join()
        manager.stop_all(reason="test")
        signal.signal(signal.SIGINT, found_handler)
    assert interrupted, (
        f"the client was never found; searches: {seen[:3]} ... {seen[-3:]}; "
        f"SIGINT handler found: {found_handler!r}"
    )
    assert left == [], "the interrupted job left its client"
    assert not paths.raw(cell).exists() and not paths.gpu(cell).exists()


def test_a_missing_or_garbled_usage_line_is_one_warning_and_no_figures(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log = tmp_path / "r1.log"
    line = {"wall_s": 2, "cpu_user_s": 1, "cpu_sys_s": 0, "max_rss_kb": 1, "returncode": 0}
    log.write_text(f"output\n{usage.MARK}{json.dumps(line)}\n")
    with caplog.at_level("WARNING"):
        assert client_usage(log, cell="c") == usage.ProcessUsage(**line)
        assert not caplog.records
        for text in ("output\n", f"{usage.MARK}{{garbled\n"):
            log.write_text(text)
            assert client_usage(log, cell="c") is None
        assert client_usage(tmp_path / "absent.log", cell="c") is None
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 3 and all("no client process figures" in w for w in warned)


def test_a_bench_serving_cell_is_saturated_by_its_whole_process_cpu(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    exp = _setup(tmp_path)[0]
    bench = json.loads(REC_0523.read_text())  # no self-check
    hot = {"wall_s": 10, "cpu_user_s": 9, "cpu_sys_s": 0.5, "max_rss_kb": 1, "returncode": 0}
    record = BenchRecord.model_validate({**bench, usage.RECORD_KEY: hot})
    log = tmp_path / "r1.log"
    with caplog.at_level("WARNING"):
        _check_client(exp=exp, record=record, cell="c", bench_log=log)
    assert "whole-process CPU 95% of a core, limit 90" in caplog.text
    strict = exp.model_copy(
        update={
            "client": exp.client.model_copy(update={"saturation": SaturationConfig(invalid=True)})
        }
    )
    with pytest.raises(ClientError, match="cell c: client saturated"):
        _check_client(exp=strict, record=record, cell="c", bench_log=log)
    cool = BenchRecord.model_validate({**bench, usage.RECORD_KEY: {**hot, "cpu_user_s": 5}})
    _check_client(exp=strict, record=cool, cell="c", bench_log=log)  # 55%: passes


def test_client_timeout_scales_with_waves(tmp_path: Path) -> None:
    _, _, _, cell = _setup(tmp_path)
    w = cell.client.workload
    assert client_timeout(w) == 2 * w.request_timeout_s + 600


def _files(paths: RunPaths, cell) -> dict[str, Path]:
    return {"raw": paths.raw(cell), "gpu": paths.gpu(cell), "bench_log": paths.bench_log(cell)}


def test_the_server_lock_admits_one_holder_at_a_time(tmp_path: Path) -> None:
    # The holder's last act under the lock is to write a file: whoever enters after it must
    # find the file, however late either process ran (no clock is read: the elapsed time a
    # waiter sees shrinks when a loaded machine delays it).
    lock, done = tmp_path / "service" / "nodes~a.lock", tmp_path / "holder-done"
    holder = (
        "import sys, time; from pathlib import Path\n"
        "from servesweep.measure.locks import server_lock\n"
        "with server_lock(Path(sys.argv[1])):\n    print('held', flush=True); time.sleep(1.0)\n"
        "    Path(sys.argv[2]).touch()\n"
    )
    argv = [sys.executable, "-c", holder, str(lock), str(done)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"held\n"
        with server_lock(lock):
            assert done.exists(), "entered while another held it"
    finally:
        proc.wait(timeout=30)


def test_two_runs_of_one_checkout_share_node_locks_and_a_cell_is_measured_once(
    tmp_path: Path,
) -> None:
    from servesweep.measure.locks import cell_lock

    exp, paths, _, cell = _setup(tmp_path)
    other = RunPaths(paths.root.parent / "another-run")
    assert other.node_locks(["b", "a"]) == paths.node_locks(["a", "b"])  # per node, in order
    assert paths.cell_lock(cell).is_relative_to(paths.root / ".locks")  # not among the records
    held = cell_lock(paths.cell_lock(cell), cell=cell.key)
    with held, pytest.raises(CellFailed) as info, cell_lock(paths.cell_lock(cell), cell=cell.key):
        pass
    assert str(info.value).startswith(
        f"cell {cell.key}: another live job is measuring it (pid {os.getpid()})"
    )
    with cell_lock(paths.cell_lock(cell), cell=cell.key):  # released with its job
        pass


def test_a_cell_whose_planned_fingerprint_differs_is_refused(tmp_path: Path) -> None:
    from servesweep.workflow.jobs import run_cell as run_cell_job

    exp, paths, _, cell = _setup(tmp_path)
    with pytest.raises(ConfigError, match="fingerprint"):
        run_cell_job(
            config=exp.model_dump(mode="json"),
            server=cell.server.id,
            client=cell.client.id,
            repeat=1,
            fingerprint="0" * 12,
            workload=workload_key(cell.workload),
            measured_with=json.dumps(provenance.measured_with(exp, cell)),
            **_files(paths, cell),
        )


def test_a_cell_planned_with_another_client_is_refused(tmp_path: Path) -> None:
    from servesweep.workflow.jobs import run_cell as run_cell_job

    exp, paths, _, cell = _setup(tmp_path)
    planned = provenance.measured_with(exp, cell)
    planned["client"]["kind"] = "bench_serving"
    with pytest.raises(ConfigError, match="client.kind: 'bench_serving' -> 'builtin'"):
        run_cell_job(
            config=exp.model_dump(mode="json"),
            server=cell.server.id,
            client=cell.client.id,
            repeat=1,
            fingerprint=cell.server.fingerprint,
            workload=workload_key(cell.workload),
            measured_with=json.dumps(planned),
            **_files(paths, cell),
        )


def test_prerequisites_name_missing_evidence(tmp_path: Path) -> None:
    raw = deep_update(yaml.safe_load(DEFAULT_CONFIG.read_text()), {"run_id": "unit-prereq"})
    exp = load_experiment(raw, {})
    paths = RunPaths.for_run(exp, tmp_path / "results")
    with pytest.raises(PreflightFailed, match=r"cell c1: evidence missing: .*preflight\.json"):
        check_prerequisites(exp=exp, paths=paths, cell="c1")
    paths.preflight.parent.mkdir(parents=True)
    paths.preflight.write_text("{}")
    check_prerequisites(exp=exp, paths=paths, cell="c1")


def test_docker_runs_check_each_nodes_image(tmp_path: Path) -> None:
    raw = deep_update(
        yaml.safe_load(DEFAULT_CONFIG.read_text()),
        {"run_id": "unit-prereq", "runtime": {"kind": "docker", "image": "img:1"}},
    )
    exp = load_experiment(raw, {})
    paths = RunPaths.for_run(exp, tmp_path / "results")
    shared = tmp_path / "results" / ".images" / image_key(exp)  # shared by every run id
    expected = [shared / f"{node}.json" for node in exp.cluster.nodes] + [paths.preflight]
    assert paths.prerequisites(exp) == expected


def test_cell_job_imports_no_heavy_modules() -> None:
    code = (
        "import json, sys, servesweep.workflow.jobs; "
        f"print(json.dumps([n for n in {list(HEAVY_MODULES)!r} if n in sys.modules]))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    heavy = json.loads(proc.stdout)
    assert not heavy, (
        f"servesweep.workflow.jobs imports {', '.join(heavy)}: every cell-repeat's process "
        "pays it; "
        "keep the analysis jobs' imports in analysisjobs/plotjobs"
    )


def test_a_client_enospc_is_named_not_just_its_exit_status(tmp_path: Path) -> None:
    from servesweep.measure.client import _client_cause

    log = tmp_path / "r1.log"
    log.write_text("start\nOSError: [Errno 28] No space left on device: '/tmp/x.jsonl'\n")
    assert _client_cause(log).startswith(" (its disk is full: OSError: [Errno 28]")
    log.write_text("start\nTimeoutError\n")
    assert _client_cause(log) == ""


def test_a_node_without_nvidia_smi_is_said_once_per_run(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Every cell's rows say it; the warning comes once per node and reason."""
    paths = RunPaths(tmp_path / "run")
    gap = {"node": "a", "status": "unavailable", "detail": "nvidia-smi not found on node a"}
    other = {"node": "b", "status": "unavailable", "detail": "nvidia-smi not found on node b"}
    ok = {"node": "c", "status": "ok", "detail": ""}
    with caplog.at_level("WARNING"):
        for k in range(24):  # 24 cells, before + after rows of each
            warn_gpu_gaps([gap, gap, other, ok], paths=paths, cell=f"s/c/r{k}")
    warned = [r.getMessage() for r in caplog.records if "unavailable" in r.getMessage()]
    assert len(warned) == 2, warned
    assert "nvidia-smi not found on node a" in warned[0] and "s/c/r0" in warned[0]
    kept = sorted(p.read_text() for p in (paths.logs / "gpu_unavailable").iterdir())
    assert kept == [w + "\n" for w in warned]


def test_no_gpu_gap_is_said_where_the_sim_gives_the_figures(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 27: on the sim the snapshots find no nvidia-smi, but the sim's curve gives every
    figure: no 'GPU figures unavailable' line (a node without samples still gets it)."""
    paths = RunPaths(tmp_path / "run")
    gap = {"node": "local", "status": "unavailable", "detail": "nvidia-smi not found on node local"}
    sim = {"node": "local", "phase": "sample", "status": "simulated", "detail": "simulated"}
    bare = {"node": "b", "status": "unavailable", "detail": "nvidia-smi not found on node b"}
    with caplog.at_level("WARNING"):
        warn_gpu_gaps([gap, sim, gap, bare], paths=paths, cell="s/c/r1")
    warned = [r.getMessage() for r in caplog.records if "unavailable" in r.getMessage()]
    assert len(warned) == 1 and "node b" in warned[0], warned


def test_aggregates_cover_every_finished_cell_of_the_configured_matrix(tmp_path: Path) -> None:
    from servesweep.config.load import unnarrowed_env
    from servesweep.config.paths import aggregate_cells

    raw = yaml.safe_load(DEFAULT_CONFIG.read_text())
    env = {"BACKENDS_CSV": "flashinfer_mxfp4", "RUN_ID": "agg"}
    narrowed = load_experiment(raw, env)
    configured = load_experiment(raw, unnarrowed_env(env))
    assert configured.run_id == "agg" and len(cell_repeats(configured)) > len(
        cell_repeats(narrowed)
    )
    paths = RunPaths.for_run(narrowed, tmp_path / "results")
    finished = [c for c in cell_repeats(configured) if "marlin" in c.server.id][:2]
    for cell in finished:
        for path in (paths.raw(cell), paths.gpu(cell)):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("x")
    cells = aggregate_cells(
        selected=cell_repeats(narrowed), configured=cell_repeats(configured), paths=paths
    )
    keys = [c.key for c in cells]
    assert keys[:2] == [c.key for c in finished], "in matrix order: marlin configs first"
    assert set(keys) == {c.key for c in cell_repeats(narrowed)} | {c.key for c in finished}


def test_the_gpu_window_ends_when_the_client_wrote_its_record_not_when_it_exited(
    tmp_path: Path,
) -> None:
    # bench_serving 0.5.17 on the H200 rehearsal exited ~1.8 s after writing its record, and a
    # window ending at its exit missed half of the measurement. Here every client process
    # lingers 2 s after its record (an interpreter that sleeps after its program).
    slow = tmp_path / "slowexit"
    slow.write_text(f'#!/bin/sh\n{sys.executable} "$@"; rc=$?; sleep 2; exit $rc\n')
    slow.chmod(0o755)
    exp, paths, manager, cell = _setup(tmp_path)
    exp = exp.model_copy(update={"engine": exp.engine.model_copy(update={"python": str(slow)})})
    manager = ServerManager(exp, paths, cluster=open_cluster(exp))
    try:
        run_cell(exp=exp, cell=cell, manager=manager, **_files(paths, cell))
        returned = time.time()
    finally:
        manager.stop_all(reason="test")
    written = (read_record(paths.raw(cell)).model_extra or {})[CLOCK_KEY]["record_written_at"]
    assert returned - written > 1.5
    rows = {row["phase"]: row for row in read_snapshot(paths.gpu(cell))}
    end = parse_timestamp(rows["window-end"]["timestamp"])
    # The window ends at the record's file time, brought to this host's clock by the offset the
    # cell measured (the GPU file's clock row): exactly, to the millisecond its timestamps hold.
    offset = rows["clock"]["clock_offset_s"]
    assert end == pytest.approx(written - offset, abs=1e-3)
    # This host is the node, so the true offset is 0 and the measured one is off by at most half
    # the round trip of its `date` (a 0.0112 s gap failed a 0.01 s limit under load). Its exit
    # came >= 2 s after the record: a window ending there misses this bound by a second or more.
    assert abs(end - written) < 1.0


def test_a_run_start_removes_every_partial_client_file_of_a_killed_job(tmp_path):
    """A killed job's hidden client record (it may hold the API key) goes when the run next
    starts, also in a cell that never runs again; a running job's file stays."""
    from servesweep.core.events import EventLog
    from servesweep.measure.client import remove_run_partials

    run = tmp_path / "run"
    dead = [
        run / "bench" / "s~a" / "concurrency~2" / f".r1.{2**22 + 7}.client.jsonl",
        run / "bench" / "s~b" / "concurrency~4" / ".r2.client.jsonl",
    ]
    alive = run / "bench" / "s~a" / "concurrency~4" / f".r1.{os.getpid()}.client.jsonl"
    for path in [*dead, alive]:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text('{"server_info": {"api_key": "k"')
    removed = remove_run_partials(run, events=EventLog(run / "orchestrator.log"))
    assert sorted(removed) == sorted(dead) and alive.exists()
    assert not any(p.exists() for p in dead)
    cells = [f["cell"] for _, e, f in read_events(run / "orchestrator.log")]
    assert sorted(cells) == ["s~a/concurrency~2/r1", "s~b/concurrency~4/r2"]


def test_the_client_record_with_the_key_is_never_readable_by_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client's own record holds /server_info, with the API key: 0600 from its creation
    while the cell runs (the client appends to it under umask 022 here), then removed."""
    from servesweep.measure import client

    modes: list[int] = []

    def read(path: Path, **kwargs: object) -> BenchRecord:
        modes.append(Path(path).stat().st_mode & 0o777)
        return read_record(path, **kwargs)

    monkeypatch.setattr(client, "read_record", read)
    exp, paths, manager, cell = _setup(tmp_path)
    old = os.umask(0o022)
    try:
        run_cell(exp=exp, cell=cell, manager=manager, **_files(paths, cell))
    finally:
        os.umask(old)
        manager.stop_all(reason="test")
    assert modes == [0o600]
    assert not list(paths.bench_log(cell).parent.glob(".*client.jsonl"))


def test_a_keyed_server_with_its_radix_cache_on_is_flushed_before_each_cell(
    tmp_path: Path,
) -> None:
    # `/flush_cache` went without the API key: 401 until ServerBusy, every cell, 60 s each.
    # With the key, real SGLang 0.5.17 logged "Cache flushed successfully!" before every cell.
    exp, paths, manager, cell = _setup(tmp_path, server={"disable_radix_cache": False})
    try:
        run_cell(exp=exp, cell=cell, manager=manager, **_files(paths, cell))
        state = manager.current()
        assert state is not None and manager.api_key(state) is not None
        log = manager.local_log_path(state.server_id, "server", exp.cluster.nodes[0])
    finally:
        manager.stop_all(reason="test")
    assert (read_record(paths.raw(cell)).model_extra or {})["servesweep_cache_flushed"] is True
    assert "Cache flushed successfully!" in log.read_text()


def test_a_guessed_evidence_pattern_is_counted_never_enforced(tmp_path: Path) -> None:
    """The sim's server never logs this line: the guessed pattern records 0 and the cell
    stands; the same pattern, confirmed (not in `guesses`), makes the cell invalid."""
    exp, paths, manager, cell = _setup(tmp_path)
    never = {"rdma_ack": {"pattern": "RDMA ready ack never logged", "role": "server"}}
    guessed = load_experiment(
        {**exp.model_dump(mode="json"), "evidence": never, "guesses": ["evidence.rdma_ack"]}, {}
    )
    confirmed = guessed.model_copy(update={"guesses": []})
    try:
        run_cell(exp=guessed, cell=cell, manager=manager, **_files(paths, cell))
        record = read_record(paths.raw(cell))
        assert (record.model_extra or {})["servesweep_evidence"] == {"rdma_ack": 0}
        paths.raw(cell).unlink()
        with pytest.raises(CellFailed, match="rdma_ack \\(server logs, window cell\\): 0 < 1"):
            run_cell(exp=confirmed, cell=cell, manager=manager, **_files(paths, cell))
    finally:
        manager.stop_all(reason="test")
    assert not paths.raw(cell).exists()
