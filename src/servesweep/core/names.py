"""Names built into paths and shell lines: one safe path segment, one environment name."""

from __future__ import annotations

import re

from servesweep.core.errors import UnsafeName

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def safe_segment(text: object, *, what: str) -> str:
    """`text` as one path segment: not empty, `.` or `..`, without `/`, `\\` or control
    characters (UnsafeName naming `what` otherwise)."""
    value = str(text)
    if value in ("", ".", "..") or "/" in value or "\\" in value or _CONTROL.search(value):
        raise UnsafeName(f"{what} {value!r} is no single path segment (no '/', '..' or empty)")
    return value


def env_name(name: str, *, what: str) -> str:
    """`name` as an environment variable name `[A-Za-z_][A-Za-z0-9_]*` (UnsafeName otherwise)."""
    if not ENV_NAME.fullmatch(name):
        raise UnsafeName(f"{what} {name!r} is no name: [A-Za-z_][A-Za-z0-9_]*")
    return name
