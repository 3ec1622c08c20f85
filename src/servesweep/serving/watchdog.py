"""Liveness during a cell: /health and the server's progress counters; a stall stops the client."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from servesweep.cluster import http, promtext
from servesweep.core.errors import ServerStalled

logger = logging.getLogger(__name__)

POLL_S = 1.0
HEALTH_TIMEOUT_S = 20.0  # SGLang's /health runs a 1-token generate (SGLANG_HEALTH_CHECK_TIMEOUT)
HEALTH_FAILURES = 2  # consecutive failed /health polls that abort
# SGLang's /health sends a probe request into the measured batch: poll it rarely.
HEALTH_EVERY_MAX_S = 30.0
# What moves while a server works, as SGLang 0.5.17 reports it (H200 rehearsal, /metrics read
# every 0.5 s): the per-request counters (prompt_tokens_total, generation_tokens_total,
# num_requests_total) move only when a request FINISHES, so a long prefill or decode shows
# none; the per-step counters (realtime_tokens_total by mode, cuda_graph_passes_total) and the
# KV gauges move every forward pass; num_running_reqs and num_queue_reqs say whether requests
# are in flight.
_FINISHED = ("generation_tokens_total", "prompt_tokens_total", "num_requests_total")
_STEPS = ("realtime_tokens_total", "cuda_graph_passes_total", "token_usage", "num_used_tokens")
_IN_FLIGHT = ("num_running_reqs", "num_queue_reqs")
_WATCHED = tuple(f"sglang:{name}" for name in _FINISHED + _STEPS + _IN_FLIGHT)


@dataclass(frozen=True)
class Progress:
    """One reading of the servers' progress signals."""

    finished: tuple[tuple[str, str], ...]  # per-request counters: move when a request ends
    steps: tuple[tuple[str, str], ...]  # per-step counters and KV gauges: every forward pass
    in_flight: float  # running + queued requests

    def moved_since(self, before: Progress) -> bool:
        """Progress: a request finished, or requests are in flight and a forward pass ran (a
        long prefill or decode). A server stepping only for its own /health probe, with our
        request stuck, does not count."""
        if self.finished != before.finished:
            return True
        return self.in_flight > 0 and self.steps != before.steps


def progress(urls: list[str], timeout: float = 5.0) -> Progress | None:
    """The servers' progress signals (`/metrics`, with --enable-metrics); None when no
    endpoint has them."""
    finished: list[tuple[str, str]] = []
    steps: list[tuple[str, str]] = []
    in_flight = 0.0
    for url in urls:
        text = http.text(f"{url}/metrics", timeout)
        for fam, key, value in promtext.values(promtext.parse(text), _WATCHED):
            name = fam.removeprefix("sglang:")
            if name in _IN_FLIGHT:
                in_flight += float(value)
            else:
                (finished if name in _FINISHED else steps).append((f"{url} {key[7:]}", value))
    if not finished and not steps:
        return None
    return Progress(tuple(finished), tuple(steps), in_flight)


class Watchdog:
    """Polls a server while a cell's client runs; on a stall calls `abort` (once) and keeps
    the reason, which `check` raises as ServerStalled."""

    def __init__(
        self,
        *,
        health_url: str,
        metric_urls: list[str],
        server: str,
        node: str,
        cell: str,
        window_s: float,
        abort: Callable[[], None],
        poll_s: float = POLL_S,
    ) -> None:
        self.health_url, self.metric_urls = health_url, metric_urls
        self.cell, self.where = cell, f"server {server} on node {node}"
        self.window_s, self.poll_s, self.abort = window_s, poll_s, abort
        self.reason: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="watchdog", daemon=True)

    def __enter__(self) -> Watchdog:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=HEALTH_TIMEOUT_S + 5)

    def _run(self) -> None:
        failures = 0
        last, since = progress(self.metric_urls), time.monotonic()
        health_every = min(HEALTH_EVERY_MAX_S, max(self.poll_s, self.window_s / 4))
        health_at = time.monotonic() + health_every
        while not self._stop.wait(self.poll_s):
            if time.monotonic() >= health_at:
                status = http.status(self.health_url, min(HEALTH_TIMEOUT_S, self.window_s))
                health_at = time.monotonic() + health_every
                if self._stop.is_set():
                    return
                failures = failures + 1 if status != 200 else 0
                if failures >= HEALTH_FAILURES:
                    why = f"/health failed ({status or 'no answer'}) {failures} times in a row"
                    self._stall(why)
                    return
            now = progress(self.metric_urls)
            if now is None or last is None or now.moved_since(last):
                last, since = now, time.monotonic()
            elif time.monotonic() - since >= self.window_s:
                self._stall(
                    f"no progress for {self.window_s:.0f}s (server counters and load gauges flat)"
                )
                return

    def _stall(self, why: str) -> None:
        self.reason = (
            f"{self.where} stalled: {why} during the client "
            f"(validation.stall_timeout_s {self.window_s:g}); the client was stopped"
        )
        logger.error("%s", self.reason)
        try:
            self.abort()
        except Exception:  # noqa: BLE001 - the reason is kept; the client times out anyway
            logger.exception("could not stop the client after a stall")

    def check(self) -> None:
        """ServerStalled if the watchdog fired."""
        if self.reason is not None:
            raise ServerStalled(self.reason, cell=self.cell)
