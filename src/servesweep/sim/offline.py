"""Run the scheduler without sleeping: open-loop arrivals or a closed-loop client (calibration)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from servesweep.sim.scheduler import Scheduler, SimRequest, StepResult


@dataclass(frozen=True)
class Arrival:
    """One request arriving at simulated time `at`."""

    at: float
    input_len: int
    output_len: int


@dataclass(frozen=True)
class RequestTiming:
    """When one request arrived, got its first token and finished (simulated seconds)."""

    index: int
    arrival: float
    first_token: float
    finish: float
    input_len: int
    output_len: int

    @property
    def ttft(self) -> float:
        return self.first_token - self.arrival

    @property
    def e2e(self) -> float:
        return self.finish - self.arrival


@dataclass(frozen=True)
class OfflineRun:
    """Per-request timings and every step of one offline simulation."""

    requests: list[RequestTiming]
    steps: list[StepResult]

    @property
    def duration(self) -> float:
        if not self.requests:
            return 0.0
        return max(r.finish for r in self.requests) - min(r.arrival for r in self.requests)

    @property
    def output_throughput(self) -> float:
        return sum(r.output_len for r in self.requests) / self.duration

    @property
    def input_throughput(self) -> float:
        return sum(r.input_len for r in self.requests) / self.duration

    @property
    def mean_ttft(self) -> float:
        return sum(r.ttft for r in self.requests) / len(self.requests)


def _timing(index: int, req: SimRequest) -> RequestTiming:
    assert req.first_token_at is not None and req.finished_at is not None
    return RequestTiming(
        index=index,
        arrival=req.arrival,
        first_token=req.first_token_at,
        finish=req.finished_at,
        input_len=req.prompt_tokens,
        output_len=req.max_new_tokens,
    )


def simulate_arrivals(*, scheduler: Scheduler, arrivals: Sequence[Arrival]) -> OfflineRun:
    """Feed requests at their arrival times; a request arriving mid-step joins the next step."""
    pending = sorted(enumerate(arrivals), key=lambda item: (item[1].at, item[0]))
    reqs: dict[int, SimRequest] = {}
    steps: list[StepResult] = []
    pos = 0
    while pos < len(pending) or scheduler.has_work:
        if not scheduler.has_work:
            scheduler.advance_to(pending[pos][1].at)
        while pos < len(pending) and pending[pos][1].at <= scheduler.now:
            i, a = pending[pos]
            reqs[i] = SimRequest(
                rid=str(i), prompt_tokens=a.input_len, max_new_tokens=a.output_len, arrival=a.at
            )
            scheduler.submit(reqs[i])
            pos += 1
        steps.append(scheduler.step())
    return OfflineRun(requests=[_timing(i, reqs[i]) for i in sorted(reqs)], steps=steps)


def simulate_closed_loop(
    *,
    scheduler: Scheduler,
    num_requests: int,
    concurrency: int,
    input_len: int,
    output_len: int,
    client_delay_s: float = 1e-6,
) -> OfflineRun:
    """`concurrency` clients that each send the next request `client_delay_s` after theirs
    finished (bench_serving with --max-concurrency and request rate inf). As with the live
    server, where the next step is planned the moment the previous one ends, a request sent
    after a step ended joins the step after the one that is already running."""
    reqs: list[SimRequest] = []
    steps: list[StepResult] = []
    due: list[float] = [0.0] * min(concurrency, num_requests)

    def send(at: float) -> None:
        req = SimRequest(
            rid=str(len(reqs)), prompt_tokens=input_len, max_new_tokens=output_len, arrival=at
        )
        reqs.append(req)
        scheduler.submit(req)

    while due or scheduler.has_work:
        if not scheduler.has_work:
            scheduler.advance_to(min(due))
        for at in sorted(t for t in due if t <= scheduler.now):
            due.remove(at)
            send(at)
        result = scheduler.step()
        steps.append(result)
        for _ in result.finished:
            if len(reqs) + len(due) < num_requests:
                due.append(result.end + client_delay_s)
    return OfflineRun(requests=[_timing(i, r) for i, r in enumerate(reqs)], steps=steps)
