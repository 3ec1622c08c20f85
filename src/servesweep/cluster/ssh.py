"""Nodes reached over SSH (paramiko): one cached connection per node, keepalive, timeouts that
kill the remote process group, parallel fan-out, SFTP copies (the cluster path of transport)."""

from __future__ import annotations

import contextlib
import getpass
import logging
import os
import posixpath
import select
import shlex
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import paramiko
from paramiko import Channel, PKey, RejectPolicy
from paramiko.auth_strategy import AuthFailure, AuthStrategy, InMemoryPrivateKey, PrivateKey

from servesweep.cluster.transport import CommandResult
from servesweep.config.schema import SshOptions
from servesweep.core.errors import DOCTOR_HINT, TransportError, Unreachable
from servesweep.core.files import current_umask

logger = logging.getLogger(__name__)


# Channels one SSH connection may have open at once (sshd's MaxSessions defaults to 10).
MAX_CHANNELS_PER_NODE = 8
# After a timed-out command is signalled with TERM, how long before KILL.
KILL_GRACE_S = 2.0
POLL_S = 0.5
_PID_MARKER = b"__servesweep_pgid "
DEFAULT_KEY_FILES = ("id_ed25519", "id_ecdsa", "id_rsa")
_KNOWN_HOSTS_LOCK = threading.Lock()


@dataclass(frozen=True)
class SshTarget:
    """Where a node alias leads once `~/.ssh/config` is applied."""

    node: str
    hostname: str
    port: int
    user: str
    identity_files: tuple[str, ...]
    identities_only: bool
    known_hosts: tuple[str, ...]
    proxy_command: str | None

    @property
    def address(self) -> str:
        return f"{self.user}@{self.hostname}:{self.port}"


def resolve_target(node: str, *, config: paramiko.SSHConfig) -> SshTarget:
    """Apply an SSH config to a node alias (HostName, Port, User, IdentityFile, known_hosts)."""
    entry = config.lookup(node)
    if entry.get("proxyjump", "none").lower() != "none":
        raise TransportError(
            f"node {node}: ProxyJump is not supported; use `ProxyCommand ssh -W %h:%p <jump>`"
        )
    known = entry.get("userknownhostsfile", "~/.ssh/known_hosts").split()
    return SshTarget(
        node=node,
        hostname=entry.get("hostname", node),
        port=int(entry.get("port", 22)),
        user=entry.get("user") or getpass.getuser(),
        identity_files=tuple(os.path.expanduser(p) for p in entry.get("identityfile", [])),
        identities_only=entry.get("identitiesonly", "no").lower() == "yes",
        known_hosts=tuple(os.path.expanduser(p) for p in known),
        proxy_command=_unless_none(entry.get("proxycommand")),
    )


def _unless_none(value: str | None) -> str | None:
    return None if not value or value.lower() == "none" else value


class _KeyFile(PrivateKey):
    """A private key file, loaded when tried (a bad or encrypted key is one failed source)."""

    def __init__(self, username: str, path: str) -> None:
        super().__init__(username=username)
        self.path = path

    def authenticate(self, transport: paramiko.Transport) -> list[str]:
        self.pkey = PKey.from_path(self.path)
        return super().authenticate(transport)

    def __repr__(self) -> str:
        return f"key file {self.path}"


class _AgentKey(InMemoryPrivateKey):
    def __repr__(self) -> str:
        return f"agent key {self.pkey.fingerprint}"


class _Keys(AuthStrategy):
    """Like OpenSSH: IdentityFile keys, then (unless IdentitiesOnly) agent and ~/.ssh/id_* keys."""

    def __init__(self, target: SshTarget, *, config: paramiko.SSHConfig) -> None:
        super().__init__(ssh_config=config)
        self.target = target
        self.agent: paramiko.Agent | None = None

    def get_sources(self) -> Iterator[PrivateKey]:
        user, tried = self.target.user, set()
        for path in self.target.identity_files:
            if os.path.isfile(path):
                tried.add(path)
                yield _KeyFile(user, path)
        if self.target.identities_only:
            return
        self.agent = paramiko.Agent()
        for key in self.agent.get_keys():
            yield _AgentKey(user, key)
        for name in DEFAULT_KEY_FILES:
            path = os.path.expanduser(f"~/.ssh/{name}")
            if path not in tried and os.path.isfile(path):
                yield _KeyFile(user, path)

    def close(self) -> None:
        if self.agent is not None:
            self.agent.close()


