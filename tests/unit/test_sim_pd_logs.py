"""The sim's batch and Mooncake start lines against real SGLang 0.5.17 lines (tests/fixtures/real):
the same shape, and on the same workload the same PD queue counts."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import re
from datetime import datetime

import pytest

from servesweep.serving import logscan
from servesweep.sim import engine as engine_module
from servesweep.sim import mooncake
from servesweep.sim.costmodel import CostModel, Topology
from servesweep.sim.engine import DisaggQueues, Engine, RequestStream
from servesweep.sim.scheduler import new_scheduler
from tests.helpers import REPO

LOGS = REPO / "tests" / "fixtures" / "real" / "logs"


def body(line: str) -> str:
    """The message after SGLang's `[date time] ` prefix."""
    return re.sub(r"^\[[^\]]*\] ", "", line)


# PD prefill and decode on one H100, SGLang 0.5.17, Mooncake over TCP (2026-12-07)
PD_PREFILL = (LOGS / "pd-1gpu-0517-mooncake-tcp-prefill-batches.log").read_text().splitlines()
# SGLang 0.5.17 without PD (the H200 rehearsal, 2026-12-02)
PLAIN = (LOGS / "h200-rehearsal-0517-warm-start-bench-serving.log").read_text().splitlines()

# The report's regexes (/tmp/sglang-pd-logs.md section 6: tested on the batch lines of the
# 0.5.16-0.5.23 wheels' own source and on the real 0.5.17 line).
PREFILL_PD = re.compile(
    r"Prefill batch(?: \[\d+\])?, #new-seq: (?P<new_seq>\d+), #new-token: (?P<new_token>\d+), "
    r"#cached-token: (?P<cached_token>\d+), (?:full )?token usage: (?P<token_usage>\d+\.\d+), "
    r".*?#running-req: (?P<running_req>\d+), #queue-req: (?P<queue_req>\d+), "
    r"#pending-token: (?P<pending_token>\d+), (?:#replay-token: \d+, )?"
    r"#bootstrap-req: (?P<bootstrap_req>\d+), #inflight-req: (?P<inflight_req>\d+), "
    r"#optimistic-req: (?P<optimistic_req>\d+), (?:waiting-image-req: \d+, )?"
    r"(?:cuda|cpu|npu|musa) graph: (?P<graph>True|False), "
    r"input throughput \(token/s\): (?P<input_tput>\d+\.\d+)"
)
DECODE_PD = re.compile(
    r"Decode batch(?: \[\d+\])?, #running-req: (?P<running_req>\d+), .*?"
    r"pre-allocated usage: (?P<prealloc_usage>\d+\.\d+), #prealloc-req: (?P<prealloc_req>\d+), "
    r"#transfer-req: (?P<transfer_req>\d+), (?:#host-receive-req: \d+, )?"
    r"#retracted-req: (?P<retracted_req>\d+), (?:waiting-image-req: \d+, )?"
    r"(?:cuda|cpu|npu|musa) graph: (?P<graph>True|False), "
    r"gen throughput \(token/s\): (?P<gen_tput>\d+\.\d+), #queue-req: (?P<queue_req>\d+)"
)
# The real PD decode server's first batch line (SGLang 0.5.17 on one H100, 2026-12-07:
# docs/rehearsal/pd-2026-12-07/, its whole log in tests/fixtures/real/logs/).
DECODE_PD_RENDERED = next(
    body(line)
    for line in (LOGS / "pd-1gpu-0517-decode-healthy.log").read_text().splitlines()
    if "Decode batch" in line
)
DECODE_PD_README = "Decode batch, #running-req: 1, #token: 16448"
COUNTS = ("new_seq", "new_token", "cached_token", "running_req", "queue_req", "pending_token")
PD_COUNTS = (*COUNTS, "bootstrap_req", "inflight_req", "optimistic_req")
QUIET = dataclasses.replace(CostModel(), noise_sigma=0.0)


def shape(line: str) -> str:
    """A batch line with its numbers and booleans as N: the fields and their order."""
    return re.sub(r"\d+(?:\.\d+)?|True|False", "N", body(line))


def real(lines: list[str], start: str) -> list[str]:
    return [body(line) for line in lines if body(line).startswith(start)]


def counts(match: re.Match[str] | None, names: tuple[str, ...]) -> dict[str, str]:
    assert match is not None
    return {name: match[name] for name in names}


