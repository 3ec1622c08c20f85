"""Engine driver in-process (real asyncio sleeps, scaled) and the token helpers."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path

import pytest

from servesweep.sim import engine as engine_module
from servesweep.sim.costmodel import CostModel, Topology
from servesweep.sim.engine import Engine
from servesweep.sim.scheduler import RequestRejected, new_scheduler
from servesweep.sim.tokens import WORDS, PromptCounter, output_id, output_word

QUIET = dataclasses.replace(CostModel(), noise_sigma=0.0)


def engine(scale: float) -> Engine:
    sched = new_scheduler(
        topology=Topology(tp_size=8, ep_size=8), model=QUIET, chunked_prefill_size=8192
    )
    return Engine(scheduler=sched, time_scale=scale)


def test_wall_time_follows_simulated_time_times_scale() -> None:
    async def main() -> tuple[float, float, list[int]]:
        eng = engine(0.05)
        task = asyncio.create_task(eng.run())
        time.sleep(0.01)  # a loaded machine: the engine idles between its start and the request
        # The arrival's wall time taken before submit re-anchors the engine's clock, so no
        # preemption between the two can shorten the measured latency (one did under load).
        arrival = asyncio.get_running_loop().time()
        stream = eng.submit(
            prompt_tokens=2048, max_new_tokens=3, counted=True, arrival_wall=arrival
        )
        seen = []
        while not stream.finished:
            await stream.wait_change()
            seen.append(len(stream.output_ids))
        await eng.close(task)
        assert stream.req.first_token_at is not None and stream.req.finished_at is not None
        sim = stream.req.finished_at - stream.req.arrival
        assert stream.e2e_latency is not None
        return sim, stream.e2e_latency, seen

    sim, wall, seen = asyncio.run(main())
    # Sleeps only end late, so load only lengthens `wall`; the one way it ends early is by
    # design: a step due in less than MIN_SLEEP_S is not slept (2 ms, against which a 1 % margin,
    # 1 ms here, failed at load 10). An engine that counted its idle 10 ms before the request as
    # simulated time would come out 10 ms short.
    assert wall >= sim * 0.05 - engine_module.MIN_SLEEP_S - 1e-6
    assert seen[-1] == 3 and seen == sorted(seen)


def test_crash_falls_in_the_batch_of_request_n_though_the_batch_ends_in_one_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """--sim-crash-after N: CI saw a whole second cell's batch finish in one step, so a crash
    keyed on N requests *delivered* never came. Keyed on request N in flight, it always does."""

    class Crashed(Exception):
        pass

    def crash(*, message: str, code: int = 1) -> None:
        raise Crashed(message)

    monkeypatch.setattr(engine_module, "fatal_exit", crash)

    async def main() -> list[bool]:
        eng = Engine(scheduler=engine(0).scheduler, time_scale=0, crash_after=1)
        task = asyncio.create_task(eng.run())
        await eng.run_to_completion(prompt_tokens=8, max_new_tokens=1)  # uncounted (warmup)
        first = eng.submit(prompt_tokens=16, max_new_tokens=2, counted=True)  # request 0
        while not first.finished:
            await first.wait_change()
        batch = [eng.submit(prompt_tokens=16, max_new_tokens=2, counted=True) for _ in range(3)]
        with pytest.raises(Crashed, match="injected by --sim-crash-after 1"):
            await asyncio.wait_for(task, timeout=10)  # no crash: TimeoutError
        return [s.finished for s in batch]

    assert asyncio.run(main()) == [False, False, False]


def test_streams_get_cumulative_ids_and_words() -> None:
    async def main() -> list[str]:
        eng = engine(0.001)
        task = asyncio.create_task(eng.run())
        streams = [
            eng.submit(prompt_tokens=100 + i, max_new_tokens=5 + i, counted=True) for i in range(4)
        ]
        for s in streams:
            while not s.finished:
                await s.wait_change()
        await eng.close(task)
        assert eng.stats.generation_tokens_total == sum(5 + i for i in range(4))
        assert eng.stats.prompt_tokens_total == sum(100 + i for i in range(4))
        return [s.text for s in streams]

    texts = asyncio.run(main())
    assert [len(t.split()) for t in texts] == [5, 6, 7, 8]
    assert len(set(texts)) > 1


def test_probe_succeeds_when_a_step_completes_and_warmup_is_uncounted() -> None:
    async def main() -> None:
        eng = engine(0.001)
        task = asyncio.create_task(eng.run())
        await eng.run_to_completion(prompt_tokens=7, max_new_tokens=8)
        assert await eng.probe(timeout_s=5.0)
        assert eng.stats.requests_total == 0 and eng.idle
        with pytest.raises(RequestRejected):
            eng.submit(prompt_tokens=10, max_new_tokens=10**9, counted=True)
        await eng.close(task)

    asyncio.run(main())


def test_probe_times_out_when_the_scheduler_is_stuck() -> None:
    async def main() -> bool:
        eng = engine(0.001)  # loop never started: nothing steps
        return await eng.probe(timeout_s=0.05)

    assert asyncio.run(main()) is False


def test_output_tokens_are_deterministic_ids_below_1000_with_single_token_words() -> None:
    ids = [output_id(seq=s, k=k) for s in range(5) for k in range(50)]
    assert all(0 <= i < 1000 for i in ids)
    assert ids == [output_id(seq=s, k=k) for s in range(5) for k in range(50)]
    assert all(output_word(i) in WORDS for i in ids)
    assert all(w.startswith(" ") and " " not in w[1:] for w in WORDS)


def test_prompt_counter_uses_a_local_tokenizer_json_else_estimates(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1, "b": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    tok.save(str(model_dir / "tokenizer.json"))
    exact = PromptCounter(paths=[None, str(model_dir)])
    assert exact.count("a b a b zzz") == 5 and "tokenizer.json" in exact.source
    guess = PromptCounter(paths=[str(tmp_path / "nothing"), "sim/label"])
    assert guess.count("a b a b zzz") == 3  # 11 characters / 4, rounded up


def test_zero_time_scale_never_sleeps_and_delivers_every_token() -> None:
    async def main() -> list[list[int]]:
        eng = engine(0.0)
        task = asyncio.create_task(eng.run())
        streams = [
            eng.submit(prompt_tokens=16384, max_new_tokens=5, counted=True) for _ in range(20)
        ]
        for s in streams:
            while not s.finished:
                await s.wait_change()
        await eng.close(task)
        return [s.output_ids for s in streams]

    outputs = asyncio.run(asyncio.wait_for(main(), 30))
    assert [len(o) for o in outputs] == [5] * 20


def test_first_token_from_elsewhere_leads_the_output() -> None:
    async def main() -> list[int]:
        eng = engine(0.0)
        task = asyncio.create_task(eng.run())
        s = eng.submit(prompt_tokens=64, max_new_tokens=3, counted=True, prefilled=64,
                       first_token=999)  # fmt: skip
        while not s.finished:
            await s.wait_change()
        await eng.close(task)
        return s.output_ids

    ids = asyncio.run(main())
    assert ids[0] == 999 and len(ids) == 3
