"""Tests of servesweep.serving.logscan with SGLang-like server log snippets."""

from __future__ import annotations

from pathlib import Path

import pytest

from servesweep.serving import logscan
from tests.helpers import REPO

REAL = REPO / "tests" / "fixtures" / "real" / "logs"

# A healthy SGLang 0.5.x start (rank 0), including lines that mention NCCL, CUDA, memory,
# watchdog and page size without being failures.
READY_LOG = """\
[2026-11-29 16:40:02] server_args=ServerArgs(model_path='/models/Kimi-K3', tp_size=8, \
ep_size=8, moe_runner_backend='marlin', chunked_prefill_size=8192, page_size=64, \
mem_fraction_static=0.85, kv_cache_dtype='auto', watchdog_timeout=300, \
disaggregation_mode='null', enable_nccl_nvls=False, disable_radix_cache=True)
[2026-11-29 16:40:09 TP0] Init torch distributed begin.
[2026-11-29 16:40:11 TP0] sglang is using nccl==2.27.3
[2026-11-29 16:40:14 TP0] Init torch distributed ends. mem usage=1.21 GB
[2026-11-29 16:40:15 TP0] Load weight begin. avail mem=137.85 GB
Loading safetensors checkpoint shards: 100% Completed | 64/64 [01:02<00:00,  1.02it/s]
[2026-11-29 16:41:18 TP0] Load weight end. type=DeepseekV3ForCausalLM, dtype=torch.bfloat16, \
avail mem=62.40 GB, mem usage=75.45 GB.
[2026-11-29 16:41:19 TP0] KV Cache is allocated. #tokens: 1048576, KV size: 34.31 GB
[2026-11-29 16:41:19 TP0] Memory pool end. avail mem=27.21 GB
[2026-11-29 16:41:20 TP0] Capture cuda graph begin. This can take up to several minutes. \
avail mem=27.01 GB
Capturing batches (bs=1 avail_mem=25.95 GB): 100%|██████████| 36/36 [00:12<00:00,  2.90it/s]
[2026-11-29 16:41:33 TP0] Capture cuda graph end. Time elapsed: 13.02 s. mem usage=1.06 GB.
[2026-11-29 16:41:35] INFO:     Started server process [4242]
[2026-11-29 16:41:35] INFO:     Waiting for application startup.
[2026-11-29 16:41:35] INFO:     Application startup complete.
[2026-11-29 16:41:35] INFO:     Uvicorn running on http://0.0.0.0:30000 (Press CTRL+C to quit)
[2026-11-29 16:41:36] INFO:     127.0.0.1:51234 - "GET /model_info HTTP/1.1" 200 OK
[2026-11-29 16:41:36 TP0] Prefill batch. #new-seq: 1, #new-token: 6, #cached-token: 0, \
token usage: 0.00, #running-req: 0, #queue-req: 0, cuda graph: False
[2026-11-29 16:41:37] INFO:     127.0.0.1:51240 - "POST /generate HTTP/1.1" 200 OK
[2026-11-29 16:41:37] The server is fired up and ready to roll!
[2026-11-29 16:41:40] INFO:     127.0.0.1:51250 - "GET /health HTTP/1.1" 200 OK
"""

