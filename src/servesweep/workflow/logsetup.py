"""A job's process edge: logging and stderr go to the rule's log; errors end it in one line."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from servesweep.core.errors import ServesweepError, Terminated

logger = logging.getLogger(__name__)

INTERRUPTED = 130  # exit status of a process ended by SIGINT, as the shell reports it
# OSErrors that describe this host, not a bug: shown as one line like a ServesweepError.
HOST_ERRNOS = frozenset(
    {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO, errno.EMFILE}
)
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# The terminal's stderr while job_logging sends fd 2 to the rule's log (console() writes there).
_terminal: int | None = None


def console(line: str) -> None:
    """One line on the terminal (Snakemake's console), also inside job_logging, where stderr
    is the rule's log; the log gets it too."""
    logger.info("console: %s", line)
    data = (line.rstrip("\n") + "\n").encode()
    if _terminal is None:
        sys.stderr.write(data.decode())
        sys.stderr.flush()
    else:
        os.write(_terminal, data)


def _raise_terminated(signum: int, _frame: object) -> None:
    raise Terminated(f"stopped by {signal.Signals(signum).name}", signum)


def terminate_on_hangup() -> None:
    """SIGTERM and SIGHUP raise Terminated in a job's process (main thread only; elsewhere,
    as in a test's thread, the handlers stay as they are)."""
    for sig in (signal.SIGTERM, signal.SIGHUP):
        with contextlib.suppress(ValueError):
            signal.signal(sig, _raise_terminated)


def hangup_like_sigterm() -> None:
    """Snakemake's process (`onstart:`): SIGHUP gets the SIGTERM handler Snakemake installed
    (graceful stop: jobs ended, `onerror` stops the servers); by default SIGHUP kills it at once
    and leaves servers and the lock behind."""
    signal.signal(signal.SIGHUP, signal.getsignal(signal.SIGTERM))


def _failure(exc: BaseException) -> tuple[str, int] | None:
    """The one line and exit status of an expected failure; None for a bug."""
    if isinstance(exc, ServesweepError):
        return f"servesweep: {type(exc).__name__}: {exc}", 1
    if isinstance(exc, OSError) and exc.errno in HOST_ERRNOS:
        return f"servesweep: {type(exc).__name__}: {exc}", 1
    if isinstance(exc, Terminated):
        return f"servesweep: Terminated: {exc}", 128 + int(exc.signum)
    if isinstance(exc, KeyboardInterrupt):
        return f"servesweep: Interrupted: {str(exc) or 'stopped by SIGINT (Ctrl-C)'}", INTERRUPTED
    return None


@contextlib.contextmanager
def job_logging(log_path: str | Path) -> Iterator[None]:
    """Run a job's body with `logging` and this process's stderr (fd 2: warnings, tracebacks,
    subprocesses) written to `log_path`, the rule's `log:` (emptied first; opened for append,
    so code that appends its own lines to the same file, as the image checks do, is kept).

    A ServesweepError or an OSError of this host (disk full, read-only, permission denied)
    ends the process with status 1, Ctrl-C with 130, as one line at the end of the log and on
    the terminal (not the whole log: a failed cell's bench log holds the client's table). Any
    other exception is logged with its traceback and propagates (its traceback also reaches
    the terminal).
    """
    path = Path(log_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    failure: tuple[str, int] | None = None
    sys.stderr.flush()
    global _terminal
    terminal = os.dup(2)
    _terminal = terminal
    root = logging.getLogger()
    path.write_text("")  # this run of the job only; then O_APPEND, so writers can share it
    with open(path, "a", buffering=1) as fh:
        os.dup2(fh.fileno(), 2)
        handler = logging.StreamHandler(fh)
        handler.setFormatter(logging.Formatter(FORMAT))
        saved = root.handlers[:], root.level
        root.handlers[:] = [handler]
        root.setLevel(logging.INFO)
        started = time.monotonic()
        logger.info("job started (pid %d)", os.getpid())
        try:
            terminate_on_hangup()
            yield
            logger.info("job done in %.2f s", time.monotonic() - started)
        except SystemExit:
            raise
        except BaseException as exc:
            failure = _failure(exc)
            if failure is None:
                logger.exception("job failed")
                raise
            logger.debug("traceback", exc_info=True)
            fh.write(failure[0] + "\n")
        finally:
            root.handlers[:], level = saved
            root.setLevel(level)
            sys.stderr.flush()
            os.dup2(terminal, 2)
            os.close(terminal)
            _terminal = None
    if failure is not None:
        print(failure[0], file=sys.stderr, flush=True)
        sys.exit(failure[1])
