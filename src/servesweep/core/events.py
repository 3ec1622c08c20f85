"""orchestrator.log: one timestamped line per lifecycle or progress event."""

from __future__ import annotations

import datetime as dt
import logging
import os
from pathlib import Path

logger = logging.getLogger(__name__)


def _value(v: object) -> str:
    """A field value as written: one line; quoted (with `\\` and `"` escaped) when it holds a
    space or a quote, or is empty, so any text reads back whole (parse_line)."""
    text = " ".join(str(v).splitlines())
    if text and not any(c in text for c in ' "\\'):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


class EventLog:
    """Appends `<UTC time> <event> key=value ...` lines; safe across processes (O_APPEND)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def emit(self, event: str, **fields: object) -> None:
        stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        parts = [stamp, event, *(f"{k}={_value(v)}" for k, v in fields.items())]
        line = " ".join(parts) + "\n"
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                os.write(fd, line.encode())
            finally:
                os.close(fd)
        except OSError as exc:  # a full disk: say which file (the caller adds the cell)
            raise OSError(exc.errno, f"{exc.strerror or exc} writing {self.path}") from exc
        # The job log's formatter stamps the time: the line once, without its own stamp.
        logger.info(" ".join(parts[1:]))


def parse_line(line: str) -> tuple[str, str, dict[str, str]]:
    """Inverse of `emit` for one line: (timestamp, event, fields)."""
    head, _, rest = line.rstrip("\n").partition(" ")
    event, _, rest = rest.partition(" ")
    fields: dict[str, str] = {}
    token = ""
    in_quotes = escaped = False
    for ch in rest + " ":
        if escaped:
            token += ch
            escaped = False
        elif ch == "\\" and in_quotes:
            escaped = True
        elif ch == '"':
            in_quotes = not in_quotes
        elif ch == " " and not in_quotes:
            if "=" in token:
                key, _, value = token.partition("=")
                fields[key] = value
            token = ""
        else:
            token += ch
    return head, event, fields


def read_events(path: str | Path) -> list[tuple[str, str, dict[str, str]]]:
    """Every event of an orchestrator.log (empty if it does not exist)."""
    p = Path(path)
    if not p.exists():
        return []
    return [parse_line(line) for line in p.read_text().splitlines() if line.strip()]
