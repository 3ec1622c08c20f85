"""SGLang server log judgement: fatal lines, and the structure around them (tracebacks, which
process they run in, whether the process goes on, native log levels)."""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from servesweep.serving.state import log_owner

log = logging.getLogger(__name__)

# Logged by rank 0 after warmup, the moment /health turns 200. It does not clear a fatal line
# logged before it (a PD prefill prints "warm Up Failed" just before it).
READY_LINE = "The server is fired up and ready to roll!"

Severity = Literal["fatal", "warning"]
FATAL: Severity = "fatal"
WARNING: Severity = "warning"


@dataclass(frozen=True)
class Pattern:
    """One log sign, as a short name, its severity and a compiled regex over one line."""

    name: str
    severity: Severity
    regex: re.Pattern[str]


def _fatal(name: str, pattern: str, flags: int = 0) -> Pattern:
    return Pattern(name, FATAL, re.compile(pattern, flags))


def _warning(name: str, pattern: str, flags: int = 0) -> Pattern:
    return Pattern(name, WARNING, re.compile(pattern, flags))


# Lines that are fatal wherever they stand: SGLang's own crash headers and fatal messages, and
# the fatal lines of what it hosts. Searched anywhere in a line, so prefixes (Kubernetes CRI,
# wrapping loggers, docker compose, collectors) do not hide them. What a line list cannot see
# (a traceback without such a line, a native library's error level, a hang) is judged by
# structure: see `scan_text`.
FATAL_PATTERNS: tuple[Pattern, ...] = (
    # SGLang's crash header, `logger.error(f"{Name} hit an exception: {traceback}")`, logged by
    # every process it runs (Scheduler, TokenizerManager, DetokenizerManager,
    # DataParallelController, ...) just before it kills the process tree.
    _fatal("process_exception", r"\b[A-Z]\w* hit an exception\b"),
    # Running phase: "SIGQUIT received. signum=..., frame=.... It usually means one child
    # failed."; launch phase: "Received sigquit from a child process. ..." (older releases
    # spelt it "child proces.").
    _fatal("sigquit", r"SIGQUIT received\.|Received sigquit from a child proces"),
    _fatal("subprocess_crashed", r"Subprocess \S+ \(pid=\d+\) crashed with exit code"),
    # "Scheduler watchdog timeout (self.watchdog_timeout=300, self.soft=False)" (utils/
    # watchdog.py) and the older "Watchdog timeout (self.watchdog_timeout=300)". The soft
    # watchdog (self.soft=True) only dumps: judged by what follows it (scan_text).
    _fatal(
        "watchdog_timeout",
        r"[Ww]atchdog timeout \(self\.watchdog_timeout=\d+(?:\)|, self\.soft=False)",
    ),
    _fatal("warmup_failed", r"Initialization failed\. warmup error:"),
    # PD prefill warmup; printed just BEFORE the ready line, the server then serves nothing.
    _fatal("pd_warmup_failed", r"disaggregation mode warm ?[Uu]p [Ff]ailed"),
    _fatal("health_check_failed", r"Health check failed\."),
    _fatal(
        "not_enough_memory", r"Not enough memory\. Please try to increase --mem-fraction-static"
    ),
    # "max_total_tokens=131072 is larger than the profiled value -561981": no KV pool at all.
    _fatal("negative_kv_pool", r"profiled value -\d"),
    _fatal("cuda_oom", r"torch\.OutOfMemoryError|CUDA out of memory"),
    _fatal("cuda_error", r"CUDA error"),
    # faulthandler: "Fatal Python error: Segmentation fault" / "Aborted" / "Bus error".
    _fatal("fatal_python_error", r"Fatal Python error: "),
    # A fatal signal caught by a native library's handler (UCX/ucs, also under NIXL):
    # "[host:pid:tid] Caught signal 11 (Segmentation fault: ...)", then "==== backtrace".
    _fatal("native_crash", r"Caught signal (?:4|6|7|8|11) \("),
    _fatal(
        "nccl_error", r"NCCL error|nccl(?:Internal|System|UnhandledCuda|Remote|InvalidUsage)Error"
    ),
    # torch ProcessGroupNCCL: "[Rank 1] Watchdog caught collective operation timeout: ..." and
    # "Some NCCL operations have failed or timed out. ...".
    _fatal(
        "nccl_timeout",
        r"Watchdog caught collective operation timeout|"
        r"Some NCCL operations have failed or timed out",
    ),
    # OSError "[Errno 98] Address already in use" or uvicorn's "... address already in use".
    _fatal("address_in_use", r"address already in use", re.IGNORECASE),
    _fatal("page_size_mismatch", r"Page size mismatch"),
    _fatal("kv_cache_dtype_mismatch", r"KV cache dtype mismatch"),
    _fatal("prefill_parallel_info", r"Could not fetch prefill parallel info"),
    _fatal("prefill_server_info", r"Failed to get prefill server info"),
    _fatal("prefill_kvcache", r"Failed to get kvcache from prefill instance"),
    # PD transfer aborts ("Aborted by AbortReq", "Failed due to an unknown reason from another
    # rank"); /health keeps answering 200 after them.
    _fatal("kv_transfer_error", r"KVTransferError\("),
    _fatal("mooncake_metadata", r"metadata not found|Failed to retrieve segment descriptor"),
    _fatal(
        "mooncake_transport",
        r"Session::readBody failed|TcpTransport::startTransfer encountered an? ASIO exception",
    ),
    # sglang-router (Rust) PD router: a worker answered an error.
    _fatal("pd_router_worker_error", r"(?:Prefill|Decode) server returned error status"),
)

