"""Constants and helpers of the integration tests (the nodes made by .ci/setup_nodes.sh)."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

from servesweep.cluster.runtime import DockerRuntime
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
