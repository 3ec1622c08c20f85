"""Work done once per test session across pytest-xdist workers (each worker has its own
session, so a session fixture alone would repeat a whole run per worker)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from filelock import FileLock


def once(tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], None]) -> Path:
    """A directory `make(directory)` filled once for the whole session: the first worker to ask
    makes it while the others wait on a lock, then every worker reads it. A failed `make`
    leaves no mark, so each worker that asks fails on its own (with its own message)."""
    base = tmp_path_factory.getbasetemp()
    # Under xdist every worker's base temp is a folder of the session's own (popen-gw0, ...).
    root = base.parent if base.name.startswith("popen-gw") else base
    directory = root / f"shared-{name}"
    done = root / f"shared-{name}.done"
    with FileLock(str(root / f"shared-{name}.lock")):
        if not done.exists():
            directory.mkdir(exist_ok=True)
            make(directory)
            done.touch()
    return directory
