"""Server lifecycle: lazy, fingerprinted, one server set at a time per node pool (DESIGN.md
section 5; servesweep.cluster.pools)."""

from __future__ import annotations

import contextlib
import json
import logging
import shlex
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from servesweep.cluster import http
from servesweep.cluster.access import Cluster, connected, release, service_holdings
from servesweep.cluster.owner import (
    KIND_LABEL,
    OWNER_LABEL,
    RUN_LABEL,
    SERVER_KIND,
    SERVICE_LABEL,
    Owner,
    current_owner,
)
from servesweep.cluster.pools import narrow, node_pools
from servesweep.cluster.runtime import Labelled, Launch
from servesweep.cluster.secrets import Secret, new_api_key, scrub
from servesweep.config.experiment import Experiment, dry_fire_enabled, start_waves
from servesweep.config.matrix import ServerSpec, server_specs
from servesweep.config.paths import RunPaths
from servesweep.config.schema import PD_ROLES, SINGLE_ROLE
from servesweep.core.errors import DryFireFailed, ServerDied, ServerStartError, TransportError
from servesweep.core.events import EventLog
from servesweep.core.files import failed_name, write_json_atomic, write_text_atomic
from servesweep.serving import logscan
from servesweep.serving.agreement import check_pd_agreement
from servesweep.serving.dryfire import dry_spec, fire_one, first_line
from servesweep.serving.engines import API_KEY_ENV, ROUTER_ROLE, RankCommand, base_url
from servesweep.serving.launches import (
    commands_script,
    rank_launches,
    rank_url,
    resolve_ports,
    run_node_dir,
    server_labels,
    spec_nodes,
)
from servesweep.serving.neighbours import check_foreign, check_nodes_free, foreign
from servesweep.serving.state import RankState, ServerState, log_name

logger = logging.getLogger(__name__)

POLL_S = 0.2
FATAL_SCAN_EVERY_S = 2.0


