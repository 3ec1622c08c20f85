"""Contract: SGLang's own bench_serving (0.5.23 wheel) against the sim, versus the builtin."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from servesweep.config.schema import Workload
from servesweep.measure.loadgen import API_KEY_ENV, client_argv, client_env
from servesweep.measure.loadgen.builtin import sample_rows
from servesweep.measure.loadgen.metrics import BUILTIN_EXTRA_KEYS, RequestResult, compute_metrics
from servesweep.measure.recordkeys import DETAIL_KEYS, RECORD_KEYS
from servesweep.measure.records import read_record
from servesweep.measure.validation import record_problems
from tests.support.sglang_bench import bench_env
from tests.support.sim import running_sim, sim_available

pytestmark = pytest.mark.contract

WORKLOAD = Workload(
    input_len=512, output_len=4, num_requests=8, concurrency=4, warmup_requests=1, seed=42
)
RUN_TIMEOUT_S = 300  # a guard against a hung client, not an assertion


def run(argv: list[str], *, env: dict[str, str], cwd: Path, log: Path) -> int:
    with open(log, "w") as fh:
        res = subprocess.run(
            argv, env=env, cwd=cwd, stdout=fh, stderr=subprocess.STDOUT, timeout=RUN_TIMEOUT_S
        )
    return res.returncode


def bench_argv(*, port: int, tokenizer: Path, output: Path, tag: str) -> list[str]:
    """The exact command of the contract (SGLANG.md section 2 recipe)."""
    return [
        sys.executable,
        "-m",
        "sglang.benchmark.serving",
        "--backend",
        "sglang",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dataset-name",
        "random-ids",
        "--random-input-len",
        "512",
        "--random-output-len",
        "4",
        "--random-range-ratio",
        "1.0",
        "--num-prompts",
        "8",
        "--max-concurrency",
        "4",
        "--tokenizer",
        str(tokenizer),
        "--model",
        str(tokenizer),
        "--tokenize-prompt",
        "--output-file",
        str(output),
        "--output-details",
        "--tag",
        tag,
        "--warmup-requests",
        "1",
        "--disable-tqdm",
    ]


def builtin_run(*, base_url: str, output: Path, log: Path, tag: str) -> int:
    argv = client_argv(
        kind="builtin", workload=WORKLOAD, base_url=base_url, output_file=str(output), tag=tag
    )
    env = {**os.environ, **client_env("builtin")}
    return run([*argv, "--disable-tqdm"], env=env, cwd=output.parent, log=log)


needs_sim = pytest.mark.skipif(not sim_available(), reason="servesweep.sim not written yet")


@needs_sim
def test_bench_record_parses_validates_and_agrees_with_builtin(
    staged_bench, tokenizer_dir, tmp_path
):
    bench_out = tmp_path / "bench.jsonl"
    builtin_out = tmp_path / "builtin.jsonl"
    env = bench_env(staged=staged_bench)
    with running_sim(log_path=tmp_path / "sim.log") as sim:
        argv = bench_argv(port=sim.port, tokenizer=tokenizer_dir, output=bench_out, tag="c1")
        rc = run(argv, env=env, cwd=tmp_path, log=tmp_path / "bench.log")
        assert rc == 0, (tmp_path / "bench.log").read_text()[-3000:]
        rc = builtin_run(
            base_url=sim.base_url, output=builtin_out, log=tmp_path / "builtin.log", tag="c1"
        )
        assert rc == 0, (tmp_path / "builtin.log").read_text()[-3000:]

    bench = read_record(bench_out)
    assert record_problems(bench, WORKLOAD) == []
    assert bench.tag == "c1" and bench.completed == 8
    assert isinstance(bench.server_info, dict)

    builtin = read_record(builtin_out)
    assert record_problems(builtin, WORKLOAD) == []

    bench_keys = list(json.loads(bench_out.read_text()))
    builtin_keys = list(json.loads(builtin_out.read_text()))
    assert bench_keys == [*RECORD_KEYS, *DETAIL_KEYS]
    assert [k for k in builtin_keys if k not in BUILTIN_EXTRA_KEYS] == bench_keys
    assert set(builtin_keys) - set(bench_keys) == set(BUILTIN_EXTRA_KEYS)

    for key in ("completed", "total_input_tokens", "total_output_tokens"):
        assert getattr(builtin, key) == getattr(bench, key), key
    assert builtin.input_lens == bench.input_lens and builtin.output_lens == bench.output_lens
    assert [len(x) for x in builtin.itls] == [len(x) for x in bench.itls]
    # the noisy sim's text re-tokenizes with drift (suffix pieces merge), never more tokens
    assert 0.5 <= bench.total_output_tokens_retokenized / bench.total_output_tokens <= 1


@needs_sim
def test_midstream_error_is_a_bench_success_but_a_record_problem(
    staged_bench, tokenizer_dir, tmp_path
):
    # generate indices: bench = warmup 0, requests 1..8; builtin = warmup 9, requests 10..17
    bench_out = tmp_path / "bench.jsonl"
    builtin_out = tmp_path / "builtin.jsonl"
    args = ["--sim-midstream-error-at", "2,11"]
    with running_sim(log_path=tmp_path / "sim.log", args=args) as sim:
        argv = client_argv(
            kind="bench_serving",
            workload=WORKLOAD,
            base_url=sim.base_url,
            output_file=str(bench_out),
            tag="fault",
            python=sys.executable,
            tokenizer=str(tokenizer_dir),
        )
        env = {**bench_env(staged=staged_bench), **client_env("bench_serving")}
        rc = run([*argv, "--disable-tqdm"], env=env, cwd=tmp_path, log=tmp_path / "bench.log")
        assert rc == 0, (tmp_path / "bench.log").read_text()[-3000:]
        rc = builtin_run(
            base_url=sim.base_url, output=builtin_out, log=tmp_path / "builtin.log", tag="fault"
        )
        assert rc == 0, (tmp_path / "builtin.log").read_text()[-3000:]

    bench = read_record(bench_out)
    assert bench.completed == 8 and all(e == "" for e in bench.errors)  # silent in bench
    problems = record_problems(bench, WORKLOAD)
    joined = " | ".join(problems)
    assert "1 request(s) with ttft 0" in joined, problems
    # 1 of 8 texts missing: drift-sized (0.875), a warning; the ttft-0 request is what fails it
    assert "retokenized" not in joined, problems

    builtin = read_record(builtin_out)  # the builtin reports the fault as a failed request
    assert builtin.completed == 7
    assert sum(1 for e in builtin.errors if e.startswith("mid-stream error")) == 1
    assert any(
        "failed; first error: mid-stream error" in p for p in record_problems(builtin, WORKLOAD)
    )


ONE_TOKEN = Workload(
    input_len=256, output_len=1, num_requests=8, concurrency=4, warmup_requests=1, seed=42
)


@needs_sim
def test_special_token_outputs_get_a_ttft_from_bench_with_our_sampling_params(
    staged_bench, tokenizer_dir, tmp_path
):
    """Every 1-token output is a special token (SGLang skips its text by default). bench_serving
    stamps TTFT only on non-empty text: with its own payload every request reads ttft 0, like a
    silent failure; with ours (`skip_special_tokens: false`) every first token is timed."""
    env = {**bench_env(staged=staged_bench), **client_env("bench_serving")}
    ours, plain = tmp_path / "ours.jsonl", tmp_path / "plain.jsonl"
    with running_sim(log_path=tmp_path / "sim.log", args=["--sim-special-rate", "1"]) as sim:
        argv = client_argv(
            kind="bench_serving",
            workload=ONE_TOKEN,
            base_url=sim.base_url,
            output_file=str(ours),
            tag="ours",
            tokenizer=str(tokenizer_dir),
        )
        rc = run([*argv, "--disable-tqdm"], env=env, cwd=tmp_path, log=tmp_path / "ours.log")
        assert rc == 0, (tmp_path / "ours.log").read_text()[-3000:]
        cut = argv.index("--extra-request-body")
        plain_argv = [*argv[:cut], *argv[cut + 2 :]]
        plain_argv[plain_argv.index(str(ours))] = str(plain)
        rc = run([*plain_argv, "--disable-tqdm"], env=env, cwd=tmp_path, log=tmp_path / "p.log")
        assert rc == 0, (tmp_path / "p.log").read_text()[-3000:]

    record = read_record(ours)
    assert record_problems(record, ONE_TOKEN) == []
    assert all(t > 0 for t in record.ttfts) and all(record.generated_texts)
    without = read_record(plain)
    assert all(t == 0 for t in without.ttfts) and not any(without.generated_texts)
    assert any("8 request(s) with ttft 0" in p for p in record_problems(without, ONE_TOKEN))


BENCH_SAMPLER = """
import json, sys
import numpy as np
from transformers import AutoTokenizer
from sglang.benchmark.datasets.random import sample_random_requests
tok = AutoTokenizer.from_pretrained(sys.argv[1])
np.random.seed(int(sys.argv[2]))
rows = sample_random_requests(input_len=40, output_len=6, num_prompts=10, range_ratio=0.25,
    tokenizer=tok, dataset_path="", random_sample=False, return_text=False)
