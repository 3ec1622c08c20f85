"""What servesweep's Snakemake logger plugin (snakemake_logger_plugin_servesweep) changes on the
console: a `--configfile` Snakemake cannot read becomes the one line `servesweep plan` gives,
and quiet mode drops the scheduler's two lines per job. Pure functions over text."""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence

from servesweep.config.load import read_config_file
from servesweep.core.errors import ConfigError

# Snakemake 9.27 logs these with no event, so `--quiet` cannot drop them.
SCHEDULER_CHATTER = re.compile(r"^(Select jobs to execute\.\.\.|Execute \d+ jobs\.\.\.)$")
# Snakemake reads --configfile before any workflow code runs: a missing file is a 27-line
# traceback through load_configfile, a YAML error a WorkflowError without file or line.
CONFIG_LOAD_ERRORS = ("load_configfile", "Config file ")


def configfiles(argv: Sequence[str]) -> list[str]:
    """The `--configfile`/`--configfiles` paths of a Snakemake command line."""
    out: list[str] = []
    taking = False
    for arg in argv[1:]:
        if arg in ("--configfile", "--configfiles"):
            taking = True
            continue
        if arg.startswith(("--configfile=", "--configfiles=")):
            out.append(arg.split("=", 1)[1])
            taking = False
            continue
        if taking and not arg.startswith("-"):
            out.append(arg)
        else:
            taking = False
    return out


def config_error_line(*, message: str, configfiles: Sequence[str]) -> str | None:
    """The one line for an error Snakemake raised while reading `configfiles` (None for any
    other error): servesweep's own reading of the first file that fails, with its line."""
    if not any(marker in message for marker in CONFIG_LOAD_ERRORS):
        return None
    for path in configfiles:
        try:
            read_config_file(path)
        except ConfigError as exc:
            return f"servesweep: ConfigError: {exc}"
    return None


def console_text(
    *, text: str, error: bool, argv: Sequence[str], quiet: Collection[str]
) -> str | None:
    """What the console shows for one formatted Snakemake record: the text, its one-line
    replacement, or None (dropped). `quiet`: Snakemake's --quiet choices, lower case."""
    if error:
        line = config_error_line(message=text, configfiles=configfiles(argv))
        if line:
            return line
    if "rules" in quiet and SCHEDULER_CHATTER.match(text.strip()):
        return None
    return text
