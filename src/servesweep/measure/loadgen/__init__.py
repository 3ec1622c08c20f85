"""Load generator command lines: the builtin client or SGLang's bench_serving, same flags."""

from __future__ import annotations

import json
import re
import sys
from typing import TYPE_CHECKING, Any, Literal

from servesweep.core.errors import ConfigError

if TYPE_CHECKING:  # the client process imports this package: keep pydantic models out of it
    from servesweep.config.schema import Workload

ClientKind = Literal["builtin", "bench_serving"]

BUILTIN_MODULE = "servesweep.measure.loadgen.builtin"
# The 0.5.17 wheel (the H200 rehearsal's) already has sglang.benchmark.serving, with
# sglang.bench_serving a deprecated shim; when it moved before that is not checked.
BENCH_MODULE = "sglang.benchmark.serving"  # sglang >= 0.5.17
OLD_BENCH_MODULE = "sglang.bench_serving"  # sglang < 0.5.17 (later a deprecated shim)
BENCH_MODULE_SINCE = (0, 5, 17)


def _version_tuple(version: str) -> tuple[int, ...] | None:
    """Leading numeric components of a version ('0.5.10.post1' -> (0, 5, 10)); None if none."""
    match = re.match(r"v?(\d+(?:\.\d+)*)", version.strip())
    return tuple(int(x) for x in match.group(1).split(".")) if match else None


def bench_module(sglang_version: str) -> str:
    """The bench_serving module for an SGLang version (unparsable tags such as 'latest' or
    'dev' are taken to be new)."""
    parsed = _version_tuple(sglang_version)
    if parsed is not None and parsed < BENCH_MODULE_SINCE:
        return OLD_BENCH_MODULE
    return BENCH_MODULE


def client_argv(
    *,
    kind: ClientKind,
    workload: Workload,
    base_url: str,
    output_file: str,
    tag: str,
    python: str = sys.executable,
    tokenizer: str | None = None,
    sglang_version: str = "0.5.23",
) -> list[str]:
    """The argv of one client invocation for `workload` against the server at `base_url`.

    Both kinds get the same bench_serving flags; bench_serving also needs a local tokenizer
    directory (`--tokenizer T --model T --tokenize-prompt`), the builtin gets its
    `--request-timeout-sec`. `python` is the interpreter on the node that runs the client.
    bench_serving has no per-request timeout: the caller bounds its run time.
    """
    if kind == "builtin":
        head = [python, "-m", BUILTIN_MODULE]
    elif kind == "bench_serving":
        head = [python, "-m", bench_module(sglang_version)]
    else:
        raise ConfigError(f"client.kind: unknown client {kind!r}")
    argv = [
        *head,
        "--backend",
        "sglang",
        "--base-url",
        base_url,
        "--dataset-name",
        workload.dataset,
        "--random-input-len",
        str(workload.input_len),
        "--random-output-len",
        str(workload.output_len),
        "--random-range-ratio",
        "1.0",
        "--num-prompts",
        str(workload.num_requests),
        "--max-concurrency",
        str(workload.concurrency),
        "--request-rate",
        str(workload.request_rate),
        "--seed",
        str(workload.seed),
        "--warmup-requests",
        str(workload.warmup_requests),
        "--output-file",
        output_file,
        "--output-details",
        "--tag",
        tag,
        "--extra-request-body",
        json.dumps({"sampling_params": sampling_params(workload)}, separators=(",", ":")),
    ]
    if not workload.stream:
        argv.append("--disable-stream")
    if kind == "builtin":
        argv += ["--request-timeout-sec", str(workload.request_timeout_s)]
    else:
        if not tokenizer:
            raise ConfigError(
                "client.tokenizer: bench_serving needs a tokenizer directory on the client node"
            )
        argv += ["--tokenizer", tokenizer, "--model", tokenizer, "--tokenize-prompt"]
    return argv


def sampling_params(workload: Workload) -> dict[str, Any]:
    """The sampling params every request carries: bench_serving's own for a fixed output length
    (temperature 0, max_new_tokens, ignore_eos) plus `skip_special_tokens: false`.

    bench_serving stamps TTFT on the first chunk with non-empty text, so a 1-token output that is
    a special token (empty text when skipped, SGLang's default) would get TTFT 0, which is
    indistinguishable from a stream on which no token arrived (docs/validation.md). Its text
    kept, every request's first token is timed. `--extra-request-body` replaces bench_serving's
    whole `sampling_params`, hence all of them here (the workload's lengths are fixed: range
    ratio 1).
    """
    return {
        "temperature": 0.0,
        "max_new_tokens": workload.output_len,
        "ignore_eos": True,
        "skip_special_tokens": False,
    }


# The variable both clients take the server's API key from (bench_serving's get_auth_headers
# sends `Authorization: Bearer $OPENAI_API_KEY`, 0.5.9 and 0.5.23 alike).
API_KEY_ENV = "OPENAI_API_KEY"


def client_env(kind: ClientKind) -> dict[str, str]:
    """Extra environment for the client: bench_serving must not look anything up online."""
    return {"HF_HUB_OFFLINE": "1"} if kind == "bench_serving" else {}
