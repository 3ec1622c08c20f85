"""`servesweep` command line: commands, up, status, down, plan, nodes, check, import, compare
(no benchmark)."""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from servesweep import __version__
from servesweep.cluster.access import holdings, open_cluster, release
from servesweep.cluster.images import build_commands
from servesweep.cluster.images import build_images as build_all
from servesweep.cluster.owner import current_owner
from servesweep.cluster.runtime import Labelled, purge_cache_line
from servesweep.cluster.secrets import Secret
from servesweep.cluster.transport import node_address
from servesweep.config.experiment import Experiment, dry_fire_enabled
from servesweep.config.guesses import guess_values
from servesweep.config.load import load_experiment_file
from servesweep.config.matrix import cell_repeats, server_specs
from servesweep.config.paths import RunPaths
from servesweep.config.schema import MIN_RETOKENIZED_RATIO, EquivalenceConfig, PlotsConfig
from servesweep.core.errors import ConfigError, ServesweepError
from servesweep.core.files import write_json_atomic
from servesweep.core.terminal import visible, visible_lines
from servesweep.measure.cells import run_warmup
from servesweep.measure.client import client_files, client_launch
from servesweep.measure.locks import lock_holder
from servesweep.serving.dryfire import dry_flags
from servesweep.serving.engines import base_url, check_experiment, keyed, launch_targets
from servesweep.serving.launches import node_cache_dir, resolve_ports
from servesweep.serving.neighbours import describe_server
from servesweep.serving.preflight import run_preflight
from servesweep.serving.servers import ServerManager, connect, shutdown
from servesweep.workflow.plan import make_plan

DEFAULT_CONFIG = "config/config.yaml"


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--configfile",
        default=DEFAULT_CONFIG,
        help=f"experiment YAML (default {DEFAULT_CONFIG}); env narrowing applies",
    )
    common.add_argument(
        "--results",
        default=None,
        help="results directory (default: results/ of the checkout holding --configfile, as "
        "Snakemake there uses it, so any folder finds the same servers; else ./results)",
    )
    parser = argparse.ArgumentParser(prog="servesweep", description=__doc__)
    parser.add_argument("--version", action="version", version=f"servesweep {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, text in (
        ("down", "stop this run's servers and this config's services (yours only)"),
        ("status", "servers on the nodes by label: owner, run, service, uptime, used by, health"),
        ("commands", "print every server launch command per node; touches no node"),
        ("up", "start a service (warm-up included) that every run of this server config reuses"),
        (
            "plan",
            "cell-repeats to run (missing, or replaced: changed measurement or code), server "
            "starts, node pools, estimated wall time; touches no node",
        ),
        (
            "nodes",
            "no node ever held two server sets: orchestrator.log, and the labels on the nodes now",
        ),
        (
            "doctor",
            "check every node over SSH: model path, image + version, GPUs idle, IB devices, "
            "ports, clock skew, disk; one line per node and check",
        ),
    ):
        sub.add_parser(name, parents=[common], help=text, description=text)
    sub.choices["up"].add_argument("--server", help="server id (default: the first)")
    sub.choices["down"].add_argument(
        "--force",
        action="store_true",
        help="also stop a service a run is measuring on, and remove other owners' servers in "
        "the way of this config (named, logged)",
    )
    sub.choices["down"].add_argument(
        "--purge-caches",
        action="store_true",
        help="also remove this config's compile-cache folder on every node (yours only)",
    )
    text = "judge bench_serving records and server logs: ok, warning, invalid or fatal per line"
    check = sub.add_parser("check", help=text, description=text)
    check.add_argument("files", nargs="*", metavar="FILE", help="JSONL records or server logs")
    check.add_argument("--type", choices=["record", "log"], help="skip typing by content")
    check.add_argument(
        "--min-retokenized-ratio",
        type=float,
        default=MIN_RETOKENIZED_RATIO,
        help=f"validation.min_retokenized_ratio (default {MIN_RETOKENIZED_RATIO})",
    )
    check.add_argument(
        "--num-prompts",
        type=int,
        metavar="N",
        help="the client's --num-prompts: a record that completed fewer requests is invalid "
        "(a record, or the command line printed with a block, may state it too)",
    )
    check.add_argument(
        "--table",
        metavar="DIR",
        help="check every file DIR/INDEX.md lists (tests/fixtures/real): file | label | verdict",
    )
    text = (
        "bring a folder of bench_serving JSONL files into results/<run-id>/ (csv, summary, plots)"
    )
    imp = sub.add_parser("import", help=text, description=text)
    imp.add_argument("dir", metavar="DIR", help="folder of bench_serving JSONL files")
    imp.add_argument("--run-id", required=True, help="results/<run-id>/ to create")
    imp.add_argument(
        "--mapping", help="YAML naming each file's axes and repeat (docs/validation.md)"
    )
    imp.add_argument("--results", default="results", help="results directory")
    imp.add_argument(
        "--min-retokenized-ratio", type=float, default=MIN_RETOKENIZED_RATIO, help="as for check"
    )
    imp.add_argument("--no-plots", action="store_true", help="results.csv and summary.json only")
    text = (
        "compare two equivalence probe answers (results/<run>/equivalence/<server>.json): "
        "baseline first; exit 1 when the outputs differ"
    )
    eq = sub.add_parser("equivalence", help=text, description=text)
    eq.add_argument("baseline", metavar="BASELINE.json")
    eq.add_argument("candidate", metavar="CANDIDATE.json")
    eq.add_argument(
        "--tolerance",
        type=float,
        default=EquivalenceConfig().logprob_tolerance,
        help="equivalence.logprob_tolerance (default %(default)s)",
    )
    eq.add_argument("--json", metavar="OUT", help="also write the comparison as JSON")
    text = (
        "run B against run A, cell by cell: each metric's change of the medians, its interval "
        "and verdict, and the equivalence probe's outputs where both runs have them; writes "
        "A/compare/B/comparison.json, .csv and .png"
    )
    cmp = sub.add_parser("compare", help=text, description=text)
    for name, role in (("A", "the reference run"), ("B", "the run compared with A")):
        cmp.add_argument(
            f"run_{name.lower()}",
            metavar=name,
            help=f"{role}: a run folder, or a run id under --results",
        )
    cmp.add_argument("--results", default="results", help="results directory (default %(default)s)")
    cmp.add_argument(
        "--tolerance",
        type=float,
        default=EquivalenceConfig().logprob_tolerance,
        help="equivalence.logprob_tolerance for the outputs (default %(default)s)",
    )
    return parser


