"""build_images: on every node at once, make the base image present, build or pull the
image (docker; on Slurm, pyxis/apptainer import it once into a shared file), run its smoke
commands and content checks, keep evidence keyed by the image's inputs."""

from __future__ import annotations

import copy
import datetime as dt
import json
import logging
import re
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from servesweep.cluster import argcheck, contract, moekernel
from servesweep.cluster.argcheck import LaunchArgs
from servesweep.cluster.owner import Owner
from servesweep.cluster.runtime import DockerRuntime, Launch, owner_dir
from servesweep.cluster.slurm import SlurmRuntime
from servesweep.cluster.transport import fan_out
from servesweep.config.experiment import Experiment
from servesweep.config.guesses import ENGINE_VERSION, guessed
from servesweep.config.matrix import image_key
from servesweep.config.schema import BaseImage, ImageBuild, ImageCheck
from servesweep.core.errors import DOCTOR_HINT, SmokeFailed, Unreachable

logger = logging.getLogger(__name__)

BUILD_TIMEOUT_S = 7200.0
CONTRACT_KEY = "runtime.build.contract"
SMOKE_TIMEOUT_S = 600.0
MOE_KERNEL_TIMEOUT_S = 1800.0  # a model start on dummy weights, JIT and autotune included


def version_probe(exp: Experiment) -> str:
    """A smoke command printing the engine version inside the image."""
    module = "sglang" if exp.engine.kind == "sglang" else "servesweep"
    return f"{exp.engine.python} -c 'import {module}; print({module}.__version__)'"


# The image's package versions, from their metadata (no import): SGLang, its kernels, FlashInfer,
# the router, and which member of the Mooncake family (`mooncake-transfer-engine`, `-cuda13`,
# `-efa`, `-non-cuda`) is installed. One JSON line.
PACKAGES_PROBE = (
    "import importlib.metadata as m, json, re; "
    "d = {re.sub(r'[-_.]+', '-', x.metadata['Name'] or '').lower(): x.version "
    "for x in m.distributions()}; "
    "w = ['sglang', 'sgl-kernel', 'flashinfer-python', 'flashinfer-cubin', "
    "'flashinfer-jit-cache', 'sglang-router', 'torch']; "
    "o = {n: d.get(n) for n in w}; "
    "o['mooncake'] = sorted(n + '==' + v for n, v in d.items() "
    "if n.startswith('mooncake-transfer-engine')); "
    "print(json.dumps(o))"
)


def packages_probe(exp: Experiment) -> str:
    """A command printing the image's package versions as one JSON line."""
    return f"{exp.engine.python} -c {shlex.quote(PACKAGES_PROBE)}"


def _packages(
    *, exp: Experiment, node: str, runtime: DockerRuntime, owner: Owner, log: Path
) -> dict[str, Any]:
    """The image's package versions (recorded, never compared): {} when unreadable."""
    command = packages_probe(exp)
    returncode, output = _in_image(
        exp=exp, node=node, runtime=runtime, owner=owner, name="packages", command=command
    )
    _append(log, f"[packages rc={returncode}] {command}", output)
    try:
        found = json.loads(output.splitlines()[-1]) if returncode == 0 and output else {}
    except json.JSONDecodeError:
        found = {}
    return found if isinstance(found, dict) else {}


def _append(log: Path, title: str, text: str) -> None:
    with log.open("a") as fh:
        fh.write(f"$ {title}\n{text.rstrip()}\n\n")


def _present(runtime: DockerRuntime, node: str, image: str) -> bool:
    return runtime.run_docker(node, f"image inspect {shlex.quote(image)} >/dev/null 2>&1").ok


def ensure_base(*, base: BaseImage, node: str, runtime: DockerRuntime, log: Path) -> str:
    """Make the base image present on `node` before anything builds on it: `present`, or
    built from its dockerfile, or pulled; SmokeFailed when it is missing and neither is given."""
    if _present(runtime, node, base.image):
        _append(log, f"docker image inspect {base.image}", "base image present")
        return "present"
    if not (base.dockerfile or base.pull):
        raise SmokeFailed(
            f"base image {base.image} is missing on node {node} and runtime.build.base gives "
            f"neither a dockerfile nor pull: true to make it; log {log}"
        )
    return _docker_get(spec=base, image=base.image, node=node, runtime=runtime, log=log)


