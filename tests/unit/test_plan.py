"""Tests of workflow.plan: missing cells, server starts, estimates from history or the sim."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servesweep.config.load import load_experiment_file
from servesweep.config.matrix import cell_repeats
from servesweep.config.paths import RunPaths
from servesweep.core.events import EventLog
from servesweep.measure.provenance import KEY, measured_with
from servesweep.workflow.plan import (
    CELL_FIXED_S,
    CHANGED_CODE,
    CHANGED_MEASUREMENT,
    MISSING,
    dry_run_requested,
    make_plan,
    read_history,
    rerun_reason,
    simulated_seconds,
)
from tests.helpers import DEFAULT_CONFIG


def test_everything_missing_is_estimated_from_the_sim(tmp_path: Path) -> None:
    exp = load_experiment_file(DEFAULT_CONFIG)
    plan = make_plan(exp=exp, paths=RunPaths(tmp_path / exp.run_id), results_dir=tmp_path)
    assert len(plan.missing) == 24 and len(plan.starts) == 4
    assert plan.from_history == 0
    cell = cell_repeats(exp)[0]
    assert plan.estimate_s > 24 * simulated_seconds(exp, cell) * 0.5
    text = plan.render()
    assert "24 of 24 cell-repeats to run (24 missing)" in text and "server starts: 4" in text
    # The parts add up; measuring is the cost model's windows, the rest is around them.
    parts = plan.starts_s + plan.warmups_s + plan.measuring_s + plan.overhead_s + plan.other_s
    assert plan.estimate_s == pytest.approx(parts)
    windows = sum(simulated_seconds(exp, c) for c in plan.missing)
    assert plan.measuring_s == pytest.approx(windows)
    assert plan.overhead_s > 24 * CELL_FIXED_S
    assert 0.0 < plan.measuring_share < 1.0
    assert f"measuring is {plan.measuring_share:.0%} of the time servers hold the GPUs" in text
    line = plan.summary()
    assert "\n" not in line
    assert "24 of 24 cell-repeats to run (24 missing), 4 server starts, 0 image builds" in line


def test_history_and_existing_files_shape_the_plan(tmp_path: Path) -> None:
    exp = load_experiment_file(DEFAULT_CONFIG)
    paths = RunPaths(tmp_path / exp.run_id)
    cells = cell_repeats(exp)
    for cell in cells[1:]:  # only the first cell-repeat is missing
        paths.raw(cell).parent.mkdir(parents=True, exist_ok=True)
        paths.raw(cell).write_text(json.dumps({KEY: measured_with(exp, cell)}) + "\n")
    probed(paths, cells)
    first = cells[0]
    log = EventLog(tmp_path / "earlier-run" / "orchestrator.log")
    log.emit("ready", fp=first.server.fingerprint, server=first.server.id, seconds="100.00")
    log.emit("warmup", fp=first.server.fingerprint, server=first.server.id, seconds="7.00")
    log.emit(
        "cell-done",
        cell=first.key,
        fp=first.server.fingerprint,
        seconds="50.00",
        client_seconds="49.00",
        measured_seconds="40.00",
    )
    history = read_history(tmp_path)
    assert history.ready_s == {first.server.fingerprint: 100.0}
    plan = make_plan(exp=exp, paths=paths, results_dir=tmp_path)
    assert [c.key for c in plan.missing] == [first.key]
    assert plan.starts == [first.server.fingerprint]
    assert plan.from_history == 1
    assert 150.0 < plan.estimate_s < 200.0  # 100 s start + 50 s cell + overheads
    assert (plan.starts_s, plan.measuring_s) == (100.0, 40.0)
    assert plan.warmups_s == 0.0  # the default config has no warm-up after a start
    assert history.warmup_s == {first.server.fingerprint: 7.0}


@pytest.mark.parametrize(
    ("argv", "dry"),
    [
        (["snakemake", "-n"], True),
        (["snakemake", "--cores", "1", "--dry-run", "all"], True),
        (["snakemake", "-np", "all"], True),
        (["snakemake", "--dryrun"], True),
        (["snakemake", "--cores", "1", "all"], False),
        (["snakemake", "--nolock", "--cores", "1"], False),
        (["snakemake", "-Rrun_cell", "--cores", "1"], False),  # a value, not flags
    ],
)
def test_dry_run_is_read_from_the_command_line(argv: list[str], dry: bool) -> None:
    assert dry_run_requested(argv) is dry


def test_the_dry_run_line_gives_no_estimate_beyond_its_budget(tmp_path: Path) -> None:
    """More configs than the cost-model budget: counts only, and where the estimate is."""
    exp = load_experiment_file(DEFAULT_CONFIG)
    paths = RunPaths(tmp_path / exp.run_id)
    plan = make_plan(exp=exp, paths=paths, results_dir=tmp_path, max_simulated=7)
    assert plan.unestimated == 8 and len(plan.missing) == 24 and len(plan.starts) == 4
    assert plan.summary().endswith(
        "24 of 24 cell-repeats to run (24 missing), 4 server starts, 0 image builds; no "
        "estimate here (8 server x client configs for the cost model): `servesweep plan` gives it"
    )
    within = make_plan(exp=exp, paths=paths, results_dir=tmp_path, max_simulated=8)
    assert within.unestimated == 0 and "estimated " in within.summary()


def test_a_config_edit_counts_every_cell_snakemake_reruns_and_says_it_replaces_records(
    tmp_path: Path,
) -> None:
    """Records measured with another workload (or client) run again, as Snakemake reruns them
    (their params changed); the plan gives the reason and ends saying it replaces them."""
    exp = load_experiment_file(DEFAULT_CONFIG)
    paths = RunPaths(tmp_path / exp.run_id)
    cells = cell_repeats(exp)
    edited = exp.model_copy(
        update={"workload": exp.workload.model_copy(update={"num_requests": 7})}
    )
    for i, cell in enumerate(cells):
        recorded = measured_with(exp, cell)
        if i == 0:
            recorded = {**recorded, "client": {**recorded["client"], "version": "0.0.1"}}
        paths.raw(cell).parent.mkdir(parents=True, exist_ok=True)
        paths.raw(cell).write_text(json.dumps({KEY: recorded}) + "\n")
    assert rerun_reason(exp, paths, cells[1]) is None
    assert rerun_reason(exp, paths, cells[0]) == CHANGED_CODE
    again = cell_repeats(edited)
    assert [rerun_reason(edited, paths, c) for c in again[1:3]] == [CHANGED_MEASUREMENT] * 2
    paths.raw(cells[2]).unlink()
    assert rerun_reason(exp, paths, cells[2]) == MISSING
    plan = make_plan(exp=exp, paths=paths, results_dir=tmp_path)
    assert [c.key for c in plan.missing] == [cells[0].key, cells[2].key]
    assert plan.summary().endswith(
        "; REPLACES 1 measured record(s) (kept under moe-prefill-sim/raw/.superseded/<time>/)"
    )
    assert "2 of 24 cell-repeats to run (1 missing, 1 changed code)" in plan.summary()
    n = len(cells)
    edited_plan = make_plan(exp=edited, paths=paths, results_dir=tmp_path)
    assert len(edited_plan.missing) == n and edited_plan.replaced == n - 1
    assert f"{n} of {n} cell-repeats to run (1 missing, {n - 1} changed measurement)" in (
        edited_plan.summary()
    )
    assert f"REPLACES {n - 1} measured record(s)" in edited_plan.summary().rsplit(";", 1)[1]


def test_a_service_that_is_up_costs_no_start(tmp_path: Path) -> None:
    # seed 003's flow: `servesweep up`, then suites under new RUN_IDs reuse the service
    exp = load_experiment_file(DEFAULT_CONFIG)
    paths = RunPaths(tmp_path / exp.run_id)
    before = make_plan(exp=exp, paths=paths, results_dir=tmp_path)
    up = before.starts[0]
    paths.service_record(up).parent.mkdir(parents=True)
    paths.service_record(up).write_text("{}")
    after = make_plan(exp=exp, paths=paths, results_dir=tmp_path)
    assert len(after.missing) == len(before.missing)
    assert after.starts == before.starts[1:] and up not in after.starts
    assert after.starts_s < before.starts_s
    assert f"{len(before.starts) - 1} server starts" in after.summary()


def probed(paths: RunPaths, cells: list) -> None:
    """Every server config's equivalence probe answered (a file in its place)."""
    for cell in cells:
        paths.probe(cell.server.id).parent.mkdir(parents=True, exist_ok=True)
        paths.probe(cell.server.id).write_text("{}")


def test_a_measured_config_without_its_probe_starts_for_the_probe_alone(tmp_path: Path) -> None:
    exp = load_experiment_file(DEFAULT_CONFIG)
    paths = RunPaths(tmp_path / exp.run_id)
    cells = cell_repeats(exp)
    for cell in cells:
        paths.raw(cell).parent.mkdir(parents=True, exist_ok=True)
        paths.raw(cell).write_text(json.dumps({KEY: measured_with(exp, cell)}) + "\n")
    plan = make_plan(exp=exp, paths=paths, results_dir=tmp_path)
    assert plan.missing == [] and len(plan.starts) == 4  # the run predates the probe
    probed(paths, cells[:1])
    assert len(make_plan(exp=exp, paths=paths, results_dir=tmp_path).starts) == 3
    off = exp.model_copy(
        update={"equivalence": exp.equivalence.model_copy(update={"enabled": False})}
    )
    assert make_plan(exp=off, paths=paths, results_dir=tmp_path).starts == []
