"""What servesweep's Snakemake logger plugin (snakemake_logger_plugin_servesweep) changes on the
console: a `--configfile` Snakemake cannot read becomes the one line `servesweep plan` gives,
and quiet mode drops the scheduler's two lines per job. Pure functions over text."""

from __future__ import annotations

import re
import shlex
from collections.abc import Collection, Mapping, Sequence

from servesweep.config.load import EXPERIMENT_ENV, read_config_file
from servesweep.core.errors import ConfigError

# Snakemake 9.27 logs these with no event, so `--quiet` cannot drop them.
SCHEDULER_CHATTER = re.compile(r"^(Select jobs to execute\.\.\.|Execute \d+ jobs\.\.\.)$")
# Snakemake reads --configfile before any workflow code runs: a missing file is a 27-line
# traceback through load_configfile, a YAML error a WorkflowError without file or line.
CONFIG_LOAD_ERRORS = ("load_configfile", "Config file ")


def option_values(argv: Sequence[str], names: Collection[str], *, many: bool) -> list[str]:
    """The values of the options `names` (`--name v`, `--name=v`; with `many`, every word up
    to the next option, as Snakemake's lists take them) on a Snakemake command line."""
    out: list[str] = []
    taking = False
    for arg in argv[1:]:
        if arg in names:
            taking = True
            continue
        name, eq, value = arg.partition("=")
        if eq and name in names:
            out.append(value)
            taking = False
            continue
        if taking and not arg.startswith("-"):
            out.append(arg)
            taking = many
        else:
            taking = False
    return out


def configfiles(argv: Sequence[str]) -> list[str]:
    """The `--configfile`/`--configfiles` paths of a Snakemake command line."""
    return option_values(argv, ("--configfile", "--configfiles"), many=True)


def refresh_command(argv: Sequence[str], env: Mapping[str, str]) -> str:
    """The `all` command of this invocation's workflow, config and environment (its snakefile,
    directory, --configfile and the env variables the experiment reads): what brings
    results.csv, summary.json and the report up to date with the raw records."""
    assigned = [f"{var}={shlex.quote(env[var])}" for var in EXPERIMENT_ENV if var in env]
    words = ["snakemake", "--cores", "1"]
    for short, names in (("-s", ("-s", "--snakefile")), ("-d", ("-d", "--directory"))):
        words += [w for v in option_values(argv, names, many=False)[-1:] for w in (short, v)]
    files = configfiles(argv)
    words += ["all", *(["--configfile", *files] if files else [])]
    return " ".join([*assigned, *(shlex.quote(w) for w in words)])


# A file of the compare target (rules/compare.smk): <results>/<A>/compare/<B>/comparison.*
COMPARISON_FILE = re.compile(
    r"^(?P<folder>(?:.*/)?[^/]+/compare/[^/]+)/comparison\.(?:json|csv|png)$"
)


def comparison_targets(argv: Sequence[str]) -> list[str]:
    """The comparison.json of each comparison a Snakemake command line targets, once each."""
    found = [m["folder"] + "/comparison.json" for a in argv[1:] if (m := COMPARISON_FILE.match(a))]
    return list(dict.fromkeys(found))


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
