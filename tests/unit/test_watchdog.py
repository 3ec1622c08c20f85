"""Unit tests of watchdog: /health failing or flat counters stop the client, one line."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator

import pytest

from servesweep.core.errors import ServerStalled
from servesweep.serving.watchdog import Watchdog


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