def run_folder(run: str, results: Path) -> Path:
    """The folder of a run named on the command line: a folder that holds a results.csv, else
    results/<run>/; a ConfigError naming both places where neither has one."""
    for folder in (Path(run), results / run):
        if (folder / "results.csv").is_file():
            return folder
    raise ConfigError(
        f"run {run!r}: no results.csv in {run}/ or {results / run}/ (name a run folder, or a run "
        "id under --results, after its `snakemake ... all`)"
    )


def cmd_compare(args: argparse.Namespace) -> None:
    """Run B against run A, printed; the same files as the workflow's compare target
    (rules/compare.smk), made by the same functions."""
    from servesweep.analysis.answer import print_comparison
    from servesweep.analysis.planned import run_inputs
    from servesweep.core.names import safe_segment
    from servesweep.workflow.analysisjobs import compare_runs
    from servesweep.workflow.plotjobs import plot_comparison

    folder_a, folder_b = (run_folder(r, Path(args.results)) for r in (args.run_a, args.run_b))
    run_a, run_b = folder_a.resolve().name, folder_b.resolve().name
    out = folder_a / "compare" / safe_segment(run_b, what="run id")
    inputs = {side: run_inputs(run_dir=f) for side, f in (("a", folder_a), ("b", folder_b))}
    compare_runs(
        run_a=run_a,
        run_b=run_b,
        results_a=inputs["a"]["csv"],
        results_b=inputs["b"]["csv"],
        requests_a=inputs["a"]["requests"],
        requests_b=inputs["b"]["requests"],
        probes_a=inputs["a"]["probes"],
        probes_b=inputs["b"]["probes"],
        out_json=out / "comparison.json",
        out_csv=out / "comparison.csv",
        tolerance=args.tolerance,
    )
    metrics = PlotsConfig().metrics  # the default plots.metrics, as the workflow target's
    plot_comparison(
        comparison_json=out / "comparison.json", metrics=metrics, out=out / "comparison.png"
    )
    print_comparison(comparison_json=out / "comparison.json", metrics=metrics)