# One realistic line per fatal pattern (name -> line); every pattern must have one.
EXAMPLES = {
    "process_exception": "[2026-11-29 17:02:11 TP3] Scheduler hit an exception: Traceback "
    "(most recent call last):",
    "sigquit": "[2026-11-29 17:02:12] SIGQUIT received. signum=None, frame=None. It usually "
    "means one child failed.",
    "subprocess_crashed": "[2026-11-29 17:02:12] Subprocess scheduler_0 (pid=3417555) crashed "
    "with exit code -3. Triggering SIGQUIT for cleanup...",
    "watchdog_timeout": "[2026-11-29 17:07:16 TP0] Scheduler watchdog timeout "
    "(self.watchdog_timeout=300, self.soft=False)",
    "warmup_failed": "[2026-11-29 16:41:37] Initialization failed. warmup error: Traceback "
    "(most recent call last):",
    "health_check_failed": "[2026-11-29 17:10:00] Health check failed. Server couldn't get a "
    "response from detokenizer for last 20 seconds. tic start time: 17:09:40. last_heartbeat "
    "time: 17:09:39",
    "not_enough_memory": "RuntimeError: Not enough memory. Please try to increase "
    "--mem-fraction-static. Current value: mem_fraction_static=0.85",
    "cuda_oom": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 10.62 GiB. GPU 3 "
    "has a total capacity of 139.81 GiB of which 2.06 GiB is free.",
    "cuda_error": "torch.AcceleratorError: CUDA error: an illegal memory access was encountered",
    "nccl_error": "torch.distributed.DistBackendError: NCCL error in: "
    "/pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:77, unhandled system error, NCCL "
    "version 2.27.3",
    "nccl_timeout": "[rank1]:[E1129 17:20:01.123456 ProcessGroupNCCL.cpp:632] [Rank 1] "
    "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=42, OpType=ALLREDUCE, "
    "NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600011 milliseconds before timing out.",
    "address_in_use": "[2026-11-29 16:41:35] ERROR:    [Errno 98] error while attempting to "
    "bind on address ('0.0.0.0', 30000): address already in use",
    "page_size_mismatch": "RuntimeError: Page size mismatch: prefill server has page_size=64, "
    "but decode server has page_size=32. Both servers must use the same --page-size value.",
    "kv_cache_dtype_mismatch": "RuntimeError: KV cache dtype mismatch: prefill server has "
    "kv_cache_dtype=fp8_e4m3, but decode server has kv_cache_dtype=auto.",
    "prefill_parallel_info": "[2026-11-29 17:30:02 TP0] Could not fetch prefill parallel info "
    "from bootstrap_addr: 10.0.0.2:8998",
    "prefill_server_info": "[2026-11-29 17:30:02 TP0] Failed to get prefill server info: "
    "HTTPConnectionPool(host='10.0.0.2', port=8998): Max retries exceeded",
    "prefill_kvcache": "[2026-11-29 17:30:09 TP0] Failed to get kvcache from prefill instance, "
    "it might be dead",
    # Real lines from published logs (tests/fixtures/real, issue 14).
    "pd_warmup_failed": "[2026-04-15 08:41:05] Prefill disaggregation mode warm Up Failed, "
    "status code: 400",
    "negative_kv_pool": "[2025-07-02 07:41:59 DP0 TP0] max_total_tokens=131072 is larger than "
    "the profiled value -561981. Use the profiled value instead.",
    "fatal_python_error": "Fatal Python error: Segmentation fault",
    "kv_transfer_error": "[2025-11-05 16:39:09 TP0] Decode transfer failed for request rank=0 "
    "with exception KVTransferError(bootstrap_room=4793981895866140836): Aborted by AbortReq.",
    "mooncake_metadata": "W0414 03:56:41.856264 77969 transfer_metadata.cpp:153] Failed to "
    "retrieve segment descriptor, name 10.6.131.6_58f33e4e",
    "mooncake_transport": "E0904 07:15:26.325699  5796 tcp_transport.cpp:172] Session::readBody "
    "failed. Error: End of file (value: 2)",
    "native_crash": "[beaker:594314:0:594797] Caught signal 11 (Segmentation fault: invalid "
    "permissions for mapped object at address 0x7a80e6008000)",
    "pd_router_worker_error": "2025-09-04 07:15:26 ERROR http_request{method=POST "
    "uri=/v1/completions}: sglang_router_rs::routers::pd_router: Decode server returned error "
    "status decode_url=http://10.160.1.2:30001",
}


