"""Whether a run passes its validation: no fatal finding in the final scan of its server logs
and every absolute bound of its `gate` met. Each failure is one named line: the console's
answer block lists them and the run exits 1 with the first (the workflow's `onsuccess`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from servesweep.analysis.planned import SUMMARY_METRICS, _key
from servesweep.config.experiment import Experiment
from servesweep.core.errors import ConfigError

# A log line quoted in a failure is cut at this many characters.
MAX_LINE = 160


def check_gate(exp: Experiment) -> None:
    """Every gate metric is a summary metric (ConfigError naming the first that is not)."""
    for i, rule in enumerate(exp.gate):
        for metric in rule.bounds:
            if metric not in SUMMARY_METRICS:
                raise ConfigError(
                    f"config key 'gate[{i}].bounds': {metric!r} is not a summary metric "
                    f"(one of {', '.join(SUMMARY_METRICS)})"
                )


def _selects(where: Mapping[str, Any], axes: Mapping[str, Any]) -> bool:
    return all(axis in axes and _key(axes[axis]) == _key(v) for axis, v in where.items())


def gate_result(cells: Sequence[Mapping[str, Any]], gate: Sequence[Mapping[str, Any]]) -> dict:
    """summary.json's `gate`: how many bounds were checked and each one missed (the cell, the
    metric, the bound and the median measured; `null` where the cell has no value). A rule
    that selects no cell of this run (a narrowed run) checks nothing."""
    checked, missed = 0, []
    for rule in gate:
        for cell in (c for c in cells if _selects(rule.get("where") or {}, c.get("axes") or {})):
            for metric, bound in (rule.get("bounds") or {}).items():
                checked += 1
                value = ((cell.get("metrics") or {}).get(metric) or {}).get("median")
                low, high = bound.get("min"), bound.get("max")
                if value is None or (low is not None and value < low):
                    side = ("min", low) if low is not None else ("max", high)
                elif high is not None and value > high:
                    side = ("max", high)
                else:
                    continue
                missed.append(
                    {
                        "cell": cell.get("label"),
                        "axes": cell.get("axes"),
                        "metric": metric,
                        "bound": side[0],
                        "limit": side[1],
                        "value": value,
                    }
                )
    return {"checked": checked, "missed": missed}


def failures(summary: Mapping[str, Any]) -> list[str]:
    """One line per reason the run fails its validation: each fatal finding of the final log
    scan (the finding, its role and node, the log and line), then each gate bound missed."""
    out = []
    for f in (summary.get("log_scan") or {}).get("fatal") or []:
        line = str(f.get("line", ""))[:MAX_LINE]
        out.append(
            f"fatal log finding {f.get('pattern')} on {f.get('role')} node {f.get('node')}: "
            f"{f.get('log')} line {f.get('line_no')}: {line}"
        )
    for m in (summary.get("gate") or {}).get("missed") or []:
        measured = "no value" if m["value"] is None else f"{m['value']:.6g}"
        out.append(
            f"gate missed: {m['cell']}: {m['metric']} {measured}, {m['bound']} {m['limit']:g} "
            "(config gate; summary.json gate.missed)"
        )
    return out


def exit_message(summary: Mapping[str, Any]) -> str | None:
    """The one line a failed validation exits with (the first failure and how many more), or
    None when the run passes."""
    found = failures(summary)
    if not found:
        return None
    more = f" (and {len(found) - 1} more: the answer above)" if len(found) > 1 else ""
    return f"servesweep: ValidationFailed: {found[0]}{more}"
