"""Adapter for rule run_cell: one cell-repeat (server ensured lazily, client, validation).

A `shell:` job, not `script:` (per-job cost with thousands of cells, docs/performance.md):
wildcards and files come as arguments, the config from the Snakefile's environment."""

import argparse
from pathlib import Path

from servesweep import scripting
from servesweep.cells import check_prerequisites, run_cell
from servesweep.config import find_cell
from servesweep.servers import connect


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    for name in ("server", "client", "repeat", "raw", "gpu", "bench-log"):
        p.add_argument(f"--{name}", required=True)
    args = p.parse_args()

    exp, paths = scripting.exported_experiment()
    cell = find_cell(exp, server=args.server, client=args.client, repeat=args.repeat)
    check_prerequisites(exp=exp, paths=paths, cell=cell.key)
    with connect(exp, paths) as manager:
        run_cell(
            exp=exp,
            cell=cell,
            paths=paths,
            manager=manager,
            raw_out=Path(args.raw),
            gpu_out=Path(args.gpu),
            bench_log=Path(args.bench_log),
        )


scripting.run(main)
