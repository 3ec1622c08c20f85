"""Guessed config values (`guesses:` in an experiment or its site file): listed by `commands`
and `doctor`, observed and recorded, never enforced until the site confirms them.

A guess is a dotted key: `engine.version`, `runtime.env.NCCL_IB_HCA`, `evidence.<name>` (the
pattern is counted and reported, a cell is not invalid below its minimum), or
`runtime.checks.<name>` (a list entry by its `name`: the check's output is recorded, a
mismatch is a warning)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

GUESSES_KEY = "guesses"
ENGINE_VERSION = "engine.version"


def lookup(data: Any, dotted: str) -> tuple[bool, Any]:
    """(found, value) of a dotted key; a list is entered by an item's `name` (which may hold
    dots, e.g. `runtime.checks.mooncake-0.3.12.post1`)."""
    parts = dotted.split(".")
    node = data
    i = 0
    while i < len(parts):
        if isinstance(node, Mapping):
            if parts[i] not in node:
                return False, None
            node = node[parts[i]]
            i += 1
            continue
        if isinstance(node, Sequence) and not isinstance(node, str):
            for j in range(len(parts), i, -1):
                name = ".".join(parts[i:j])
                item = next(
                    (x for x in node if isinstance(x, Mapping) and x.get("name") == name), None
                )
                if item is not None:
                    node, i = item, j
                    break
            else:
                return False, None
            continue
        return False, None
    return True, node


def unknown(data: Mapping[str, Any], keys: Sequence[str]) -> list[str]:
    """The guessed keys that name no config value."""
    return [key for key in keys if not lookup(data, key)[0]]


def listed(data: Mapping[str, Any], keys: Sequence[str]) -> list[tuple[str, Any]]:
    """(key, value) of every guess, in the order given."""
    return [(key, lookup(data, key)[1]) for key in keys]


def guessed(keys: Sequence[str], key: str) -> bool:
    """Whether `key` (or a section above it) is a guess."""
    return any(key == g or key.startswith(g + ".") for g in keys)


def guess_values(exp: Any) -> list[tuple[str, Any]]:
    """(key, value) of every guess of an Experiment (its `guesses`, site guesses included)."""
    return listed(exp.model_dump(mode="json"), exp.guesses)
