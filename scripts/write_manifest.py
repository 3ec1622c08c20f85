"""Adapter for rule write_manifest."""

from pathlib import Path

from servesweep import scripting
from servesweep.files import write_json_atomic
from servesweep.manifest import build_manifest


def main() -> None:
    exp, paths = scripting.experiment(snakemake)
    repo = Path(snakemake.scriptdir).parent
    write_json_atomic(snakemake.output.json, build_manifest(exp=exp, paths=paths, repo=repo))


scripting.run(main)
