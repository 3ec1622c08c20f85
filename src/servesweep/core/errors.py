"""One exception type per failure kind; each carries the cell, node and log it concerns."""

from __future__ import annotations

import signal


class ServesweepError(Exception):
    """Base class of every error this package raises on purpose: `what` went wrong and, where
    known, where: the `cell`, the `node`, the `log` that holds it (as it reads in the line:
    `log P`, `bench log P`, `logs: P, Q`). str() composes the one line, each part only when
    given: `cell C: what; node N; log P` (a `what` that names its node already gets no second).
    """

    def __init__(
        self,
        what: str = "",
        *,
        cell: str | None = None,
        node: str | None = None,
        log: str | None = None,
    ) -> None:
        super().__init__(what)
        self.what, self.cell, self.node, self.log = what, cell, node, log

    def __str__(self) -> str:
        parts = [f"cell {self.cell}: {self.what}" if self.cell else self.what]
        if self.node and f"node {self.node}" not in self.what:
            parts.append(f"node {self.node}")
        if self.log:
            parts.append(self.log)
        return "; ".join(parts)

    def __reduce__(self):  # pickled across a process pool with its fields
        return (_rebuilt, (type(self), self.what, self.cell, self.node, self.log))

    def with_context(self, **fields: str | None) -> ServesweepError:
        """A copy of this error (same type) with `fields` (what, cell, node, log) where it has
        none yet; `what` and `log` given replace (a log path moved to its kept copy)."""
        cell, node = fields.get("cell"), fields.get("node")
        return _rebuilt(
            type(self),
            fields.get("what") or self.what,
            self.cell or cell,
            self.node or node,
            fields.get("log") or self.log,
        )


def _rebuilt(
    kind: type[ServesweepError], what: str, cell: str | None, node: str | None, log: str | None
) -> ServesweepError:
    """An error of `kind` from its fields (a subclass with an __init__ of its own gets what
    alone, then its fields)."""
    try:
        return kind(what, cell=cell, node=node, log=log)
    except TypeError:
        exc = kind(what)
        exc.cell, exc.node, exc.log = cell, node, log
        return exc


class ConfigError(ServesweepError):
    """The experiment configuration is invalid (the message names the key)."""


class TransportError(ServesweepError):
    """A node could not be reached or a command on it failed."""


class Unreachable(TransportError):
    """A node could not be reached at all (connection, host key, authentication): the message
    ends with DOCTOR_HINT."""


# What an Unreachable error tells the user to run: doctor checks every node (ssh, docker, GPUs).
DOCTOR_HINT = "run `servesweep doctor` to check every node"


class ServerStartError(ServesweepError):
    """A server did not start or did not become ready."""


class DryFireFailed(ServerStartError):
    """The dry fire (dummy weights, the same topology, one request) failed: the real start
    would have too, after its full cost."""


class ServerDied(ServesweepError):
    """A running server stopped answering or logged a fatal pattern."""


class ClientError(ServesweepError):
    """The load generator failed to produce a record."""


class CellFailed(ServesweepError):
    """A cell-repeat's record failed validation (failed requests, wrong lengths, ...)."""


class ProbeFailed(ServesweepError):
    """The equivalence probe got no usable answer from a server config."""


class SmokeFailed(ServesweepError):
    """An image capability smoke test failed."""


class SecretError(ServesweepError):
    """The sudo password is missing or its file is unsafe."""


class PreflightFailed(ServesweepError):
    """A check before any server start failed (ports, IB devices, image, P/D agreement), or
    its evidence is missing when a cell is about to run."""


class ServerConflict(ServesweepError):
    """Another owner's server holds a node or port a server of this run needs."""


class NodeShared(ServesweepError):
    """A node a server set needs holds a server of another pool of this run (labels say so)."""


class PoolStopped(ServesweepError):
    """A cell of a pool whose earlier cell failed in this invocation: it does not start."""


class ServerStalled(ServesweepError):
    """A server stopped making progress (or answering /health) while a cell's client ran."""


class ServerBusy(ServesweepError):
    """A server still reports running or queued requests before a cell's client starts."""


class RunLocked(ServesweepError):
    """Another live snakemake of the same run holds it: this one stops before touching
    anything."""


class WorkerDied(ServesweepError):
    """A worker process of a job's process pool died without an answer (SIGKILL: the OOM
    killer, `kill -9`); the job wrote nothing and is run again as it was."""


class Terminated(BaseException):
    """SIGTERM or SIGHUP (a dropped SSH session) ended a job: raised like KeyboardInterrupt, so
    the cleanup of Ctrl-C runs (cell-failed event, partial files removed)."""

    def __init__(self, message: str, signum: int = signal.SIGTERM) -> None:
        super().__init__(message)
        self.signum = signum


class UnsafeName(ServesweepError, ValueError):
    """A name from data, config or the environment is no single safe path segment or shell
    variable name (it would reach outside its folder or into the shell)."""
