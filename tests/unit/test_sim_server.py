"""The simulator as a real subprocess over real HTTP: API shapes, stream format, lifecycle."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from servesweep.measure import isolation
from servesweep.serving import logscan
from servesweep.serving.engines import API_KEY_ENV, KEYED_LAUNCH
from tests.support.simprocess import SimProcess, free_port, start_sim

FAST = ["--sim-time-scale", "0.001", "--sim-startup-s", "1"]
REQUIRED_SERVER_INFO = [
    "model_path", "served_model_name", "tokenizer_path", "host", "port", "tp_size", "ep_size",
    "dp_size", "pp_size", "nnodes", "node_rank", "dist_init_addr", "moe_runner_backend",
    "chunked_prefill_size", "page_size", "kv_cache_dtype", "disable_radix_cache",
    "mem_fraction_static", "max_running_requests", "trust_remote_code", "log_level",
    "enable_metrics", "disaggregation_mode", "disaggregation_bootstrap_port",
    "disaggregation_ib_device", "disaggregation_transfer_backend", "skip_server_warmup",
    "watchdog_timeout", "launch_command", "max_total_num_tokens", "internal_states", "version",
]  # fmt: skip


def http(
    method: str, url: str, body: dict[str, Any] | None = None, timeout: float = 30
) -> tuple[int, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def bench_parse(lines: Iterator[bytes]) -> dict[str, Any]:
    """SGLang bench_serving's async_request_sglang_generate parsing (SGLANG.md 1.4)."""
    generated, output_len, last_len, ttft, chunks, itl_counts = "", 0, 0, None, 0, []
    done_seen_last = False
    for raw in lines:
        line = raw.strip()
        if not line:
            continue
        chunk = line.decode().removeprefix("data: ")
        done_seen_last = chunk == "[DONE]"
        if chunk == "[DONE]":
            continue
        data = json.loads(chunk)
        if "text" in data and data["text"]:
            chunks += 1
            generated = data["text"]
            output_len = data["meta_info"]["completion_tokens"]  # KeyError = failed request
            if ttft is None:
                ttft = chunks
            else:
                new = output_len - last_len
                if new == 0:
                    continue
                itl_counts.append(new)
            last_len = output_len
    return {
        "generated_text": generated,
        "output_len": output_len,
        "ttft_seen": ttft is not None,
        "itl_tokens": sum(itl_counts),
        "done_last": done_seen_last,
    }


def stream_lines(url: str, body: dict[str, Any]) -> list[bytes]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    with urllib.request.urlopen(request, timeout=30) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        return list(resp)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimProcess]:
    log = tmp_path_factory.mktemp("sim") / "server.log"
    argv = [
        "--model-path",
        "sim/Kimi",
        "--served-model-name",
        "kimi",
        "--port",
        "0",
        "--tp-size",
        "8",
        "--ep-size",
        "8",
        "--chunked-prefill-size",
        "8192",
        "--page-size",
        "64",
        "--moe-runner-backend",
        "flashinfer_mxfp4",
        "--disable-radix-cache",
        "--enable-metrics",
        *FAST,
    ]
    with start_sim(argv=argv, log_path=log) as proc:
        proc.wait_ready()
        yield proc


def test_log_milestones_in_sglang_order(server: SimProcess) -> None:
    log = server.log()
    marks = [
        "server_args=ServerArgs(",
        "Load weight begin.",
        "Load weight end.",
        "KV Cache is allocated.",
        "Uvicorn running on http://127.0.0.1:",
        "The server is fired up and ready to roll!",
    ]
    positions = [log.index(m) for m in marks]
    assert positions == sorted(positions)
    first = log.splitlines()[0]
    assert first[0] == "[" and first[20:22] == "] " and first[5] == "-" and first[14] == ":"


