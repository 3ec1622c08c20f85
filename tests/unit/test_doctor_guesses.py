"""Tests of workflow.doctor that need no node: the config's guesses, one line each."""

from __future__ import annotations

from servesweep.config.load import load_experiment_file
from servesweep.workflow.doctor import guess_lines
from tests.helpers import REPO


def test_doctor_lists_every_guess_of_the_config_in_use_and_fails_on_none() -> None:
    exp = load_experiment_file(REPO / "config" / "experiments" / "moe_prefill_gate.yaml", {})
    lines = guess_lines(exp)
    assert [c.detail.split(" = ")[0] for c in lines] == exp.guesses
    assert {c.status for c in lines} == {"guess"}  # listed, never a failure
    assert "engine.version = '0.5.23': confirm it on the cluster" in lines[6].line()
