"""`python -m servesweep.loadgen`: the builtin client (same as `-m servesweep.loadgen.builtin`)."""

import sys

from servesweep.loadgen.builtin import main

sys.exit(main())