gaps = [float(np.random.exponential(1 / 4.0)) for _ in rows]
print("RESULT" + json.dumps({"vocab": tok.vocab_size, "gaps": gaps,
    "rows": [[r.prompt, r.prompt_len, r.output_len] for r in rows]}))
"""


def bench_python(code: str, args: list[str], *, staged: Path, cwd: Path) -> dict:
    res = subprocess.run(
        [sys.executable, "-c", code, *args],
        env=bench_env(staged=staged),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    line = next(x for x in res.stdout.splitlines() if x.startswith("RESULT"))
    return json.loads(line.removeprefix("RESULT"))


def test_builtin_prompts_and_arrivals_equal_bench_sampler(staged_bench, tokenizer_dir, tmp_path):
    got = bench_python(BENCH_SAMPLER, [str(tokenizer_dir), "9"], staged=staged_bench, cwd=tmp_path)
    rng = np.random.RandomState(9)
    rows = sample_rows(
        rng=rng,
        num_prompts=10,
        input_len=40,
        output_len=6,
        range_ratio=0.25,
        vocab_size=got["vocab"],
    )
    assert [[r.input_ids(got["vocab"]), r.input_len, r.output_len] for r in rows] == got["rows"]
    assert [float(rng.exponential(1 / 4.0)) for _ in rows] == got["gaps"]


BENCH_METRICS = """
import dataclasses, json, sys
from transformers import AutoTokenizer
from sglang.benchmark.datasets.common import DatasetRow
from sglang.benchmark.serving import RequestFuncOutput, calculate_metrics
tok = AutoTokenizer.from_pretrained(sys.argv[1])
data = json.loads(sys.stdin.read())
rows = [DatasetRow(prompt=[0], prompt_len=r["input_len"], output_len=0) for r in data]
outs = []
for r in data:
    o = RequestFuncOutput(generated_text=r["generated_text"], success=r["success"],
        latency=r["latency"], ttft=r["ttft"], itl=r["itl"], prompt_len=r["prompt_len"],
        error=r["error"], output_len=r["output_len"], start_time=r["start_time"])
    outs.append(o)
