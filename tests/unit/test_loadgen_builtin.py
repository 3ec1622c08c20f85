"""The builtin client: pure parts (prompts, stream parser, CLI) and runs against the real sim."""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
from pathlib import Path

import aiohttp
import numpy as np
import orjson
import pytest

from servesweep.measure.loadgen.builtin import (
    BenchOptions,
    build_parser,
    decode_chunk,
    main,
    parse_lines,
    request_body,
    resolve_base_url,
    run_benchmark,
    sample_rows,
)
from servesweep.measure.loadgen.metrics import RequestResult
from servesweep.measure.records import BenchRecord, read_records
from tests.support.sim import running_sim, sim_available

# ---------------------------------------------------------------- prompts


def rows(**kw):
    args = {
        "num_prompts": 50,
        "input_len": 64,
        "output_len": 8,
        "range_ratio": 1.0,
        "vocab_size": 1000,
        **kw,
    }
    return sample_rows(rng=np.random.RandomState(args.pop("seed", 1)), **args)


def test_range_ratio_one_gives_exact_lengths():
    rs = rows()
    assert {(r.input_len, r.output_len) for r in rs} == {(64, 8)}


def test_range_ratio_bounds_lengths_like_bench():
    rs = rows(range_ratio=0.5, num_prompts=400)
    ins = {r.input_len for r in rs}
    outs = {r.output_len for r in rs}
    assert min(ins) >= 32 and max(ins) <= 64 and len(ins) > 10
    assert min(outs) >= 4 and max(outs) <= 8
    zero = rows(range_ratio=0.0, num_prompts=400, output_len=2)
    assert {r.output_len for r in zero} == {1, 2}  # lower bound max(int(L*0), 1)


def test_ids_are_consecutive_modulo_vocab_and_seeded():
    rs = rows(vocab_size=70)
    for r in rs:
        ids = r.input_ids(70)
        assert len(ids) == 64 and all(0 <= i < 70 for i in ids)
        assert all((b - a) % 70 == 1 for a, b in zip(ids, ids[1:], strict=False))
    assert [r.first_id for r in rows(seed=5)] == [r.first_id for r in rows(seed=5)]
    assert [r.first_id for r in rows(seed=5)] != [r.first_id for r in rows(seed=6)]


def test_request_body_is_sglang_generate_payload():
    body = json.loads(request_body(input_ids=[1, 2], output_len=3, stream=True))
    assert body == {
        "input_ids": [1, 2],
        "sampling_params": {"temperature": 0.0, "max_new_tokens": 3, "ignore_eos": True},
        "stream": True,
    }
    extra = {"sampling_params": {"max_new_tokens": 3, "skip_special_tokens": False}}
    body = json.loads(request_body(input_ids=[1], output_len=3, stream=False, extra=extra))
    assert body == {"input_ids": [1], "stream": False, **extra}  # top-level keys, as in bench


# ---------------------------------------------------------------- stream parser


def chunk(text: str, n: int, **meta) -> bytes:
    return (
        b"data: "
        + json.dumps({"text": text, "meta_info": {"completion_tokens": n, **meta}}).encode()
    )


def parsed(lines: list[bytes], times: list[float]) -> RequestResult:
    res = RequestResult(input_len=10, prompt_len=10, output_len=5, start_time=100.0)
    parse_lines(lines, times, res)
    return res


def test_stream_ttft_itl_split_and_done():
    lines = [
        chunk(" a", 1, prompt_tokens=12),
        b"",
        chunk(" a b c", 3),
        chunk(" a b c", 3),  # no new tokens: skipped, does not move the clock
        chunk(" a b c d", 4),
        b"data: [DONE]",
    ]
    res = parsed(lines, [100.5, 100.55, 100.7, 100.8, 101.0, 101.1])
    assert res.success and res.error == ""
    assert res.ttft == pytest.approx(0.5)
    assert res.itl == pytest.approx([0.1, 0.1, 0.3])  # 0.2 gap split over 2, then 0.3
    assert res.latency == pytest.approx(1.1)  # the [DONE] line counts
    assert res.output_len == 4 and res.generated_text == " a b c d"
    assert res.prompt_len == 12  # meta_info.prompt_tokens overrides the intended length


