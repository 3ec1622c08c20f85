"""Client command lines built from a Workload, for the builtin client and bench_serving."""

from __future__ import annotations

import json
import math

import pytest

from servesweep.config.schema import Workload
from servesweep.core.errors import ConfigError
from servesweep.measure.loadgen import bench_module, client_argv, client_env
from servesweep.measure.loadgen.builtin import build_parser

WORKLOAD = Workload(
    input_len=512, output_len=4, num_requests=8, concurrency=4, warmup_requests=1, seed=7
)


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_builtin_argv_parses_with_the_builtin_cli():
    argv = client_argv(
        kind="builtin",
        workload=WORKLOAD,
        base_url="http://10.0.0.1:30000",
        output_file="/r/raw.jsonl",
        tag="run/cell/r1",
        python="py",
    )
    assert argv[:3] == ["py", "-m", "servesweep.measure.loadgen.builtin"]
    args = build_parser().parse_args(argv[3:])
    assert args.base_url == "http://10.0.0.1:30000"
    assert (args.random_input_len, args.random_output_len) == (512, 4)
    assert args.random_range_ratio == 1.0
    assert (args.num_prompts, args.max_concurrency, args.seed) == (8, 4, 7)
    assert args.request_rate == math.inf
    assert args.warmup_requests == 1
    assert args.output_file == "/r/raw.jsonl" and args.output_details
    assert args.tag == "run/cell/r1"
    assert not args.disable_stream
    assert args.request_timeout_sec == WORKLOAD.request_timeout_s
    assert "--tokenizer" not in argv


def test_bench_serving_argv_has_tokenizer_and_same_common_flags():
    common = {
        "workload": WORKLOAD.model_copy(update={"stream": False, "request_rate": 2.5}),
        "base_url": "http://h:1",
        "output_file": "o.jsonl",
        "tag": "t",
        "python": "python3",
    }
    bench = client_argv(kind="bench_serving", tokenizer="/tok", **common)
    builtin = client_argv(kind="builtin", **common)
    assert bench[:3] == ["python3", "-m", "sglang.benchmark.serving"]
    assert flag(bench, "--tokenizer") == "/tok" and flag(bench, "--model") == "/tok"
    assert "--tokenize-prompt" in bench and "--request-timeout-sec" not in bench
    assert flag(bench, "--request-rate") == "2.5"
    assert "--disable-stream" in bench and "--disable-stream" in builtin
    shared = builtin[3 : builtin.index("--request-timeout-sec")]
    assert bench[3 : 3 + len(shared)] == shared
    for name in ("--dataset-name", "--random-range-ratio", "--output-details", "--tag"):
        assert name in bench


def test_both_clients_keep_special_token_text_with_bench_sampling_params():
    for kind, extra in (("builtin", {}), ("bench_serving", {"tokenizer": "/tok"})):
        argv = client_argv(
            kind=kind, workload=WORKLOAD, base_url="u", output_file="o", tag="t", **extra
        )
        body = json.loads(flag(argv, "--extra-request-body"))
        assert body == {
            "sampling_params": {
                "temperature": 0.0,
                "max_new_tokens": WORKLOAD.output_len,
                "ignore_eos": True,
                "skip_special_tokens": False,
            }
        }


def test_bench_serving_needs_a_tokenizer():
    with pytest.raises(ConfigError, match="tokenizer"):
        client_argv(kind="bench_serving", workload=WORKLOAD, base_url="u", output_file="o", tag="t")


@pytest.mark.parametrize(
    ("version", "module"),
    [
        ("0.5.23", "sglang.benchmark.serving"),
        ("0.5.18", "sglang.benchmark.serving"),
        ("v0.5.20-cu129-amd64", "sglang.benchmark.serving"),
        ("0.5.17", "sglang.benchmark.serving"),  # seen in the 0.5.17 wheel (H200 rehearsal)
        ("0.5.16", "sglang.bench_serving"),
        ("0.5.10.post1", "sglang.bench_serving"),
        ("0.4.10.post2", "sglang.bench_serving"),
        ("latest", "sglang.benchmark.serving"),
    ],
)
def test_bench_module_by_version(version, module):
    assert bench_module(version) == module


def test_old_sglang_uses_the_old_module_name():
    argv = client_argv(
        kind="bench_serving",
        workload=WORKLOAD,
        base_url="u",
        output_file="o",
        tag="t",
        tokenizer="/tok",
        sglang_version="0.5.9",
    )
    assert argv[1:3] == ["-m", "sglang.bench_serving"]


def test_client_env():
    assert client_env("bench_serving") == {"HF_HUB_OFFLINE": "1"}
    assert client_env("builtin") == {}
