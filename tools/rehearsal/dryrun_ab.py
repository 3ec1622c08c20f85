"""Interleaved 10k dry-runs on the H200 host (docs/performance.md, planning): this checkout, an
older tree unpacked in /tmp/old (tools/rehearsal/planning_h200.sh unpacks .bundle/old.tar.gz
there) and the plain Snakefile of benchmarks/planning.py, each timed by planning.dry_run; wall
and CPU seconds per run, medians and ratios.

    OUT=$OUT PYTHONPATH=$WORK/site:$PWD/src python3 tools/rehearsal/dryrun_ab.py ROUNDS
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import yaml

sys.path.insert(0, "benchmarks")
from _common import median  # noqa: E402
from planning import PLAIN_SNAKEFILE, dry_run, experiment  # noqa: E402

SITE = os.environ.get("WORK", "/tmp/servesweep-h200") + "/site"
OUT = Path(os.environ["OUT"])
TMP = Path("/tmp/ab")


def main(rounds: int) -> None:
    (TMP / "plain").mkdir(parents=True, exist_ok=True)
    (TMP / "plain" / "Snakefile").write_text(PLAIN_SNAKEFILE)
    (TMP / "exp.yaml").write_text(yaml.safe_dump(experiment(10000), sort_keys=False))
    cfg = ["--configfile", str(TMP / "exp.yaml"), "-n"]
    variants = {
        "new": (["-s", str(Path("Snakefile").resolve()), *cfg], f"{SITE}:{Path.cwd()}/src"),
        "old": (["-s", "/tmp/old/Snakefile", *cfg], f"{SITE}:/tmp/old/src"),
        "plain": (["-s", str(TMP / "plain" / "Snakefile"), "-n"], f"{SITE}:{Path.cwd()}/src"),
    }
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
    for k in range(rounds):
        for name, (args, pythonpath) in variants.items():
            env = {**os.environ, "PYTHONPATH": pythonpath, "PLAIN_N": "10000"}
            argv = [sys.executable, "-m", "snakemake", *args, "-d", str(TMP / f"w{name}")]
            runs[name].append(dry_run(argv, env=env, out=OUT / f"ab-{name}.log"))
            print(
                k,
                name,
                f"wall {runs[name][-1]['wall_s']:.2f} cpu {runs[name][-1]['cpu_s']:.2f}",
                flush=True,
            )
    med = {
        name: (median([t["wall_s"] for t in r]), median([t["cpu_s"] for t in r]))
        for name, r in runs.items()
    }
    for name in ("new", "old"):
        wall, cpu = med[name]
        print(
            f"{name}: median wall {wall:.2f} s cpu {cpu:.2f} s; ratio to plain wall "
            f"{wall / med['plain'][0]:.2f} cpu {cpu / med['plain'][1]:.2f}"
        )
    print(f"plain: median wall {med['plain'][0]:.2f} cpu {med['plain'][1]:.2f}")


if __name__ == "__main__":
    main(int(sys.argv[1]))
