"""A fork server for the workflow's jobs: Python imported once, a forked child per job.

A fresh Python process per job spends 0.2-0.3 s (a cell-repeat) to 1.7 s (the plots: pandas,
seaborn) starting and importing before it does anything (docs/performance.md). The fork
server is started with the workflow (`onstart:`), imports the job code once, and forks a child
per job. The job's own process (the thin `scripts/<rule>.py`) connects over a Unix socket in a
private directory, hands over its stdin/stdout/stderr, working directory, environment and
argument (argv of a `shell:` job, the `snakemake` object of a `script:` job), forwards
signals to the child and exits with the child's status. The child joins the job process's
process group, so a group's Ctrl-C or SIGKILL reaches it and its subprocesses as before. A
child whose job process is gone (killed alone) gets SIGTERM, so no job outlives its Snakemake
job. A child ends with os._exit once its function returns and logging and stdio are flushed:
atexit handlers and non-daemon threads of the job do not outlive the function.

Without `SERVESWEEP_FORKSERVER` in the environment (a script run by hand, a test), or with a
server that cannot be reached (a job sent to another host), the job runs in the calling process:
the same function, only without the fork.

Imported by every job's own process: standard library only, nothing done at import time.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import pickle
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

SOCKET_ENV = "SERVESWEEP_FORKSERVER"
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
PARENT_POLL_S = 1.0  # how often an idle server checks that Snakemake is still there
START_TIMEOUT_S = 30.0
_HEADER = struct.Struct("!I")  # length of the pickled request that follows the fds
# The server's own environment: no BLAS thread pool (numpy) in a process that forks.
SERVER_ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

_server: subprocess.Popen[bytes] | None = None
_server_dir: str | None = None


# --- the job's side ---------------------------------------------------------------------------


def _resolve(target: str) -> Callable[[Any], None]:
    module, _, name = target.partition(":")
    func: Callable[[Any], None] = getattr(importlib.import_module(module), name)
    return func


def run_job(target: str, arg: Any) -> NoReturn:
    """Call `target` ("module:function") with `arg` (picklable) in a child of the fork server,
    or in this process without one (or if it cannot be reached); exit with its status."""
    path = os.environ.get(SOCKET_ENV)
    conn = _connect(path) if path else None
    if conn is None:
        _resolve(target)(arg)
        sys.exit(0)
    sys.exit(_delegate(conn, target, arg))


def _connect(path: str) -> socket.socket | None:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
    except OSError as exc:
        conn.close()
        print(
            f"servesweep: fork server at {path} is not there ({exc}); running the job in this "
            "process",
            file=sys.stderr,
        )
        return None
    return conn


def _delegate(conn: socket.socket, target: str, arg: Any) -> int:
    # Signals that arrive before the child is known wait in `received`. A child that joined this
    # process's group gets a group's Ctrl-C itself, so SIGINT is forwarded only to one that did
    # not (or that was not there yet); SIGTERM/SIGHUP come to this process alone (Snakemake).
    received: list[int] = []
    child: list[int] = []  # [pid, joined the group (0/1)] once the server answered

    def forward(signum: int, _frame: Any) -> None:
        received.append(signum)
        if child and not (signum == signal.SIGINT and child[1]):
            with contextlib.suppress(ProcessLookupError):
                os.kill(child[0], signum)

    for signum in FORWARDED_SIGNALS:
        signal.signal(signum, forward)
    request = pickle.dumps(
        {
            "target": target,
            "arg": arg,
            "argv": sys.argv,
            "cwd": os.getcwd(),
            "env": dict(os.environ),
            "pgid": os.getpgid(0),
        }
    )
    socket.send_fds(conn, [_HEADER.pack(len(request))], [0, 1, 2])
    conn.sendall(request)
    reader = conn.makefile("rb")
    pid_line = reader.readline()
    if not pid_line:
        print("servesweep: the fork server closed before starting the job", file=sys.stderr)
        return 1
    child.extend(int(word) for word in pid_line.split())
    for signum in received:  # before the child was there, it got none of them
        with contextlib.suppress(ProcessLookupError):
            os.kill(child[0], signum)
    status_line = reader.readline()
    if status_line:
        return int(status_line)
    print(f"servesweep: job process {child[0]} ended without a status (killed)", file=sys.stderr)
    return 128 + received[-1] if received else 1


# --- the server's side ------------------------------------------------------------------------


def serve(path: str, first: Sequence[str], then: Sequence[str]) -> None:
    """Accept jobs on `path` until the parent process (Snakemake) is gone or SIGTERM arrives;
    the directory of `path` is the server's own and is removed when it ends.

    The socket listens at once; jobs wait while the modules in `first` are imported. Then a
    second server, forked from this one, imports `then` (pandas, seaborn: over a second) while
    this one keeps serving, and takes over when it is done: no job waits for those imports."""
    parent = os.getppid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    listener.setblocking(False)  # both servers watch it during the hand-over
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # jobs forward Ctrl-C to their own child
    signal.signal(signal.SIGTERM, _exit_on_signal)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    for module in first:
        importlib.import_module(module)
    print(f"fork server {os.getpid()} on {path}, with {', '.join(first) or 'nothing'}", flush=True)
    successor, handed_over = _start_successor(listener, then) if then else (None, None)
    try:
        _accept_jobs(listener, parent=parent, until=handed_over)
        while os.getppid() == parent and _alive(successor):  # the successor serves
            time.sleep(PARENT_POLL_S)
        _accept_jobs(listener, parent=parent, until=None)  # unless it died: serve again
    finally:
        if successor is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(successor, signal.SIGTERM)
        shutil.rmtree(os.path.dirname(path), ignore_errors=True)


def _start_successor(listener: socket.socket, modules: Sequence[str]) -> tuple[int, int]:
    """Fork the server that imports `modules` and then serves; (its pid, a pipe's read end that
    becomes readable when it takes over). It ends when this server does."""
    read_end, write_end = os.pipe()
    sys.stdout.flush()
    pid = os.fork()
    if pid:
        os.close(write_end)
        return pid, read_end
    status = 1
    try:
        os.close(read_end)
        for module in modules:
            importlib.import_module(module)
        print(f"fork server {os.getpid()} takes over, with {', '.join(modules)} too", flush=True)
        os.write(write_end, b"1")
        os.close(write_end)
        _accept_jobs(listener, parent=os.getppid(), until=None)
        status = 0
    except SystemExit as exc:
        status = _exit_status(exc.code)
    except BaseException:
        traceback.print_exc()
    finally:
        os._exit(status)


def _alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _accept_jobs(listener: socket.socket, *, parent: int, until: int | None) -> None:
    """Fork a child per connection until `parent` is gone or fd `until` becomes readable."""
    watched = [listener] if until is None else [listener, until]
    jobs = 0
    try:
        while os.getppid() == parent:
            readable, _, _ = select.select(watched, [], [], PARENT_POLL_S)
            if until in readable:
                break
            try:
                conn, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                continue  # nothing yet, or the other server took it
            conn.setblocking(True)
            jobs += 1
            sys.stdout.flush()
            sys.stderr.flush()
            if os.fork() == 0:
                status = 1
                try:
                    listener.close()
                    status = _child(conn)
                except BaseException:
                    traceback.print_exc()
                finally:
                    os._exit(status)
            conn.close()
    finally:
        print(f"fork server {os.getpid()} served {jobs} jobs", flush=True)


def _exit_on_signal(signum: int, _frame: Any) -> NoReturn:
    raise SystemExit(128 + signum)


def _child(conn: socket.socket) -> int:
    """Become the job: its fds, cwd, env and argv; run the target; report the status."""
    for signum in (*FORWARDED_SIGNALS, signal.SIGCHLD):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    conn.settimeout(None)
    header, fds, _, _ = socket.recv_fds(conn, _HEADER.size, 3)
    (length,) = _HEADER.unpack(header)
    request = pickle.loads(_recv_exactly(conn, length))  # this user's own jobs (0700 dir)
    for target_fd, fd in enumerate(fds):
        os.dup2(fd, target_fd)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = request["argv"]
    # Into the job process's group, where the job would have run: a group's Ctrl-C or SIGKILL
    # (Snakemake's) reaches the child and what it starts (the load client), as it did before.
    # Not possible from another session: the job process forwards SIGINT then.
    try:
        os.setpgid(0, request["pgid"])
        joined = 1
    except OSError:
        joined = 0
    conn.sendall(f"{os.getpid()} {joined}\n".encode())
    threading.Thread(target=_end_with_job_process, args=(conn,), daemon=True).start()
    try:
        _resolve(request["target"])(request["arg"])
        status = 0
    except SystemExit as exc:
        status = _exit_status(exc.code)
    except BaseException:
        traceback.print_exc()
        status = 1
    _flush_everything()
    with contextlib.suppress(OSError):
        conn.sendall(f"{status}\n".encode())
    return status


def _recv_exactly(conn: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = conn.recv(min(left, 1 << 16))
        if not chunk:
            raise ConnectionError("job process closed the connection mid-request")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _end_with_job_process(conn: socket.socket) -> None:
    """SIGTERM this child when its job process goes away (it sends nothing after the request)."""
    with contextlib.suppress(OSError):
        conn.recv(1)
    os.kill(os.getpid(), signal.SIGTERM)


def _exit_status(code: object) -> int:
    """sys.exit's argument as a process status: None 0, an int itself, anything else printed
    and 1 (as the interpreter does)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _flush_everything() -> None:
    import logging

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()