class ServerManager:
    """Ensures the right server set runs for a cell; stops it on exit."""

    def __init__(
        self,
        exp: Experiment,
        paths: RunPaths,
        *,
        cluster: Cluster,
        events: EventLog | None = None,
        owner: Owner | None = None,
        pool: int = 0,
    ) -> None:
        self.exp = exp  # narrowed to the pool's nodes (servesweep.cluster.pools.narrow)
        self.pool = pool
        self.paths = paths
        self.cluster = cluster
        self.transport = cluster.transport
        self.runtime = cluster.runtime
        self.events = events or EventLog(paths.orchestrator_log)
        self.owner = owner or current_owner(paths.root.parent)
        # `servesweep up`: what starts is a service (labelled, recorded in paths.services).
        self.service_mode = False
        # API keys of server sets by id: made at start, or read back from the entry process's
        # environment (a later job, a service); only ever in memory here (docs/access.md).
        self._keys: dict[str, Secret | None] = {}

    # ------------------------------------------------------------ naming
    def labels(self, spec: ServerSpec | None = None) -> dict[str, str]:
        """Labels of this caller's servers: kind, run and owner (+ fingerprint of `spec`)."""
        return server_labels(self.exp, self.owner, self.pool, spec, service=self.service_mode)

    def node_dir(self) -> str:
        """This owner's and run's directory on a node: two checkouts never share it."""
        return run_node_dir(self.exp, self.owner)

    def node_log_path(self, server_id: str, role: str, node: str) -> str:
        """Where a process writes its log on its node."""
        if self.cluster.local:
            return str(self.local_log_path(server_id, role, node).resolve())
        return f"{self.node_dir()}/{server_id}/{log_name(role, node)}"

    def local_log_path(self, server_id: str, role: str, node: str) -> Path:
        return self.paths.service(server_id) / log_name(role, node)

    def launches(
        self, spec: ServerSpec, key: Secret | None = None
    ) -> list[tuple[RankCommand, Launch]]:
        """Every process of a server set in start order, with its launch."""
        return rank_launches(
            self.exp,
            spec,
            labels=self.labels(spec),
            owner=self.owner,
            pool=self.pool,
            log_path=lambda role, node: self.node_log_path(spec.id, role, node),
            key=key,
        )

    def commands_script(self, spec: ServerSpec) -> str:
        """service/<server>/commands.sh: the exact command run on each node, in start order."""
        return commands_script(spec, self.launches(spec), self.runtime)

    # ------------------------------------------------------------ lifecycle
    def current(self) -> ServerState | None:
        """The server set this run started (service/current.json)."""
        return ServerState.load(self.paths.current_server_of(self.pool))

    def service(self, fingerprint: str) -> ServerState | None:
        """The service with this fingerprint that `servesweep up` left running, if any."""
        return ServerState.load(self.paths.service_record(fingerprint))

    def _state_file(self, state: ServerState) -> Path:
        if state.service:
            return self.paths.service_record(state.fingerprint)
        return self.paths.current_server_of(self.pool)

    def ensure(self, spec: ServerSpec) -> tuple[ServerState, bool]:
        """Reuse a healthy server with `spec`'s fingerprint (this run's, or a service brought
        up by `servesweep up`, whatever run started it), else start one.

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
        service = self.service(spec.fingerprint)
        if service is not None:
            if self._healthy(service):
                self.events.emit(
                    "reuse", fp=spec.fingerprint, server=spec.id, service=spec.fingerprint
                )
                self._note_use(spec.fingerprint)
                return service, False
            self.events.emit("unhealthy", fp=spec.fingerprint, service=spec.fingerprint)
            self.stop(service, reason="service unhealthy")
        self._remove_stale()
        return self.start(spec), True

    def _note_use(self, fingerprint: str) -> None:
        """Add this run to the service's list of runs that used it (once per run)."""
        path = self.paths.service_runs(fingerprint)
        seen = path.read_text().split() if path.exists() else []
        if self.exp.run_id not in seen:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            write_text_atomic(
                path,
                "".join(
                    f"{line}\n"
                    for line in [
                        *(path.read_text().splitlines() if path.exists() else []),
                        f"{stamp} {self.exp.run_id}",
                    ]
                ),
            )

    def service_runs(self, fingerprint: str) -> list[str]:
        path = self.paths.service_runs(fingerprint)
        return [line.split()[1] for line in path.read_text().splitlines()] if path.exists() else []

    def start(self, spec: ServerSpec) -> ServerState:
        """Start wave by wave (config.experiment.start_waves: PD engines together unless they
        share a GPU, then the router), each wave ready before the next; on failure stop
        everything that started. "auto" ports are picked now."""
        spec = resolve_ports(spec)
        service = self.paths.service(spec.id)
        service.mkdir(parents=True, exist_ok=True)
        write_text_atomic(service / "commands.sh", self.commands_script(spec))
        state = ServerState(
            fingerprint=spec.fingerprint,
            server_id=spec.id,
            base_url=base_url(self.exp, spec),
            service=self.service_mode,
            owner=self.owner.label,
            run_id=self.exp.run_id,
        )
        self.transport.check_reachable(self.exp.cluster.nodes)
        check_foreign(self.runtime, self.exp, spec, owner=self.owner)
        check_nodes_free(self.runtime, self.exp, spec, owner=self.owner, pool=self.pool)
        if dry_fire_enabled(self.exp):
            self.dry_fire(spec, self._state_file(state))
        state.started_at = time.time()  # the start proper: `ready seconds` counts from here
        self.events.emit(
            "start",
            fp=spec.fingerprint,
            server=spec.id,
            nodes=",".join(spec_nodes(spec)),
            pool=self.pool,
            owner=self.owner.label,
        )
        try:
            self._run_waves(spec, state, self._state_file(state))
        except BaseException as exc:
            self.events.emit(
                "start-failed",
                fp=spec.fingerprint,
                server=spec.id,
                error=str(exc).splitlines()[0][:200],
            )
            self.stop(state, reason="start failed")
            raise
        self._record_ready(state, spec)
        return state

    def _record_ready(self, state: ServerState, spec: ServerSpec) -> None:
        """The set is up: where its start went (rank 0's log), the state and server.json, the
        engine's own /server_info (its key masked), and the `ready` event."""
        state.ready_at = time.time()
        total = state.ready_at - state.started_at
        head = state.ranks[0]
        phases = logscan.startup_phases(
            self.runtime.logs(head.node, head.handle, head.log_path), total
        )
        state.start_phases = {"ready_s": round(total, 2), **phases}
        write_json_atomic(self._state_file(state), state.to_dict())
        if state.service:
            self._note_use(spec.fingerprint)
        service = self.paths.service(spec.id)
        write_json_atomic(service / "server.json", state.to_dict())
        key = self.api_key(state)
        info = http.get_json(f"{head.url}/server_info", key=key)
        if info is not None:  # SGLang reports its api_key (and launch command): masked
            write_text_atomic(service / "server_info.json", scrub(json.dumps(info, indent=2), key))
        self.events.emit(
            "ready",
            fp=spec.fingerprint,
            server=spec.id,
            seconds=f"{total:.2f}",
            **{name: f"{value:.1f}" for name, value in phases.items()},
        )

    def _run_waves(
        self, spec: ServerSpec, state: ServerState, state_file: Path, *, events: str = ""
    ) -> None:
        """Launch `spec` wave by wave (config.experiment.start_waves), each ready before the
        next; the PD agreement once both engines are up. Raises as the first failure does.
        `events`: a prefix of its event names (the dry fire's `dry-fire-`)."""
        key = new_api_key()
        self._keys[spec.id] = key
        launches = self.launches(spec, key)
        if not any(launch.secret_env for _, launch in launches):
            self._keys[spec.id] = None
        waves = start_waves(
            self.exp.cluster,
            [(role.name, role.nodes) for role in spec.roles],
            router=ROUTER_ROLE if spec.router else None,
        )
        for wave, roles in enumerate(waves, 1):
            wave_started = time.time()
            for cmd, launch in launches:
                if cmd.role not in roles:
                    continue
                handle = self.runtime.start(launch)
                state.ranks.append(
                    RankState(
                        cmd.role,
                        cmd.node,
                        cmd.rank,
                        handle,
                        launch.log_path,
                        rank_url(self.exp, spec, cmd),
                        self.runtime.identity(cmd.node, handle),
                    )
                )
                write_json_atomic(state_file, state.to_dict())
            ready_at = self._wait_ready(state, spec, roles)
            if PD_ROLES[-1] in roles:  # both engines up, before the router and any request
                agreed = check_pd_agreement(state)
                self.events.emit(f"{events}pd-agreement", fp=spec.fingerprint, **agreed)
            for role in roles:
                if role != SINGLE_ROLE:
                    self.events.emit(
                        f"{events}role-ready",
                        fp=spec.fingerprint,
                        server=spec.id,
                        role=role,
                        seconds=f"{ready_at[role] - wave_started:.2f}",
                        wave=wave,
                    )

    def dry_fire(self, spec: ServerSpec, state_file: Path) -> float:
        """Start `spec`'s topology with dummy weights and one layer per pipeline stage
        (serving.dryfire.dry_spec), send it one request (through the router for PD), require the
        PD agreement and the enforced log evidence, and tear it down; DryFireFailed naming role,
        node and log otherwise. Returns its seconds."""
        dry = dry_spec(spec)
        started = time.time()
        self.events.emit("dry-fire", fp=spec.fingerprint, server=spec.id)
        write_text_atomic(
            self.paths.service(spec.id) / "dry-fire-commands.sh",
            commands_script(dry, self.launches(dry), self.runtime),
        )
        state = ServerState(
            fingerprint=dry.fingerprint,
            server_id=spec.id,
            base_url=base_url(self.exp, dry),
            service=False,
            owner=self.owner.label,
            run_id=self.exp.run_id,
        )
        try:
            self._run_waves(dry, state, state_file, events="dry-fire-")
            fire_one(self.exp, state, key=self._keys.get(spec.id), read=self._read_log)
        except (ServerStartError, ServerDied) as exc:
            self.events.emit(
                "dry-fire-failed", fp=spec.fingerprint, server=spec.id, error=first_line(exc)
            )
            raise DryFireFailed(f"dry fire of server {spec.id}: {first_line(exc)}") from None
        finally:
            self.stop(state, reason="dry fire")
        seconds = time.time() - started
        self.events.emit("dry-fire-done", fp=spec.fingerprint, seconds=f"{seconds:.2f}")
        return seconds

    def _read_log(self, rank: RankState) -> str:
        return self.runtime.logs(rank.node, rank.handle, rank.log_path)

    def _wait_ready(
        self, state: ServerState, spec: ServerSpec, roles: tuple[str, ...]
    ) -> dict[str, float]:
        """Wait until every role of `roles` answers /health 200 (and, for an engine, its rank 0
        has logged SGLang's ready line); fail fast on a dead rank or a fatal log pattern. Returns
        when each role was first seen ready (time.time())."""
        heads = {role: next(r for r in state.ranks if r.role == role and r.url) for role in roles}
        ready_at: dict[str, float] = {}
        deadline = time.monotonic() + self.exp.engine.ready_timeout_s
        next_scan = 0.0
        while True:
            for role, head in heads.items():
                if role not in ready_at and self._role_ready(role, head):
                    ready_at[role] = time.time()
            if len(ready_at) == len(heads):
                break
            now = time.monotonic()
            if now >= next_scan:
                self._check_ranks(state, starting=True)
                next_scan = now + FATAL_SCAN_EVERY_S
            if now > deadline:
                role, head = next((r, h) for r, h in heads.items() if r not in ready_at)
                text = self.runtime.logs(head.node, head.handle, head.log_path)
                raise ServerStartError(
                    f"server {spec.id} (fp {spec.fingerprint}) {role} not ready after "
                    f"{self.exp.engine.ready_timeout_s:.0f}s: no /health 200"
                    f"{'' if role == ROUTER_ROLE else ' + ready line'} on node {head.node}; "
                    f"log {self._keep_failed_log(spec.id, head, text)}"
                )
            time.sleep(POLL_S)
        self._check_ranks(state, starting=True)
        return ready_at

    def _role_ready(self, role: str, head: RankState) -> bool:
        """/health answers 200 and, for an engine, its log holds SGLang's ready line."""
        if http.status(f"{head.url}/health") != 200:
            return False
        if role == ROUTER_ROLE:
            return True
        return logscan.READY_LINE in self.runtime.logs(head.node, head.handle, head.log_path)

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
        # A running process's log end is no silence yet (logscan.scan_text, complete).
        def fatal(rank: RankState) -> list[logscan.Finding]:
            return logscan.fatal_findings(texts[rank.role, rank.rank], complete=rank in exited)

        silent = [r for r in exited if not fatal(r)]
        exited = silent + [r for r in exited if r not in silent]
        for rank in exited or state.ranks:
            text = texts[rank.role, rank.rank]
            findings = fatal(rank)
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
            if rank in exited:
                told = self.runtime.ended(rank.node, rank.handle)
                exit_ = f"exited ({told})" if told else "exited"
                cause = f"{exit_}; {cause}" if findings else exit_
            raise error(f"{where}: {cause}; log {log}")

    def _keep_failed_log(self, server_id: str, rank: RankState, text: str) -> Path:
        """A copy of a failed process's log that a later start will not overwrite."""
        kept = failed_name(self.local_log_path(server_id, rank.role, rank.node))
        write_text_atomic(kept, scrub(text, self._keys.get(server_id)))
        return kept

    def api_key(self, state: ServerState) -> Secret | None:
        """The server set's API key (None: it has none): made at its start by this process,
        else read back from its entry process's environment over the transport (a later job of
        the run, a service of `servesweep up`); never written anywhere."""
        if state.server_id not in self._keys:
            entry = next((r for r in state.ranks if r.role == ROUTER_ROLE), None) or (
                state.ranks[0] if state.ranks else None
            )
            key = None
            if entry is not None:
                key = self.runtime.secret_env(entry.node, entry.handle, API_KEY_ENV)
            self._keys[state.server_id] = key if key is not None and key.reveal() else None
        return self._keys[state.server_id]

    def check_alive(self, state: ServerState) -> None:
        """After a cell: every process running, no fatal pattern, the entry point healthy."""
        self._check_ranks(state, starting=False)
        if http.status(f"{state.base_url}/health", timeout=30.0) != 200:
            self._check_ranks(state, starting=False)  # a rank that died meanwhile is the cause
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
            write_text_atomic(target, scrub(text, self._keys.get(server_id)))

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
        self._keys.pop(state.server_id, None)
        if state.service:
            self.paths.service_record(state.fingerprint).unlink(missing_ok=True)
        else:
            current = self.current()
            if current is not None and current.fingerprint == state.fingerprint:
                self._state_file(state).unlink(missing_ok=True)
        self.events.emit(
            "stop", fp=state.fingerprint, server=state.server_id, pool=self.pool, reason=reason
        )

    def _stop_if_ours(self, state: ServerState, rank: RankState) -> None:
        """Signal a rank only if it provably is the one we started (labels in its env or on its
        container, and its start time); a reused pid of another process is left alone."""
        labels = {"run": self.exp.run_id, "fingerprint": state.fingerprint}
        if self.runtime.owns(rank.node, rank.handle, labels, rank.identity):
            self.runtime.stop(rank.node, rank.handle)
            return
        if not self.runtime.is_running(rank.node, rank.handle):
            return  # gone: nothing to signal
        kind = "container" if self.cluster.containers else "process"
        self.events.emit("not-ours", node=rank.node, handle=rank.handle, server=state.server_id)
        logger.warning(
            "node %s: %s %s is not server %s of run %s (labels or start time differ): left alone",
            rank.node,
            kind,
            rank.handle,
            state.server_id,
            self.exp.run_id,
        )

    def _remove_stale(self) -> int:
        """Remove this owner's processes/containers of this run found by label (after a hard
        kill); another owner's servers are never touched here. Returns how many."""
        labels = self.labels()
        removed = 0
        for node in self.exp.cluster.nodes:
            for found in self.runtime.labelled(node, labels):
                if found.labels.get(SERVICE_LABEL):
                    continue  # a service outlives runs: only `servesweep down` stops it
                self.events.emit("stale", node=node, handle=found.handle, run=self.exp.run_id)
                self.runtime.stop(node, found.handle)
                removed += 1
        return removed

    def remove_foreign(self, specs: list[ServerSpec]) -> list[Labelled]:
        """`servesweep down --force`: stop other owners' servers in the way of `specs`."""
        removed: dict[tuple[str, str], Labelled] = {}
        for spec in specs:
            for other in foreign(self.runtime, self.exp, spec, owner=self.owner):
                if (other.node, other.handle) in removed:
                    continue
                self.events.emit(
                    "force-stop",
                    node=other.node,
                    handle=other.handle,
                    owner=other.labels.get(OWNER_LABEL, "?"),
                    run=other.labels.get(RUN_LABEL, "?"),
                )
                self.runtime.stop(other.node, other.handle)
                removed[other.node, other.handle] = other
        return list(removed.values())

    def stop_all(self, *, reason: str, services: bool = False) -> int:
        """Stop the server set this run started and any stale one of this run (this owner's
        only); with `services`, also the services of this config's fingerprints
        (`servesweep down`), recorded or found by label. Returns how many it stopped (server
        sets and stray processes)."""
        stopped = 0
        state = self.current()
        if state is not None:
            self.stop(state, reason=reason)
            stopped += 1
        stopped += self._remove_stale()
        if not services:
            return stopped
        for spec in server_specs(self.exp):
            service = self.service(spec.fingerprint)
            if service is not None:
                self.stop(service, reason=reason)
                stopped += 1
            mine = {KIND_LABEL: SERVER_KIND, SERVICE_LABEL: spec.fingerprint, **self.owner.labels()}
            for node in self.exp.cluster.nodes:
                for handle in self.runtime.find(node, mine):
                    self.events.emit("stale", node=node, handle=handle, service=spec.fingerprint)
                    self.runtime.stop(node, handle)
                    stopped += 1
        return stopped

    def remove_node_dirs(self) -> None:
        """Once the run's servers are stopped: its directory on each node (node_dir: client
        and server logs, already copied into the run folder; smoke logs; GPU sample folders)
        goes, so nothing of the run stays under the node's /tmp. A node where something of the
        run still runs (a service of `servesweep up`, which logs there) keeps it."""
        mine = {RUN_LABEL: self.exp.run_id, **self.owner.labels()}
        folder = self.node_dir()
        for node in self.exp.cluster.nodes:
            try:
                if self.runtime.labelled(node, mine):
                    continue
                res = self.transport.run(node, f"rm -rf {shlex.quote(folder)}", timeout=60)
                why = res.stderr.strip() if not res.ok else ""
            except TransportError as exc:  # the run's own end is what gets reported
                why = str(exc)
            if why:
                logger.warning("node %s: could not remove %s: %s", node, folder, why)

    def status(self) -> list[dict[str, str]]:
        """Per server process found on the nodes by label (any owner, so also what a killed
        run left): owner, run, service, uptime and the runs that used it (from our records),
        running, health (rank 0)."""
        known: dict[tuple[str, str], tuple[ServerState, RankState]] = {}
        for spec in server_specs(self.exp):
            for state in (self.current(), self.service(spec.fingerprint)):
                if state is not None:
                    known |= {(r.node, r.handle): (state, r) for r in state.ranks}
        rows = []
        seen: set[tuple[str, str]] = set()
        for node in self.exp.cluster.nodes:
            for found in self.runtime.labelled(node, {KIND_LABEL: SERVER_KIND}):
                if found.labels.get("node", node) != node or (node, found.handle) in seen:
                    continue
                seen.add((node, found.handle))
                rows.append(self._status_row(found, known.get((node, found.handle))))
        return rows

    def _status_row(
        self, found: Labelled, known: tuple[ServerState, RankState] | None
    ) -> dict[str, str]:
        labels = found.labels
        fp = labels.get("fingerprint", "?")
        service = labels.get(SERVICE_LABEL, "")
        row = {
            "node": found.node,
            "role": labels.get("role", "?"),
            "rank": labels.get("rank", "?"),
            "server": labels.get("server", "?"),
            "fp": fp,
            "service": service or "-",
            "owner": labels.get(OWNER_LABEL, "?"),
            "mine": str(labels.get(OWNER_LABEL) == self.owner.label).lower(),
            "run": labels.get(RUN_LABEL, "?"),
            "handle": found.handle[:12],
            "running": str(self.runtime.is_running(found.node, found.handle)),
        }
        if known is not None:
            state, rank = known
            row["uptime_s"] = f"{time.time() - state.started_at:.0f}"
            if rank.url:
                row["health"] = str(http.status(f"{rank.url}/health") or "no answer")
        else:
            row["uptime_s"] = "?"
        if service and labels.get(OWNER_LABEL) == self.owner.label:
            row["used_by"] = ",".join(self.service_runs(service)) or "-"
        return row


@contextlib.contextmanager
def connect(exp: Experiment, paths: RunPaths, *, pool: int = 0) -> Iterator[ServerManager]:
    """A ServerManager (of pool `pool`, `exp` narrowed to it) over a freshly opened cluster,
    closed on exit."""
    with connected(exp) as cluster:
        yield ServerManager(exp, paths, cluster=cluster, pool=pool)


def shutdown(exp: Experiment, paths: RunPaths, *, reason: str, services: bool = False) -> int:
    """Stop every server the run started, in every pool (workflow onsuccess/onerror); with
    `services` also the services of this config (`servesweep down`). Returns how many server
    sets and stray processes were stopped."""
    stopped = 0
    # the allocations this config's services run in (Slurm), under whatever RUN_ID started them
    held = service_holdings(exp, [s.fingerprint for s in server_specs(exp)]) if services else []
    for pool in node_pools(exp):
        with connect(narrow(exp, pool), paths, pool=pool.index) as manager:
            stopped += manager.stop_all(reason=reason, services=services)
            manager.remove_node_dirs()
    release(exp, down=services, services=held)  # the run's Slurm allocations (a service's stays)
    return stopped