def test_ready_log_has_no_findings():
    assert logscan.scan_text(READY_LOG) == []
    assert logscan.is_ready(READY_LOG)
    assert logscan.READY_LINE == "The server is fired up and ready to roll!"
    assert not logscan.is_ready(READY_LOG.replace("ready to roll", "warming up"))


def test_every_pattern_has_an_example():
    names = [p.name for p in logscan.FATAL_PATTERNS]
    assert len(names) == len(set(names))
    assert set(names) == set(EXAMPLES)


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_each_fatal_pattern_is_found(name):
    lines = READY_LOG.splitlines()
    lines.insert(10, EXAMPLES[name])
    findings = logscan.scan_text("\n".join(lines))
    assert name in {f.name for f in findings}
    hit = next(f for f in findings if f.name == name)
    assert hit.line_no == 11
    assert hit.line == EXAMPLES[name]
    assert {f.line_no for f in findings} == {11}  # nothing else in the healthy log matched


def test_crash_log_findings_in_line_order():
    crash = (
        READY_LOG
        + "[2026-11-29 17:02:11 TP3] Scheduler hit an exception: Traceback (most recent call "
        "last):\n"
        '  File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 3021, in '
        "run_scheduler_process\n"
        "    scheduler.event_loop_overlap()\n"
        "torch.AcceleratorError: CUDA error: an illegal memory access was encountered\n"
        "\n"
        "[2026-11-29 17:02:12] SIGQUIT received. signum=None, frame=None. It usually means one "
        "child failed.\n"
        "Killed\n"
    )
    n = len(READY_LOG.splitlines())
    findings = logscan.scan_text(crash)
    assert [(f.name, f.line_no) for f in findings] == [
        ("process_exception", n + 1),
        ("traceback", n + 1),
        ("cuda_error", n + 4),
        ("sigquit", n + 6),
    ]
    assert str(findings[0]).startswith(f"process_exception at line {n + 1}: [2026-11-29")


def test_older_watchdog_and_launch_phase_sigquit_lines():
    text = (
        "[2026-04-03 20:06:34 DP1 TP0] Watchdog timeout (self.watchdog_timeout=300)\n"
        "Received sigquit from a child process. It usually means the child failed.\n"
    )
    assert [f.name for f in logscan.scan_text(text)] == ["watchdog_timeout", "sigquit"]


def test_scan_file_counts_lines_like_grep(tmp_path):
    path = tmp_path / "rank0.log"
    body = (
        READY_LOG.replace("Capturing batches (bs=1", "Capturing\r batches\r (bs=1")
        + "\x1b[31mTraceback (most recent call last):\x1b[0m\r\n"
    )
    path.write_bytes(body.encode() + b"\xff\xfe garbage\n")
    findings = logscan.scan_file(path)
    assert [(f.name, f.line_no) for f in findings] == [
        ("traceback", len(READY_LOG.splitlines()) + 1)
    ]
    assert not findings[0].line.endswith("\r")


# ---------------------------------------------------------------- severities and prefixes

DISCONNECT = """\
[2026-01-12 21:03:30] Task exception was never retrieved
future: <Task finished name='Task-993871' coro=<<async_generator_asend without __name__>()> \
exception=ValueError("Request is disconnected from the client side (type 1). Abort request")>
Traceback (most recent call last):
  File "/usr/lib/python3.12/asyncio/tasks.py", line 520, in wait_for
    return await fut
asyncio.exceptions.CancelledError
"""


def test_a_traceback_alone_is_a_warning_naming_its_exception():
    findings = logscan.scan_text(READY_LOG + DISCONNECT)
    assert logscan.fatal_findings(READY_LOG + DISCONNECT) == []
    assert logscan.warning_counts(findings) == {
        "task_exception": 1,
        "client_disconnected": 1,
        "traceback": 1,
    }
    tb = next(f for f in findings if f.name == "traceback")
    assert tb.severity == "warning" and tb.detail == "asyncio.exceptions.CancelledError"
    assert logscan.verdict_line(findings).startswith("warning: task_exception x1")


