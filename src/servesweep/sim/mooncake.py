"""What a PD server's Mooncake start prints: SGLang's own server-args lines and the transfer
engine's glog lines (C++, outside Python's logging).

Seen on SGLang 0.5.17 with mooncake-transfer-engine 0.3.14, prefill and decode on one H100
(2026-12-07, tests/fixtures/real/logs/pd-1gpu-0517-mooncake-tcp-prefill-batches.log): without
`--disaggregation-ib-device`, SGLang warns that it falls back to auto discovery, Mooncake finds
no HCA and installs TCP, and each side logs one healthy `E... transfer_metadata.cpp:1367] Local
segment descriptor not found` at start. Not seen, from Mooncake's source
(`transfer_engine_impl.cpp`, whose strings the 0.3.14 wheel holds): with devices, `Found N
HCAs.` and `Using RDMA transport (RoCE/iWARP)`; with `MC_FORCE_TCP` (which
`--disaggregation-transfer-backend mooncake_tcp` sets) `MC_FORCE_TCP is set, using TCP
transport only` instead of the discovery. The `file:line` of those two are guessed.
"""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Mapping
from datetime import datetime, timedelta

NO_IB_DEVICES = "No IB devices specified for Mooncake backend, falling back to auto discovery."
MOONCAKE_TCP_BACKEND = (
    "disaggregation transfer backend 'mooncake_tcp' -> mooncake with MC_FORCE_TCP=1 "
    "(TCP transport, no RDMA)"
)
TCP_TRANSPORT = "Using TCP transport (no HCA detected)"
RDMA_TRANSPORT = "Using RDMA transport (RoCE/iWARP)"
FORCE_TCP = "MC_FORCE_TCP is set, using TCP transport only"
SEGMENT_NOT_FOUND = "Local segment descriptor not found"
HANDSHAKE_PORT = 12001  # Mooncake's default handshake port (globalConfig().handshake_port)
RPC_PORTS = (15000, 17000)  # where the P2P handshake's listening port fell (16467 seen)
GLOG_STEP_US = 60  # between two lines of the start (55-130 us seen)


def server_args_lines(*, backend: str, ib_device: str | None) -> list[tuple[str, str]]:
    """(level, message) of SGLang's server-args lines for a PD role's transfer backend
    (`handle_pd_disaggregation`, `_validate_ib_devices`)."""
    lines = []
    if backend == "mooncake_tcp":
        lines.append(("info", MOONCAKE_TCP_BACKEND))
        backend, ib_device = "mooncake", None
    if backend == "mooncake" and ib_device is None:
        lines.append(("warning", NO_IB_DEVICES))
    return lines


def hca_count(ib_device: str) -> int:
    """Devices in `--disaggregation-ib-device`: `mlx5_0,mlx5_1` or a per-GPU JSON map."""
    try:
        groups = list(json.loads(ib_device).values())
    except (ValueError, AttributeError):
        groups = [ib_device]
    return len({d.strip() for group in groups for d in str(group).split(",") if d.strip()})


def glog(level: str, source: str, message: str, *, when: datetime, tid: int) -> str:
    """A glog line: `I1207 16:03:23.150265  1282 transfer_engine_impl.cpp:488] message`."""
    return f"{level}{when:%m%d %H:%M:%S}.{when.microsecond:06d} {tid:5d} {source}] {message}"


def transfer_engine_lines(
    *,
    backend: str,
    ib_device: str | None,
    host: str,
    env: Mapping[str, str],
    noise: bool,
    rng: random.Random | None = None,
    when: datetime | None = None,
) -> list[str]:
    """The glog lines of Mooncake's TransferEngine start on one rank (none for another
    backend). `noise`: with the healthy `Local segment descriptor not found` E line."""
    if backend not in ("mooncake", "mooncake_tcp"):
        return []
    force_tcp = backend == "mooncake_tcp" or "MC_FORCE_TCP" in env
    if force_tcp:
        ib_device = None
    protocol = env.get("MOONCAKE_PROTOCOL", "rdma")
    rpc_port = (rng or random.Random()).randint(*RPC_PORTS)
    now = when or datetime.now()
    tid = threading.get_native_id()
    impl = "transfer_engine_impl.cpp"
    out: list[tuple[str, str, str]] = []
    if protocol == "tcp":
        allocator = f"Using 64KB-aligned malloc/free for protocol: {protocol}"
        out.append(("W", "transfer_engine_py.cpp:301", allocator))
    out += [
        ("I", f"{impl}:1184", "Metrics reporting is disabled (set MC_TE_METRIC=1 to enable)"),
        (
            "I",
            f"{impl}:147",
            f"Transfer Engine parseHostNameWithPort. server_name: {host} port: {HANDSHAKE_PORT}",
        ),
        (
            "I",
            f"{impl}:214",
            f"Transfer Engine RPC using P2P handshake, listening on {host}:{rpc_port}",
        ),
    ]
    if force_tcp:
        out.append(("I", f"{impl}:231", FORCE_TCP))
    else:
        hcas = hca_count(ib_device) if ib_device else 0
        out.append(("I", f"{impl}:318", "Auto-discovering topology..."))
        out.append(("I", f"{impl}:345", f"Topology discovery complete. Found {hcas} HCAs."))
        out.append(
            ("I", f"{impl}:480", RDMA_TRANSPORT) if hcas else ("I", f"{impl}:488", TCP_TRANSPORT)
        )
    if noise:
        out.append(("E", "transfer_metadata.cpp:1367", SEGMENT_NOT_FOUND))
    step = timedelta(microseconds=GLOG_STEP_US)
    return [
        glog(level, source, message, when=now + k * step, tid=tid)
        for k, (level, source, message) in enumerate(out)
    ]
