"""Interleaved 10k dry-runs on the H200 host (docs/performance.md, planning): this checkout, an
older tree unpacked in /tmp/old (tools/rehearsal/planning_h200.sh unpacks 540c289 there) and the
plain Snakefile of benchmarks/planning.py; wall and CPU seconds per run, medians and ratios.

    OUT=$OUT PYTHONPATH=$WORK/site:$PWD/src python3 tools/rehearsal/dryrun_ab.py ROUNDS
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import yaml

sys.path.insert(0, "benchmarks")
from planning import PLAIN_SNAKEFILE, experiment  # noqa: E402

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
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    for k in range(rounds):
        for name, (args, pythonpath) in variants.items():
            env = {**os.environ, "PYTHONPATH": pythonpath, "PLAIN_N": "10000"}
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            start = time.perf_counter()
            with open(OUT / f"ab-{name}.err", "w") as err:
                argv = [sys.executable, "-m", "snakemake", *args, "-d", str(TMP / f"w{name}")]
                subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=err, check=True)
            wall = time.perf_counter() - start
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
            runs[name].append((wall, cpu))
            print(k, name, f"wall {wall:.2f} cpu {cpu:.2f}", flush=True)
    med = {
        name: (statistics.median(w for w, _ in r), statistics.median(c for _, c in r))
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