def test_a_traceback_ending_in_a_fatal_line_is_fatal():
    text = DISCONNECT.replace(
        "asyncio.exceptions.CancelledError",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
    )
    assert [f.name for f in logscan.fatal_findings(text)] == ["cuda_oom"]
    assert logscan.verdict_line(logscan.scan_text(text)).startswith("fatal: cuda_oom at line 6")


def test_benign_startup_noise_is_a_warning():
    text = (
        "[2025-11-23 06:47:42 TP1] Using default MoE kernel config. Performance might be "
        "sub-optimal! Config file not found at /x/E=256,N=768.json\n"
        "[2025-08-24 06:25:37 TP0] Ignore import error when loading sglang.srt.models.glm4v_moe\n"
        "/opt/conda/lib/python3.10/site-packages/torch/_dynamo/functions.py:1575: UserWarning: x\n"
        "node1:1234:1290 [0] NCCL WARN NET/IB : Got async event : port error\n"
        '[2026-04-05 20:02:51] INFO:     127.0.0.1:40052 - "POST /generate HTTP/1.1" 500 '
        "Internal Server Error\n"
    )
    findings = logscan.scan_text(READY_LOG + text)
    assert logscan.fatal_findings(READY_LOG + text) == []
    assert set(logscan.warning_counts(findings)) == {
        "moe_default_config",
        "import_error_ignored",
        "user_warning",
        "nccl_warn",
        "http_5xx",
    }


@pytest.mark.parametrize(
    "prefix",
    [
        "2025-07-25T07:53:08.217+08:00 stdout F ",
        "2025-03-08 02:04:48,697 - __main__ - INFO - ",
        "qwen3-32b-sglang-prefill-1  | ",
        "[2025-11-06T02:08:27.278Z] ",
        "ERROR 2026-06-15T14:10:59.392128409Z ",
        "my-own-format>> ",
    ],
)
def test_prefixes_are_tolerated(prefix):
    crash = (
        "[2026-11-29 17:02:11 TP3] Scheduler hit an exception: Traceback (most recent call last):\n"
        '  File "/sgl-workspace/sglang/python/sglang/srt/managers/scheduler.py", line 3021, in f\n'
        "    scheduler.event_loop_overlap()\n"
        "ValueError: Failed to allocate token prealloc indices\n"
    )
    text = "".join(prefix + line + "\n" for line in crash.splitlines())
    findings = logscan.scan_text(text)
    # the crash header, and the traceback after which the process does not go on
    assert [f.name for f in findings if f.severity == "fatal"] == ["process_exception", "traceback"]
    tb = next(f for f in findings if f.name == "traceback")
    if not prefix.startswith("my-own"):  # an unknown prefix hides the exception line's start
        assert tb.detail == (
            "in f (scheduler.py), the process does not go on: "
            "ValueError: Failed to allocate token prealloc indices"
        )
    assert logscan.strip_prefix(prefix + "[TP0] x") == "x" or prefix.startswith("my-own")


def test_ready_does_not_clear_an_earlier_fatal_line():
    text = (
        '[2026-04-15 08:41:05] INFO:     127.0.0.1:43246 - "POST /generate HTTP/1.1" 400 Bad\n'
        "[2026-04-15 08:41:05] Prefill disaggregation mode warm Up Failed, status code: 400\n"
        "[2026-04-15 08:41:05] The server is fired up and ready to roll!\n"
        '[2026-04-15 08:41:09] INFO:     127.0.0.1:43250 - "GET /health HTTP/1.1" 200 OK\n'
    )
    assert logscan.is_ready(text)
    assert [f.name for f in logscan.fatal_findings(text)] == ["pd_warmup_failed"]


