"""Tests of servesweep.core.events: orchestrator.log lines round-trip."""

from pathlib import Path

import pytest

from servesweep.core.events import EventLog, read_events


def test_emit_and_read_back(tmp_path: Path) -> None:
    log = EventLog(tmp_path / "orchestrator.log")
    log.emit("start", fp="abc123", server="moe~marlin", nodes="a,b")
    log.emit("stop", fp="abc123", reason="workflow finished")
    events = read_events(log.path)
    assert [e[1] for e in events] == ["start", "stop"]
    assert events[0][2] == {"fp": "abc123", "server": "moe~marlin", "nodes": "a,b"}
    assert events[1][2]["reason"] == "workflow finished"
    assert events[0][0].endswith("Z")


def test_missing_log_is_empty(tmp_path: Path) -> None:
    assert read_events(tmp_path / "nope.log") == []


def test_error_text_reads_back_whole(tmp_path: Path) -> None:
    """Quotes, backslashes and long paths in a value survive: nothing is cut mid-path."""
    error = (
        'invalid record: first error: HTTP 500: {"error": {"message": "x \\ y"}}; logs: '
        + "/".join(["results", "run", "bench", "moe_runner_backend~marlin"] * 20)
        + "/r1.log"
    )
    log = EventLog(tmp_path / "orchestrator.log")
    log.emit("cell-failed", cell="a/b/r1", error=error + "\nsecond line", fp="f")
    ((_, event, fields),) = read_events(log.path)
    assert event == "cell-failed" and fields["fp"] == "f"
    assert fields["error"] == error + " second line"


def test_an_unwritable_log_names_its_file(tmp_path: Path) -> None:
    """A full disk (here: the path is a directory) says which file (issue 17 item 10)."""
    (tmp_path / "orchestrator.log").mkdir()
    with pytest.raises(OSError, match=r"writing .*orchestrator\.log"):
        EventLog(tmp_path / "orchestrator.log").emit("cell-start", cell="a/b/r1")