# Counted and shown, never a reason to stop: healthy servers print them.
WARNING_PATTERNS: tuple[Pattern, ...] = (
    _warning("task_exception", r"Task exception was never retrieved"),
    _warning("client_disconnected", r"Request is disconnected from the client side"),
    _warning("asgi_exception", r"Exception in ASGI application"),
    _warning("http_5xx", r"HTTP/1\.[01]\" 5\d\d"),
    _warning("import_error_ignored", r"Ignore import error when loading"),
    _warning("moe_default_config", r"Using (?:default )?MoE kernel config"),
    _warning("user_warning", r"\bUserWarning\b"),
    _warning("nccl_warn", r"NCCL WARN"),
)
PATTERNS: tuple[Pattern, ...] = FATAL_PATTERNS + WARNING_PATTERNS

# SGLang answers its readiness probe with 503 until its own warm-up has run (0.5.17 on the H200
# rehearsal: 50 `"GET /health HTTP/1.1" 503` access lines before the ready line, while our
# start-up poll waited). Such a line before the ready line is the probe's answer, not a fault;
# after it, a 5xx on /health counts (the watchdog stops the cell on it).
READINESS_PROBE = re.compile(r'"(?:GET|HEAD) /health(?:_generate)?(?:\?\S*)? HTTP/[\d.]+" 5\d\d')

# Prefixes put before a log line by whatever carried it, stripped (repeatedly) to read the
# line's own start: Kubernetes CRI, bracketed ISO collectors, cloud logging, Python logging
# wrappers, docker compose, and SGLang's own `[date time TPn]` / `[TPn]`.
PREFIXES: tuple[re.Pattern[str], ...] = tuple(
    re.compile(p)
    for p in (
        r"^\d{4}-\d\d-\d\dT[\d:.]+(?:Z|[+-]\d\d:?\d\d)? (?:stdout|stderr) [FP] ",
        r"^\[\d{4}-\d\d-\d\dT[^\]]*\] ?",
        r"^(?:DEFAULT|DEBUG|INFO|NOTICE|WARNING|ERROR|CRITICAL) \d{4}-\d\d-\d\dT\S+ ",
        r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ - \S+ - [A-Z]+ - ",
        r"^[A-Za-z0-9][\w.-]*\s+\| ",
        r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[^\]]*\] ",
        r"^\[(?:DP|TP|EP|PP|CP)\d+[^\]]*\] ",
    )
)
# The line that closes a traceback: `[module.]Name(Error|Exception|...)` then `:` or the end.
EXCEPTION_LINE = re.compile(
    r"^(?:\w+\.)*[A-Z]?\w*(?:Error|Exception|Exit|Interrupt|Group)(?::\s|:?\s*$)"
)
TRACEBACK_HEADER = "Traceback (most recent call last)"
FRAME = re.compile(r'^\s*File "([^"]+)", line \d+, in (\S+)')  # faulthandler dumps: "line N in f"
CHAINED = re.compile(r"^(?:During handling of the above exception|The above exception was the)")

