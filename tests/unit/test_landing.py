"""Tests of analysis.landing (the report's first page), labels and the no-delta decision."""

from __future__ import annotations

from pathlib import Path

import jinja2
import pandas as pd
import pytest
import yaml
from docutils.core import publish_parts

from servesweep.analysis import labels, landing
from servesweep.analysis.summary import expected_delta_note
from servesweep.config.load import load_experiment
from tests.helpers import DEFAULT_CONFIG, REPO

METRICS = ["ttft_p50_ms", "input_tps"]
DELTA = {
    "label": "moe_runner_backend=flashinfer_mxfp4, concurrency=8",
    "axes": {"moe_runner_backend": "flashinfer_mxfp4", "concurrency": 8},
    "coarse": True,
    "metrics": {
        "ttft_p50_ms": {
            "candidate_median": 594.0,
            "baseline_median": 625.0,
            "delta_pct": -4.96,
            "ci_low": -5.8,
            "ci_high": -4.4,
            "verdict": "better",
        },
        "input_tps": {
            "candidate_median": 218856.0,
            "baseline_median": 207787.0,
            "delta_pct": 5.33,
            "ci_low": None,
            "ci_high": None,
            "verdict": "unknown",
        },
    },
}
SUMMARY = {
    "run_id": "r1",
    "baseline": {"moe_runner_backend": "marlin"},
    "cells": [
        {
            "label": "moe_runner_backend=marlin, concurrency=8",
            "n": 3,
            "metrics": {"ttft_p50_ms": {"median": 625.0}, "input_tps": {"median": 207787.0}},
        },
    ],  # fmt: skip
    "deltas": [DELTA],
    "note": None,
    "log_scan": {"fatal_findings": 0, "warnings": {"moe_default_config": 4}},
}
MANIFEST = {
    "run_id": "r1",
    "git_sha": "abc",
    "written_at": "2026-12-01T17:38:09+00:00",
    "engine": {"kind": "sim", "version_pinned": "0.5.23", "image": None},
    "servers": [{"engine_version_reported": "0.5.23-sim"}],
    "config": {
        "engine": {"sim": {"time_scale": 0.005}},
        "cluster": {"nodes": ["local"], "transport": "local", "gpus_per_node": 8},
    },
}


def render(rst: str) -> str:
    """As snakemake --report does: Jinja, then docutils; a docutils error fails the test."""
    text = jinja2.Environment().from_string(rst).render()
    return publish_parts(
        text, writer_name="html", settings_overrides={"halt_level": 2, "report_level": 2}
    )["html_body"]


def page(**changes) -> str:
    results = pd.DataFrame({"retokenized_ratio": [1.0, 1.0], "client_saturated": [False, True]})
    args = {
        "summary": SUMMARY,
        "manifest": MANIFEST,
        "results": results,
        "metrics": METRICS,
        "plots": [],
        "method_rst": (REPO / "report" / "method.rst").read_text(),
        **changes,
    }
    return render(landing.landing_page(**args))


def test_page_opens_on_identity_deltas_and_warnings():
    html = page()
    assert html.index("<h1") < html.index("SIMULATED engine (time scale 0.005")
    assert "Run r1: what it measured</h1>" in html
    assert "servers report 0.5.23-sim" in html and "local (local, 8 GPUs per node)" in html
    table = html[html.index("<table id='deltas'>") : html.index("</table>", html.index("deltas"))]
    assert table.count("<tr>") == 1 + 2  # header + one row per metric
    assert "TTFT p50 [ms]" in table and "625 ms" in table and "594 ms" in table
    assert "-5.0%" in table and "[-5.8, -4.4]%" in table and ">better<" in table
    assert "207,787 tok/s" in table and ">unknown<" in table and ">none<" in table
    assert "warning moe_default_config x 4" in html
    assert "Client saturated in 1 of 2 cell-repeats" in html
    assert "intervals are coarse" in html
    # the method follows, as its own section (not lifted above the answer as the title)
    assert html.index("Run r1") < html.index("How uncertain the numbers are")
    # the report's content pane starts at the top (it centred tall pages off-screen)
    assert "align-items: flex-start !important" in html


def test_page_of_a_run_without_deltas_says_why():
    note = "only the baseline moe_runner_backend=marlin ran: no other value to compare"
    html = page(summary={**SUMMARY, "deltas": [], "note": note})
    assert "<table id='deltas'>" not in html
    assert f"No deltas in this run:</b> {note}" in html
    assert "<table id='cells'>" in html and "625 ms" in html


def test_warnings_name_drift_and_failed_cells():
    # drift as tokenizers do (0.9875) is no warning; below every healthy record (0.85) it is
    results = pd.DataFrame({"retokenized_ratio": [1.0, 0.9875, 0.63, 0.84]})
    events = [("t", "cell-failed", {"cell": "a/b/r1", "error": "server died"})]
    found = landing.warnings(summary={}, results=results, events=events)
    assert found[0].startswith("Re-tokenization drift in 2 of 4 cell-repeats")
    assert "0.6300 to 0.8400" in found[0]
    assert found[1].startswith("Invalid cell attempt a/b/r1: server died")


