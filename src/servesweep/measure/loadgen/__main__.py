"""`python -m servesweep.measure.loadgen`: the builtin client (same as its `.builtin`)."""

import sys

from servesweep.measure.loadgen.builtin import main

sys.exit(main())
