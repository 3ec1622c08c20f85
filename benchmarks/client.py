"""Item 1: the builtin client vs SGLang's bench_serving on the zero-cost sim, client pinned.

Both clients get the same bench_serving flags (`servesweep.measure.loadgen.client_argv`) and
run on one core against the sim on another. Per client and concurrency (closed loop, request
rate inf):
request throughput, TTFT median/p99 (everything the client and the sim's HTTP layer add: the
sim computes nothing), client CPU per request inside its event loop and garbage-collector
pauses. A streaming run gives client CPU per streamed token. Figures of one run.

    python benchmarks/client.py [--concurrencies 1,64,256] [--client-core 0 --server-cores 1]
    python benchmarks/client.py --self-check-only      # only the self-check's cost at C=256
    python benchmarks/client.py --smoke                # seconds: builtin only, C=1,8

Each client runs as a cell runs it, under the usage wrapper (servesweep.measure.loadgen.usage).
Checks (exit 1, each failure named): sanity bounds, every run completed all its requests, was
measured by the wrapper (exit 0) and has throughput; goals (timings), >= 2,100 req/s at C=256,
<= 25 us of client CPU per streamed token, TTFT not above bench_serving's, self-check < 5 %,
each where this run measured it. `--smoke` enforces the sanity bounds and reports the goals
without failing on them (at that size on a shared 2-core machine they measure noise).

The builtin's self-check (CPU time, event-loop lag, GC pauses: servesweep.measure.loadgen.selfcheck)
is on in the workflow; its cost is measured as the builtin's request throughput at C=256 with
and without it (`--no-self-check`), in adjacent pairs of alternating order, the median of the
`--self-check-pairs` pair figures.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

from _common import (
    PROBE,
    Check,
    Sim,
    add_common_args,
    check_rows,
    log,
    pin,
    proc_cpu_s,
    scratch_dir,
    setup_logging,
    time_scale_note,
    verdict,
    write_result,
    zero_cost_sim,
)

from servesweep.config.schema import Workload
from servesweep.measure.loadgen import client_argv, client_env, usage
from tests.support.sglang_bench import SGLANG_VERSION, bench_env, find_wheel, stage_bench
from tests.support.tokenizer import DEFAULT_VOCAB_SIZE, build_tokenizer, sim_words

CLIENTS = ("builtin", "bench_serving")
GOAL_RPS_C256 = 2100.0
GOAL_US_PER_TOKEN = 25.0
RUN_TIMEOUT_S = 600
# --smoke: the builtin only (bench_serving needs the sglang wheel), small runs, no self-check
# pairs; seconds. Its goals are timings: reported, not enforced (benchmarks/README.md).
SMOKE = {
    "clients": "builtin",
    "concurrencies": "1,8",
    "requests": 200,
    "input_len": 128,
    "stream_output_len": 16,
    "stream_requests": 50,
    "stream_concurrency": 8,
    "self_check_pairs": 0,
}


def default_requests(concurrency: int) -> int:
    """Enough requests for a steady state and for bench's prompt-list GC pauses to show."""
    return max(3000, 25 * concurrency)


def probe_argv(
    *,
    kind: str,
    base_url: str,
    workload: Workload,
    output: Path,
    probe_out: Path,
    tokenizer: Path,
    vocab_size: int,
    self_check: bool = True,
) -> list[str]:
    """The workflow's client command as a cell runs it: under the usage wrapper
    (servesweep.measure.loadgen.usage, around every client in the workflow), with the CPU/GC
    probe in place of `-m` (it runs the same module inside the wrapper's child)."""
    argv = client_argv(
        kind=kind,  # type: ignore[arg-type]
        workload=workload,
        base_url=base_url,
        output_file=str(output),
        tag=f"{kind}-c{workload.concurrency}",
        tokenizer=str(tokenizer),
        python=sys.executable,
        sglang_version=SGLANG_VERSION,
    )
    python, dash_m, module, *flags = argv
    assert dash_m == "-m", argv
    flags.append("--disable-tqdm")
    if kind == "builtin":  # the same id range as bench's tokenizer
        flags += ["--vocab-size", str(vocab_size)]
    if not self_check:
        flags.append("--no-self-check")
    return usage.wrapped([python, str(PROBE), str(probe_out), module, *flags], python=python)


