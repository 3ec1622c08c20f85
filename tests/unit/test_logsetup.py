"""Tests of workflow.logsetup: a job's logging and stderr go to its log; one-line errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO

JOB = """
import logging, subprocess, sys
from servesweep.core.errors import CellFailed
from servesweep.workflow.logsetup import job_logging

kind, log = sys.argv[1], sys.argv[2]
with job_logging(log):
    logging.getLogger("servesweep.x").info("a log line")
    print("stderr line", file=sys.stderr)
    subprocess.run(["sh", "-c", "echo child stderr >&2"], check=True)
    if kind == "cell":
        raise CellFailed("cell a/b/r1: 1 request failed; logs: bench.log")
    if kind == "bug":
        raise KeyError("bug")
    if kind == "ctrl-c":
        raise KeyboardInterrupt
    if kind == "console":
        from servesweep.workflow.logsetup import console
        console("[1/2] a cell done")
print("after", file=sys.stderr)
"""


def _job(tmp_path: Path, kind: str) -> tuple[subprocess.CompletedProcess[str], str]:
    log = tmp_path / "logs" / "job.log"
    log.parent.mkdir()
    log.write_text("stale line of an earlier run\n")
    proc = subprocess.run(
        [sys.executable, "-c", JOB, kind, str(log)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    return proc, log.read_text()


def test_logging_stderr_and_subprocesses_go_to_the_log(tmp_path: Path) -> None:
    proc, log = _job(tmp_path, "ok")
    assert proc.returncode == 0, proc.stderr
    assert "servesweep.x: a log line" in log
    assert "stderr line" in log and "child stderr" in log
    assert "stale line" not in log
    assert proc.stderr == "after\n", "stderr is the terminal again after the block"


@pytest.mark.parametrize(
    ("kind", "status", "line"),
    [
        ("cell", 1, "servesweep: CellFailed: cell a/b/r1: 1 request failed; logs: bench.log"),
        ("ctrl-c", 130, "servesweep: Interrupted: stopped by SIGINT (Ctrl-C)"),
    ],
)
def test_an_expected_failure_is_one_line_at_the_end_of_the_log(
    tmp_path: Path, kind: str, status: int, line: str
) -> None:
    proc, log = _job(tmp_path, kind)
    assert proc.returncode == status
    assert proc.stderr == line + "\n", "the terminal gets the one line, not the log"
    assert log.endswith(line + "\n")
    assert "Traceback" not in log


def test_a_bug_keeps_its_traceback_in_the_log(tmp_path: Path) -> None:
    proc, log = _job(tmp_path, "bug")
    assert proc.returncode == 1
    assert "job failed" in log and "KeyError: 'bug'" in log
    assert "KeyError: 'bug'" in proc.stderr


def test_console_reaches_the_terminal_from_inside_the_job(tmp_path: Path) -> None:
    proc, log = _job(tmp_path, "console")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "[1/2] a cell done\nafter\n"
    assert "console: [1/2] a cell done" in log
