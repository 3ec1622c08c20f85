"""Shared fixtures: SGLang's staged bench_serving (from the wheel) and a local tokenizer."""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `tests.support` without relying on the invocation directory
    sys.path.insert(0, str(ROOT))

from tests.support.sglang_bench import WheelNotFound, find_wheel, stage_bench  # noqa: E402
from tests.support.sglang_server import stage_sglang  # noqa: E402
from tests.support.tokenizer import build_tokenizer, sim_words  # noqa: E402

# What bench_serving 0.5.23 imports besides the stdlib (SGLANG.md section 2); datasets is stubbed.
BENCH_DEPS = ("aiohttp", "msgspec", "numpy", "orjson", "requests", "tqdm", "transformers")
BENCH_DEPS += ("pybase64", "PIL")


@pytest.fixture(scope="session")
def staged_bench(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`sglang/benchmark/` from the sglang wheel plus stubs, ready for PYTHONPATH."""
    missing = [m for m in BENCH_DEPS if importlib.util.find_spec(m) is None]
    if missing:
        pytest.fail(f"bench_serving needs {missing}: install the package's test extra")
    try:
        wheel = find_wheel()
    except WheelNotFound as exc:
        if os.environ.get("CI"):
            pytest.fail(f"no sglang wheel: {exc}", pytrace=False)
        pytest.skip(f"no sglang wheel: {exc}")
    return stage_bench(wheel=wheel, dest=tmp_path_factory.mktemp("sglang_bench"))


@pytest.fixture(scope="session")
def staged_sglang(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SGLang's whole package from the sglang wheel plus import stubs (its real argument parser
    without a GPU); tests.support.sglang_server.sglang_env puts it on PYTHONPATH."""
    try:
        wheel = find_wheel()
    except WheelNotFound as exc:
        if os.environ.get("CI"):
            pytest.fail(f"no sglang wheel: {exc}", pytrace=False)
        pytest.skip(f"no sglang wheel: {exc}")
    return stage_sglang(wheel=wheel, dest=tmp_path_factory.mktemp("sglang_server"))


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A local tokenizer directory bench loads with AutoTokenizer (no network)."""
    return build_tokenizer(tmp_path_factory.mktemp("tokenizer"), words=sim_words())


# Scheduling on xdist workers (pyproject: -n 4). A test module with a module-scoped fixture
# shares one whole run between its tests (test_default_matrix's default run, the PD suite's):
# its tests go to one worker together, so the run is made once; every other test goes alone to
# whichever worker is free. (xdist's own --dist loadgroup does not group under pytest 9.2:
# the group suffix it writes into the node id does not reach the controller.)
SHARED_RUN = re.compile(r"^@pytest\.fixture\(scope=\"module\"\)", re.M)
# Collection order is the scheduling order: the longest work first, so that no worker starts a
# whole run while the others have finished.
WHOLE_RUN_MARKERS = ("workflow", "integration", "reliability", "contract")


@functools.cache
def shares_a_run(module: Path) -> bool:
    """Whether a test module defines a module-scoped fixture (its tests share what it makes)."""
    return module.suffix == ".py" and bool(SHARED_RUN.search(module.read_text()))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling

    root = config.rootpath

    class SharedRunScheduling(LoadScopeScheduling):
        """One work unit per test, or per module for a module that shares a run."""

        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return module if shares_a_run(root / module) else nodeid

    return SharedRunScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The modules that share a run first, then the other tests that run real workflows, then
    the unit tests (stable within each kind; without xdist only the order changes)."""

    def kind(item: pytest.Item) -> int:
        if shares_a_run(Path(item.path)):
            return 0
        return 1 if any(item.get_closest_marker(m) for m in WHOLE_RUN_MARKERS) else 2

    items.sort(key=kind)