def test_stream_is_parsed_like_bench_serving(server: SimProcess) -> None:
    body = {
        "input_ids": list(range(300)),
        "stream": True,
        "sampling_params": {"temperature": 0.0, "max_new_tokens": 16, "ignore_eos": True},
        "lora_path": None,
        "return_logprob": False,
        "logprob_start_len": -1,
    }
    lines = stream_lines(server.url + "/generate", body)
    parsed = bench_parse(iter(lines))
    assert parsed["output_len"] == 16 and parsed["ttft_seen"] and parsed["done_last"]
    assert parsed["itl_tokens"] == 15
    # one word per token, but the noisy sim's suffix pieces merge (re-tokenization drift)
    assert 14 <= len(parsed["generated_text"].split()) <= 16
    events = [json.loads(x[6:]) for x in lines if x.strip() and x != b"data: [DONE]\n"]
    nonblank = [x for x in lines if x.strip()]
    assert all(x.startswith(b"data: ") for x in nonblank) and nonblank[-1] == b"data: [DONE]\n"
    assert b"".join(lines).endswith(b"data: [DONE]\n\n")
    counts = [e["meta_info"]["completion_tokens"] for e in events]
    assert counts == sorted(counts) and len(set(counts)) == len(counts) and counts[-1] == 16
    for e in events:
        meta = e["meta_info"]
        assert len(e["output_ids"]) == meta["completion_tokens"]
        assert all(0 <= i < 1000 for i in e["output_ids"])
        assert meta["prompt_tokens"] == 300 and meta["cached_tokens"] == 0
    assert all(e["meta_info"]["finish_reason"] is None for e in events[:-1])
    assert "e2e_latency" not in events[0]["meta_info"]
    last = events[-1]["meta_info"]
    assert last["finish_reason"] == {"type": "length", "length": 16}
    assert last["e2e_latency"] > 0
    assert events[-1]["text"].startswith(events[0]["text"])  # cumulative


def test_non_streamed_generate_returns_one_object(server: SimProcess) -> None:
    status, raw = http(
        "POST",
        server.url + "/generate",
        {"text": "a b c d e f g h", "sampling_params": {"max_new_tokens": 5}},
    )
    assert status == 200
    out = json.loads(raw)
    assert out["meta_info"]["completion_tokens"] == 5 == len(out["output_ids"])
    assert out["meta_info"]["prompt_tokens"] == 4  # 15 characters / 4, rounded up
    assert out["meta_info"]["finish_reason"]["type"] == "length"
    status, raw = http("POST", server.url + "/generate", {"input_ids": [1, 2]})
    assert json.loads(raw)["meta_info"]["completion_tokens"] == 128  # SGLang's default