# Where a traceback runs. A request's handler (uvicorn, starlette, the HTTP server, an asyncio
# task of a request) fails one request and the server goes on; anywhere else (scheduler, model
# runner, CUDA graph runner, TP worker, transfer and bootstrap threads, a child process) it is
# the engine's own code: fatal unless the process goes on.
REQUEST_SCOPE = re.compile(
    r"Task exception was never retrieved|Exception in ASGI application|"
    r"/(?:uvicorn|starlette|fastapi|sse_starlette|aiohttp)/|/entrypoints/http_server\.py|"
    r"/openai_api/|/entrypoints/openai/"
)
# Exceptions that say the process was asked to stop (Ctrl-C, our SIGTERM, a cancelled task).
STOPPED = re.compile(r"^(?:\w+\.)*(?:KeyboardInterrupt|SystemExit|CancelledError)\b")

# The process goes on: its scheduler runs a batch, the ready line, the Rust router's finished
# request with 2xx. An HTTP access line is no such sign: the HTTP process logs a streamed
# request's 200 when its headers go out and answers /health with 200 while a scheduler is dead.
PROGRESS = re.compile(r"\b(?:Prefill|Decode) batch\b|ready to roll|status=2\d\d")

# An HTTP access line, as uvicorn writes it for SGLang:
# `INFO:     127.0.0.1:5000 - "GET /path HTTP/1.1" 404 Not Found`. Its request target is the
# client's text: no pattern reads it (`GET /torch.OutOfMemoryError` is a 404, not an OOM).
ACCESS_TARGET = re.compile(r'("[A-Z]+ )\S+( HTTP/[\d.]+" \d{3}\b)')


def without_request_target(line: str) -> str:
    """The line with the request target of an access line replaced by `-` (other lines as
    they are): what the patterns read."""
    return ACCESS_TARGET.sub(r"\1-\2", line)


# Native log levels of what SGLang hosts; an error-level line is fatal when the process does
# not go on after it. glog (Mooncake, ...): `E0511 07:42:36.355509 10240 file.cpp:198] ...`
# (F: fatal); UCX: `[1747186205.897] [host:pid:tid]  module.c:72  UCX  ERROR ...`; Rust
# (sglang-router): `2025-07-30 00:09:07 ERROR target: src/x.rs:246: ...` and the older
# `[Router (Rust)] 2025-03-18 14:17:58 - ERROR - ...`; a C/C++/CUDA library's source-located
# error print (NVSHMEM: `/path/init.cu:1007: non-zero status: 7 ...`).
GLOG = re.compile(r"(?:^|\s)([EF])\d{4} \d\d:\d\d:\d\d\.\d+\s+\d+ \S+:\d+\] ")
# Native error-level lines a healthy start prints, never fatal (a warning where seen): Mooncake's
# transfer engine logs one `E... transfer_metadata.cpp:1367] Local segment descriptor not found`
# per process at start (SGLang 0.5.17 PD on one H100, 2026-12-07, served fine after it); a
# multi-node server's other ranks log no batch or ready line after it.
HEALTHY_NATIVE = re.compile(r"transfer_metadata\.cpp:\d+\] Local segment descriptor not found")
UCX_ERROR = re.compile(r"\[[\w.-]+:\d+:\d+\]\s+\S+:\d+\s+UCX\s+(?:ERROR|FATAL)\b")
RUST_ERROR = re.compile(
    r"^\d{4}-\d\d-\d\d[ T][\d:.]+Z?\s+ERROR\s+\S.*\.rs:\d+|^\[Router \(Rust\)\] .* - ERROR - "
)
NATIVE_SOURCE = re.compile(r"^\S+\.(?:c|cc|cpp|cu|cuh|hpp):(?:\w+:)?\d+: ")
# A stack dump without a crash: faulthandler's `Thread 0x... (most recent call first):` or
# SGLang's py-spy dump; a hang when the process does not go on after it.
STACK_DUMP = re.compile(
    r"^(?:Thread|Current thread) 0x[0-9a-f]+ \(most recent call first\)|Pyspy dump|"
    r"self\.soft=True"
)


