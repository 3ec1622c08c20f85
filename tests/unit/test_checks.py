"""`servesweep check` on real published records and logs (tests/fixtures/real)."""

from __future__ import annotations

import json

import pytest

from servesweep.measure import checks
from servesweep.workflow.cli import main
from tests.helpers import REPO

REAL = REPO / "tests" / "fixtures" / "real"


def test_corpus_acceptance():
    # issue 14: 0 healthy logs fatal, >= 90% decisive fatal logs caught, 0 healthy records
    # invalid, every invalid record caught
    rows = checks.corpus_rows(REAL)
    counts = checks.corpus_counts(rows)
    assert counts["logs"] >= 25 and counts["records"] >= 10
    assert counts["healthy_logs_called_fatal"] == 0, [
        r for r in rows if r.label == "healthy" and r.verdict == "fatal"
    ]
    assert counts["fatal_logs_caught"] >= 0.9 * counts["fatal_logs_with_decisive_line"], [
        r
        for r in rows
        if r.label.startswith("fatal") and r.decisive != "no" and r.verdict != "fatal"
    ]
    assert counts["healthy_records_invalid"] == 0
    assert counts["invalid_records_caught"] == counts["invalid_records"] > 0
    assert checks.acceptance_met(counts)


def test_held_out_goals_on_the_real_corpus():
    # issue 28: on files no rule was tuned on (sha256(name) % 3 == 0, fixed before the scanner
    # changed), >= 90% of fatal logs caught, 0 false alarms, every silent failure caught, 0
    # healthy records invalid; the tuned-on files too
    rows = checks.corpus_rows(REAL)
    scores = checks.split_scores(rows)
    held_out = scores["held-out"]
    assert held_out.fatal_logs >= 20 and held_out.healthy_logs >= 5, held_out
    assert held_out.goals_met(), checks.render_scores(rows)
    assert scores["tuned"].goals_met(), checks.render_scores(rows)
    assert sum(r.split == "held-out" for r in rows) >= len(rows) / 3
    assert checks.split_of("logs/pd-1p1d-segfault-issue10350.log") == "held-out"
    assert checks.split_of("logs/pd-vlm-warmup-400-issue22871.log") == "tuned"


def test_stated_workload_and_num_prompts(tmp_path, capsys):
    rehearsal = REAL / "records" / "h200-rehearsal-0517-builtin.jsonl"  # 96 x 8192 in / 8 out
    record = json.loads(rehearsal.read_text())
    short = tmp_path / "short.jsonl"
    short.write_text(json.dumps({**record, "random_output_len": 2000}) + "\n")
    assert main(["check", str(rehearsal)]) == 0
    assert main(["check", str(short)]) == 1
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"{short}: invalid: 96 request(s) with output_len outside [2000, 2000] (e.g. 8): the "
        "record states random_output_len 2000, random_range_ratio 1"
    )
    block = REAL / "records" / "issue2805-printed-1648-of-3000.txt"
    assert main(["check", str(block)]) == 0  # the block alone states no --num-prompts
    assert main(["check", "--num-prompts", "3000", str(block)]) == 1
    assert "completed 1648 of 3000 requests (num_prompts 3000)" in capsys.readouterr().out
    with_command = REAL / "records" / "issue2805-command-and-block-1648-of-3000.txt"
    assert main(["check", str(with_command)]) == 1
    assert (
        main(["check", str(REAL / "records" / "issue2097-command-and-block-1200-of-1200.txt")]) == 0
    )
    zero = REAL / "records" / "vllm-pr14673-printed-zero-generated.txt"
    assert main(["check", str(zero)]) == 1
    assert "total_output_tokens 0 over 100 completed requests" in capsys.readouterr().out


