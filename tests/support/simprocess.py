"""Test harness: start the simulated engine (and its router) as local processes, by pid."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from servesweep.core.errors import ServerStartError
from servesweep.sim.logs import READY_LINE
from servesweep.sim.router import READY_LINE as ROUTER_READY_LINE

__all__ = ["ROUTER_READY_LINE", "SimProcess", "free_port", "start_router", "start_sim"]
UVICORN_RE = re.compile(r"Uvicorn running on http://(\S+):(\d+)")
POLL_S = 0.05


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (bind port 0, read it, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@dataclass
class SimProcess:
    """A running `python -m servesweep.sim` in its own session, logging to `log_path`."""

    proc: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        """The whole log so far."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    @property
    def url(self) -> str:
        """http://host:port of rank 0, from its `Uvicorn running on` line."""
        match = UVICORN_RE.search(self.log())
        if match is None:
            raise ServerStartError(f"no 'Uvicorn running on' line yet in {self.log_path}")
        return f"http://{match.group(1)}:{match.group(2)}"

    def wait_for_line(self, text: str, *, timeout_s: float = 30.0) -> None:
        """Wait until the log contains `text`; raise if the process exits first or time runs
        out (the message names the log file)."""
        deadline = time.monotonic() + timeout_s
        while text not in self.log():
            if self.proc.poll() is not None:
                raise ServerStartError(
                    f"sim pid {self.pid} exited with {self.proc.returncode} before logging "
                    f"{text!r}; log: {self.log_path}"
                )
            if time.monotonic() > deadline:
                raise ServerStartError(f"no {text!r} within {timeout_s}s; log: {self.log_path}")
            time.sleep(POLL_S)

    def wait_ready(self, *, timeout_s: float = 30.0) -> SimProcess:
        """Wait for the ready line (rank 0)."""
        self.wait_for_line(READY_LINE, timeout_s=timeout_s)
        return self

    def wait_exit(self, *, timeout_s: float = 30.0) -> int:
        """Wait for the process to end by itself; return its exit code."""
        return self.proc.wait(timeout=timeout_s)

    def stop(self, *, timeout_s: float = 10.0) -> int:
        """SIGTERM, then SIGKILL after `timeout_s`; return the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def __enter__(self) -> SimProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        with contextlib.suppress(OSError):
            self.stop()


def start_sim(
    *,
    argv: Sequence[str],
    log_path: str | Path,
    env: Mapping[str, str] | None = None,
    module: str = "servesweep.sim",
    prefix: Sequence[str] = (),
) -> SimProcess:
    """Start `<prefix> python -m <module> <argv>` detached, stdout+stderr to `log_path`;
    `prefix` is a command that execs the rest, such as `taskset -c 1` to pin the sim."""
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [*prefix, sys.executable, "-m", module, *argv],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )
    return SimProcess(proc=proc, log_path=log_path)


def start_router(
    *, argv: Sequence[str], log_path: str | Path, env: Mapping[str, str] | None = None
) -> SimProcess:
    """Start the mini-LB (`python -m servesweep.sim.router <argv>`); wait for it with
    `wait_for_line(ROUTER_READY_LINE)`, then `url` is its address."""
    return start_sim(argv=argv, log_path=log_path, env=env, module="servesweep.sim.router")
