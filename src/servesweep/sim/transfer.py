"""KV-cache transfer model of PD disaggregation: bytes, link bandwidth, warm-up (no I/O).

A transfer of one request from a prefill server (attention TP `p_tp`) to a decode server
(TP `d_tp`) moves::

    bytes = tokens * kv_bytes_per_token * (d_tp if kv_replicated else 1) * dtype_factor
          + state_bytes_per_request

`kv_bytes_per_token` is the cost model's per-GPU KV size of one token (all layers). With an
MLA-style latent cache every decode attention-TP rank holds the whole cache, so each of the
`d_tp` ranks receives a copy (`kv_replicated`); recurrent (Mamba / linear-attention) state is
sliced from the prefill TP layout to the decode one ("state slice TP4->TP32") and counted once.

The bytes go over the prefill server's link: `devices * gbps_per_device` GB/s, where devices
is the number of `--disaggregation-ib-device` names (at least 1). `gbps_per_device` is an
*effective* goodput fitted to measurements, far below an RDMA NIC's line rate: Mooncake
writes page-sized pieces per layer and per destination rank. Up to `max_parallel` transfers
share the link fairly (processor sharing, as concurrent RDMA flows do); more wait in FIFO
order (SGLang's transfer queues). Every transfer also pays `base_latency_s` off the link
(bootstrap handshake, completion notify and the decode side's polling), and the first
transfer to a decode peer after start pays `endpoint_setup_s` while Mooncake establishes the
RDMA endpoints (QP exchange and memory registration).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field

INSTANT_BACKENDS = frozenset({"fake"})


@dataclass(frozen=True)
class TransferModel:
    """Coefficients of the KV transfer (see the module docstring)."""

    kv_replicated: bool = True
    state_bytes_per_request: float = 0.0
    gbps_per_device: float = 12.0
    max_parallel: int | None = None
    base_latency_s: float = 0.02
    endpoint_setup_s: float = 1.0


@dataclass(frozen=True)
class TransferPlan:
    """One request's transfer: bytes over the link plus fixed latencies (simulated s)."""

    nbytes: float
    base_latency_s: float
    setup_s: float


def ib_device_count(value: str | None) -> int:
    """How many IB devices `--disaggregation-ib-device` names ('mlx5_0,mlx5_1' or a JSON map
    of GPU -> device); at least 1."""
    if not value:
        return 1
    text = value.strip()
    if text.startswith("{"):
        import json

        try:
            mapping = json.loads(text)
        except json.JSONDecodeError:
            return 1
        names: set[str] = set()
        for v in mapping.values() if isinstance(mapping, dict) else ():
            names.update(p.strip() for p in str(v).split(",") if p.strip())
        return max(1, len(names))
    return max(1, len({p.strip() for p in text.split(",") if p.strip()}))


def dtype_factor(kv_cache_dtype: str | None) -> float:
    """KV bytes relative to bf16 (fp8 halves, fp4 quarters)."""
    dtype = kv_cache_dtype or "auto"
    if "fp4" in dtype:
        return 0.25
    if "fp8" in dtype:
        return 0.5
    return 1.0


def link_bandwidth(*, model: TransferModel, ib_device: str | None) -> float:
    """Bytes per simulated second of a prefill server's transfer link."""
    return model.gbps_per_device * 1e9 * ib_device_count(ib_device)


def transfer_bytes(
    *,
    model: TransferModel,
    tokens: int,
    kv_bytes_per_token: float,
    decode_tp: int,
    kv_cache_dtype: str | None = None,
) -> float:
    """Bytes one request's transfer moves."""
    copies = max(1, decode_tp) if model.kv_replicated else 1
    kv = tokens * kv_bytes_per_token * copies * dtype_factor(kv_cache_dtype)
    return kv + model.state_bytes_per_request


def plan_transfer(
    *,
    model: TransferModel,
    tokens: int,
    kv_bytes_per_token: float,
    decode_tp: int,
    kv_cache_dtype: str | None = None,
    first_to_peer: bool = False,
    backend: str = "mooncake",
) -> TransferPlan:
    """What one request's transfer costs (the fake backend costs nothing)."""
    if backend in INSTANT_BACKENDS:
        return TransferPlan(nbytes=0.0, base_latency_s=0.0, setup_s=0.0)
    return TransferPlan(
        nbytes=transfer_bytes(
            model=model,
            tokens=tokens,
            kv_bytes_per_token=kv_bytes_per_token,
            decode_tp=decode_tp,
            kv_cache_dtype=kv_cache_dtype,
        ),
        base_latency_s=model.base_latency_s,
        setup_s=model.endpoint_setup_s if first_to_peer else 0.0,
    )


@dataclass
class _Flow:
    key: Hashable
    left: float


@dataclass
class TransferLink:
    """A link shared by concurrent transfers in simulated time: up to `max_parallel` flows
    progress at bandwidth / active each; the rest queue FIFO. Call `advance(now)` before
    `add` and to collect finished flows; `next_completion()` says when to call it next."""

    bandwidth: float
    max_parallel: int | None = None
    now: float = 0.0
    active: list[_Flow] = field(default_factory=list)
    queued: deque[_Flow] = field(default_factory=deque)

    def __post_init__(self) -> None:
        if self.bandwidth <= 0:
            raise ValueError(f"bandwidth must be > 0, got {self.bandwidth}")

    @property
    def busy(self) -> bool:
        return bool(self.active or self.queued)

    def _fill(self) -> None:
        cap = self.max_parallel or math.inf
        while self.queued and len(self.active) < cap:
            self.active.append(self.queued.popleft())

    def add(self, *, key: Hashable, nbytes: float, now: float) -> list[Hashable]:
        """Start (or queue) a flow at `now`; returns flows that finished up to `now`."""
        done = self.advance(now)
        self.queued.append(_Flow(key=key, left=max(0.0, nbytes)))
        self._fill()
        return done + self._pop_empty()

    def _pop_empty(self) -> list[Hashable]:
        done = [f.key for f in self.active if f.left <= 0.0]
        if done:
            self.active = [f for f in self.active if f.left > 0.0]
            self._fill()
            done += self._pop_empty()
        return done

    def next_completion(self) -> float | None:
        """Simulated time the next active flow finishes (None when idle)."""
        if not self.active:
            return None
        rate = self.bandwidth / len(self.active)
        return self.now + min(f.left for f in self.active) / rate

    def advance(self, now: float) -> list[Hashable]:
        """Progress every flow to `now`; return the keys that finished, in order."""
        done: list[Hashable] = []
        while self.active:
            shortest = min(f.left for f in self.active)
            rate = self.bandwidth / len(self.active)
            nxt = self.now + shortest / rate
            if nxt > now:
                break
            self.now = nxt
            for f in self.active:  # the shortest flows end exactly (no float residue)
                f.left = 0.0 if f.left <= shortest * (1 + 1e-12) else f.left - shortest
            done += self._pop_empty()
        if self.active and now > self.now:
            rate = self.bandwidth / len(self.active)
            for f in self.active:
                f.left -= (now - self.now) * rate
        self.now = max(self.now, now)
        return done