def cmd_equivalence(args: argparse.Namespace) -> int:
    """A candidate's probe answers against a baseline's, printed (docs/equivalence.md)."""
    from servesweep.analysis.equivalence import DIFFER, NOT_COMPARABLE, compare_answers
    from servesweep.measure.probefile import read_probe

    try:
        base, cand = read_probe(args.baseline), read_probe(args.candidate)
    except ValueError as exc:
        print(f"servesweep: {exc}", file=sys.stderr)
        return 2
    result = compare_answers(base, cand, tolerance=args.tolerance)
    print(f"{cand.run_id}/{cand.server} vs {base.run_id}/{base.server}: {result.line()}")
    for row in result.per_prompt:
        gap = "n/a" if row.max_logprob_diff is None else f"{row.max_logprob_diff:.4f}"
        why = f"  {row.why}" if row.why else ""
        print(
            f"  {row.prompt:<10} {row.verdict:<27} prefix {row.agree_prefix:>3}/{row.tokens}"
            f"  max |dlogprob| {gap}{why}"
        )
    if args.json:
        write_json_atomic(args.json, result.to_dict())
    return 1 if result.verdict in (DIFFER, NOT_COMPARABLE) else 0


def checkout_results(configfile: str | Path) -> Path:
    """The results root Snakemake uses for `configfile`: results/ beside the Snakefile of the
    checkout that holds it (owner labels hash this path, so `down` from another folder finds
    the same servers); ./results when the file lies in no checkout."""
    for folder in Path(configfile).resolve().parents:
        if (folder / "Snakefile").is_file():
            return folder / "results"
    return Path("results")


def _experiment(args: argparse.Namespace) -> Experiment:
    """The experiment of `--configfile` after env narrowing, checked as the Snakefile checks it
    (rules/common.smk) before anything starts: a name the pinned engine lacks is refused."""
    exp = load_experiment_file(args.configfile, os.environ)
    check_experiment(exp, server_specs(exp), os.environ)
    return exp


def cmd_commands(args: argparse.Namespace) -> None:
    exp = _experiment(args)
    paths = RunPaths.for_run(exp, args.results)
    # Command lines only: nothing is reached and no password is read.
    manager = ServerManager(exp, paths, cluster=open_cluster(exp, for_commands=True))
    if exp.runtime.containers:
        print("# image: build_images, on every node at once (NODE: each of them)")
        for line in build_commands(
            exp=exp, runtime=manager.runtime, owner=manager.owner, launches=launch_targets(exp)
        ):
            print(line)
    planned = server_specs(exp)
    specs = {spec.id: resolve_ports(spec) for spec in planned}
    if any(specs[spec.id] != spec for spec in planned):
        print(
            "# ports set to auto: shown as free now; each start picks its own (the run's "
            "service/<server>/commands.sh has the ones it used)"
        )
    for spec in specs.values():
        print(manager.commands_script(spec).removeprefix("#!/bin/sh\n"), end="")
    if dry_fire_enabled(exp):
        layers = max(r.args.pp_size for spec in specs.values() for r in spec.roles)
        print(
            "# dry fire (preflight.dry_fire) before each start: the same commands with "
            f"{shlex.join(dry_flags(layers))}, one request through the entry, then torn down "
            "(service/<server>/dry-fire-commands.sh)"
        )
    print(
        f"# client on node {exp.cluster.nodes[0]}, per cell-repeat (each server config alike; "
        "a keyed server's API key goes to its stdin)"
    )
    cells = cell_repeats(exp)
    for cell in (c for c in cells if c.server.id == cells[0].server.id):
        out, log = client_files(
            manager, bench_log=paths.bench_log(cell), tag=cell.key, pid="<job pid>"
        )
        launch = client_launch(
            exp=exp,
            manager=manager,
            base_url=base_url(exp, specs[cell.server.id]),
            workload=cell.workload,
            tag=cell.key,
            output_file=out,
            log_path=log,
            key=Secret("") if keyed(cell.server) else None,
        )
        print(manager.runtime.oneshot_line(launch))
    for line in config_warnings(args.configfile, exp):
        print(f"warning: {line}", file=sys.stderr)


