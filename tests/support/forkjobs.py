"""Job functions for tests/unit/test_forkserver.py, run by a real fork server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path


def report(argv: Sequence[str]) -> None:
    """Print what the job sees, then exit with the status in argv[0]."""
    seen = {
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "cwd": os.getcwd(),
        "argv": list(argv),
        "sys_argv": sys.argv,
        "marker": os.environ.get("FORKJOB_MARKER"),
    }
    print(json.dumps(seen))
    print("to stderr", file=sys.stderr)
    sys.exit(int(argv[0]))


def fail(argv: Sequence[str]) -> None:
    """End as argv[0] says: a message to sys.exit, or an exception."""
    if argv[0] == "message":
        sys.exit("job said no")
    raise ValueError("job broke")


def wait(argv: Sequence[str]) -> None:
    """Write this process's pid to argv[0] (with "spawn": and that of a `sleep` it started, as
    a cell starts its load client), then sleep; Ctrl-C ends it with status 130."""
    pids = [os.getpid()]
    if argv[1:] == ["spawn"]:
        pids.append(subprocess.Popen(["sleep", "60"]).pid)
    Path(argv[0]).write_text(" ".join(map(str, pids)))
    try:
        time.sleep(60)
    except KeyboardInterrupt:
        print("job interrupted", file=sys.stderr)
        sys.exit(130)


def echo(arg: object) -> None:
    """Print the argument as JSON."""
    print(json.dumps(arg))
