"""Item 2: `snakemake -n` of the workflow vs a plain Snakefile with as many trivial jobs.

For each size N (cell-repeats): the default experiment with 10 server configs x N/50 client
configs x 5 repeats, dry-run with the repo's Snakefile and workflow profile, against a plain
Snakefile with N jobs of one rule and one job gathering them. Wall and CPU time of each
`snakemake -n` (output to a file), median over --repeats interleaved runs; ratio = workflow /
plain. `--profile N` adds a cProfile breakdown of the workflow's dry-run at size N.

`--ablations N` times, at size N, copies of the workflow with one per-cell feature taken out
each (ABLATIONS): what each feature costs in planning.

    python benchmarks/planning.py [--sizes 100,1000,10000] [--repeats 3] [--profile 10000]
                                  [--ablations 10000] [--smoke]

Checks (exit 1, each failure named, after the JSON is written): sanity, both dry-runs planned
more jobs than cell-repeats; goal (a timing), the workflow's own overhead: `ratio_wall_vs_shaped`
(the workflow against a Snakefile of run_cell's shape, medians of interleaved runs) <= 1.15 at
every size of at least 10k (issue 41: Snakemake's own per-job cost, e.g. 9.19+'s `script:`
check, is the shaped Snakefile's too). The plain ratio is reported, not gated. `--smoke` (one
dry-run each at 100) enforces the sanity bound and reports the ratios without failing on them.
"""

from __future__ import annotations

import argparse
import json
import pstats
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from _common import (
    REPO,
    Check,
    add_common_args,
    check_rows,
    log,
    median,
    scratch_dir,
    setup_logging,
    snakemake_exe,
    verdict,
    workflow_env,
    write_result,
)

# The workflow's own planning overhead, against a Snakefile of run_cell's shape, at >= GOAL_SIZE.
GOAL_RATIO = 1.15
GOAL_SIZE = 10_000
# --smoke: one dry-run of each at 100 cell-repeats (seconds); the ratio is reported, not
# enforced (a timing at a tiny size on a shared machine: benchmarks/README.md).
SMOKE = {"sizes": "100", "repeats": 1}
SERVER_AXES = {
    "moe_runner_backend": ["marlin", "flashinfer_mxfp4"],
    "chunked_prefill_size": [4096, 8192, 12288, 16384, 20480],
}
REPEATS_PER_CELL = 5
PLAIN_SNAKEFILE = """\
# N trivial jobs and one job gathering them (the baseline of benchmarks/planning.py).
import os

N = int(os.environ["PLAIN_N"])


rule all:
    input:
        "summary.txt",


rule gather:
    input:
        expand("raw/{i}.txt", i=range(N)),
    output:
        "summary.txt",
    shell:
        "cat {input} > {output}"


rule job:
    output:
        "raw/{i}.txt",
    shell:
        "echo {wildcards.i} > {output}"
"""
# The plain baseline with run_cell's per-job shape and none of servesweep's code: a `script:`,
# two outputs, two logs, three params functions and a priority function per job, its first
# output listed by `all` and by the gathering job, which gathers the second too. What Snakemake
# itself charges for the features the workflow promises (docs/performance.md): servesweep /
# shaped is the workflow's own overhead.
SHAPED_SNAKEFILE = """\
import os

N = int(os.environ["PLAIN_N"])
RAW = expand("raw/{i}.txt", i=range(N))


def fingerprint(wildcards):
    return f"f{wildcards.i}"


def workload(wildcards):
    return f"w{wildcards.i}"


def measured_with(wildcards):
    return f"m{wildcards.i}"


def priority(wildcards):
    return int(wildcards.i) % 7


rule all:
    input:
        RAW,
        "summary.txt",


rule gather:
    input:
        raw=RAW,
        gpu=expand("gpu/{i}.txt", i=range(N)),
    output:
        "summary.txt",
    shell:
        "cat {input.raw} > {output}"


rule job:
    output:
        raw="raw/{i}.txt",
        gpu="gpu/{i}.txt",
    log:
        job="logs/{i}.log",
        bench="bench/{i}.log",
    priority: priority
    params:
        fingerprint=fingerprint,
        workload=workload,
        measured_with=measured_with,
    script:
        "job.py"
"""
SHAPED_SCRIPT = "open(snakemake.output.raw, 'w').close()\n"
# Where the dry-run's time goes (cumulative seconds under cProfile), by Snakemake function.
PHASES = {
    "parse Snakefile (includes)": "snakemake/workflow.py:include",
    "build DAG": "snakemake/dag.py:init",
    "  input functions / params": "snakemake/rules.py:apply_input_function",
    "  script source checks": "snakemake/script/__init__.py:get_source",
    "  needrun (rerun triggers)": "snakemake/dag.py:update_needrun",
    "schedule + print jobs": "snakemake/scheduling/job_scheduler.py:schedule",
    "  format messages": "snakemake/jobs.py:message",
}


