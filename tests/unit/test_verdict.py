"""A run's validation: the final log scan's fatal findings and the config's absolute gate, each
a named line (analysis.verdict); the console kept in the run folder (workflow.console)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from servesweep.analysis.verdict import check_gate, exit_message, failures, gate_result
from servesweep.config.load import load_experiment
from servesweep.core.errors import ConfigError
from servesweep.serving import logscan
from tests.helpers import DEFAULT_CONFIG, REPO

PD = REPO / "config" / "experiments" / "pd_standard_local.yaml"


def _cell(case: str, **medians: float | None) -> dict:
    return {
        "axes": {"case": case},
        "label": f"case={case}",
        "metrics": {m: {"median": v} for m, v in medians.items()},
    }


CELLS = [
    _cell("64-8-c1", ttft_p50_ms=1449.0, tpot_p50_ms=37.3, input_tps=36.7),
    _cell("1k-16-c1-nonstream", ttft_p50_ms=2191.0, tpot_p50_ms=None, input_tps=460.8),
]


def test_gate_names_each_bound_missed_with_cell_metric_bound_and_value() -> None:
    gate = [
        {"where": {"case": "64-8-c1"}, "bounds": {"ttft_p50_ms": {"max": 1200}}},
        {"where": {"case": "64-8-c1"}, "bounds": {"input_tps": {"min": 40, "max": None}}},
        {"where": {}, "bounds": {"ttft_p50_ms": {"max": 2500}}},  # every cell: met
    ]
    result = gate_result(CELLS, gate)
    assert result["checked"] == 4
    assert [
        (m["cell"], m["metric"], m["bound"], m["limit"], m["value"]) for m in result["missed"]
    ] == [
        ("case=64-8-c1", "ttft_p50_ms", "max", 1200, 1449.0),
        ("case=64-8-c1", "input_tps", "min", 40, 36.7),
    ]
    [first, second] = failures({"gate": result})
    assert first == (
        "gate missed: case=64-8-c1: ttft_p50_ms 1449, max 1200 (config gate; summary.json "
        "gate.missed)"
    )
    assert "input_tps 36.7, min 40" in second
    assert exit_message({"gate": result}).startswith("servesweep: ValidationFailed: " + first)


def test_a_gated_metric_without_a_value_is_a_miss_and_an_unselected_case_checks_nothing() -> None:
    gate = [
        {"where": {"case": "1k-16-c1-nonstream"}, "bounds": {"tpot_p50_ms": {"max": 100}}},
        {"where": {"case": "16k-1-c8"}, "bounds": {"ttft_p50_ms": {"max": 1}}},  # narrowed out
    ]
    result = gate_result(CELLS, gate)
    assert result["checked"] == 1
    assert failures({"gate": result}) == [
        "gate missed: case=1k-16-c1-nonstream: tpot_p50_ms no value, max 100 (config gate; "
        "summary.json gate.missed)"
    ]
    assert exit_message({"gate": gate_result(CELLS, gate[1:])}) is None


def test_a_fatal_finding_of_the_final_scan_is_named_with_its_role_node_and_log(
    tmp_path: Path,
) -> None:
    service = tmp_path / "results" / "r" / "service"
    (service / "pd").mkdir(parents=True)
    clean = "[2026-08-27 13:10:00] The server is fired up and ready to roll!\n"
    (service / "pd" / "prefill-601.log").write_text(clean)
    (service / "pd" / "decode-606.log").write_text(
        clean + "[2026-08-27 13:20:00 TP3] torch.OutOfMemoryError: CUDA out of memory.\n"
    )
    logs = sorted((service / "pd").glob("*.log"))
    scan = logscan.scan_run(logs=logs, service_root=service, evidence={})
    assert scan["fatal_findings"] == 1
    [finding] = scan["fatal"]
    assert (finding["role"], finding["node"], finding["pattern"], finding["line_no"]) == (
        "decode",
        "606",
        "cuda_oom",
        2,
    )
    summary = {"log_scan": {k: v for k, v in scan.items() if k != "per_log"}}
    [line] = failures(summary)
    assert line.startswith(
        f"fatal log finding cuda_oom on decode node 606: {service}/pd/decode-606.log line 2: "
    )
    assert "CUDA out of memory" in line
    assert exit_message(summary) == f"servesweep: ValidationFailed: {line}"


def test_a_single_server_log_is_its_node_s() -> None:
    from servesweep.serving.state import log_name, log_owner

    for role, node in [("server", "601"), ("prefill", "p-601"), ("router", "605")]:
        assert log_owner(log_name(role, node)) == (role, node)


@pytest.mark.parametrize(
    ("gate", "key"),
    [
        (
            [{"where": {"cas": "64-8-c1"}, "bounds": {"ttft_p50_ms": {"max": 1}}}],
            "gate[0].where.cas",
        ),
        (
            [{"where": {"case": "nope"}, "bounds": {"ttft_p50_ms": {"max": 1}}}],
            "gate[0].where.case",
        ),
        ([{"bounds": {"ttft_p50_ms": {}}}], "gate.0.bounds.ttft_p50_ms"),
        ([{"bounds": {"ttft_p50_ms": {"min": 2, "max": 1}}}], "gate.0.bounds.ttft_p50_ms"),
        ([{"where": {}}], "gate.0.bounds"),
    ],
)
def test_a_bad_gate_is_one_line_naming_its_key(gate: list, key: str) -> None:
    raw = {**yaml.safe_load(PD.read_text()), "gate": gate}
    with pytest.raises(ConfigError) as info:
        load_experiment(raw, {})
    assert key in str(info.value) and "\n" not in str(info.value)


def test_a_gate_metric_must_be_a_summary_metric() -> None:
    raw = yaml.safe_load(DEFAULT_CONFIG.read_text())
    raw["gate"] = [{"where": {"concurrency": 8}, "bounds": {"ttft_p50": {"max": 1}}}]
    exp = load_experiment(raw, {})
    with pytest.raises(ConfigError, match=r"'gate\[0\].bounds': 'ttft_p50' is not a summary"):
        check_gate(exp)


CHILD = """
import subprocess, sys
from pathlib import Path
from servesweep.workflow.console import tee_console
tee_console(Path(sys.argv[1]), ["snakemake", "--cores", "1", "all"])
print("to stdout", flush=True)
print("to stderr", file=sys.stderr, flush=True)
subprocess.run(["sh", "-c", "echo from a job; echo job error >&2"], check=True)
sys.exit("servesweep: ValidationFailed: the last line")
"""


def test_the_console_is_kept_in_the_run_folder_and_appended_per_invocation(
    tmp_path: Path,
) -> None:
    log = tmp_path / "results" / "r" / "console.log"
    runs = [
        subprocess.run(
            [sys.executable, "-c", CHILD, str(log)], capture_output=True, text=True, timeout=60
        )
        for _ in range(2)
    ]
    for proc in runs:
        assert proc.returncode == 1
        assert proc.stdout == "to stdout\nfrom a job\n"  # the console still gets it all
        assert proc.stderr == "to stderr\njob error\nservesweep: ValidationFailed: the last line\n"
    text = log.read_text()
    parts = text.split("==== ")[1:]
    assert len(parts) == 2, text  # the second invocation appended, never truncated
    for part in parts:
        head, *lines = part.splitlines()
        assert head.endswith(": snakemake --cores 1 all")
        assert sorted(lines) == sorted(
            [
                "to stdout",
                "to stderr",
                "from a job",
                "job error",
                "servesweep: ValidationFailed: the last line",
            ]
        )
