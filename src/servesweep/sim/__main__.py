"""`python -m servesweep.sim ...`: a drop-in for `python3 -m sglang.launch_server`."""

from servesweep.sim.cli import main

raise SystemExit(main())
