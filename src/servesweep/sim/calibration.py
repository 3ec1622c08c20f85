"""Replay seed 003's PD validation offline and compare with its 'Validated Result' table.

Seed 003 (Kimi-K3 standard PD on 8x RTX 6000D): prefill PP8/TP4/EP4 flashinfer_mxfp4 with
8K chunks on 4 nodes, decode TP32/EP32 marlin on 4 nodes, Mooncake over mlx5_0..3, page 64,
mini-LB router. Each case runs offline (no sleeping) through the prefill scheduler, the KV
link and the decode scheduler (`offline_pd`), with warm RDMA endpoints (the seed's table
rows came after smoke runs), and is scored the way bench_serving scores it:

* TTFT P50: median over requests of time to the first token (non-streaming: the whole
  latency, as bench_serving with --disable-stream reports it);
* input TPS: total input tokens / duration, where duration spans the first send to the last
  finish of every request (all 8 sequential requests of a C1 case) plus `BENCH_OVERHEAD_S`,
  the client's own time around the requests (seed: duration - e2e of its 1-request rows is
  0.067, 0.059 and 0.067 s).

`cold_start_ttft` predicts the first request after service start (RDMA endpoint warm-up).

Profile `kimi-k3-rtx6000d-pd`, noise seed 0 (`python -m servesweep.sim.calibration`; over
noise seeds 0-11 the worst error of any case and metric stays at or below 10.7 %)::

    | Case                    | TTFT P50 sim / seed | err   | Input TPS sim / seed | err  |
    | 64->8 C1                |  1.236 /  1.217 s   | +1.6% |   41.84 /   42.18    | -0.8% |
    | 1K->16 C1 non-streaming |  1.966 /  1.956 s   | +0.5% |  504.61 /  508.09    | -0.7% |
    | 16K->1 C1               |  7.323 /  7.565 s   | -3.2% | 2235.09 / 2161.23    | +3.4% |
    | 16K->1 C8               | 22.745 / 20.555 s   | +10.7%| 6137.46 / 6364.31    | -3.6% |
    | 16K->512 C1             |  7.306 /  7.702 s   | -5.1% |  602.89 /  595.27    | +1.3% |
    | 16K->512 C8             | 17.057 / 18.755 s   | -9.1% | 2615.49 / 2544.27    | +2.8% |
    first request after start: 4.736 s (seed 4.775 s)

TPOT P50 (not scored): 32.9 / 38.8 / 65.1 ms vs the seed's 33.27 / 38.66 / 63.20 ms.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from servesweep.sim.costmodel import Topology
from servesweep.sim.offline_pd import PDPair, PDRun, simulate_pd_closed_loop
from servesweep.sim.profiles import KIMI_K3_PD_PROFILE, SimProfile, get_profile
from servesweep.sim.scheduler import new_scheduler
from servesweep.sim.transfer import TransferLink, TransferPlan, link_bandwidth, plan_transfer

BENCH_OVERHEAD_S = 0.063
CLIENT_GAP_S = 0.002
TOLERANCE = 0.15

PREFILL_TOPOLOGY = Topology(
    tp_size=4, ep_size=4, pp_size=8, nnodes=4, moe_runner_backend="flashinfer_mxfp4"
)
DECODE_TOPOLOGY = Topology(tp_size=32, ep_size=32, nnodes=4, moe_runner_backend="marlin")
PREFILL_CHUNK = 8192
PAGE_SIZE = 64
IB_DEVICES = "mlx5_0,mlx5_1,mlx5_2,mlx5_3"
SEED_COLD_TTFT_S = 4.775


@dataclass(frozen=True)
class Case:
    """One row of the seed's table: workload and the measured TTFT P50 / input TPS."""

    name: str
    input_len: int
    output_len: int
    concurrency: int
    num_requests: int
    stream: bool
    seed_ttft_p50_s: float
    seed_input_tps: float


SEED_003_CASES: tuple[Case, ...] = (
    Case("64->8 C1", 64, 8, 1, 1, True, 1.217, 42.18),
    Case("1K->16 C1 non-streaming", 1024, 16, 1, 1, False, 1.956, 508.09),
    Case("16K->1 C1", 16384, 1, 1, 8, True, 7.565, 2161.23),
    Case("16K->1 C8", 16384, 1, 8, 40, True, 20.555, 6364.31),
    Case("16K->512 C1", 16384, 512, 1, 1, True, 7.702, 595.27),
    Case("16K->512 C8", 16384, 512, 8, 40, True, 18.755, 2544.27),
)