def test_error_line_fails_the_request_with_its_text():
    err = {"error": {"message": "scheduler died", "type": "x", "code": 500, "retryable": False}}
    lines = [chunk(" a", 1), b"data: " + json.dumps(err).encode(), b"data: [DONE]"]
    res = parsed(lines, [100.1, 100.2, 100.3])
    assert not res.success
    assert "mid-stream error" in res.error and "scheduler died" in res.error


def test_text_free_stream_is_a_bench_success_with_zero_ttft():
    # bench counts this as success; validation flags it (ttft 0, empty text)
    res = parsed([b'data: {"meta_info": {}}', b"data: [DONE]"], [100.1, 100.2])
    assert res.success and res.ttft == 0.0 and res.generated_text == ""
    assert res.output_len == 5


def test_non_streamed_body_is_one_line():
    body = json.dumps({"text": " a b", "meta_info": {"completion_tokens": 2}}).encode()
    res = parsed([body], [100.4])
    assert res.success and res.ttft == pytest.approx(0.4) == pytest.approx(res.latency)
    assert res.itl == []


META = {"id": "r1", "finish_reason": None, "prompt_tokens": 12, "completion_tokens": 3}
SGLANG_CHUNK = {"text": " a b c", "output_ids": [101, 7, 4095], "meta_info": META}
TRICKY_TEXTS = ["", ' "output_ids": [1]}, "x', "a]b\\", '\u00e9\u4e2d \\"', "\n\t,"]
SGLANG_SHAPES = [
    SGLANG_CHUNK,
    {**SGLANG_CHUNK, "prompt_token_ids": [1, 2]},  # SGLang adds it after meta_info
    {**SGLANG_CHUNK, "output_ids": []},
    {**SGLANG_CHUNK, "text": None},
    *({**SGLANG_CHUNK, "text": t} for t in TRICKY_TEXTS),
]
OTHER_SHAPES = [
    {"text": " a", "output_ids": [5]},  # nothing after the ids
    {"output_ids": [1], "meta_info": META},  # token ids only: no text
    {"meta_info": META, "text": " a", "output_ids": [1]},  # text not first
    {"text": " a", "x": 1, "output_ids": [1], "meta_info": META},  # a key between
    {"text": " a", "m": {"output_ids": [1], "c": 2}, "meta_info": META},  # a nested id key
    {"text": " a", "m": {"output_ids": [1]}, "meta_info": META},
    {"text": " a", "output_ids": [[1, 2], [3]], "meta_info": META},  # not a flat id list
    {"text": " a", "output_ids": ["a],", 1], "meta_info": META},
    {"text": " a", "output_ids": ["a]", 1], "meta_info": META},
    {"error": {"message": "boom", "code": 500}},
]


def encodings(data: dict) -> list[bytes]:
    return [orjson.dumps(data), json.dumps(data).encode()]  # SGLang's and the sim's spacing


def without_ids(data: dict) -> dict:
    return {k: v for k, v in data.items() if k != "output_ids"}


@pytest.mark.parametrize("line", [e for d in SGLANG_SHAPES for e in encodings(d)])
def test_decode_chunk_skips_the_ids_of_sglang_chunks(line):
    assert decode_chunk(line) == without_ids(orjson.loads(line))


@pytest.mark.parametrize("line", [e for d in OTHER_SHAPES for e in encodings(d)])
def test_decode_chunk_decodes_other_shapes_whole(line):
    assert decode_chunk(line) == orjson.loads(line)


@pytest.mark.parametrize(
    "line",
    [
        b'{"text":"a","output_ids":[1],}',  # trailing comma
        b'{"text":"a","output_ids":[1],"meta_info":{}',  # cut short
        b'{"text":"a" "b","output_ids":[1],"meta_info":{}}',
        b'{"text":"a","output_ids":[1],"text":"b"}',  # a repeated key: the full decoder's call
    ],
)
def test_decode_chunk_agrees_with_the_full_decoder_on_odd_lines(line):
    try:
        expected = orjson.loads(line)
    except ValueError:
        with pytest.raises(ValueError):
            decode_chunk(line)
    else:
        assert decode_chunk(line) == expected


# ---------------------------------------------------------------- CLI


def test_resolve_base_url():
    assert resolve_base_url(base_url="http://x:1/", host="h", port=2) == "http://x:1"
    assert resolve_base_url(base_url=None, host="h", port=2) == "http://h:2"
    assert resolve_base_url(base_url=None, host="::1", port=2) == "http://[::1]:2"


