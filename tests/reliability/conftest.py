"""Fixtures of the fault-injection suite: the fault shim, checks, the uninterrupted reference."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from tests.integration.conftest import docker_node, nodes_dir, ssh, ssh_options  # noqa: F401
from tests.reliability.harness import (
    Checks,
    FaultShim,
    Run,
    cluster_config,
    kill_local_leftovers,
    local_config,
    remove_containers,
    unique_run_id,
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "reliability: fault-injection scenarios (docs/reliability.md)"
    )


@pytest.fixture()
def checks(record_property: Callable[[str, object], None]) -> Checks:
    return Checks(record_property)


@pytest.fixture()
def shim(tmp_path: Path) -> FaultShim:
    return FaultShim.create(tmp_path / "shim")


@pytest.fixture()
def make_run(
    tmp_path: Path, shim: FaultShim, request: pytest.FixtureRequest
) -> Iterator[Callable[..., Run]]:
    """Runs of a slice of the suite's matrix on this machine, in the test's own directory."""
    runs: list[Run] = []
    name = request.node.name.removeprefix("test_").replace("_", "-")[:24]

    def make(layout: dict[str, Any], **extra: Any) -> Run:
        workdir = tmp_path / f"w{len(runs)}"
        workdir.mkdir()
        run = Run.create(workdir, local_config(unique_run_id(name), shim, **layout, **extra))
        runs.append(run)
        return run

    yield make
    for run in runs:
        kill_local_leftovers(run.port)


@pytest.fixture()
def make_cluster_run(
    tmp_path: Path,
    shim: FaultShim,
    nodes_dir: Path,  # noqa: F811
    docker_node: str,  # noqa: F811
    request: pytest.FixtureRequest,
) -> Iterator[Callable[..., Run]]:
    """Runs of a slice of the suite's matrix on the loopback SSH nodes with docker."""
    runs: list[Run] = []
    name = request.node.name.removeprefix("test_").replace("_", "-")[:24]

    def make(layout: dict[str, Any], *, nodes: list[str], **extra: Any) -> Run:
        workdir = tmp_path / f"w{len(runs)}"
        workdir.mkdir()
        config = cluster_config(
            unique_run_id(name), shim, nodes_dir=nodes_dir, nodes=nodes, **layout, **extra
        )
        run = Run.create(workdir, config)
        runs.append(run)
        return run

    yield make
    for run in runs:
        remove_containers(run.run_id)
        kill_local_leftovers(run.port)


@pytest.fixture(scope="session")
def reference(tmp_path_factory: pytest.TempPathFactory) -> pd.DataFrame:
    """results.csv of the matrix run once without any fault."""
    workdir = tmp_path_factory.mktemp("reference")
    shim = FaultShim.create(workdir / "shim")
    run = Run.create(workdir, local_config(unique_run_id("reference"), shim))
    try:
        proc = run.snakemake()
        assert proc.returncode == 0, proc.stderr[-4000:]
        return pd.read_csv(run.run_dir / "results.csv")
    finally:
        kill_local_leftovers(run.port)
