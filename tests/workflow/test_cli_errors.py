"""What a user sees on a bad config or env value: one line naming it, no traceback, through the
real `servesweep` and `snakemake` commands (one test per case)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from servesweep.config.load import load_experiment_file
from servesweep.config.paths import RunPaths
from servesweep.core.errors import PreflightFailed
from servesweep.measure.cells import check_prerequisites
from tests.helpers import DEFAULT_CONFIG, REPO, run_snakemake

NARROWING = ("RUN_ID", "BACKENDS_CSV", "CHUNKED_PREFILL_SIZES_CSV", "CONCURRENCIES_CSV", "EP_SIZE")


def servesweep(
    *args: str, env: dict[str, str] | None = None, cwd: Path = REPO
) -> subprocess.CompletedProcess[str]:
    """The real CLI in a process of its own, with only `env`'s narrowing variables set."""
    full = {k: v for k, v in os.environ.items() if k not in NARROWING} | (env or {})
    return subprocess.run(
        [sys.executable, "-m", "servesweep.workflow.cli", *args],
        capture_output=True,
        text=True,
        env=full,
        cwd=cwd,
        timeout=120,
    )


def one_line(proc: subprocess.CompletedProcess[str]) -> str:
    """The single error line of a failed command (stderr), checked to be exactly one."""
    assert proc.returncode != 0, proc.stdout
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert "Traceback" not in proc.stderr, proc.stderr
    assert len(lines) == 1, proc.stderr
    return lines[0]


def snakemake_error(tmp_path: Path, env: dict[str, str]) -> str:
    """The servesweep error line of `snakemake -n all` (Snakemake adds its profile line)."""
    proc = run_snakemake(tmp_path, "-n", "all", env=env)
    assert proc.returncode != 0, proc.stdout[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr
    ours = [ln for ln in proc.stderr.splitlines() if ln.startswith("servesweep: ")]
    assert len(ours) == 1, proc.stderr
    assert "Job stats" not in proc.stdout, "the matrix was planned anyway"
    return ours[0]


def test_missing_config_file_is_one_line() -> None:
    line = one_line(servesweep("plan", "--configfile", "/nonexistent.yaml"))
    assert line == (
        "servesweep: ConfigError: config file /nonexistent.yaml: No such file or directory"
    )


def test_malformed_config_file_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("matrix:\n  server: [marlin\n")
    line = one_line(servesweep("status", "--configfile", str(bad)))
    assert line.startswith(f"servesweep: ConfigError: config file {bad}: not valid YAML (line ")


def test_concurrency_that_is_no_number_names_the_variable_and_value(tmp_path: Path) -> None:
    env = {"CONCURRENCIES_CSV": "abc"}
    for line in (one_line(servesweep("plan", env=env)), snakemake_error(tmp_path, env)):
        assert "CONCURRENCIES_CSV='abc'" in line and "valid integer" in line, line


@pytest.mark.parametrize("value", ["", "8,,16"], ids=["empty", "empty item"])
def test_empty_list_or_item_is_an_error_not_the_full_matrix(tmp_path: Path, value: str) -> None:
    env = {"CONCURRENCIES_CSV": value}
    for line in (one_line(servesweep("plan", env=env)), snakemake_error(tmp_path, env)):
        assert f"env CONCURRENCIES_CSV={value!r}: empty" in line, line


@pytest.mark.parametrize("command", ["plan", "status", "down"])
def test_plan_status_and_down_refuse_an_unknown_runner_as_snakemake_does(
    tmp_path: Path, command: str
) -> None:
    env = {"BACKENDS_CSV": "marlinn", "RUN_ID": "cli-errors"}
    line = one_line(servesweep(command, "--results", str(tmp_path), env=env))
    assert line == snakemake_error(tmp_path, env)
    assert "env BACKENDS_CSV='marlinn': " in line and "'marlinn' is not a MoE runner" in line


def test_the_suggested_command_for_missing_evidence_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """cells.check_prerequisites tells the user what to run; run it (dry) where it is meant to
    run, and it plans the image checks and preflight."""
    monkeypatch.chdir(tmp_path)
    exp = load_experiment_file(DEFAULT_CONFIG, {"RUN_ID": "suggested"})
    with pytest.raises(PreflightFailed) as info:
        check_prerequisites(exp=exp, paths=RunPaths.for_run(exp), cell="c")
    command = re.search(r"run `([^`]+)`", str(info.value))
    assert command, str(info.value)
    argv = shlex.split(command.group(1))
    assert argv[:3] == ["snakemake", "--cores", "1"], argv
    proc = run_snakemake(tmp_path, "-n", *argv[1:], env={"RUN_ID": "suggested"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert re.search(r"^preflight\s+1$", proc.stdout, re.M), proc.stdout[-2000:]


def test_the_hint_for_config_overrides_alone_is_a_command_that_works(tmp_path: Path) -> None:
    """`--config run_id=x` alone replaces the embedded default; the error's suggested command
    (a dry run of it here) plans the default matrix under that run id."""
    # run_snakemake drops RUN_ID from the environment: the error comes from the overrides
    proc = run_snakemake(tmp_path, "-n", "all", "--config", "run_id=hint-run")
    assert proc.returncode != 0, proc.stdout[-2000:]
    line = next(ln for ln in proc.stderr.splitlines() if ln.startswith("servesweep: "))
    command = re.search(r"`(snakemake [^`]+)`", line)
    assert command, line
    argv = shlex.split(command.group(1))
    assert "--configfile" in argv and "run_id=hint-run" in argv, argv
    proc = run_snakemake(tmp_path, "-n", "all", *argv[1:])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "servesweep plan: run hint-run:" in proc.stdout + proc.stderr
