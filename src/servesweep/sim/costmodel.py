"""Step-time and KV-memory cost model of the simulated engine (all coefficients in one place).

Units: seconds of *simulated* time. "Single-GPU" coefficients are the work one GPU would
need; they are divided by the parallel speedup `gpus ** parallel_exponent` of the topology
(gpus = tp_size * pp_size, SGLang's world size). Communication and per-step terms are not.

One scheduler step costs (before noise)::

    overhead   = step_overhead_s + node_sync_s * (nnodes - 1) + pp_stage_s * (pp_size - 1)
    prefill    = n * (dense + moe * runner_factor) / speedup * (1 + prefill_half_tokens / n)
               + n * comm_per_token
               + sum over chunks of attn_s_per_token_ctx / speedup * tokens * (ctx + tokens / 2)
    decode     = (decode_weights_s + decode_s_per_seq * seqs
                  + decode_attn_s_per_ctx_token * sum(context)
                  + decode_attn_s_per_max_ctx_token * max(context)) / speedup  (if seqs > 0)

with n the prefill tokens of the step and ctx the tokens of that request already prefilled.
`1 + prefill_half_tokens / n` is the GEMM efficiency of small prefill batches (bigger chunks
are cheaper per token, and there are fewer per-step overheads). `comm_per_token` is the
TP all-reduce and EP all-to-all traffic, `internode_factor` times dearer when the group spans
nodes. The default coefficients are calibrated on the seed-000 reference (Kimi-class MoE,
TP32/EP32 on 4 nodes x 8 GPUs, marlin): a 16K-token prompt prefills in ~5 s, a decode step of
16 requests at 16K context takes ~40 ms; flashinfer_mxfp4 is 12 % faster on the MoE part
(~5 % on the whole prefill). Step times are multiplied by lognormal noise (`noise_sigma`) in
the scheduler. Named, calibrated coefficient sets live in `profiles.py`.

Pipeline parallelism: by default (`pp_pipeline=False`) PP is treated like more GPUs plus
`pp_stage_s` per extra stage and step. With `pp_pipeline=True` the scheduler runs SGLang's
micro-batch pipeline instead: a step is one pipeline *tick* costing `overhead` plus the
per-stage compute above (the batch's work over all tp x pp GPUs) of the slowest micro-batch in
flight; a micro-batch completes `pp_size` ticks after it entered, so one batch alone sees pp x
the per-stage time (latency) while pp micro-batches of different requests overlap (throughput).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

# MoE-part speed of each --moe-runner-backend relative to marlin (lower is faster).
# Unknown/experimental runners default to 1.0.
MOE_RUNNER_FACTORS: Mapping[str, float] = MappingProxyType(
    {
        "marlin": 1.00,
        "experimental_sgl_marlin": 0.99,
        "auto": 0.97,
        "triton": 1.04,
        "triton_kernel": 1.02,
        "flashinfer_mxfp4": 0.88,
        "flashinfer_cutlass": 0.93,
        "flashinfer_trtllm": 0.90,
        "flashinfer_trtllm_routed": 0.91,
        "flashinfer_cutedsl": 0.94,
        "deep_gemm": 0.92,
        "cutlass": 0.95,
    }
)


@dataclass(frozen=True)
class Topology:
    """The parallel layout of one server (what `sglang.launch_server` flags say)."""

    tp_size: int = 1
    ep_size: int = 1
    dp_size: int = 1
    pp_size: int = 1
    nnodes: int = 1
    moe_runner_backend: str = "auto"

    @property
    def gpus(self) -> int:
        return self.tp_size * self.pp_size


@dataclass(frozen=True)
class CostModel:
    """Coefficients of the step-time and memory model (see the module docstring)."""

    step_overhead_s: float = 0.012
    node_sync_s: float = 0.004
    pp_stage_s: float = 0.003
    parallel_exponent: float = 0.9
    prefill_dense_s_per_token: float = 2.17e-3
    prefill_moe_s_per_token: float = 2.65e-3
    prefill_half_tokens: float = 512.0
    attn_s_per_token_ctx: float = 1.265e-7
    tp_comm_s_per_token: float = 6.3e-6
    ep_comm_s_per_token: float = 6.3e-6
    internode_factor: float = 3.0
    decode_weights_s: float = 0.226
    decode_s_per_seq: float = 4.5e-3
    decode_attn_s_per_ctx_token: float = 2.6e-7
    # Latency-bound part of decode attention: grows with the longest context in the batch.
    decode_attn_s_per_max_ctx_token: float = 0.0
    noise_sigma: float = 0.03
    pp_pipeline: bool = False
    moe_runner_factors: Mapping[str, float] = field(default_factory=lambda: MOE_RUNNER_FACTORS)
    # KV memory model: per-GPU HBM, model weights (sharded over gpus), KV bytes per token.
    hbm_gb_per_gpu: float = 96.0
    weights_gb: float = 400.0
    reserved_gb_per_gpu: float = 2.0
    kv_bytes_per_token: float = 70_000.0
    default_mem_fraction_static: float = 0.85
    min_kv_tokens: int = 131_072
    context_length: int = 262_144

    def runner_factor(self, backend: str | None) -> float:
        """MoE-part speed factor of a runner (1.0 when unknown)."""
        return self.moe_runner_factors.get(backend or "auto", 1.0)


@dataclass(frozen=True)
class StepCost:
    """Coefficients resolved for one topology: what a scheduler step needs."""

    overhead_s: float
    prefill_s_per_token: float
    prefill_half_tokens: float
    comm_s_per_token: float
    attn_s_per_token_ctx: float
    decode_base_s: float
    decode_s_per_seq: float
    decode_attn_s_per_ctx_token: float
    noise_sigma: float
    decode_attn_s_per_max_ctx_token: float = 0.0
    pipeline_stages: int = 1


@dataclass(frozen=True)
class PrefillChunk:
    """`tokens` prompt tokens of one request prefilled in a step after `context` earlier ones."""

    tokens: int
    context: int = 0


def speedup(*, model: CostModel, gpus: int) -> float:
    """Parallel speedup of `gpus` GPUs over one (sub-linear)."""
    return max(1, gpus) ** model.parallel_exponent


def step_cost(*, model: CostModel, topology: Topology) -> StepCost:
    """Resolve the coefficients of `model` for one topology."""
    t = topology
    s = speedup(model=model, gpus=t.gpus)
    spans_nodes = t.nnodes > 1
    tp_comm = model.tp_comm_s_per_token * (1 - 1 / t.tp_size)
    ep_comm = model.ep_comm_s_per_token * (1 - 1 / t.ep_size)
    if spans_nodes:
        tp_comm *= model.internode_factor
        per_node = max(1, t.gpus // t.nnodes)
        if t.ep_size > per_node:
            ep_comm *= model.internode_factor
    moe = model.prefill_moe_s_per_token * model.runner_factor(t.moe_runner_backend)
    return StepCost(
        overhead_s=model.step_overhead_s
        + model.node_sync_s * (t.nnodes - 1)
        + model.pp_stage_s * (t.pp_size - 1),
        prefill_s_per_token=(model.prefill_dense_s_per_token + moe) / s,
        prefill_half_tokens=model.prefill_half_tokens,
        comm_s_per_token=tp_comm + ep_comm,
        attn_s_per_token_ctx=model.attn_s_per_token_ctx / s,
        decode_base_s=model.decode_weights_s / s,
        decode_s_per_seq=model.decode_s_per_seq / s,
        decode_attn_s_per_ctx_token=model.decode_attn_s_per_ctx_token / s,
        noise_sigma=model.noise_sigma,
        decode_attn_s_per_max_ctx_token=model.decode_attn_s_per_max_ctx_token / s,
        pipeline_stages=t.pp_size if model.pp_pipeline else 1,
    )


def step_time(
    *, cost: StepCost, prefill: Sequence[PrefillChunk] = (), decode_contexts: Sequence[int] = ()
) -> float:
    """Noise-free simulated duration of one step (prefill chunks + one decode token per seq)."""
    return cost.overhead_s + step_work(cost=cost, prefill=prefill, decode_contexts=decode_contexts)


def step_work(
    *, cost: StepCost, prefill: Sequence[PrefillChunk] = (), decode_contexts: Sequence[int] = ()
) -> float:
    """The compute part of `step_time` (no per-step overhead): one pipeline stage's share."""
    total = 0.0
    n = sum(c.tokens for c in prefill)
    if n > 0:
        total += n * cost.prefill_s_per_token * (1 + cost.prefill_half_tokens / n)
        total += n * cost.comm_s_per_token
        total += sum(
            cost.attn_s_per_token_ctx * c.tokens * (c.context + c.tokens / 2) for c in prefill
        )
    if decode_contexts:
        total += cost.decode_base_s
        total += cost.decode_s_per_seq * len(decode_contexts)
        total += cost.decode_attn_s_per_ctx_token * sum(decode_contexts)
        total += cost.decode_attn_s_per_max_ctx_token * max(decode_contexts)
    return total


