"""Atomic file writes: a file that exists under its final name is complete."""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import stat
import tempfile
import time
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
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise _naming(exc, path) from exc
    os.fchmod(fd, perms if perms is not None else 0o666 & ~current_umask())
    try:
        with os.fdopen(fd, mode) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        if isinstance(exc, OSError):  # a full disk names no file by itself (a write, a flush)
            raise _naming(exc, path) from exc
        raise


def _naming(exc: OSError, path: Path) -> OSError:
    """`exc` with the file it was writing in its message (`[Errno 28] ... writing <path>`)."""
    if str(path) in str(exc):
        return exc
    return type(exc)(exc.errno, f"{exc.strerror or exc} writing {path}")


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write `text` to `path` atomically."""
    with atomic_open(path) as fh:
        fh.write(text)


def failed_name(path: str | Path) -> Path:
    """`<path>.failed-<UTC time>`: where a failed attempt's log is kept, beside the log that a
    later attempt (a server's next start, a cell's rerun) writes again."""
    path = Path(path)
    return path.with_name(f"{path.name}.failed-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}")


def keep_failed_copy(path: str | Path) -> Path:
    """A copy of the log `path` under failed_name(path), atomic and of the same mode."""
    kept = failed_name(path)
    perms = stat.S_IMODE(os.stat(path).st_mode)
    with open(path, "rb") as src, atomic_open(kept, "wb", perms=perms) as dst:
        shutil.copyfileobj(src, dst)
    return kept


# Strict JSON has no Infinity/NaN: such a float is written as null, and this top-level key of
# the document maps its JSON pointer to what it was ("inf", "-inf", "nan").
NON_FINITE_KEY = "non_finite"


def _pointer(parts: tuple[str, ...]) -> str:
    return "".join("/" + p.replace("~", "~0").replace("/", "~1") for p in parts)


def finite_json(data: Any) -> Any:
    """`data` for strict JSON: every non-finite float becomes None and, in a dict document,
    `non_finite` maps its JSON pointer to "inf", "-inf" or "nan" (restore_non_finite)."""
    found: dict[str, str] = {}

    def walk(value: Any, parts: tuple[str, ...]) -> Any:
        if isinstance(value, float) and not math.isfinite(value):
            found[_pointer(parts)] = "nan" if math.isnan(value) else str(value)
            return None
        if isinstance(value, dict):
            return {k: walk(v, (*parts, str(k))) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [walk(v, (*parts, str(i))) for i, v in enumerate(value)]
        return value

    out = walk(data, ())
    if found and isinstance(out, dict):
        out[NON_FINITE_KEY] = found
    return out


def restore_non_finite(data: Any) -> Any:
    """Undo finite_json on a parsed dict document (in place): the non-finite floats come back
    and the `non_finite` key goes; anything else is returned as it is."""
    if not isinstance(data, dict) or not isinstance(data.get(NON_FINITE_KEY), dict):
        return data
    for pointer, text in data.pop(NON_FINITE_KEY).items():
        parts = [p.replace("~1", "/").replace("~0", "~") for p in pointer.split("/")[1:]]
        node: Any = data
        for part in parts[:-1]:
            node = node[int(part)] if isinstance(node, list) else node.get(part)
            if node is None:
                break
        else:
            if isinstance(node, list):
                node[int(parts[-1])] = float(text)
            elif isinstance(node, dict):
                node[parts[-1]] = float(text)
    return data


def strict_json(data: Any, **kwargs: Any) -> str:
    """json.dumps of finite_json(data): valid for any strict JSON parser."""
    return json.dumps(finite_json(data), allow_nan=False, **kwargs)


def write_json_atomic(path: str | Path, data: Any) -> None:
    """Write `data` as indented strict JSON to `path` atomically (finite_json)."""
    write_text_atomic(path, strict_json(data, indent=2, sort_keys=False, default=str) + "\n")


def private_dir(path: str | Path) -> Path:
    """`path` as a folder only this user can write: made 0700 if missing; an existing one must
    be a real folder (no symlink) owned by us with no group or other write bit, else OSError
    naming it (another user may have planted it in a shared /tmp, with links inside)."""
    path = Path(path)
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    st = path.lstat()
    if not stat.S_ISDIR(st.st_mode):
        raise OSError(f"{path}: not a folder of ours (a link or a file); remove it or pick another")
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise OSError(
            f"{path}: owned by uid {st.st_uid} with mode {stat.S_IMODE(st.st_mode):o}, not a "
            f"private folder of uid {os.geteuid()}; remove it (someone else may have made it)"
        )
    return path


def open_private(path: str | Path, mode: str = "w") -> IO[str]:
    """Open a file inside a private_dir without following a link planted at its name."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | (os.O_TRUNC if mode == "w" else os.O_APPEND)
    return os.fdopen(os.open(path, flags, 0o600), mode)
