"""Adapter for rule down: stop every server of the run (after a hard kill)."""

from servesweep import scripting
from servesweep.servers import shutdown


def main() -> None:
    exp, paths = scripting.experiment(snakemake)
    shutdown(exp, paths, reason="down rule")


scripting.run(main)
