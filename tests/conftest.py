"""Shared fixtures: SGLang's staged bench_serving (from the wheel) and a local tokenizer."""

from __future__ import annotations

import ast
import functools
import importlib.util
import os
import signal
import sys
import warnings
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


# Scheduling on xdist workers (pyproject: -n 4). A module-scoped fixture shares one whole run
# between the tests that use it (test_default_matrix's default run, the PD suite's): those tests
# go to one worker together, so the run is made once; every other test, of the same module too,
# goes alone to whichever worker is free. An autouse module fixture holds every test of its
# module together (the Slurm tests share one cluster). (xdist's own --dist loadgroup does not
# group under pytest 9.2: the group suffix it writes into the node id does not reach the
# controller.)
# Collection order is the scheduling order: the longest work first, so that no worker starts a
# whole run while the others have finished: the shared runs, the few long workflow and cluster
# tests (minutes each), then the many fault scenarios (a minute or less each), then the unit tests.
WHOLE_RUN_MARKERS = ("workflow", "integration", "reliability", "contract")


def _module_fixture(node: ast.FunctionDef) -> tuple[bool, bool] | None:
    """(module-scoped, autouse) of a `@pytest.fixture(...)` function, None if no fixture."""
    for deco in node.decorator_list:
        call = deco if isinstance(deco, ast.Call) else None
        target = call.func if call else deco
        if ast.unparse(target) not in ("pytest.fixture", "fixture"):
            continue
        kw = {k.arg: k.value for k in call.keywords} if call else {}
        scope = kw.get("scope")
        autouse = kw.get("autouse")
        return (
            isinstance(scope, ast.Constant) and scope.value == "module",
            isinstance(autouse, ast.Constant) and autouse.value is True,
        )
    return None


@functools.cache
def shared_tests(module: Path) -> frozenset[str] | None:
    """Names of the tests of `module` that use what a module-scoped fixture of it makes
    (directly or through its other fixtures); None: every test (an autouse one)."""
    if module.suffix != ".py" or not module.exists():
        return frozenset()
    tree = ast.parse(module.read_text())
    functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
    fixtures = {n.name: (n, kind) for n in functions if (kind := _module_fixture(n))}
    if any(module_scoped and autouse for _, (module_scoped, autouse) in fixtures.values()):
        return None
    shared = {name for name, (_, (module_scoped, _)) in fixtures.items() if module_scoped}
    grew = True
    while grew:  # fixtures that take a shared one share it too
        grew = False
        for name, (node, _) in fixtures.items():
            if name not in shared and shared & {a.arg for a in node.args.args}:
                shared.add(name)
                grew = True
    return frozenset(
        n.name
        for n in functions
        if n.name.startswith("test") and shared & {a.arg for a in n.args.args}
    )


def shares_a_run(nodeid: str, root: Path) -> bool:
    """Whether the test `nodeid` uses a module-scoped fixture's work (with the other tests that
    use it)."""
    module, _, rest = nodeid.partition("::")
    tests = shared_tests(root / module)
    return tests is None or rest.rsplit("::", 1)[-1].split("[", 1)[0] in tests


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling

    root = config.rootpath

    class SharedRunScheduling(LoadScopeScheduling):
        """One work unit per test, or per module for the tests that share its run."""

        def _split_scope(self, nodeid: str) -> str:
            return nodeid.split("::", 1)[0] if shares_a_run(nodeid, root) else nodeid

        def _reschedule(self, node: Any) -> None:
            """One unit waiting behind the running test, not xdist's two: a worker that
            queued two multi-minute runs kept them while the others ran out of work."""
            if self.workqueue and self._pending_of(self.assigned_work[node]) > 1:
                return
            super()._reschedule(node)

    return SharedRunScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tests that share a run first, then the other tests that run real workflows (the
    fault scenarios last of them), then the unit tests (stable within each kind; without xdist
    only the order changes)."""

    def kind(item: pytest.Item) -> int:
        if shares_a_run(item.nodeid, config.rootpath):
            return 0
        if item.get_closest_marker("reliability"):
            return 2
        return 1 if any(item.get_closest_marker(m) for m in WHOLE_RUN_MARKERS) else 3

    items.sort(key=kind)


@pytest.fixture(autouse=True)
def _sigint_handler_restored(request: pytest.FixtureRequest):
    """A test that leaves another SIGINT handler in its worker gets a warning naming it, and
    the handler is put back: a later test's Ctrl-C must reach the main thread (a leaked
    handler once made test_cells' interrupted-cell test wait out its server's watchdog)."""
    before = signal.getsignal(signal.SIGINT)
    yield
    after = signal.getsignal(signal.SIGINT)
    if after is not before:
        signal.signal(signal.SIGINT, before)
        warnings.warn(f"{request.node.nodeid} left SIGINT handler {after!r}", stacklevel=1)
