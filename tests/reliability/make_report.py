"""Run the fault-injection suite and the bad-config tests; write docs/reliability.md from the run.

    python tests/reliability/make_report.py                  # run the tests, write the report
    python tests/reliability/make_report.py --junit run.xml  # only render an earlier run

The table is generated from the JUnit XML of a real test run (the properties every scenario
records: scenario, each check, the error line seen), never written by hand. The exit status is
pytest's (non-zero if any scenario failed); the report is written either way.
"""

from __future__ import annotations

import argparse
import datetime as dt
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEFAULT_OUTPUT = REPO / "docs" / "reliability.md"
TESTS = ["tests/reliability", "tests/unit/test_config_errors.py"]
MAX_MESSAGE = 400


@dataclass
class Case:
    """One test case of the JUnit XML."""

    file: str
    name: str
    seconds: float
    outcome: str  # passed | known gap | failed | skipped
    detail: str = ""
    props: list[tuple[str, str]] = field(default_factory=list)

    def prop(self, name: str) -> str:
        return next((v for k, v in self.props if k == name), "")

    def all(self, name: str) -> list[str]:
        return [v for k, v in self.props if k == name]


def run_started(path: Path) -> str:
    """When the test run of a JUnit XML started (UTC), as pytest recorded it."""
    suite = next(ET.parse(path).getroot().iter("testsuite"), None)
    stamp = suite.get("timestamp") if suite is not None else None
    when = dt.datetime.fromisoformat(stamp) if stamp else dt.datetime.now(dt.UTC)
    return when.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")


def parse_junit(path: Path) -> list[Case]:
    """Every test case of a JUnit XML written by pytest, in run order."""
    cases = []
    for tc in ET.parse(path).getroot().iter("testcase"):
        outcome, detail = "passed", ""
        for child in tc:
            text = (child.get("message") or child.text or "").strip()
            if child.tag in ("failure", "error"):
                outcome, detail = "failed", text
            elif child.tag == "skipped":
                xfail = child.get("type") == "pytest.xfail"
                outcome, detail = ("known gap" if xfail else "skipped"), text
        props = [(p.get("name", ""), p.get("value", "")) for p in tc.iter("property")]
        cases.append(
            Case(
                file=(tc.get("classname") or "").replace(".", "/"),
                name=tc.get("name", ""),
                seconds=float(tc.get("time") or 0),
                outcome=outcome,
                detail=detail,
                props=props,
            )
        )
    return cases


def _cell(text: str, limit: int | None = None) -> str:
    """Text safe inside a markdown table cell."""
    text = " ".join(text.split())
    if limit and len(text) > limit:
        text = text[: limit - 3] + "..."
    return text.replace("|", "\\|")


def _code(text: str) -> str:
    return f"`{_cell(text, MAX_MESSAGE).replace('`', chr(39))}`" if text else ""


def _result(case: Case) -> str:
    if case.outcome == "passed":
        return "pass"
    reason = case.detail.removeprefix("reason: ")
    first = reason.splitlines()[0] if reason else ""
    if case.outcome == "known gap":
        return f"**known gap** (strict xfail): {_cell(first, 600)}"
    if case.outcome == "skipped":
        return f"skipped: {_cell(first, 200)}"
    return f"**FAIL**: {_cell(first, 300)}"


# The checks every failure scenario makes (tests/reliability/harness.py), by their first words;
# the table names them as two groups and lists only the other checks one by one.
STOP_CHECKS = (
    "the run exits non-zero",
    "a one-line `servesweep",
    "the error names the cause",
    "a cell started and did not finish",
    "the error names the failed cell",
    "the error names the node",
    "the error names a log file",
    "no server, client or container is left",
    "no finished-looking or partial file",
    "finished cells are kept",
)
RERUN_CHECKS = (
    "the rerun succeeds",
    "the rerun runs only the",
    "the rerun starts at most one server",
    "cells finished before the failure are untouched",
    "results.csv equals an uninterrupted run's",
    "one fingerprint per server config",
    "nothing is left running after the rerun",
)