def run_client(
    *,
    kind: str,
    sim: Sim,
    workload: Workload,
    workdir: Path,
    env: dict[str, str],
    tokenizer: Path,
    vocab_size: int,
    core: int | None,
    self_check: bool = True,
) -> dict[str, Any]:
    """One client invocation; its record's figures plus CPU, GC and server load."""
    name = f"{kind}-c{workload.concurrency}-o{workload.output_len}"
    output, probe_out, log_path = (workdir / f"{name}{ext}" for ext in (".jsonl", ".probe", ".log"))
    for path in (output, probe_out):
        path.unlink(missing_ok=True)
    argv = [
        *pin(core),
        *probe_argv(
            kind=kind,
            base_url=sim.base_url,
            workload=workload,
            output=output,
            probe_out=probe_out,
            tokenizer=tokenizer,
            vocab_size=vocab_size,
            self_check=self_check,
        ),
    ]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    server_before = sum(proc_cpu_s(pid) for pid in sim.pids)
    with open(log_path, "w") as fh:
        res = subprocess.run(
            argv, env=env, cwd=workdir, stdout=fh, stderr=subprocess.STDOUT, timeout=RUN_TIMEOUT_S
        )
    server_cpu = sum(proc_cpu_s(pid) for pid in sim.pids) - server_before
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if res.returncode != 0 or not output.exists():
        tail = log_path.read_text(errors="replace")[-2000:]
        raise RuntimeError(f"{name} exited {res.returncode}:\n{tail}")
    record = json.loads(output.read_text().splitlines()[-1])
    wrapper = usage.parse(log_path.read_text(errors="replace"))
    probe = json.loads(probe_out.read_text().splitlines()[-1])
    completed = int(record["completed"])
    tokens = int(record["total_output_tokens"])
    duration = float(record["duration"])
    process_cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    run = {
        "client": kind,
        "self_check": self_check,
        "client_loop_lag_p99_ms": record.get("client_loop_lag_p99_ms"),
        "client_cpu_pct": record.get("client_cpu_pct"),
        "concurrency": workload.concurrency,
        "input_len": workload.input_len,
        "output_len": workload.output_len,
        "requests": workload.num_requests,
        "completed": completed,
        "duration_s": duration,
        "request_rps": float(record["request_throughput"]),
        "output_tps": float(record["output_throughput"]),
        "ttft_p50_ms": float(record["median_ttft_ms"]),
        "ttft_p99_ms": float(record["p99_ttft_ms"]),
        "ttft_max_ms": 1000 * max(t for t in record["ttfts"] if t is not None),
        "loop_cpu_s": probe["cpu_s"],
        "loop_wall_s": probe["wall_s"],
        "process_cpu_s": process_cpu,
        "cpu_us_per_request": 1e6 * probe["cpu_s"] / completed,
        "cpu_us_per_token": 1e6 * probe["cpu_s"] / tokens,
        "cpu_bound_rps": completed / probe["cpu_s"],
        "gc_s": probe["gc_s"],
        "gc_max_pause_ms": probe["gc_max_pause_ms"],
        "gc_collections": probe["gc_collections"],
        "server_cpu_s": server_cpu,
        # The usage wrapper's figures of the whole client process (imports included), as the
        # workflow records them (results.csv client_process_*); None: the wrapper printed none.
        "wrapped_process": wrapper.to_dict() if wrapper else None,
        # Of the sim's cores together: 100 % is every sim process busy all the run.
        "server_busy": server_cpu / duration / len(sim.pids),
    }
    log.info(
        "%-13s C=%-3d out=%-3d %7.0f req/s  TTFT p50 %7.2f p99 %7.2f ms  %5.0f us/req  "
        "%5.1f us/tok  GC max %5.1f ms  server busy %3.0f%%",
        kind,
        workload.concurrency,
        workload.output_len,
        run["request_rps"],
        run["ttft_p50_ms"],
        run["ttft_p99_ms"],
        run["cpu_us_per_request"],
        run["cpu_us_per_token"],
        run["gc_max_pause_ms"],
        100 * run["server_busy"],
    )
    return run


