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
