"""Continuous-batching scheduler with chunked prefill, stepped in simulated time (no I/O).

Two step models: one batch per step (default), or SGLang's pipeline-parallel micro-batch
loop (`StepCost.pipeline_stages > 1`, see costmodel), where a step is one pipeline tick and
a micro-batch's results land `pipeline_stages` ticks after it was scheduled. A request whose
KV cache arrived from a prefill server (PD decode) is submitted with `prefilled` equal to its
prompt: it costs no prefill and emits its first token (sampled by the prefill server) at the
end of the step that admits it."""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass, field

from servesweep.sim.costmodel import (
    CostModel,
    PrefillChunk,
    StepCost,
    Topology,
    max_total_num_tokens,
    noise_factor,
    step_cost,
    step_time,
    step_work,
)


class RequestRejected(ValueError):
    """A request can never be served (longer than the context or the whole KV cache)."""


@dataclass(eq=False)
class SimRequest:
    """One generate request as the scheduler sees it (times are simulated seconds)."""

    rid: str
    prompt_tokens: int
    max_new_tokens: int
    arrival: float = 0.0
    prefilled: int = 0
    generated: int = 0
    kv_reserved: int = 0
    first_token_at: float | None = None
    finished_at: float | None = None
    aborted: bool = False
    in_flight: bool = False  # inside a micro-batch that has not left the pipeline yet

    @property
    def prefill_done(self) -> bool:
        return self.prefilled >= self.prompt_tokens

    @property
    def finished(self) -> bool:
        return self.finished_at is not None or self.aborted


@dataclass(frozen=True)
class BatchPolicy:
    """What one step may take: chunk size, prefill budget, batch cap and KV capacity."""

    max_total_num_tokens: int
    chunked_prefill_size: int | None = None
    max_prefill_tokens: int = 16384
    max_running_requests: int | None = None
    page_size: int = 1
    context_length: int = 262_144

    @property
    def chunking(self) -> bool:
        return self.chunked_prefill_size is not None and self.chunked_prefill_size > 0


@dataclass(frozen=True)
class PrefillReport:
    """A prefill batch whose results landed in a step, as SGLang's batch line reports it (the
    counts of when it was scheduled; SGLang logs the line once the results are processed)."""

    seqs: int  # requests with a chunk in it (#new-seq)
    tokens: int  # #new-token
    running: int  # requests decoding beside it (#running-req)
    pending_tokens: int  # prompt tokens left to prefill after it (#pending-token)


@dataclass(frozen=True)
class StepResult:
    """What one step did; the request objects were already updated."""

    start: float
    duration_s: float
    new_seqs: int
    prefill_tokens: int
    decode_seqs: int
    emitted: tuple[SimRequest, ...]
    finished: tuple[SimRequest, ...]
    running: int
    queued: int
    kv_used: int
    prefills: tuple[PrefillReport, ...] = ()  # prefill batches whose results landed

    @property
    def end(self) -> float:
        return self.start + self.duration_s


@dataclass(eq=False)
class MicroBatch:
    """A batch inside the pipeline: its decode requests, prefill chunks and stage compute."""

    decode: list[SimRequest]
    plan: list[tuple[SimRequest, int]]
    admitted: int
    work_s: float
    ticks_left: int
    pending_tokens: int = 0  # prompt tokens left to prefill once its chunks are done