def test_table_command_prints_every_file(capsys):
    assert main(["check", "--table", str(REAL)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("| file | label | verdict |")
    assert (
        "| records/issue12389-ifb-retokenized-zero.jsonl | invalid:retokenized-zero | invalid |"
        in out
    )
    assert "acceptance (issue 14): met" in out


def test_check_lines_and_exit_codes(capsys):
    good = REAL / "records" / "datacrunch-llama-405b-online.jsonl"  # 6 records, Infinity
    bad = REAL / "records" / "issue12389-ifb-retokenized-zero.jsonl"
    assert main(["check", str(good)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 6 and out[3] == f"{good}:4: ok"  # ratio 0.9888: no drift worth a word
    assert main(["check", str(good), str(bad)]) == 1
    assert capsys.readouterr().out.splitlines()[-1].startswith(f"{bad}: invalid: ")
    log = REAL / "logs" / "pd-decode-kvtransfer-then-health-200-issue10560.log"
    assert main(["check", str(log)]) == 1
    assert capsys.readouterr().out.startswith(f"{log}: fatal: kv_transfer_error at line 1")
    healthy = REAL / "logs" / "client-disconnect-task-exception-issue17031.log"
    assert main(["check", str(healthy)]) == 0
    assert ": warning: task_exception x1" in capsys.readouterr().out


def test_printed_blocks_and_forced_type(capsys):
    printed = REAL / "records" / "pr23954-printed-reasoning-retokenized-zero.txt"
    assert main(["check", str(printed)]) == 1
    assert "retokenized_ratio 0.0000" in capsys.readouterr().out
    vlm = REAL / "records" / "pr9812-printed-vlm-one-token.txt"
    assert main(["check", "--type", "record", str(vlm)]) == 0
    assert capsys.readouterr().out.endswith(": ok\n")
    # the same file read as a log has nothing to report
    assert main(["check", "--type", "log", str(printed)]) == 0


def test_threshold_flag(capsys):
    rec = REAL / "records" / "pr183-achatbot-printed-gpt-oss.txt"  # 19627 / 20480 = 0.958
    assert main(["check", str(rec)]) == 0
    assert main(["check", "--min-retokenized-ratio", "0.99", str(rec)]) == 1


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (None, "cannot read"),
        ('{"completed": 3,\n', "not JSON"),
        ("", "empty file"),
        ('{"hello": "world"}\n', "unknown type"),
        ("[1, 2]\n", "unknown type"),
    ],
)
def test_unreadable_input_exits_2(tmp_path, capsys, content, why):
    path = tmp_path / "x.jsonl"
    if content is not None:
        path.write_text(content)
    assert main(["check", str(path)]) == 2
    assert why in capsys.readouterr().err


def test_bare_infinity_and_nan_are_accepted(tmp_path, capsys):
    path = tmp_path / "r.jsonl"
    record = {"completed": 2, "total_output_tokens": 8, "total_output_tokens_retokenized": 8}
    line = json.dumps({**record, "request_rate": float("inf"), "std_ttft_ms": float("nan")})
    assert "Infinity" in line and "NaN" in line
    path.write_text(line + "\n")
    assert main(["check", str(path)]) == 0
    assert capsys.readouterr().out == f"{path}: ok\n"


def test_endless_and_hostile_inputs_are_one_line_exit_2(tmp_path, capsys):
    assert main(["check", "/dev/zero"]) == 2
    deep = tmp_path / "deep.json"
    deep.write_text('{"a":' * 100000)
    assert main(["check", str(deep)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "servesweep: CheckInputError: /dev/zero: not a regular file (a FIFO, device or folder)",
        f"servesweep: CheckInputError: {deep}: JSON nested too deep",
    ]


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"input_throughput": float("nan")}, "input_throughput nan is impossible"),
        ({"duration": -1.0}, "duration -1.0 is impossible"),
        ({"request_throughput": float("inf")}, "request_throughput inf is impossible"),
        ("x10", "input_throughput"),
        ("ttft", "median_ttft_ms 1 contradicts the ttfts' median"),
    ],
)
def test_impossible_or_contradicting_figures_are_invalid(tmp_path, capsys, change, why):
    good = REAL / "records" / "h200-rehearsal-0517-bench-serving.jsonl"
    record = json.loads(good.read_text())
    if change == "x10":
        record["input_throughput"] *= 10
    elif change == "ttft":
        record["median_ttft_ms"] = 1.0
    else:
        record |= change
    forged = tmp_path / "forged.jsonl"
    forged.write_text(json.dumps(record) + "\n")
    assert main(["check", str(good)]) == 0
    assert main(["check", str(forged)]) == 1
    assert why in capsys.readouterr().out


def _drop_last_request(record: dict) -> None:
    for key in ("input_lens", "output_lens", "ttfts", "itls", "generated_texts", "errors"):
        record[key] = record[key][:-1]


def _scaled(key: str, factor: float):
    return lambda record: record.update({key: record[key] * factor})