def test_older_misspelt_sigquit_line():
    text = "[2024-10-01 10:00:00] Received sigquit from a child proces. It usually means ...\n"
    assert [f.name for f in logscan.fatal_findings(text)] == ["sigquit"]


def test_scan_run_counts_warnings(tmp_path):
    svc = tmp_path / "service" / "srv"
    svc.mkdir(parents=True)
    (svc / "local.log").write_text(READY_LOG + DISCONNECT + DISCONNECT)
    scan = logscan.scan_run(
        logs=[svc / "local.log"], service_root=tmp_path / "service", evidence={}
    )
    assert scan["fatal_findings"] == 0
    assert scan["warnings"] == {"task_exception": 2, "client_disconnected": 2, "traceback": 2}
    assert scan["warning_findings"] == 6
    assert scan["per_log"]["srv/local.log"]["warnings"]["traceback"] == 2


REHEARSAL_LOG = (
    Path(__file__).parents[1]
    / "fixtures"
    / "real"
    / "logs"
    / "h200-rehearsal-0517-cold-start-builtin.log"
)


def test_real_readiness_probe_503s_before_the_ready_line_are_no_finding():
    # SGLang 0.5.17 on the H200 rehearsal: /health answered 503 until its warm-up ran; the
    # scan counted each as http_5xx (50 warnings on a healthy start).
    text = REHEARSAL_LOG.read_text(errors="replace")
    assert text.count('"GET /health HTTP/1.1" 503') > 10
    findings = logscan.scan_text(text)
    assert [f for f in findings if f.severity == logscan.FATAL] == []
    assert "http_5xx" not in logscan.warning_counts(findings)


def test_a_health_503_after_the_ready_line_still_counts():
    probe = 'INFO:     127.0.0.1:1 - "GET /health HTTP/1.1" 503 Service Unavailable'
    text = (
        f"[2026-12-02 05:42:20] {probe}\n"
        f"[2026-12-02 05:42:28] {logscan.READY_LINE}\n"
        f"[2026-12-02 05:50:00] {probe}\n"
        '[2026-12-02 05:50:01] INFO:     127.0.0.1:3 - "POST /generate HTTP/1.1" 500 Internal\n'
    )
    assert [f.line_no for f in logscan.scan_text(text) if f.name == "http_5xx"] == [3, 4]


def test_startup_phases_of_the_real_cold_and_warm_starts():
    # The H200 rehearsal (SGLang 0.5.17): 134 s cold, most of it imports and the prefill CUDA
    # graph capture with its Triton compiles; 57 s warm, the compile caches kept.
    real = REHEARSAL_LOG.parent
    cold = logscan.startup_phases(REHEARSAL_LOG.read_text(errors="replace"), 134.01)
    assert cold == {
        "imports_s": 49.0,
        "load_weight_s": 0.8,
        "cuda_graph_s": 72.3,
        "warmup_s": 8.0,
        "other_s": 3.9,
    }
    warm_log = real / "h200-rehearsal-0517-warm-start-bench-serving.log"
    warm = logscan.startup_phases(warm_log.read_text(errors="replace"), 57.07)
    assert warm["cuda_graph_s"] == 8.9 and warm["imports_s"] == 43.1
    assert sum(warm.values()) == pytest.approx(57.07, abs=0.3)
    assert logscan.startup_phases("no stamps here", 10.0) == {}


# ---------------------------------------------------------------- structure (issue 28)

# The scheduler goes on: a batch line (the H200 rehearsal's, SGLang 0.5.17).
SERVED = (
    "[2026-12-02 05:42:33] Decode batch, #running-req: 4, #token: 0, token usage: 0.00, "
    "cuda graph: True, gen throughput (token/s): 214.23, #queue-req: 0\n"
)
ENGINE_TRACEBACK = (  # no crash header: a thread of the scheduler's process
    "Exception in thread Thread-3 (transfer_worker):\n"
    "Traceback (most recent call last):\n"
    '  File "/usr/lib/python3.12/threading.py", line 1075, in _bootstrap_inner\n'
    '  File "/sgl-workspace/sglang/python/sglang/srt/disaggregation/mooncake/conn.py", line 672, '
    "in transfer_worker\n"
    "    self.send_kvcache(req)\n"
    "AssertionError: kv indices out of range\n"
)


