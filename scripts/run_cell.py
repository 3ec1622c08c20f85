"""Adapter for rule run_cell: one cell-repeat (server ensured lazily, client, validation).

A `shell:` job, not `script:` (per-job cost with thousands of cells, docs/performance.md): the
only argument is the raw file, from which RunPaths gives the cell and its other files; the
config comes from the Snakefile's environment."""

import argparse

from servesweep import scripting
from servesweep.cells import check_prerequisites, run_cell
from servesweep.servers import connect


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("raw", help="the cell-repeat's raw file, as the rule's output names it")
    args = p.parse_args()

    exp, paths = scripting.exported_experiment()
    cell = paths.cell_of_raw(exp, args.raw)
    check_prerequisites(exp=exp, paths=paths, cell=cell.key)
    with connect(exp, paths) as manager:
        run_cell(
            exp=exp,
            cell=cell,
            paths=paths,
            manager=manager,
            raw_out=paths.raw(cell),
            gpu_out=paths.gpu(cell),
            bench_log=paths.bench_log(cell),
        )


scripting.run(main)