def config_warnings(path: str, exp: Experiment) -> list[str]:
    """Every value still marked as a guess (the config's own `guesses`, then those it takes
    from its site file), and nodes no ssh alias resolves."""
    import yaml

    from servesweep.config.load import site_dir_of
    from servesweep.config.site import guessed_values

    with open(path) as fh:
        raw = yaml.safe_load(fh) or {}
    from_site = {key: where for key, _, where in guessed_values(raw, site_dir_of(path))}
    out = [
        f"{key} = {value!r} is a guess ({from_site.get(key, path)}): confirm it on the "
        f"cluster, then drop it from its guesses"
        for key, value in guess_values(exp)
    ]
    if not exp.cluster.local:
        for node in exp.cluster.nodes:
            address = node_address(exp.cluster, node)
            if node not in exp.cluster.addresses and address == node:
                how = (
                    "Slurm gives no NodeAddr for it (scontrol show node)"
                    if exp.cluster.transport == "slurm"
                    else f"no ssh alias resolves it in {exp.cluster.ssh.config_file}"
                )
                out.append(
                    f"node {node}: {how} "
                    f"and cluster.addresses has none: {node}:{exp.engine.dist_init_port} "
                    f"would be used as an address"
                )
    return out


def cmd_status(args: argparse.Namespace) -> None:
    exp = _experiment(args)
    with connect(exp, RunPaths.for_run(exp, args.results)) as manager:
        rows = manager.status()
    # Labels, lock holders and Slurm's lines are data another process wrote: never raw escapes.
    for line in holdings(exp):
        print(visible(line))
    if not rows:
        print(f"run {exp.run_id}: no server running on {', '.join(exp.cluster.nodes)}")
    for row in rows:
        print("  ".join(f"{visible(k)}={visible(v)}" for k, v in row.items()))


def cmd_plan(args: argparse.Namespace) -> None:
    exp = _experiment(args)
    paths = RunPaths.for_run(exp, args.results)
    print(make_plan(exp=exp, paths=paths, results_dir=Path(args.results)).render(), end="")


def split_by_owner(
    found: Sequence[Labelled], *, owner: str
) -> tuple[list[Labelled], list[Labelled]]:
    """(ours, others') of server processes found on the nodes, by their `owner` label: only
    ours can be this checkout's overlap; the others are other users' or checkouts' servers
    (on a shared machine, their sims)."""
    from servesweep.cluster.owner import OWNER_LABEL

    ours = [item for item in found if item.labels.get(OWNER_LABEL) == owner]
    return ours, [item for item in found if item.labels.get(OWNER_LABEL) != owner]


def others_line(others: Sequence[Labelled]) -> str | None:
    """One information line on other owners' server processes (None if there are none)."""
    from servesweep.cluster.owner import OWNER_LABEL, RUN_LABEL

    if not others:
        return None
    held = sorted(
        {
            f"{item.labels.get('node', item.node)}: {item.labels.get(OWNER_LABEL, '?')} "
            f"run {item.labels.get(RUN_LABEL, '?')}"
            for item in others
        }
    )
    return (
        f"info: {len(others)} server processes of other owners on the nodes (not counted): "
        + "; ".join(held)
    )


