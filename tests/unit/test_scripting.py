"""Tests of servesweep.scripting: one-line errors and exit status for rule scripts."""

from __future__ import annotations

import os
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