def test_completions_stream_and_whole(server: SimProcess) -> None:
    status, raw = http(
        "POST",
        server.url + "/v1/completions",
        {"model": "kimi", "prompt": [5] * 40, "max_tokens": 7},
    )
    out = json.loads(raw)
    assert status == 200 and out["object"] == "text_completion" and out["model"] == "kimi"
    assert out["usage"] == {"prompt_tokens": 40, "completion_tokens": 7, "total_tokens": 47}
    assert out["choices"][0]["finish_reason"] == "length"
    assert 6 <= len(out["choices"][0]["text"].split()) <= 7
    body = {
        "prompt": "hello there",
        "max_tokens": 6,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    lines = [x for x in stream_lines(server.url + "/v1/completions", body) if x.strip()]
    assert lines[-1].strip() == b"data: [DONE]"
    events = [json.loads(x[6:]) for x in lines[:-1]]
    text = "".join(c["text"] for e in events for c in e["choices"])
    assert 5 <= len(text.split()) <= 6
    assert events[-2]["choices"][0]["finish_reason"] == "length"
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 6


def test_info_endpoints(server: SimProcess) -> None:
    status, raw = http("GET", server.url + "/v1/models")
    models = json.loads(raw)
    assert status == 200 and models["data"][0]["id"] == "kimi"
    for path in ("/model_info", "/get_model_info"):
        info = json.loads(http("GET", server.url + path)[1])
        assert info["model_path"] == "sim/Kimi" and info["tokenizer_path"] == "sim/Kimi"
        assert info["is_generation"] is True
    for path in ("/server_info", "/get_server_info"):
        info = json.loads(http("GET", server.url + path)[1])
        missing = [k for k in REQUIRED_SERVER_INFO if k not in info]
        assert not missing
        assert info["version"] == "0.5.23-sim"
        assert info["moe_runner_backend"] == "flashinfer_mxfp4" and info["tp_size"] == 8
        assert info["chunked_prefill_size"] == 8192 and info["page_size"] == 64
        assert info["port"] == int(server.url.rsplit(":", 1)[1])
        assert "servesweep.sim" in info["launch_command"]
        assert "--moe-runner-backend flashinfer_mxfp4" in info["launch_command"]
        assert info["max_total_num_tokens"] > 0
        assert set(info["internal_states"][0]) >= {"last_gen_throughput", "avg_spec_accept_length"}


def test_metrics_are_prometheus_text(server: SimProcess) -> None:
    status, raw = http("GET", server.url + "/metrics")
    text = raw.decode()
    assert status == 200
    for name in ("sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:gen_throughput"):
        assert f"# TYPE {name} gauge" in text
        assert f'{name}{{model_name="kimi"}} ' in text


def test_flush_cache_is_refused_while_busy(server: SimProcess) -> None:
    body = {"input_ids": [1] * 100, "stream": True, "sampling_params": {"max_new_tokens": 50000}}
    request = urllib.request.Request(
        server.url + "/generate", data=json.dumps(body).encode(), method="POST"
    )
    with urllib.request.urlopen(request, timeout=30) as resp:
        assert resp.readline().startswith(b"data: ")
        assert http("POST", server.url + "/flush_cache")[0] == 400
        assert http("GET", server.url + "/flush_cache")[0] == 400
    for _ in range(200):  # client gone -> request aborted -> idle
        if http("POST", server.url + "/flush_cache")[0] == 200:
            break
        time.sleep(0.05)
    status, raw = http("GET", server.url + "/flush_cache")
    assert status == 200 and raw.startswith(b"Cache flushed")
    assert "the client disconnected" in server.log()
    # like SGLang: a benign traceback (a warning of the log scan, never fatal)
    assert "Task exception was never retrieved" in server.log()
    assert logscan.fatal_findings(server.log()) == []
    assert "client_disconnected" in logscan.warning_counts(logscan.scan_text(server.log()))


def test_bad_requests_get_400(server: SimProcess) -> None:
    assert http("POST", server.url + "/generate", {"sampling_params": {}})[0] == 400
    too_long = {"input_ids": [1] * 10, "sampling_params": {"max_new_tokens": 10_000_000}}
    status, raw = http("POST", server.url + "/generate", too_long)
    assert status == 400 and "context length" in json.loads(raw)["error"]["message"]
    status, raw = http("POST", server.url + "/v1/completions", {"max_tokens": 3})
    assert status == 400 and json.loads(raw)["object"] == "error"


def test_concurrent_requests_all_complete(server: SimProcess) -> None:
    def one(i: int) -> dict[str, Any]:
        body = {
            "input_ids": [i] * (500 + i),
            "stream": True,
            "sampling_params": {"max_new_tokens": 20 + i, "ignore_eos": True},
        }
        return bench_parse(iter(stream_lines(server.url + "/generate", body)))

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(one, range(8)))
    assert [r["output_len"] for r in results] == [20 + i for i in range(8)]


def test_health_is_503_until_ready_then_200_and_sigterm_exits_0(tmp_path: Path) -> None:
    port = free_port()
    argv = [
        "--model",
        "m",
        "--port",
        str(port),
        "--sim-time-scale",
        "1",
        "--sim-startup-s",
        "1.5",
        "--skip-server-warmup",
    ]
    with start_sim(argv=argv, log_path=tmp_path / "s.log") as proc:
        proc.wait_for_line("Load weight begin.")
        url = f"http://127.0.0.1:{port}"
        statuses = []
        for _ in range(400):
            status, _ = http("GET", url + "/health", timeout=10)
            statuses.append(status)
            if status == 200:
                break
            assert http("GET", url + "/v1/models")[0] == 200  # like SGLang: up before ready
            time.sleep(0.02)
        assert statuses[0] == 503 and statuses[-1] == 200
        assert set(statuses[:-1]) == {503}
        assert "The server is fired up and ready to roll!" in proc.log()
        one = {"input_ids": [1], "sampling_params": {"max_new_tokens": 2}}
        assert http("POST", url + "/generate", one)[0] == 200
        assert proc.stop() == 0
    assert "Received SIGTERM" in proc.log()


def test_port_in_use_is_a_fatal_start(server: SimProcess, tmp_path: Path) -> None:
    port = server.url.rsplit(":", 1)[1]
    argv = ["--model", "m", "--port", port, *FAST]
    proc = start_sim(argv=argv, log_path=tmp_path / "dup.log")
    assert proc.wait_exit() != 0
    assert "Address already in use" in proc.log()


