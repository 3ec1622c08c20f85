"""Cost model: calibration scale, runner ordering, topology and chunk effects (no sleeping)."""

from __future__ import annotations

import dataclasses

import pytest

from servesweep.sim.costmodel import (
    CostModel,
    PrefillChunk,
    Topology,
    max_total_num_tokens,
    prefill_seconds,
    step_cost,
    step_time,
)

REF = Topology(tp_size=32, ep_size=32, pp_size=1, nnodes=4, moe_runner_backend="marlin")


def cost(**changes: object):
    return step_cost(model=CostModel(), topology=dataclasses.replace(REF, **changes))


def test_reference_prefill_of_16k_takes_3_to_8_simulated_seconds() -> None:
    for chunk in (8192, 16384, None):
        seconds = prefill_seconds(cost=cost(), prompt_tokens=16384, chunk=chunk)
        assert 3.0 <= seconds <= 8.0, (chunk, seconds)


def test_reference_decode_step_takes_30_to_60_ms() -> None:
    for contexts in ([100], [16384] * 16, [4096] * 64):
        ms = 1000 * step_time(cost=cost(), decode_contexts=contexts)
        assert 30.0 <= ms <= 60.0, (len(contexts), ms)


def test_flashinfer_mxfp4_is_a_few_to_15_percent_faster_than_marlin_on_the_moe_part() -> None:
    model = CostModel()
    gain = 1 - model.runner_factor("flashinfer_mxfp4") / model.runner_factor("marlin")
    assert 0.02 <= gain <= 0.15
    marlin = prefill_seconds(cost=cost(), prompt_tokens=16384, chunk=8192)
    mxfp4 = prefill_seconds(
        cost=cost(moe_runner_backend="flashinfer_mxfp4"), prompt_tokens=16384, chunk=8192
    )
    assert mxfp4 < marlin
    assert (marlin - mxfp4) / marlin < gain  # only the MoE part gets faster


def test_unknown_runner_costs_like_marlin() -> None:
    assert CostModel().runner_factor("megamoe") == 1.0


def test_more_gpus_are_faster_per_token_and_more_nodes_add_communication() -> None:
    one_node = step_cost(model=CostModel(), topology=Topology(tp_size=8, ep_size=8))
    four_nodes = cost()
    assert four_nodes.prefill_s_per_token < one_node.prefill_s_per_token
    assert four_nodes.comm_s_per_token > one_node.comm_s_per_token
    assert four_nodes.overhead_s > one_node.overhead_s
    # Same 32 GPUs: a layout spread over more nodes pays more per step.
    two_nodes = cost(nnodes=2)
    assert step_time(cost=four_nodes, decode_contexts=[1000]) > step_time(
        cost=two_nodes, decode_contexts=[1000]
    )


def test_pipeline_stages_add_per_step_overhead() -> None:
    flat = step_cost(model=CostModel(), topology=Topology(tp_size=8, ep_size=8, nnodes=1))
    piped = step_cost(model=CostModel(), topology=Topology(tp_size=4, ep_size=4, pp_size=2))
    assert piped.overhead_s > flat.overhead_s


def test_bigger_chunks_prefill_faster_fewer_steps_and_better_gemm_efficiency() -> None:
    times = [prefill_seconds(cost=cost(), prompt_tokens=16384, chunk=c) for c in (2048, 8192)]
    assert times[0] > times[1]


def test_attention_term_grows_with_context_already_prefilled() -> None:
    c = cost()
    early = step_time(cost=c, prefill=[PrefillChunk(tokens=4096, context=0)])
    late = step_time(cost=c, prefill=[PrefillChunk(tokens=4096, context=12288)])
    assert late > early


def test_decode_cost_grows_with_batch_but_less_than_linearly() -> None:
    c = cost()
    one = step_time(cost=c, decode_contexts=[1024])
    sixteen = step_time(cost=c, decode_contexts=[1024] * 16)
    assert one < sixteen < 16 * one


def test_kv_capacity_follows_gpus_memory_fraction_and_dtype() -> None:
    model = CostModel()
    tp8 = max_total_num_tokens(model=model, topology=Topology(tp_size=8, ep_size=8))
    tp32 = max_total_num_tokens(model=model, topology=REF)
    assert tp32 > tp8
    assert max_total_num_tokens(model=model, topology=REF, mem_fraction_static=0.9) > tp32
    assert max_total_num_tokens(model=model, topology=REF, kv_cache_dtype="fp8_e4m3") > tp32
    tiny = max_total_num_tokens(model=model, topology=Topology())
    assert tiny == model.min_kv_tokens


@pytest.mark.parametrize("field", ["prefill_moe_s_per_token", "step_overhead_s"])
def test_coefficients_are_in_one_frozen_dataclass(field: str) -> None:
    model = CostModel()
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(model, field, 0.0)
    faster = dataclasses.replace(model, **{field: getattr(model, field) / 2})
    slow = step_cost(model=model, topology=REF)
    fast = step_cost(model=faster, topology=REF)
    chunk = [PrefillChunk(tokens=8192)]
    assert step_time(cost=fast, prefill=chunk) < step_time(cost=slow, prefill=chunk)