# --- the workflow's side ----------------------------------------------------------------------


def start(first: Sequence[str], then: Sequence[str] = (), *, log: str | Path) -> str | None:
    """Start the fork server (Snakefile `onstart:`) with the modules in `first` imported before
    it serves and `then` imported while it serves (see serve); point this process's future jobs
    at it; returns the socket path. The server ends with `stop()` or with this process.

    A server that does not come up (e.g. a socket path too long under $TMPDIR) is a warning,
    not an error: the jobs then run in their own processes, only slower; None."""
    global _server, _server_dir
    if _server is not None:
        return os.environ[SOCKET_ENV]
    _server_dir = tempfile.mkdtemp(prefix="servesweep-fs-")  # mode 0700: this user only
    path = os.path.join(_server_dir, "socket")
    Path(log).parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        _server = subprocess.Popen(
            [sys.executable, "-m", "servesweep.forkserver", path, ",".join(first), ",".join(then)],
            stdin=subprocess.DEVNULL,
            env={**os.environ, **SERVER_ENV},
            stdout=out,
            stderr=subprocess.STDOUT,
            # Its own group (a terminal's Ctrl-C is for the jobs), in this session (its
            # children can join their job process's group).
            process_group=0,
        )
    deadline = time.monotonic() + START_TIMEOUT_S
    while not os.path.exists(path):
        if _server.poll() is not None or time.monotonic() > deadline:
            stop()
            print(
                f"servesweep: the fork server did not start (see {log}); every job runs in "
                "its own process",
                file=sys.stderr,
            )
            return None
        time.sleep(0.01)
    os.environ[SOCKET_ENV] = path
    return path


def stop() -> None:
    """End the fork server (Snakefile `onsuccess:`/`onerror:`); running jobs are not touched."""
    global _server, _server_dir
    os.environ.pop(SOCKET_ENV, None)
    if _server is not None:
        _server.terminate()
        try:
            _server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            _server.kill()
            _server.wait()
        _server = None
    if _server_dir is not None:
        shutil.rmtree(_server_dir, ignore_errors=True)
        _server_dir = None


if __name__ == "__main__":
    path, first, then = sys.argv[1:]
    serve(path, first.split(",") if first else [], then.split(",") if then else [])
