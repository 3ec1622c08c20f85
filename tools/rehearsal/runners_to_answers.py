"""Turn the runner probe's file (`../shared/tools/equivalence-probe/probe.py`: per MoE runner,
8 greedy tokens with top-5 logprobs for 4 prompts) into one equivalence answers file per runner
(measure/probefile.py), so `servesweep equivalence` compares them as it compares a run's.

    python3 tools/rehearsal/runners_to_answers.py RUNNERS.json OUTDIR"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from servesweep.core.files import write_json_atomic
from servesweep.measure.probefile import Answer, ProbeAnswers


def main(src: str, out: str) -> int:
    data = json.loads(Path(src).read_text())
    for runner, result in data.items():
        answers = [
            Answer(
                prompt=f"p{i}",
                tokens=o["tokens"],
                logprobs=o["logprobs"],
                top=[[(lp, t) for lp, t in pos] for pos in o["top5"]],
            )
            for i, o in enumerate(result.get("outputs") or [])
        ]
        probe = ProbeAnswers(
            server=f"moe_runner_backend~{runner}",
            axes={"moe_runner_backend": runner},
            fingerprint="",
            # probe.py's fixed prompts (16, 256, 2048, 8192 ids), 8 tokens, top-5
            probe_key="probe.py-2026-12-07",
            settings={"lengths": [16, 256, 2048, 8192], "output_len": 8, "top_logprobs": 5},
            engine={"kind": "sglang", "version": "0.5.17"},
            answers=answers,
            run_id=Path(src).stem,
        )
        write_json_atomic(Path(out) / f"{runner}.json", probe.to_dict())
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
