"""Mini-LB router: CLI, bootstrap fields, and a real router process over recording backends."""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from servesweep.sim.router import MiniLB, RouterArgsError, batch_size, build_parser, parse_args
from tests.support.simprocess import ROUTER_READY_LINE, SimProcess, start_router


@dataclass
class Backend:
    """A stand-in prefill or decode server on a real loopback port that records requests."""

    name: str
    seen: list[tuple[str, str, Any]] = field(default_factory=list)
    url: str = ""

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json() if request.can_read_body else None
        self.seen.append((request.method, request.path, body))
        if request.path == "/get_server_info":
            return web.json_response(
                {"role": self.name, "internal_states": [{"last_gen_throughput": 7.0}]}
            )
        if request.path in ("/v1/models", "/get_model_info"):
            return web.json_response({"from": self.name})
        if request.path in ("/generate", "/v1/completions") and body and body.get("stream"):
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for k in range(3):
                await resp.write(f'data: {{"who": "{self.name}", "k": {k}}}\n\n'.encode())
            await resp.write(b"data: [DONE]\n\n")
            return resp
        if request.path in ("/generate", "/v1/completions"):
            return web.json_response({"who": self.name, "echo": body}, status=200)
        return web.Response(status=200)


class Backends:
    """Several Backend apps served by one event loop in a background thread."""

    def __init__(self, names: list[str]) -> None:
        self.backends = {n: Backend(n) for n in names}
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.runners: list[web.AppRunner] = []

    def __enter__(self) -> Backends:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(30)
        return self

    async def _start(self) -> None:
        for backend in self.backends.values():
            runner = web.AppRunner(backend.app(), access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            backend.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
            self.runners.append(runner)

    async def _stop(self) -> None:
        for runner in self.runners:
            await runner.cleanup()

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    def __getitem__(self, name: str) -> Backend:
        return self.backends[name]


def http(method: str, url: str, body: Any = None) -> tuple[int, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


@dataclass
class Setup:
    router: SimProcess
    backends: Backends


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    with Backends(["p1", "p2", "d1"]) as backends:
        argv = [
            "--pd-disaggregation", "--mini-lb",
            "--prefill", backends["p1"].url, "9001",
            "--prefill", backends["p2"].url,
            "--decode", backends["d1"].url,
            "--host", "127.0.0.1", "--port", "0", "--policy", "cache_aware",
        ]  # fmt: skip
        log = tmp_path_factory.mktemp("router") / "router.log"
        with start_router(argv=argv, log_path=log) as router:
            router.wait_for_line(ROUTER_READY_LINE)
            yield Setup(router=router, backends=backends)


def generate_bodies(backends: Backends, name: str) -> list[dict[str, Any]]:
    return [b for m, p, b in backends[name].seen if p == "/generate"]


def test_generate_sends_the_same_body_plus_bootstrap_fields_to_p_and_d(setup: Setup) -> None:
    b = setup.backends
    request = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2}, "x": "y"}
    for _ in range(24):
        status, raw = http("POST", setup.router.url + "/generate", request)
        assert status == 200
        assert json.loads(raw)["who"] == "d1"  # the decode server's answer
    decoded = generate_bodies(b, "d1")
    sent_to_p = generate_bodies(b, "p1") + generate_bodies(b, "p2")
    assert len(decoded) == len(sent_to_p) == 24
    assert generate_bodies(b, "p1") and generate_bodies(b, "p2")  # random over both
    assert sorted(d["bootstrap_room"] for d in decoded) == sorted(
        p["bootstrap_room"] for p in sent_to_p
    )
    for body in decoded:
        assert {k: body[k] for k in request} == request
        assert body["bootstrap_host"] == "127.0.0.1"
        assert 0 <= body["bootstrap_room"] < 2**63
    assert {p["bootstrap_port"] for p in generate_bodies(b, "p1")} == {9001}
    assert {p["bootstrap_port"] for p in generate_bodies(b, "p2")} == {None}


def test_stream_passes_the_decode_servers_events_through(setup: Setup) -> None:
    status, raw = http("POST", setup.router.url + "/generate", {"text": "hi", "stream": True})
    assert status == 200
    assert (
        raw
        == b"".join(f'data: {{"who": "d1", "k": {k}}}\n\n'.encode() for k in range(3))
        + b"data: [DONE]\n\n"
    )
    status, raw = http("POST", setup.router.url + "/v1/completions", {"prompt": "a"})
    assert status == 200 and json.loads(raw)["echo"]["bootstrap_host"] == "127.0.0.1"


def test_there_is_no_server_info_or_metrics_like_the_real_mini_lb(setup: Setup) -> None:
    # sglang-router 0.3.2's mini-LB answered 404 to both (one H100, 2026-12-07), FastAPI's body
    for path in ("/server_info", "/metrics"):
        status, raw = http("GET", setup.router.url + path)
        assert (status, json.loads(raw)) == (404, {"detail": "Not Found"}), path
    assert http("GET", setup.router.url + "/health")[0] == 200
    status, raw = http("GET", setup.router.url + "/generate")  # a POST route
    assert (status, json.loads(raw)) == (405, {"detail": "Method Not Allowed"})
    assert not [m for m, p, _ in setup.backends["d1"].seen if p in ("/server_info", "/metrics")]


def test_get_server_info_collects_both_roles(setup: Setup) -> None:
    status, raw = http("GET", setup.router.url + "/get_server_info")
    assert status == 200
    info = json.loads(raw)
    assert [p["role"] for p in info["prefill"]] == ["p1", "p2"]
    assert [d["role"] for d in info["decode"]] == ["d1"]
    assert info["internal_states"] == [{"last_gen_throughput": 7.0}]


