"""`python -m servesweep.sim`: `sglang.launch_server`'s flags (argparse, unknown = error)."""

from __future__ import annotations

import argparse
import json
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

from servesweep.sim.profiles import DEFAULT_PROFILE, PROFILES
from servesweep.sim.tokens import SPECIAL_RATE

logger = logging.getLogger(__name__)

# JSON object with the fault flags' keys (fail_start, crash_after, http_500_at,
# midstream_error_at, hang_at; a `sim_` prefix and dashes are accepted too), merged with the
# --sim-* flags: lists are united, a flag given on the command line wins for scalars.
FAULTS_ENV = "SERVESWEEP_SIM_FAULTS"
FAULT_KEYS = (
    "fail_start",
    "crash_after",
    "crash_kind",
    "http_500_at",
    "midstream_error_at",
    "hang_at",
)
CRASH_KINDS = ("scheduler", "detokenizer", "native")

# --moe-runner-backend choices of sglang 0.5.23 (SGLANG.md section 3).
MOE_RUNNER_BACKENDS = (
    "auto",
    "deep_gemm",
    "triton",
    "triton_kernel",
    "flashinfer_trtllm",
    "flashinfer_cutlass",
    "flashinfer_mxfp4",
    "flashinfer_cutedsl",
    "cutlass",
    "experimental_sgl_trtllm",
    "flashinfer_trtllm_routed",
    "flashinfer_megamoe",
    "aiter",
    "marlin",
    "humming",
    "experimental_sgl_marlin",
    "lora_cutedsl",
    "lora_triton",
    "lora_marlin",
    "hpc_ops",
    "megamoe",
    "intel_xpu",
)
DISAGGREGATION_MODES = ("null", "prefill", "decode")
TRANSFER_BACKENDS = ("mooncake", "nixl", "ascend", "fake", "mori", "mooncake_tcp")
DEFAULT_DIST_TIMEOUT_S = 600


def _index_list(value: str) -> list[int]:
    try:
        items = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {value!r}"
        ) from None
    if any(i < 0 for i in items):
        raise argparse.ArgumentTypeError(f"indices must be >= 0, got {value!r}")
    return items


# SGLang's `--load-format` choices the sim accepts (it loads no weights either way).
LOAD_FORMATS = ("auto", "pt", "safetensors", "npcache", "dummy")


class _Removed(argparse.Action):
    """A flag the mirrored SGLang release no longer takes: exit 2 naming its successor."""

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[no-untyped-def]
        parser.error(f"{option_string}: removed in SGLang 0.5.20; use --cuda-graph-max-bs-decode")


def _json_object(value: str) -> str:
    """`--json-model-override-args`: a JSON object, as SGLang's json.loads of it needs."""
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(parsed, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object, got {value!r}")
    return value


def _nonnegative_float(value: str) -> float:
    f = float(value)
    if not f >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value!r}")
    return f


