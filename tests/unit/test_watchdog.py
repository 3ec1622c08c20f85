"""Unit tests of watchdog: /health failing or flat counters stop the client, one line."""

from __future__ import annotations

import contextlib
import http.server
import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from servesweep.core.errors import ServerStalled
from servesweep.serving.watchdog import Watchdog
from tests.support.simprocess import start_sim


class _Handler(http.server.BaseHTTPRequestHandler):
    pages: dict[str, tuple[int, str]] = {}

    def do_GET(self) -> None:  # noqa: N802
        status, body = self.pages.get(self.path, (404, ""))
        self.send_response(status)
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def server() -> Iterator[tuple[str, dict[str, tuple[int, str]]]]:
    pages: dict[str, tuple[int, str]] = {}
    httpd = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), type("H", (_Handler,), {"pages": pages})
    )
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", pages
    httpd.shutdown()


def _watch(url: str, aborted: list[str], window_s: float) -> Watchdog:
    return Watchdog(
        health_url=f"{url}/health",
        metric_urls=[url],
        server="srv",
        node="node3",
        cell="srv/c/r1",
        window_s=window_s,
        abort=lambda: aborted.append("client stopped"),
        poll_s=0.05,
    )


def _wait(dog: Watchdog) -> None:
    end = time.monotonic() + 10
    while dog.reason is None and time.monotonic() < end:
        time.sleep(0.02)


def test_health_failing_aborts(server: tuple[str, dict[str, tuple[int, str]]]) -> None:
    url, pages = server
    pages["/health"] = (503, "")
    aborted: list[str] = []
    with _watch(url, aborted, window_s=0.2) as dog:
        _wait(dog)
    assert aborted == ["client stopped"]
    with pytest.raises(ServerStalled) as info:
        dog.check()
    assert str(info.value).startswith("cell srv/c/r1: server srv on node node3 stalled: /health")


def test_flat_counters_abort_moving_ones_do_not(
    server: tuple[str, dict[str, tuple[int, str]]],
) -> None:
    url, pages = server
    pages["/health"] = (200, "")
    pages["/metrics"] = (200, 'sglang:generation_tokens_total{model_name="m"} 5.0\n')
    aborted: list[str] = []
    with _watch(url, aborted, window_s=0.3) as dog:
        _wait(dog)
    assert "no progress" in (dog.reason or "") and aborted
    pages["/metrics"] = (200, "")  # no counters: only /health is watched
    aborted.clear()
    with _watch(url, aborted, window_s=0.3) as dog:
        time.sleep(0.6)
    dog.check()
    assert not aborted


def _generate(url: str, *, input_len: int, output_len: int, timeout: float) -> None:
    body = {
        "input_ids": list(range(input_len)),
        "sampling_params": {"max_new_tokens": output_len, "ignore_eos": True},
    }
    request = urllib.request.Request(
        f"{url}/generate", data=json.dumps(body).encode(), method="POST"
    )
    with contextlib.suppress(OSError), urllib.request.urlopen(request, timeout=timeout) as resp:
        resp.read()


def test_a_request_longer_than_the_window_passes_while_the_sim_works_a_frozen_one_stops(
    tmp_path: Path,
) -> None:
    # Real SGLang (0.5.17, H200 rehearsal) moves its request counters only when a request
    # finishes; the sim does the same, so only per-step counters and gauges show progress.
    argv = ["--model-path", "sim/Kimi", "--port", "0", "--tp-size", "8", "--ep-size", "8"]
    argv += ["--chunked-prefill-size", "2048", "--enable-metrics", "--sim-clean"]
    argv += ["--sim-time-scale", "0.2", "--sim-startup-s", "0", "--sim-hang-at", "1"]
    with start_sim(argv=argv, log_path=tmp_path / "sim.log") as sim:
        sim.wait_ready()
        url = sim.url
        finished = progress_counter(url)
        long_one = threading.Thread(
            target=_generate,
            kwargs={"url": url, "input_len": 16384, "output_len": 30, "timeout": 60},
        )
        aborted: list[str] = []
        started = time.monotonic()
        with _watch(url, aborted, window_s=1.5) as dog:
            long_one.start()
            time.sleep(1.6)
            assert progress_counter(url) == finished  # nothing finished yet, yet no stall
            long_one.join()
        took = time.monotonic() - started
        dog.check()
        assert not aborted and took > 2 * 1.5, took
        hung = threading.Thread(
            target=_generate,
            kwargs={"url": url, "input_len": 64, "output_len": 4, "timeout": 8},
            daemon=True,
        )
        hung.start()
        with _watch(url, aborted, window_s=1.5) as dog:
            _wait(dog)
        assert aborted == ["client stopped"]
        assert "no progress for 2s" in (dog.reason or "")


def progress_counter(url: str) -> str:
    """The sim's `sglang:num_requests_total` line (moves when a request finishes)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return next(line for line in text.splitlines() if line.startswith("sglang:num_requests_total"))