def test_zero_cost_mode_serves_concurrent_requests_exactly(tmp_path: Path) -> None:
    argv = ["--model", "sim/m", "--port", "0", "--sim-time-scale", "0", "--sim-startup-s", "30"]
    argv.append("--sim-clean")  # exact 1-token texts (no special-token outputs)
    body = {"input_ids": list(range(1024)), "sampling_params": {"max_new_tokens": 1}}
    with start_sim(argv=argv, log_path=tmp_path / "zero.log") as proc:
        proc.wait_ready()  # 30 simulated seconds of startup take no time at scale 0
        with ThreadPoolExecutor(16) as pool:
            results = list(pool.map(lambda _: http("POST", proc.url + "/generate", body),
                                    range(200)))  # fmt: skip
        lines = stream_lines(proc.url + "/generate", {**body, "stream": True})
    assert {status for status, _ in results} == {200}
    metas = [json.loads(raw)["meta_info"] for _, raw in results]
    assert {(m["prompt_tokens"], m["completion_tokens"]) for m in metas} == {(1024, 1)}
    assert len({m["id"] for m in metas}) == 200
    assert bench_parse(iter(lines))["output_len"] == 1
    assert "Capture cuda graph end. Time elapsed: 0.00 s." in proc.log()


def test_loads_report_running_requests_like_sglang(server: SimProcess) -> None:
    """`/v1/loads` (SGLang 0.5.23): a streaming request counts as running until it ends."""
    body = {"input_ids": [1] * 100, "stream": True, "sampling_params": {"max_new_tokens": 50000}}
    request = urllib.request.Request(
        server.url + "/generate", data=json.dumps(body).encode(), method="POST"
    )
    with urllib.request.urlopen(request, timeout=30) as resp:
        assert resp.readline().startswith(b"data: ")
        running, queued, source = isolation.endpoint_load(server.url) or (0, 0, "")
        assert (running, queued, source) == (1, 0, server.url + "/v1/loads")
    for _ in range(200):  # client gone -> request aborted -> idle
        if isolation.endpoint_load(server.url) == (0, 0, server.url + "/v1/loads"):
            break
        time.sleep(0.05)
    assert isolation.endpoint_load(server.url) == (0, 0, server.url + "/v1/loads")


def test_api_key_enforced_and_never_in_argv_or_log(tmp_path: Path) -> None:
    """The keyed launch (engines.KEYED_LAUNCH): a request without the key gets SGLang's 401
    before anything is counted; probes and /metrics stay open; the key is in no argv (the
    server's and its children's /proc/PID/cmdline) and masked in the log (the sim logs its
    server_args with api_key, as SGLang does) and in /server_info only for those holding it."""
    key = "-k3y-" + "x" * 40  # a URL-safe key may start with '-' (1 in 64): no flag to argparse
    log = tmp_path / "server.log"
    argv = ["--model-path", "sim/Kimi", "--port", "0", "--enable-metrics", *FAST]
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", KEYED_LAUNCH, "servesweep.sim", *argv],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, API_KEY_ENV: key},
            start_new_session=True,
        )
    with SimProcess(proc=proc, log_path=log) as sim:
        sim.wait_ready()
        body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 2}}
        status, text = http("POST", f"{sim.url}/generate", body)
        assert (status, json.loads(text)) == (401, {"error": "Unauthorized"})
        wrong = urllib.request.Request(
            f"{sim.url}/v1/loads", headers={"Authorization": "Bearer nope"}
        )
        with pytest.raises(urllib.error.HTTPError, match="401"):
            urllib.request.urlopen(wrong, timeout=10)
        for path in ("/health", "/metrics"):
            assert http("GET", f"{sim.url}{path}")[0] == 200
        assert isolation.request_counters([sim.url]) == {sim.url: 0.0}, "401s are not counted"
        good = urllib.request.Request(
            f"{sim.url}/generate",
            data=json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(good, timeout=30) as resp:
            assert resp.status == 200
        assert isolation.request_counters([sim.url]) == {sim.url: 1.0}
        for pid in [sim.pid, *_children(sim.pid)]:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            assert key.encode() not in cmdline, f"pid {pid}: the key is in its argv"
        assert "api_key=" in sim.log() and key not in sim.log(), sim.log()[-2000:]


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(stat.parent.name))
        except (OSError, ValueError, IndexError):
            continue
    return out
