"""Named coefficient sets of the simulator (`--sim-profile`): cost model + KV transfer model.

`default` is the cost model calibrated on the seed-000 reference (see costmodel) with a
generic transfer model; it is what every run without `--sim-profile` uses, so existing
results do not move. `kimi-k3-rtx6000d-pd` is fitted to seed 003 (Kimi-K3 standard PD on
8x RTX 6000D nodes: prefill PP8/TP4/EP4 flashinfer_mxfp4 chunk 8K on 4 nodes, decode
TP32/EP32 marlin on 4 nodes, Mooncake over mlx5_0..3, page 64); `calibration.py` replays
that experiment's six cases offline and compares with its 'Validated Result' table.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from servesweep.sim.costmodel import CostModel
from servesweep.sim.transfer import TransferModel

DEFAULT_PROFILE = "default"
KIMI_K3_PD_PROFILE = "kimi-k3-rtx6000d-pd"


@dataclass(frozen=True)
class SimProfile:
    """A named cost model plus KV transfer model."""

    name: str
    description: str
    cost: CostModel
    transfer: TransferModel


# Seed 003, fitted with `calibration.run_calibration()` (table in calibration.py's docstring):
# * prefill (PP8 x TP4 over 4 nodes): SGLang's micro-batch pipeline (`pp_pipeline`). A tick
#   costs 0.075 s of overhead (scheduling, node sync, 7 stage hops) plus one stage's compute:
#   a 64-token prompt crosses the 8 stages in 0.62 s, 1K tokens in 0.70 s, an 8K chunk in
#   1.7 s, a lone 16K prompt (two chunks, the second attending to the first) in 4.2 s;
#   concurrent requests overlap in the pipeline.
# * transfer: 70 KB/token MLA latent KV copied to each of the 32 decode ranks (36.7 GB for
#   16K tokens) plus 100 MB of recurrent state per request, over 4 IB devices at an effective
#   3.65 GB/s each (14.6 GB/s, 2.52 s per 16K request; this is the C8 bottleneck), shared
#   fairly by concurrent transfers; 0.58 s fixed per transfer (bootstrap, notify, polling);
#   3.5 s once per decode peer for the RDMA endpoints (seed: first request 4.775 s TTFT vs
#   1.217 s warm).
# * decode (TP32 over 4 nodes): 33.3 ms per step at short context, 38.7 ms for one sequence
#   at 16.6K, 68 ms for 8 sequences at 16.6K (part of the attention cost follows the longest
#   context, not the sum); the seed's 63 ms TPOT at C8 averages over fewer running.
_KIMI_COST = dataclasses.replace(
    CostModel(),
    pp_pipeline=True,
    step_overhead_s=0.012,
    node_sync_s=0.004,
    pp_stage_s=0.0073,
    prefill_dense_s_per_token=7.0e-5,
    prefill_moe_s_per_token=1.0e-4,
    prefill_half_tokens=256.0,
    tp_comm_s_per_token=1.0e-6,
    ep_comm_s_per_token=1.0e-6,
    attn_s_per_token_ctx=3.5e-8,
    decode_weights_s=0.2048,
    decode_s_per_seq=5.0e-3,
    decode_attn_s_per_ctx_token=5.5e-6,
    decode_attn_s_per_max_ctx_token=1.85e-6,
)
_KIMI_TRANSFER = TransferModel(
    kv_replicated=True,
    state_bytes_per_request=1.0e8,
    gbps_per_device=3.65,
    max_parallel=None,
    base_latency_s=0.58,
    endpoint_setup_s=3.5,
)

PROFILES: Mapping[str, SimProfile] = MappingProxyType(
    {
        DEFAULT_PROFILE: SimProfile(
            name=DEFAULT_PROFILE,
            description="seed-000 reference cost model, generic Mooncake transfer",
            cost=CostModel(),
            transfer=TransferModel(),
        ),
        KIMI_K3_PD_PROFILE: SimProfile(
            name=KIMI_K3_PD_PROFILE,
            description="seed 003: Kimi-K3 PD, P PP8/TP4/EP4 mxfp4, D TP32/EP32 marlin, "
            "Mooncake mlx5_0..3",
            cost=_KIMI_COST,
            transfer=_KIMI_TRANSFER,
        ),
    }
)


def get_profile(name: str | None = None) -> SimProfile:
    """The profile called `name` (None: default); ValueError names the choices."""
    key = name or DEFAULT_PROFILE
    try:
        return PROFILES[key]
    except KeyError:
        raise ValueError(
            f"unknown simulator profile {key!r} (choices: {', '.join(PROFILES)})"
        ) from None
