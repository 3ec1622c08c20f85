"""A running server set as the workflow records it: ranks, URLs, times (service/current.json)."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from servesweep.config.schema import PD_ROLES, SINGLE_ROLE
from servesweep.core.names import safe_segment
from servesweep.serving.engines import ROUTER_ROLE


@dataclass
class RankState:
    """One running process of a server set: where it runs and how to find it again."""

    role: str
    node: str
    rank: int
    handle: str
    log_path: str
    url: str | None = None  # the role's HTTP endpoint, on rank 0 and the router
    identity: str = ""  # Runtime.identity at start: a reused pid or id is not ours


@dataclass
class ServerState:
    """The server set currently running for a run (persisted in service/current.json)."""

    fingerprint: str
    server_id: str
    base_url: str
    ranks: list[RankState] = field(default_factory=list)
    started_at: float = 0.0
    ready_at: float | None = None
    service: bool = False  # brought up by `servesweep up`: outlives runs
    owner: str = ""
    run_id: str = ""  # the run (or `up`) that started it
    # where the start went: `ready_s` and logscan.startup_phases (the phases its log shows)
    start_phases: dict[str, float] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> ServerState | None:
        if not path.exists():
            return None
        data = json.loads(path.read_text())
        data["ranks"] = [RankState(**r) for r in data["ranks"]]
        for key in TIME_FIELDS:
            data[key] = _epoch(data.get(key))
        return cls(**data)

    def to_dict(self) -> dict[str, Any]:
        """As written to current.json and server.json: times in ISO-8601 (UTC)."""
        data = asdict(self)
        for key in TIME_FIELDS:
            data[key] = _iso(data[key])
        return data


TIME_FIELDS = ("started_at", "ready_at")


def _iso(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    return dt.datetime.fromtimestamp(epoch, dt.UTC).isoformat(timespec="milliseconds")


def _epoch(value: str | float | None) -> float | None:
    """A time of a state file: ISO-8601, or the epoch float files before it held."""
    if value is None or isinstance(value, int | float):
        return value
    return dt.datetime.fromisoformat(value).timestamp()


def log_name(role: str, node: str) -> str:
    """File name of one process's log in service/<server>/."""
    node = safe_segment(node, what="node")
    return f"{node}.log" if role == SINGLE_ROLE else f"{role}-{node}.log"


def log_owner(name: str) -> tuple[str, str]:
    """(role, node) of a log file named by `log_name` (a PD role or the router before the
    first dash; else the single server's node)."""
    stem = name.removesuffix(".log")
    role, sep, node = stem.partition("-")
    if sep and role in (*PD_ROLES, ROUTER_ROLE):
        return role, node
    return SINGLE_ROLE, stem
