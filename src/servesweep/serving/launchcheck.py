"""preflight: every launch command of this run parsed by its engine's own argument parser where
it will run, before the first start: by each node's python (process runtime), or in the image
(docker) unless build_images already parsed this very set (the image evidence is shared by
runs whose matrices differ)."""

from __future__ import annotations

import json
import logging
from typing import Any

from servesweep.cluster import argcheck
from servesweep.cluster.images import parse_launches
from servesweep.config.experiment import Experiment
from servesweep.core.errors import PreflightFailed, SmokeFailed
from servesweep.serving.engines import launch_targets
from servesweep.serving.servers import ServerManager

logger = logging.getLogger(__name__)

PARSE_TIMEOUT_S = 300.0  # `import sglang.srt.server_args` takes 10-30 s on a GPU node


def _built_digests(exp: Experiment, manager: ServerManager) -> list[str | None]:
    out = []
    for path in manager.paths.builds(exp):
        try:
            out.append(json.loads(path.read_text()).get("launch_args_digest"))
        except (OSError, ValueError):
            out.append(None)
    return out


def check_launch_args(*, exp: Experiment, manager: ServerManager) -> dict[str, Any]:
    """Parse every launch command (PreflightFailed naming node, server config and flag); the
    evidence: how many, where, and the set's digest."""
    launches = launch_targets(exp)
    if not launches:
        return {}
    want = argcheck.digest(launches)
    nodes = list(dict.fromkeys(exp.cluster.nodes))
    if exp.cluster.local:  # every node is this machine: one parse answers for all
        nodes = nodes[:1]
    if exp.runtime.imaged:
        built = _built_digests(exp, manager)
        if built and all(d == want for d in built):
            return {"digest": want, "parsed_by": "build_images", "commands": len(launches)}
        log = manager.paths.logs / "preflight_launch_args.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        try:
            for node in nodes:
                parse_launches(
                    exp=exp,
                    node=node,
                    runtime=manager.runtime,  # type: ignore[arg-type]
                    owner=manager.owner,
                    log=log,
                    launches=launches,
                )
        except SmokeFailed as exc:
            raise PreflightFailed(str(exc)) from None
        return {"digest": want, "parsed_by": "image", "commands": len(launches)}
    command = argcheck.parse_command(
        python=exp.engine.python, engine_kind=exp.engine.kind, launches=launches
    )
    for node in nodes:
        res = manager.transport.run(node, command, timeout=PARSE_TIMEOUT_S)
        count, refused = argcheck.rejected(res.stdout)
        if refused:
            first = refused[0]
            raise PreflightFailed(
                f"node {node}: {exp.engine.python}'s {exp.engine.kind} argument parser rejects "
                f"the launch command of {first.label}: {first.error[:300]}"
            )
        if not res.ok or count == 0:
            last = (res.stderr.strip().splitlines() or ["no output"])[-1][:200]
            raise PreflightFailed(
                f"node {node}: could not parse the launch commands with {exp.engine.python}'s "
                f"{exp.engine.kind} argument parser ({last})"
            )
    return {"digest": want, "parsed_by": "node python", "commands": len(launches)}