def cmd_nodes(args: argparse.Namespace) -> int:
    """One line per node that held two of this checkout's server sets (log, labels); 1 if
    any, else 0. Other owners' servers on the nodes are listed as information."""
    from servesweep.cluster.owner import KIND_LABEL, SERVER_KIND
    from servesweep.cluster.pools import label_overlaps, node_overlaps
    from servesweep.core.events import read_events

    exp = load_experiment_file(args.configfile, os.environ)
    paths = RunPaths.for_run(exp, args.results)
    events = read_events(paths.orchestrator_log)
    problems = node_overlaps(events)
    with connect(exp, paths) as manager:
        found = [
            item
            for node in dict.fromkeys(exp.cluster.nodes)
            for item in manager.runtime.labelled(node, {KIND_LABEL: SERVER_KIND})
            if item.labels.get("node", node) == node
        ]
        ours, others = split_by_owner(found, owner=manager.owner.label)
    problems += label_overlaps(ours)
    for line in problems:
        print(line)
    info = others_line(others)
    if info:
        print(info)
    starts = sum(e == "start" for _, e, _ in events)
    print(
        f"run {exp.run_id}: {starts} server starts in {paths.orchestrator_log}, "
        f"{len(ours)} of this checkout's server processes on the nodes now; "
        f"times a node held two server sets: {len(problems)}"
    )
    return 1 if problems else 0


def up_prerequisites(*, exp: Experiment, paths: RunPaths, manager: ServerManager) -> None:
    """What a run checks before its first start, before `up` starts a service: the image
    checks on every node (docker runtimes; kept evidence is reused) and preflight."""
    builds = paths.builds(exp)
    if builds and not all(p.exists() for p in builds):
        logs = dict(zip(exp.cluster.nodes, paths.build_logs(exp), strict=True))
        for log in logs.values():
            log.parent.mkdir(parents=True, exist_ok=True)
        evidence = build_all(exp=exp, runtime=manager.runtime, logs=logs, owner=manager.owner)
        for node, path in zip(exp.cluster.nodes, builds, strict=True):
            write_json_atomic(path, evidence[node])
    write_json_atomic(paths.preflight, run_preflight(exp=exp, manager=manager))


def cmd_up(args: argparse.Namespace) -> None:
    exp = _experiment(args)
    specs = server_specs(exp)
    chosen = [s for s in specs if args.server in (None, s.id)]
    if not chosen:
        raise ConfigError(f"--server {args.server!r}: not one of {[s.id for s in specs]}")
    spec = chosen[0]
    paths = RunPaths.for_run(exp, args.results)
    with connect(exp, paths) as manager:
        manager.service_mode = True
        if manager.service(spec.fingerprint) is None:
            up_prerequisites(exp=exp, paths=paths, manager=manager)
        state, fresh = manager.ensure(spec)
        if fresh and exp.warmup_after_start:
            run_warmup(exp=exp, server=spec, manager=manager, state=state)
    verb = "started" if fresh else "already running"
    print(
        f"service {state.fingerprint} (server {state.server_id}) {verb} at {state.base_url}; "
        f"runs with this server config reuse it; stop it with "
        f"`servesweep down --configfile {args.configfile}`"
    )


def cmd_doctor(args: argparse.Namespace) -> int:
    from servesweep.workflow.doctor import run_doctor

    exp = _experiment(args)
    if exp.cluster.transport == "slurm":  # its own allocation (never a run's), given back
        exp = exp.model_copy(update={"run_id": f"{exp.run_id}-doctor"})
    try:
        with connect(exp, RunPaths.for_run(exp, args.results)) as manager:
            checks = run_doctor(exp=exp, manager=manager, results=Path(args.results))
        held = holdings(exp)  # the allocation the checks ran in (Slurm), before it is released
    finally:
        release(exp)
    for line in held:
        print(line)
    for check in checks:
        print(check.line())
    failed = [c for c in checks if c.status == "fail"]
    print(f"{len(checks)} checks, {len(failed)} failed")
    return 1 if failed else 0


def runs_measuring(exp: Experiment, results: Path) -> list[str]:
    """The runs that a cell of is measuring right now on a service of this config (its job
    holds the run's server lock), from each service's list of runs that used it."""
    busy = []
    with connect(exp, RunPaths.for_run(exp, results)) as manager:
        for spec in server_specs(exp):
            if manager.service(spec.fingerprint) is None:
                continue
            runs = set(manager.service_runs(spec.fingerprint))
            locks = RunPaths.for_run(exp, results).node_locks(exp.cluster.nodes)
            holders = {(lock_holder(lock) or "").split(" ")[0] for lock in locks}
            busy += [f"{run} (service {spec.fingerprint})" for run in sorted(runs & holders)]
    return list(dict.fromkeys(busy))