def _docker_get(
    *, spec: ImageBuild | BaseImage, image: str, node: str, runtime: DockerRuntime, log: Path
) -> str:
    """`docker build` (a dockerfile) or `docker pull` of `image` on `node`; the method."""
    cmd = docker_get_args(spec=spec, image=image)
    method = "build" if spec.dockerfile else "pull"
    res = runtime.run_docker(node, f"{cmd} 2>&1", timeout=BUILD_TIMEOUT_S)
    _append(log, f"docker {cmd}", res.stdout)
    if not res.ok:
        raise SmokeFailed(f"image {image}: docker {method} failed on node {node}; log {log}")
    return method


def docker_get_args(*, spec: ImageBuild | BaseImage, image: str) -> str:
    """The docker arguments that build (a dockerfile) or pull `image`."""
    quoted = shlex.quote(image)
    if spec.dockerfile:
        args = "".join(
            f"--build-arg {shlex.quote(f'{k}={v}')} " for k, v in spec.build_args.items()
        )
        return (
            f"build -t {quoted} -f {shlex.quote(spec.dockerfile)} {args}"
            f"{shlex.quote(spec.context or '.')}"
        )
    return f"pull {quoted}"


def build_commands(
    *,
    exp: Experiment,
    runtime: DockerRuntime,
    owner: Owner,
    launches: Sequence[LaunchArgs] = (),
) -> list[str]:
    """What build_images runs on every node (at once), as shell lines: the base image when
    missing, the build or pull, then each smoke command, the package probe, the parse of every
    launch command by the image's own parser, and each content check in the image."""
    lines = []
    build = exp.runtime.build
    prefix = runtime.docker_prefix()
    if build is not None and build.base is not None:
        base = build.base
        make = (
            f"{prefix} {docker_get_args(spec=base, image=base.image)}"
            if base.dockerfile or base.pull
            else "false  # base missing: give runtime.build.base.dockerfile or pull"
        )
        lines.append(f"{prefix} image inspect {shlex.quote(base.image)} >/dev/null || {make}")
    if build is not None and (build.dockerfile or build.pull):
        lines.append(f"{prefix} {docker_get_args(spec=build, image=runtime.image)}")
    node = "NODE"
    for i, command in enumerate([version_probe(exp), *exp.runtime.smoke]):
        launch = in_image_launch(
            exp=exp, node=node, owner=owner, name=f"smoke-{i}", command=command
        )
        lines.append(f"{runtime.oneshot_line(launch, gpus=True)}  # smoke: exit 0")
    for i, run in enumerate(moekernel.kernel_runs(exp)):
        launch = in_image_launch(
            exp=exp, node=node, owner=owner, name=f"moe-{i}", command=run.command
        )
        lines.append(
            f"{runtime.oneshot_line(launch, gpus=True)}  # moe kernel {run.backend!r}: runs once "
            f"on the GPU, exit 0 (no GPU: not run, said in the evidence)"
        )
    launch = in_image_launch(
        exp=exp, node=node, owner=owner, name="packages", command=packages_probe(exp)
    )
    lines.append(f"{runtime.oneshot_line(launch, gpus=True)}  # package versions, recorded")
    if exp.router is not None:
        command = argcheck.router_help(python=exp.engine.python, engine_kind=exp.engine.kind)
        launch = in_image_launch(
            exp=exp, node=node, owner=owner, name="router-help", command=command
        )
        wants = f", lists {argcheck.MINI_LB}" if exp.router.mini_lb else ""
        lines.append(f"{runtime.oneshot_line(launch, gpus=True)}  # router: exit 0{wants}")
    if launches:
        lines.append(
            f"# launch-args: {len(launches)} launch commands parsed in the image by its own "
            f"{exp.engine.kind} argument parser (servesweep.cluster.argcheck); a rejected flag "
            f"fails here, before any start"
        )
    if build is not None and build.contract is not None:
        base = build.contract.base or (build.base.image if build.base else "the Dockerfile's FROM")
        lines.append(
            f"# contract: packages and sglang files of {base} and of {runtime.image} compared "
            f"(servesweep.cluster.contract); a breach of runtime.build.contract fails here"
        )
    for check in exp.runtime.checks:
        launch = in_image_launch(
            exp=exp, node=node, owner=owner, name=f"check-{check.name}", command=check.command
        )
        lines.append(
            f"{runtime.oneshot_line(launch, gpus=True)}  # check {check.name}: output matches "
            f"{check.expect!r}"
        )
    return lines


