"""Liveness during a cell: /health and the server's progress counters; a stall stops the client."""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable

from servesweep.cluster import http
from servesweep.core.errors import ServerStalled

logger = logging.getLogger(__name__)

POLL_S = 1.0
HEALTH_TIMEOUT_S = 20.0  # SGLang's /health runs a 1-token generate (SGLANG_HEALTH_CHECK_TIMEOUT)
HEALTH_FAILURES = 2  # consecutive failed /health polls that abort
# SGLang's /health sends a probe request into the measured batch: poll it rarely.
HEALTH_EVERY_MAX_S = 30.0
_COUNTER = re.compile(
    r"^sglang:(generation_tokens_total|prompt_tokens_total|num_requests_total)"
    r"(?:\{[^}]*\})?\s+(\S+)",
    re.M,
)


def progress(urls: list[str], timeout: float = 5.0) -> tuple[float, ...] | None:
    """The servers' token and request counters (`/metrics`, with --enable-metrics); None when
    no endpoint has them."""
    values: list[float] = []
    for url in urls:
        text = http.text(f"{url}/metrics", timeout)
        if text is not None:
            values += [float(v) for _, v in _COUNTER.findall(text)]
    return tuple(values) or None


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
        self.where = f"cell {cell}: server {server} on node {node}"
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
            if now is None or now != last:
                last, since = now, time.monotonic()
            elif time.monotonic() - since >= self.window_s:
                self._stall(f"no progress for {self.window_s:.0f}s (server counters flat)")
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
            raise ServerStalled(self.reason)