def cmd_down(args: argparse.Namespace) -> None:
    exp = _experiment(args)
    paths = RunPaths.for_run(exp, args.results)
    busy = runs_measuring(exp, Path(args.results))
    if busy and not args.force:
        raise ServesweepError(
            f"run {', '.join(busy)} is measuring on this config's service now: stopping it "
            f"would fail that run's cell; wait for it or Ctrl-C it, or `servesweep down --force`"
        )
    stopped = shutdown(exp, paths, reason="servesweep down", services=True)
    if stopped:
        print(f"run {exp.run_id}: stopped {stopped} server set(s) and service(s) of this config")
    else:
        print(
            f"run {exp.run_id}: found no server or service of this config under "
            f"{Path(args.results).resolve()} (owner {current_owner(Path(args.results)).label}); "
            f"nothing stopped"
        )
    if args.force:
        with connect(exp, paths) as manager:
            for other in manager.remove_foreign(server_specs(exp)):
                print(f"removed {describe_server(other)}")
    if args.purge_caches:
        purge_caches(exp, paths)


def purge_caches(exp: Experiment, paths: RunPaths) -> None:
    """Remove this config's compile-cache folder on every node, where it is ours."""
    folder = node_cache_dir(exp, current_owner(paths.root.parent))
    if folder is None:
        print("runtime.compile_cache is off: no cache folder to purge")
        return
    with connect(exp, paths) as manager:
        for node in exp.cluster.nodes:
            res = manager.transport.run(node, purge_cache_line(folder), timeout=600)
            said = res.stdout.strip() or res.stderr.strip() or f"exit {res.returncode}"
            print(f"node {node}: compile cache {folder}: {said.splitlines()[-1]}")


def cmd_check(args: argparse.Namespace) -> int:
    from servesweep.measure import checks

    if args.table:
        rows = checks.corpus_rows(args.table)
        print(checks.render_table(rows), end="")
        return 0 if checks.acceptance_met(checks.corpus_counts(rows)) else 1
    if not args.files:
        raise checks.CheckInputError("no FILE given (or --table DIR)")
    lines = []
    for path in args.files:
        for line in checks.check_file(
            path,
            kind=args.type,
            min_retokenized_ratio=args.min_retokenized_ratio,
            num_prompts=args.num_prompts,
        ):
            print(line, flush=True)
            lines.append(line)
    return 1 if checks.any_bad(lines) else 0


def cmd_import(args: argparse.Namespace) -> int:
    from servesweep.analysis import importer

    report = importer.import_run(
        source=Path(args.dir),
        run_id=args.run_id,
        results=Path(args.results),
        mapping=importer.load_mapping(args.mapping) if args.mapping else importer.Mapping(),
        min_retokenized_ratio=args.min_retokenized_ratio,
        plots=not args.no_plots,
    )
    for line in report.lines():
        print(line)
    return 1 if report.rejected else 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    # paramiko's transport thread logs each failed handshake with its traceback (to stderr,
    # through logging's last resort); the commands say per node why, in one line.
    logging.getLogger("paramiko").addHandler(logging.NullHandler())
    if getattr(args, "results", "") is None:
        args.results = str(checkout_results(args.configfile))
    if args.command == "equivalence":
        return cmd_equivalence(args)
    if args.command in ("check", "import"):
        from servesweep.measure.checks import CheckInputError

        try:
            return cmd_check(args) if args.command == "check" else cmd_import(args)
        except CheckInputError as exc:
            print(f"servesweep: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 2
        except ServesweepError as exc:
            print(f"servesweep: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 1
    handlers = {
        "compare": cmd_compare,
        "down": cmd_down,
        "status": cmd_status,
        "commands": cmd_commands,
        "up": cmd_up,
        "plan": cmd_plan,
    }
    try:
        if args.command == "doctor":
            return cmd_doctor(args)
        if args.command == "nodes":
            return cmd_nodes(args)
        handlers[args.command](args)
    except ServesweepError as exc:
        print(f"servesweep: {type(exc).__name__}: {visible_lines(str(exc))}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
