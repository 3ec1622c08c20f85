"""Tests of servesweep.scripting: one-line errors and exit status for rule scripts."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from servesweep.errors import CellFailed, ConfigError
from servesweep.scripting import (
    WORKFLOW_CONFIG_ENV,
    experiment,
    export_config,
    exported_experiment,
    run,
)
from tests.helpers import DEFAULT_CONFIG


def test_servesweep_error_is_one_line_and_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    def body() -> None:
        raise CellFailed("cell a/b/r1: 1 request failed; logs: bench.log")

    with pytest.raises(SystemExit) as info:
        run(body)
    assert info.value.code == 1
    assert capsys.readouterr().err == (
        "servesweep: CellFailed: cell a/b/r1: 1 request failed; logs: bench.log\n"
    )


def test_other_errors_keep_their_traceback() -> None:
    def body() -> None:
        raise KeyError("bug")

    with pytest.raises(KeyError):
        run(body)


def test_experiment_applies_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUN_ID", "from-env")
    smk = SimpleNamespace(config=yaml.safe_load(DEFAULT_CONFIG.read_text()))
    exp, paths = experiment(smk)
    assert exp.run_id == "from-env" and str(paths.root) == "results/from-env"


def test_shell_jobs_resolve_the_exported_config_with_the_same_env(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(WORKFLOW_CONFIG_ENV, raising=False)
    with pytest.raises(ConfigError, match=WORKFLOW_CONFIG_ENV):
        exported_experiment()
    config = yaml.safe_load(DEFAULT_CONFIG.read_text())
    monkeypatch.setenv("CONCURRENCIES_CSV", "8")
    export_config(config)  # the Snakefile's step; a shell job inherits os.environ
    monkeypatch.setenv(WORKFLOW_CONFIG_ENV, os.environ[WORKFLOW_CONFIG_ENV])  # undone after
    exp, paths = exported_experiment()
    assert exp == experiment(SimpleNamespace(config=config))[0]
    assert exp.matrix.client["concurrency"] == [8] and paths.root.name == exp.run_id


UNTHROTTLE_SNAKEFILE = """
from servesweep.scripting import unthrottle_scheduler

if config["unthrottle"]:
    onstart:
        unthrottle_scheduler(workflow)

onsuccess:
    with open("limiter.txt", "w") as fh:
        fh.write(type(workflow.scheduler.job_rate_limiter).__name__)

rule done:
    output: "done.txt"
    shell: "touch {output}"
"""


@pytest.mark.workflow
@pytest.mark.parametrize(("unthrottle", "limiter"), [(True, "NoneType"), (False, "JobRateLimiter")])
def test_unthrottle_scheduler_drops_the_rate_limiter_of_a_real_run(
    tmp_path: Path, unthrottle: bool, limiter: str
) -> None:
    # The control run shows the attribute exists in the installed Snakemake: without it the
    # getattr in unthrottle_scheduler would silently do nothing.
    (tmp_path / "Snakefile").write_text(UNTHROTTLE_SNAKEFILE)
    exe = shutil.which("snakemake")
    assert exe, "snakemake is not installed"
    proc = subprocess.run(
        [exe, "--cores", "1", "--config", f"unthrottle={unthrottle}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "limiter.txt").read_text() == limiter