def _checks(case: Case) -> str:
    """The checks of a case: the common groups by name (with their particulars), the rest
    one by one; a known-gap check is always listed."""
    checks = case.all("check")

    def group(prefixes: tuple[str, ...]) -> list[str]:
        return [c for c in checks if c.startswith(prefixes) and "[known gap]" not in c]

    stop, rerun = group(STOP_CHECKS), group(RERUN_CHECKS)
    shown = ("the error names the cause", "the error names the node", "finished cells are kept")
    items = []
    for check in checks:  # each group where its first check was made
        if stop and check == stop[0]:
            details = [c for c in stop if c.startswith(shown)]
            items.append(f"**stop checks** ({len(stop)}): " + "; ".join(details))
        elif rerun and check == rerun[0]:
            items.append(f"**rerun checks** ({len(rerun)})")
        elif check not in stop and check not in rerun:
            items.append(check)
    return "<br>".join(f"- {_cell(i)}" for i in items) or "(none recorded)"


# Rows in the order of the list of scenarios, by scenario id: the parametrize id of a
# table-driven test (`test_fault_then_rerun[server_fails_to_start]`), else the test's name
# without `test_`. The ssh + docker variant after its local twin, known-gap extras last.
ORDER = (
    "server_fails_to_start",
    "server_never_becomes_ready",
    "rank_above_zero_dies_mid_cell",
    "rank_above_zero_node_dies_mid_cell",
    "server_crashes_mid_cell",
    "another_process_crashes_mid_cell",
    "native_library_crashes_mid_cell",
    "some_requests_get_http_500",
    "mid_stream_error",
    "server_hangs_client_times_out",
    "fatal_pattern_in_a_log",
    "image_smoke_fails",
    "ssh_connection_drops_mid_cell",
    "snakemake_gets_sigint",
    "snakemake_is_sigkilled_then_rerun",
    "snakemake_is_sigkilled_then_rerun_with_containers",
    "disk_fills_while_writing_a_raw_file",
    # issue 17: data integrity
    "double_load_after_sigkill_stale_client_removed",
    "cell_job_sigkilled_alone_stale_partials_removed",
    "record_edited_completed",
    "record_edited_error_string",
    "gpu_snapshot_cut_corrupted_deleted",
    "config_changed_after_a_run",
    "stale_pid_of_an_unrelated_process_is_left_alone",
    "watchdog_stops_a_frozen_server",
    "snakemake_gets_sighup",
    "snakemake_gets_sigterm",
    "event_log_disk_full",
    "client_disk_fills",
    "record_cut_mid_line",
    "record_corrupted_bytes",
    "foreign_requests_without_the_key",
    "foreign_requests_with_the_key_counted",
    "service_key_found_by_a_later_run",
)


def scenario_id(name: str) -> str:
    """The scenario a test case name stands for: its parametrize id, else the name."""
    if name.endswith("]") and "[" in name:
        return name[name.index("[") + 1 : -1]
    return name.removeprefix("test_")


def _rank(case: Case) -> int:
    key = scenario_id(case.name)
    return ORDER.index(key) if key in ORDER else len(ORDER)


def scenario_table(cases: Iterable[Case]) -> list[str]:
    lines = [
        "| Scenario | What was checked | Result | Message seen |",
        "|---|---|---|---|",
    ]
    for case in sorted(cases, key=_rank):
        checks = _checks(case)
        seen = "<br>".join(_code(m) for m in case.all("message"))
        notes = "<br>".join(_cell(n) for n in case.all("note"))
        if notes:
            seen = f"{seen}<br>{notes}" if seen else notes
        where = f"<br><sub>{case.file.split('/')[-1]}::{case.name}, {case.seconds:.0f} s</sub>"
        lines.append(
            f"| {_cell(case.prop('scenario') or case.name)}{where} | {checks} | "
            f"{_result(case)} | {seen} |"
        )
    return lines


def config_table(cases: list[Case]) -> list[str]:
    """One row per bad-config kind: the one-line error seen."""
    lines = ["| Bad configuration | Message seen | Result |", "|---|---|---|"]
    for case in cases:
        kind = case.prop("kind")
        if kind:
            message = _code(case.prop("message"))
            lines.append(f"| {_cell(kind)} | {message} | {_result(case)} |")
    return lines


def known_gaps(gaps: list[Case]) -> list[str]:
    """One item per distinct reason, naming the tests that show it."""
    by_reason: dict[str, list[str]] = {}
    for case in gaps:
        by_reason.setdefault(case.detail.removeprefix("reason: "), []).append(case.name)
    return [
        f"- {_cell(reason, 1200)} ({', '.join(f'`{n}`' for n in names)})"
        for reason, names in by_reason.items()
    ]


def summary(cases: list[Case]) -> str:
    counts: dict[str, int] = {}
    for case in cases:
        counts[case.outcome] = counts.get(case.outcome, 0) + 1
    order = ("passed", "known gap", "failed", "skipped")
    return ", ".join(f"{counts[k]} {k}" for k in order if counts.get(k))