@dataclass(frozen=True)
class CaseResult:
    """Predicted vs measured for one case."""

    case: Case
    ttft_p50_s: float
    input_tps: float
    tpot_p50_ms: float | None

    @property
    def ttft_error(self) -> float:
        return self.ttft_p50_s / self.case.seed_ttft_p50_s - 1

    @property
    def tps_error(self) -> float:
        return self.input_tps / self.case.seed_input_tps - 1

    @property
    def within_tolerance(self) -> bool:
        return abs(self.ttft_error) <= TOLERANCE and abs(self.tps_error) <= TOLERANCE


def new_pair(*, profile: SimProfile, seed: int = 0, warm: bool = True) -> PDPair:
    """Seed 003's prefill and decode servers and their link, fresh and idle."""
    cost, xfer = profile.cost, profile.transfer
    prefill = new_scheduler(
        topology=PREFILL_TOPOLOGY,
        model=cost,
        chunked_prefill_size=PREFILL_CHUNK,
        page_size=PAGE_SIZE,
        seed=seed,
    )
    decode = new_scheduler(topology=DECODE_TOPOLOGY, model=cost, page_size=PAGE_SIZE, seed=seed + 1)
    link = TransferLink(
        bandwidth=link_bandwidth(model=xfer, ib_device=IB_DEVICES),
        max_parallel=xfer.max_parallel,
    )

    def plan(tokens: int, first_to_peer: bool) -> TransferPlan:
        return plan_transfer(
            model=xfer,
            tokens=tokens,
            kv_bytes_per_token=cost.kv_bytes_per_token,
            decode_tp=DECODE_TOPOLOGY.tp_size,
            first_to_peer=first_to_peer,
        )

    return PDPair(prefill=prefill, decode=decode, link=link, plan=plan, warm=warm)


def score(*, case: Case, run: PDRun) -> CaseResult:
    """bench_serving's TTFT P50, input TPS and TPOT P50 of one run."""
    reqs = run.requests
    ttfts = [r.ttft if case.stream else r.e2e for r in reqs]
    duration = run.duration + BENCH_OVERHEAD_S
    tpots = [t for r in reqs if (t := r.tpot) is not None and case.stream]
    return CaseResult(
        case=case,
        ttft_p50_s=statistics.median(ttfts),
        input_tps=sum(r.input_len for r in reqs) / duration,
        tpot_p50_ms=1000 * statistics.median(tpots) if tpots else None,
    )


def run_case(*, case: Case, profile: SimProfile, seed: int = 0) -> CaseResult:
    """Simulate one case offline on warm servers and score it."""
    run = simulate_pd_closed_loop(
        pair=new_pair(profile=profile, seed=seed),
        num_requests=case.num_requests,
        concurrency=case.concurrency,
        input_len=case.input_len,
        output_len=case.output_len,
        client_delay_s=CLIENT_GAP_S,
    )
    return score(case=case, run=run)


def run_calibration(*, profile_name: str = KIMI_K3_PD_PROFILE, seed: int = 0) -> list[CaseResult]:
    """Every case of seed 003, predicted by `profile_name`, next to the seed's numbers."""
    profile = get_profile(profile_name)
    return [run_case(case=c, profile=profile, seed=seed) for c in SEED_003_CASES]


def cold_start_ttft(*, profile_name: str = KIMI_K3_PD_PROFILE, seed: int = 0) -> float:
    """TTFT of the first 64->8 request after start (RDMA endpoints not yet established)."""
    run = simulate_pd_closed_loop(
        pair=new_pair(profile=get_profile(profile_name), seed=seed, warm=False),
        num_requests=1,
        concurrency=1,
        input_len=64,
        output_len=8,
    )
    return run.requests[0].ttft


def format_table(results: list[CaseResult]) -> str:
    """Markdown table: predicted vs seed for TTFT P50 and input TPS, with relative errors."""
    lines = [
        "| Case | TTFT P50 sim / seed (s) | err | Input TPS sim / seed | err | TPOT P50 sim (ms) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        tpot = f"{r.tpot_p50_ms:.2f}" if r.tpot_p50_ms is not None else "N/A"
        lines.append(
            f"| {r.case.name} | {r.ttft_p50_s:.3f} / {r.case.seed_ttft_p50_s:.3f} | "
            f"{r.ttft_error:+.1%} | {r.input_tps:.2f} / {r.case.seed_input_tps:.2f} | "
            f"{r.tps_error:+.1%} | {tpot} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    table = run_calibration()
    print(format_table(table))
    print(f"first request after start: {cold_start_ttft():.3f} s (seed {SEED_COLD_TTFT_S} s)")