def max_total_num_tokens(
    *,
    model: CostModel,
    topology: Topology,
    mem_fraction_static: float | None = None,
    kv_cache_dtype: str | None = None,
) -> int:
    """KV-cache capacity in tokens (toy memory model, floored at `min_kv_tokens`)."""
    frac = mem_fraction_static or model.default_mem_fraction_static
    free_gb = (
        model.hbm_gb_per_gpu * frac - model.weights_gb / topology.gpus - model.reserved_gb_per_gpu
    )
    per_token = model.kv_bytes_per_token
    if kv_cache_dtype and ("fp8" in kv_cache_dtype or "fp4" in kv_cache_dtype):
        per_token /= 2 if "fp8" in kv_cache_dtype else 4
    tokens = int(free_gb * 1e9 / per_token) if free_gb > 0 else 0
    return max(model.min_kv_tokens, tokens)


def prefill_seconds(*, cost: StepCost, prompt_tokens: int, chunk: int | None = None) -> float:
    """Noise-free time to prefill one prompt alone in chunks of `chunk` (None: one step); with
    a micro-batch pipeline each chunk passes all stages before the next one starts."""
    size = chunk if chunk and chunk > 0 else prompt_tokens
    total, done = 0.0, 0
    while done < prompt_tokens:
        take = min(size, prompt_tokens - done)
        chunk_s = step_time(cost=cost, prefill=[PrefillChunk(tokens=take, context=done)])
        total += chunk_s * cost.pipeline_stages
        done += take
    return total


def noise_factor(*, sigma: float, gauss: float) -> float:
    """Lognormal multiplier exp(sigma * z) for a standard-normal draw z."""
    return math.exp(sigma * gauss)
