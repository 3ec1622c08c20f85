"""Shared fixtures: SGLang's staged bench_serving (from the wheel) and a local tokenizer."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

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


# Collection order is xdist's scheduling order: the longest work first, so that no worker
# starts a whole run while the others have finished.
WHOLE_RUN_MARKERS = ("workflow", "integration", "reliability", "contract")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests sharing a module-scoped fixture (a whole run: test_default_matrix's, the PD
    suite's) form one xdist group, run by one worker (pyproject: --dist loadgroup), so the run
    is made once; these groups come first, then the other tests that run real workflows, then
    the unit tests. Without xdist only the order changes (stable within each kind)."""
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        shared = [
            name
            for name in getattr(item, "fixturenames", ())
            if info is not None
            and info.name2fixturedefs.get(name)
            and info.name2fixturedefs[name][-1].scope == "module"
        ]
        if shared and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(f"{item.module.__name__}:{shared[0]}"))

    def kind(item: pytest.Item) -> int:
        if item.get_closest_marker("xdist_group") is not None:
            return 0
        return 1 if any(item.get_closest_marker(m) for m in WHOLE_RUN_MARKERS) else 2

    items.sort(key=kind)
