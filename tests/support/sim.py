"""Run the simulated SGLang engine as a real subprocess on a free loopback port."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from servesweep.sim.process import free_port  # noqa: F401 (re-exported)

HOST = "127.0.0.1"
SIM_MODULE = "servesweep.sim"
SIM_MAIN = Path(__file__).resolve().parents[2] / "src" / "servesweep" / "sim" / "__main__.py"


@dataclass(frozen=True)
class SimServer:
    """A running sim: where to reach it and where it logs."""

    base_url: str
    port: int
    pid: int
    log_path: Path

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def sim_available() -> bool:
    """Whether `python -m servesweep.sim` exists in this checkout yet."""
    return SIM_MAIN.exists()


def _healthy(base_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base_url}/health", timeout=2) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@contextlib.contextmanager
def running_sim(
    *,
    log_path: Path,
    args: Sequence[str] = (),
    model_path: str = "sim/test-model",
    time_scale: float = 0.001,
    startup_s: float = 1.0,
    ready_timeout_s: float = 60.0,
) -> Iterator[SimServer]:
    """Start `python -m servesweep.sim`, wait for /health 200, stop it (by pid) on exit."""
    for attempt in range(3):
        port = free_port()
        argv = [
            sys.executable,
            "-m",
            SIM_MODULE,
            "--model-path",
            model_path,
            "--host",
            HOST,
            "--port",
            str(port),
            "--sim-time-scale",
            str(time_scale),
            "--sim-startup-s",
            str(startup_s),
            *args,
        ]
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        server = SimServer(f"http://{HOST}:{port}", port, proc.pid, log_path)
        try:
            deadline = time.monotonic() + ready_timeout_s
            while proc.poll() is None and not _healthy(server.base_url):
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"sim not healthy in {ready_timeout_s} s:\n{server.log_text()}"
                    )
                time.sleep(0.05)
            if proc.poll() is not None:
                text = server.log_text()
                if "Address already in use" in text and attempt < 2:
                    continue  # lost the free-port race; try another port
                raise RuntimeError(f"sim exited with {proc.returncode}:\n{text[-3000:]}")
            yield server
            return
        finally:
            _stop(proc)
