"""Run the simulated SGLang engine as a real subprocess on a free loopback port."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.support.simprocess import start_sim

HOST = "127.0.0.1"
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
    """Start `python -m servesweep.sim` on a port the OS picks, wait until it is ready, stop
    it (by pid) on exit."""
    argv = [
        "--model-path",
        model_path,
        "--host",
        HOST,
        "--port",
        "0",
        "--sim-time-scale",
        str(time_scale),
        "--sim-startup-s",
        str(startup_s),
        *args,
    ]
    with start_sim(argv=argv, log_path=log_path) as proc:
        base_url = proc.wait_ready(timeout_s=ready_timeout_s).url
        yield SimServer(base_url, int(base_url.rsplit(":", 1)[1]), proc.pid, log_path)
