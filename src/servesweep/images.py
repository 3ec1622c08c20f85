"""build_image: build or pull the image on a node, run the capability smoke, keep evidence."""

from __future__ import annotations

import datetime as dt
import json
import shlex
from pathlib import Path
from typing import Any

from servesweep.config import Experiment
from servesweep.errors import SmokeFailed
from servesweep.owner import Owner
from servesweep.runtime import ONESHOT_DIR, DockerRuntime, Launch

BUILD_TIMEOUT_S = 7200.0
SMOKE_TIMEOUT_S = 600.0


def version_probe(exp: Experiment) -> str:
    """A smoke command printing the engine version inside the image."""
    module = "sglang" if exp.engine.kind == "sglang" else "servesweep"
    return f"{exp.engine.python} -c 'import {module}; print({module}.__version__)'"


def _append(log: Path, title: str, text: str) -> None:
    with log.open("a") as fh:
        fh.write(f"$ {title}\n{text.rstrip()}\n\n")


def _acquire(*, exp: Experiment, node: str, runtime: DockerRuntime, log: Path) -> str:
    """Build (dockerfile), pull, or require a present image; return the method used."""
    image = shlex.quote(runtime.image)
    build = exp.runtime.build
    if build is not None and build.dockerfile:
        args = " ".join(
            f"--build-arg {shlex.quote(f'{k}={v}')}" for k, v in build.build_args.items()
        )
        cmd = (
            f"build -t {image} -f {shlex.quote(build.dockerfile)} {args} "
            f"{shlex.quote(build.context or '.')}"
        )
        method = "build"
    elif build is not None and build.pull:
        cmd, method = f"pull {image}", "pull"
    else:
        return "present"
    res = runtime.run_docker(node, f"{cmd} 2>&1", timeout=BUILD_TIMEOUT_S)
    _append(log, f"docker {cmd}", res.stdout)
    if not res.ok:
        raise SmokeFailed(
            f"image {runtime.image}: docker {method} failed on node {node}; log {log}"
        )
    return method


def build_image(
    *, exp: Experiment, node: str, runtime: DockerRuntime, log: Path, owner: Owner
) -> dict[str, Any]:
    """Get the image onto `node`, smoke it, return the evidence (raises SmokeFailed)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as fh:  # the job's own log lines (logsetup.job_logging) share the file
        fh.write(f"# build_image node {node} image {runtime.image}\n")
    method = _acquire(exp=exp, node=node, runtime=runtime, log=log)
    fmt = shlex.quote("{{json .}}")
    res = runtime.run_docker(node, f"image inspect -f {fmt} {shlex.quote(runtime.image)}")
    if not res.ok:
        _append(log, "docker image inspect", res.stdout + res.stderr)
        raise SmokeFailed(f"image {runtime.image} is not present on node {node}; log {log}")
    info = json.loads(res.stdout)
    smoke = []
    for i, command in enumerate([version_probe(exp), *exp.runtime.smoke]):
        launch = Launch(
            name=f"servesweep-{owner.tag}-{exp.run_id}-smoke-{node}-{i}",
            node=node,
            argv=["sh", "-c", command],
            log_path=f"{ONESHOT_DIR}/{owner.tag}/{exp.run_id}/smoke/{node}-{i}.log",
            labels={"run": exp.run_id, "role": "smoke", **owner.labels()},
        )
        result = runtime.run_oneshot(launch, timeout=SMOKE_TIMEOUT_S, gpus=True)
        output = runtime.transport.run(node, f"cat {shlex.quote(launch.log_path)}", timeout=60)
        _append(log, f"[smoke rc={result.returncode}] {command}", output.stdout)
        smoke.append(
            {"command": command, "returncode": result.returncode, "output": output.stdout.strip()}
        )
        if not result.ok:
            raise SmokeFailed(
                f"image {runtime.image} failed smoke command {i} on node {node} "
                f"(exit {result.returncode}): {command}; log {log}"
            )
    reported = smoke[0]["output"].splitlines()[-1] if smoke[0]["output"] else None
    if exp.engine.kind == "sglang" and reported != exp.engine.version:
        raise SmokeFailed(
            f"image {runtime.image} on node {node} has SGLang {reported}, but engine.version pins "
            f"{exp.engine.version} (flags are chosen per version); log {log}"
        )
    return {
        "node": node,
        "image": runtime.image,
        "image_id": info.get("Id"),
        "repo_digests": info.get("RepoDigests") or [],
        "created": info.get("Created"),
        "method": method,
        "engine_version": reported,
        "engine_version_pinned": exp.engine.version,
        "smoke": smoke,
        "checked_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }
