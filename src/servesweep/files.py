"""Atomic file writes: a file that exists under its final name is complete."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any


def current_umask() -> int:
    """The process's umask, read without changing it (Linux /proc; else set and restored)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_open(
    path: str | Path, mode: str = "w", *, perms: int | None = None
) -> Iterator[IO[Any]]:
    """Open a temp file beside `path`; rename it over `path` only if the block succeeds.
    The file gets `perms`, or what a plain open() would give: 0666 less the umask (mkstemp's
    own 0600 would hide results from the group whatever the umask; only secrets are 0600)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.fchmod(fd, perms if perms is not None else 0o666 & ~current_umask())
    try:
        with os.fdopen(fd, mode) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write `text` to `path` atomically."""
    with atomic_open(path) as fh:
        fh.write(text)


def write_json_atomic(path: str | Path, data: Any) -> None:
    """Write `data` as indented JSON to `path` atomically."""
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
