"""A cell is measured alone: no other client of ours, and an idle server, before its client."""

from __future__ import annotations

import contextlib
import json
import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from servesweep.cluster import http
from servesweep.cluster.runtime import Runtime
from servesweep.cluster.secrets import Secret
from servesweep.core.errors import ServerBusy
from servesweep.core.events import EventLog

IDLE_WAIT_S = 60.0
# The raw record's key: True when run_cell flushed the radix cache before the cell's client.
CACHE_FLUSHED_KEY = "servesweep_cache_flushed"
POLL_S = 0.2
_METRIC = re.compile(r"^sglang:(num_running_reqs|num_queue_reqs)(?:\{[^}]*\})?\s+(\S+)", re.M)
# Finished requests (SGLang counts each at its end, per is_streaming label; /health's probes
# are not counted: log_metrics=False, 0.5.9 and 0.5.23).
_REQUESTS = re.compile(r"^sglang:num_requests_total(?:\{[^}]*\})?\s+(\S+)", re.M)


@dataclass(frozen=True)
class ServerLoad:
    """Running and queued requests one server set reports, and where they were read."""

    running: int
    queued: int
    sources: list[str] = field(default_factory=list)  # e.g. "http://x:30000/v1/loads"

    @property
    def known(self) -> bool:
        return bool(self.sources)


@dataclass(frozen=True)
class Isolation:
    """The two checks made before a cell's client starts (recorded in its raw record)."""

    stale_clients_removed: list[str]
    running: int | None
    queued: int | None
    load_sources: list[str]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class RequestCount:
    """The server's own count of finished requests over a client's run vs what it sent."""

    client: int
    server: int | None  # None: no endpoint has the counter (no /metrics)
    sources: list[str] = field(default_factory=list)

    @property
    def difference(self) -> int | None:
        return None if self.server is None else self.server - self.client

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "difference": self.difference}


def request_counters(urls: list[str], *, key: Secret | None = None) -> dict[str, float]:
    """`sglang:num_requests_total` (summed over its labels) per endpoint that has it."""
    found = {}
    for url in urls:
        text = http.text(f"{url}/metrics", 5.0, key=key)
        values = _REQUESTS.findall(text or "")
        with contextlib.suppress(ValueError):
            if values:
                found[url] = sum(float(v) for v in values)
    return found


def compare_requests(
    *, before: dict[str, float], after: dict[str, float], sent: int
) -> RequestCount:
    """The client's `sent` requests vs the most any endpoint counted between the two readings
    (every role's rank 0 sees each request once)."""
    deltas = {url: int(after[url] - before[url]) for url in before if url in after}
    if not deltas:
        return RequestCount(client=sent, server=None)
    return RequestCount(
        client=sent, server=max(deltas.values()), sources=[f"{u}/metrics" for u in deltas]
    )


def endpoint_load(
    url: str, *, timeout: float = 5.0, key: Secret | None = None
) -> tuple[int, int, str] | None:
    """(running, queued, source) from SGLang's `/v1/loads` (newer versions; behind the API key)
    or `/metrics` (with --enable-metrics); None when the server exposes neither."""
    text = http.text(f"{url}/v1/loads", timeout, key=key)
    if text is not None:
        try:
            loads = json.loads(text)["loads"]
            running = sum(int(x.get("num_running_reqs", 0)) for x in loads)
            queued = sum(int(x.get("num_waiting_reqs", 0)) for x in loads)
            return running, queued, f"{url}/v1/loads"
        except (ValueError, KeyError, TypeError, AttributeError):
            pass
    text = http.text(f"{url}/metrics", timeout)
    if text is not None:
        found: dict[str, float] = {}
        for name, value in _METRIC.findall(text):
            try:
                found[name] = found.get(name, 0.0) + float(value)
            except ValueError:
                continue
        if found:
            return (
                int(found.get("num_running_reqs", 0)),
                int(found.get("num_queue_reqs", 0)),
                f"{url}/metrics",
            )
    return None


def server_load(urls: list[str], *, key: Secret | None = None) -> ServerLoad:
    """The summed load of every endpoint of a server set that reports one."""
    running = queued = 0
    sources = []
    for url in urls:
        got = endpoint_load(url, key=key)
        if got is not None:
            running, queued = running + got[0], queued + got[1]
            sources.append(got[2])
    return ServerLoad(running, queued, sources)


def remove_stale_clients(
    *, runtime: Runtime, events: EventLog, node: str, labels: dict[str, str], cell: str
) -> list[str]:
    """Remove clients with `labels` (this owner's, of this run) still running on `node`: cells
    hold the server lock one at a time, so such a client outlived its killed job (SIGKILL) and
    would load the server."""
    handles = runtime.find(node, labels)
    for handle in handles:
        events.emit(
            "stale", node=node, handle=handle, run=labels.get("run"), role="client", cell=cell
        )
        runtime.stop(node, handle)
    return handles


def stop_clients(*, runtime: Runtime, node: str, labels: dict[str, str]) -> None:
    """Stop the clients with `labels` on `node` (the watchdog aborting a stalled cell)."""
    for handle in runtime.find(node, labels):
        runtime.stop(node, handle)


def wait_idle(
    *,
    urls: list[str],
    server: str,
    node: str,
    cell: str,
    wait_s: float = IDLE_WAIT_S,
    key: Secret | None = None,
) -> ServerLoad:
    """Wait until the server reports no running or queued request (aborted requests of a removed
    client drain within moments); ServerBusy after `wait_s`. Unknown load passes, recorded."""
    deadline = time.monotonic() + wait_s
    while True:
        load = server_load(urls, key=key)
        if not load.known or (load.running == 0 and load.queued == 0):
            return load
        if time.monotonic() >= deadline:
            raise ServerBusy(
                f"server {server} on node {node} still reports {load.running} "
                f"running and {load.queued} queued request(s) after {wait_s:.0f}s before the "
                f"client starts ({', '.join(load.sources)}); another client is using it",
                cell=cell,
            )
        time.sleep(POLL_S)


def flush_cache(
    *,
    urls: list[str],
    server: str,
    cell: str,
    key: Secret | None = None,
    wait_s: float = IDLE_WAIT_S,
) -> None:
    """POST SGLang's `/flush_cache` on each engine endpoint (http_server.py: GET or POST; 200
    when flushed, 400 while requests run or wait; 401 without the server's `--api-key`),
    retrying until `wait_s`; ServerBusy after."""
    for url in urls:
        deadline = time.monotonic() + wait_s
        while True:
            status, _ = http.request(f"{url}/flush_cache", timeout=30.0, method="POST", key=key)
            if status == 200:
                break
            if time.monotonic() >= deadline:
                raise ServerBusy(
                    f"server {server} did not flush its radix cache at {url} within "
                    f"{wait_s:.0f}s (last status {status}); the cell would reuse cached prefixes",
                    cell=cell,
                )
            time.sleep(POLL_S)