def _pick(runs: list[dict[str, Any]], client: str, **where: Any) -> dict[str, Any] | None:
    for run in runs:
        if run["client"] == client and all(run[k] == v for k, v in where.items()):
            return run
    return None


def compare(
    runs: list[dict[str, Any]], *, concurrencies: list[int], stream_output_len: int | None
) -> dict[str, Any]:
    """Builtin vs bench ratios per concurrency, and the issue's goals."""
    rows = []
    ttft_ok = True
    for c in concurrencies:
        b = _pick(runs, "builtin", concurrency=c, output_len=1)
        s = _pick(runs, "bench_serving", concurrency=c, output_len=1)
        if b is None or s is None:
            continue
        ok = b["ttft_p50_ms"] <= s["ttft_p50_ms"] and b["ttft_p99_ms"] <= s["ttft_p99_ms"]
        ttft_ok &= ok
        rows.append(
            {
                "concurrency": c,
                "rps_ratio": b["request_rps"] / s["request_rps"],
                "cpu_per_request_ratio": b["cpu_us_per_request"] / s["cpu_us_per_request"],
                "ttft_p50_ratio": b["ttft_p50_ms"] / s["ttft_p50_ms"],
                "ttft_p99_ratio": b["ttft_p99_ms"] / s["ttft_p99_ms"],
                "ttft_not_above_bench": ok,
            }
        )
    goals: dict[str, Any] = {"ttft_not_above_bench_at_every_concurrency": ttft_ok if rows else None}
    top = _pick(runs, "builtin", concurrency=256, output_len=1)
    goals["builtin_rps_c256"] = top["request_rps"] if top else None
    goals["builtin_rps_c256_goal"] = GOAL_RPS_C256
    goals["builtin_rps_c256_met"] = top["request_rps"] >= GOAL_RPS_C256 if top else None
    stream = _pick(runs, "builtin", output_len=stream_output_len) if stream_output_len else None
    goals["builtin_us_per_token"] = stream["cpu_us_per_token"] if stream else None
    goals["builtin_us_per_token_goal"] = GOAL_US_PER_TOKEN
    goals["builtin_us_per_token_met"] = (
        stream["cpu_us_per_token"] <= GOAL_US_PER_TOKEN if stream else None
    )
    return {"ratios": rows, "goals": goals}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--clients", default=",".join(CLIENTS))
    p.add_argument("--concurrencies", default="1,64,256")
    p.add_argument("--requests", type=int, default=None, help="per run (default max(3000, 25C))")
    p.add_argument("--input-len", type=int, default=1024)
    p.add_argument("--output-len", type=int, default=1)
    p.add_argument("--stream-output-len", type=int, default=256, help="0: no streaming run")
    p.add_argument("--stream-input-len", type=int, default=128)
    p.add_argument("--stream-requests", type=int, default=600)
    p.add_argument("--stream-concurrency", type=int, default=64)
    p.add_argument("--client-core", type=int, default=0)
    p.add_argument(
        "--server-cores",
        default="1",
        help="the sim's cores, one sim process each on one port (e.g. 1-4 on a 16-core host)",
    )
    p.add_argument("--vocab-size", type=int, default=DEFAULT_VOCAB_SIZE)
    p.add_argument("--self-check-pairs", type=int, default=3, help="0: no self-check cost")
    p.add_argument("--self-check-only", action="store_true")
    add_common_args(p)
    if p.parse_known_args(argv)[0].smoke:  # smoke sizes; a flag given still wins
        p.set_defaults(**SMOKE)
    return p.parse_args(argv)


