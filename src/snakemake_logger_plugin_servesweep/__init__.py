"""Snakemake logger plugin `servesweep` (profiles/default: `logger: [servesweep]`): Snakemake's
console output, with a `--configfile` error as one servesweep line and, in quiet mode, without
the scheduler's lines (servesweep.workflow.snakelog). Snakemake attaches its own filter and
formatter (has_filter, has_formatter False), so everything else reads as without the plugin."""

from __future__ import annotations

import logging
import sys

from snakemake_interface_logger_plugins.base import LogHandlerBase

from servesweep.workflow.snakelog import console_text


class LogHandler(LogHandlerBase):
    """Writes Snakemake's formatted records to stderr (stdout with --stdout)."""

    def __post_init__(self) -> None:
        self.stream = sys.stdout if self.common_settings.stdout else sys.stderr
        self.quiet = {str(getattr(q, "name", q)).lower() for q in self.common_settings.quiet or ()}

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
            if not text:
                return
            shown = console_text(
                text=text,
                error=record.levelno >= logging.ERROR,
                argv=sys.argv,
                quiet=self.quiet,
            )
            if shown is not None:
                self.stream.write(shown + "\n")
                self.stream.flush()
        except Exception:  # noqa: BLE001 - logging must never raise
            self.handleError(record)

    @property
    def writes_to_stream(self) -> bool:
        return True

    @property
    def writes_to_file(self) -> bool:
        return False

    @property
    def has_filter(self) -> bool:
        return False

    @property
    def has_formatter(self) -> bool:
        return False

    @property
    def needs_rulegraph(self) -> bool:
        return False
