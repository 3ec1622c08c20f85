"""Adapter for rule scan_logs: final scan of every server log (fatal patterns, evidence)."""

from servesweep import scripting
from servesweep.files import write_json_atomic
from servesweep.logscan import scan_run


def main() -> None:
    exp, paths = scripting.experiment(snakemake)
    scan = scan_run(service_root=paths.root / "service", evidence=exp.evidence)
    write_json_atomic(snakemake.output.json, scan)


scripting.run(main)