def test_real_run_shows_image_digest_and_no_sim_banner(tmp_path: Path):
    manifest = {**MANIFEST, "engine": {"kind": "sglang", "version_pinned": "0.5.23",
                                       "image": "img:1"}}  # fmt: skip
    builds = [{"repo_digests": ["img@sha256:ab12"], "image_id": "sha256:ff"}]
    png = tmp_path / "p.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\n" + b"x" * 20000)
    html = page(manifest=manifest, builds=builds, plots=[("TTFT p50 [ms]: change", png)])
    assert "img:1 (img@sha256:ab12)" in html and "real (sglang)" in html
    assert "SIMULATED" not in html.split("How uncertain")[0]
    assert html.count("data:image/png;base64,") == 1


def test_key_plots_pick_a_latency_and_a_throughput():
    deltas = {m: f"d_{m}.png" for m in ("ttft_p50_ms", "ttft_p99_ms", "input_tps")}
    picked = landing.key_plots(deltas=deltas, metric_vs={}, x="concurrency")
    assert list(picked.values()) == ["d_ttft_p50_ms.png", "d_input_tps.png"]
    assert list(picked)[0] == "TTFT p50 [ms]: change vs baseline"
    vs = landing.key_plots(deltas={}, metric_vs={"e2e_p50_ms": "v.png"}, x="concurrency")
    assert vs == {"E2E latency p50 [ms]: against concurrency": "v.png"}


@pytest.mark.parametrize(
    ("env", "note"),
    [
        ({}, None),
        ({"BACKENDS_CSV": "marlin"}, "only the baseline moe_runner_backend=marlin ran"),
        ({"BACKENDS_CSV": "flashinfer_mxfp4"}, "no baseline in this run"),
    ],
)
def test_expected_delta_note(env, note):
    found = expected_delta_note(load_experiment(yaml.safe_load(DEFAULT_CONFIG.read_text()), env))
    assert found == note if note is None else found.startswith(note)


def test_labels_carry_units():
    assert labels.label("ttft_p50_ms") == "TTFT p50 [ms]"
    assert labels.label("ttft_p99_9_ms") == "TTFT p99.9 [ms]"
    assert labels.label("input_tps") == "input throughput [tok/s]"
    assert labels.label("request_throughput_rps") == "request throughput [req/s]"
    assert labels.label("gpu_mem_used_peak_mib") == "gpu mem used peak [MiB]"
    assert labels.value_text(207786.6, "input_tps") == "207,787 tok/s"
    assert labels.value_text(0.02374, "joules_per_input_token") == "0.0237 J/tok"
    assert labels.value_text(None, "tpot_p50_ms") == "N/A"  # as the case table, never 0
    assert labels.sim_note({"kind": "sglang"}) == ""


def test_a_guessed_version_and_the_guesses_are_on_the_first_page(tmp_path: Path):
    manifest = {
        **MANIFEST,
        "engine": {"kind": "sglang", "version_pinned": "0.5.23", "version_guessed": True,
                   "image": "img:1"},
        "guesses": [{"key": "engine.version", "value": "0.5.23"},
                    {"key": "evidence.d_rdma_ready_ack", "value": {}}],
    }  # fmt: skip
    builds = [{"engine_version": "0.5.17", "image_id": "sha256:ff"}]
    html = page(manifest=manifest, builds=builds, plots=[])
    assert "0.5.23 guessed; the image has 0.5.17" in html
    assert "engine.version, evidence.d_rdma_ready_ack" in html


def test_the_sim_note_says_the_sim_runs_faster():
    note = labels.sim_note({"kind": "sim", "time_scale": 0.005})
    assert note == (
        "SIMULATED engine (time scale 0.005: wall-clock times of a sim that runs 200x faster "
        "than simulated time)"
    )
    assert "x wall time" not in note


def test_a_case_run_opens_on_its_table_against_the_reference_with_tpot():
    """Issue 27: a PD run (no deltas) opened on "No deltas in this run"; its answer, the cases
    against seed 003's reference with TTFT and TPOT, was only under Tables."""
    validation = (
        "<p>Against the reference: seed 003</p><table id='reference'><thead><tr><th>Case</th>"
        "<th>TTFT P50 / P95</th><th>TPOT P50 / P95</th></tr></thead><tbody><tr><td>64-8-c1"
        "</td><td>1.250 / 1.250 s</td><td>33.10 / 33.10 ms</td></tr></tbody></table>"
    )
    note = "no baseline in this run (none configured, or narrowed out of the matrix)"
    html = page(summary={**SUMMARY, "deltas": [], "note": note}, validation_html=validation)
    first = html.index("<table id='reference'>")
    assert "Each case against the reference</h2>" in html
    assert first < html.index("<table id='cells'>") and first < html.index("Warnings</h2>")
    assert "TPOT P50 / P95" in html[first:] and "33.10 / 33.10 ms" in html
    assert "No deltas in this run" not in html