def _acquire(*, exp: Experiment, node: str, runtime: DockerRuntime, log: Path) -> str:
    """Build (dockerfile), pull, or require a present image; return the method used."""
    build = exp.runtime.build
    if build is None or not (build.dockerfile or build.pull):
        return "present"
    return _docker_get(spec=build, image=runtime.image, node=node, runtime=runtime, log=log)


def build_image(
    *,
    exp: Experiment,
    node: str,
    runtime: DockerRuntime | SlurmRuntime,
    log: Path,
    owner: Owner,
    launches: Sequence[LaunchArgs] = (),
) -> dict[str, Any]:
    """Get the image onto `node`, smoke it, parse every launch command in `launches` with the
    image's own engine parser, run the checks; return the evidence (raises SmokeFailed)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as fh:  # the job's own log lines (logsetup.job_logging) share the file
        fh.write(f"# build_image node {node} image {runtime.image}\n")
    build = exp.runtime.build
    base = None
    if not isinstance(runtime, DockerRuntime):  # pyxis/apptainer on Slurm: one shared file
        method = runtime.acquire(node=node, log=log, timeout=BUILD_TIMEOUT_S)
        info: dict[str, Any] = runtime.image_info(node)
    else:
        if build is not None and build.base is not None:
            base = ensure_base(base=build.base, node=node, runtime=runtime, log=log)
        method = _acquire(exp=exp, node=node, runtime=runtime, log=log)
        fmt = shlex.quote("{{json .}}")
        res = runtime.run_docker(node, f"image inspect -f {fmt} {shlex.quote(runtime.image)}")
        if not res.ok:
            _append(log, "docker image inspect", res.stdout + res.stderr)
            raise SmokeFailed(f"image {runtime.image} is not present on node {node}; log {log}")
        info = json.loads(res.stdout)
    smoke = []
    for i, command in enumerate([version_probe(exp), *exp.runtime.smoke]):
        returncode, output = _in_image(
            exp=exp, node=node, runtime=runtime, owner=owner, name=f"smoke-{i}", command=command
        )
        _append(log, f"[smoke rc={returncode}] {command}", output)
        smoke.append({"command": command, "returncode": returncode, "output": output})
        if returncode != 0:
            raise SmokeFailed(
                f"image {runtime.image} failed smoke command {i} on node {node} "
                f"(exit {returncode}): {command}; log {log}"
            )
    reported = smoke[0]["output"].splitlines()[-1] if smoke[0]["output"] else None
    pinned = not guessed(exp.guesses, ENGINE_VERSION)
    if exp.engine.kind == "sglang" and reported != exp.engine.version:
        if pinned:
            raise SmokeFailed(
                f"image {runtime.image} on node {node} has SGLang {reported}, but engine.version "
                f"pins {exp.engine.version} (flags are chosen per version); log {log}"
            )
        note = f"engine.version {exp.engine.version} is a guess; the image has SGLang {reported}"
        _append(log, "[guess] engine.version", note)
        logger.warning("node %s: %s", node, note)
    packages = _packages(exp=exp, node=node, runtime=runtime, owner=owner, log=log)
    parsed = parse_launches(
        exp=exp, node=node, runtime=runtime, owner=owner, log=log, launches=launches
    )
    router = _router_smoke(exp=exp, node=node, runtime=runtime, owner=owner, log=log)
    held = _contract(exp=exp, node=node, runtime=runtime, owner=owner, log=log)
    checks = [
        _check(exp=exp, node=node, runtime=runtime, owner=owner, log=log, check=c)
        for c in exp.runtime.checks
    ]
    # last: a model start per MoE runner, the dearest of the checks
    kernels = _moe_kernels(exp=exp, node=node, runtime=runtime, owner=owner, log=log)
    return {
        "node": node,
        "image": runtime.image,
        "image_key": image_key(exp),
        "base": {"image": build.base.image, "method": base} if build and build.base else None,
        "image_id": info.get("Id"),
        "repo_digests": info.get("RepoDigests") or [],
        "created": info.get("Created"),
        "method": method,
        "engine_version": reported,
        "engine_version_pinned": exp.engine.version,
        "engine_version_guessed": not pinned,
        "packages": packages,
        "launch_commands_parsed": parsed,
        "launch_args_digest": argcheck.digest(launches) if launches else None,
        "router_help": router,
        "contract": held,
        "smoke": smoke,
        "moe_kernels": kernels,
        "checks": checks,
        "checked_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }


def _inventory(
    *, exp: Experiment, node: str, runtime: DockerRuntime, owner: Owner, image: str, name: str
) -> dict[str, Any]:
    """Packages and sglang files of `image` on `node` (SmokeFailed when unreadable)."""
    other = copy.copy(runtime)
    other.image = image
    command = contract.inventory_probe(exp.engine.python)
    returncode, output = _in_image(
        exp=exp, node=node, runtime=other, owner=owner, name=name, command=command
    )
    try:
        found = json.loads(output.splitlines()[-1]) if returncode == 0 and output else None
    except json.JSONDecodeError:
        found = None
    if not isinstance(found, dict):
        last = (output.splitlines() or ["(no output)"])[-1][:200]
        raise SmokeFailed(
            f"image {image} on node {node}: its inventory (packages, sglang files) could not be "
            f"read (exit {returncode}, last line: {last})"
        )
    return found


def _contract(
    *, exp: Experiment, node: str, runtime: DockerRuntime, owner: Owner, log: Path
) -> dict[str, Any] | None:
    """The image's difference to its base (runtime.build.contract): recorded; SmokeFailed
    naming each breach of what must not change. None without a contract."""
    build = exp.runtime.build
    if build is None or build.contract is None:
        return None
    base = build.contract.base or (build.base.image if build.base else None)
    if base is None and build.dockerfile:
        res = runtime.transport.run(node, f"cat {shlex.quote(build.dockerfile)}", timeout=60)
        base = contract.last_from(res.stdout) if res.ok else None
    if base is None:
        raise SmokeFailed(
            f"image {runtime.image} on node {node}: runtime.build.contract has no base image "
            f"and the last FROM of runtime.build.dockerfile cannot be read (give "
            f"runtime.build.contract.base); log {log}"
        )
    diff = contract.delta(
        _inventory(exp=exp, node=node, runtime=runtime, owner=owner, image=base, name="base-inv"),
        _inventory(
            exp=exp, node=node, runtime=runtime, owner=owner, image=runtime.image, name="inv"
        ),
    )
    # A guessed file count (runtime.build.contract.sglang_files_changed in `guesses`) is
    # recorded and warned on, never enforced.
    guess = guessed(exp.guesses, f"{CONTRACT_KEY}.sglang_files_changed")
    enforced = build.contract.model_copy(update={"sglang_files_changed": None} if guess else {})
    found = contract.breaches(enforced, diff)
    observed = [b for b in contract.breaches(build.contract, diff) if b not in found]
    _append(log, f"[contract against {base}: {len(found)} breaches]", json.dumps(diff, indent=1))
    for note in observed:
        _append(log, f"[guess] {CONTRACT_KEY}.sglang_files_changed", note)
        logger.warning("node %s: %s (the contract's file count is a guess)", node, note)
    if found:
        raise SmokeFailed(
            f"image {runtime.image} on node {node} breaks runtime.build.contract against its "
            f"base {base}: {'; '.join(found[:5])}; log {log}"
        )
    return {"base": base, "delta": diff, "guessed_breaches": observed}


def _moe_kernels(
    *, exp: Experiment, node: str, runtime: DockerRuntime, owner: Owner, log: Path
) -> list[dict[str, Any]]:
    """Each MoE runner the run chooses, run once on the node's GPU (cluster.moekernel): its
    evidence (`ran` false with the reason where no GPU is visible); SmokeFailed naming the
    runner and the GPU when its kernel fails."""
    out = []
    for i, run in enumerate(moekernel.kernel_runs(exp)):
        returncode, output = _in_image(
            exp=exp,
            node=node,
            runtime=runtime,
            owner=owner,
            name=f"moe-{i}",
            command=run.command,
            timeout=MOE_KERNEL_TIMEOUT_S,
        )
        _append(log, f"[moe kernel {run.backend} rc={returncode}] {run.command}", output)
        found = moekernel.verdict(output) if returncode == 0 else None
        if found is None:
            last = (output.splitlines() or ["(no output)"])[-1][:300]
            raise SmokeFailed(
                f"image {runtime.image} on node {node}: the MoE kernel of runner "
                f"{run.backend!r} does not run (exit {returncode}): {last}; log {log}"
            )
        if not found.get("ran"):
            logger.warning("node %s: MoE runner %s: %s", node, run.backend, found.get("reason"))
        out.append({**found, "command": run.command})
    return out


def _router_smoke(
    *, exp: Experiment, node: str, runtime: DockerRuntime, owner: Owner, log: Path
) -> dict[str, Any] | None:
    """The PD router's own `--help` in the image: it must run, and list `--mini-lb` when the
    config asks for it (else that shows only after P and D have loaded); None without one."""
    if exp.router is None:
        return None
    command = argcheck.router_help(python=exp.engine.python, engine_kind=exp.engine.kind)
    returncode, output = _in_image(
        exp=exp, node=node, runtime=runtime, owner=owner, name="router-help", command=command
    )
    has_mini_lb = argcheck.MINI_LB in output
    _append(log, f"[router help rc={returncode} mini_lb={has_mini_lb}] {command}", output)
    if returncode != 0:
        last = (output.splitlines() or ["(no output)"])[-1][:200]
        raise SmokeFailed(
            f"image {runtime.image} on node {node}: the router does not start: `{command}` "
            f"exited {returncode} (last line: {last}); log {log}"
        )
    if exp.router.mini_lb and not has_mini_lb:
        raise SmokeFailed(
            f"image {runtime.image} on node {node}: router.mini_lb is set, but the image's "
            f"router has no {argcheck.MINI_LB} (`{command}`; sglang-router <= 0.3.2 has it, "
            f"smg has not); log {log}"
        )
    return {"command": command, "returncode": returncode, "mini_lb": has_mini_lb}


def parse_launches(
    *,
    exp: Experiment,
    node: str,
    runtime: DockerRuntime,
    owner: Owner,
    log: Path,
    launches: Sequence[LaunchArgs],
) -> int:
    """Parse every launch command with the image's own parser (SGLang's ServerArgs, or the
    sim's); how many were parsed, or SmokeFailed naming the server config and the flag."""
    if not launches:
        return 0
    command = argcheck.parse_command(
        python=exp.engine.python, engine_kind=exp.engine.kind, launches=launches
    )
    returncode, output = _in_image(
        exp=exp, node=node, runtime=runtime, owner=owner, name="launch-args", command=command
    )
    count, refused = argcheck.rejected(output)
    _append(log, f"[launch args rc={returncode} parsed={count}] {len(launches)} commands", output)
    if refused:
        first = refused[0]
        more = f" (and {len(refused) - 1} more)" if len(refused) > 1 else ""
        raise SmokeFailed(
            f"image {runtime.image} on node {node}: its {exp.engine.kind} argument parser "
            f"rejects the launch command of {first.label}: {first.error[:300]}{more}; log {log}"
        )
    if returncode != 0 or count == 0:
        last = (output.splitlines() or ["(no output)"])[-1][:200]
        raise SmokeFailed(
            f"image {runtime.image} on node {node}: could not parse the launch commands with "
            f"its {exp.engine.kind} argument parser (exit {returncode}, last line: {last}); "
            f"log {log}"
        )
    return count