# Per-cell features of the workflow, each taken out of a copy: (file, text removed) edits. The
# texts must be in the workflow (the run fails loudly when the rules changed).
ABLATIONS: dict[str, list[tuple[str, str]]] = {
    "raw files not requested by `all` (a deleted raw file would not rerun its cell)": [
        ("Snakefile", "        raw=RAW_FILES,\n"),
    ],
    "one params function: no `workload` param (a workload change would not rerun cells)": [
        ("rules/cells.smk", "        workload=cell_workload,\n"),
    ],
    "no priority function (server configs interleave: a server start per switch)": [
        ("rules/cells.smk", "    priority: cell_priority\n"),
    ],
    "raw file only: no GPU snapshot output, no bench log": [
        ("rules/cells.smk", '        gpu=PATHS.cell_pattern("gpu"),\n'),
        ("rules/analysis.smk", "        gpu=AGGREGATED_GPU,\n"),
        ("rules/cells.smk", '        bench=PATHS.cell_pattern("bench"),\n'),
    ],
}


ABLATIONS["no script: (Snakemake checks a script's source per job)"] = [
    ("rules/cells.smk", '    script:\n        "../scripts/run_cell.py"\n'),
]
ABLATIONS["all of the above taken out"] = [edit for edits in ABLATIONS.values() for edit in edits]


def ablated_copy(workflow: Path, dest: Path, edits: list[tuple[str, str]]) -> Path:
    """A copy of the workflow's Snakefile, rules and profile with `edits` removed."""
    dest.mkdir(parents=True)
    for part in ("Snakefile", "rules", "profiles", "config", "scripts", "report", "schemas"):
        src = workflow / part
        if src.is_dir():
            shutil.copytree(src, dest / part)
        elif src.exists():
            shutil.copy2(src, dest / part)
    for name, text in edits:
        path = dest / name
        source = path.read_text()
        if text not in source:
            raise SystemExit(f"ablation: {name} no longer contains {text!r}; update ABLATIONS")
        path.write_text(source.replace(text, "", 1))
    return dest / "Snakefile"


