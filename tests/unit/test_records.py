"""Tests of measure.records: bench_serving JSONL parsing, Infinity, one record per file."""

from pathlib import Path

import pytest
from pydantic import ValidationError

from servesweep.measure.recordkeys import RECORD_KEYS
from servesweep.measure.records import BenchRecord, read_record, read_records, write_record


def test_record_keys_are_bench_serving_0_5_23() -> None:
    assert len(RECORD_KEYS) == 49
    assert RECORD_KEYS[0] == "tag" and RECORD_KEYS[-1] == "max_concurrent_requests"


def test_infinity_and_unknown_keys_round_trip(tmp_path: Path) -> None:
    line = '{"tag": "x", "request_rate": Infinity, "completed": 3, "goodput_slos_ms": null}\n'
    path = tmp_path / "r1.jsonl"
    path.write_text(line)
    rec = read_record(path)
    assert rec.request_rate == float("inf")
    assert rec.completed == 3
    assert "goodput_slos_ms" in rec.model_dump()
    out = tmp_path / "out.jsonl"
    write_record(out, rec)
    assert read_record(out) == rec


def test_a_raw_file_holds_exactly_one_record(tmp_path: Path) -> None:
    path = tmp_path / "r1.jsonl"
    path.write_text('{"completed": 1}\n{"completed": 2}\n')
    assert [r.completed for r in read_records(path)] == [1, 2]
    with pytest.raises(ValueError, match="exactly one record, found 2"):
        read_record(path)
    assert BenchRecord().completed is None


def test_read_record_with_keys_validates_and_keeps_only_those(tmp_path: Path) -> None:
    path = tmp_path / "r1.jsonl"
    path.write_text('{"completed": 3, "duration": 1.5, "itls": "garbage", "tag": "x"}\n')
    rec = read_record(path, keys=("completed", "duration", "median_ttft_ms"))
    assert (rec.completed, rec.duration, rec.median_ttft_ms) == (3, 1.5, None)
    assert rec.itls is None and rec.tag is None  # not read, so not validated either
    with pytest.raises(ValidationError, match="itls"):
        read_record(path, keys=("completed", "itls"))
    path.write_text('{"completed": 1}\n{"completed": 2}\n')
    with pytest.raises(ValueError, match="exactly one record, found 2"):
        read_record(path, keys=("completed",))
