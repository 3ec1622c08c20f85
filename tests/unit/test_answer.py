"""The answer block a run prints last (servesweep.analysis.answer)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from servesweep.analysis import answer, labels


def _metric(delta, low, high, verdict):
    return {"delta_pct": delta, "ci_low": low, "ci_high": high, "verdict": verdict}


def _delta(chunk, conc, ttft, tps, extra_verdict="within noise"):
    return {
        "axes": {
            "moe_runner_backend": "flashinfer_mxfp4",
            "chunked_prefill_size": chunk,
            "concurrency": conc,
        },
        "label": f"moe_runner_backend=flashinfer_mxfp4, chunked_prefill_size={chunk}",
        "n_candidate": 3,
        "n_baseline": 3,
        "metrics": {
            "ttft_p50_ms": ttft,
            "input_tps": tps,
            "ttft_p99_ms": _metric(1.0, -0.5, 2.5, extra_verdict),
        },
    }


SUMMARY = {
    "run_id": "moe-prefill-sim",
    "engine": {"kind": "sim", "time_scale": 0.005},
    "baseline": {"moe_runner_backend": "marlin"},
    "deltas": [
        _delta(8192, 8, _metric(-5.6, -5.9, -4.4, "better"), _metric(5.2, 4.5, 6.1, "better")),
        _delta(
            16384, 16, _metric(-0.4, -1.6, -0.04, "worse"), _metric(0.3, -0.2, 0.9, "within noise")
        ),
    ],
    "note": None,
    "log_scan": {"fatal_findings": 0},
}
RESULTS = pd.DataFrame(
    {
        "server_id": ["a", "b", "b"],
        "client_id": ["concurrency~8"] * 3,
        "client_saturated": [False, True, True],
    }
)
FILES = [("results.csv", "results/r/results.csv"), ("report", "results/r/report.html")]


def block(**changes) -> str:
    args = {
        "summary": SUMMARY,
        "results": RESULTS,
        "metrics": ["ttft_p50_ms", "ttft_p99_ms", "input_tps"],
        "files": FILES,
        **changes,
    }
    return answer.answer_block(**args)


@pytest.mark.parametrize(
    ("value", "text"),
    [(-0.04, "0.0"), (0.04, "0.0"), (-0.0, "0.0"), (-0.06, "-0.1"), (5.25, "+5.2"), (None, "n/a")],
)
def test_a_percentage_that_rounds_to_zero_has_no_sign(value, text):
    assert labels.pct(value) == text


def test_the_block_gives_each_cell_its_change_interval_and_verdict():
    text = block()
    lines = text.splitlines()
    assert lines[0].startswith("== servesweep: the answer of run moe-prefill-sim (SIMULATED")
    assert (
        "moe_runner_backend=flashinfer_mxfp4 vs baseline moe_runner_backend=marlin: 2 cells, "
        "medians of 3 repeats" in text
    )
    row = next(line for line in lines if "chunked_prefill_size=8192, concurrency=8" in line)
    assert "-5.6% [-5.9, -4.4] better" in row and "+5.2% [+4.5, +6.1] better" in row
    # the primary metrics: the first latency and the first throughput, not TTFT p99
    assert "TTFT p50 [ms]" in text and "input throughput [tok/s]" in text
    assert "TTFT p99" not in text
    # a bound that rounds to zero is never "-0.0" beside "worse"
    assert "-0.4% [-1.6, 0.0] worse" in text and "-0.0" not in text
    assert "verdicts over 6 cell-metric comparisons: 2 better, 1 worse, 3 within noise" in text


def test_the_block_ends_with_the_warnings_and_the_paths():
    events = [("t", "cell-failed", {"cell": "a/concurrency~8/r2", "error": "1 request failed"})]
    text = block(events=events)
    assert "Client saturated in 2 of 3 cell-repeats (b/concurrency~8)" in text
    assert (
        "Invalid cell attempt a/concurrency~8/r2: 1 request failed (orchestrator.log; not in "
        "results.csv)" in text
    )
    assert text.splitlines()[-2:] == [
        "  results.csv  results/r/results.csv",
        "  report       results/r/report.html",
    ]
    calm = block(results=RESULTS.assign(client_saturated=False))
    assert "Warnings: none" in calm


def test_a_streamed_cell_with_a_tpot_of_zero_is_a_warning():
    text = block(results=RESULTS.assign(tpot_zero=[False, True, False]))
    assert (
        "  - TPOT p50 of 0.00 ms in 1 of 3 cell-repeats (b/concurrency~8) that stream outputs "
        "of more than one token: a measurement error" in text
    )
    assert "TPOT" not in block(results=RESULTS.assign(tpot_zero=False))


def test_the_console_and_the_report_state_each_warning_in_the_same_words():
    """Issue 27: one definition per fact (analysis.cautions), not two drifting copies."""
    from servesweep.analysis import landing

    events = [("t", "cell-failed", {"cell": "a/concurrency~8/r2", "error": "1 request failed"})]
    summary = {**SUMMARY, "log_scan": {"fatal_findings": 2, "warnings": {"x": 3}}}
    results = RESULTS.assign(retokenized_ratio=[1.0, 0.80, 1.0])  # below the 0.85 warning
    console = answer.warnings(summary=summary, results=results, events=events)
    report = landing.warnings(summary=summary, results=results, events=events)
    assert console == report and len(console) == 5, console
    text = block(summary=summary, results=results, events=events)
    assert all(f"  - {w}" in text for w in console)


def test_a_cell_whose_node_clock_was_off_is_flagged():
    """Issue 26 item 7: a node clock off by more than the sampling interval is said."""
    results = RESULTS.assign(
        gpu_clock_skewed=[False, True, "True"], gpu_clock_offset_s=[0.01, 2.5, -2.6]
    )
    found = answer.warnings(summary=SUMMARY, results=results, events=[])
    said = [w for w in found if w.startswith("GPU clocks:")]
    assert said == [
        "GPU clocks: in 2 of 3 cell-repeats a node's clock was off the workflow host's by more "
        "than the sampling interval (up to 2.600 s); its samples were aligned by the offset "
        "measured in the cell (gpu_clock_offset_s in results.csv)."
    ]


def test_a_run_without_deltas_says_why():
    text = block(summary={**SUMMARY, "deltas": [], "note": "one backend only"})
    assert "No deltas: one backend only." in text


def test_print_answer_reads_the_run_files(tmp_path: Path, capsys):
    summary, results = tmp_path / "summary.json", tmp_path / "results.csv"
    missing = answer.print_answer(
        summary_json=summary, results_csv=results, report_html=tmp_path / "report.html",
        metrics=["ttft_p50_ms", "input_tps"],
    )  # fmt: skip
    assert missing.startswith("servesweep: no summary yet")
    summary.write_text(json.dumps(SUMMARY))
    RESULTS.assign(run_id="r").to_csv(results, index=False)
    text = answer.print_answer(
        summary_json=summary, results_csv=results, report_html=tmp_path / "report.html",
        metrics=["ttft_p50_ms", "input_tps"], events=tmp_path / "orchestrator.log",
    )  # fmt: skip
    assert capsys.readouterr().out.endswith(text)
    assert f"summary.json  {summary}" in text
    assert "report.html" not in text  # not written: not listed


def test_no_answer_is_printed_from_files_older_than_a_raw_record(tmp_path: Path, capsys):
    """A cell rerun alone (`snakemake -f <raw>`) leaves results.csv and summary.json older
    than its new record: one line naming the record and the command, never the old answer."""
    import os

    summary, results = tmp_path / "summary.json", tmp_path / "results.csv"
    summary.write_text(json.dumps(SUMMARY))
    RESULTS.assign(run_id="r").to_csv(results, index=False)
    older, newer = tmp_path / "r1.jsonl", tmp_path / "r2.jsonl"
    older.write_text("{}\n")
    newer.write_text("{}\n")
    built = summary.stat().st_mtime_ns
    os.utime(older, ns=(built - 10**9, built - 10**9))
    os.utime(results, ns=(built + 10**9, built + 10**9))
    os.utime(newer, ns=(built + 2 * 10**9, built + 2 * 10**9))
    kw = {"summary_json": summary, "results_csv": results, "report_html": tmp_path / "r.html"}
    kw |= {"metrics": ["ttft_p50_ms"], "refresh": "snakemake --cores 1 all --configfile c.yaml"}
    text = answer.print_answer(**kw, records=[older, newer, tmp_path / "gone.jsonl"])
    assert capsys.readouterr().out == text + "\n" and "\n" not in text
    assert "== servesweep: the answer" not in text
    assert str(newer) in text and str(summary) in text
    assert "`snakemake --cores 1 all --configfile c.yaml` brings them" in text
    # the records are older than both files: the answer
    os.utime(newer, ns=(built - 10**9, built - 10**9))
    assert answer.print_answer(**kw, records=[older, newer]).startswith("== servesweep: the answer")


def test_an_invalid_attempt_remeasured_since_is_no_warning():
    """A cell-failed event followed by a valid record of the same cell (cell-done) is history:
    orchestrator.log keeps it, the answer warns only of attempts not remeasured since."""
    failed = {"cell": "a/concurrency~8/r2", "error": "1 request failed"}
    other = {"cell": "b/concurrency~8/r1", "error": "server died"}
    events = [
        ("t1", "cell-done", {"cell": failed["cell"]}),
        ("t2", "cell-failed", failed),
        ("t3", "cell-failed", other),
        ("t4", "cell-done", {"cell": failed["cell"]}),
        ("t5", "cell-done", {"cell": "b/concurrency~8/r2"}),
    ]
    found = answer.warnings(summary=SUMMARY, results=RESULTS, events=events)
    invalid = [w for w in found if w.startswith("Invalid cell attempt")]
    assert invalid == [
        "Invalid cell attempt b/concurrency~8/r1: server died (orchestrator.log; not in "
        "results.csv)."
    ]
    again = [*events, ("t6", "cell-failed", failed)]  # failed again after its valid record
    found = answer.warnings(summary=SUMMARY, results=RESULTS, events=again)
    assert sum(w.startswith("Invalid cell attempt a/concurrency~8/r2") for w in found) == 1


def test_the_sims_deliberate_log_noise_is_said_but_no_warning():
    """The sim writes a UserWarning and the default-MoE-config line on purpose (as healthy
    real SGLang starts do): on a sim run they are named beside the warnings, not among them;
    on a real engine they stay warnings, and so does any other finding on the sim."""
    scan = {"fatal_findings": 0, "warnings": {"moe_default_config": 4, "user_warning": 4, "x": 3}}
    calm = RESULTS.assign(client_saturated=False)
    text = block(summary={**SUMMARY, "log_scan": scan}, results=calm)
    said = text[text.index("Warnings:") : text.index("Files:")].splitlines()
    assert said == [
        "Warnings:",
        "  - Server logs: warning x x 3 (logscan.json).",
        "  (Not warnings: the simulated engine's deliberate log noise (moe_default_config x 4, "
        "user_warning x 4 in logscan.json), written as healthy real SGLang writes it "
        "(engine.sim.noise: false turns it off).)",
    ]
    real = {**SUMMARY, "engine": {"kind": "sglang"}, "log_scan": scan}
    found = answer.warnings(summary=real, results=calm, events=[])
    assert "Server logs: warning moe_default_config x 4 (logscan.json)." in found
    assert "Not warnings" not in block(summary=real, results=calm)
    quiet = {**SUMMARY, "log_scan": {"fatal_findings": 0, "warnings": {"user_warning": 2}}}
    assert "Warnings: none\n  (Not warnings:" in block(summary=quiet, results=calm)
