"""Adapter for rule run_cell: one cell-repeat (server ensured lazily, client, validation)."""

from pathlib import Path

from servesweep import scripting
from servesweep.cells import check_prerequisites, run_cell
from servesweep.config import find_cell
from servesweep.servers import connect


def main() -> None:
    exp, paths = scripting.experiment(snakemake)
    w = snakemake.wildcards
    cell = find_cell(exp, server=w.server, client=w.client, repeat=w.repeat)
    check_prerequisites(exp=exp, paths=paths, cell=cell.key)
    with connect(exp, paths) as manager:
        run_cell(
            exp=exp,
            cell=cell,
            paths=paths,
            manager=manager,
            raw_out=Path(snakemake.output.raw),
            gpu_out=Path(snakemake.output.gpu),
            bench_log=Path(snakemake.log.bench),
        )


scripting.run(main)
