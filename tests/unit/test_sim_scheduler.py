"""Scheduler and offline simulation: chunking, batching, caps, arrivals, concurrency, noise."""

from __future__ import annotations

import dataclasses

import pytest

from servesweep.sim.costmodel import CostModel, Topology, prefill_seconds, step_cost
from servesweep.sim.offline import Arrival, simulate_arrivals, simulate_closed_loop
from servesweep.sim.scheduler import (
    BatchPolicy,
    RequestRejected,
    Scheduler,
    SimRequest,
    new_scheduler,
)

REF = Topology(tp_size=32, ep_size=32, nnodes=4, moe_runner_backend="marlin")
QUIET = dataclasses.replace(CostModel(), noise_sigma=0.0)


def sched(**kw: object) -> Scheduler:
    params: dict[str, object] = {"topology": REF, "model": QUIET, "seed": 0}
    params.update(kw)
    return new_scheduler(**params)  # type: ignore[arg-type]


def req(rid: str, prompt: int, out: int) -> SimRequest:
    return SimRequest(rid=rid, prompt_tokens=prompt, max_new_tokens=out)


def test_long_prompt_is_prefilled_over_several_steps_and_first_token_ends_the_last() -> None:
    s = sched(chunked_prefill_size=4096)
    r = req("a", 10000, 3)
    s.submit(r)
    steps = [s.step() for _ in range(3)]
    assert [x.prefill_tokens for x in steps] == [4096, 4096, 1808]
    assert [r in x.emitted for x in steps] == [False, False, True]
    assert r.first_token_at == steps[2].end and r.generated == 1
    assert steps[2].decode_seqs == 0
    later = [s.step() for _ in range(2)]
    assert [x.decode_seqs for x in later] == [1, 1]
    assert later[-1].finished == (r,) and r.finished_at == later[-1].end
    assert not s.has_work and s.kv_used == 0


def test_unchunked_prefill_takes_whole_prompts() -> None:
    for chunk in (None, -1):
        s = sched(chunked_prefill_size=chunk)
        s.submit(req("a", 20000, 1))
        s.submit(req("b", 100, 1))
        first = s.step()
        assert first.prefill_tokens == 20000  # bigger than max_prefill_tokens, still whole
        assert s.step().prefill_tokens == 100


def test_unchunked_steps_pack_whole_prompts_up_to_max_prefill_tokens() -> None:
    s = sched(chunked_prefill_size=None, max_prefill_tokens=16384)
    for i in range(5):
        s.submit(req(str(i), 6000, 1))
    assert [s.step().prefill_tokens for _ in range(3)] == [12000, 12000, 6000]


def test_each_step_decodes_every_running_request_plus_prefill_chunk() -> None:
    s = sched(chunked_prefill_size=8192)
    for i in range(3):
        s.submit(req(f"d{i}", 100, 50))
    s.step()  # prefill all three
    s.submit(req("long", 16384, 5))
    mixed = s.step()
    assert mixed.decode_seqs == 3 and mixed.prefill_tokens == 8192
    assert all(r.generated == 2 for r in s.running if r.rid.startswith("d"))


def test_chunks_are_taken_fifo_and_share_the_budget() -> None:
    s = sched(chunked_prefill_size=8192)
    a, b, c = req("a", 6000, 1), req("b", 6000, 1), req("c", 6000, 1)
    for r in (a, b, c):
        s.submit(r)
    first = s.step()
    assert first.prefill_tokens == 8192 and first.new_seqs == 2
    assert (a.prefilled, b.prefilled, c.prefilled) == (6000, 2192, 0)
    second = s.step()
    assert (b.prefilled, c.prefilled) == (6000, 8192 - 3808)
    assert second.prefill_tokens == 8192


def test_max_running_requests_caps_the_batch() -> None:
    s = sched(chunked_prefill_size=8192, max_running_requests=2)
    reqs = [req(str(i), 100, 10) for i in range(5)]
    for r in reqs:
        s.submit(r)
    first = s.step()
    assert first.new_seqs == 2 and first.queued == 3
    while reqs[0].finished_at is None:
        assert len(s.running) <= 2
        s.step()
    assert s.step().new_seqs >= 1


def test_kv_capacity_blocks_admission_until_memory_frees() -> None:
    policy = BatchPolicy(max_total_num_tokens=10_000, chunked_prefill_size=8192, page_size=64)
    s = Scheduler(cost=step_cost(model=QUIET, topology=REF), policy=policy)
    a, b = req("a", 6000, 10), req("b", 6000, 10)
    s.submit(a)
    s.submit(b)
    s.step()
    assert a in s.running and b in s.waiting and s.kv_used == 6016  # 6010 rounded to pages
    while not a.finished:
        s.step()
    s.step()
    assert b in s.running