def build_parser() -> argparse.ArgumentParser:
    """The parser: SGLang's flags the workflow emits, a few more it may pass, and --sim-*."""
    p = argparse.ArgumentParser(
        prog="python -m servesweep.sim",
        description="Simulated SGLang server (drop-in for python3 -m sglang.launch_server).",
    )
    add = p.add_argument
    add("--model-path", "--model", dest="model_path", type=str, required=True)
    add("--served-model-name", type=str, default=None)
    add("--tokenizer-path", type=str, default=None)
    add("--host", type=str, default="127.0.0.1")
    add("--port", type=int, default=30000)
    add("--tp-size", "--tensor-parallel-size", dest="tp_size", type=int, default=1)
    add("--ep-size", "--expert-parallel-size", dest="ep_size", type=int, default=1)
    add("--dp-size", "--data-parallel-size", dest="dp_size", type=int, default=1)
    add("--pp-size", "--pipeline-parallel-size", dest="pp_size", type=int, default=1)
    add("--nnodes", type=int, default=1)
    add("--node-rank", type=int, default=0)
    add("--dist-init-addr", "--nccl-init-addr", dest="dist_init_addr", type=str, default=None)
    add("--dist-timeout", type=int, default=None)
    add("--moe-runner-backend", type=str, choices=MOE_RUNNER_BACKENDS, default="auto")
    add("--chunked-prefill-size", type=int, default=None)
    add("--max-prefill-tokens", type=int, default=16384)
    add("--page-size", type=int, default=None)
    add("--kv-cache-dtype", type=str, default="auto")
    add("--context-length", type=int, default=None)
    add("--disable-radix-cache", action="store_true")
    add("--mem-fraction-static", type=float, default=None)
    add("--max-running-requests", type=int, default=None)
    add("--trust-remote-code", action="store_true")
    add("--log-level", type=str, default="info")
    add("--enable-metrics", action="store_true")
    add("--api-key", type=str, default=None)  # SGLang: every endpoint but /health*, /metrics*
    add("--disaggregation-mode", type=str, choices=DISAGGREGATION_MODES, default="null")
    add("--disaggregation-bootstrap-port", type=int, default=8998)
    add("--disaggregation-ib-device", type=str, default=None)
    add(
        "--disaggregation-transfer-backend",
        type=str,
        choices=TRANSFER_BACKENDS,
        default="mooncake",
    )
    add("--skip-server-warmup", action="store_true")
    add("--watchdog-timeout", type=float, default=300.0)
    add("--speculative-algorithm", type=str, default=None)
    # SGLang 0.5.14+; 0.5.20+ refuses the old `--cuda-graph-max-bs` (ambiguous), which
    # argparse would otherwise take as this flag's abbreviation
    add("--cuda-graph-max-bs-decode", type=int, default=None)
    add("--cuda-graph-max-bs", action=_Removed, help=argparse.SUPPRESS)
    add("--load-format", type=str, choices=LOAD_FORMATS, default="auto")
    add("--json-model-override-args", type=_json_object, default="{}")
    sim = p.add_argument_group("simulator (not SGLang)")
    sim.add_argument(
        "--sim-time-scale",
        type=_nonnegative_float,
        default=1.0,
        help="wall seconds per simulated second (0.01: 100x faster than the modelled GPUs; "
        "0: zero-cost mode, no simulated compute at all, for benchmarking clients)",
    )
    sim.add_argument(
        "--sim-profile",
        type=str,
        choices=sorted(PROFILES),
        default=DEFAULT_PROFILE,
        help="named cost/transfer coefficients (profiles.py)",
    )
    sim.add_argument("--sim-seed", type=int, default=0, help="seed of the step-time noise")
    sim.add_argument(
        "--sim-startup-s", type=float, default=30.0, help="simulated weight loading before ready"
    )
    sim.add_argument(
        "--sim-fail-start", action="store_true", help="die during startup with a traceback"
    )
    sim.add_argument(
        "--sim-corrupt",
        action="store_true",
        help="answer requests that ask for logprobs with wrong tokens at full speed (a broken "
        "kernel, or on a PD decode server a KV transfer that hands it the wrong cache)",
    )
    sim.add_argument(
        "--sim-fail-transfer",
        action="store_true",
        help="a dead KV transfer on a PD prefill server: no request's KV reaches decode",
    )
    sim.add_argument(
        "--sim-reuse-port",
        action="store_true",
        help="bind the HTTP port with SO_REUSEPORT: several sim processes serve one port, the "
        "kernel spreading connections among them (a client benchmark on several sim cores)",
    )
    sim.add_argument(
        "--sim-clean",
        action="store_true",
        help="no benign noise: no startup warnings, disconnect tracebacks, text drift or "
        "special-token outputs",
    )
    sim.add_argument(
        "--sim-special-rate",
        type=float,
        default=SPECIAL_RATE,
        metavar="P",
        help="share of 1-token outputs that are a special token (empty text unless the request "
        "asks skip_special_tokens: false)",
    )
    sim.add_argument(
        "--sim-crash-after",
        type=int,
        default=None,
        metavar="N",
        help="crash at the first step with request N (0-based arrival order, health checks "
        "excluded) in flight: N requests before it may finish, it never does",
    )
    sim.add_argument(
        "--sim-crash-kind",
        choices=CRASH_KINDS,
        default=None,
        help="how the --sim-crash-after crash shows: the scheduler's traceback (default), the "
        "detokenizer process's crash header, or a native library's fatal signal (UCX "
        "Caught signal 11, the process dies of SIGSEGV)",
    )
    sim.add_argument(
        "--sim-http-500-at",
        type=_index_list,
        default=[],
        metavar="I,J",
        help="0-based request indices (arrival order, health checks excluded) that get HTTP 500",
    )
    sim.add_argument(
        "--sim-midstream-error-at",
        type=_index_list,
        default=[],
        metavar="I,J",
        help="request indices answered 200 with a data: {error} event then [DONE]",
    )
    sim.add_argument(
        "--sim-hang-at",
        type=_index_list,
        default=[],
        metavar="I,J",
        help="request indices that are never answered",
    )
    return p


def split_addr(addr: str) -> tuple[str, int]:
    """'host:port' (IPv6 as '[::1]:port') -> (host, port)."""
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"expected host:port, got {addr!r}")
    return host.strip("[]"), int(port)