@dataclass
class Scheduler:
    """FIFO continuous batching: every step decodes all running requests by one token and
    prefills up to the chunk budget from the queue (a long prompt spans several steps)."""

    cost: StepCost
    policy: BatchPolicy
    seed: int = 0
    now: float = 0.0
    waiting: deque[SimRequest] = field(default_factory=deque)
    running: list[SimRequest] = field(default_factory=list)
    kv_used: int = 0
    steps: int = 0
    pipeline: deque[MicroBatch] = field(default_factory=deque)
    pending_tokens: int = 0  # prompt tokens still to prefill (SGLang's #pending-token)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    # ------------------------------------------------------------------ queue

    def kv_need(self, *, prompt_tokens: int, max_new_tokens: int) -> int:
        """KV tokens reserved for a request (prompt + all outputs, rounded up to pages)."""
        page = max(1, self.policy.page_size)
        return math.ceil((prompt_tokens + max_new_tokens) / page) * page

    def check(self, *, prompt_tokens: int, max_new_tokens: int) -> None:
        """Raise RequestRejected if such a request could never run."""
        total = prompt_tokens + max_new_tokens
        if prompt_tokens < 1:
            raise RequestRejected("The input is empty.")
        if total > self.policy.context_length:
            raise RequestRejected(
                f"Requested token count exceeds the model's maximum context length of "
                f"{self.policy.context_length} tokens. You requested a total of {total} tokens: "
                f"{prompt_tokens} tokens from the input messages and {max_new_tokens} tokens "
                f"for the completion."
            )
        need = self.kv_need(prompt_tokens=prompt_tokens, max_new_tokens=max_new_tokens)
        if need > self.policy.max_total_num_tokens:
            raise RequestRejected(
                f"Input length {prompt_tokens} plus max_new_tokens {max_new_tokens} exceeds the "
                f"KV cache capacity of {self.policy.max_total_num_tokens} tokens."
            )

    def submit(self, req: SimRequest) -> None:
        """Queue a request (FIFO); it joins at the next step."""
        self.check(prompt_tokens=req.prompt_tokens, max_new_tokens=req.max_new_tokens)
        self.waiting.append(req)
        self.pending_tokens += req.prompt_tokens - req.prefilled

    def abort(self, req: SimRequest) -> None:
        """Drop a request wherever it is and release its KV reservation."""
        if req.finished:
            return
        req.aborted = True
        self.pending_tokens -= req.prompt_tokens - req.prefilled
        if req in self.waiting:
            self.waiting.remove(req)
        if req in self.running:
            self.running.remove(req)
            self.kv_used -= req.kv_reserved

    def hold(self, req: SimRequest) -> None:
        """Keep a finished request's KV cache reserved (PD prefill: until it was sent)."""
        self.kv_used += req.kv_reserved

    def release(self, req: SimRequest) -> None:
        """Free what `hold` kept."""
        self.kv_used -= req.kv_reserved

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def token_usage(self) -> float:
        return self.kv_used / self.policy.max_total_num_tokens

    def advance_to(self, t: float) -> None:
        """Let idle simulated time pass."""
        self.now = max(self.now, t)

    # ------------------------------------------------------------------ steps

    def _admissible(self, req: SimRequest) -> bool:
        cap = self.policy.max_running_requests
        if cap is not None and len(self.running) >= cap:
            return False
        need = self.kv_need(prompt_tokens=req.prompt_tokens, max_new_tokens=req.max_new_tokens)
        return self.kv_used + need <= self.policy.max_total_num_tokens

    def _plan_prefill(self) -> tuple[list[tuple[SimRequest, int]], int]:
        """(request, tokens) to prefill this step, and how many requests were admitted.
        Requests inside the pipeline wait for their micro-batch; requests whose KV arrived
        from a prefill server are admitted with 0 tokens (they need no budget)."""
        p = self.policy
        budget = p.chunked_prefill_size if p.chunking else p.max_prefill_tokens
        assert budget is not None
        plan: list[tuple[SimRequest, int]] = []
        for req in self.running:
            if budget <= 0:
                break
            if not req.prefill_done and not req.in_flight:
                left = req.prompt_tokens - req.prefilled
                take = min(left, budget) if p.chunking else left
                plan.append((req, take))
                budget -= take
        admitted = 0
        while self.waiting:
            req = self.waiting[0]
            left = req.prompt_tokens - req.prefilled
            if left > 0 and budget <= 0:
                break
            if not p.chunking and plan and left > budget:
                break
            if not self._admissible(req):
                break
            self.waiting.popleft()
            req.kv_reserved = self.kv_need(
                prompt_tokens=req.prompt_tokens, max_new_tokens=req.max_new_tokens
            )
            self.kv_used += req.kv_reserved
            self.running.append(req)
            admitted += 1
            take = min(left, budget) if p.chunking else left
            plan.append((req, take))
            budget -= take
        return plan, admitted

    def step(self) -> StepResult:
        """Run one step (or pipeline tick): plan a batch, draw its duration, advance requests
        and the clock."""
        if not self.has_work:
            raise RuntimeError("step() called with no work")
        if self.cost.pipeline_stages > 1:
            return self._tick()
        decode = [r for r in self.running if r.prefill_done]
        plan, admitted = self._plan_prefill()
        chunks = [PrefillChunk(tokens=n, context=r.prefilled) for r, n in plan]
        contexts = [r.prompt_tokens + r.generated for r in decode]
        base = step_time(cost=self.cost, prefill=chunks, decode_contexts=contexts)
        duration = base * noise_factor(sigma=self.cost.noise_sigma, gauss=self._rng.gauss(0, 1))
        start, end = self.now, self.now + duration
        emitted, finished = self._apply(decode=decode, plan=plan, end=end)
        self.now = end
        self.steps += 1
        report = _report(plan, running=len(decode), pending_tokens=self.pending_tokens)
        return StepResult(
            start=start,
            duration_s=duration,
            new_seqs=admitted,
            prefill_tokens=sum(n for _, n in plan),
            decode_seqs=len(decode),
            emitted=tuple(emitted),
            finished=tuple(finished),
            running=len(self.running),
            queued=len(self.waiting),
            kv_used=self.kv_used,
            prefills=(report,) if report else (),
        )

    def _tick(self) -> StepResult:
        """One pipeline tick: schedule a micro-batch from requests outside the pipeline, run
        every stage once (as long as the slowest micro-batch in flight), retire the oldest
        micro-batch once it has passed all stages."""
        decode = [r for r in self.running if r.prefill_done and not r.in_flight]
        plan, admitted = self._plan_prefill()
        if decode or plan:
            chunks = [PrefillChunk(tokens=n, context=r.prefilled) for r, n in plan]
            contexts = [r.prompt_tokens + r.generated for r in decode]
            work = step_work(cost=self.cost, prefill=chunks, decode_contexts=contexts)
            for req in [*decode, *(r for r, _ in plan)]:
                req.in_flight = True
            self.pipeline.append(
                MicroBatch(
                    decode=decode,
                    plan=plan,
                    admitted=admitted,
                    work_s=work,
                    ticks_left=self.cost.pipeline_stages,
                )
            )
            in_pipeline = sum(n for mb in self.pipeline for r, n in mb.plan if not r.aborted)
            self.pipeline[-1].pending_tokens = self.pending_tokens - in_pipeline
        base = self.cost.overhead_s + max((mb.work_s for mb in self.pipeline), default=0.0)
        duration = base * noise_factor(sigma=self.cost.noise_sigma, gauss=self._rng.gauss(0, 1))
        start, end = self.now, self.now + duration
        emitted: list[SimRequest] = []
        finished: list[SimRequest] = []
        reports: list[PrefillReport] = []
        for mb in self.pipeline:
            mb.ticks_left -= 1
        while self.pipeline and self.pipeline[0].ticks_left <= 0:
            mb = self.pipeline.popleft()
            for req in [*mb.decode, *(r for r, _ in mb.plan)]:
                req.in_flight = False
            e, f = self._apply(decode=mb.decode, plan=mb.plan, end=end)
            emitted += e
            finished += f
            report = _report(mb.plan, running=len(mb.decode), pending_tokens=mb.pending_tokens)
            reports += [report] if report else []
        self.now = end
        self.steps += 1
        return StepResult(
            start=start,
            duration_s=duration,
            new_seqs=admitted,
            prefill_tokens=sum(n for _, n in plan),
            decode_seqs=len(decode),
            emitted=tuple(emitted),
            finished=tuple(finished),
            running=len(self.running),
            queued=len(self.waiting),
            kv_used=self.kv_used,
            prefills=tuple(reports),
        )

    def _apply(
        self, *, decode: list[SimRequest], plan: list[tuple[SimRequest, int]], end: float
    ) -> tuple[list[SimRequest], list[SimRequest]]:
        """Advance the requests of a finished batch; return (emitted, finished)."""
        emitted: list[SimRequest] = []
        finished: list[SimRequest] = []
        for req in decode:
            req.generated += 1
            emitted.append(req)
        for req, n in plan:
            req.prefilled += n
            if not req.aborted:  # an aborted request's rest was taken off at once
                self.pending_tokens -= n
            if req.prefill_done:
                req.first_token_at = end
                if req.max_new_tokens > 0:
                    req.generated = 1
                    emitted.append(req)
        for req in decode + [r for r, _ in plan]:
            if req.prefill_done and req.generated >= req.max_new_tokens and not req.finished:
                req.finished_at = end
                finished.append(req)
                self.running.remove(req)
                self.kv_used -= req.kv_reserved
        return emitted, finished