def strip_prefix(line: str) -> str:
    """The line without the prefixes of PREFIXES (as many as are stacked)."""
    for _ in range(4):
        for prefix in PREFIXES:
            match = prefix.match(line)
            if match:
                line = line[match.end() :]
                break
        else:
            return line
    return line


@dataclass(frozen=True)
class Finding:
    """A pattern found on one log line (1-based line number)."""

    name: str
    line_no: int
    line: str
    severity: Severity = FATAL
    detail: str = ""  # for a traceback: the exception line that closes it

    def __str__(self) -> str:
        return f"{self.name} at line {self.line_no}: {self.line.strip()}"

    def as_dict(self) -> dict[str, Any]:
        out = {"pattern": self.name, "severity": self.severity, "line_no": self.line_no}
        out["line"] = self.line.strip()
        if self.detail:
            out["detail"] = self.detail
        return out


@dataclass(frozen=True)
class Traceback:
    """A Python traceback: its first line (the header, or the first frame when the header was
    cut off), last line, frames (file, function) and the exception line that closes it."""

    start: int
    end: int
    frames: tuple[tuple[str, str], ...]
    exception: str
    context: str  # the header line and the three lines before it

    @property
    def request_scoped(self) -> bool:
        """Runs in a request's handler: fails one request, not the server."""
        return bool(REQUEST_SCOPE.search(self.context)) or any(
            REQUEST_SCOPE.search(path) for path, _ in self.frames
        )

    @property
    def where(self) -> str:
        """The innermost frame of SGLang's own code (or the innermost frame)."""
        own = [f for f in self.frames if "sglang" in f[0]] or list(self.frames)
        if not own:
            return "no frames"
        path, func = own[-1]
        return f"{func} ({Path(path).name})"


def tracebacks(bodies: list[str]) -> list[Traceback]:
    """Every traceback in the prefix-stripped lines: headed ones, those whose header was cut
    off (frames first) and bare exception lines (an assertion without a traceback)."""
    out = []
    index = 0
    while index < len(bodies):
        body = bodies[index]
        headed = TRACEBACK_HEADER in body
        if not (headed or FRAME.match(body) or EXCEPTION_LINE.match(body)):
            index += 1
            continue
        start = index
        frames: list[tuple[str, str]] = []
        exception = ""
        if EXCEPTION_LINE.match(body) and not headed:
            exception = body.strip()[:200]
        else:
            index += 1 if headed else 0
            code_allowed = False
            while index < len(bodies):
                line = bodies[index]
                frame = FRAME.match(line)
                if frame:
                    frames.append((frame.group(1), frame.group(2)))
                    code_allowed = True
                elif EXCEPTION_LINE.match(line):
                    exception = line.strip()[:200]
                    break
                elif (
                    TRACEBACK_HEADER in line
                    or CHAINED.match(line)
                    or not line.strip()
                    or code_allowed  # the source line under a frame
                    or line.startswith((" ", "\t"))
                ):
                    code_allowed = False
                else:
                    index -= 1
                    break
                index += 1
            index = min(index, len(bodies) - 1)
        context = " ".join(bodies[max(start - 3, 0) : start + 1])
        out.append(Traceback(start, index, tuple(frames), exception, context))
        index += 1
    return out


def _native_error(body: str, raw: str) -> bool:
    glog = GLOG.search(raw)
    return bool(
        (glog and glog.group(1) == "E")
        or UCX_ERROR.search(raw)
        or RUST_ERROR.match(body)
        or NATIVE_SOURCE.match(body)
    )