def _auth_failure(exc: AuthFailure) -> str:
    tried = [
        f"{source!r}: {'rejected' if isinstance(r, paramiko.AuthenticationException) else r}"
        for source, r in exc.result
    ]
    return "; ".join(tried) if tried else "no identity file or agent key to offer"


class _SaveNewHostKey(paramiko.MissingHostKeyPolicy):
    """Accept a host key not yet known and append it to the known_hosts file."""

    def __init__(self, path: str) -> None:
        self.path = path

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: PKey) -> None:
        client.get_host_keys().add(hostname, key.get_name(), key)
        with _KNOWN_HOSTS_LOCK:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a") as fh:
                fh.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
        logger.warning(
            "accepted new host key %s %s for %s; saved to %s",
            key.get_name(),
            key.fingerprint,
            hostname,
            self.path,
        )


class SshTransport:
    """Nodes reached over SSH (paramiko): one cached connection per node, thread-safe."""

    def __init__(self, options: SshOptions, *, nodes: Iterable[str] = ()) -> None:
        self.options = options
        self.nodes = tuple(nodes)
        path = Path(options.config_file).expanduser()
        self._config = (
            paramiko.SSHConfig.from_path(str(path)) if path.is_file() else paramiko.SSHConfig()
        )
        self._lock = threading.Lock()
        self._node_locks: dict[str, threading.Lock] = {}
        self._slots: dict[str, threading.BoundedSemaphore] = {}
        self._clients: dict[str, paramiko.SSHClient] = {}

    def __enter__(self) -> SshTransport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def target(self, node: str) -> SshTarget:
        """Where `node` leads (ssh config applied)."""
        return resolve_target(node, config=self._config)

    # -------------------------------------------------------------- connections

    def _connect(self, node: str) -> paramiko.SSHClient:
        target = self.target(node)
        client = paramiko.SSHClient()
        for path in ("/etc/ssh/ssh_known_hosts", *target.known_hosts[1:]):
            if os.path.isfile(path):
                client.load_system_host_keys(path)
        primary = target.known_hosts[0]
        if os.path.isfile(primary):
            client.load_host_keys(primary)
        client.set_missing_host_key_policy(
            _SaveNewHostKey(primary) if self.options.accept_new_host_keys else RejectPolicy()
        )
        keys = _Keys(target, config=self._config)
        where = f"node {node} ({target.address})"
        started = time.monotonic()
        try:
            sock = None
            if target.proxy_command:
                sock = paramiko.ProxyCommand(target.proxy_command)
            client.connect(
                target.hostname,
                port=target.port,
                username=target.user,
                auth_strategy=keys,
                timeout=self.options.connect_timeout_s,
                banner_timeout=self.options.connect_timeout_s,
                auth_timeout=self.options.connect_timeout_s,
                channel_timeout=self.options.connect_timeout_s,
                sock=sock,
            )
        except paramiko.BadHostKeyException as exc:
            client.close()
            raise Unreachable(
                f"{where}: host key {exc.key.get_name()} {exc.key.fingerprint} does not match "
                f"the known_hosts entry; refusing to connect; {DOCTOR_HINT}"
            ) from None
        except AuthFailure as exc:
            client.close()
            raise Unreachable(
                f"{where}: authentication failed as user {target.user} "
                f"(tried: {_auth_failure(exc)}); {DOCTOR_HINT}"
            ) from None
        except paramiko.SSHException as exc:
            client.close()
            if "known_hosts" in str(exc):
                hint = (
                    f" (add its key to {primary}, e.g. with ssh-keyscan, "
                    f"or set cluster.ssh.accept_new_host_keys)"
                )
                raise Unreachable(f"{where}: {exc}{hint}; {DOCTOR_HINT}") from None
            waited = time.monotonic() - started
            reason = self._no_ssh(target, exc, waited=waited)
            raise Unreachable(f"{where}: {reason}; {DOCTOR_HINT}") from None
        except Exception as exc:  # socket errors, timeouts, DNS, proxy command failures
            client.close()
            reason = self._no_ssh(target, exc, waited=time.monotonic() - started)
            raise Unreachable(f"{where}: {reason}; {DOCTOR_HINT}") from None
        finally:
            keys.close()
        transport = client.get_transport()
        if transport is not None and self.options.keepalive_s:
            transport.set_keepalive(self.options.keepalive_s)
        logger.info("connected to %s", where)
        return client

    def _no_ssh(self, target: SshTarget, exc: Exception, *, waited: float) -> str:
        """Why a connection gave no SSH session, in words: connection refused, timeout, or
        something not SSH on the port; the socket's own words otherwise."""
        limit = self.options.connect_timeout_s
        errors = list(getattr(exc, "errors", {}).values()) or [exc]
        if all(isinstance(e, ConnectionRefusedError) for e in errors):
            return f"connection refused on port {target.port} (is sshd up there, on that port?)"
        if isinstance(exc, TimeoutError) or waited >= limit:
            return f"timeout: no SSH answer within {limit:g}s (is the node up, the address right?)"
        if isinstance(exc, paramiko.SSHException):
            return f"port {target.port} answers, but not as an SSH server ({exc})"
        return f"cannot connect: {exc or type(exc).__name__}"

    def _node_lock(self, node: str) -> threading.Lock:
        with self._lock:
            return self._node_locks.setdefault(node, threading.Lock())

    def _client(self, node: str) -> paramiko.SSHClient:
        with self._node_lock(node):
            with self._lock:
                client = self._clients.get(node)
            transport = client.get_transport() if client is not None else None
            if client is not None and transport is not None and transport.is_active():
                return client
            if client is not None:
                logger.info("connection to node %s was lost; reconnecting", node)
                client.close()
            client = self._connect(node)
            with self._lock:
                self._clients[node] = client
            return client

    def _drop(self, node: str, client: paramiko.SSHClient) -> None:
        with self._lock:
            if self._clients.get(node) is client:
                del self._clients[node]
        client.close()

    @contextlib.contextmanager
    def _slot(self, node: str, timeout: float) -> Iterator[None]:
        """Hold one of the node's channel slots (bounds concurrent channels per connection)."""
        with self._lock:
            slot = self._slots.setdefault(node, threading.BoundedSemaphore(MAX_CHANNELS_PER_NODE))
        if not slot.acquire(timeout=timeout):
            raise TransportError(f"node {node}: no free SSH channel within {timeout:g}s")
        try:
            yield
        finally:
            slot.release()

    def _session(self, node: str) -> tuple[paramiko.SSHClient, Channel]:
        """A new session channel; reconnects once if the cached connection is dead."""
        for attempt in (1, 2):
            client = self._client(node)
            transport = client.get_transport()
            try:
                if transport is None:
                    raise paramiko.SSHException("not connected")
                return client, transport.open_session(timeout=self.options.connect_timeout_s)
            except paramiko.ChannelException as exc:
                raise TransportError(f"node {node}: sshd refused a session: {exc}") from None
            except (paramiko.SSHException, OSError, EOFError) as exc:
                self._drop(node, client)
                if attempt == 2:
                    raise TransportError(f"node {node}: cannot open a session: {exc}") from None
        raise AssertionError("unreachable")

    # -------------------------------------------------------------- Transport

    def run(
        self, node: str, command: str, *, timeout: float, stdin: str | None = None
    ) -> CommandResult:
        head = command[:120]
        logger.debug("node %s: run %r (timeout %gs)", node, head, timeout)
        deadline = time.monotonic() + timeout
        with self._slot(node, timeout):
            client, chan = self._session(node)
            try:
                out, err, finished = _exec(chan, command, stdin=stdin, deadline=deadline)
                pgid, stdout = _split_pid(out)
                transport = client.get_transport()
                lost = finished and chan.exit_status == -1
                if lost and (transport is None or not transport.is_active()):
                    raise TransportError(f"node {node}: connection lost while running: {head}")
            except (paramiko.SSHException, OSError, EOFError) as exc:
                raise TransportError(f"node {node}: command failed to run: {head}: {exc}") from None
            finally:
                chan.close()
        if not finished:  # outside the slot: the kill needs a channel of its own
            self._kill_group(node, pgid)
            raise TransportError(f"command timed out after {timeout:g}s on node {node}: {head}")
        return CommandResult(
            node,
            command,
            chan.exit_status,
            stdout.decode(errors="replace"),
            err.decode(errors="replace"),
        )

    def _kill_group(self, node: str, pgid: int | None) -> None:
        if pgid is None:
            logger.warning("node %s: timed-out command left running (its pid is unknown)", node)
            return
        ticks = max(1, int(KILL_GRACE_S * 10))
        # zombies (state Z) are dead already, they only wait to be reaped
        alive = f"ps -eo pgid=,stat= | awk '$1 == {pgid} && $2 !~ /^Z/ {{f = 1}} END {{exit !f}}'"
        script = (
            f"kill -s TERM -- -{pgid} 2>/dev/null || exit 0; "
            f"for i in $(seq {ticks}); do sleep 0.1; {alive} || exit 0; done; "
            f"kill -s KILL -- -{pgid} 2>/dev/null; exit 0"
        )
        try:
            self.run(node, script, timeout=KILL_GRACE_S + self.options.connect_timeout_s)
        except TransportError as exc:
            logger.warning(
                "node %s: could not kill timed-out process group %d: %s", node, pgid, exc
            )

    @contextlib.contextmanager
    def _sftp(self, node: str) -> Iterator[paramiko.SFTPClient]:
        timeout = self.options.command_timeout_s
        with self._slot(node, timeout):
            for attempt in (1, 2):
                client = self._client(node)
                try:
                    sftp = client.open_sftp()
                    break
                except (paramiko.SSHException, OSError, EOFError) as exc:
                    self._drop(node, client)
                    if attempt == 2:
                        raise TransportError(f"node {node}: cannot open SFTP: {exc}") from None
            channel = sftp.get_channel()
            if channel is not None:
                channel.settimeout(timeout)
            try:
                yield sftp
            finally:
                sftp.close()

    def run_background(self, node: str, command: str, *, timeout: float) -> CommandResult:
        return self.run(node, command, timeout=timeout)

    def put(self, node: str, local: Path, remote: str) -> None:
        remote = _sftp_path(remote)
        part = f"{remote}.part-{uuid.uuid4().hex[:8]}"
        with self._sftp(node) as sftp:
            try:
                _sftp_makedirs(sftp, posixpath.dirname(remote))
                sftp.put(str(local), part)
                sftp.posix_rename(part, remote)
            except (OSError, paramiko.SSHException) as exc:
                with contextlib.suppress(OSError, paramiko.SSHException):
                    sftp.remove(part)
                raise TransportError(
                    f"cannot copy {local} to {remote} on node {node}: {exc}"
                ) from None
        logger.debug("node %s: put %s -> %s", node, local, remote)

    def get(self, node: str, remote: str, local: Path, *, private: bool = False) -> None:
        local.parent.mkdir(parents=True, exist_ok=True)
        fd, part = tempfile.mkstemp(prefix=f".{local.name}.", suffix=".part", dir=local.parent)
        os.close(fd)
        try:
            with self._sftp(node) as sftp:
                try:
                    sftp.get(_sftp_path(remote), part)
                except FileNotFoundError:
                    raise TransportError(f"no file {remote} on node {node}") from None
                except (OSError, paramiko.SSHException) as exc:
                    raise TransportError(f"cannot copy {remote} from node {node}: {exc}") from None
            if not private:  # mkstemp's 0600 kept for a secret; else as a plain open() would
                os.chmod(part, 0o666 & ~current_umask())
            os.replace(part, local)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(part)
        logger.debug("node %s: get %s -> %s", node, remote, local)

    def close(self) -> None:
        with self._lock:
            clients = list(self._clients.values())
            self._clients.clear()
        for client in clients:
            client.close()

    def check_reachable(self, nodes: Iterable[str] | None = None) -> None:
        """Connect to every node (default: this transport's nodes) and run `true`.

        Raises TransportError naming every unreachable node and why.
        """
        nodes = list(self.nodes if nodes is None else nodes)
        timeout = self.options.connect_timeout_s

        def probe(node: str) -> str | None:
            try:
                self.run(node, "true", timeout=timeout).check("`true`")
            except TransportError as exc:
                return str(exc)
            return None

        with ThreadPoolExecutor(max_workers=max(1, len(nodes))) as pool:
            failures = {n: r for n, r in zip(nodes, pool.map(probe, nodes), strict=True) if r}
        if failures:
            raise Unreachable(
                f"{len(failures)} of {len(nodes)} node(s) unreachable: "
                + "; ".join(
                    f"{n}: {why.removesuffix(f'; {DOCTOR_HINT}')}" for n, why in failures.items()
                )
                + f"; {DOCTOR_HINT}"
            )


