"""PD disaggregation with real processes on loopback: prefill + decode sims + mini-LB router."""

from __future__ import annotations

import http.client
import json
import math
import re
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from servesweep.sim import mooncake
from servesweep.sim.pd import (
    BOOTSTRAP_LINE,
    EVIDENCE_PATTERNS,
    KV_TRANSFER_DONE,
    RDMA_ENDPOINTS_LINE,
    RDMA_READY_ACK,
    Bootstrap,
    PDMismatch,
    bootstrap_of,
    check_compatible,
)
from servesweep.sim.tokens import WORDS
from tests.support.simprocess import ROUTER_READY_LINE, SimProcess, start_router, start_sim
from tests.unit.test_sim_pd_logs import PREFILL_PD

# --sim-clean: these tests compare text with the output ids word for word (no drift pieces)
FAST = ["--model", "sim/kimi", "--port", "0", "--sim-time-scale", "0.001", "--sim-startup-s", "1"]
FAST += ["--sim-clean", "--enable-metrics"]
PREFILL = [
    *FAST,
    "--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", "0",
    "--tp-size", "4", "--ep-size", "4", "--pp-size", "2", "--chunked-prefill-size", "256",
    "--page-size", "64", "--disaggregation-ib-device", "mlx5_0,mlx5_1",
]  # fmt: skip
DECODE = [*FAST, "--disaggregation-mode", "decode", "--tp-size", "8", "--ep-size", "8"]
BOOTSTRAP_RE = re.compile(re.escape(BOOTSTRAP_LINE) + r" \S+:(\d+)")
ROOM_RE = r"room=(\d+)"


def post(url: str, body: dict[str, Any], timeout: float = 30) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def events(raw: bytes) -> list[Any]:
    out: list[Any] = []
    for block in raw.split(b"\n\n"):
        text = block.strip().decode()
        if text:
            payload = text.removeprefix("data: ")
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def bootstrap_port(proc: SimProcess) -> int:
    proc.wait_for_line(BOOTSTRAP_LINE)
    match = BOOTSTRAP_RE.search(proc.log())
    assert match, proc.log()
    return int(match.group(1))


def rooms(log: str, marker: str) -> list[int]:
    return [int(m) for m in re.findall(re.escape(marker) + r"(\d+)", log)]


@dataclass
class PD:
    prefill: SimProcess
    decode: SimProcess
    router: SimProcess
    bootstrap_port: int


@pytest.fixture(scope="module")
def pd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PD]:
    logs = tmp_path_factory.mktemp("pd")
    with start_sim(argv=PREFILL, log_path=logs / "prefill.log") as prefill:
        port = bootstrap_port(prefill)
        decode_argv = [*DECODE, "--page-size", "64", "--disaggregation-bootstrap-port", str(port)]
        with start_sim(argv=decode_argv, log_path=logs / "decode.log") as decode:
            prefill.wait_ready()
            decode.wait_ready()
            router_argv = [
                "--pd-disaggregation", "--mini-lb", "--prefill", prefill.url, str(port),
                "--decode", decode.url, "--host", "127.0.0.1", "--port", "0",
                "--policy", "random",
            ]  # fmt: skip
            with start_router(argv=router_argv, log_path=logs / "router.log") as router:
                router.wait_for_line(ROUTER_READY_LINE)
                yield PD(prefill=prefill, decode=decode, router=router, bootstrap_port=port)


def gen(n_in: int, n_out: int, *, stream: bool) -> dict[str, Any]:
    return {
        "input_ids": list(range(100, 100 + n_in)),
        "sampling_params": {"max_new_tokens": n_out, "ignore_eos": True},
        "stream": stream,
    }


def assert_exact(obj: dict[str, Any], *, n_in: int, n_out: int) -> None:
    meta = obj["meta_info"]
    assert meta["completion_tokens"] == n_out == len(obj["output_ids"])
    assert meta["prompt_tokens"] == n_in
    assert meta["finish_reason"] == {"type": "length", "length": n_out}
    assert obj["text"] == "".join(WORDS[i % len(WORDS)] for i in obj["output_ids"])


