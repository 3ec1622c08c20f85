"""manifest.json: resolved config, fingerprints, node pools, git SHA, package/engine/image
versions."""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import json
import platform
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from servesweep import __version__
from servesweep.cluster.pools import PoolPlan, pooled_specs
from servesweep.cluster.runtime import COMPILE_CACHE_ENV, compile_cache_dir
from servesweep.config.experiment import Experiment
from servesweep.config.guesses import ENGINE_VERSION, guess_values, guessed

PACKAGES = ("servesweep", "snakemake", "pydantic", "pandas", "aiohttp", "paramiko", "seaborn")


def git_sha(repo: Path) -> str:
    """HEAD of the workflow's git checkout, '+dirty' if it has changes; 'unknown' outside git."""
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=repo,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return sha + ("+dirty" if dirty.strip() else "")


def package_versions() -> dict[str, str]:
    """Installed versions of the packages that shape results."""
    out = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            # servesweep run from a checkout on PYTHONPATH (the GPU rehearsal) has no metadata
            out[name] = __version__ if name == "servesweep" else "not installed"
    return out


def image_records(builds: Sequence[Path]) -> list[dict[str, Any]]:
    """Per node: the image's digest and what its smoke commands and checks printed (the
    build_images evidence, results/.images/<key>/<node>.json)."""
    out = []
    for path in builds:
        data = json.loads(path.read_text())
        out.append(
            {
                "node": data.get("node"),
                "image": data.get("image"),
                "image_key": data.get("image_key"),
                "image_id": data.get("image_id"),
                "repo_digests": data.get("repo_digests", []),
                "base": data.get("base"),
                "method": data.get("method"),
                "engine_version": data.get("engine_version"),
                "engine_version_guessed": data.get("engine_version_guessed", False),
                "packages": data.get("packages", {}),
                "launch_commands_parsed": data.get("launch_commands_parsed"),
                "router_help": data.get("router_help"),
                "smoke": [{"command": s["command"], "output": s["output"]} for s in data["smoke"]],
                # per MoE runner: ran on which GPU, or why not (no GPU visible)
                "moe_kernels": [
                    {k: m.get(k) for k in ("backend", "ran", "gpu", "sm", "reason")}
                    for m in data.get("moe_kernels", [])
                ],
                "checks": [
                    {k: c.get(k) for k in ("name", "expect", "output", "matched", "guess")}
                    for c in data.get("checks", [])
                ],
                "checked_at": data.get("checked_at"),
                # The whole evidence file, verbatim: results/.images/ lies outside the run
                # folder, so a copied run folder carries its image evidence here.
                "evidence": data,
            }
        )
    return out


def build_manifest(
    *,
    exp: Experiment,
    server_info: Sequence[Path],
    repo: Path,
    pools: PoolPlan,
    builds: Sequence[Path] = (),
    superseded: Sequence[str] = (),
    owner_tag: str = "",
) -> dict[str, Any]:
    """Everything needed to know what ran: config, servers (each in its pool), versions,
    engine reports, images.
    `server_info`: the /server_info snapshots of the run (service/<server>/server_info.json);
    `builds`: the image evidence per node (docker runtimes); `superseded`: the records reruns
    replaced, kept under raw/.superseded/ (relative to the run folder)."""
    infos = {path.parent.name: path for path in server_info}
    servers = []
    for spec in pooled_specs(exp, pools):
        info_path = infos.get(spec.id)
        info = json.loads(info_path.read_text()) if info_path is not None else {}
        servers.append(
            {
                "id": spec.id,
                "fingerprint": spec.fingerprint,
                "pool": spec.pool,
                "axes": spec.axes,
                "roles": [
                    {
                        "role": r.name,
                        "nodes": list(r.nodes),
                        "port": r.port,
                        "args": r.args.model_dump(),
                    }
                    for r in spec.roles
                ],
                "router": spec.router.model_dump() if spec.router else None,
                "engine_version_reported": info.get("version"),
            }
        )
    return {
        "run_id": exp.run_id,
        "written_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "git_sha": git_sha(repo),
        "versions": package_versions(),
        "engine": {
            "kind": exp.engine.kind,
            "simulated": exp.engine.kind == "sim",
            # simulated seconds x time_scale = wall seconds (None for a real engine)
            "time_scale": exp.engine.sim.time_scale if exp.engine.kind == "sim" else None,
            "version_pinned": exp.engine.version,
            "version_guessed": guessed(exp.guesses, ENGINE_VERSION),
            "image": exp.runtime.image,
        },
        "images": image_records(builds),
        # The per-node folder the servers' JIT caches outlive their containers in.
        "compile_cache": {
            "enabled": exp.runtime.compile_cache.enabled,
            "dir": compile_cache_dir(
                exp.runtime, engine_version=exp.engine.version, owner_tag=owner_tag
            )
            if owner_tag
            else None,
            "env": sorted(COMPILE_CACHE_ENV) if exp.runtime.compile_cache.enabled else [],
        },
        "pools": pools.to_dict()["pools"],
        "servers": servers,
        "superseded": list(superseded),
        "guesses": [{"key": k, "value": v} for k, v in guess_values(exp)],
        "config": exp.model_dump(mode="json"),
    }
