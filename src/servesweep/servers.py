"""Server lifecycle: lazy, fingerprinted, one server set at a time (DESIGN.md section 5)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from servesweep import logscan
from servesweep.config import SINGLE_ROLE, Experiment, ServerSpec
from servesweep.engines import ROUTER_ROLE, RankCommand, base_url, rank_commands, role_url
from servesweep.errors import ServerDied, ServerStartError
from servesweep.events import EventLog
from servesweep.files import write_json_atomic, write_text_atomic
from servesweep.paths import RunPaths
from servesweep.runtime import ONESHOT_DIR, Launch, ProcessRuntime, Runtime
from servesweep.transport import LocalTransport, Transport

logger = logging.getLogger(__name__)

POLL_S = 0.2
FATAL_SCAN_EVERY_S = 2.0


@dataclass
class RankState:
    """One running process of a server set: where it runs and how to find it again."""

    role: str
    node: str
    rank: int
    handle: str
    log_path: str
    url: str | None = None  # the role's HTTP endpoint, on rank 0 and the router
    identity: str = ""  # Runtime.identity at start: a reused pid or id is not ours


@dataclass
class ServerState:
    """The server set currently running for a run (persisted in service/current.json)."""

    fingerprint: str
    server_id: str
    base_url: str
    ranks: list[RankState] = field(default_factory=list)
    started_at: float = 0.0
    ready_at: float | None = None

    @classmethod
    def load(cls, path: Path) -> ServerState | None:
        if not path.exists():
            return None
        data = json.loads(path.read_text())
        data["ranks"] = [RankState(**r) for r in data["ranks"]]
        return cls(**data)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def log_name(role: str, node: str) -> str:
    """File name of one process's log in service/<server>/."""
    return f"{node}.log" if role == SINGLE_ROLE else f"{role}-{node}.log"


def http_status(url: str, timeout: float = 2.0) -> int | None:
    """HTTP status of a GET, or None when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError, TimeoutError):
        return None


def http_json(url: str, timeout: float = 5.0) -> Any:
    """GET a JSON document (None on any failure)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return json.loads(resp.read())
    except (urllib.error.URLError, OSError, TimeoutError, ValueError):
        return None


