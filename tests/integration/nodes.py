"""Constants and helpers of the integration tests (the nodes made by .ci/setup_nodes.sh)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NoReturn

import pytest

from servesweep.cluster.runtime import DockerRuntime, host_python_mounts
from servesweep.cluster.ssh import SshTransport
from servesweep.config.schema import RuntimeConfig
from tests.helpers import wait_until  # noqa: F401 (re-exported)
from tests.support.simprocess import free_port  # noqa: F401 (re-exported)

NODES = ("node1", "node2", "node3", "node4")
ADDRESSES = {"node1": "127.0.0.2", "node2": "127.0.0.3", "node3": "127.0.0.4", "node4": "127.0.0.5"}
IMAGE = "servesweep-sim:local"
DEFAULT_DIR = "/tmp/servesweep-nodes"
SETUP_HINT = 'run `eval "$(bash .ci/setup_nodes.sh)"` as root first'


def unavailable(reason: str) -> NoReturn:
    """Skip locally; fail under CI, where the nodes must exist."""
    message = f"integration nodes unavailable: {reason}; {SETUP_HINT}"
    if os.environ.get("CI"):
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def root_docker(ssh: SshTransport, runtime: RuntimeConfig) -> DockerRuntime:
    return DockerRuntime(ssh, runtime, sudo_password=None, gpus=None)


def ssh_cluster(nodes_dir: Path, nodes: Iterable[str], **settings: Any) -> dict[str, Any]:
    """The `cluster:` section for `nodes` over SSH (`node1` or a user's alias `node1-sweeper`)."""
    nodes = list(nodes)
    return {
        "transport": "ssh",
        "nodes": nodes,
        "addresses": {n: ADDRESSES[n.split("-")[0]] for n in nodes},
        "ssh": {"config_file": str(nodes_dir / "ssh_config")},
        **settings,
    }


def sim_in_docker(checkout: Path, *, mounts: Iterable[str] = (), **settings: Any) -> dict[str, Any]:
    """The `runtime:` section that runs the sim in docker on the test nodes: the empty image
    `IMAGE`, this machine's Python mounted read-only (`engine.python: python3` resolves to it),
    and servesweep imported from `checkout`, the tree under test (a worktree's own code, never
    the pip-installed checkout). `mounts`: more `host:container:ro`; `settings`: other keys."""
    src = checkout / "src"
    own = [f"{src}:{src}:ro", "/usr/bin:/usr/bin:ro", "/bin:/bin:ro", *mounts]
    return {
        "kind": "docker",
        "image": IMAGE,
        "gpus": None,
        "shm_size": "64m",
        "mounts": list(dict.fromkeys([*host_python_mounts(), *own])),
        "env": {
            "PATH": f"{sys.prefix}/bin:/usr/bin:/bin",
            "PYTHONPATH": str(src),
            "PYTHONUNBUFFERED": "1",
        },
        **settings,
    }
