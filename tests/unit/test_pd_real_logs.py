"""The one-GPU PD rehearsal's real logs (SGLang 0.5.17, Mooncake over TCP, sglang-router 0.3.2's
mini load balancer; docs/rehearsal/pd-2026-12-07/): healthy to the log scan, the evidence of
h200_pd_rehearsal.yaml found where the config says, and the sim's lines in the same shape."""

from __future__ import annotations

import re

from servesweep.config.load import load_experiment_file
from servesweep.serving import logscan
from tests.helpers import REPO

LOGS = REPO / "tests" / "fixtures" / "real" / "logs"
PREFILL = (LOGS / "pd-1gpu-0517-prefill-healthy.log").read_text()
DECODE = (LOGS / "pd-1gpu-0517-decode-healthy.log").read_text()
ROUTER = (LOGS / "pd-1gpu-0517-router-healthy.log").read_text()
CONFIG = REPO / "config" / "experiments" / "h200_pd_rehearsal.yaml"


def test_the_real_pd_logs_have_no_fatal_finding() -> None:
    for text in (PREFILL, DECODE, ROUTER):
        assert logscan.fatal_findings(text) == []
    # Mooncake's one healthy E line per process is there, and only a warning.
    assert "transfer_metadata.cpp:1367] Local segment descriptor not found" in PREFILL
    found = [f for f in logscan.scan_text(PREFILL) if f.name == "native_error"]
    assert found and all(f.severity == logscan.WARNING for f in found)


def test_every_evidence_pattern_of_the_rehearsal_is_in_its_roles_real_log() -> None:
    exp = load_experiment_file(CONFIG, {})
    logs = {"prefill": PREFILL, "decode": DECODE, "router": ROUTER}
    counts = {
        name: len(re.findall(p.pattern, logs[p.role], flags=re.M))
        for name, p in exp.evidence.items()
    }
    assert counts["p_bootstrap_server"] == 1
    assert counts["d_pd_batch"] >= 1
    # One line per request whose KV went out: 1 warm-up + 10 probe prompts + the suite's 3 x
    # (1 + 1 + 8 + 40) requests, more where a batch held several.
    assert counts["p_kv_inflight"] >= 1 + 10 + 3 * 50
    # Enforced only what the real log showed; the guesses are what it has not.
    assert not [g for g in exp.guesses if g.startswith("evidence.")]


def test_the_router_answers_404_to_metrics_and_server_info() -> None:
    for path in ("/metrics", "/server_info"):
        assert f'"GET {path} HTTP/1.1" 404 Not Found' in ROUTER


def test_the_real_pd_batch_lines_carry_the_queues() -> None:
    """The fields of the real lines, in order, with the numbers taken out (the sim's lines are
    held against these in test_sim_pd_logs)."""

    def shape(line: str) -> str:
        body = line.split("] ", 1)[1]
        return re.sub(r"\d+(\.\d+)?", "N", body)

    real_prefill = next(line for line in PREFILL.splitlines() if "#inflight-req: 1" in line)
    real_decode = next(line for line in DECODE.splitlines() if "Decode batch" in line)
    assert shape(real_prefill).startswith(
        "Prefill batch, #new-seq: N, #new-token: N, #cached-token: N"
    )
    assert "#bootstrap-req: N, #inflight-req: N, #optimistic-req: N, cuda graph: True" in shape(
        real_prefill
    )
    assert shape(real_decode).startswith(
        "Decode batch, #running-req: N, #token: N, token usage: N, pre-allocated usage: N, "
        "#prealloc-req: N, #transfer-req: N, #retracted-req: N, cuda graph: True"
    )
