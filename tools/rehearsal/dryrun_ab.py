"""Interleaved 10k dry-runs (docs/performance.md, planning): this checkout, an older tree
unpacked in /tmp/old if there is one (tools/rehearsal/bench_h200.sh planning unpacks
.bundle/old.tar.gz there), and the plain Snakefile of benchmarks/planning.py, each timed by
planning.dry_run; with ALT_SNAKEMAKE=DIR (another Snakemake installed there, `pip install
--target DIR`), the checkout and the plain Snakefile again under that Snakemake. Wall and CPU
seconds per run, medians, and each workflow's ratio to the plain Snakefile under the same
Snakemake.

    OUT=$OUT PYTHONPATH=$WORK/site:$PWD/src [ALT_SNAKEMAKE=DIR] \\
      python3 tools/rehearsal/dryrun_ab.py ROUNDS

writes $OUT/dryrun_ab.json.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

sys.path.insert(0, "benchmarks")
from _common import median, provenance  # noqa: E402
from planning import PLAIN_SNAKEFILE, dry_run, experiment  # noqa: E402

SITE = os.environ.get("WORK", "/tmp/servesweep-h200") + "/site"
OUT = Path(os.environ["OUT"])
TMP = Path("/tmp/ab")
OLD = Path("/tmp/old")


def variants() -> dict[str, tuple[list[str], str, str]]:
    """name: (snakemake arguments, PYTHONPATH, the plain variant it is compared with)."""
    cfg = ["--configfile", str(TMP / "exp.yaml"), "-n"]
    ours = ["-s", str(Path("Snakefile").resolve()), *cfg]
    plain = ["-s", str(TMP / "plain" / "Snakefile"), "-n"]
    src = f"{SITE}:{Path.cwd()}/src"
    found = {"new": (ours, src, "plain"), "plain": (plain, src, "plain")}
    if (OLD / "Snakefile").exists():
        found["old"] = (["-s", str(OLD / "Snakefile"), *cfg], f"{SITE}:{OLD}/src", "plain")
    if alt := os.environ.get("ALT_SNAKEMAKE"):
        found["new@alt"] = (ours, f"{alt}:{src}", "plain@alt")
        found["plain@alt"] = (plain, f"{alt}:{src}", "plain@alt")
    return found


def main(rounds: int) -> None:
    (TMP / "plain").mkdir(parents=True, exist_ok=True)
    (TMP / "plain" / "Snakefile").write_text(PLAIN_SNAKEFILE)
    (TMP / "exp.yaml").write_text(yaml.safe_dump(experiment(10000), sort_keys=False))
    found = variants()
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in found}
    for k in range(rounds):
        for name, (args, pythonpath, _) in found.items():
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
    rows = {}
    for name, (_, pythonpath, base) in found.items():
        wall, cpu = med[name]
        rows[name] = {
            "snakemake": snakemake_version(pythonpath),
            "wall_s": wall,
            "cpu_s": cpu,
            "compared_with": base,
            "ratio_wall": wall / med[base][0],
            "ratio_cpu": cpu / med[base][1],
        }
        print(
            f"{name} (Snakemake {rows[name]['snakemake']}): median wall {wall:.2f} s cpu "
            f"{cpu:.2f} s; ratio to {base} wall {rows[name]['ratio_wall']:.2f} cpu "
            f"{rows[name]['ratio_cpu']:.2f}"
        )
    result = {"provenance": provenance(), "rounds": rounds, "cell_repeats": 10000, "rows": rows}
    (OUT / "dryrun_ab.json").write_text(json.dumps(result, indent=1) + "\n")


def snakemake_version(pythonpath: str) -> str:
    code = "import snakemake; print(snakemake.__version__)"
    env = {**os.environ, "PYTHONPATH": pythonpath}
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    return res.stdout.strip() or "?"


if __name__ == "__main__":
    main(int(sys.argv[1]))