def scan_text(text: str, *, complete: bool = True) -> list[Finding]:
    """Every finding of a log text, fatal and warning, in line order (readiness-probe 503s
    before the ready line are no finding).

    Lines of FATAL_PATTERNS are fatal wherever they stand, an access line's request target
    aside (ACCESS_TARGET). The rest is judged by structure:
    - a traceback that runs in a request's handler is a warning; one that runs anywhere else
      (scheduler, model runner, a transfer or bootstrap thread, a child process; its header
      cut off or not) is fatal when the process does not go on after it: no batch line, ready
      line or router's 2xx follows (an HTTP access line is no such sign: PROGRESS);
    - a native error-level line (glog E, UCX ERROR, Rust ERROR, a source-located C/CUDA error
      print) and a stack dump without a crash (faulthandler, py-spy, the soft watchdog) are
      fatal on the same condition; glog F is fatal.
    `complete=False` is for the log of a process still running: its end is no silence yet, so
    "the process does not go on" is not concluded (such findings stay warnings).

    Lines are split on newlines only, so line numbers agree with `grep -n` even when progress
    bars wrote carriage returns.
    """
    lines = [line.rstrip("\r") for line in text.split("\n")]
    read = [without_request_target(line) for line in lines]
    bodies = [strip_prefix(line) for line in read]
    last_progress = max((i for i, line in enumerate(read) if PROGRESS.search(line)), default=-1)

    def stops_after(index: int) -> bool:
        return complete and last_progress <= index

    findings: list[Finding] = []
    ready = False
    for index, line in enumerate(lines):
        ready = ready or READY_LINE in line
        if not ready and READINESS_PROBE.search(line):
            continue
        for pattern in PATTERNS:
            if pattern.regex.search(read[index]):
                findings.append(Finding(pattern.name, index + 1, line, pattern.severity))
        body = bodies[index]
        glog = GLOG.search(read[index])
        if glog and glog.group(1) == "F":
            findings.append(Finding("native_fatal", index + 1, line, FATAL))
        elif _native_error(body, read[index]):
            known = HEALTHY_NATIVE.search(line)
            severity = FATAL if stops_after(index) and not known else WARNING
            detail = "the process does not go on after it" if severity == FATAL else ""
            findings.append(Finding("native_error", index + 1, line, severity, detail))
        if STACK_DUMP.search(read[index]):
            severity = FATAL if stops_after(index) else WARNING
            detail = "a stack dump, then silence" if severity == FATAL else ""
            findings.append(Finding("stack_dump", index + 1, line, severity, detail))
    for tb in tracebacks(bodies):
        benign = tb.request_scoped or STOPPED.match(tb.exception)
        severity = FATAL if not benign and stops_after(tb.end) else WARNING
        detail = tb.exception
        if severity == FATAL:
            detail = f"in {tb.where}, the process does not go on: {tb.exception or '(cut)'}"
        findings.append(Finding("traceback", tb.start + 1, lines[tb.start], severity, detail))
    return _first_per_block(sorted(findings, key=lambda f: f.line_no))


def _first_per_block(findings: list[Finding]) -> list[Finding]:
    """Structural findings of one kind on consecutive lines (a dump, a run of native error
    lines) counted once: the first line stands for the block."""
    out: list[Finding] = []
    last: dict[str, int] = {}
    for f in findings:
        if f.name in ("native_error", "stack_dump") and last.get(f.name, -9) >= f.line_no - 3:
            last[f.name] = f.line_no
            continue
        last[f.name] = f.line_no
        out.append(f)
    return out


def fatal_findings(text: str, *, complete: bool = True) -> list[Finding]:
    """The fatal findings of `scan_text`: each one means the server failed."""
    return [f for f in scan_text(text, complete=complete) if f.severity == FATAL]


def scan_file(path: str | Path) -> list[Finding]:
    """`scan_text` over a log file (undecodable bytes replaced; carriage returns kept)."""
    with Path(path).open(errors="replace", newline="") as fh:
        findings = scan_text(fh.read())
    fatal = [f for f in findings if f.severity == FATAL]
    if fatal:
        log.info("%s: %d fatal finding(s), first: %s", path, len(fatal), fatal[0])
    return findings


def warning_counts(findings: list[Finding]) -> dict[str, int]:
    """Warning findings per pattern name, in first-seen order."""
    return dict(Counter(f.name for f in findings if f.severity == WARNING))


def verdict_line(findings: list[Finding]) -> str:
    """`fatal: <first fatal finding>`, `warning: <counts>` or `ok`, for one log."""
    fatal = [f for f in findings if f.severity == FATAL]
    if fatal:
        first = fatal[0]
        more = f" (+{len(fatal) - 1} more)" if len(fatal) > 1 else ""
        why = f" ({first.detail[:160]})" if first.detail else ""
        return f"fatal: {first.name} at line {first.line_no}: {first.line.strip()[:160]}{why}{more}"
    counts = warning_counts(findings)
    if counts:
        return "warning: " + ", ".join(f"{name} x{n}" for name, n in counts.items())
    return "ok"