def test_an_engine_traceback_is_fatal_when_the_process_does_not_go_on():
    findings = logscan.scan_text(READY_LOG + ENGINE_TRACEBACK)
    tb = next(f for f in findings if f.name == "traceback")
    assert tb.severity == "fatal"
    assert tb.detail == (
        "in transfer_worker (conn.py), the process does not go on: "
        "AssertionError: kv indices out of range"
    )
    # a batch after it: the process went on
    assert logscan.fatal_findings(READY_LOG + ENGINE_TRACEBACK + SERVED) == []
    # a running process's log: its end is no silence yet
    assert logscan.fatal_findings(READY_LOG + ENGINE_TRACEBACK, complete=False) == []


def test_a_request_handler_traceback_stays_a_warning_at_the_log_end():
    asgi = (
        "[2025-08-17 17:15:54] ERROR:    Exception in ASGI application\n"
        "Traceback (most recent call last):\n"
        '  File "/usr/local/lib/python3.12/site-packages/uvicorn/protocols/http/h11_impl.py", '
        "line 403, in run_asgi\n"
        "    result = await app(self.scope, self.receive, self.send)\n"
        "asyncio.exceptions.CancelledError\n"
    )
    assert logscan.fatal_findings(READY_LOG + DISCONNECT) == []
    assert logscan.fatal_findings(READY_LOG + asgi) == []


def test_a_cut_header_and_a_bare_assertion_are_judged_like_a_traceback():
    cut = "".join(
        (REAL / "torch-compile-stream-capturing-issue7918.log").read_text().splitlines(True)[:9]
    )
    assert [f.name for f in logscan.fatal_findings(cut)] == ["traceback", "cuda_error"]
    bare = "[2026-11-29 17:02:11 TP0] AssertionError: req_to_token_pool is full\n"
    assert [f.name for f in logscan.fatal_findings(READY_LOG + bare)] == ["traceback"]
    assert logscan.fatal_findings(READY_LOG + bare + SERVED) == []


@pytest.mark.parametrize(
    "header",
    [
        "[2025-08-15 14:25:48] DetokenizerManager hit an exception: Traceback (most recent call "
        "last):",
        "[2025-10-17 13:40:23] DataParallelController hit an exception: Traceback (most recent "
        "call last):",
        "DP2 TP2] Scheduler hit an exception: Traceback (most recent call last):",
        "[2026-11-29 17:02:11 DP1 TP3 EP3] PrefillScheduler hit an exception: Traceback",
    ],
)
def test_every_process_crash_header_is_fatal_even_when_requests_follow(header):
    findings = logscan.fatal_findings(READY_LOG + header + "\n" + SERVED)
    assert [f.name for f in findings] == ["process_exception"]


def test_native_error_levels_are_fatal_when_the_process_does_not_go_on():
    glog = (
        "E0511 07:42:36.355509 10240 rdma_context.cpp:198] Failed to register memory "
        "0x2e1cbac200: Bad address [14]\n"
    )
    rust = (
        "2026-11-29 17:05:01 ERROR sglang_router_rs::routers::http::pd_router: "
        "src/routers/http/pd_router.rs:612: No available prefill workers (all circuits open)\n"
    )
    ucx = (
        "[1747186205.897557] [TENCENT64:27319:0]          module.c:72   UCX  ERROR ucs library "
        "path: /lib/libucs.so.0\n"
    )
    nvshmem = (
        "/sgl-workspace/nvshmem/src/host/init/init.cu:1007: non-zero status: 7 nvshmem setup "
        "connections failed\n"
    )
    for line in (glog, rust, ucx, nvshmem):
        assert [f.name for f in logscan.fatal_findings(READY_LOG + line)] == ["native_error"]
        assert logscan.fatal_findings(READY_LOG + line + SERVED) == []
    router_served = (
        "2026-11-29 17:05:02  INFO http_request{method=POST uri=/generate}: "
        "sglang_router_rs::middleware: src/middleware.rs:169: finished processing request "
        "status=200 OK latency=1.4ms\n"
    )
    assert logscan.fatal_findings(READY_LOG + rust + router_served) == []
    signal = (REAL / "nixl-upgrade-prefill-worker-signal11-issue380.log").read_text()
    assert logscan.fatal_findings(signal + SERVED)[0].name == "native_crash"


