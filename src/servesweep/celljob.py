"""Rule run_cell's job: one cell-repeat, named by its raw file (server ensured lazily, client,
validation). Run by `scripts/run_cell.py` through the fork server (servesweep.forkserver)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from servesweep import scripting
from servesweep.cells import check_prerequisites, run_cell
from servesweep.servers import connect


def main(argv: Sequence[str]) -> None:
    """`run_cell RAW`: the config comes from the Snakefile's environment, the cell and its
    gpu/bench files from the raw path (RunPaths)."""
    p = argparse.ArgumentParser(prog="run_cell", description=__doc__)
    p.add_argument("raw", help="the cell-repeat's raw file, as the rule's output names it")
    args = p.parse_args(argv)
    scripting.run(lambda: _run(args.raw))


def _run(raw: str) -> None:
    exp, paths = scripting.exported_experiment()
    cell = paths.cell_of_raw(exp, raw)
    check_prerequisites(exp=exp, paths=paths, cell=cell.key)
    with connect(exp, paths) as manager:
        run_cell(exp=exp, cell=cell, paths=paths, manager=manager)
