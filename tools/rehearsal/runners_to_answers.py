"""Turn the runner probe's file (`../shared/tools/equivalence-probe/probe.py`: per MoE runner,
8 greedy tokens with top-5 logprobs for 4 prompts) into one equivalence answers file per runner
(measure/probefile.py), so `servesweep equivalence` compares them as it compares a run's.

    python3 tools/rehearsal/runners_to_answers.py RUNNERS.json OUTDIR"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from servesweep.core.files import write_json_atomic
from servesweep.measure.probefile import from_runner_probe


def main(src: str, out: str) -> int:
    data = json.loads(Path(src).read_text())
    for runner, probe in from_runner_probe(data, run_id=Path(src).stem).items():
        write_json_atomic(Path(out) / f"{runner}.json", probe.to_dict())
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
