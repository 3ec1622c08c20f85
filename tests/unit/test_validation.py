"""Record validation: completeness, exact lengths and silent mid-stream failures."""

from __future__ import annotations

import pytest

from servesweep.config.schema import Workload
from servesweep.core.errors import CellFailed
from servesweep.measure.recordkeys import BUILTIN_CLIENT, CLIENT_KEY
from servesweep.measure.records import BenchRecord
from servesweep.measure.validation import Verdict, check_record, judge_record, record_problems

WORKLOAD = Workload(input_len=512, output_len=4, num_requests=4, concurrency=2)


def good(**changes) -> dict:
    n = 4
    data = {
        "completed": n,
        "total_input_tokens": n * 512,
        "total_output_tokens": n * 4,
        "total_output_tokens_retokenized": n * 4,
        "input_lens": [512] * n,
        "output_lens": [4] * n,
        "ttfts": [0.01] * n,
        "itls": [[0.001] * 3] * n,
        "generated_texts": [" tok tok tok tok"] * n,
        "errors": [""] * n,
    }
    data.update(changes)
    return data


def problems(**changes) -> list[str]:
    return record_problems(BenchRecord.model_validate(good(**changes)), WORKLOAD)


def test_valid_record_has_no_problems():
    assert problems() == []


def test_failed_request_is_quoted_and_counted():
    out = problems(
        completed=3,
        total_input_tokens=3 * 512,
        total_output_tokens=12,
        total_output_tokens_retokenized=12,
        output_lens=[4, 0, 4, 4],
        errors=["", "Internal Server Error: injected fault", "", ""],
    )
    assert out[0] == "completed 3 of 4 requests"
    assert out[1].startswith("1 request(s) failed; first error: Internal Server Error")
    assert len(out) == 2  # the failed request's zero output is not a length problem


def test_missing_details():
    data = good()
    for key in ("input_lens", "output_lens", "ttfts", "itls", "generated_texts", "errors"):
        data.pop(key)
    out = record_problems(BenchRecord.model_validate(data), WORKLOAD)
    assert len(out) == 1 and "no per-request details" in out[0]


def test_details_of_the_wrong_size():
    out = problems(ttfts=[0.1])
    assert any("do not have 4 entries" in p for p in out)


def test_wrong_input_and_output_lengths():
    out = problems(
        input_lens=[512, 511, 512, 512],
        total_input_tokens=2047,
        output_lens=[4, 4, 4, 5],
        total_output_tokens=17,
    )
    joined = " | ".join(out)
    assert "1 request(s) with input_len != 512: #1" in joined
    assert "total_input_tokens 2047 != 4 x input_len 512" in joined
    assert "1 request(s) with output_len != 4: #3" in joined
    assert "total_output_tokens 17 != 4 x output_len 4" in joined


def test_silent_midstream_failure_as_bench_serving_reports_it():
    # bench_serving: HTTP 200 + error line -> success, ttft 0, empty text, intended output_len
    out = problems(
        ttfts=[0.01, 0.01, 0.0, 0.01],
        generated_texts=["a b c d", "a b c d", "", "a b c d"],
        itls=[[0.1] * 3, [0.1] * 3, [], [0.1] * 3],
        total_output_tokens_retokenized=12,
    )
    assert out == ["1 request(s) with ttft 0 (no token arrived: silent stream failure): #2"]


def verdict(**changes) -> Verdict:
    return judge_record(BenchRecord.model_validate(good(**changes)), workload=WORKLOAD)


@pytest.mark.parametrize(
    ("retok", "total", "warned"),
    [  # published healthy records: drift as tokenizers do is no warning; the VLM case is
        (1205324, 1218922, False),
        (675679, 675840, False),
        (89, 101, False),  # 2-token outputs (PR 9428): the lowest healthy ratio, 0.881
        (128753, 204800, True),
    ],
)
def test_real_drift_warns_only_below_the_healthy_records(retok, total, warned):
    v = judge_record(
        BenchRecord.model_validate(
            {
                "completed": 200,
                "total_output_tokens": total,
                "total_output_tokens_retokenized": retok,
                "median_ttft_ms": 50.0,
            }
        )
    )
    assert v.problems == []
    assert v.retokenized_ratio == pytest.approx(retok / total)
    assert ("re-tokenization drift" in v.line()) is warned
    assert v.line().startswith("warning: " if warned else "ok")