class ServerManager:
    """Ensures the right server set runs for a cell; stops it on exit."""

    def __init__(
        self,
        exp: Experiment,
        paths: RunPaths,
        *,
        transport: Transport,
        runtime: Runtime,
        events: EventLog | None = None,
    ) -> None:
        self.exp = exp
        self.paths = paths
        self.transport = transport
        self.runtime = runtime
        self.events = events or EventLog(paths.orchestrator_log)

    # ------------------------------------------------------------ naming
    def labels(self, spec: ServerSpec | None = None) -> dict[str, str]:
        labels = {"run": self.exp.run_id}
        if spec is not None:
            labels |= {"fingerprint": spec.fingerprint}
        return labels

    def node_log_path(self, server_id: str, role: str, node: str) -> str:
        """Where a process writes its log on its node."""
        if self.exp.cluster.transport == "local":
            return str(self.local_log_path(server_id, role, node).resolve())
        return f"{ONESHOT_DIR}/{self.exp.run_id}/{server_id}/{log_name(role, node)}"

    def local_log_path(self, server_id: str, role: str, node: str) -> Path:
        return self.paths.service(server_id) / log_name(role, node)

    def launches(self, spec: ServerSpec) -> list[tuple[RankCommand, Launch]]:
        """Every process of a server set in start order, with its launch."""
        out = []
        for cmd in rank_commands(self.exp, spec):
            labels = self.labels(spec) | {
                "server": spec.id,
                "role": cmd.role,
                "rank": str(cmd.rank),
            }
            launch = Launch(
                name=f"servesweep-{self.exp.run_id}-{spec.fingerprint}-{cmd.role}-r{cmd.rank}",
                node=cmd.node,
                argv=cmd.argv,
                log_path=self.node_log_path(spec.id, cmd.role, cmd.node),
                env=cmd.env,
                labels=labels,
            )
            out.append((cmd, launch))
        return out

    def commands_script(self, spec: ServerSpec) -> str:
        """service/<server>/commands.sh: the exact command run on each node, in start order."""
        lines = ["#!/bin/sh", f"# server {spec.id} fingerprint {spec.fingerprint}"]
        for cmd, launch in self.launches(spec):
            lines.append(f"# role {cmd.role} rank {cmd.rank} node {cmd.node}")
            lines.append(self.runtime.command_line(launch))
        return "\n".join(lines) + "\n"

    def _url(self, spec: ServerSpec, cmd: RankCommand) -> str | None:
        if cmd.role == ROUTER_ROLE:
            return base_url(self.exp, spec)
        if cmd.rank != 0:
            return None
        return role_url(self.exp, next(r for r in spec.roles if r.name == cmd.role))

    # ------------------------------------------------------------ lifecycle
    def current(self) -> ServerState | None:
        return ServerState.load(self.paths.current_server)

    def ensure(self, spec: ServerSpec) -> tuple[ServerState, bool]:
        """Reuse the running set if it has `spec`'s fingerprint and is healthy, else restart.

        Returns the state and whether it was started just now."""
        state = self.current()
        if state is not None and state.fingerprint == spec.fingerprint:
            if self._healthy(state):
                self.events.emit("reuse", fp=spec.fingerprint, server=spec.id)
                return state, False
            self.events.emit("unhealthy", fp=state.fingerprint, server=state.server_id)
        if state is not None:
            reason = "fingerprint change" if state.fingerprint != spec.fingerprint else "unhealthy"
            self.stop(state, reason=reason)
        self._remove_stale()
        return self.start(spec), True

    def start(self, spec: ServerSpec) -> ServerState:
        """Start role by role (prefill, decode, router), each ready before the next;
        on failure stop everything that started."""
        service = self.paths.service(spec.id)
        service.mkdir(parents=True, exist_ok=True)
        write_text_atomic(service / "commands.sh", self.commands_script(spec))
        state = ServerState(
            fingerprint=spec.fingerprint,
            server_id=spec.id,
            base_url=base_url(self.exp, spec),
            started_at=time.time(),
        )
        self.transport.check_reachable(self.exp.cluster.nodes)
        self.events.emit(
            "start", fp=spec.fingerprint, server=spec.id, nodes=",".join(self.exp.cluster.nodes)
        )
        try:
            launches = self.launches(spec)
            for role in dict.fromkeys(cmd.role for cmd, _ in launches):
                role_started = time.time()
                for cmd, launch in launches:
                    if cmd.role != role:
                        continue
                    handle = self.runtime.start(launch)
                    state.ranks.append(
                        RankState(
                            cmd.role,
                            cmd.node,
                            cmd.rank,
                            handle,
                            launch.log_path,
                            self._url(spec, cmd),
                            self.runtime.identity(cmd.node, handle),
                        )
                    )
                    write_json_atomic(self.paths.current_server, state.to_dict())
                self._wait_ready(state, spec, role)
                if role != SINGLE_ROLE:
                    self.events.emit(
                        "role-ready",
                        fp=spec.fingerprint,
                        server=spec.id,
                        role=role,
                        seconds=f"{time.time() - role_started:.2f}",
                    )
        except BaseException as exc:
            self.events.emit(
                "start-failed",
                fp=spec.fingerprint,
                server=spec.id,
                error=str(exc).splitlines()[0][:200],
            )
            self.stop(state, reason="start failed")
            raise
        state.ready_at = time.time()
        write_json_atomic(self.paths.current_server, state.to_dict())
        write_json_atomic(service / "server.json", state.to_dict())
        info = http_json(f"{state.ranks[0].url}/server_info")
        if info is not None:
            write_json_atomic(service / "server_info.json", info)
        self.events.emit(
            "ready",
            fp=spec.fingerprint,
            server=spec.id,
            seconds=f"{state.ready_at - state.started_at:.2f}",
        )
        return state

    def _wait_ready(self, state: ServerState, spec: ServerSpec, role: str) -> None:
        """Wait until `role`'s endpoint answers /health 200 (and, for an engine, rank 0 has
        logged SGLang's ready line); fail fast on a dead rank or a fatal log pattern."""
        head = next(r for r in state.ranks if r.role == role and r.url)
        deadline = time.monotonic() + self.exp.engine.ready_timeout_s
        next_scan = 0.0
        while True:
            if http_status(f"{head.url}/health") == 200:
                if role == ROUTER_ROLE:
                    break
                log = self.runtime.logs(head.node, head.handle, head.log_path)
                if logscan.READY_LINE in log:
                    break
            now = time.monotonic()
            if now >= next_scan:
                self._check_ranks(state, starting=True)
                next_scan = now + FATAL_SCAN_EVERY_S
            if now > deadline:
                text = self.runtime.logs(head.node, head.handle, head.log_path)
                raise ServerStartError(
                    f"server {spec.id} (fp {spec.fingerprint}) {role} not ready after "
                    f"{self.exp.engine.ready_timeout_s:.0f}s: no /health 200"
                    f"{'' if role == ROUTER_ROLE else ' + ready line'} on node {head.node}; "
                    f"log {self._keep_failed_log(spec.id, head, text)}"
                )
            time.sleep(POLL_S)
        self._check_ranks(state, starting=True)

    def _check_ranks(self, state: ServerState, *, starting: bool) -> None:
        """Save every process's log; raise naming node and log if one died or logged a
        fatal pattern. A process that exited is reported first: it is the cause, the fatal
        lines of the others (e.g. rank 0's NCCL error) are its consequence."""
        error = ServerStartError if starting else ServerDied
        texts = {}
        for rank in state.ranks:
            texts[rank.role, rank.rank] = self.runtime.logs(rank.node, rank.handle, rank.log_path)
            self._save_log(state.server_id, rank, texts[rank.role, rank.rank])
        exited = [r for r in state.ranks if not self.runtime.is_running(r.node, r.handle)]
        # A process that died silently (killed, node lost) is the cause; one that exited
        # logging a fatal line after it (rank 0's NCCL error) is the consequence.
        silent = [r for r in exited if not logscan.fatal_findings(texts[r.role, r.rank])]
        exited = silent + [r for r in exited if r not in silent]
        for rank in exited or state.ranks:
            text = texts[rank.role, rank.rank]
            findings = logscan.fatal_findings(text)
            if not findings and rank not in exited:
                continue
            where = (
                f"server {state.server_id} (fp {state.fingerprint}) {rank.role} rank "
                f"{rank.rank} on node {rank.node}"
            )
            log = self._keep_failed_log(state.server_id, rank, text)
            if findings:
                first = findings[0]
                cause = (
                    f"fatal pattern '{first.name}' at line {first.line_no}: "
                    f"{first.line.strip()[:160]}"
                )
            else:
                cause = "exited"
            if rank in exited and findings:
                cause = f"exited; {cause}"
            raise error(f"{where}: {cause}; log {log}")

    def _keep_failed_log(self, server_id: str, rank: RankState, text: str) -> Path:
        """A copy of a failed process's log that a later start will not overwrite."""
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        target = self.local_log_path(server_id, rank.role, rank.node)
        kept = target.with_name(f"{target.name}.failed-{stamp}")
        write_text_atomic(kept, text)
        return kept

    def check_alive(self, state: ServerState) -> None:
        """After a cell: every process running, no fatal pattern, the entry point healthy."""
        self._check_ranks(state, starting=False)
        if http_status(f"{state.base_url}/health", timeout=30.0) != 200:
            head = state.ranks[0]
            raise ServerDied(
                f"server {state.server_id} (fp {state.fingerprint}) at {state.base_url} is "
                f"unhealthy (/health not 200); log "
                f"{self.local_log_path(state.server_id, head.role, head.node)}"
            )

    def _healthy(self, state: ServerState) -> bool:
        try:
            self.check_alive(state)
        except (ServerDied, ServerStartError):
            return False
        return True

    def _save_log(self, server_id: str, rank: RankState, text: str) -> None:
        target = self.local_log_path(server_id, rank.role, rank.node)
        if str(target.resolve()) != rank.log_path:
            write_text_atomic(target, text)

    def stop(self, state: ServerState, *, reason: str) -> None:
        """Collect every rank's log, stop every rank (in parallel), forget the state."""

        def _stop(rank: RankState) -> None:
            try:
                text = self.runtime.logs(rank.node, rank.handle, rank.log_path)
                self._save_log(state.server_id, rank, text)
            finally:
                self._stop_if_ours(state, rank)

        with ThreadPoolExecutor(max_workers=max(1, len(state.ranks))) as pool:
            list(pool.map(_stop, state.ranks))
        current = self.current()
        if current is not None and current.fingerprint == state.fingerprint:
            self.paths.current_server.unlink(missing_ok=True)
        self.events.emit("stop", fp=state.fingerprint, server=state.server_id, reason=reason)

    def _stop_if_ours(self, state: ServerState, rank: RankState) -> None:
        """Signal a rank only if it provably is the one we started (labels in its env or on its
        container, and its start time); a reused pid of another process is left alone."""
        labels = {"run": self.exp.run_id, "fingerprint": state.fingerprint}
        if self.runtime.owns(rank.node, rank.handle, labels, rank.identity):
            self.runtime.stop(rank.node, rank.handle)
            return
        if not self.runtime.is_running(rank.node, rank.handle):
            return  # gone: nothing to signal
        kind = "process" if self.exp.runtime.kind == "process" else "container"
        self.events.emit("not-ours", node=rank.node, handle=rank.handle, server=state.server_id)
        logger.warning(
            "node %s: %s %s is not server %s of run %s (labels or start time differ): left alone",
            rank.node,
            kind,
            rank.handle,
            state.server_id,
            self.exp.run_id,
        )

    def _remove_stale(self) -> None:
        """Remove processes/containers of this run found by label (after a hard kill)."""
        labels = self.labels()
        for node in self.exp.cluster.nodes:
            for handle in self.runtime.find(node, labels):
                self.events.emit("stale", node=node, handle=handle, run=self.exp.run_id)
                self.runtime.stop(node, handle)

    def stop_all(self, *, reason: str) -> None:
        """Stop the current server set and any stale one of this run."""
        state = self.current()
        if state is not None:
            self.stop(state, reason=reason)
        self._remove_stale()

    def status(self) -> list[dict[str, str]]:
        """Per node and rank: handle, running, health (rank 0)."""
        state = self.current()
        if state is None:
            return []
        rows = []
        for rank in state.ranks:
            running = self.runtime.is_running(rank.node, rank.handle)
            health = str(http_status(f"{rank.url}/health") or "no answer") if rank.url else ""
            rows.append(
                {
                    "role": rank.role,
                    "server": state.server_id,
                    "fp": state.fingerprint,
                    "node": rank.node,
                    "rank": str(rank.rank),
                    "handle": rank.handle,
                    "running": str(running),
                    "health": health,
                }
            )
        return rows


