"""Shared helpers of the benchmark scripts: provenance, JSON results, pinned sims, timing."""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import logging
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from servesweep.config.load import CLIENT_AXIS_ENV, SERVER_ARG_ENV, SERVER_AXIS_ENV
from servesweep.core.errors import ServerStartError

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # tests.support (staged bench_serving, tokenizer) and helpers
    sys.path.insert(0, str(REPO))
from tests.support.simprocess import free_port, start_sim  # noqa: E402, F401 (free_port re-exported)

RESULTS_DIR = REPO / "benchmarks" / "results"
# Where `--smoke` runs write their JSON (not benchmarks/results/: the doc is made from there).
SMOKE_DIR = Path(tempfile.gettempdir()) / "servesweep-bench-smoke"
PROBE = REPO / "benchmarks" / "_probe.py"
HOST = "127.0.0.1"
# The sim's zero-cost mode (no simulated compute, no sleeping) is `--sim-time-scale 0`; a sim
# without it gets this tiny scale instead (every step shorter than its minimum sleep).
ZERO_COST_SCALE = 0.0
FALLBACK_SCALE = 1e-9
CLK_TCK = os.sysconf("SC_CLK_TCK")

log = logging.getLogger("benchmarks")
# Variables the workflow narrows the matrix with (servesweep.config): never inherited by a run.
NARROWING_ENV = (*SERVER_AXIS_ENV, *CLIENT_AXIS_ENV, *SERVER_ARG_ENV, "RUN_ID", "SUITE")


def workflow_env(**extra: str) -> dict[str, str]:
    """This process's environment without the narrowing variables, plus `extra`."""
    return {**{k: v for k, v in os.environ.items() if k not in NARROWING_ENV}, **extra}


def snakemake_exe() -> str:
    """The `snakemake` on PATH, or exit saying it is missing."""
    exe = shutil.which("snakemake")
    if exe is None:
        raise SystemExit("snakemake is not installed")
    return exe


def setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _git(*args: str) -> str | None:
    try:
        res = subprocess.run(
            ["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return res.stdout.strip() if res.returncode == 0 else None


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def provenance() -> dict[str, Any]:
    """When and where a figure was measured (goes into every result file and the doc)."""
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {
        "measured_at": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "host": socket.gethostname(),
        "cpu": cpu_model(),
        "cpus": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "snakemake": _version("snakemake"),
        "aiohttp": _version("aiohttp"),
        "pandas": _version("pandas"),
        "git_sha": (_git("rev-parse", "--short", "HEAD") or "unknown"),
        "git_dirty": bool(status),
    }


def write_result(
    name: str, data: dict[str, Any], out: str | Path | None = None, *, smoke: bool = False
) -> Path:
    """Write `benchmarks/results/<name>.json` (or `out`) with provenance; return the path. A
    `--smoke` run writes to SMOKE_DIR instead: its figures never replace a measured result."""
    default = SMOKE_DIR if smoke else RESULTS_DIR
    path = Path(out) if out else default / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"benchmark": name, "provenance": provenance(), **data}
    path.write_text(json.dumps(payload, indent=2, allow_nan=False, default=str) + "\n")
    log.info("wrote %s", path)
    return path


def add_common_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default=None, help="result JSON (default benchmarks/results/)")
    parser.add_argument("--keep-tmp", action="store_true", help="keep the scratch directory")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="a tiny size (seconds): checks the sanity bounds and that the figures come out; "
        "timing goals are reported, not enforced (see benchmarks/README.md)",
    )


# ---------------------------------------------------------------- goals and sanity bounds


@dataclass(frozen=True)
class Check:
    """One goal or sanity bound of a benchmark and what the run measured against it.

    `timing`: a goal on a speed figure. A `--smoke` run reports it but does not fail on it: at
    a tiny size on a shared 2-core machine it measures noise and start-up, not the goal. Every
    other check (sanity bounds, and goals that are not timings) fails a smoke run too."""

    name: str
    ok: bool
    measured: str
    timing: bool = False

    def enforced(self, *, smoke: bool) -> bool:
        return not (smoke and self.timing)


def check_rows(checks: Sequence[Check], *, smoke: bool) -> list[dict[str, Any]]:
    """The checks as JSON rows (for the result file)."""
    return [
        {
            "check": c.name,
            "ok": c.ok,
            "measured": c.measured,
            "timing_goal": c.timing,
            "enforced": c.enforced(smoke=smoke),
        }
        for c in checks
    ]


