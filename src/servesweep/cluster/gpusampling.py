"""GPU samples during a cell: nvidia-smi loops on every node and the sim's power curve."""

from __future__ import annotations

import json
import logging
import math
import shlex
import threading
import time
import urllib.request
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from servesweep.cluster import telemetry
from servesweep.cluster.runtime import node_dir_prep
from servesweep.core.gpufile import (
    PHASE_SAMPLE,
    PHASE_WINDOW_END,
    PHASE_WINDOW_START,
    STATUS_OK,
    STATUS_SIMULATED,
    STATUS_UNAVAILABLE,
    format_timestamp,
    parse_timestamp,
    text_of,
)

if TYPE_CHECKING:
    from servesweep.cluster.transport import Transport

log = logging.getLogger(__name__)

# The fields one loop line holds, in this order: those of the recorded H200 series
# (tests/data/nvidia-smi-series/), which the integration nodes' fake nvidia-smi replays.
SAMPLE_FIELDS: tuple[str, ...] = (
    "timestamp",
    "index",
    "uuid",
    "power.draw",
    "power.limit",
    "utilization.gpu",
    "utilization.memory",
    "memory.used",
    "memory.total",
    "clocks.sm",
    "clocks.mem",
    "temperature.gpu",
    "pstate",
)
# The simulated curve: idle and loaded power of the recorded H200 series (79 W, 692 W, limit
# 700 W); busy = 1 - 0.5**requests held (a monotone curve of the load, not a power model).
SIM_IDLE_W = 79.3
SIM_LOADED_W = 691.9
SIM_LIMIT_W = 700.0
SIM_MIN_INTERVAL_S = 0.02
STOP_TIMEOUT_S = 60.0


def loop_command(*, interval_ms: int, out: str, max_s: int) -> str:
    """Shell: start the sampling loop in the background writing to `out`; prints its pid.

    Exit 127 when the node has no nvidia-smi. Line-buffered (stdbuf) where available, so a
    stopped loop leaves every finished line in the file. The loop ends by itself after `max_s`
    (coreutils `timeout`, where available): a loop whose Snakemake was killed before it could
    stop it does not sample, and grow its file, forever."""
    q = shlex.quote(out)
    return (
        "command -v nvidia-smi >/dev/null 2>&1 || exit 127; "
        f"{node_dir_prep(out)} && "
        "buf=; command -v stdbuf >/dev/null 2>&1 && buf='stdbuf -oL'; "
        f"lim=; command -v timeout >/dev/null 2>&1 && lim='timeout {max_s}'; "
        f"TZ=UTC nohup $buf $lim nvidia-smi --query-gpu={','.join(SAMPLE_FIELDS)} "
        f"--format=csv,noheader,nounits --loop-ms={interval_ms} >{q} 2>{q}.err </dev/null & "
        "echo $!"
    )


def stop_command(*, pid: int, out: str) -> str:
    """Shell: stop the loop `pid` (only if it still is an nvidia-smi loop), print its file,
    remove it."""
    q = shlex.quote(out)
    return (
        f"if tr '\\0' ' ' </proc/{pid}/cmdline 2>/dev/null | grep -q 'nvidia-smi.*--loop-ms='; "
        f"then kill {pid}; fi; sleep 0.1; cat {q}; rm -f {q} {q}.err; "
        f'rmdir "$(dirname {q})" 2>/dev/null; true'
    )


def parse_loop_output(text: str, *, node: str) -> list[dict[str, Any]]:
    """Sample rows of one node's loop output; an unfinished last line (the loop was stopped
    while writing it) is left out. ValueError for any other line that is not a sample (e.g.
    a timestamp nvidia-smi would not print)."""
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines = lines[:-1]
    meta = {"node": node, "phase": PHASE_SAMPLE, "status": STATUS_OK, "detail": ""}
    gpus = telemetry.parse_noheader("".join(lines), fields=SAMPLE_FIELDS)
    for gpu in gpus:
        parse_timestamp(text_of(gpu.get("timestamp")))
    return [{**meta, **gpu} for gpu in gpus]


def _unavailable(node: str, detail: str) -> dict[str, Any]:
    return {
        "node": node,
        "phase": PHASE_SAMPLE,
        "status": STATUS_UNAVAILABLE,
        "detail": detail,
    }