# Start-up milestones of an SGLang log (0.5.17, seen on the H200 rehearsal): the bracketed time
# of every line, the engine's own timing summary, uvicorn's start and the ready line.
_STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)[^\]]*\] ", re.M)
_TIMINGS = re.compile(
    r"Engine startup timings \(s\): load_weight=([\d.]+).*?cuda_graph=\{prefill=([\d.]+), "
    r"decode=([\d.]+)"
)
_UVICORN = "Uvicorn running on"


def startup_phases(text: str, total_s: float) -> dict[str, float]:
    """Where a start's `total_s` (launch to ready) went, from rank 0's log: `imports_s`, the
    launcher's Python imports before its first stamped line plus the scheduler subprocess's
    up to "Init torch distributed begin" (49 s cold, 43 s warm on the rehearsal), `load_weight_s`,
    `cuda_graph_s` (capture, with the Triton/JIT compiles of a cold machine: 66 s on the
    rehearsal's first start, 8 s on a warm one), `warmup_s` (uvicorn up to the ready line:
    the server's own warm-up request) and `other_s`. Phases the log does not show are left out
    (older releases print no timing summary; the sim prints none)."""

    def at(line_marker: str) -> float | None:
        index = text.find(line_marker)
        if index < 0:
            return None
        stamp = None
        for match in _STAMP.finditer(text, 0, index + 1):
            stamp = match
        return _epoch(stamp.group(1)) if stamp else None

    first = _STAMP.search(text)
    ready = at(READY_LINE)
    if first is None or ready is None:
        return {}
    phases = {"imports_s": total_s - (ready - _epoch(first.group(1)))}
    scheduler = at("Init torch distributed begin")
    if scheduler is not None:  # the scheduler subprocess imports SGLang again
        phases["imports_s"] += scheduler - _epoch(first.group(1))
    timings = _TIMINGS.search(text)
    if timings:
        phases["load_weight_s"] = float(timings.group(1))
        phases["cuda_graph_s"] = float(timings.group(2)) + float(timings.group(3))
    uvicorn = at(_UVICORN)
    if uvicorn is not None:
        phases["warmup_s"] = ready - uvicorn
    phases["other_s"] = total_s - sum(phases.values())
    return {k: round(max(v, 0.0), 1) for k, v in phases.items()}


def _epoch(stamp: str) -> float:
    import datetime as dt

    return dt.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S").timestamp()


def is_ready(text: str) -> bool:
    """True if the log contains the ready line (not proof of health: see READY_LINE)."""
    return READY_LINE in text


def scan_run(
    *, logs: Sequence[str | Path], service_root: str | Path, evidence: dict[str, str]
) -> dict[str, Any]:
    """Final scan of every server log of a run: fatal findings (each with its log, role and
    node), warning counts and evidence-pattern counts.

    `evidence` maps a name to a regular expression (e.g. the P-side KV transfer lines and the
    D-side RDMA-ready acknowledgements that prove the real P-to-D path).
    """
    patterns = {name: re.compile(rx) for name, rx in evidence.items()}
    scanned: dict[str, Any] = {}
    for path in map(Path, logs):  # RunPaths.service_files: the server logs, no client logs
        text = path.read_text(errors="replace")
        rel = str(path.relative_to(service_root))
        findings = scan_text(text, complete=False)  # stopped by us: its end is no crash
        scanned[rel] = {
            "fatal": [f.as_dict() for f in findings if f.severity == FATAL],
            "warnings": warning_counts(findings),
            "evidence": {name: len(rx.findall(text)) for name, rx in patterns.items()},
        }
    totals = {name: sum(e["evidence"][name] for e in scanned.values()) for name in patterns}
    # Every fatal finding with the log it is in and that log's role and node: each fails the
    # run's validation (analysis.verdict), named.
    fatal = [
        {"log": str(path), "role": role, "node": node, **finding}
        for path in map(Path, logs)
        for role, node in [log_owner(path.name)]
        for finding in scanned[str(path.relative_to(service_root))]["fatal"]
    ]
    warnings: Counter[str] = Counter()
    for entry in scanned.values():
        warnings.update(entry["warnings"])
    return {
        "logs_scanned": len(scanned),
        "fatal_findings": len(fatal),
        "fatal": fatal,
        "warning_findings": sum(warnings.values()),
        "warnings": dict(warnings),
        "evidence": totals,
        "per_log": scanned,
    }