def experiment(n: int) -> dict[str, Any]:
    """The default config with about `n` cell-repeats (10 servers x n/50 clients x 5)."""
    raw = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    servers = len(SERVER_AXES["moe_runner_backend"]) * len(SERVER_AXES["chunked_prefill_size"])
    clients = max(1, n // (servers * REPEATS_PER_CELL))
    raw["run_id"] = f"plan-{n}"
    raw["matrix"] = {
        "server": SERVER_AXES,
        "client": {"concurrency": list(range(1, clients + 1))},
    }
    raw["repeats"] = REPEATS_PER_CELL
    return raw


def dry_run(argv: list[str], *, env: dict[str, str], out: Path) -> dict[str, float]:
    """Wall and CPU seconds of one `snakemake -n` (stdout+stderr into `out`)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    with open(out, "w") as fh:
        res = subprocess.run(argv, env=env, stdout=fh, stderr=subprocess.STDOUT, timeout=1800)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {res.returncode}; see {out}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": wall, "cpu_s": cpu}


def job_count(out: Path) -> int | None:
    """The `total` line of Snakemake's job stats."""
    for line in out.read_text().splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "total" and parts[1].isdigit():
            return int(parts[1])
    return None


def profile_dry_run(argv: list[str], *, env: dict[str, str], out: Path) -> dict[str, Any]:
    """cProfile one workflow dry-run in a child process; phase times and top functions."""
    prof = out.with_suffix(".prof")
    code = (
        "import cProfile, sys; from snakemake.cli import main\n"
        "p = cProfile.Profile(); p.enable()\n"
        "try:\n    main(sys.argv[2:])\nexcept SystemExit:\n    pass\n"
        "finally:\n    p.disable(); p.dump_stats(sys.argv[1])\n"
    )
    with open(out, "w") as fh:
        subprocess.run(
            [sys.executable, "-c", code, str(prof), *argv[1:]],
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
            timeout=3600,
        )
    stats = pstats.Stats(str(prof)).stats  # type: ignore[attr-defined]
    by_name: dict[str, float] = {}
    for (path, _line, func), (_cc, _nc, _tt, ct, _callers) in stats.items():
        key = f"{path.split('site-packages/')[-1]}:{func}"
        by_name[key] = max(by_name.get(key, 0.0), ct)
    total = max(by_name.values(), default=0.0)
    phases = {label: round(by_name.get(name, 0.0), 2) for label, name in PHASES.items()}
    ours = sorted(
        ((k, v) for k, v in by_name.items() if k.startswith(str(REPO)) or "servesweep" in k),
        key=lambda kv: -kv[1],
    )[:12]
    return {
        "profiled_total_s": round(total, 2),
        "phases_profiled_s": phases,
        "top_workflow_functions_profiled_s": [[k, round(v, 2)] for k, v in ours],
        "note": "cProfile slows Snakemake ~2x; compare the phases with each other only",
    }


def time_ablations(args: argparse.Namespace, *, tmp: Path, exe: str, plain: Path) -> dict[str, Any]:
    """Dry-runs of the workflow and of each ablated copy at one size, interleaved with the plain
    Snakefile; ratios to plain, median over --repeats."""
    n = args.ablations
    config = tmp / f"abl{n}.yaml"
    config.write_text(yaml.safe_dump(experiment(n), sort_keys=False))
    variants = {"the workflow as it is": Path(args.workflow) / "Snakefile"}
    for k, (label, edits) in enumerate(ABLATIONS.items()):
        variants[label] = ablated_copy(Path(args.workflow), tmp / f"ablation{k}", edits)
    rows = []
    for k, (label, snakefile) in enumerate(variants.items()):
        ours, plains = [], []
        for _ in range(args.repeats):
            argv = [exe, "-s", str(snakefile), "-d", str(tmp / f"absw{k}"), "--configfile"]
            ours.append(dry_run([*argv, str(config), "-n"], env=workflow_env(), out=tmp / "a.txt"))
            plain_argv = [exe, "-s", str(plain), "-d", str(tmp / f"abplain{k}"), "-n"]
            env = workflow_env(PLAIN_N=str(n))
            plains.append(dry_run(plain_argv, env=env, out=tmp / "p.txt"))
        wall = median([t["wall_s"] for t in ours])
        plain_wall = median([t["wall_s"] for t in plains])
        rows.append(
            {
                "variant": label,
                "wall_s": wall,
                "plain_wall_s": plain_wall,
                "ratio_wall": wall / plain_wall,
            }
        )
        log.info("ablation N=%d %-80s ratio %.2f", n, label, wall / plain_wall)
    return {"cell_repeats": n, "rows": rows}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sizes", default="100,1000,10000")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--workflow", default=str(REPO), help="directory with the Snakefile to time")
    p.add_argument("--profile", type=int, default=None, help="also cProfile this size")
    p.add_argument("--ablations", type=int, default=None, help="also time ABLATIONS at this size")
    add_common_args(p)
    if p.parse_known_args(argv)[0].smoke:  # smoke sizes; a flag given still wins
        p.set_defaults(**SMOKE)
    return p.parse_args(argv)


def checks(rows: list[dict[str, Any]]) -> list[Check]:
    """The goal per size (a timing) and the sanity bounds: both dry-runs planned their jobs."""
    found = [
        Check(
            "both dry-runs planned every job",
            bool(rows)
            and all(
                isinstance(r["jobs"], int)
                and r["jobs"] > r["cell_repeats"]
                and (r["plain_jobs"] or 0) > r["cell_repeats"]
                for r in rows
            ),
            ", ".join(f"N={r['cell_repeats']}: {r['jobs']} vs {r['plain_jobs']} jobs" for r in rows)
            or "no sizes",
        )
    ]
    for r in rows:
        if r["cell_repeats"] < GOAL_SIZE:
            continue
        found.append(
            Check(
                f"dry-run <= {GOAL_RATIO}x a run_cell-shaped Snakefile at {r['cell_repeats']:,}",
                r["goal_met"],
                f"{r['ratio_wall_vs_shaped']:.2f}x (plain: {r['ratio_wall']:.2f}x, reported)",
                timing=True,
            )
        )
    return found


