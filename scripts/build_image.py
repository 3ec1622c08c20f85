"""Adapter for rule build_image: image + capability smoke evidence for one node."""

from pathlib import Path

from servesweep import scripting
from servesweep.files import write_json_atomic
from servesweep.images import build_image
from servesweep.servers import connect


def main() -> None:
    exp, paths = scripting.experiment(snakemake)
    with connect(exp, paths) as manager:
        evidence = build_image(
            exp=exp,
            node=snakemake.wildcards.node,
            runtime=manager.runtime,
            log=Path(snakemake.log[0]),
        )
    write_json_atomic(snakemake.output.json, evidence)


scripting.run(main)