def test_model_endpoints_come_from_the_first_prefill(setup: Setup) -> None:
    for path in ("/v1/models", "/model_info", "/get_model_info"):
        status, raw = http("GET", setup.router.url + path)
        assert status == 200 and json.loads(raw) == {"from": "p1"}


def test_flush_cache_and_health_generate_fan_out(setup: Setup) -> None:
    b = setup.backends
    assert http("POST", setup.router.url + "/flush_cache")[0] == 200
    assert http("GET", setup.router.url + "/health_generate")[0] == 200
    for name in ("p1", "p2", "d1"):
        paths = [(m, p) for m, p, _ in b[name].seen]
        assert ("POST", "/flush_cache") in paths and ("GET", "/health_generate") in paths


def test_router_logs_like_the_mini_lb(setup: Setup) -> None:
    log = setup.router.log()
    assert "MiniLB is only for debugging purposes, it only supports random policy!" in log
    assert "[MiniLB] Overriding policy to random" in log
    assert setup.router.url.startswith("http://127.0.0.1:")


def test_prefill_takes_an_optional_bootstrap_port() -> None:
    args = parse_args(
        ["--pd-disaggregation", "--prefill", "http://a:1", "8998", "--prefill", "http://b:2",
         "--prefill", "http://c:3", "none", "--decode", "http://d:4", "--decode", "http://e:5"]
    )  # fmt: skip
    assert args.prefill == (("http://a:1", 8998), ("http://b:2", None), ("http://c:3", None))
    assert args.decode == ("http://d:4", "http://e:5")
    assert (args.host, args.port, args.policy) == ("127.0.0.1", 30000, "cache_aware")


@pytest.mark.parametrize(
    "argv",
    [
        ["--prefill", "http://a:1", "--decode", "http://d:4"],  # no --pd-disaggregation
        ["--pd-disaggregation", "--decode", "http://d:4"],  # no prefill
        ["--pd-disaggregation", "--prefill", "http://a:1", "x", "--decode", "http://d:4"],
        ["--pd-disaggregation", "--prefill", "u", "1", "2", "--decode", "http://d:4"],
    ],
)
def test_bad_pd_arguments_raise(argv: list[str]) -> None:
    with pytest.raises(RouterArgsError):
        parse_args(argv)


def test_cli_exits_1_without_pd_and_2_on_argparse_errors() -> None:
    cmd = [sys.executable, "-m", "servesweep.sim.router", "--mini-lb"]
    res = subprocess.run(
        [*cmd, "--prefill", "http://a:1", "--decode", "http://d:2"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert res.returncode == 1
    assert "MiniLB only supports PD disaggregation mode" in res.stdout
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["--policy", "nope"])
    assert exc.value.code == 2


def test_bootstrap_host_is_the_prefill_hostname_and_batches_get_lists() -> None:
    lb = MiniLB(parse_args(["--pd-disaggregation", "--prefill", "http://[::1]:5", "--decode",
                            "http://d:1"]), rng=random.Random(1))  # fmt: skip
    one = lb.with_bootstrap({"text": "a"}, prefill_url="http://[::1]:5", bootstrap_port=None)
    assert one["bootstrap_host"] == "[::1]" and one["bootstrap_port"] is None
    many = lb.with_bootstrap({"text": ["a", "b"]}, prefill_url="http://h:5", bootstrap_port=7)
    assert many["bootstrap_host"] == ["h", "h"] and many["bootstrap_port"] == [7, 7]
    assert len(set(many["bootstrap_room"])) == 2
    assert batch_size({"input_ids": [[1], [2], [3]]}) == 3
    assert batch_size({"input_ids": [1, 2]}) is None


def test_router_refuses_a_taken_port(setup: Setup, tmp_path: Path) -> None:
    port = setup.router.url.rsplit(":", 1)[1]
    argv = ["--pd-disaggregation", "--mini-lb", "--prefill", "http://a:1", "--decode",
            "http://d:2", "--port", port]  # fmt: skip
    with start_router(argv=argv, log_path=tmp_path / "r.log") as second:
        assert second.wait_exit() == 1
        assert "error while attempting to bind" in second.log()


def test_a_router_without_workers_answers_503_and_its_log_is_fatal(tmp_path: Path) -> None:
    # issue 28: a router whose every worker circuit opened (sglang-router's Rust error line)
    from servesweep.measure import checks

    with Backends(["p1", "d1"]) as backends:
        argv = [
            "--pd-disaggregation", "--mini-lb",
            "--prefill", backends["p1"].url, "--decode", backends["d1"].url,
            "--host", "127.0.0.1", "--port", "0", "--sim-no-workers-after", "1",
        ]  # fmt: skip
        log = tmp_path / "router.log"
        with start_router(argv=argv, log_path=log) as router:
            router.wait_for_line(ROUTER_READY_LINE)
            body = {"input_ids": [1, 2], "sampling_params": {"max_new_tokens": 2}}
            assert http("POST", router.url + "/generate", body)[0] == 200
            status, raw = http("POST", router.url + "/generate", body)
            assert status == 503 and b"No available workers" in raw
            router.wait_for_line("ERROR sglang_router_rs")
    # while it runs, its log end is no silence; read as a finished log, it is fatal
    from servesweep.serving import logscan

    assert logscan.fatal_findings(log.read_text(), complete=False) == []
    line = checks.check_file(log, kind="log")[0]
    assert line.verdict == "fatal" and "native_error" in line.text