def test_cli_defaults_follow_bench():
    args = build_parser().parse_args([])
    assert args.random_range_ratio == 0.0 and args.warmup_requests == 1
    assert args.request_rate == math.inf and args.seed == 42 and args.port == 30000
    assert args.max_concurrency is None and args.vocab_size == 32000


@pytest.mark.parametrize(
    "bad",
    [
        ["--num-prompts", "0"],
        ["--max-concurrency", "0"],
        ["--random-range-ratio", "1.5"],
        ["--request-rate", "0"],
        ["--backend", "vllm"],
        ["--dataset-name", "sharegpt"],
        ["--no-such-flag"],
    ],
)
def test_cli_rejects_bad_arguments(bad, capsys):
    with pytest.raises(SystemExit) as exc:
        main(bad)
    assert exc.value.code == 2


def test_unreachable_server_exits_1_without_record(tmp_path):
    out = tmp_path / "o.jsonl"
    argv = ["--port", "9", "--host", "127.0.0.1", "--ready-check-timeout-sec", "1"]
    assert main([*argv, "--output-file", str(out), "--disable-tqdm"]) == 1
    assert not out.exists()


# ---------------------------------------------------------------- against the real sim

needs_sim = pytest.mark.skipif(not sim_available(), reason="servesweep.sim not written yet")


def options(base_url: str, **kw) -> BenchOptions:
    args = {
        "base_url": base_url,
        "input_len": 96,
        "output_len": 5,
        "range_ratio": 1.0,
        "num_prompts": 12,
        "max_concurrency": 3,
        "warmup_requests": 0,
        "seed": 3,
        "disable_tqdm": True,
        "ready_check_timeout_s": 10,
        **kw,
    }
    return BenchOptions(**args)


def benchmark(opts: BenchOptions) -> BenchRecord:
    """run_benchmark's record (a plain dict, as the client writes it), validated as readers do."""
    return BenchRecord.model_validate(asyncio.run(run_benchmark(opts)))


@needs_sim
def test_exact_lengths_and_complete_record(tmp_path):
    with running_sim(log_path=tmp_path / "sim.log") as sim:
        rec = benchmark(options(sim.base_url, warmup_requests=2))
    assert rec.completed == 12
    assert rec.input_lens == [96] * 12 and rec.output_lens == [5] * 12
    assert rec.total_input_tokens == 12 * 96 and rec.total_output_tokens == 60
    assert all(e == "" for e in rec.errors)
    assert all(t > 0 for t in rec.ttfts)
    assert all(len(itl) == 4 for itl in rec.itls)
    assert all(text for text in rec.generated_texts)
    assert isinstance(rec.server_info, dict)
    assert rec.max_concurrency == 3 and rec.duration > 0


async def submitted_requests(base_url: str) -> float:
    """The sim's `sglang:num_requests_total` (requests that reached its scheduler)."""
    async with aiohttp.ClientSession() as session, session.get(f"{base_url}/metrics") as resp:
        text = await resp.text()
    line = next(x for x in text.splitlines() if x.startswith("sglang:num_requests_total"))
    return float(line.split()[-1])


@needs_sim
def test_concurrency_cap_holds_requests_back(tmp_path):
    # The first 3 requests hang until the client times them out. Capped at 3, the client
    # sends nothing else meanwhile; uncapped, requests 3..5 would reach the scheduler at once.
    async def scenario(sim) -> tuple[float, BenchRecord]:
        opts = options(sim.base_url, num_prompts=6, max_concurrency=3, request_timeout_s=3.0)
        task = asyncio.create_task(run_benchmark(opts))
        while sim.log_text().count("will never be answered") < 3:
            assert not task.done(), "client finished before 3 requests hung"
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.5)  # generous time for an uncapped client to send the rest
        submitted = await submitted_requests(sim.base_url)
        return submitted, BenchRecord.model_validate(await task)

    args = ["--sim-hang-at", "0,1,2", "--enable-metrics"]
    with running_sim(log_path=tmp_path / "sim.log", args=args) as sim:
        submitted, rec = asyncio.run(scenario(sim))
    assert submitted == 0
    assert [bool(e) for e in rec.errors] == [True] * 3 + [False] * 3
    assert all(e.startswith("TimeoutError") for e in rec.errors[:3])
    assert rec.completed == 3


