"""SGLang-like log lines (`[YYYY-MM-DD HH:MM:SS] message`, flushed) and fatal exits."""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
from typing import NoReturn

logger = logging.getLogger(__name__)

LOG_FORMAT = "[%(asctime)s] %(message)s"
DATE_FORMAT = "%Y-%m-%d %H:%M:%S"
READY_LINE = "The server is fired up and ready to roll!"
SGLANG_SRC = "/sgl-workspace/sglang/python/sglang/srt"


def setup_logging(*, level: str = "info") -> None:
    """Send every record of the process to stdout, one flushed line each (like SGLang)."""
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter(LOG_FORMAT, datefmt=DATE_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, level.upper(), logging.INFO))
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


# Frames of SGLang's scheduler process: (file under srt/, line, function, source line).
STARTUP_FRAMES = (
    ("managers/scheduler.py", 2925, "run_scheduler_process", "scheduler = Scheduler(...)"),
    ("managers/scheduler.py", 312, "__init__", "self.tp_worker = TpModelWorker(...)"),
    ("model_executor/model_runner.py", 402, "load_model", "self.model = get_model(...)"),
)
LOOP_FRAMES = (
    ("managers/scheduler.py", 2931, "run_scheduler_process", "scheduler.event_loop_overlap()"),
    ("managers/scheduler.py", 1043, "event_loop_overlap", "batch_result = self.run_batch(batch)"),
)


# The decode scheduler checking the prefill server's parallel info on its first request.
DECODE_HANDSHAKE_FRAMES = (
    (
        "managers/scheduler.py",
        2933,
        "run_scheduler_process",
        "scheduler.event_loop_normal_disagg_decode()",
    ),
    (
        "disaggregation/decode.py",
        905,
        "event_loop_normal_disagg_decode",
        "self.process_decode_queue()",
    ),
    (
        "disaggregation/decode.py",
        1040,
        "process_decode_queue",
        "self.disagg_decode_prealloc_queue.add(req)",
    ),
    ("disaggregation/decode.py", 262, "add", "kv_receiver = kv_receiver_class(...)"),
    ("disaggregation/common/conn.py", 412, "__init__", "self.kv_mgr.try_ensure_parallel_info(...)"),
    ("disaggregation/common/conn.py", 236, "try_ensure_parallel_info", "raise RuntimeError("),
)
Frames = tuple[tuple[str, int, str, str], ...]


def scheduler_traceback(*, error: str, startup: bool = False, frames: Frames | None = None) -> str:
    """The text SGLang logs when its scheduler process dies (`error`: the exception line)."""
    lines = ["Scheduler hit an exception: Traceback (most recent call last):"]
    if frames is None:
        frames = STARTUP_FRAMES if startup else LOOP_FRAMES
    for path, line, func, code in frames:
        lines += [f'  File "{SGLANG_SRC}/{path}", line {line}, in {func}', f"    {code}"]
    return "\n".join([*lines, error])


def disconnect_traceback(*, rid: str, task: int) -> str:
    """What SGLang logs when a client goes away mid-request and nobody awaits the task: benign
    (the server keeps serving), but a traceback (issue 17031 in tests/fixtures/real)."""
    error = f"Request is disconnected from the client side (type 1). Abort request obj.rid='{rid}'"
    return "\n".join(
        [
            "Task exception was never retrieved",
            f"future: <Task finished name='Task-{task}' coro=<<async_generator_asend without "
            f'__name__>()> exception=ValueError("{error}")>',
            "Traceback (most recent call last):",
            f'  File "{SGLANG_SRC}/managers/tokenizer_manager.py", line 1041, in '
            "_wait_one_response",
            "    raise ValueError(",
            f"ValueError: {error}",
        ]
    )


def detokenizer_traceback(*, injected: str) -> str:
    """What SGLang logs when its detokenizer process dies (another process than the
    scheduler: its own crash header, then the parent's SIGQUIT line)."""
    frames = (
        ("managers/detokenizer_manager.py", 298, "run_detokenizer_process", "manager.event_loop()"),
        (
            "managers/detokenizer_manager.py",
            117,
            "event_loop",
            "output = self._request_dispatcher(recv_obj)",
        ),
        ("utils.py", 479, "__call__", "return fn(obj)"),
    )
    lines = ["DetokenizerManager hit an exception: Traceback (most recent call last):"]
    for path, line, func, code in frames:
        lines += [f'  File "{SGLANG_SRC}/{path}", line {line}, in {func}', f"    {code}"]
    lines.append(
        f"KeyError: 'decode_status of a request that never started' (injected by {injected})"
    )
    return "\n".join(lines)


def native_crash_exit(*, injected: str) -> NoReturn:
    """Die as a native library's crash kills SGLang (UCX/NIXL's signal handler prints its
    `[host:pid:tid] Caught signal 11 (...)` and backtrace, then the process dies of SIGSEGV;
    no Python line follows)."""
    for handler in logging.getLogger().handlers:
        handler.flush()
    pid, tid = os.getpid(), threading.get_native_id()
    lib = "/usr/local/lib/python3.12/dist-packages/.nixl.mesonpy.libs/nixl.libs"
    lines = [
        f"[{socket.gethostname()}:{pid}:0:{tid}] Caught signal 11 (Segmentation fault: address "
        f"not mapped to object at address 0x10) (injected by {injected})",
        f"==== backtrace (tid:{tid}) ====",
        f" 0  {lib}/libucs.so.0(ucs_handle_error+0x294) [0x7a84380adba4]",
        f" 1  {lib}/libucp.so.0(+0x96d80) [0x7a84100f6d80]",
        f" 2  {lib}/libuct.so.0(uct_tcp_ep_am_bcopy+0x8a) [0x7a843804504a]",
        "=================================",
    ]
    sys.stdout.write("\n".join(lines) + "\n")
    sys.stdout.flush()
    signal.signal(signal.SIGSEGV, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGSEGV)
    os._exit(139)  # not reached


def fatal_exit(*, message: str, code: int = 1) -> NoReturn:
    """Log a fatal message plus SGLang's parent-process line, flush, and end the process now
    (open connections are dropped, as when SGLang's process tree is killed)."""
    logger.error(message)
    logger.error("Received sigquit from a child process. It usually means the child failed.")
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