def checks(result: dict[str, Any], runs: list[dict[str, Any]]) -> list[Check]:
    """Sanity bounds (every run complete, wrapped, with throughput) and the goals this run
    measured (all timings)."""
    found = [
        Check(
            "every run completed all its requests",
            bool(runs) and all(0 < r["completed"] == r["requests"] for r in runs),
            ", ".join(
                f"{r['client']} C={r['concurrency']}: {r['completed']}/{r['requests']}"
                for r in runs
            )
            or "no runs",
        ),
        Check(
            "the usage wrapper measured every client (exit 0)",
            bool(runs) and all((r["wrapped_process"] or {}).get("returncode") == 0 for r in runs),
            f"{sum(1 for r in runs if r['wrapped_process'])} of {len(runs)} runs",
        ),
        Check(
            "request throughput > 0",
            bool(runs) and all(r["request_rps"] > 0 for r in runs),
            ", ".join(f"{r['request_rps']:.0f}" for r in runs) + " req/s",
        ),
    ]
    goals = result["goals"]
    if goals["builtin_rps_c256"] is not None:
        found.append(
            Check(
                f"builtin >= {GOAL_RPS_C256:,.0f} req/s at C=256",
                goals["builtin_rps_c256_met"],
                f"{goals['builtin_rps_c256']:,.0f} req/s",
                timing=True,
            )
        )
    if goals["builtin_us_per_token"] is not None:
        found.append(
            Check(
                f"builtin <= {GOAL_US_PER_TOKEN:g} us of client CPU per streamed token",
                goals["builtin_us_per_token_met"],
                f"{goals['builtin_us_per_token']:.2f} us/token",
                timing=True,
            )
        )
    if goals["ttft_not_above_bench_at_every_concurrency"] is not None:
        found.append(
            Check(
                "builtin TTFT p50 and p99 not above bench_serving's at every C",
                goals["ttft_not_above_bench_at_every_concurrency"],
                ", ".join(
                    f"C={r['concurrency']}: p50 x{r['ttft_p50_ratio']:.2f}, "
                    f"p99 x{r['ttft_p99_ratio']:.2f}"
                    for r in result["ratios"]
                ),
                timing=True,
            )
        )
    if result["self_check"]:
        cost = result["self_check"]["cost"]
        found.append(
            Check(
                "the self-check costs < 5 % of throughput at C=256",
                cost < result["self_check"]["goal_below"],
                f"{100 * cost:.1f} %",
                timing=True,
            )
        )
    return found


