"""Records a rerun replaces are copied to raw/.superseded/<time>/ and listed, never deleted."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from servesweep.config.paths import RunPaths, cell_file
from servesweep.core.events import EventLog, read_events
from servesweep.workflow.superseded import supersede, superseded_files


def test_replaced_records_are_kept_with_their_files_and_listed(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path / "run")
    measured, missing = ("s~a", "concurrency~2", 1), ("s~a", "concurrency~4", 1)
    ids = dict(zip(("server_id", "client_id", "repeat"), measured, strict=True))
    for kind in ("raw", "gpu", "bench"):
        path = cell_file(paths.root, kind, **ids)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"old {kind}\n")
    when = dt.datetime(2026, 12, 2, 6, 0, tzinfo=dt.UTC)
    kept = supersede(
        paths=paths,
        cells=[measured, missing],
        reasons={measured: "changed measurement"},
        events=EventLog(paths.orchestrator_log),
        now=when,
    )
    folder = paths.root / "raw" / ".superseded" / "20261202T060000Z"
    assert kept == [folder / "raw" / "s~a" / "concurrency~2" / "r1.jsonl"]
    assert (folder / "gpu" / "s~a" / "concurrency~2" / "r1.csv").read_text() == "old gpu\n"
    assert (folder / "bench" / "s~a" / "concurrency~2" / "r1.log").read_text() == "old bench\n"
    assert cell_file(paths.root, "raw", **ids).read_text() == "old raw\n"  # copied, not moved
    listed = "raw/.superseded/20261202T060000Z/raw/s~a/concurrency~2/r1.jsonl"
    assert superseded_files(paths) == [listed]
    [(_, event, fields)] = read_events(paths.orchestrator_log)
    assert (event, fields["cell"], fields["reason"]) == (
        "superseded",
        "s~a/concurrency~2/r1",
        "changed measurement",
    )
