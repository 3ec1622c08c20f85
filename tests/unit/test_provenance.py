"""What a raw record says it was measured with, read back cheaply for the planner."""

from __future__ import annotations

import json
from pathlib import Path

from servesweep.measure.provenance import KEY, TAIL_BYTES, recorded


def test_recorded_reads_the_key_from_the_tail_or_else_the_whole_record(tmp_path: Path) -> None:
    value = {"fingerprint": "abc", "workload": {"num_requests": 8}}
    details = [0.001 * i for i in range(TAIL_BYTES // 4)]  # per-request details, > the tail
    late, early, none = tmp_path / "late.jsonl", tmp_path / "early.jsonl", tmp_path / "n.jsonl"
    late.write_text(json.dumps({"itls": details, KEY: value, "engine": "sim"}) + "\n")
    early.write_text(json.dumps({KEY: value, "itls": details}) + "\n")
    none.write_text(json.dumps({"itls": details}) + "\n")
    assert late.stat().st_size > TAIL_BYTES
    assert recorded(late) == value
    assert recorded(early) == value
    assert recorded(none) is None


def test_cell_params_equal_the_per_cell_computation() -> None:
    """run_cell's params from the per-config cache (provenance.CellParams) are the values each
    cell computes alone: a cached value that differed would rerun, or never rerun, cells."""
    import json

    from servesweep.config.matrix import cell_repeats, workload_key
    from servesweep.measure.provenance import CellParams, measured_with
    from tests.support.runs import experiment

    for exp in (experiment(), experiment(CONCURRENCIES_CSV="8", BACKENDS_CSV="marlin")):
        cells = {c.key: c for c in cell_repeats(exp)}
        params = CellParams(exp, cells)
        assert len({params.workload(k) for k in cells}) > 1, "each repeat has its own seed"
        for key, cell in reversed(cells.items()):
            assert params.fingerprint(key) == cell.server.fingerprint
            assert params.workload(key) == workload_key(cell.workload)
            assert params.value(key) == measured_with(exp, cell)
            assert params.measured_with(key) == json.dumps(measured_with(exp, cell), sort_keys=True)
