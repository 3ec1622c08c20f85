"""The simulator's offline estimate of a cell: the one entry the workflow's planner uses."""

from __future__ import annotations

from servesweep.sim.costmodel import Topology
from servesweep.sim.offline import simulate_closed_loop
from servesweep.sim.scheduler import new_scheduler


def closed_loop_seconds(
    *,
    tp_size: int,
    ep_size: int,
    dp_size: int,
    pp_size: int,
    nnodes: int,
    moe_runner_backend: str,
    chunked_prefill_size: int | None,
    max_running_requests: int | None,
    page_size: int | None,
    num_requests: int,
    concurrency: int,
    input_len: int,
    output_len: int,
) -> float:
    """Simulated seconds (time scale 1) for `num_requests` sent by `concurrency` closed-loop
    clients to a server of this topology and these scheduler settings."""
    scheduler = new_scheduler(
        topology=Topology(
            tp_size=tp_size,
            ep_size=ep_size,
            dp_size=dp_size,
            pp_size=pp_size,
            nnodes=nnodes,
            moe_runner_backend=moe_runner_backend,
        ),
        chunked_prefill_size=chunked_prefill_size,
        max_running_requests=max_running_requests,
        page_size=page_size,
    )
    run = simulate_closed_loop(
        scheduler=scheduler,
        num_requests=num_requests,
        concurrency=concurrency,
        input_len=input_len,
        output_len=output_len,
    )
    return run.duration
