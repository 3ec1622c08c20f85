"""Prometheus text exposition as SGLang's `/metrics` serves it: one definition of its parse.

A sample is keyed by its series, `family{labels}` exactly as the server printed it (the key of
the recorded series and of the rehearsal's trace); values stay text until a reader needs a
number (`+Inf`, `NaN` parse with float())."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?[ \t]+(\S+)", re.M)
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse(text: str | None) -> dict[str, str]:
    """Every sample of an exposition text: `family{labels}` -> value text (comments skipped)."""
    return {f"{name}{labels}": value for name, labels, value in _SAMPLE.findall(text or "")}


def family(key: str) -> str:
    """The family (metric name) of a series key."""
    return key.split("{", 1)[0]


def labels(key: str) -> dict[str, str]:
    """The labels of a series key."""
    _, _, rest = key.partition("{")
    return dict(_LABEL.findall(rest))


def number(value: str | float) -> float:
    """A sample's value as a float (NaN when it is not a number)."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")


def total(sample: Mapping[str, str], name: str, *, where: Mapping[str, str] | None = None) -> float:
    """The sum of every series of family `name` (its labels matching `where`); NaN if none."""
    found = [
        number(v)
        for k, v in sample.items()
        if family(k) == name and all(labels(k).get(a) == b for a, b in (where or {}).items())
    ]
    return sum(found) if found else float("nan")


def values(sample: Mapping[str, str], names: Iterable[str]) -> list[tuple[str, str, str]]:
    """(family, series key, value) of every series whose family is in `names`."""
    wanted = set(names)
    return [(family(k), k, v) for k, v in sample.items() if family(k) in wanted]
