"""The dry fire: a server set's exact topology with dummy weights and one layer per pipeline
stage, answering one request, before the expensive real start (ServerManager.dry_fire)."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable

from servesweep.cluster import http
from servesweep.cluster.secrets import Secret
from servesweep.config.experiment import Experiment
from servesweep.config.matrix import ServerSpec
from servesweep.core.errors import ServerStartError
from servesweep.serving import evidence
from servesweep.serving.engines import ROUTER_ROLE
from servesweep.serving.state import RankState, ServerState

DRY_SUFFIX = "-dry"
# The one request: a few tokens, greedy. Dummy weights answer nonsense, so only its arrival
# counts (and, for PD, that its KV crossed: the decode side answers only after the transfer).
REQUEST = {
    "text": "servesweep dry fire",
    "sampling_params": {"max_new_tokens": 4, "temperature": 0},
}
REQUEST_TIMEOUT_S = 300.0
# Lines that say where a failed request broke (SGLang's and the sim's), the most telling first.
BROKE = (
    re.compile(r"^.*(?:KVTransferError|Failed to get kvcache).*$", re.M),
    re.compile(r"^.*(?:Traceback|Error).*$", re.M),
)


def dry_flags(layers: int) -> list[str]:
    """The launch flags a dry fire adds: random weights, `layers` hidden layers."""
    return [
        "--load-format",
        "dummy",
        "--json-model-override-args",
        json.dumps({"num_hidden_layers": layers}),
    ]


def dry_spec(spec: ServerSpec) -> ServerSpec:
    """`spec` with `--load-format dummy` and `--json-model-override-args` keeping one layer per
    pipeline stage (the largest pp_size of its roles), under its own fingerprint (its
    processes' labels and names never match the real set's)."""
    extra = dry_flags(max(role.args.pp_size for role in spec.roles))
    roles = tuple(
        dataclasses.replace(
            role, args=role.args.model_copy(update={"extra_args": [*role.args.extra_args, *extra]})
        )
        for role in spec.roles
    )
    return dataclasses.replace(spec, roles=roles, fingerprint=spec.fingerprint + DRY_SUFFIX)


def first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0][:300]


def _culprit(state: ServerState, read: Callable[[RankState], str]) -> str:
    """`role R node N log L: <line>` of the first process whose log says what broke (engines
    before the router), else of the entry process."""
    ranks = sorted(state.ranks, key=lambda r: r.role == ROUTER_ROLE)
    texts = {id(rank): read(rank) for rank in ranks}
    for pattern in BROKE:
        for rank in ranks:
            lines = pattern.findall(texts[id(rank)])
            if lines:
                line = lines[-1].strip()[:200]
                return f"role {rank.role} node {rank.node} log {rank.log_path}: {line}"
    head = ranks[-1]
    return f"role {head.role} node {head.node} log {head.log_path}"


def fire_one(
    exp: Experiment,
    state: ServerState,
    *,
    key: Secret | None,
    read: Callable[[RankState], str],
) -> None:
    """Send the one request to the set's entry (the router for PD) and require an answer, then
    each enforced evidence pattern (evidence.enforced) once in its role's logs; ServerStartError
    naming role, node and log otherwise."""
    timeout = min(REQUEST_TIMEOUT_S, exp.engine.ready_timeout_s)
    status, answer = http.post_json(f"{state.base_url}/generate", REQUEST, timeout=timeout, key=key)
    if status != 200 or not isinstance(answer, dict) or "error" in answer:
        got = "no answer" if status is None else f"HTTP {status}"
        raise ServerStartError(
            f"the request to {state.base_url} failed ({got}); {_culprit(state, read)}"
        )
    patterns = {
        name: p
        for name, p in evidence.enforced(exp.evidence, exp.guesses).items()
        if p.min_per_cell > 0
    }
    logs = [evidence.RankLog(r.role, lambda r=r: read(r), r.log_path) for r in state.ranks]
    counts = evidence.count(patterns, logs)
    missing = [name for name, n in counts.items() if n < 1]
    if missing:
        name = missing[0]
        role = patterns[name].role
        where = next((r for r in state.ranks if r.role == role), state.ranks[0])
        raise ServerStartError(
            f"the request was answered but no {name} evidence ({patterns[name].pattern!r}) in "
            f"the {role} logs: role {role} node {where.node} log {where.log_path}"
        )
