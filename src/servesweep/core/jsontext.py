"""JSON text exactly as `json.dumps(value, indent=2, allow_nan=False)` writes it, in one pass."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any

# json's own string encoder (C), as json.dumps uses it with ensure_ascii.
_string = json.encoder.encode_basestring_ascii  # type: ignore[attr-defined]


def _identity(value: Any) -> Any:
    return value


def indented_json(value: Any, *, leaf: Callable[[Any], Any] = _identity) -> str:
    """`json.dumps(value, indent=2, allow_nan=False)` of `value`, whose mapping keys are
    written as `str(key)` and whose non-container values are first passed through `leaf` (it
    returns a scalar); tuples are lists. The same text without json's pure-Python encoder
    (indent bypasses its C one): about twice as fast on a 10 MB summary. Errors as json's:
    ValueError for a non-finite float, TypeError for a value it cannot encode."""
    parts: list[str] = []
    _encode(value, "\n", parts, leaf)
    return "".join(parts)


def _encode(value: Any, newline: str, parts: list[str], leaf: Callable[[Any], Any]) -> None:
    """Append the text of `value` at the indentation `newline` (a newline and its spaces)."""
    if isinstance(value, Mapping):
        if not value:
            parts.append("{}")
            return
        inner = newline + "  "
        sep = "{" + inner
        for key, item in value.items():
            parts.append(sep)
            parts.append(_string(str(key)))
            parts.append(": ")
            _encode(item, inner, parts, leaf)
            sep = "," + inner
        parts.append(newline + "}")
        return
    if isinstance(value, list | tuple):
        if not value:
            parts.append("[]")
            return
        inner = newline + "  "
        sep = "[" + inner
        for item in value:
            parts.append(sep)
            _encode(item, inner, parts, leaf)
            sep = "," + inner
        parts.append(newline + "]")
        return
    parts.append(_scalar(leaf(value)))


def _scalar(value: Any) -> str:
    """A JSON scalar as json writes it."""
    if isinstance(value, str):
        return _string(value)
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"Out of range float values are not JSON compliant: {value!r}")
        return float.__repr__(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")