def _report(
    plan: list[tuple[SimRequest, int]], *, running: int, pending_tokens: int
) -> PrefillReport | None:
    """The batch line's counts of a batch's prefill chunks (None: it prefilled nothing)."""
    tokens = sum(n for _, n in plan)
    if not tokens:
        return None
    seqs = sum(1 for _, n in plan if n > 0)
    return PrefillReport(seqs=seqs, tokens=tokens, running=running, pending_tokens=pending_tokens)


def new_scheduler(
    *,
    topology: Topology,
    model: CostModel | None = None,
    chunked_prefill_size: int | None = None,
    max_prefill_tokens: int = 16384,
    max_running_requests: int | None = None,
    page_size: int | None = None,
    mem_fraction_static: float | None = None,
    kv_cache_dtype: str | None = None,
    context_length: int | None = None,
    seed: int = 0,
) -> Scheduler:
    """A scheduler whose step costs and KV capacity follow `model` for `topology`."""
    model = model or CostModel()
    capacity = max_total_num_tokens(
        model=model,
        topology=topology,
        mem_fraction_static=mem_fraction_static,
        kv_cache_dtype=kv_cache_dtype,
    )
    policy = BatchPolicy(
        max_total_num_tokens=capacity,
        chunked_prefill_size=chunked_prefill_size,
        max_prefill_tokens=max_prefill_tokens,
        max_running_requests=max_running_requests,
        page_size=page_size or 1,
        context_length=context_length or model.context_length,
    )
    return Scheduler(cost=step_cost(model=model, topology=topology), policy=policy, seed=seed)