def git_revision() -> str:
    def git(*args: str) -> str:
        res = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)
        return res.stdout.strip()

    sha = git("rev-parse", "--short", "HEAD") or "unknown"
    return f"{sha} (with uncommitted changes)" if git("status", "--porcelain") else sha


def render(cases: list[Case], *, started: str, seconds: float, command: str) -> str:
    scenarios = [c for c in cases if "/reliability/" in f"/{c.file}/" and c.prop("scenario")]
    configs = [c for c in cases if "test_config_errors" in c.file]
    workflow = [c for c in configs if "dry_run" in c.name or "password_file_starts" in c.name]
    gaps = [c for c in scenarios + configs if c.outcome == "known gap"]
    out = [
        "# Reliability: fault injection and bad configurations",
        "",
        "<!-- Generated by tests/reliability/make_report.py from a test run. Do not edit. -->",
        f"Generated by `{command}` from the JUnit XML of a test run started {started} (git "
        f"{git_revision()}): {summary(scenarios + configs)}, {seconds:.0f} s of test time (summed "
        "over parallel workers). Regenerate it; "
        "do not edit it.",
        "",
        "Every scenario runs the real workflow (`snakemake` on this repo's Snakefile) against "
        "the simulated engine: on this machine (process runtime) or on the loopback SSH nodes "
        "with docker made by `.ci/setup_nodes.sh` (marked *ssh + docker*). A fault's cause is "
        "armed outside the experiment config (a `python3` shim adds the sim's fault flags to "
        "one server config's launch, a marker file breaks the smoke command, a tmpfs fills, a "
        "process or container is killed), so removing it leaves every fingerprint unchanged.",
        "",
        "**Stop checks** (after the fault): the run exits non-zero with one "
        "`servesweep: <Kind>: ...` line that names the cause, the failed cell, the node and a "
        "log file that exists; no server, client or container of the run is left; the failed "
        "cell has no raw or gpu file (nor a temp file); every cell finished before is kept.",
        "",
        "**Rerun checks** (after the cause is removed): the rerun succeeds, runs only the "
        "missing cells, starts at most one server per configuration with missing cells, leaves "
        "the finished raw and gpu files untouched (content and mtime), keeps one fingerprint "
        "per server configuration, leaves nothing running, and its results.csv equals that of "
        "a run never interrupted (cells, request counts, token totals).",
        "",
        "A **known gap** is a strict xfail: the scenario's other checks passed, and the check "
        "marked `[known gap]` fails for the reason given (the test turns red once it is fixed).",
        "",
        "## Scenarios",
        "",
        *scenario_table(scenarios),
        "",
        "## Bad configurations",
        "",
        "Each kind is refused by the validation `rules/common.smk` runs before anything starts "
        "(sudo password problems: when the first job needs a node), with one line that quotes "
        "the exact key (`config key 'a.b.c': ...`) or names the env variable.",
        "",
        *config_table(configs),
        "",
        "Workflow level (real `snakemake`): "
        + "; ".join(
            f"{_cell(c.name.split('[')[-1].rstrip(']') if '[' in c.name else c.name)}: {_result(c)}"
            for c in workflow
        )
        + ".",
        "",
        "## Known gaps",
        "",
        *(known_gaps(gaps) or ["None."]),
        "",
    ]
    return "\n".join(out)


def run_tests(junit: Path, extra: list[str]) -> int:
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        *TESTS,
        "-o",
        "junit_family=xunit1",
        f"--junitxml={junit}",
        "-p",
        "no:cacheprovider",
        "-q",
        *extra,
    ]
    print("running:", " ".join(cmd), flush=True)
    return subprocess.run(cmd, cwd=REPO).returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    parser.add_argument("--junit", type=Path, help="render this JUnit XML instead of running")
    parser.add_argument("--junit-out", type=Path, help="keep the run's JUnit XML here")
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    args = parser.parse_args(argv)
    status = 0
    with tempfile.TemporaryDirectory() as tmp:
        junit = args.junit
        if junit is None:
            junit = args.junit_out or Path(tmp) / "junit.xml"
            status = run_tests(junit.resolve(), args.pytest_args)
        cases = parse_junit(junit)
        started = run_started(junit)
    seconds = sum(c.seconds for c in cases)
    command = "python tests/reliability/make_report.py"
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(render(cases, started=started, seconds=seconds, command=command))
    print(f"wrote {args.output}: {summary(cases)}")
    return status


if __name__ == "__main__":
    sys.exit(main())