def test_a_soft_watchdog_dump_then_silence_is_a_hang():
    soft = (
        "[2026-11-29 17:07:16 TP0] Scheduler watchdog timeout (self.watchdog_timeout=300, "
        "self.soft=True)\n"
        "Thread 0x00007f1337ff5640 (most recent call first):\n"
        '  File "/usr/lib/python3.12/threading.py", line 359 in wait\n'
    )
    assert [f.name for f in logscan.fatal_findings(READY_LOG + soft)] == ["stack_dump"]
    assert logscan.fatal_findings(READY_LOG + soft + SERVED) == []
    hard = soft.replace("self.soft=True", "self.soft=False")
    assert logscan.fatal_findings(READY_LOG + hard + SERVED)[0].name == "watchdog_timeout"


# ---------------------------------------------------------------- access lines (issue 40)

WARM = REAL / "h200-rehearsal-0517-warm-start-bench-serving.log"


def _access_lines(status: str) -> list[str]:
    """The real run's access lines answering `status` (e.g. `200 OK`)."""
    return [ln for ln in WARM.read_text().splitlines(True) if f'HTTP/1.1" {status}' in ln]


@pytest.mark.parametrize(
    "target", ["/torch.OutOfMemoryError", "/KVTransferError(x)", "/v1/ncclSystemError"]
)
def test_an_access_lines_request_target_is_never_a_pattern(target):
    """A client's request for a path named like a fatal line is a 404, not the fault: the
    real healthy log with such an access line (the real one's shape) stays healthy."""
    lines = WARM.read_text().splitlines(True)
    real = _access_lines("200 OK")[-1]
    probe = real.replace('"GET /metrics', f'"GET {target}').replace("200 OK", "404 Not Found")
    probe = probe.replace('"POST /generate', f'"GET {target}')
    assert target in probe and "404 Not Found" in probe
    text = "".join(lines[:-3] + [probe] + lines[-3:])
    assert logscan.fatal_findings(text) == []
    assert logscan.verdict_line(logscan.scan_text(text)) == logscan.verdict_line(
        logscan.scan_text(WARM.read_text())
    )
    # the same target answered 500 is still counted, as a 5xx
    failed = probe.replace("404 Not Found", "500 Internal Server Error")
    findings = logscan.scan_text("".join(lines + [failed]))
    assert [f.name for f in findings if f.line == failed.rstrip("\n")] == ["http_5xx"]


def test_an_access_line_after_an_engine_traceback_does_not_hide_it():
    """A real engine traceback (CUDA graph capture in the model runner) in the real healthy
    log, then the real run's 2xx access lines (/health answered by the HTTP process): still
    fatal. A batch line after it clears it (the scheduler went on)."""
    healthy = WARM.read_text()
    crash = (REAL / "capture-cuda-graph-gloo-chained-issue4205.log").read_text()
    answered = "".join(_access_lines("200 OK")[:5])
    findings = logscan.fatal_findings(healthy + crash + answered)
    assert [f.name for f in findings] == ["traceback"]
    assert "Capture cuda graph failed" in findings[0].detail
    assert logscan.fatal_findings(healthy + crash + answered + SERVED) == []
