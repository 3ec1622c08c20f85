"""The log scan on a healthy Mooncake start (SGLang 0.5.17 PD on one H100, 2026-12-07): its one
`E... transfer_metadata.cpp:1367] Local segment descriptor not found` per side is no failure."""

from __future__ import annotations

import re

from servesweep.serving import logscan
from servesweep.sim import mooncake
from tests.helpers import REPO

REAL = (
    REPO / "tests" / "fixtures" / "real" / "logs" / "pd-1gpu-0517-mooncake-tcp-prefill-batches.log"
)
LINES = REAL.read_text().splitlines()
START = [line for line in LINES if "Prefill batch" not in line]
BATCHES = [line for line in LINES if "Prefill batch" in line]
# The README quotes the E line as `E... transfer_metadata.cpp:1367] Local segment descriptor
# not found`, its glog prefix elided; here it takes the prefix of the real start's last line.
TCP_LINE = START[-1]
SEGMENT = re.sub(
    r"^I(\d{4} [\d:.]+\s+\d+) \S+\] .*$",
    r"E\1 transfer_metadata.cpp:1367] Local segment descriptor not found",
    TCP_LINE,
)
READY = "[2026-12-07 16:04:37] The server is fired up and ready to roll!"


def test_the_real_start_then_serving_has_no_fatal_finding() -> None:
    assert TCP_LINE.endswith("Using TCP transport (no HCA detected)")
    findings = logscan.scan_text("\n".join([*START, SEGMENT, *BATCHES, READY]))
    assert logscan.fatal_findings("\n".join([*START, SEGMENT, *BATCHES, READY])) == []
    assert [(f.name, f.severity, f.line_no) for f in findings] == [
        ("native_error", logscan.WARNING, len(START) + 1)
    ]
    assert logscan.scan_text("\n".join(LINES)) == []  # the kept lines alone: nothing


def test_the_sims_start_reads_like_the_real_one() -> None:
    sim = mooncake.transfer_engine_lines(
        backend="mooncake", ib_device=None, host="192.0.2.2", env={}, noise=True
    )
    glog_prefix = re.compile(r"^E\d{4} [\d:.]+\s+\d+ ")
    assert glog_prefix.sub("", sim[-1]) == glog_prefix.sub("", SEGMENT)
    text = "\n".join([*sim, *BATCHES, READY])
    assert logscan.fatal_findings(text) == []
    assert logscan.fatal_findings("\n".join(sim), complete=False) == []  # a start under way


def test_a_peer_ranks_healthy_start_is_no_failure() -> None:
    """A multi-node PD server's node_rank > 0 logs no batch or ready line after the E line."""
    peer = [*START, SEGMENT, "[2026-12-07 16:04:30] Capture cuda graph end. Time elapsed: 5 s."]
    assert logscan.fatal_findings("\n".join(peer)) == []
