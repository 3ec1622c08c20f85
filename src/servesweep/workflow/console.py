"""The console kept in the run folder: what an invocation prints (Snakemake's lines, the jobs'
output, the answer block, a failure's line) also goes to `console.log`, appended after a header
line, as the seeds' `| tee -a` did."""

from __future__ import annotations

import atexit
import contextlib
import datetime as dt
import os
import shlex
import subprocess
import sys
from pathlib import Path

# How long the exit waits for the copies to write out what they were handed last.
DRAIN_TIMEOUT_S = 10.0


def header(argv: list[str]) -> str:
    """The line that opens one invocation's part of the console log."""
    now = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    return f"==== {now} pid {os.getpid()}: {shlex.join(argv)}"


def tee_console(path: Path, argv: list[str]) -> None:
    """From now on copy this process's stdout and stderr (file descriptors 1 and 2, so the
    children's output too) into `path` as well, appended after `header(argv)`: one `tee -a`
    per stream, in its own session (a Ctrl-C leaves it to copy the last lines), waited for at
    exit. An earlier invocation's part is never truncated."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as log:
        log.write(header(argv) + "\n")
    sys.stdout.flush()
    sys.stderr.flush()
    copies: list[tuple[int, int, subprocess.Popen[bytes]]] = []
    for fd in (1, 2):
        original = os.dup(fd)
        tee = subprocess.Popen(
            ["tee", "-a", str(path)],
            stdin=subprocess.PIPE,
            stdout=original,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        assert tee.stdin is not None
        os.dup2(tee.stdin.fileno(), fd)
        tee.stdin.close()
        copies.append((fd, original, tee))
    atexit.register(_restore, copies)


def _restore(copies: list[tuple[int, int, subprocess.Popen[bytes]]]) -> None:
    """At exit: the streams back on the console, then each copy drained."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    for fd, original, _ in copies:
        os.dup2(original, fd)
        os.close(original)
    for _, _, tee in copies:
        # A child still holding the pipe: its copy ends with it.
        with contextlib.suppress(subprocess.TimeoutExpired):
            tee.wait(timeout=DRAIN_TIMEOUT_S)