def _index_items(value: Any, key: str) -> list[int]:
    if isinstance(value, str):
        return _index_list(value)
    if isinstance(value, list) and all(
        isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in value
    ):
        return list(value)
    raise ValueError(f"{key} must be a list of indices >= 0 or 'I,J', got {value!r}")


def parse_faults_env(text: str) -> dict[str, Any]:
    """The fault settings of `SERVESWEEP_SIM_FAULTS` (ValueError names what is wrong)."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ValueError("must be a JSON object")
    faults: dict[str, Any] = {}
    for name, value in raw.items():
        key = str(name).replace("-", "_").removeprefix("sim_")
        if key not in FAULT_KEYS:
            raise ValueError(f"unknown key {name!r} (keys: {', '.join(FAULT_KEYS)})")
        if key == "fail_start":
            if not isinstance(value, bool):
                raise ValueError(f"fail_start must be true or false, got {value!r}")
            faults[key] = value
        elif key == "crash_kind":
            if value not in CRASH_KINDS:
                raise ValueError(
                    f"crash_kind must be one of {', '.join(CRASH_KINDS)}, got {value!r}"
                )
            faults[key] = value
        elif key == "crash_after":
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 0
            ):
                raise ValueError(f"crash_after must be an integer >= 0 or null, got {value!r}")
            faults[key] = value
        else:
            try:
                faults[key] = _index_items(value, key)
            except argparse.ArgumentTypeError as exc:
                raise ValueError(f"{key}: {exc}") from None
    return faults


def apply_faults(ns: argparse.Namespace, faults: Mapping[str, Any]) -> None:
    """Merge env faults into the parsed flags (lists united, command-line scalars win)."""
    if faults.get("fail_start"):
        ns.sim_fail_start = True
    if ns.sim_crash_after is None and faults.get("crash_after") is not None:
        ns.sim_crash_after = faults["crash_after"]
    if ns.sim_crash_kind is None and faults.get("crash_kind") is not None:
        ns.sim_crash_kind = faults["crash_kind"]
    for key in ("http_500_at", "midstream_error_at", "hang_at"):
        attr = f"sim_{key}"
        setattr(ns, attr, sorted(set(getattr(ns, attr)) | set(faults.get(key, []))))


def parse_args(
    argv: Sequence[str] | None = None, *, env: Mapping[str, str] | None = None
) -> argparse.Namespace:
    """Parse and cross-check the flags (plus `SERVESWEEP_SIM_FAULTS` from `env`, default
    os.environ); errors exit 2 like argparse (and SGLang)."""
    parser = build_parser()
    ns = parser.parse_args(argv)
    env_text = (os.environ if env is None else env).get(FAULTS_ENV, "").strip()
    if env_text:
        try:
            apply_faults(ns, parse_faults_env(env_text))
        except ValueError as exc:
            parser.error(f"{FAULTS_ENV}: {exc}")
    if ns.nnodes < 1 or not 0 <= ns.node_rank < ns.nnodes:
        parser.error(f"--node-rank {ns.node_rank} must be in [0, --nnodes {ns.nnodes})")
    if ns.nnodes > 1:
        if not ns.dist_init_addr:
            parser.error("--dist-init-addr is required when --nnodes > 1")
        try:
            split_addr(ns.dist_init_addr)
        except ValueError as exc:
            parser.error(f"--dist-init-addr: {exc}")
    for name in ("tp_size", "ep_size", "dp_size", "pp_size"):
        if getattr(ns, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if ns.tp_size % ns.ep_size:
        parser.error(f"--ep-size {ns.ep_size} must divide --tp-size {ns.tp_size}")
    if ns.chunked_prefill_size is not None and (
        ns.chunked_prefill_size == 0 or ns.chunked_prefill_size < -1
    ):
        parser.error("--chunked-prefill-size must be positive or -1")
    if ns.sim_crash_after is not None and ns.sim_crash_after < 0:
        parser.error("--sim-crash-after must be >= 0")
    if ns.cuda_graph_max_bs_decode is not None and ns.cuda_graph_max_bs_decode < 1:
        parser.error("--cuda-graph-max-bs-decode must be >= 1")
    if ns.sim_startup_s < 0:
        parser.error("--sim-startup-s must be >= 0")
    return ns


def resolved_args(ns: argparse.Namespace) -> dict[str, Any]:
    """Every flag with defaults resolved the way SGLang reports them in /server_info."""
    args = dict(vars(ns))
    args["served_model_name"] = ns.served_model_name or ns.model_path
    args["tokenizer_path"] = ns.tokenizer_path or ns.model_path
    args["dist_timeout"] = ns.dist_timeout or DEFAULT_DIST_TIMEOUT_S
    return args
