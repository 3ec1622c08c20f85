"""Prefill and decode agree on the KV layout they hand over, as both running servers report it.

The config check compares what the config says; this compares what the servers resolved (an
`auto` KV dtype, a page size a backend forced, a hybrid model's Mamba state dtype), read from
each role's `/server_info` before the first measured request. A mismatch corrupts the
transferred KV silently (sglang#36371 for the Mamba SSM state dtype of hybrid models such as
Kimi-K3), so it fails the start."""

from __future__ import annotations

from typing import Any

from servesweep.cluster import http
from servesweep.config.schema import PD_ROLES
from servesweep.core.errors import ServerStartError
from servesweep.serving.state import ServerState

AGREED = ("page_size", "kv_cache_dtype", "mamba_ssm_dtype")
INFO_TIMEOUT_S = 30.0


def served_args(info: Any) -> dict[str, Any]:
    """The server args of a `/server_info` answer (a PD prefill nests them per DP rank in
    older releases: the first one)."""
    if isinstance(info, list):
        info = info[0] if info else {}
    return info if isinstance(info, dict) else {}


def check_pd_agreement(state: ServerState) -> dict[str, Any]:
    """The AGREED values both roles report; ServerStartError naming the field and both values
    on a mismatch, or when a role does not answer `/server_info`."""
    urls = {r.role: r.url for r in state.ranks if r.role in PD_ROLES and r.rank == 0 and r.url}
    if set(urls) != set(PD_ROLES):
        return {}
    infos = {}
    for role, url in urls.items():
        info = http.get_json(f"{url}/server_info", INFO_TIMEOUT_S)
        if info is None:
            raise ServerStartError(
                f"server {state.server_id}: {role} at {url} did not answer /server_info, so "
                f"prefill/decode agreement ({', '.join(AGREED)}) cannot be checked"
            )
        infos[role] = served_args(info)
    agreed = {}
    for field in AGREED:
        p, d = infos["prefill"].get(field), infos["decode"].get(field)
        if p != d:
            raise ServerStartError(
                f"server {state.server_id}: prefill and decode disagree on {field}: prefill "
                f"{p!r}, decode {d!r} (the transferred KV would be read wrongly)"
            )
        agreed[field] = p
    return agreed