def in_image_launch(*, exp: Experiment, node: str, owner: Owner, name: str, command: str) -> Launch:
    """A one-shot container of the image running `command` (a smoke command or a check)."""
    return Launch(
        name=f"servesweep-{owner.tag}-{exp.run_id}-{name}-{node}",
        node=node,
        argv=["sh", "-c", command],
        log_path=f"{owner_dir(owner.tag)}/{exp.run_id}/smoke/{node}-{name}.log",
        labels={"run": exp.run_id, "role": "smoke", **owner.labels()},
    )


def _in_image(
    *,
    exp: Experiment,
    node: str,
    runtime: DockerRuntime,
    owner: Owner,
    name: str,
    command: str,
    timeout: float = SMOKE_TIMEOUT_S,
) -> tuple[int, str]:
    """Run `command` in a one-shot container of the image on `node`: (exit code, output)."""
    launch = in_image_launch(exp=exp, node=node, owner=owner, name=name, command=command)
    result = runtime.run_oneshot(launch, timeout=timeout, gpus=True)
    output = runtime.transport.run(node, f"cat {shlex.quote(launch.log_path)}", timeout=60)
    return result.returncode, output.stdout.strip()


def _check(
    *,
    exp: Experiment,
    node: str,
    runtime: DockerRuntime,
    owner: Owner,
    log: Path,
    check: ImageCheck,
) -> dict[str, Any]:
    """Run one config-declared content check; its evidence, or SmokeFailed naming it."""
    returncode, output = _in_image(
        exp=exp,
        node=node,
        runtime=runtime,
        owner=owner,
        name=f"check-{check.name}",
        command=check.command,
    )
    matched = returncode == 0 and re.search(check.expect, output, flags=re.M) is not None
    _append(log, f"[check {check.name} rc={returncode} matched={matched}] {check.command}", output)
    guess = guessed(exp.guesses, f"runtime.checks.{check.name}")
    if not matched and guess:
        logger.warning(
            "node %s: check %s (a guess, observed only) does not match %r",
            node,
            check.name,
            check.expect,
        )
    elif not matched:
        last = (output.splitlines() or ["(no output)"])[-1][:200]
        raise SmokeFailed(
            f"image {runtime.image} failed check {check.name} on node {node}: output does not "
            f"match {check.expect!r} (exit {returncode}, last line: {last}); log {log}"
        )
    return {
        "name": check.name,
        "command": check.command,
        "expect": check.expect,
        "returncode": returncode,
        "output": output,
        "matched": matched,
        "guess": guess,
    }