m, lens = calculate_metrics(input_requests=rows, outputs=outs, dur_s=3.5, tokenizer=tok,
    backend="sglang")
print("RESULT" + json.dumps({"metrics": dataclasses.asdict(m), "output_lens": lens}))
"""

# BenchmarkMetrics field -> record key where they differ
METRIC_NAMES = {
    "total_input": "total_input_tokens",
    "total_input_text": "total_input_text_tokens",
    "total_input_vision": "total_input_vision_tokens",
    "total_output": "total_output_tokens",
    "total_output_retokenized": "total_output_tokens_retokenized",
}


def test_metrics_equal_bench_calculate_metrics(staged_bench, tokenizer_dir, tmp_path):
    rng = np.random.default_rng(3)
    results = []
    for i in range(30):
        itl = [float(x) for x in rng.uniform(0.001, 0.2, size=int(rng.integers(0, 6)))]
        ok = i % 7 != 3
        results.append(
            RequestResult(
                input_len=int(rng.integers(10, 100)),
                prompt_len=int(rng.integers(10, 100)),
                success=ok,
                latency=float(rng.uniform(0.3, 0.5)) + sum(itl) if ok else 0.0,
                ttft=float(rng.uniform(0.01, 0.3)) if ok else 0.0,
                itl=itl if ok else [],
                output_len=len(itl) + 1 if ok else 0,
                generated_text=" tok" * (len(itl) + 1) if ok else "",
                error="" if ok else "Internal Server Error: x",
                start_time=100.0 + float(rng.uniform(0, 2.5)),
            )
        )
    res = subprocess.run(
        [sys.executable, "-c", BENCH_METRICS, str(tokenizer_dir)],
        input=json.dumps([r.__dict__ for r in results]),
        env=bench_env(staged=staged_bench),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(next(x for x in res.stdout.splitlines() if x.startswith("RESULT"))[6:])
    ours = compute_metrics(results=results, duration_s=3.5)
    not_recorded = {"output_throughput_retokenized", "total_throughput_retokenized"}
    assert set(got["metrics"]) - not_recorded == {
        name for name in got["metrics"] if METRIC_NAMES.get(name, name) in ours
    }
    for name, value in got["metrics"].items():
        if name not in not_recorded:
            key = METRIC_NAMES.get(name, name)
            assert ours[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key
    assert [r.output_len if r.success else 0 for r in results] == got["output_lens"]


@needs_sim
def test_bench_sends_the_api_key_from_openai_api_key(staged_bench, tokenizer_dir, tmp_path):
    """bench_serving sends `Authorization: Bearer $OPENAI_API_KEY` (its get_auth_headers: the
    variable the workflow gives every client, docs/access.md); without it the keyed sim answers
    401 and nothing completes."""
    key = "contract-key-0123456789"
    env = {k: v for k, v in bench_env(staged=staged_bench).items() if k != API_KEY_ENV}
    with running_sim(log_path=tmp_path / "sim.log", args=["--api-key", key]) as sim:
        keyed = tmp_path / "keyed.jsonl"
        argv = bench_argv(port=sim.port, tokenizer=tokenizer_dir, output=keyed, tag="k")
        rc = run(argv, env={**env, API_KEY_ENV: key}, cwd=tmp_path, log=tmp_path / "keyed.log")
        assert rc == 0, (tmp_path / "keyed.log").read_text()[-3000:]
        assert read_record(keyed).completed == 8
        bare = tmp_path / "bare.jsonl"
        argv = bench_argv(port=sim.port, tokenizer=tokenizer_dir, output=bare, tag="b")
        argv += ["--ready-check-timeout-sec", "0"]
        rc = run(argv, env=env, cwd=tmp_path, log=tmp_path / "bare.log")
    assert rc != 0 and "Unauthorized" in (tmp_path / "bare.log").read_text()