def test_requests_that_can_never_fit_are_rejected() -> None:
    s = sched(context_length=4096)
    with pytest.raises(RequestRejected, match="context length"):
        s.submit(req("x", 4000, 200))
    with pytest.raises(RequestRejected, match="empty"):
        s.submit(req("y", 0, 1))
    small = Scheduler(
        cost=step_cost(model=QUIET, topology=REF), policy=BatchPolicy(max_total_num_tokens=1000)
    )
    with pytest.raises(RequestRejected, match="KV cache"):
        small.submit(req("z", 900, 200))


def test_abort_releases_kv_and_removes_the_request() -> None:
    s = sched(chunked_prefill_size=1024)
    r = req("a", 4096, 4)
    s.submit(r)
    s.step()
    assert s.kv_used > 0
    s.abort(r)
    assert not s.has_work and s.kv_used == 0 and r.aborted


def test_zero_max_new_tokens_finishes_after_prefill_without_tokens() -> None:
    s = sched()
    r = req("a", 100, 0)
    s.submit(r)
    step = s.step()
    assert step.finished == (r,) and step.emitted == () and r.generated == 0


def test_step_time_matches_the_cost_model_without_noise() -> None:
    s = sched(chunked_prefill_size=16384)
    s.submit(req("a", 16384, 1))
    step = s.step()
    expected = prefill_seconds(cost=s.cost, prompt_tokens=16384, chunk=16384)
    assert step.duration_s == pytest.approx(expected)


def test_request_arriving_mid_step_joins_the_next_step() -> None:
    s = sched(chunked_prefill_size=16384)
    run = simulate_arrivals(
        scheduler=s,
        arrivals=[Arrival(at=0.0, input_len=16384, output_len=1), Arrival(1.0, 100, 1)],
    )
    first, second = run.requests
    assert run.steps[0].prefill_tokens == 16384  # the second was not there at t=0
    assert second.first_token == run.steps[1].end
    assert run.steps[1].start == pytest.approx(first.first_token)
    assert second.ttft > run.steps[1].duration_s  # waited for the running step


def test_idle_time_passes_until_the_next_arrival() -> None:
    run = simulate_arrivals(
        scheduler=sched(), arrivals=[Arrival(0.0, 100, 1), Arrival(50.0, 100, 1)]
    )
    assert run.steps[1].start == 50.0
    assert run.requests[1].ttft == pytest.approx(run.requests[0].ttft)


def test_higher_concurrency_raises_ttft_and_throughput() -> None:
    results = {}
    for c in (1, 8):
        results[c] = simulate_closed_loop(
            scheduler=sched(chunked_prefill_size=8192),
            num_requests=32,
            concurrency=c,
            input_len=1024,
            output_len=128,
        )
    assert results[8].mean_ttft > results[1].mean_ttft
    assert results[8].output_throughput > 2 * results[1].output_throughput


def test_concurrency_beyond_saturation_only_adds_queueing_for_prefill_bound_load() -> None:
    runs = {
        c: simulate_closed_loop(
            scheduler=sched(chunked_prefill_size=8192),
            num_requests=40,
            concurrency=c,
            input_len=16384,
            output_len=1,
        )
        for c in (8, 16)
    }
    assert runs[16].mean_ttft > 1.5 * runs[8].mean_ttft
    assert runs[16].input_throughput == pytest.approx(runs[8].input_throughput, rel=0.02)


def test_flashinfer_mxfp4_beats_marlin_through_the_queueing_simulation() -> None:
    ttft = {}
    for backend in ("marlin", "flashinfer_mxfp4"):
        topo = dataclasses.replace(REF, moe_runner_backend=backend)
        run = simulate_closed_loop(
            scheduler=new_scheduler(topology=topo, chunked_prefill_size=8192, seed=1),
            num_requests=40,
            concurrency=8,
            input_len=16384,
            output_len=1,
        )
        ttft[backend] = run.mean_ttft
    assert ttft["flashinfer_mxfp4"] < ttft["marlin"]
    assert 0.01 < 1 - ttft["flashinfer_mxfp4"] / ttft["marlin"] < 0.15


def test_bigger_chunks_take_fewer_steps_and_less_time() -> None:
    runs = {
        chunk: simulate_closed_loop(
            scheduler=sched(chunked_prefill_size=chunk),
            num_requests=16,
            concurrency=8,
            input_len=16384,
            output_len=1,
        )
        for chunk in (8192, 16384)
    }
    assert len(runs[16384].steps) < len(runs[8192].steps)
    assert runs[16384].duration < runs[8192].duration


