"""`python -m servesweep.sim ...`: a drop-in for `python3 -m sglang.launch_server`.

The entry point lives here, not in cli.py, so that the argument parser (cli) and the node it
starts (node, which reads the parsed arguments) import in one direction only."""

from __future__ import annotations

import asyncio
import logging
import os
import shlex
import sys
from collections.abc import Sequence

from servesweep.sim.cli import FAULTS_ENV, parse_args
from servesweep.sim.logs import setup_logging
from servesweep.sim.node import run_node

logger = logging.getLogger("servesweep.sim.cli")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: parse, set up logging, run this rank until SIGTERM or a fatal error."""
    argv = list(sys.argv[1:] if argv is None else argv)
    ns = parse_args(argv)
    setup_logging(level=ns.log_level)
    if os.environ.get(FAULTS_ENV, "").strip():
        logger.info(f"Fault injection from {FAULTS_ENV}: {os.environ[FAULTS_ENV].strip()}")
    launch_command = shlex.join([sys.executable, "-m", "servesweep.sim", *argv])
    return asyncio.run(run_node(ns, launch_command=launch_command))


if __name__ == "__main__":
    raise SystemExit(main())