class NvidiaSmiSampler:
    """nvidia-smi loops on every node, started before the client and stopped after it."""

    def __init__(
        self,
        *,
        transport: Transport,
        nodes: Sequence[str],
        interval_ms: int,
        remote_dir: str,
        max_s: int,
    ) -> None:
        self.transport = transport
        self.nodes = list(nodes)
        self.interval_ms = interval_ms
        self.max_s = max_s
        # Per sampler: a loop left running by a killed run never writes into this one's file.
        self.remote_dir = f"{remote_dir}/{uuid.uuid4().hex[:12]}"
        self.pids: dict[str, int] = {}
        self.rows: list[dict[str, Any]] = []
        self.raw: dict[str, str] = {}  # each node's loop output as nvidia-smi printed it

    def _out(self, node: str) -> str:
        return f"{self.remote_dir}/{node}.csv"

    def start(self) -> None:
        """Start every node's loop; a node without nvidia-smi says so once (one row)."""
        for node in self.nodes:
            command = loop_command(
                interval_ms=self.interval_ms, out=self._out(node), max_s=self.max_s
            )
            res = self.transport.run_background(node, command, timeout=STOP_TIMEOUT_S)
            pid = res.stdout.strip().splitlines()[-1] if res.stdout.strip() else ""
            if res.returncode in telemetry.NOT_FOUND_CODES:
                self.rows.append(_unavailable(node, f"nvidia-smi not found on node {node}"))
            elif not res.ok or not pid.isdigit():
                tail = " | ".join((res.stderr or res.stdout).strip().splitlines()[-2:])
                self.rows.append(
                    _unavailable(node, f"nvidia-smi loop did not start on node {node}: {tail}")
                )
            else:
                self.pids[node] = int(pid)

    def stop(self) -> list[dict[str, Any]]:
        """Stop the loops this sampler started (by pid) and return every row. Waits one
        interval (plus a margin) first, so that every node has a sample after the measured
        window ends and the window's edge can be interpolated (a short cell would otherwise
        end between a node's last sample and the next)."""
        time.sleep(self.interval_ms / 1000 * 1.5)
        for node, pid in self.pids.items():
            res = self.transport.run(
                node, stop_command(pid=pid, out=self._out(node)), timeout=STOP_TIMEOUT_S
            )
            self.raw[node] = res.stdout
            try:
                rows = parse_loop_output(res.stdout, node=node)
            except ValueError as exc:
                rows = [_unavailable(node, f"nvidia-smi samples of node {node} not parsed: {exc}")]
            if not rows:
                rows = [_unavailable(node, f"nvidia-smi gave no sample on node {node}")]
            self.rows.extend(rows)
        self.pids.clear()
        return self.rows


def sim_busy(requests: float) -> float:
    """The simulated busy fraction for `requests` held by the engine (0 idle, towards 1)."""
    return 1.0 - 0.5 ** max(0.0, requests)


class SimulatedSampler:
    """A power curve that follows the sim's load (its `/get_load`), marked simulated.

    It samples every `interval_s` of wall time from a thread in the cell's process. A node's
    GPUs follow the requests held by every URL of its `loads` (two for a GPU that prefill and
    decode share: one row set, the load of both)."""

    def __init__(
        self,
        *,
        loads: Mapping[str, str | Sequence[str] | None],
        gpus: Mapping[str, Sequence[int]],
        interval_s: float,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        # node -> the base URLs whose load its GPUs follow (its role's rank 0, and that of a
        # role sharing its GPUs; none: idle)
        self.loads = {
            node: (urls,) if isinstance(urls, str) else tuple(urls or ())
            for node, urls in loads.items()
        }
        self.headers = dict(headers or {})  # the server's API key (/get_load is behind it)
        every = {u for urls in self.loads.values() for u in urls}
        self.url = ", ".join(sorted(f"{u}/get_load" for u in every))
        self.nodes = list(loads)
        self.gpus = dict(gpus)  # node -> its GPU indices
        self.interval_s = max(SIM_MIN_INTERVAL_S, interval_s)
        self.rows: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="sim-gpu-sampler", daemon=True)
        self._error = ""

    def _held(self, base_url: str) -> float:
        request = urllib.request.Request(f"{base_url}/get_load", headers=self.headers)
        with urllib.request.urlopen(request, timeout=5) as resp:
            data = json.loads(resp.read())
        return float(sum(d.get("num_reqs", 0) for d in data))

    def sample(self) -> None:
        """Append one simulated line per GPU of every node."""
        held = {url: self._held(url) for url in {u for urls in self.loads.values() for u in urls}}
        stamp = format_timestamp(time.time())
        for node in self.nodes:
            busy = sim_busy(math.fsum(held[url] for url in self.loads[node]))
            for index in self.gpus[node]:
                self.rows.append(
                    {
                        "node": node,
                        "phase": PHASE_SAMPLE,
                        "status": STATUS_SIMULATED,
                        "detail": "simulated: follows the sim's /get_load, not measured",
                        "timestamp": stamp,
                        "index": float(index),
                        "power_draw_w": SIM_IDLE_W + (SIM_LOADED_W - SIM_IDLE_W) * busy,
                        "power_limit_w": SIM_LIMIT_W,
                        "utilization_gpu_pct": 100.0 * busy,
                    }
                )

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.sample()
            except (OSError, ValueError) as exc:
                self._error = f"simulated GPU curve stopped: {self.url}: {exc}"
                return
            self._stop.wait(self.interval_s)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> list[dict[str, Any]]:
        self._stop.set()
        self._thread.join(timeout=STOP_TIMEOUT_S)
        if self._error and not self.rows:
            return [_unavailable(node, self._error) for node in self.nodes]
        if self._error:
            log.warning("%s", self._error)
        return self.rows


def window_rows(start_s: float, end_s: float) -> list[dict[str, Any]]:
    """The two GPU-file rows that hold the client's measured window."""
    return [
        {"phase": PHASE_WINDOW_START, "timestamp": format_timestamp(start_s), "detail": ""},
        {"phase": PHASE_WINDOW_END, "timestamp": format_timestamp(end_s), "detail": ""},
    ]