def test_seeded_noise_reproduces_with_the_same_seed_and_differs_with_another() -> None:
    def durations(seed: int) -> list[float]:
        s = new_scheduler(topology=REF, chunked_prefill_size=8192, seed=seed)
        run = simulate_closed_loop(
            scheduler=s, num_requests=8, concurrency=4, input_len=8192, output_len=4
        )
        return [x.duration_s for x in run.steps]

    assert durations(7) == durations(7)
    assert durations(7) != durations(8)
    quiet = [
        x.duration_s
        for x in simulate_closed_loop(
            scheduler=sched(chunked_prefill_size=8192),
            num_requests=8,
            concurrency=4,
            input_len=8192,
            output_len=4,
        ).steps
    ]
    ratios = [a / b for a, b in zip(durations(7), quiet, strict=True)]
    assert all(0.8 < r < 1.25 for r in ratios)
    assert len(set(ratios)) > 1


# ---------------------------------------------------------------- PD and pipeline parallelism

PIPED = dataclasses.replace(QUIET, pp_pipeline=True)
PP8 = Topology(tp_size=4, ep_size=4, pp_size=8, nnodes=4, moe_runner_backend="flashinfer_mxfp4")


def test_request_with_transferred_kv_emits_its_first_token_without_prefill() -> None:
    s = sched(chunked_prefill_size=8192)
    r = SimRequest(rid="d", prompt_tokens=16384, max_new_tokens=3, prefilled=16384)
    s.submit(r)
    first = s.step()
    assert first.prefill_tokens == 0 and first.new_seqs == 1 and first.emitted == (r,)
    assert r.first_token_at == first.end and r.generated == 1
    assert first.duration_s == pytest.approx(step_cost(model=QUIET, topology=REF).overhead_s)
    assert [s.step().decode_seqs for _ in range(2)] == [1, 1] and r.finished


def test_transferred_requests_need_no_prefill_budget() -> None:
    s = sched(chunked_prefill_size=8192)
    s.submit(req("p", 8192, 1))  # takes the whole budget
    s.submit(SimRequest(rid="d", prompt_tokens=4096, max_new_tokens=2, prefilled=4096))
    step = s.step()
    assert step.new_seqs == 2 and step.prefill_tokens == 8192


def test_a_lone_micro_batch_crosses_every_pipeline_stage() -> None:
    s = sched(topology=PP8, model=PIPED, chunked_prefill_size=8192)
    r = req("a", 16384, 1)
    s.submit(r)
    steps = []
    while s.has_work:
        steps.append(s.step())
    assert len(steps) == 2 * 8  # two chunks, each through 8 stages, no overlap
    assert [x.prefill_tokens for x in steps if x.prefill_tokens] == [8192, 8192]
    cost = step_cost(model=PIPED, topology=PP8)
    assert r.first_token_at == pytest.approx(
        prefill_seconds(cost=cost, prompt_tokens=16384, chunk=8192)
    )


def test_pipeline_overlaps_micro_batches_of_different_requests() -> None:
    def finish_time(n: int) -> float:
        s = sched(topology=PP8, model=PIPED, chunked_prefill_size=8192)
        for i in range(n):
            s.submit(req(str(i), 8192, 1))
        while s.has_work:
            s.step()
        return s.now

    one, eight = finish_time(1), finish_time(8)
    assert eight < 2.5 * one  # 8 requests overlap in 8 stages (15 ticks, not 64)
    assert eight > one


def test_pipeline_mode_is_off_by_default_and_keeps_the_flat_step_model() -> None:
    s = sched(topology=PP8, chunked_prefill_size=8192)
    s.submit(req("a", 8192, 1))
    assert s.step().finished  # one step: PP as more GPUs


def test_abort_inside_the_pipeline_frees_its_kv_when_the_batch_retires() -> None:
    s = sched(topology=PP8, model=PIPED, chunked_prefill_size=8192)
    a, b = req("a", 4096, 4), req("b", 4096, 4)
    s.submit(a)
    s.submit(b)
    s.step()
    assert a.in_flight and b.in_flight
    s.abort(a)
    while s.has_work:
        result = s.step()
        assert a not in result.finished
    assert b.finished and s.kv_used == 0 and not s.pipeline


@pytest.mark.parametrize("piped", [False, True])
def test_pending_tokens_are_what_is_left_to_prefill(piped: bool) -> None:
    """SGLang's #pending-token, kept as a count: the queue's prompts plus the rest of partly
    prefilled requests, through chunks, the pipeline and aborts."""
    import random

    rng = random.Random(7)
    model = PIPED if piped else QUIET
    s = sched(topology=PP8 if piped else REF, model=model, chunked_prefill_size=4096)
    live: list[SimRequest] = []
    for k in range(300):
        if rng.random() < 0.3:
            r = req(str(k), rng.randint(1, 12000), rng.randint(1, 4))
            s.submit(r)
            live.append(r)
        if live and rng.random() < 0.05:
            s.abort(live.pop(rng.randrange(len(live))))
        if s.has_work:
            s.step()
        left = [r for r in [*s.waiting, *s.running] if not r.prefill_done]
        assert s.pending_tokens == sum(r.prompt_tokens - r.prefilled for r in left)
    while s.has_work:
        s.step()
    assert s.pending_tokens == 0
