"""Fixtures of the fault-injection suite: the fault shim, checks, the uninterrupted reference."""

from __future__ import annotations

import functools
import shutil
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
from tests.support.shared import once


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


def _runs(
    tmp_path: Path, request: pytest.FixtureRequest, config: Callable[..., dict[str, Any]]
) -> Iterator[Callable[..., Run]]:
    """A factory of runs, each in its own directory of the test's, named after its scenario
    (the parametrize id, else the test's name); ends what they left running afterwards."""
    runs: list[Run] = []
    callspec = getattr(request.node, "callspec", None)
    name = callspec.id if callspec else request.node.name.removeprefix("test_")
    name = name.replace("_", "-")[:24]

    def make(layout: dict[str, Any], **extra: Any) -> Run:
        workdir = tmp_path / f"w{len(runs)}"
        workdir.mkdir()
        run = Run.create(workdir, config(unique_run_id(name), **layout, **extra))
        runs.append(run)
        return run

    yield make
    for run in runs:
        if run.in_containers:
            remove_containers(run.run_id)
        kill_local_leftovers(run.port)


@pytest.fixture()
def make_run(
    tmp_path: Path, shim: FaultShim, request: pytest.FixtureRequest
) -> Iterator[Callable[..., Run]]:
    """Runs of a slice of the suite's matrix on this machine: `make_run(WITHIN, **extra)`."""
    yield from _runs(tmp_path, request, functools.partial(local_config, shim=shim))


@pytest.fixture()
def make_cluster_run(
    tmp_path: Path,
    shim: FaultShim,
    nodes_dir: Path,  # noqa: F811
    docker_node: str,  # noqa: F811
    request: pytest.FixtureRequest,
) -> Iterator[Callable[..., Run]]:
    """Runs of a slice of the suite's matrix on the loopback SSH nodes with docker:
    `make_cluster_run(WITHIN, nodes=[...], **extra)`."""
    config = functools.partial(cluster_config, shim=shim, nodes_dir=nodes_dir)
    yield from _runs(tmp_path, request, config)


@pytest.fixture(scope="session")
def reference(tmp_path_factory: pytest.TempPathFactory) -> pd.DataFrame:
    """results.csv of the matrix run once without any fault (once per session, whatever the
    number of xdist workers)."""

    def make(workdir: Path) -> None:
        shim = FaultShim.create(workdir / "shim")
        run = Run.create(workdir, local_config(unique_run_id("reference"), shim))
        try:
            proc = run.snakemake()
            assert proc.returncode == 0, proc.stderr[-4000:]
            shutil.copyfile(run.run_dir / "results.csv", workdir / "reference.csv")
        finally:
            kill_local_leftovers(run.port)

    return pd.read_csv(once(tmp_path_factory, "reliability-reference", make) / "reference.csv")
