"""Generate docs/performance.md from the benchmark scripts' JSON results.

    python benchmarks/make_performance_doc.py [--results benchmarks/results] [--out docs/...]

The text is the template `benchmarks/performance.md.j2`; this script only fills it with tables
and figures read from `benchmarks/results/<item>.json` (each written by `benchmarks/<item>.py`,
figures + provenance). An optional `<item>.before.json` (the same script run before a change)
adds a "before" column; `ci.json` (the test suite's recorded runs) adds its section. Missing
results are listed as not measured.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jinja2

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
DOC = REPO / "docs" / "performance.md"
TEMPLATE = REPO / "benchmarks" / "performance.md.j2"
ITEMS = ("client", "planning", "orchestration", "aggregation", "large_run")


def load(results: Path, name: str) -> dict[str, Any] | None:
    path = results / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def num(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        return f"{value:.{digits}f}"
    return str(value)


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += [
        "| " + " | ".join(num(c) if not isinstance(c, str) else c for c in r) + " |" for r in rows
    ]
    return "\n".join(lines)


def where(data: dict[str, Any]) -> str:
    p = data["provenance"]
    dirty = " + uncommitted changes" if p.get("git_dirty") else ""
    return (
        f"*Measured {p['measured_at']} on `{p['host']}` ({p['cpu']}, {p['cpus']} CPUs, load "
        f"average {p['load_avg_1m']} at the start), Python {p['python']}, Snakemake "
        f"{p['snakemake']}, aiohttp {p['aiohttp']}, pandas {p['pandas']}, commit "
        f"`{p['git_sha']}`{dirty}.*"
    )


def host(provenance: dict[str, Any]) -> dict[str, Any]:
    """The provenance fields a sentence about another host names."""
    keys = ("cpus", "python", "measured_at", "git_sha")
    return {k: provenance[k] for k in keys}


def met(flag: Any) -> str:
    return "met" if flag is True else ("**not met**" if flag is False else "-")


# ---------------------------------------------------------------- 1. client

CLIENT_HEADER = [
    "client",
    "C",
    "output tokens",
    "requests",
    "req/s",
    "TTFT p50 ms",
    "TTFT p99 ms",
    "client CPU us/req",
    "client CPU us/token",
    "max GC pause ms",
    "sim core busy",
]


def client_rows(data: dict[str, Any]) -> list[list[Any]]:
    return [
        [
            r["client"],
            r["concurrency"],
            r["output_len"],
            r["completed"],
            r["request_rps"],
            r["ttft_p50_ms"],
            r["ttft_p99_ms"],
            r["cpu_us_per_request"],
            r["cpu_us_per_token"] if r["output_len"] > 1 else None,
            r["gc_max_pause_ms"],
            f"{100 * r['server_busy']:.0f} %",
        ]
        for r in data["runs"]
    ]


def sim_cores(p: dict[str, Any]) -> str:
    """Where the sim ran: one core (older results: `server_core`) or one process per core."""
    cores = p.get("server_cores", [p.get("server_core")])
    if len(cores) == 1:
        return f"the sim on core {cores[0]}"
    return f"{len(cores)} sim processes on one port, on cores {', '.join(map(str, cores))}"


def client_context(data: dict[str, Any], before: dict[str, Any] | None) -> dict[str, Any]:
    g = data["goals"]
    ratios = table(
        ["C", "req/s", "CPU per request", "TTFT p50", "TTFT p99", "TTFT not above bench"],
        [
            [
                r["concurrency"],
                r["rps_ratio"],
                r["cpu_per_request_ratio"],
                r["ttft_p50_ratio"],
                r["ttft_p99_ratio"],
                r["ttft_not_above_bench"],
            ]
            for r in data["ratios"]
        ],
    )
    goals = table(
        ["goal", "measured", ""],
        [
            [
                f">= {num(g['builtin_rps_c256_goal'])} req/s at C=256 on one core",
                num(g["builtin_rps_c256"]),
                met(g["builtin_rps_c256_met"]),
            ],
            [
                "added TTFT (p50 and p99) not above bench_serving's at every C",
                num(g["ttft_not_above_bench_at_every_concurrency"]),
                met(g["ttft_not_above_bench_at_every_concurrency"]),
            ],
            [
                f"<= {num(g['builtin_us_per_token_goal'])} us of client CPU per streamed token",
                num(g["builtin_us_per_token"]),
                met(g["builtin_us_per_token_met"]),
            ],
        ],
    )
    out: dict[str, Any] = {
        "where": where(data),
        "p": data["params"],
        "sim_cores": sim_cores(data["params"]),
        "runs": table(CLIENT_HEADER, client_rows(data)),
        "ratios": ratios,
        "goals": goals,
        "before": None,
        "h200": client_h200(data["h200"]) if data.get("h200") else None,
    }
    if before is not None:
        out["before"] = table(CLIENT_HEADER, [r for r in client_rows(before) if r[0] == "builtin"])
        out["before_at"] = before["provenance"]["measured_at"]
        out["before_sha"] = before["provenance"]["git_sha"]
    return out


def _stream(data: dict[str, Any], client: str) -> dict[str, Any]:
    return next(r for r in data["runs"] if r["client"] == client and r["output_len"] > 1)


def client_h200(h200: dict[str, Any]) -> dict[str, Any]:
    """client.py on the H200 host with the sim on several core counts (client.h200.json)."""
    rows = []
    for data in h200["by_sim_cores"]:
        ours, bench = _stream(data, "builtin"), _stream(data, "bench_serving")
        c256 = next(r for r in data["ratios"] if r["concurrency"] == 256)
        cost = (data["self_check"] or {}).get("cost")
        rows.append(
            [
                len(data["params"]["server_cores"]),
                data["goals"]["builtin_rps_c256"],
                c256["rps_ratio"],
                ours["request_rps"],
                bench["request_rps"],
                ours["cpu_us_per_token"],
                bench["cpu_us_per_token"],
                ours["cpu_us_per_token"] / bench["cpu_us_per_token"],
                f"{100 * ours['server_busy']:.0f} % / {100 * bench['server_busy']:.0f} %",
                f"{ours['ttft_p50_ms']:.1f} / {bench['ttft_p50_ms']:.1f}",
                ours["client_loop_lag_p99_ms"],
                "-" if cost is None else f"{100 * cost:+.1f} %",
            ]
        )
    header = [
        "sim cores",
        "builtin req/s C=256",
        "builtin / bench req/s C=256",
        "stream req/s builtin",
        "stream req/s bench",
        "builtin us/token",
        "bench us/token",
        "builtin / bench CPU per token",
        "sim busy (builtin / bench)",
        "stream TTFT p50 ms (builtin / bench)",
        "builtin loop lag p99 ms",
        "self-check cost C=256",
    ]
    cores = [str(len(d["params"]["server_cores"])) for d in h200["by_sim_cores"]]
    return {
        **host(h200["by_sim_cores"][0]["provenance"]),
        "command": h200["command"],
        "sim_cores": ", ".join(cores[:-1]) + f" and {cores[-1]}" if len(cores) > 1 else cores[0],
        "table": table(header, rows),
    }


# ---------------------------------------------------------------- 2. planning

PLANNING_HEADER = [
    "cell-repeats",
    "jobs",
    "servesweep s",
    "plain s",
    "shaped s",
    "servesweep / plain (wall)",
    "servesweep / plain (CPU)",
    "servesweep / shaped (wall)",
    "servesweep / shaped (CPU)",
    "goal",
]


def planning_rows(data: dict[str, Any]) -> list[list[Any]]:
    """One row per size; the goal (on servesweep / shaped) only where the size is gated."""
    goal_size = data.get("goal_size")
    rows = []
    for r in data["rows"]:
        gated = goal_size is not None and r["cell_repeats"] >= goal_size
        rows.append(
            [
                r["cell_repeats"],
                r["jobs"],
                r["servesweep_wall_s"],
                r["plain_wall_s"],
                r.get("shaped_wall_s"),
                r["ratio_wall"],
                r["ratio_cpu"],
                r.get("ratio_wall_vs_shaped"),
                r.get("ratio_cpu_vs_shaped"),
                f"{met(r['goal_met'])} (<= {data['goal_ratio']}x)"
                if gated or goal_size is None
                else "reported",
            ]
        )
    return rows


def planning_context(data: dict[str, Any], before: dict[str, Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "where": where(data),
        "p": data["params"],
        "goal": data["goal_ratio"],
        "goal_size": data.get("goal_size"),
        "table": table(PLANNING_HEADER, planning_rows(data)),
        "profile": None,
        "h200": None,
        "ablations": None,
        "versions": None,
    }
    if prof := data.get("profile"):
        out["profile"] = {
            **prof,
            "table": table(["phase", "profiled s"], list(prof["phases_profiled_s"].items())),
        }
    if h200 := data.get("h200"):
        header = ["cell-repeats", "servesweep s", "plain s", "shaped s", "ratio (wall)"]
        header += ["ratio (CPU)", "shaped / plain", "servesweep / shaped"]
        rows = [
            [
                r["cell_repeats"],
                r["servesweep_wall_s"],
                r["plain_wall_s"],
                r["shaped_wall_s"],
                r["ratio_wall"],
                r["ratio_cpu"],
                r["shaped_ratio_wall"],
                r["ratio_wall_vs_shaped"],
            ]
            for r in h200["rows"]
        ]
        ab = h200.get("ab_gc")
        if ab:
            ab = {**ab, "rounds": len({r["round"] for r in ab["rounds"]})}
        out["h200"] = {
            **host(h200["provenance"]),
            "repeats": h200["params"]["repeats"],
            "table": table(header, rows),
            "ab": ab,
        }
    if abl := data.get("ablations"):
        rows = abl["rows"]
        whole = rows[0]["ratio_wall"]
        out["ablations"] = {
            "cell_repeats": abl["cell_repeats"],
            "rest": rows[-1]["ratio_wall"],
            "table": table(
                ["workflow", "s", "plain s", "ratio", "the feature costs"],
                [
                    [
                        r["variant"],
                        r["wall_s"],
                        r["plain_wall_s"],
                        r["ratio_wall"],
                        "-" if k == 0 else f"{whole - r['ratio_wall']:+.2f}x",
                    ]
                    for k, r in enumerate(rows)
                ],
            ),
        }
    if versions := data.get("versions"):
        out["versions"] = versions_context(versions)
    return out


def versions_context(versions: dict[str, Any]) -> dict[str, Any]:
    """The same workflow under two Snakemake releases (planning.versions.json)."""
    rows = []
    for name_of_host, ab in versions["hosts"].items():
        p = ab["provenance"]
        for name, r in ab["rows"].items():
            if name.startswith("new"):
                plain = ab["rows"][r["compared_with"]]
                rows.append(
                    [
                        f"{name_of_host} ({p['cpus']} cores, {p['measured_at']})",
                        r["snakemake"],
                        r["wall_s"],
                        plain["wall_s"],
                        r["ratio_wall"],
                        r["ratio_cpu"],
                    ]
                )
    by: dict[str, list[float]] = {}
    for row in rows:
        by.setdefault(row[1], []).append(row[4])
    old, new = sorted(by, key=lambda v: tuple(int(x) for x in v.split(".")))

    def span(values: list[float]) -> str:
        low, high = f"{min(values):.2f}", f"{max(values):.2f}"
        return low if low == high else f"{low}-{high}"

    header = ["host", "Snakemake", "servesweep s", "plain s", "ratio (wall)", "ratio (CPU)"]
    return {
        "old": old,
        "new": new,
        "old_span": span(by[old]),
        "new_span": span(by[new]),
        "rounds": next(iter(versions["hosts"].values()))["rounds"],
        "command": versions["command"],
        "table": table(header, rows),
    }


# ---------------------------------------------------------------- 3. orchestration


def orchestration_context(data: dict[str, Any], before: dict[str, Any] | None) -> dict[str, Any]:
    jobs = data.get("after_last_cell_outputs") or []
    starts = data.get("process_start_s")
    return {
        "where": where(data),
        "d": data,
        "table": table(
            ["wall s", "server ready s", "client s", "ratio", "goal"],
            [
                [
                    data["wall_s"],
                    data["ready_s"],
                    data["client_s"],
                    data["ratio"],
                    f"<= {data['goal_ratio']} ({met(data['goal_met'])})",
                ]
            ],
        ),
        "overhead": table(
            ["where", "s"], [[k.replace("_", " "), v] for k, v in data["overhead_s"].items()]
        ),
        "after_last": (
            table(["output", "s"], [[j["output"], j["seconds"]] for j in jobs]) if jobs else None
        ),
        "starts": table(["imports", "s"], list(starts.items())) if starts else None,
    }


# ---------------------------------------------------------------- 4. aggregation

# Frames that only wrap a job (the script module, runpy, the job-logging context): they top
# every cumulative list and say nothing about where the time goes.
WRAPPERS = ("(<module>)", "(run_job)", "(_resolve)", "(run)", "(job)", "(<lambda>)")


def _work(rows: list[list[Any]]) -> list[list[Any]]:
    return [r for r in rows if not str(r[0]).endswith(WRAPPERS)]


def aggregation_figures(data: dict[str, Any]) -> str:
    """The stage table, the goal line and the profiles of one aggregation result."""
    out = [
        table(
            ["stage", "process s", "script body s"],
            [[s["stage"], s["process_s"], s["script_body_s"]] for s in data["stages"]],
        ),
        "",
        f"results.csv + summary.json: **{num(data['csv_plus_summary_s'])} s** "
        f"(goal {num(data['goal_s'])} s: {met(data['goal_met'])}); "
        f"{data['results_csv_rows']:,} rows, {data['summary_cells']:,} cells, "
        f"{data['summary_deltas']:,} deltas.",
    ]
    if data.get("snakemake_s") is not None:
        jobs_s = sum(s["process_s"] for s in data["stages"])
        out += [
            "",
            f"The whole `snakemake` call took {num(data['snakemake_s'])} s, "
            f"{num(data['snakemake_s'] - jobs_s)} s of it outside the job processes "
            "(Snakemake building the DAG and starting the jobs).",
        ]
    if prof := data.get("snakemake_profile"):
        out += [
            "",
            f"Snakemake's own process under cProfile ({num(prof['profiled_s'])} s profiled), "
            "the functions that took the most time themselves:",
            "",
            table(
                ["function", "calls", "own s", "cumulative s"],
                [[f"`{r[0]}`", r[1], r[2], r[3]] for r in prof["top_own"]],
            ),
        ]
    for s in data["stages"]:
        if s.get("top_cumulative"):
            out += [
                "",
                f"`{s['stage']}` under cProfile (package functions by cumulative time):",
                "",
                table(
                    ["function", "calls", "own s", "cumulative s"],
                    [[f"`{r[0]}`", r[1], r[2], r[3]] for r in _work(s["top_cumulative"])[:8]],
                ),
            ]
    return "\n".join(out)


def aggregation_context(data: dict[str, Any], before: dict[str, Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "where": where(data),
        "d": data,
        "figures": aggregation_figures(data),
        "h200": None,
        "snakemake_profile": bool(
            data.get("snakemake_profile") or (data.get("h200") or {}).get("snakemake_profile")
        ),
    }
    if h200 := data.get("h200"):
        cores_1 = None
        if one := h200.get("cores_1"):
            stages = {s["stage"]: s["process_s"] for s in one["stages"]}
            cores_1 = {
                "total": one["csv_plus_summary_s"],
                "collect_results": stages["collect_results"],
                "summarize": stages["summarize"],
            }
        out["h200"] = {
            **host(h200["provenance"]),
            "cores": h200["params"].get("cores", 1),
            "figures": aggregation_figures(h200),
            "cores_1": cores_1,
        }
    return out


# ---------------------------------------------------------------- 5. large run

LARGE_RUN_FIGURES = (
    "before_first_cell_s",
    "cell_cycle_median_s",
    "cell_cycle_first_tenth_s",
    "cell_cycle_last_tenth_s",
    "in_cell_median_s",
    "client_median_s",
    "between_cells_median_s",
    "after_last_cell_s",
    "projected_cells_s",
    "snakemake_cpu_per_cell_s",
)


def large_run_context(data: dict[str, Any], before: dict[str, Any] | None) -> dict[str, Any]:
    status = (
        "completed"
        if data["completed"]
        else ("stopped at the timeout" if data["timed_out"] else "**failed**")
    )
    if data.get("hung_after_sigint") or data.get("hung_after_sigterm"):
        status += " (Snakemake hung after the stop signal and was killed)"
    segments = data.get("segments") or []
    return {
        "where": where(data),
        "d": data,
        "p": data["params"],
        "status": status,
        "wall": num(data["wall_s"], 0),
        "table": table(
            ["figure", "s"],
            [[k.removesuffix("_s").replace("_", " "), data.get(k)] for k in LARGE_RUN_FIGURES],
        ),
        "segments": (
            table(
                ["measured", "commit", "cells", "wall s", "cell cycle s", "snakemake cpu/cell s"],
                [
                    [
                        seg["measured_at"],
                        seg["git_sha"],
                        seg["cells_done"],
                        seg["wall_s"],
                        seg["cell_cycle_median_s"],
                        seg["snakemake_cpu_per_cell_s"],
                    ]
                    for seg in segments
                ],
            )
            if len(segments) > 1
            else None
        ),
    }


# ---------------------------------------------------------------- test suite under load


def ci_context(data: dict[str, Any]) -> dict[str, Any] | None:
    """ci.json's recorded runs of the README's test command under load, and CI's wall time;
    None while it holds no `runs`."""
    runs = data.get("runs")
    if not runs:
        return None
    return {
        "ci_wall_s": data.get("ci_wall_s"),
        "table": table(
            ["started", "command", "load", "wall s", "passed", "failed"],
            [
                [
                    r["started"],
                    f"`{r['command']}`",
                    num(r["load"]) if not isinstance(r["load"], str) else r["load"],
                    num(r["wall_s"], 0),
                    r["passed"],
                    r["failed"],
                ]
                for r in runs
            ],
        ),
    }


# ---------------------------------------------------------------- the summary table

SECTIONS: dict[str, Callable[[dict[str, Any], dict[str, Any] | None], dict[str, Any]]] = {
    "client": client_context,
    "planning": planning_context,
    "orchestration": orchestration_context,
    "aggregation": aggregation_context,
    "large_run": large_run_context,
}


def _client_headline(d: dict[str, Any]) -> tuple[str, str, str]:
    g = d["goals"]
    measured = (
        f"{num(g['builtin_rps_c256'])} req/s; TTFT "
        f"{'not above' if g['ttft_not_above_bench_at_every_concurrency'] else 'above'} "
        f"bench's; {num(g['builtin_us_per_token'])} us/token"
    )
    keys = (
        "builtin_rps_c256_met",
        "ttft_not_above_bench_at_every_concurrency",
        "builtin_us_per_token_met",
    )
    goal = (
        f">= {num(g['builtin_rps_c256_goal'])} req/s at C=256; TTFT <= bench_serving's; "
        f"<= {num(g['builtin_us_per_token_goal'])} us/token"
    )
    return goal, measured, ", ".join(met(g[k]) for k in keys)


def _planning_headline(d: dict[str, Any]) -> tuple[str, str, str]:
    """The goal on servesweep / shaped at the gated sizes (every size in older results, whose
    goal was on servesweep / plain)."""
    goal_size = d.get("goal_size")
    if goal_size is None:
        ratios = ", ".join(f"{num(r['ratio_wall'])}x at {r['cell_repeats']:,}" for r in d["rows"])
        ok = all(r["goal_met"] for r in d["rows"])
        return f"<= {d['goal_ratio']}x a plain Snakefile", ratios, met(ok)
    gated = [r for r in d["rows"] if r["cell_repeats"] >= goal_size]
    ratios = ", ".join(f"{num(r['ratio_wall_vs_shaped'])}x at {r['cell_repeats']:,}" for r in gated)
    ok = bool(gated) and all(r["goal_met"] for r in gated)
    goal = f"<= {d['goal_ratio']}x a run_cell-shaped Snakefile at >= {goal_size:,}"
    return goal, ratios or "-", met(ok) if gated else "-"


def _orchestration_headline(d: dict[str, Any]) -> tuple[str, str, str]:
    return f"<= {d['goal_ratio']}", num(d["ratio"]), met(d["goal_met"])


def _aggregation_headline(d: dict[str, Any]) -> tuple[str, str, str]:
    goal = f"<= {num(d['goal_s'])} s for {d['params']['cell_repeats']:,} records"
    return goal, f"{num(d['csv_plus_summary_s'])} s", met(d["goal_met"])


def _large_run_headline(d: dict[str, Any]) -> tuple[str, str, str]:
    measured = f"{num(d.get('cells_done'))} done in {num(d['wall_s'], 0)} s"
    if d["params"].get("workdir"):
        measured += (
            f" ({num(d.get('cells_done_total'))} of {d['params']['cell_repeats']:,} in its workdir)"
        )
    verdict = met(d["completed"])
    if d["timed_out"]:
        hours = (d.get("projected_cells_s") or 0) / 3600
        measured += f" (stopped by --timeout; to the end projected at {hours:.1f} h here)"
        verdict = "not run to the end"
    return f"{d['params']['cell_repeats']:,} cell-repeats complete", measured, verdict


HEADLINES: dict[str, tuple[str, Callable[[dict[str, Any]], tuple[str, str, str]]]] = {
    "client": ("1 client", _client_headline),
    "planning": ("2 planning", _planning_headline),
    "orchestration": ("3 orchestration", _orchestration_headline),
    "aggregation": ("4 aggregation", _aggregation_headline),
    "large_run": ("5 large run", _large_run_headline),
}


def summary_rows(
    found: dict[str, dict[str, Any]], before: dict[str, dict[str, Any]]
) -> list[list[str]]:
    """One row per measured item: goal, figure before the changes (`<item>.before.json`, if
    any, with its commit), figure now, verdict now."""
    rows = []
    for name, (label, headline) in HEADLINES.items():
        if name not in found:
            continue
        goal, measured, verdict = headline(found[name])
        was = "-"
        if name in before:
            was = f"{headline(before[name])[1]} (`{before[name]['provenance']['git_sha']}`)"
        rows.append([label, goal, was, measured, verdict])
        if name == "aggregation" and (h200 := found[name].get("h200")):
            goal, measured, verdict = headline(h200)
            cores = h200["params"].get("cores", 1)
            rows.append([f"{label} (H200 host, {cores} cores)", goal, "-", measured, verdict])
        for data in (found[name].get("h200") or {}).get("by_sim_cores", []):
            cores = len(data["params"]["server_cores"])
            if name == "client" and cores > 1:
                goal, measured, verdict = headline(data)
                rows.append(
                    [f"{label} (H200 host, sim on {cores} cores)", goal, "-", measured, verdict]
                )
    return rows


# ---------------------------------------------------------------- render


def render(results: Path, template: Path = TEMPLATE) -> str:
    """docs/performance.md: `template` filled from the JSON files in `results`."""
    found = {name: data for name in ITEMS if (data := load(results, name)) is not None}
    before = {n: data for n in ITEMS if (data := load(results, f"{n}.before")) is not None}
    if "planning" in found and (h200 := load(results, "planning.h200")) is not None:
        found["planning"]["h200"] = h200
    if "planning" in found and (versions := load(results, "planning.versions")) is not None:
        found["planning"]["versions"] = versions
    if "aggregation" in found and (h200 := load(results, "aggregation.h200")) is not None:
        found["aggregation"]["h200"] = h200
        h200["cores_1"] = load(results, "aggregation.h200.cores-1")
    if "client" in found and (h200 := load(results, "client.h200")) is not None:
        found["client"]["h200"] = h200
    context: dict[str, Any] = {
        name: SECTIONS[name](found[name], before.get(name)) if name in found else None
        for name in ITEMS
    }
    context["summary"] = table(["item", "goal", "before", "now", ""], summary_rows(found, before))
    ci = load(results, "ci")
    context["ci"] = ci_context(ci) if ci is not None else None
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(template.parent),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["num"] = num
    return env.get_template(template.name).render(context)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--results", default=str(RESULTS))
    p.add_argument("--out", default=str(DOC))
    args = p.parse_args(argv)
    text = render(Path(args.results))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