@needs_sim
def test_http_500_and_midstream_error_are_failed_requests(tmp_path):
    args = ["--sim-http-500-at", "1", "--sim-midstream-error-at", "3"]
    with running_sim(log_path=tmp_path / "sim.log", args=args) as sim:
        rec = benchmark(options(sim.base_url, max_concurrency=1))
    assert rec.completed == 10
    failed = [i for i, e in enumerate(rec.errors) if e]
    assert failed == [1, 3]  # concurrency 1: arrival order == dispatch order
    assert rec.errors[1].startswith("HTTP 500 Internal Server Error")
    assert rec.errors[3].startswith("mid-stream error")
    assert rec.output_lens[1] == rec.output_lens[3] == 0
    assert rec.total_output_tokens == 50


@needs_sim
def test_non_streaming_ttft_equals_latency(tmp_path):
    with running_sim(log_path=tmp_path / "sim.log") as sim:
        rec = benchmark(options(sim.base_url, stream=False))
    assert rec.completed == 12 and rec.output_lens == [5] * 12
    assert all(itl == [] for itl in rec.itls)
    assert rec.mean_ttft_ms == pytest.approx(rec.mean_e2e_latency_ms)


@needs_sim
def test_hung_request_times_out_as_failure(tmp_path):
    with running_sim(log_path=tmp_path / "sim.log", args=["--sim-hang-at", "0"]) as sim:
        rec = benchmark(options(sim.base_url, num_prompts=3, request_timeout_s=1.0))
    assert rec.completed == 2
    assert rec.errors[0].startswith("TimeoutError")


@needs_sim
def test_cli_appends_one_line_per_run(tmp_path):
    out = tmp_path / "sub" / "raw.jsonl"
    with running_sim(log_path=tmp_path / "sim.log") as sim:
        base = ["--base-url", sim.base_url, "--random-input-len", "32"]
        base += ["--random-output-len", "3", "--random-range-ratio", "1", "--num-prompts", "4"]
        base += ["--disable-tqdm", "--output-file", str(out)]
        assert main([*base, "--tag", "first", "--output-details"]) == 0
        assert main([*base, "--tag", "second", "--warmup-requests", "0"]) == 0
    first, second = read_records(out)
    assert (first.tag, second.tag) == ("first", "second")
    assert first.output_lens == [3] * 4
    assert second.output_lens is None  # no --output-details: summary keys only
    assert first.completed == second.completed == 4


@needs_sim
def test_cli_exits_1_when_nothing_completes(tmp_path):
    out = tmp_path / "raw.jsonl"
    with running_sim(log_path=tmp_path / "sim.log", args=["--sim-http-500-at", "0,1"]) as sim:
        rc = main(
            ["--base-url", sim.base_url, "--num-prompts", "2", "--warmup-requests", "0"]
            + ["--random-input-len", "8", "--random-output-len", "2", "--disable-tqdm"]
            + ["--output-file", str(out)]
        )
    assert rc == 1
    assert not Path(out).exists()


def test_client_process_imports_no_pydantic_or_config() -> None:
    # Every cell-repeat starts one client process: pydantic and the config models would add
    # ~0.1 s to each (records.BenchRecord validates the record when the workflow reads it).
    code = (
        "import json, sys, servesweep.measure.loadgen.builtin\n"
        "print(json.dumps([m for m in ('pydantic', 'servesweep.config',"
        " 'servesweep.measure.records')"
        " if m in sys.modules]))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert json.loads(proc.stdout) == []


def test_ctrl_c_is_one_line_without_record(tmp_path, monkeypatch, capsys, caplog):
    """SIGINT reaches the client with the terminal's process group: one line, exit 130."""

    def interrupted(coro):
        coro.close()
        raise KeyboardInterrupt

    monkeypatch.setattr(asyncio, "run", interrupted)
    out = tmp_path / "out.jsonl"
    argv = ["--base-url", "http://127.0.0.1:9", "--num-prompts", "1"]
    assert main([*argv, "--output-file", str(out), "--disable-tqdm"]) == 130
    assert "Traceback" not in capsys.readouterr().err and not out.exists()
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == [
        "interrupted by SIGINT (Ctrl-C); no record written"
    ]


def test_api_key_header_from_the_environment_like_bench_serving() -> None:
    from servesweep.measure.loadgen.builtin import auth_headers

    assert auth_headers({"OPENAI_API_KEY": "k"}) == {"Authorization": "Bearer k"}
    assert auth_headers({}) == {}