def self_check_cost(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The self-check's cost: the median over pairs of 1 - rps with it / rps without it (C=256).

    Runs come in adjacent pairs whose order alternates (on-off, off-on, ...), so a drift of the
    machine over the benchmark (the sim's throughput rises as it warms) cancels instead of
    landing on one side. The spread of the pair figures says how much noise one pair carries.
    """
    pairs = [runs[i : i + 2] for i in range(0, len(runs) - 1, 2)]
    on_off = [sorted(pair, key=lambda r: not r["self_check"]) for pair in pairs]
    costs = sorted(1.0 - on["request_rps"] / off["request_rps"] for on, off in on_off)
    cpu_costs = sorted(
        on["cpu_us_per_request"] / off["cpu_us_per_request"] - 1.0 for on, off in on_off
    )
    cost, cpu_cost = costs[len(costs) // 2], cpu_costs[len(cpu_costs) // 2]
    with_rps = sorted(on["request_rps"] for on, _ in on_off)
    without = sorted(off["request_rps"] for _, off in on_off)
    print(
        f"self-check cost at C=256: {100 * cost:.1f}% of client throughput (median of "
        f"{len(costs)} alternating pairs; pairs range {100 * costs[0]:+.1f}% to "
        f"{100 * costs[-1]:+.1f}%); client CPU per request {100 * cpu_cost:+.1f}% (pairs "
        f"{100 * cpu_costs[0]:+.1f}% to {100 * cpu_costs[-1]:+.1f}%)"
    )
    lags = sorted(r["client_loop_lag_p99_ms"] for r in runs if r["self_check"])
    cpus = sorted(r["client_cpu_pct"] for r in runs if r["self_check"])
    print(
        f"self-check figures at C=256 (median): event-loop lag p99 {lags[len(lags) // 2]:.1f} ms,"
        f" client CPU {cpus[len(cpus) // 2]:.0f}% of a core"
    )
    return {
        "loop_lag_p99_ms": lags,
        "client_cpu_pct": cpus,
        "rps_with": with_rps,
        "rps_without": without,
        "cost": cost,
        "pair_costs": costs,
        "cpu_cost": cpu_cost,
        "pair_cpu_costs": cpu_costs,
        "goal_below": 0.05,
    }


def core_list(text: str) -> list[int]:
    """`1`, `1,3` or `1-4` as core numbers."""
    cores: list[int] = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        try:
            cores += range(int(first), int(last or first) + 1)
        except ValueError:
            raise SystemExit(f"--server-cores: {text!r} is not like 1, 1,3 or 1-4") from None
    if not cores:
        raise SystemExit(f"--server-cores: {text!r} names no core")
    return cores


def main(argv: list[str] | None = None) -> int:
    setup_logging()
    args = parse_args(argv)
    clients = [c for c in args.clients.split(",") if c]
    concurrencies = [int(c) for c in args.concurrencies.split(",") if c]
    server_cores = core_list(args.server_cores)
    with scratch_dir("client", keep=args.keep_tmp) as tmp:
        tokenizer = build_tokenizer(
            tmp / "tokenizer", words=sim_words(), vocab_size=args.vocab_size
        )
        envs = {"builtin": {**os.environ, **client_env("builtin")}}
        if "bench_serving" in clients:
            staged = stage_bench(wheel=find_wheel(), dest=tmp / "sglang_bench")
            envs["bench_serving"] = {**bench_env(staged=staged), **client_env("bench_serving")}
        plan = [
            Workload(
                input_len=args.input_len,
                output_len=args.output_len,
                num_requests=args.requests or default_requests(c),
                concurrency=c,
                warmup_requests=1,
            )
            for c in concurrencies
        ]
        if args.stream_output_len:
            plan.append(
                Workload(
                    input_len=args.stream_input_len,
                    output_len=args.stream_output_len,
                    num_requests=args.stream_requests,
                    concurrency=args.stream_concurrency,
                    warmup_requests=1,
                )
            )
        if args.self_check_only:
            clients, plan = ["builtin"], []
        runs, check_runs = [], []
        with zero_cost_sim(workdir=tmp, cores=server_cores) as sim:
            c256 = Workload(
                input_len=args.input_len,
                output_len=args.output_len,
                num_requests=args.requests or default_requests(256),
                concurrency=256,
                warmup_requests=1,
            )
            for pair in range(args.self_check_pairs if "builtin" in clients else 0):
                for on in (True, False) if pair % 2 == 0 else (False, True):
                    check_runs.append(
                        run_client(
                            kind="builtin",
                            sim=sim,
                            workload=c256,
                            workdir=tmp,
                            env=envs["builtin"],
                            tokenizer=tokenizer,
                            vocab_size=args.vocab_size,
                            core=args.client_core,
                            self_check=on,
                        )
                    )
            for workload in plan:
                for kind in clients:  # interleaved: both clients see the same machine load
                    runs.append(
                        run_client(
                            kind=kind,
                            sim=sim,
                            workload=workload,
                            workdir=tmp,
                            env=envs[kind],
                            tokenizer=tokenizer,
                            vocab_size=args.vocab_size,
                            core=args.client_core,
                        )
                    )
    result = {
        "params": {
            "clients": clients,
            "bench_serving_version": SGLANG_VERSION,
            "concurrencies": concurrencies,
            "input_len": args.input_len,
            "output_len": args.output_len,
            "stream": {
                "input_len": args.stream_input_len,
                "output_len": args.stream_output_len,
                "requests": args.stream_requests,
                "concurrency": args.stream_concurrency,
            },
            "client_core": args.client_core,
            "server_cores": server_cores,
            "sim_time_scale": sim.time_scale,
            "sim_note": time_scale_note(sim.time_scale),
            "prompts": "random-ids as input_ids, warmup 1 request, request rate inf",
        },
        "runs": runs,
        "self_check": self_check_cost(check_runs) if check_runs else None,
        **compare(
            runs,
            concurrencies=concurrencies,
            stream_output_len=args.stream_output_len or None,
        ),
    }
    found = checks(result, runs + check_runs)
    result["checks"] = check_rows(found, smoke=args.smoke)
    name = "client_selfcheck" if args.self_check_only else "client"
    write_result(name, result, args.out, smoke=args.smoke)
    print(json.dumps(result["goals"], indent=2))
    return verdict(found, smoke=args.smoke)


if __name__ == "__main__":
    sys.exit(main())
