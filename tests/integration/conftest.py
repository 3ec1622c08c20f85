"""Session fixtures for tests on real nodes: sshd on 127.0.0.2-5 and dockerd, made by
`.ci/setup_nodes.sh` (env SERVESWEEP_TEST_NODES names its directory). Without them these tests
skip locally and FAIL when env CI is set."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from servesweep.cluster.ssh import SshTransport
from servesweep.config.schema import RuntimeConfig, SshOptions
from servesweep.core.errors import TransportError
from tests.helpers import REPO
from tests.integration.nodes import DEFAULT_DIR, IMAGE, NODES, sim_in_docker, unavailable


@pytest.fixture(scope="session")
def nodes_dir() -> Path:
    path = Path(os.environ.get("SERVESWEEP_TEST_NODES") or DEFAULT_DIR)
    if not (path / "ssh_config").is_file():
        unavailable(f"no {path}/ssh_config (SERVESWEEP_TEST_NODES={path})")
    return path


@pytest.fixture(scope="session")
def ssh_options(nodes_dir: Path) -> SshOptions:
    return SshOptions(config_file=str(nodes_dir / "ssh_config"), connect_timeout_s=10)


@pytest.fixture(scope="session")
def ssh(ssh_options: SshOptions) -> Iterator[SshTransport]:
    transport = SshTransport(ssh_options, nodes=NODES)
    try:
        transport.check_reachable()
    except TransportError as exc:
        transport.close()
        unavailable(str(exc))
    yield transport
    transport.close()


@pytest.fixture(scope="session")
def docker_node(ssh: SshTransport) -> str:
    """A node whose docker daemon answers and has the sim image."""
    info = ssh.run("node1", "docker info --format '{{.ServerVersion}}'", timeout=60)
    if not info.ok:
        unavailable(f"docker daemon does not answer on node1: {info.stderr.strip()[-300:]}")
    image = ssh.run("node1", f"docker image inspect {IMAGE} > /dev/null", timeout=60)
    if not image.ok:
        unavailable(f"no image {IMAGE} on node1")
    return "node1"


@pytest.fixture(scope="session")
def sweeper_password(nodes_dir: Path) -> str:
    path = nodes_dir / "sweeper_password"
    if not path.is_file():
        unavailable(f"no {path}")
    return path.read_text().splitlines()[0]


@pytest.fixture(scope="session")
def sim_runtime() -> RuntimeConfig:
    """Docker settings that run this machine's Python in the empty imported image."""
    return RuntimeConfig(**sim_in_docker(REPO))


@pytest.fixture
def run_label() -> dict[str, str]:
    """A label unique to this test (containers of parallel runs never mix)."""
    return {"run": f"it-{uuid.uuid4().hex[:10]}"}


@pytest.fixture
def cleanup(ssh: SshTransport) -> Iterator[list[tuple[str, str]]]:
    """Containers (node, name-or-id) to remove as root after the test, whatever happened."""
    started: list[tuple[str, str]] = []
    yield started
    for node, handle in started:
        ssh.run(node.split("-")[0], f"docker rm -f {handle} > /dev/null 2>&1", timeout=60)
