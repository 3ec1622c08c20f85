"""Tests of servesweep.serving.launchcheck: preflight parses every launch command of the run
with the engine's own parser where it runs (the node's python; the image unless build_images
parsed the same set)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

from servesweep.cluster import argcheck
from servesweep.cluster.access import open_cluster
from servesweep.config.load import load_experiment
from servesweep.config.paths import RunPaths
from servesweep.core.errors import PreflightFailed
from servesweep.serving.engines import launch_targets
from servesweep.serving.launchcheck import check_launch_args
from servesweep.serving.preflight import run_preflight
from servesweep.serving.servers import ServerManager
from tests.helpers import DEFAULT_CONFIG, deep_update, free_port
from tests.unit.test_images import docker  # noqa: F401  (the docker stand-in fixture)


def _manager(tmp_path: Path, **changes) -> ServerManager:
    raw = deep_update(yaml.safe_load(DEFAULT_CONFIG.read_text()), changes)
    exp = load_experiment(raw, {})
    return ServerManager(exp, RunPaths(tmp_path / exp.run_id), cluster=open_cluster(exp))


def test_the_nodes_python_parses_every_command_and_an_unknown_flag_fails_preflight(
    tmp_path: Path,
) -> None:
    m = _manager(tmp_path, engine={"port": free_port(), "python": sys.executable})
    evidence = run_preflight(exp=m.exp, manager=m)
    assert evidence["launch_args"]["parsed_by"] == "node python"
    assert evidence["launch_args"]["commands"] == len(launch_targets(m.exp))
    bad = _manager(
        tmp_path,
        engine={"port": free_port(), "python": sys.executable},
        server={"extra_args": ["--bogus-flag"]},
    )
    with pytest.raises(PreflightFailed) as info:
        check_launch_args(exp=bad.exp, manager=bad)
    text = str(info.value)
    assert text.startswith("node local: ") and "rejects the launch command of server config" in text
    assert "unrecognized arguments: --bogus-flag" in text


def test_docker_reparses_in_the_image_only_when_build_images_parsed_another_set(
    tmp_path: Path,
    docker: Path,  # noqa: F811
) -> None:
    changes = {
        "runtime": {"kind": "docker", "image": "img:test", "gpus": None},
        "engine": {"python": sys.executable},
    }
    m = _manager(tmp_path, **changes)
    want = argcheck.digest(launch_targets(m.exp))
    for path in m.paths.builds(m.exp):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"launch_args_digest": want}))
    assert check_launch_args(exp=m.exp, manager=m)["parsed_by"] == "build_images"
    calls = docker.read_text().splitlines() if docker.exists() else []
    assert not [c for c in calls if json.loads(c)[0] == "run"], "nothing run in the image"
    # A run with another matrix shares the image evidence: its commands are parsed again.
    bad = _manager(tmp_path, **changes, server={"extra_args": ["--bogus-flag"]})
    with pytest.raises(PreflightFailed, match="unrecognized arguments: --bogus-flag"):
        check_launch_args(exp=bad.exp, manager=bad)
    assert "launch args" in (bad.paths.logs / "preflight_launch_args.log").read_text()
