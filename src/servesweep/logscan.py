"""Fatal patterns in SGLang server logs (SGLANG.md section 3.2) and the ready line."""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# Logged by rank 0 after warmup, the moment /health turns 200.
READY_LINE = "The server is fired up and ready to roll!"


@dataclass(frozen=True)
class FatalPattern:
    """One way an SGLang server dies, as a short name and a compiled regex over one line."""

    name: str
    regex: re.Pattern[str]


def _p(name: str, pattern: str, flags: int = 0) -> FatalPattern:
    return FatalPattern(name, re.compile(pattern, flags))


# In the order a human would look for them; a line may match more than one.
FATAL_PATTERNS: tuple[FatalPattern, ...] = (
    # Any `<Something>Scheduler hit an exception:` (managers/scheduler.py, then SIGQUIT).
    _p("scheduler_exception", r"Scheduler hit an exception"),
    _p("tokenizer_manager_exception", r"TokenizerManager hit an exception"),
    _p("detokenizer_manager_exception", r"DetokenizerManager hit an exception"),
    _p("dp_controller_exception", r"DataParallelController hit an exception"),
    # Running phase: "SIGQUIT received. signum=..., frame=.... It usually means one child
    # failed."; launch phase: "Received sigquit from a child process. It usually means ...".
    _p("sigquit", r"SIGQUIT received\.|Received sigquit from a child process"),
    _p("subprocess_crashed", r"Subprocess \S+ \(pid=\d+\) crashed with exit code"),
    # "Scheduler watchdog timeout (self.watchdog_timeout=300, self.soft=False)" (utils/
    # watchdog.py) and the older "Watchdog timeout (self.watchdog_timeout=300)".
    _p("watchdog_timeout", r"[Ww]atchdog timeout \(self\.watchdog_timeout="),
    _p("warmup_failed", r"Initialization failed\. warmup error:"),
    _p("health_check_failed", r"Health check failed\."),
    _p("not_enough_memory", r"Not enough memory\. Please try to increase --mem-fraction-static"),
    _p("traceback", r"Traceback \(most recent call last\)"),
    _p("cuda_oom", r"torch\.OutOfMemoryError|CUDA out of memory"),
    _p("cuda_error", r"CUDA error"),
    _p("nccl_error", r"NCCL error|nccl(?:Internal|System|UnhandledCuda|Remote|InvalidUsage)Error"),
    # torch ProcessGroupNCCL: "[Rank 1] Watchdog caught collective operation timeout: ...".
    _p("nccl_timeout", r"Watchdog caught collective operation timeout"),
    # OSError "[Errno 98] Address already in use" or uvicorn's "... address already in use".
    _p("address_in_use", r"address already in use", re.IGNORECASE),
    _p("page_size_mismatch", r"Page size mismatch"),
    _p("kv_cache_dtype_mismatch", r"KV cache dtype mismatch"),
    _p("prefill_parallel_info", r"Could not fetch prefill parallel info"),
    _p("prefill_server_info", r"Failed to get prefill server info"),
    _p("prefill_kvcache", r"Failed to get kvcache from prefill instance"),
)


@dataclass(frozen=True)
class Finding:
    """A fatal pattern found on one log line (1-based line number)."""

    name: str
    line_no: int
    line: str

    def __str__(self) -> str:
        return f"{self.name} at line {self.line_no}: {self.line.strip()}"

    def as_dict(self) -> dict[str, Any]:
        return {"pattern": self.name, "line_no": self.line_no, "line": self.line.strip()}


def scan_text(text: str) -> list[Finding]:
    """Every (pattern, line) match in a log text, in line order then pattern order.

    Lines are split on newlines only, so line numbers agree with `grep -n` even when progress
    bars wrote carriage returns.
    """
    findings = []
    for line_no, line in enumerate(text.split("\n"), start=1):
        for pattern in FATAL_PATTERNS:
            if pattern.regex.search(line):
                findings.append(Finding(pattern.name, line_no, line.rstrip("\r")))
    return findings


def scan_file(path: str | Path) -> list[Finding]:
    """`scan_text` over a log file (undecodable bytes replaced; carriage returns kept)."""
    with Path(path).open(errors="replace", newline="") as fh:
        findings = scan_text(fh.read())
    if findings:
        log.info("%s: %d fatal finding(s), first: %s", path, len(findings), findings[0])
    return findings


def is_ready(text: str) -> bool:
    """True if the log contains the ready line."""
    return READY_LINE in text


def scan_run(
    *, logs: Sequence[str | Path], service_root: str | Path, evidence: dict[str, str]
) -> dict[str, Any]:
    """Final scan of every server log of a run: fatal findings and evidence-pattern counts.

    `evidence` maps a name to a regular expression (e.g. the P-side KV transfer lines and the
    D-side RDMA-ready acknowledgements that prove the real P-to-D path).
    """
    patterns = {name: re.compile(rx) for name, rx in evidence.items()}
    scanned: dict[str, Any] = {}
    for path in map(Path, logs):  # RunPaths.service_files: the server logs, no client logs
        text = path.read_text(errors="replace")
        rel = str(path.relative_to(service_root))
        scanned[rel] = {
            "fatal": [f.as_dict() for f in scan_text(text)],
            "evidence": {name: len(rx.findall(text)) for name, rx in patterns.items()},
        }
    totals = {name: sum(e["evidence"][name] for e in scanned.values()) for name in patterns}
    fatal = sum(len(entry["fatal"]) for entry in scanned.values())
    return {
        "logs_scanned": len(scanned),
        "fatal_findings": fatal,
        "evidence": totals,
        "per_log": scanned,
    }