def verdict(checks: Sequence[Check], *, smoke: bool) -> int:
    """Print every check; 1 when an enforced one failed (each named), else 0."""
    failed = []
    for c in checks:
        if c.ok:
            state = "ok"
        elif c.enforced(smoke=smoke):
            state = "FAILED"
            failed.append(c)
        else:
            state = "not met (timing goal: reported, not enforced under --smoke)"
        print(f"check {c.name}: {state} ({c.measured})")
    for c in failed:
        print(f"FAILED: {c.name} ({c.measured})", file=sys.stderr)
    return 1 if failed else 0


@contextlib.contextmanager
def scratch_dir(prefix: str, *, keep: bool = False) -> Iterator[Path]:
    """A fresh directory under the system temp dir (never the repo's results/)."""
    path = Path(tempfile.mkdtemp(prefix=f"servesweep-bench-{prefix}-"))
    try:
        yield path
    finally:
        if keep:
            log.info("kept scratch directory %s", path)
        else:
            shutil.rmtree(path, ignore_errors=True)


def pin(core: int | None) -> list[str]:
    """`taskset -c core` as an argv prefix (nothing if no core or no taskset)."""
    if core is None or shutil.which("taskset") is None:
        return []
    return ["taskset", "-c", str(core)]


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a running process (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = (len(ordered) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def median(values: Sequence[float]) -> float:
    return percentile(values, 50.0)


@contextlib.contextmanager
def timed() -> Iterator[dict[str, float]]:
    """`with timed() as t: ...` then t["s"] is the wall time."""
    box: dict[str, float] = {}
    start = time.perf_counter()
    try:
        yield box
    finally:
        box["s"] = time.perf_counter() - start


# ---------------------------------------------------------------- the simulated engine


@dataclass(frozen=True)
class Sim:
    """Running sim processes, each pinned to a core, serving one address."""

    base_url: str
    pids: tuple[int, ...]
    time_scale: float
    log_path: Path


def _generates(base_url: str) -> bool:
    """Whether a tiny non-streaming /generate request succeeds."""
    body = json.dumps(
        {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2}, "stream": False}
    ).encode()
    req = urllib.request.Request(
        f"{base_url}/generate", data=body, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


@contextlib.contextmanager
def zero_cost_sim(
    *, workdir: Path, cores: Sequence[int] | None, args: Sequence[str] = ()
) -> Iterator[Sim]:
    """One sim process per core of `cores` (None: one, not pinned) in zero-cost mode
    (`--sim-time-scale 0`), else with FALLBACK_SCALE, stopped on exit. Several share one port
    (`--sim-reuse-port`): the kernel spreads the client's connections among them, so a client
    benchmark can give the sim more cores than the client has."""
    pinned: list[int | None] = list(cores) if cores else [None]
    share = ["--sim-reuse-port"] if len(pinned) > 1 else []
    for scale in (ZERO_COST_SCALE, FALLBACK_SCALE):
        base = ["--model-path", "sim/bench", "--host", HOST, "--skip-server-warmup", *share]
        base += ["--sim-time-scale", repr(scale), "--sim-startup-s", "0", *args]
        log_path = workdir / f"sim-scale-{scale!r}.log"
        with contextlib.ExitStack() as stack:
            pids, port = [], "0"
            try:
                for k, core in enumerate(pinned):
                    path = log_path if k == 0 else log_path.with_suffix(f".{k}.log")
                    argv = [*base, "--port", port]
                    proc = stack.enter_context(
                        start_sim(argv=argv, log_path=path, prefix=pin(core))
                    )
                    base_url = proc.wait_ready(timeout_s=60).url
                    port = base_url.rsplit(":", 1)[1]
                    pids.append(proc.pid)
            except ServerStartError as exc:
                log.info("sim with --sim-time-scale %r did not start (%s)", scale, exc)
                continue
            if not _generates(base_url):
                log.info("sim with --sim-time-scale %r did not serve; trying the next", scale)
                continue
            log.info("sim at %s (time scale %r, cores %s)", base_url, scale, pinned)
            yield Sim(base_url, tuple(pids), scale, log_path)
            return
    raise RuntimeError(f"the sim did not start; logs in {workdir}")


def time_scale_note(scale: float) -> str:
    if scale == 0:
        return "sim in zero-cost mode (--sim-time-scale 0: no simulated compute, no sleeping)"
    return (
        f"sim at --sim-time-scale {scale:g} (this sim has no zero-cost mode yet; every step "
        "is shorter than its minimum sleep, so it never sleeps)"
    )