async def batch_lines(
    caplog: pytest.LogCaptureFixture,
    *,
    mode: str | None,
    requests: list[tuple[int, int]],
    queues: DisaggQueues | None = None,
    topology: Topology | None = None,
) -> tuple[list[str], Engine]:
    """Run each (prompt, output) request alone on an engine (chunks of 8192, like the real
    run) and return the batch lines it logged; a prefill server's transfers end at once."""
    model = dataclasses.replace(QUIET, pp_pipeline=True)
    sched = new_scheduler(topology=topology or Topology(), model=model, chunked_prefill_size=8192)
    eng = Engine(scheduler=sched, time_scale=1e-5)
    eng.disagg = queues or (DisaggQueues(mode=mode) if mode else None)
    task = asyncio.create_task(eng.run())
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=engine_module.__name__):
        for prompt, out in requests:
            prefilled = prompt if mode == "decode" else 0
            stream: RequestStream = eng.submit(
                prompt_tokens=prompt, max_new_tokens=out, counted=True, prefilled=prefilled
            )
            while not stream.finished:
                await stream.wait_change()
            eng.transfer_done(stream)
    await eng.close(task)
    lines = [r.getMessage() for r in caplog.records if " batch, " in r.getMessage()]
    return lines, eng


def test_a_pd_prefill_server_logs_the_real_lines_with_the_real_counts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Seed 003's 64-token case and a 16K prompt in two chunks: the same fields as 0.5.17's
    prefill server, and the same counts (the line after the last chunk counts the request in
    #inflight-req, as it waits for its KV transfer)."""
    lines, eng = asyncio.run(batch_lines(caplog, mode="prefill", requests=[(64, 1), (16384, 1)]))
    real_lines = real(PD_PREFILL, "Prefill batch")
    assert len(lines) == 3 and all(shape(line) == shape(real_lines[0]) for line in lines)
    for sim, want in zip(lines, (real_lines[0], real_lines[5], real_lines[6]), strict=True):
        assert counts(PREFILL_PD.search(sim), PD_COUNTS) == counts(
            PREFILL_PD.search(want), PD_COUNTS
        ), (sim, want)
    # its KV cache stays reserved while it is in flight, as the real 0.01 on both chunks
    usage = [PREFILL_PD.search(line)["token_usage"] for line in lines[1:]]  # type: ignore[index]
    assert usage[0] == usage[1] != "0.00"
    assert eng.disagg == DisaggQueues(mode="prefill") and eng.scheduler.kv_used == 0


def test_with_pipeline_parallel_prefill_the_line_comes_when_the_batch_leaves_the_pipeline(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Seed 003's prefill runs PP8: SGLang logs a batch once its results come out of the last
    stage, so the line after the last chunk still counts the request in flight."""
    pp8 = Topology(tp_size=4, ep_size=4, pp_size=8)
    lines, eng = asyncio.run(
        batch_lines(caplog, mode="prefill", requests=[(64, 1), (16384, 1)], topology=pp8)
    )
    assert eng.scheduler.cost.pipeline_stages == 8
    real_lines = real(PD_PREFILL, "Prefill batch")
    for sim, want in zip(lines, (real_lines[0], real_lines[5], real_lines[6]), strict=True):
        assert counts(PREFILL_PD.search(sim), PD_COUNTS) == counts(
            PREFILL_PD.search(want), PD_COUNTS
        ), (sim, want)


def test_the_bootstrap_queue_is_counted_on_the_prefill_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    queues = DisaggQueues(mode="prefill", bootstrap=3)  # three requests wait for their decode
    lines, _ = asyncio.run(batch_lines(caplog, mode="prefill", requests=[(8192, 1)], queues=queues))
    found = PREFILL_PD.search(lines[-1])
    assert found and found["bootstrap_req"] == "3" and found["inflight_req"] == "1"


def test_uncounted_requests_leave_the_inflight_queue_after_their_line() -> None:
    """Warm-up and health probes have a fake bootstrap room: counted once, then gone."""

    async def main() -> tuple[int, int]:
        sched = new_scheduler(topology=Topology(), model=QUIET)
        eng = Engine(scheduler=sched, time_scale=1e-5)
        eng.disagg = DisaggQueues(mode="prefill")
        task = asyncio.create_task(eng.run())
        await eng.run_to_completion(prompt_tokens=7, max_new_tokens=1)
        stream = eng.submit(prompt_tokens=7, max_new_tokens=1, counted=True)
        while not stream.finished:
            await stream.wait_change()
        inflight = eng.disagg.inflight  # the counted one waits for the server's transfer
        eng.transfer_done(stream)
        await eng.close(task)
        return inflight, eng.disagg.inflight

    assert asyncio.run(main()) == (1, 0)


def test_a_pd_decode_server_logs_prebuilt_batches_with_its_queues(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine_module, "DECODE_LOG_MIN_WALL_S", 0.0)
    queues = DisaggQueues(mode="decode", transfer=1, preallocated_tokens=16448)
    lines, eng = asyncio.run(
        batch_lines(caplog, mode="decode", requests=[(16384, 64)], queues=queues)
    )
    assert lines and not [line for line in lines if line.startswith("Prefill batch")]
    decode = DECODE_PD.search(lines[0])
    assert decode and DECODE_PD.search(DECODE_PD_RENDERED)
    assert shape(lines[0]) == shape(DECODE_PD_RENDERED)
    assert shape(lines[0]).startswith(shape(DECODE_PD_README))
    assert (decode["running_req"], decode["transfer_req"], decode["prealloc_req"]) == (
        "1",
        "1",
        "0",
    )
    capacity = eng.scheduler.policy.max_total_num_tokens
    assert decode["prealloc_usage"] == f"{16448 / capacity:.2f}"


def test_a_server_without_pd_keeps_the_plain_shapes(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine_module, "DECODE_LOG_MIN_WALL_S", 0.0)
    lines, _ = asyncio.run(batch_lines(caplog, mode=None, requests=[(16384, 64)]))
    prefill = [line for line in lines if line.startswith("Prefill batch")]
    decode = [line for line in lines if line.startswith("Decode batch")]
    assert len(prefill) == 2 and decode
    assert {shape(line) for line in prefill} == {shape(real(PLAIN, "Prefill batch")[0])}
    assert {shape(line) for line in decode} == {shape(real(PLAIN, "Decode batch")[0])}
    assert not any(PREFILL_PD.search(line) or DECODE_PD.search(line) for line in lines)
    # the first chunk leaves 8192 tokens pending, as the real cold start's chunks do
    assert "#pending-token: 8192, " in prefill[0] and "#pending-token: 0, " in prefill[1]


# ---------------------------------------------------------------------- Mooncake's start


def glog_parts(line: str) -> tuple[str, str, str]:
    """(level, file:line, message) of a glog line."""
    found = re.match(r"^([IWEF])\d{4} \d\d:\d\d:\d\d\.\d{6} +\d+ (\S+:\d+)\] (.*)$", line)
    assert found, line
    return found[1], found[2], found[3]


def test_the_tcp_start_lines_are_the_real_ones() -> None:
    real_glog = [glog_parts(line) for line in PD_PREFILL if re.match(r"^[IWEF]\d{4} ", line)]
    sim = mooncake.transfer_engine_lines(
        backend="mooncake",
        ib_device=None,
        host="192.0.2.2",
        env={"MOONCAKE_PROTOCOL": "tcp"},
        noise=True,
        rng=random.Random(0),
        when=datetime(2026, 12, 7, 16, 3, 23, 149676),
    )
    parts = [glog_parts(line) for line in sim]

    def port_free(rows: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
        port = re.compile(r"listening on (\S+):\d+")
        return [(lv, src, port.sub(r"listening on \1:N", m)) for lv, src, m in rows]

    assert port_free(parts[:-1]) == port_free(real_glog)
    # the healthy E line each side logs once at start (README: `E... transfer_metadata.cpp:1367]`)
    assert parts[-1] == ("E", "transfer_metadata.cpp:1367", "Local segment descriptor not found")
    assert sim[0].startswith("W1207 16:03:23.149676 ") and logscan.GLOG.search(sim[-1])
    [warning] = [body(line) for line in PD_PREFILL if "No IB devices" in line]
    assert mooncake.server_args_lines(backend="mooncake", ib_device=None) == [("warning", warning)]


def test_rdma_devices_and_forced_tcp() -> None:
    def messages(**kw: object) -> list[str]:
        args: dict[str, object] = {"host": "10.0.0.1", "env": {}, "noise": False, **kw}
        return [glog_parts(line)[2] for line in mooncake.transfer_engine_lines(**args)]  # type: ignore[arg-type]

    rdma = messages(backend="mooncake", ib_device="mlx5_0,mlx5_1,mlx5_0")
    assert rdma[-2:] == ["Topology discovery complete. Found 2 HCAs.", mooncake.RDMA_TRANSPORT]
    assert mooncake.hca_count('{"0": "mlx5_0,mlx5_1", "1": "mlx5_2"}') == 3
    assert mooncake.server_args_lines(backend="mooncake", ib_device="mlx5_0") == []
    forced = messages(backend="mooncake_tcp", ib_device="mlx5_0")
    assert forced[-1] == mooncake.FORCE_TCP and "Auto-discovering topology..." not in forced
    assert messages(backend="mooncake", ib_device=None, env={"MC_FORCE_TCP": "1"})[-1] == (
        mooncake.FORCE_TCP
    )
    assert [m for _, m in mooncake.server_args_lines(backend="mooncake_tcp", ib_device=None)] == [
        mooncake.MOONCAKE_TCP_BACKEND,
        mooncake.NO_IB_DEVICES,
    ]
    assert (
        mooncake.transfer_engine_lines(backend="nixl", ib_device=None, host="h", env={}, noise=True)
        == []
    )