def main(argv: list[str] | None = None) -> int:
    setup_logging()
    args = parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    exe = snakemake_exe()
    snakefile = Path(args.workflow) / "Snakefile"
    rows = []
    profile = None
    ablations = None
    with scratch_dir("planning", keep=args.keep_tmp) as tmp:
        plain = tmp / "plain" / "Snakefile"
        plain.parent.mkdir()
        plain.write_text(PLAIN_SNAKEFILE)
        shaped = tmp / "shaped" / "Snakefile"
        shaped.parent.mkdir()
        shaped.write_text(SHAPED_SNAKEFILE)
        (shaped.parent / "job.py").write_text(SHAPED_SCRIPT)
        for n in sizes:
            config = tmp / f"exp{n}.yaml"
            config.write_text(yaml.safe_dump(experiment(n), sort_keys=False))
            ours_argv = [exe, "-s", str(snakefile), "-d", str(tmp / f"ws{n}")]
            ours_argv += ["--configfile", str(config), "-n"]
            plain_argv = [exe, "-s", str(plain), "-d", str(tmp / f"plain{n}"), "-n"]
            shaped_argv = [exe, "-s", str(shaped), "-d", str(tmp / f"shaped{n}"), "-n"]
            timings: dict[str, list[dict[str, float]]] = {
                "servesweep": [],
                "plain": [],
                "shaped": [],
            }
            for k in range(args.repeats):  # interleaved: both see the same machine load
                out = tmp / f"ours{n}.{k}.txt"
                timings["servesweep"].append(dry_run(ours_argv, env=workflow_env(), out=out))
                jobs = job_count(out)
                pout = tmp / f"plain{n}.{k}.txt"
                env = workflow_env(PLAIN_N=str(n))
                timings["plain"].append(dry_run(plain_argv, env=env, out=pout))
                plain_jobs = job_count(pout)
                sout = tmp / f"shaped{n}.{k}.txt"
                timings["shaped"].append(dry_run(shaped_argv, env=env, out=sout))
            row: dict[str, Any] = {"cell_repeats": n, "jobs": jobs, "plain_jobs": plain_jobs}
            for name, runs in timings.items():
                row[f"{name}_wall_s"] = median([r["wall_s"] for r in runs])
                row[f"{name}_cpu_s"] = median([r["cpu_s"] for r in runs])
            row["ratio_wall"] = row["servesweep_wall_s"] / row["plain_wall_s"]
            row["ratio_cpu"] = row["servesweep_cpu_s"] / row["plain_cpu_s"]
            row["shaped_ratio_wall"] = row["shaped_wall_s"] / row["plain_wall_s"]
            row["ratio_wall_vs_shaped"] = row["servesweep_wall_s"] / row["shaped_wall_s"]
            row["ratio_cpu_vs_shaped"] = row["servesweep_cpu_s"] / row["shaped_cpu_s"]
            row["goal_met"] = row["ratio_wall_vs_shaped"] <= GOAL_RATIO
            rows.append(row)
            log.info(
                "N=%-6d jobs %-6s servesweep %6.2f s  plain %6.2f s  ratio %.2f (CPU %.2f);"
                " shaped %6.2f s: shaped/plain %.2f, servesweep/shaped %.2f (CPU %.2f)",
                n,
                jobs,
                row["servesweep_wall_s"],
                row["plain_wall_s"],
                row["ratio_wall"],
                row["ratio_cpu"],
                row["shaped_wall_s"],
                row["shaped_ratio_wall"],
                row["ratio_wall_vs_shaped"],
                row["ratio_cpu_vs_shaped"],
            )
        if args.profile:
            n = args.profile
            config = tmp / f"exp{n}.yaml"
            config.write_text(yaml.safe_dump(experiment(n), sort_keys=False))
            argv_p = [exe, "-s", str(snakefile), "-d", str(tmp / f"prof{n}")]
            argv_p += ["--configfile", str(config), "-n"]
            profile = {"cell_repeats": n}
            profile |= profile_dry_run(argv_p, env=workflow_env(), out=tmp / f"prof{n}.txt")
            log.info("profile: %s", json.dumps(profile, indent=1))
        if args.ablations:
            ablations = time_ablations(args, tmp=tmp, exe=exe, plain=plain)
    result = {
        "params": {
            "sizes": sizes,
            "repeats": args.repeats,
            "smoke": args.smoke,
            "shape": "10 server configs x N/50 client configs x 5 repeats, default experiment",
            "plain": "N jobs of one rule (shell: echo) + one job gathering them",
            "profile": f"every dry-run from {Path.cwd()}: Snakemake takes profiles/default from "
            "the current directory first, so when that is the repo the plain and shaped "
            "Snakefiles run under the workflow profile too (its logger plugin, scheduler, "
            "resources)",
            "shaped": "the plain baseline with run_cell's per-job shape (script, 2 outputs, "
            "2 logs, 3 params functions, a priority function; raw files listed twice)",
            "command": "snakemake -n (workflow profile of the repo; output to a file)",
            "workflow": str(snakefile),
        },
        "goal_ratio": GOAL_RATIO,
        "goal_size": GOAL_SIZE,
        "rows": rows,
        "profile": profile,
        "ablations": ablations,
    }
    found = checks(rows)
    result["checks"] = check_rows(found, smoke=args.smoke)
    write_result("planning", result, args.out, smoke=args.smoke)
    return verdict(found, smoke=args.smoke)


if __name__ == "__main__":
    sys.exit(main())