# Edits of a real record's figures that its own arrays contradict (issue 40): each names
# the figure it finds.
FORGED = [
    ("completed_edited", lambda r: r.update(completed=r["completed"] - 1), "completed 95"),
    ("arrays_cut", _drop_last_request, "completed 96 contradicts the requests without an error"),
    ("p99_ttft_raised", _scaled("p99_ttft_ms", 1.1), "p99_ttft_ms"),
    ("p99_itl_raised", _scaled("p99_itl_ms", 1.02), "p99_itl_ms"),
    ("p99_e2e_lowered", _scaled("p99_e2e_latency_ms", 0.95), "p99_e2e_latency_ms"),
    ("median_e2e_lowered", _scaled("median_e2e_latency_ms", 0.9), "median_e2e_latency_ms"),
    ("mean_e2e_raised", _scaled("mean_e2e_latency_ms", 1.05), "concurrency"),
    ("output_throughput_raised", _scaled("output_throughput", 1.01), "output_throughput"),
    ("total_throughput_raised", _scaled("total_throughput", 1.01), "total_throughput"),
    ("median_tpot_lowered", _scaled("median_tpot_ms", 0.8), "median_tpot_ms"),
]


@pytest.mark.parametrize(
    "name", ["h200-rehearsal-0517-bench-serving.jsonl", "h200-rehearsal-0517-builtin.jsonl"]
)
@pytest.mark.parametrize(("edit", "named"), [f[1:] for f in FORGED], ids=[f[0] for f in FORGED])
def test_figures_the_arrays_contradict_are_invalid(tmp_path, capsys, name, edit, named):
    """bench_serving's and our client's real records pass; each edit is named, exit 1."""
    good = REAL / "records" / name
    record = json.loads(good.read_text())
    edit(record)
    forged = tmp_path / "forged.jsonl"
    forged.write_text(json.dumps(record) + "\n")
    assert main(["check", str(good)]) == 0
    capsys.readouterr()
    assert main(["check", str(forged)]) == 1
    out = capsys.readouterr().out
    assert named in out and "contradicts" in out, out


def test_arrays_of_another_num_prompts_are_invalid(tmp_path, capsys):
    """The real record's 96 requests against a stated --num-prompts of 100 (given, or stated
    by the record itself): the arrays and `completed` both disagree."""
    good = REAL / "records" / "h200-rehearsal-0517-bench-serving.jsonl"
    assert main(["check", str(good), "--num-prompts", "96"]) == 0
    capsys.readouterr()
    assert main(["check", str(good), "--num-prompts", "100"]) == 1
    out = capsys.readouterr().out
    assert "per-request details have 96 entries, not num_prompts 100" in out, out
    stated = tmp_path / "stated.jsonl"
    stated.write_text(json.dumps({**json.loads(good.read_text()), "num_prompts": 100}) + "\n")
    assert main(["check", str(stated)]) == 1
    assert "not num_prompts 100" in capsys.readouterr().out


def test_the_allowance_is_the_rounding_of_the_figures_as_written():
    """A figure and what it is recomputed from are allowed half a unit of their last digit:
    a printed block's 2 decimals allow more than JSON's full floats."""
    from servesweep.measure.validation import Recomputed, half_unit

    assert half_unit(302.97) == pytest.approx(0.005)
    assert half_unit(3.436835532000032) == pytest.approx(5e-16)
    assert half_unit(1e-05) == pytest.approx(5e-06)
    assert half_unit(96) == 0.0
    figure = Recomputed("output_throughput", 100.0, "total_output_tokens / duration =", 0.01)
    assert figure.contradiction(100.01) is None  # 0.005 + 0.01 + float slack
    assert figure.contradiction(100.0104) is not None  # 0.00005 + 0.01 + float slack
    assert "rounding allows +-0.015" in (figure.contradiction(100.02) or "")
    assert Recomputed("completed", 96, "x").contradiction(95) == (
        "completed 95 contradicts x 96 (a count: exact)"
    )


def test_an_exact_zero_gap_does_not_loosen_the_allowance():
    """The sim's records hold ITLs of exactly 0.0 (tokens of one chunk): a whole value is
    exact, so it does not widen the TTFT statistics' allowance to 0.05 s (a halved p99 TTFT
    of the sim's record passed)."""
    from servesweep.measure.records import BenchRecord
    from servesweep.measure.validation import judge_record

    record = {
        "completed": 2,
        "duration": 1.5,
        "input_lens": [4, 4],
        "output_lens": [2, 2],
        "ttfts": [0.0123456789, 0.0234567891],
        "itls": [[0.0], [0.0]],
        "generated_texts": ["a b", "c d"],
        "errors": ["", ""],
        "p99_ttft_ms": 11.6,
    }
    line = judge_record(BenchRecord.model_validate(record)).line()
    assert "p99_ttft_ms 11.6 contradicts the ttfts' p99 23.3" in line, line