def _exec(
    chan: Channel, command: str, *, stdin: str | None, deadline: float
) -> tuple[bytes, bytes, bool]:
    """Run `command` on a fresh channel: (stdout, stderr, finished before the deadline)."""
    # The login shell prints its pid (= its process group: sshd starts it with setsid) so that a
    # timed-out command can be killed, then becomes a POSIX `sh -c command`.
    chan.exec_command(f"echo {_PID_MARKER.decode()}$$; exec /bin/sh -c {shlex.quote(command)}")
    if stdin:
        chan.settimeout(max(0.001, deadline - time.monotonic()))
        try:
            chan.sendall(stdin.encode())
        except TimeoutError:  # the command does not read its stdin in time
            out, err, _ = _drain(chan, time.monotonic())
            return out, err, False
        chan.settimeout(None)
    chan.shutdown_write()
    return _drain(chan, deadline)


def _drain(chan: Channel, deadline: float) -> tuple[bytes, bytes, bool]:
    """Read stdout and stderr until the command ends (True) or the deadline passes (False)."""
    out, err = bytearray(), bytearray()
    while True:
        while chan.recv_ready():
            out += chan.recv(65536)
        while chan.recv_stderr_ready():
            err += chan.recv_stderr(65536)
        ended = chan.eof_received or chan.closed
        if ended and not chan.recv_ready() and not chan.recv_stderr_ready():
            break
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return bytes(out), bytes(err), False
        select.select([chan], [], [], min(remaining, POLL_S))
    finished = chan.status_event.wait(max(0.0, deadline - time.monotonic()))
    return bytes(out), bytes(err), finished


def _split_pid(out: bytes) -> tuple[int | None, bytes]:
    """Take the login shell's pid line out of stdout."""
    start = out.find(_PID_MARKER)
    if start < 0 or (start and out[start - 1 : start] != b"\n"):
        return None, out
    end = out.find(b"\n", start)
    line = out[start + len(_PID_MARKER) : end if end >= 0 else len(out)]
    rest = out[:start] + (out[end + 1 :] if end >= 0 else b"")
    return (int(line) if line.strip().isdigit() else None), rest


def _sftp_path(remote: str) -> str:
    """SFTP starts in the home directory and does not expand `~`."""
    if remote == "~":
        return "."
    return remote[2:] if remote.startswith("~/") else remote


def _sftp_makedirs(sftp: paramiko.SFTPClient, path: str) -> None:
    if path in ("", "/", "."):
        return
    try:
        sftp.stat(path)
        return
    except FileNotFoundError:
        pass
    _sftp_makedirs(sftp, posixpath.dirname(path))
    with contextlib.suppress(OSError):  # created meanwhile by a parallel put
        sftp.mkdir(path)
