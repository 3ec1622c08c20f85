"""Tests of servesweep.plan: missing cells, server starts, estimates from history or the sim."""

from __future__ import annotations

from pathlib import Path

from servesweep.config import cell_repeats, load_experiment_file
from servesweep.events import EventLog
from servesweep.paths import RunPaths
from servesweep.plan import make_plan, read_history, simulated_cell_s
from tests.helpers import DEFAULT_CONFIG


def test_everything_missing_is_estimated_from_the_sim(tmp_path: Path) -> None:
    exp = load_experiment_file(DEFAULT_CONFIG)
    plan = make_plan(exp=exp, paths=RunPaths(tmp_path / exp.run_id), results_dir=tmp_path)
    assert len(plan.missing) == 24 and len(plan.starts) == 4
    assert plan.from_history == 0
    cell = cell_repeats(exp)[0]
    assert plan.estimate_s > 24 * simulated_cell_s(exp, cell) * 0.5
    text = plan.render()
    assert "24 of 24 cell-repeats missing" in text and "server starts: 4" in text


def test_history_and_existing_files_shape_the_plan(tmp_path: Path) -> None:
    exp = load_experiment_file(DEFAULT_CONFIG)
    paths = RunPaths(tmp_path / exp.run_id)
    cells = cell_repeats(exp)
    for cell in cells[1:]:  # only the first cell-repeat is missing
        paths.raw(cell).parent.mkdir(parents=True, exist_ok=True)
        paths.raw(cell).write_text("{}\n")
    first = cells[0]
    log = EventLog(tmp_path / "earlier-run" / "orchestrator.log")
    log.emit("ready", fp=first.server.fingerprint, server=first.server.id, seconds="100.00")
    log.emit(
        "cell-done",
        cell=first.key,
        fp=first.server.fingerprint,
        seconds="50.00",
        client_seconds="49.00",
    )
    history = read_history(tmp_path)
    assert history.ready_s == {first.server.fingerprint: 100.0}
    plan = make_plan(exp=exp, paths=paths, results_dir=tmp_path)
    assert [c.key for c in plan.missing] == [first.key]
    assert plan.starts == [first.server.fingerprint]
    assert plan.from_history == 1
    assert 150.0 < plan.estimate_s < 200.0  # 100 s start + 50 s cell + overheads