def build_images(
    *,
    exp: Experiment,
    runtime: DockerRuntime | SlurmRuntime,
    logs: Mapping[str, Path],
    owner: Owner,
    launches: Sequence[LaunchArgs] = (),
) -> dict[str, dict[str, Any]]:
    """build_image on every node of `logs` at once (the transport's parallel fan-out); the
    evidence per node. When any node fails, SmokeFailed names every failed node (the first
    failure's message first), after all have finished."""
    results = fan_out(
        list(logs),
        lambda node: build_image(
            exp=exp, node=node, runtime=runtime, log=logs[node], owner=owner, launches=launches
        ),
    )
    failed = {node: r for node, r in results.items() if isinstance(r, BaseException)}
    if failed:
        first = next(iter(failed.values()))
        if len(failed) == 1:
            raise first
        # All unreachable (or all one other kind): that kind, not a smoke failure.
        kind = type(first) if all(type(r) is type(first) for r in failed.values()) else SmokeFailed
        also = f" (also failed on nodes {', '.join(list(failed)[1:])})"
        text = str(first)
        if isinstance(first, Unreachable):  # the hint stays last
            text = text.removesuffix(f"; {DOCTOR_HINT}") + also + f"; {DOCTOR_HINT}"
        else:
            text += also
        raise kind(text)
    return {node: r for node, r in results.items() if not isinstance(r, BaseException)}