def test_streamed_request_through_the_router_is_exact(pd: PD) -> None:
    status, raw = post(pd.router.url + "/generate", gen(300, 12, stream=True))
    assert status == 200
    evs = events(raw)
    assert evs[-1] == "[DONE]"
    chunks = evs[:-1]
    assert [c["meta_info"]["completion_tokens"] for c in chunks] == list(range(1, 13))
    assert all(c["text"] for c in chunks)  # bench_serving counts only non-empty text
    assert_exact(chunks[-1], n_in=300, n_out=12)
    for earlier, later in zip(chunks, chunks[1:], strict=False):
        assert later["output_ids"][: len(earlier["output_ids"])] == earlier["output_ids"]


def test_non_streamed_request_through_the_router_is_exact(pd: PD) -> None:
    status, raw = post(pd.router.url + "/generate", gen(1024, 16, stream=False))
    assert status == 200
    assert_exact(json.loads(raw), n_in=1024, n_out=16)


def test_openai_completion_through_the_router(pd: PD) -> None:
    status, raw = post(pd.router.url + "/v1/completions", {"prompt": [5] * 70, "max_tokens": 5})
    assert status == 200
    body = json.loads(raw)
    assert body["usage"] == {"prompt_tokens": 70, "completion_tokens": 5, "total_tokens": 75}
    assert len(body["choices"][0]["text"].split()) == 5


def test_each_request_leaves_matching_evidence_in_both_logs(pd: PD) -> None:
    before_p = rooms(pd.prefill.log(), KV_TRANSFER_DONE)
    before_d = rooms(pd.decode.log(), RDMA_READY_ACK)
    for _ in range(3):
        assert post(pd.router.url + "/generate", gen(64, 2, stream=False))[0] == 200
    p_rooms = rooms(pd.prefill.log(), KV_TRANSFER_DONE)[len(before_p) :]
    d_rooms = rooms(pd.decode.log(), RDMA_READY_ACK)[len(before_d) :]
    assert len(p_rooms) == 3 and sorted(p_rooms) == sorted(d_rooms)
    assert all(0 <= r < 2**63 for r in p_rooms) and len(set(p_rooms)) == 3
    assert "state slice TP4->TP8" in pd.prefill.log()
    assert pd.prefill.log().count(RDMA_ENDPOINTS_LINE) == 1  # once per decode peer
    assert EVIDENCE_PATTERNS == {"prefill": KV_TRANSFER_DONE, "decode": RDMA_READY_ACK}
    assert "Start of pd disaggregation warmup" in pd.decode.log()
    assert "Prefill parallel info for [127.0.0.1:" in pd.decode.log()


def test_both_servers_log_sglangs_pd_lines(pd: PD) -> None:
    """SGLang 0.5.17's batch lines with the PD queues, the bootstrap server's line, and
    Mooncake's start: RDMA on the prefill server (two IB devices given), TCP on the decode
    server (none given, so SGLang falls back to auto discovery)."""
    before = len(pd.prefill.log().splitlines())
    for _ in range(2):  # 300 tokens: two chunks of 256 each
        assert post(pd.router.url + "/generate", gen(300, 2, stream=False))[0] == 200
    new = pd.prefill.log().splitlines()[before:]
    batches = [line for line in new if "Prefill batch" in line]
    assert len(batches) >= 4 and all(PREFILL_PD.search(line) for line in batches), batches
    # the line after each request's last chunk counts it in flight (the pattern
    # config/experiments/pd_standard.yaml counts as evidence), before its transfer is done
    inflight = re.compile(r"Prefill batch.*#bootstrap-req: \d+, #inflight-req: [1-9]")
    sent = counted = 0
    for line in new:
        counted += bool(inflight.search(line))
        if line.split("] ", 1)[-1].startswith(KV_TRANSFER_DONE):
            sent += 1
            assert counted >= sent, new
    assert sum(bool(inflight.search(line)) for line in batches) >= 2
    prefill, decode = pd.prefill.log(), pd.decode.log()
    assert re.search(
        r"\] CommonKVBootstrapServer started successfully on 127\.0\.0\.1:\d+", prefill
    )
    assert "Found 2 HCAs." in prefill and mooncake.RDMA_TRANSPORT in prefill
    assert mooncake.NO_IB_DEVICES not in prefill and mooncake.NO_IB_DEVICES in decode
    assert "Found 0 HCAs." in decode and mooncake.TCP_TRANSPORT in decode
    assert mooncake.SEGMENT_NOT_FOUND not in prefill + decode  # --sim-clean: no benign noise
    assert "Prefill batch" not in decode  # a decode server's batches are prebuilt


def test_null_bootstrap_port_means_the_decode_servers_own_port(pd: PD) -> None:
    body = {**gen(64, 3, stream=False), "bootstrap_host": "127.0.0.1", "bootstrap_port": None}
    body["bootstrap_room"] = 4242
    results: dict[str, tuple[int, bytes]] = {}

    def send(name: str, url: str) -> None:
        results[name] = post(url + "/generate", body)

    threads = [
        threading.Thread(target=send, args=(name, proc.url))
        for name, proc in (("p", pd.prefill), ("d", pd.decode))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results["p"][0] == results["d"][0] == 200
    assert json.loads(results["d"][1])["meta_info"]["completion_tokens"] == 3
    assert f"{RDMA_READY_ACK}4242," in pd.decode.log()


def test_prefill_failure_reaches_decode_as_an_error(pd: PD, tmp_path: Path) -> None:
    env = {"SERVESWEEP_SIM_FAULTS": json.dumps({"http_500_at": [0]})}
    with start_sim(argv=PREFILL, log_path=tmp_path / "p2.log", env=env) as broken:
        port = bootstrap_port(broken)
        broken.wait_ready()
        body = {**gen(64, 3, stream=False), "bootstrap_host": "127.0.0.1"}
        body.update(bootstrap_port=port, bootstrap_room=777)
        results: dict[str, tuple[int, bytes]] = {}
        threads = [
            threading.Thread(target=lambda n=n, u=u: results.update({n: post(u, body)}))
            for n, u in (("p", broken.url + "/generate"), ("d", pd.decode.url + "/generate"))
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert results["p"][0] == 500
    status, raw = results["d"]
    assert status == 500
    assert "KVTransferError(bootstrap_room=777)" in raw.decode()
    assert "injected HTTP 500" in raw.decode()
    assert pd.decode.proc.poll() is None  # one failed room does not kill decode


@pytest.mark.parametrize(
    ("decode_flags", "message"),
    [
        (
            ["--page-size", "32"],
            "RuntimeError: Page size mismatch: prefill server has page_size=64, but decode "
            "server has page_size=32. Both servers must use the same --page-size value.",
        ),
        (
            ["--page-size", "64", "--kv-cache-dtype", "fp8_e4m3"],
            "RuntimeError: KV cache dtype mismatch: prefill server has kv_cache_dtype=auto, "
            "but decode server has kv_cache_dtype=fp8_e4m3. Both servers must use the same "
            "--kv-cache-dtype value.",
        ),
    ],
)
def test_mismatch_kills_decode_on_its_first_request(
    pd: PD, tmp_path: Path, decode_flags: list[str], message: str
) -> None:
    with start_sim(argv=[*DECODE, *decode_flags], log_path=tmp_path / "d.log") as bad:
        bad.wait_ready()  # startup succeeds: the check is lazy
        assert bad.proc.poll() is None
        body = {**gen(64, 3, stream=False), "bootstrap_host": "127.0.0.1"}
        body.update(bootstrap_port=pd.bootstrap_port, bootstrap_room=1)
        with pytest.raises((urllib.error.URLError, ConnectionError, http.client.HTTPException)):
            post(bad.url + "/generate", body)  # the process dies with the request in flight
        assert bad.wait_exit() == 1
        log = bad.log()
    lines = log.splitlines()
    start = next(i for i, line in enumerate(lines) if "Scheduler hit an exception:" in line)
    assert "Traceback (most recent call last):" in lines[start]
    assert message in lines[start + 1 :]
    assert "disaggregation/common/conn.py" in log and "try_ensure_parallel_info" in log
    assert log.index("fired up and ready to roll") < log.index("Scheduler hit an exception")
    assert pd.prefill.proc.poll() is None


def test_bootstrap_fields_parse_like_sglang() -> None:
    body = {"bootstrap_host": "10.0.0.1", "bootstrap_port": None, "bootstrap_room": 5}
    assert bootstrap_of(body, default_port=8998) == Bootstrap("10.0.0.1", 8998, 5)
    assert bootstrap_of({"bootstrap_host": "[::1]", "bootstrap_port": 9, "bootstrap_room": 1},
                        default_port=1).addr == "[::1]:9"  # fmt: skip
    assert bootstrap_of({"text": "x"}, default_port=1) is None
    assert bootstrap_of({**body, "bootstrap_host": "2.2.2.2"}, default_port=1).fake  # type: ignore[union-attr]
    for bad in ({**body, "bootstrap_room": "x"}, {**body, "bootstrap_port": 70000}):
        with pytest.raises(ValueError):
            bootstrap_of(bad, default_port=1)


def test_compatibility_check_messages() -> None:
    check_compatible(info={"page_size": 64, "kv_cache_dtype": "auto"}, page_size=64,
                     kv_cache_dtype="auto")  # fmt: skip
    check_compatible(info={"page_size": None}, page_size=16, kv_cache_dtype="auto")
    with pytest.raises(PDMismatch, match="Page size mismatch: prefill server has page_size=1,"):
        check_compatible(info={"page_size": 1}, page_size=64, kv_cache_dtype="auto")


def test_both_roles_export_sglangs_pd_families_with_its_stage_labels(pd: PD) -> None:
    """The sim's /metrics has what the workflow records and derives from a real PD server:
    the load and PD queue gauges, and per-stage latencies under SGLang's RequestStage labels,
    each stage's count one per request of the role."""
    from servesweep.cluster import promtext

    def read(url: str) -> dict[str, str]:
        return promtext.parse(urllib.request.urlopen(url + "/metrics", timeout=10).read().decode())

    def count(sample: dict[str, str], stage: str) -> float:
        family = "sglang:per_stage_req_latency_seconds_count"
        found = promtext.total(sample, family, where={"stage": stage})
        return 0.0 if math.isnan(found) else found

    stages = {
        "prefill": ("prefill_bootstrap", "prefill_forward", "prefill_transfer_kv_cache"),
        "decode": ("decode_bootstrap", "decode_transferred", "decode_waiting"),
    }
    before = {"prefill": read(pd.prefill.url), "decode": read(pd.decode.url)}
    for _ in range(2):
        assert post(pd.router.url + "/generate", gen(256, 3, stream=True))[0] == 200
    after = {"prefill": read(pd.prefill.url), "decode": read(pd.decode.url)}
    for role, names in stages.items():
        for stage in names:
            done = count(after[role], stage) - count(before[role], stage)
            assert done == 2, (role, stage)
        sample = after[role]
        for gauge in (
            "num_running_reqs", "num_queue_reqs", "token_usage", "cache_hit_rate",
            "kv_used_tokens", "num_prefill_bootstrap_queue_reqs",
            "num_prefill_inflight_queue_reqs", "num_decode_prealloc_queue_reqs",
            "num_decode_transfer_queue_reqs",
        ):  # fmt: skip
            assert promtext.total(sample, f"sglang:{gauge}") >= 0, gauge
        inf = 'le="+Inf"'
        buckets = [k for k in sample if k.startswith("sglang:per_stage_req_latency_seconds_bucket")]
        assert any(inf in k for k in buckets) and len(buckets) == 31 * len(
            {promtext.labels(k)["stage"] for k in buckets}
        )