def open_transport(exp: Experiment) -> Transport:
    """The transport the experiment's cluster is reached with."""
    if exp.cluster.transport == "local":
        return LocalTransport()
    from servesweep.ssh import SshTransport

    return SshTransport(exp.cluster.ssh, nodes=exp.cluster.nodes)


def open_runtime(exp: Experiment, transport: Transport, *, for_commands: bool = False) -> Runtime:
    """The runtime servers live in on each node (`for_commands`: no password is read)."""
    if exp.runtime.kind == "process":
        return ProcessRuntime(transport)
    from servesweep.runtime import DockerRuntime
    from servesweep.secrets import sudo_password

    password = sudo_password(os.environ) if exp.runtime.sudo and not for_commands else None
    return DockerRuntime(transport, exp.runtime, sudo_password=password, gpus=exp.runtime.gpus)


@contextlib.contextmanager
def connect(exp: Experiment, paths: RunPaths) -> Iterator[ServerManager]:
    """A ServerManager over a fresh transport, closed on exit."""
    transport = open_transport(exp)
    try:
        yield ServerManager(exp, paths, transport=transport, runtime=open_runtime(exp, transport))
    finally:
        transport.close()


def shutdown(exp: Experiment, paths: RunPaths, *, reason: str) -> None:
    """Stop every server of the run (workflow onsuccess/onerror, `servesweep down`)."""
    with connect(exp, paths) as manager:
        manager.stop_all(reason=reason)
