"""Per-cell log evidence (e.g. PD's P->D transfer lines): count each pattern in its role's
logs, and call a cell-repeat below a pattern's minimum invalid with a one-line reason."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from servesweep.config.guesses import guessed
from servesweep.config.schema import EvidencePattern
from servesweep.core.errors import CellFailed


@dataclass(frozen=True)
class RankLog:
    """One process of a server set whose log can be read: its role and how to read it."""

    role: str
    read: Callable[[], str]
    path: str


def count(patterns: Mapping[str, EvidencePattern], logs: list[RankLog]) -> dict[str, int]:
    """Lines matching each pattern in the logs of its role, now (whole logs so far)."""
    texts = [(log.role, log.read()) for log in logs]
    return {
        name: sum(
            len(re.findall(p.pattern, text, flags=re.M)) for role, text in texts if role == p.role
        )
        for name, p in patterns.items()
    }


def cell_counts(
    patterns: Mapping[str, EvidencePattern],
    *,
    before: Mapping[str, int],
    after: Mapping[str, int],
) -> dict[str, int]:
    """Each pattern's count for a cell: new lines since `before` (window cell), or every line
    since the server started (window service)."""
    return {
        name: after[name] - (before[name] if p.window == "cell" else 0)
        for name, p in patterns.items()
    }


def shortfalls(patterns: Mapping[str, EvidencePattern], counts: Mapping[str, int]) -> list[str]:
    """`name (role, window): n < min` for each pattern below its minimum ([] when none)."""
    return [
        f"{name} ({p.role} logs, window {p.window}): {counts[name]} < {p.min_per_cell}"
        for name, p in patterns.items()
        if counts[name] < p.min_per_cell
    ]


def check(
    patterns: Mapping[str, EvidencePattern],
    counts: Mapping[str, int],
    *,
    cell: str,
    logs: list[RankLog],
) -> None:
    """Raise CellFailed (one line naming the cell, the patterns and the logs) if a pattern is
    below its minimum."""
    short = shortfalls(patterns, counts)
    if short:
        roles = {p.role for name, p in patterns.items() if counts[name] < p.min_per_cell}
        where = ", ".join(log.path for log in logs if log.role in roles) or "none"
        raise CellFailed(
            f"invalid: log evidence below its minimum: {'; '.join(short)}",
            cell=cell,
            log=f"logs: {where}",
        )


def enforced(
    patterns: Mapping[str, EvidencePattern], guesses: Sequence[str]
) -> dict[str, EvidencePattern]:
    """The patterns a cell must meet: a guessed one (`evidence.<name>` in `guesses`) is
    counted and reported, never enforced, until the site confirms it."""
    return {name: p for name, p in patterns.items() if not guessed(guesses, f"evidence.{name}")}
