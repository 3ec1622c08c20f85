"""Adapter for rule run_cell: one cell-repeat, named by its raw file (servesweep.celljob).

A `shell:` job, not `script:`, and it imports only servesweep.forkserver: the cell runs in a
child of the workflow's fork server, which has the cell code imported already (per-job cost
with thousands of cells, docs/performance.md)."""

import sys

from servesweep import forkserver

forkserver.run_job("servesweep.celljob:main", sys.argv[1:])
