"""Per-cell log evidence: role, window, minimum; a shortfall is one invalid line."""

from __future__ import annotations

from pathlib import Path

import pytest

from servesweep.config.load import load_experiment_file
from servesweep.config.schema import EvidencePattern
from servesweep.core.errors import CellFailed, ConfigError
from servesweep.serving import evidence

ROOT = Path(__file__).resolve().parents[2]
PD_LOCAL = ROOT / "config" / "experiments" / "pd_standard_local.yaml"

PATTERNS = {
    "p_slice": EvidencePattern(pattern="KV transfer done: room=", role="prefill"),
    "p_mode": EvidencePattern(pattern="state slice transfer", role="prefill", window="service"),
    "d_ack": EvidencePattern(pattern="RDMA ready ack", role="decode", min_per_cell=2),
}


def logs(texts: dict[str, list[str]]) -> list[evidence.RankLog]:
    return [
        evidence.RankLog(
            role=role, read=lambda role=role: "\n".join(texts[role]), path=f"{role}.log"
        )
        for role in texts
    ]


def test_counts_per_role_and_window() -> None:
    texts = {
        "prefill": ["Using Mamba state slice transfer for ...", "KV transfer done: room=1"],
        "decode": ["RDMA ready ack: room=1", "KV transfer done: room=9 (not its role)"],
    }
    rank_logs = logs(texts)
    before = evidence.count(PATTERNS, rank_logs)
    assert before == {"p_slice": 1, "p_mode": 1, "d_ack": 1}
    texts["prefill"].append("KV transfer done: room=2")
    texts["decode"] += ["RDMA ready ack: room=2", "RDMA ready ack: room=3"]
    counts = evidence.cell_counts(
        PATTERNS, before=before, after=evidence.count(PATTERNS, rank_logs)
    )
    # window cell: only this cell's lines; window service: the once-per-process line counts on
    assert counts == {"p_slice": 1, "p_mode": 1, "d_ack": 2}
    evidence.check(PATTERNS, counts, cell="pd/case~a/r1", logs=rank_logs)


def test_a_cell_below_a_minimum_is_invalid_with_one_line() -> None:
    rank_logs = logs({"prefill": ["nothing"], "decode": ["RDMA ready ack: room=1"]})
    counts = evidence.count(PATTERNS, rank_logs)
    with pytest.raises(CellFailed) as err:
        evidence.check(PATTERNS, counts, cell="pd/case~a/r1", logs=rank_logs)
    text = str(err.value)
    assert "\n" not in text
    assert text.startswith("cell pd/case~a/r1: invalid: log evidence below its minimum: ")
    assert "p_slice (prefill logs, window cell): 0 < 1" in text
    assert "d_ack (decode logs, window cell): 1 < 2" in text
    assert "logs: prefill.log, decode.log" in text


def test_config_names_the_key_of_a_bad_pattern_or_role() -> None:
    import yaml

    raw = yaml.safe_load(PD_LOCAL.read_text())
    from servesweep.config.load import load_experiment

    raw["evidence"]["d_rdma_ready_ack"]["pattern"] = "("
    with pytest.raises(ConfigError, match=r"'evidence\.d_rdma_ready_ack\.pattern': bad regular"):
        load_experiment(raw)
    raw["evidence"]["d_rdma_ready_ack"] = {"pattern": "x", "role": "server"}
    with pytest.raises(ConfigError, match=r"evidence\.d_rdma_ready_ack\.role': 'server' is not"):
        load_experiment(raw)


def test_local_pd_config_requires_both_sides() -> None:
    exp = load_experiment_file(PD_LOCAL)
    roles = {p.role for p in exp.evidence.values() if p.min_per_cell > 0}
    assert roles == {"prefill", "decode"}


def test_a_guessed_pattern_is_observed_not_enforced() -> None:
    rank_logs = logs(
        {"prefill": ["KV transfer done: room=1", "state slice transfer"], "decode": []}
    )
    counts = evidence.count(PATTERNS, rank_logs)
    required = evidence.enforced(PATTERNS, ["evidence.d_ack"])
    assert sorted(required) == ["p_mode", "p_slice"]
    evidence.check(required, counts, cell="pd/case~a/r1", logs=rank_logs)  # d_ack: 0 < 2
    seed = load_experiment_file(ROOT / "config" / "experiments" / "pd_standard.yaml")
    assert sorted(evidence.enforced(seed.evidence, seed.guesses)) == ["p_state_slice_transfer"]
    assert "d_rdma_ready_ack" in seed.evidence  # still counted, a results.csv column
