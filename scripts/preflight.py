"""Adapter for rule preflight: checks before any server start, as evidence."""

from servesweep import scripting
from servesweep.files import write_json_atomic
from servesweep.preflight import run_preflight
from servesweep.servers import connect


def main() -> None:
    exp, paths = scripting.experiment(snakemake)
    with connect(exp, paths) as manager:
        evidence = run_preflight(exp=exp, manager=manager)
    write_json_atomic(snakemake.output.json, evidence)


scripting.run(main)
