"""Offline PD simulation without sleeping: prefill scheduler + KV transfer link + decode
scheduler driven by a closed-loop client (what the live P, D and mini-LB processes do).

A discrete-event loop in simulated seconds: each request is prefilled on P (its first token
is sampled there), waits for the RDMA endpoints on its first transfer after start, pays the
transfer's fixed latency, crosses the shared link, then joins D's next step, which emits the
first token; D decodes the rest. Ties go to arrivals and transfers before scheduler steps,
so a request that arrives exactly when a step starts joins that step, like the live engine.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from servesweep.sim.scheduler import Scheduler, SimRequest
from servesweep.sim.transfer import TransferLink, TransferPlan

# plan(tokens, first_to_peer) -> what that request's transfer costs
PlanFn = Callable[[int, bool], TransferPlan]


@dataclass(frozen=True)
class PDTiming:
    """One request through P, the link and D (simulated seconds)."""

    index: int
    sent: float
    prefill_done: float
    kv_arrived: float
    first_token: float
    finish: float
    input_len: int
    output_len: int

    @property
    def ttft(self) -> float:
        return self.first_token - self.sent

    @property
    def e2e(self) -> float:
        return self.finish - self.sent

    @property
    def tpot(self) -> float | None:
        if self.output_len <= 1:
            return None
        return (self.finish - self.first_token) / (self.output_len - 1)


@dataclass(frozen=True)
class PDRun:
    """Per-request timings of one offline PD run."""

    requests: list[PDTiming]

    @property
    def duration(self) -> float:
        if not self.requests:
            return 0.0
        return max(r.finish for r in self.requests) - min(r.sent for r in self.requests)


@dataclass
class _Flight:
    index: int
    sent: float
    p_req: SimRequest
    prefill_done: float = 0.0
    kv_arrived: float = 0.0
    d_req: SimRequest | None = None


@dataclass
class PDPair:
    """One prefill server, its link, one decode server, and whether the RDMA endpoints
    between them exist yet (`warm`)."""

    prefill: Scheduler
    decode: Scheduler
    link: TransferLink
    plan: PlanFn
    warm: bool = False
    _setup_done_at: float | None = field(default=None, repr=False)

    def transfer_start(self, *, prefill_done: float, plan: TransferPlan) -> float:
        """When a transfer whose prefill ended at `prefill_done` enters the link."""
        start = prefill_done
        if not self.warm:
            if self._setup_done_at is None:
                self._setup_done_at = prefill_done + plan.setup_s
            start = max(start, self._setup_done_at)
        return start + plan.base_latency_s


def simulate_pd_closed_loop(
    *,
    pair: PDPair,
    num_requests: int,
    concurrency: int,
    input_len: int,
    output_len: int,
    client_delay_s: float = 1e-6,
) -> PDRun:
    """`concurrency` clients sending `num_requests` requests in total through P -> link -> D;
    each client sends its next request `client_delay_s` after its previous one finished."""
    p, d, link = pair.prefill, pair.decode, pair.link
    seq = itertools.count()
    events: list[tuple[float, int, str, int]] = []
    flights: dict[int, _Flight] = {}
    by_p: dict[int, int] = {}
    by_d: dict[int, int] = {}
    done: list[PDTiming] = []
    sent = 0
    for _ in range(min(concurrency, num_requests)):
        heapq.heappush(events, (0.0, next(seq), "send", sent))
        sent += 1
    inf = float("inf")

    def arrive(t: float, index: int) -> None:
        f = flights[index]
        f.kv_arrived = t
        if not d.has_work:
            d.advance_to(t)
        r = SimRequest(
            rid=f"d{index}",
            prompt_tokens=input_len,
            max_new_tokens=output_len,
            arrival=t,
            prefilled=input_len,
        )
        f.d_req = r
        by_d[id(r)] = index
        d.submit(r)

    while True:
        t_ev = events[0][0] if events else inf
        t_p = p.now if p.has_work else inf
        t_d = d.now if d.has_work else inf
        t_x = link.next_completion()
        t_x = inf if t_x is None else t_x
        t = min(t_ev, t_p, t_d, t_x)
        if t == inf:
            break
        if t_ev == t:
            _, _, kind, index = heapq.heappop(events)
            if kind == "send":
                if not p.has_work:
                    p.advance_to(t)
                r = SimRequest(
                    rid=f"p{index}", prompt_tokens=input_len, max_new_tokens=1, arrival=t
                )
                flights[index] = _Flight(index=index, sent=t, p_req=r)
                by_p[id(r)] = index
                p.submit(r)
            elif kind == "link":
                plan = pair.plan(input_len, False)
                for key in link.add(key=index, nbytes=plan.nbytes, now=t):
                    arrive(t, int(key))  # type: ignore[call-overload]
        elif t_x == t:
            for key in link.advance(t):
                arrive(t, int(key))  # type: ignore[call-overload]
        elif t_p == t:
            result = p.step()
            for r in result.finished:
                index = by_p.pop(id(r))
                flights[index].prefill_done = result.end
                plan = pair.plan(input_len, not pair.warm)
                start = pair.transfer_start(prefill_done=result.end, plan=plan)
                heapq.heappush(events, (start, next(seq), "link", index))
        else:
            result = d.step()
            for r in result.finished:
                index = by_d.pop(id(r))
                f = flights.pop(index)
                assert f.d_req is not None and f.d_req.first_token_at is not None
                done.append(
                    PDTiming(
                        index=index,
                        sent=f.sent,
                        prefill_done=f.prefill_done,
                        kv_arrived=f.kv_arrived,
                        first_token=f.d_req.first_token_at,
                        finish=result.end,
                        input_len=input_len,
                        output_len=output_len,
                    )
                )
                if sent < num_requests:
                    heapq.heappush(events, (result.end + client_delay_s, next(seq), "send", sent))
                    sent += 1
    if len(done) != num_requests:
        raise RuntimeError(f"offline PD run finished {len(done)} of {num_requests} requests")
    return PDRun(requests=sorted(done, key=lambda r: r.index))
