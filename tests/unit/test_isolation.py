"""Unit tests of isolation: the server's load from /v1/loads or /metrics, ServerBusy."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator

import pytest

from servesweep.core.errors import ServerBusy
from servesweep.measure import isolation


class _Handler(http.server.BaseHTTPRequestHandler):
    pages: dict[str, str] = {}

    def do_GET(self) -> None:  # noqa: N802
        body = self.pages.get(self.path)
        self.send_response(404 if body is None else 200)
        self.end_headers()
        self.wfile.write((body or "Not Found").encode())

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def server() -> Iterator[tuple[str, dict[str, str]]]:
    pages: dict[str, str] = {}
    handler = type("H", (_Handler,), {"pages": pages})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", pages
    httpd.shutdown()


def _loads(running: int, waiting: int) -> str:
    load = {"dp_rank": 0, "num_running_reqs": running, "num_waiting_reqs": waiting}
    return json.dumps({"loads": [load, {**load, "dp_rank": 1}]})


def test_loads_endpoint_sums_dp_ranks(server: tuple[str, dict[str, str]]) -> None:
    url, pages = server
    pages["/v1/loads"] = _loads(1, 2)
    assert isolation.endpoint_load(url) == (2, 4, f"{url}/v1/loads")


def test_metrics_when_no_loads_endpoint(server: tuple[str, dict[str, str]]) -> None:
    url, pages = server
    pages["/metrics"] = (
        "# TYPE sglang:num_running_reqs gauge\n"
        'sglang:num_running_reqs{model_name="m"} 3.0\n'
        'sglang:num_queue_reqs{model_name="m"} 0.0\n'
    )
    assert isolation.endpoint_load(url) == (3, 0, f"{url}/metrics")


def test_unknown_load_passes_and_says_so(server: tuple[str, dict[str, str]]) -> None:
    url, _ = server
    load = isolation.wait_idle(urls=[url], server="s", node="n", cell="c", wait_s=0)
    assert not load.known


def test_busy_server_fails_with_one_line(server: tuple[str, dict[str, str]]) -> None:
    url, pages = server
    pages["/v1/loads"] = _loads(0, 1)
    with pytest.raises(ServerBusy) as info:
        isolation.wait_idle(urls=[url], server="srv", node="node7", cell="srv/c/r1", wait_s=0)
    text = str(info.value)
    assert "\n" not in text
    assert text.startswith("cell srv/c/r1: server srv on node node7")
    assert "2 queued" in text


def test_request_count_compares_the_busiest_rank0_with_what_was_sent() -> None:
    count = isolation.compare_requests(
        before={"http://p": 10.0, "http://d": 3.0},
        after={"http://p": 16.0, "http://d": 9.0},
        sent=5,
    )
    assert (count.client, count.server, count.difference) == (5, 6, 1)
    assert count.sources == ["http://p/metrics", "http://d/metrics"]
    unknown = isolation.compare_requests(before={}, after={"http://p": 1.0}, sent=5)
    assert unknown.server is None and unknown.to_dict()["difference"] is None