def test_a_record_is_judged_against_the_workload_it_states():
    base = {
        "dataset_name": "random-ids",
        "random_output_len": 2000,
        "random_range_ratio": 1.0,
        "completed": 4,
        "total_output_tokens": 4,
        "median_ttft_ms": 40.0,
        "median_tpot_ms": 0.0,
    }
    v = judge_record(BenchRecord.model_validate(base))
    assert v.problems == [
        "total_output_tokens 4 < 4 x 2000: the record states random_output_len 2000, "
        "random_range_ratio 1"
    ]
    # a range ratio 0 asks for 1 to 2000 tokens; a sharegpt record's random_* keys state nothing
    assert judge_record(BenchRecord.model_validate({**base, "random_range_ratio": 0.0})).ok
    assert judge_record(BenchRecord.model_validate({**base, "dataset_name": "sharegpt"})).ok
    # num_prompts, stated or given
    assert judge_record(
        BenchRecord.model_validate({**base, "random_output_len": 1, "num_prompts": 5})
    ).problems == ["completed 4 of 5 requests (num_prompts 5)"]
    assert not judge_record(
        BenchRecord.model_validate({**base, "random_output_len": 1}), num_prompts=5
    ).ok


@pytest.mark.parametrize(("retok", "total", "ttft"), [(0, 300000, 0.0), (8, 32334, 40.0)])
def test_real_silent_failures_are_invalid(retok, total, ttft):
    v = judge_record(
        BenchRecord.model_validate(
            {
                "completed": 300,
                "total_output_tokens": total,
                "total_output_tokens_retokenized": retok,
                "median_ttft_ms": ttft,
                "mean_ttft_ms": ttft,
            }
        )
    )
    assert any("< validation.min_retokenized_ratio 0.5" in p for p in v.problems), v
    assert v.line().startswith("invalid: ")


def test_threshold_is_configurable():
    assert verdict(total_output_tokens_retokenized=15).problems == []
    v = judge_record(
        BenchRecord.model_validate(good(total_output_tokens_retokenized=15)),
        workload=WORKLOAD,
        min_retokenized_ratio=0.99,
    )
    assert "retokenized_ratio 0.9375" in v.problems[0]


def test_empty_text_after_a_first_token_is_a_warning():
    v = verdict(
        generated_texts=["", " a b c", " a b c d", " a b c d"], total_output_tokens_retokenized=11
    )
    assert v.problems == [] and v.empty_texts == 1
    assert "1 request(s) with empty text after a first token (special tokens): #0" in v.warnings


def test_aggregate_only_record_is_judged_on_its_aggregates():
    rec = BenchRecord.model_validate(
        {
            "completed": 300,
            "total_output_tokens": 300,
            "total_output_tokens_retokenized": 300,
            "median_ttft_ms": 0.0,
            "mean_ttft_ms": 0.0,
        }
    )
    assert judge_record(rec).problems == [
        "median_ttft_ms 0.0 over 300 completed requests (no token arrived)"
    ]
    ok = rec.model_copy(update={"median_ttft_ms": 12.0, "mean_ttft_ms": 13.0})
    assert judge_record(ok).line() == "ok"


def test_builtin_records_are_judged_like_any_other():
    # the builtin records the server's count (or the sim's re-count): a low one is a fault too
    data = good(total_output_tokens_retokenized=0)
    data[CLIENT_KEY] = BUILTIN_CLIENT
    assert (
        "retokenized_ratio 0.0000" in record_problems(BenchRecord.model_validate(data), WORKLOAD)[0]
    )


def test_check_record_raises_naming_cell_problems_and_logs():
    rec = BenchRecord.model_validate(
        good(
            completed=0,
            total_input_tokens=0,
            total_output_tokens=0,
            errors=["boom"] * 4,
            output_lens=[0] * 4,
        )
    )
    with pytest.raises(CellFailed) as exc:
        check_record(rec, WORKLOAD, cell="srv/cli/r1", logs=["bench/x.log", "service/s.log"])
    msg = str(exc.value)
    assert msg.startswith("cell srv/cli/r1: invalid record: completed 0 of 4 requests")
    assert "first error: boom" in msg
    assert msg.endswith("logs: bench/x.log, service/s.log")


def test_check_record_passes_a_valid_record():
    check_record(BenchRecord.model_validate(good()), WORKLOAD, cell="c", logs=[])


def test_many_problems_are_truncated():
    rec = BenchRecord.model_validate(
        good(
            completed=1,
            input_lens=[1] * 4,
            output_lens=[1] * 4,
            ttfts=[0.0] * 4,
            generated_texts=[""] * 4,
        )
    )
    with pytest.raises(CellFailed, match=r"\(\+\d+ more\)"):
        check_record(rec, WORKLOAD, cell="c", logs=["l"])
