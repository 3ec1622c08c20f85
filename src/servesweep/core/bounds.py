"""Size and depth bounds on hostile input: YAML alias bombs, deeply nested JSON."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

# A config holds a few hundred values; 100,000 is far above any real one (24-cell seeds: ~300).
MAX_CONFIG_VALUES = 100_000
# Nesting of a config (the deepest real key: roles.decode.server.env.X, 5).
MAX_CONFIG_DEPTH = 32


class TooLarge(ValueError):
    """Input over a size or depth bound; the message names where (a dotted key) and the bound."""


def _children(node: Any) -> list[tuple[str | None, Any]]:
    if isinstance(node, Mapping):
        return [(str(k), v) for k, v in node.items()]
    if isinstance(node, list | tuple):
        return [(None, v) for v in node]
    return []


def check_size(
    data: Any, *, max_values: int = MAX_CONFIG_VALUES, max_depth: int = MAX_CONFIG_DEPTH
) -> None:
    """Raise TooLarge when `data` (parsed YAML: aliases are shared objects, so a bomb is small
    in memory until something copies it) expands to more than `max_values` values or nests
    deeper than `max_depth`. Counts each shared object once per use without expanding it."""
    sizes: dict[int, int] = {}
    depths: dict[int, int] = {}
    # Iterative post-order walk (no recursion: a 100,000-deep input is input too).
    stack: list[tuple[Any, bool]] = [(data, False)]
    on_path: set[int] = set()
    while stack:
        node, done = stack.pop()
        key = id(node)
        kids = _children(node)
        if not kids:
            sizes[key], depths[key] = 1, 0
            continue
        if done:
            on_path.discard(key)
            sizes[key] = min(max_values + 1, 1 + sum(sizes[id(v)] for _, v in kids))
            depths[key] = 1 + max(depths[id(v)] for _, v in kids)
            continue
        if key in sizes:
            continue
        if key in on_path or len(on_path) > max_depth:
            sizes[key], depths[key] = max_values + 1, max_depth + 1  # a cycle or too deep
            continue
        on_path.add(key)
        stack.append((node, True))
        stack.extend((v, False) for _, v in kids if id(v) not in sizes)
    if sizes[id(data)] <= max_values and depths[id(data)] <= max_depth:
        return
    # Name the deepest mapping key over the bound (a list's items are one value's parts).
    path: list[str] = []
    node = data
    while isinstance(node, Mapping):
        over = [
            (k, v)
            for k, v in _children(node)
            if sizes.get(id(v), 1) > max_values or depths.get(id(v), 0) >= max_depth
        ]
        if not over:
            break
        name, node = over[0]
        path.append(str(name))
    where = ".".join(path) or "<top level>"
    if sizes[id(data)] > max_values:
        raise TooLarge(
            f"config key '{where}': expands to more than {max_values:,} values (YAML aliases "
            "repeated that often?); a config holds at most that many"
        )
    raise TooLarge(f"config key '{where}': nested deeper than {max_depth} levels")


def loads_json(text: str | bytes) -> Any:
    """json.loads, with TooLarge (a ValueError) instead of a RecursionError for a document
    nested deeper than the decoder's recursion limit (~1,000 levels; records nest ~6)."""
    try:
        return json.loads(text)
    except RecursionError:
        raise TooLarge("JSON nested too deep (over ~1,000 levels)") from None
