"""Tests for cluster.transport (LocalTransport, run_all) and cluster.ssh (SshTransport)
against a real in-process SSH server (paramiko's server side on 127.0.0.1, commands run by
/bin/sh)."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import paramiko
import pytest

from servesweep.cluster.ssh import SshTransport, resolve_target
from servesweep.cluster.transport import CommandResult, LocalTransport, run_all
from servesweep.config.schema import SshOptions
from servesweep.core.errors import TransportError, Unreachable

CANARY = "canary-stdin-4f2a"

# ---------------------------------------------------------------- a real SSH server in-process


class _Sftp(paramiko.SFTPServerInterface):
    """SFTP over the local filesystem (absolute paths; relative ones from the cwd)."""

    def _attrs(self, path: str, *, follow: bool = True) -> paramiko.SFTPAttributes | int:
        try:
            st = os.stat(path) if follow else os.lstat(path)
        except OSError as exc:
            return paramiko.SFTPServer.convert_errno(exc.errno)
        return paramiko.SFTPAttributes.from_stat(st)

    def stat(self, path: str) -> paramiko.SFTPAttributes | int:
        return self._attrs(path)

    def lstat(self, path: str) -> paramiko.SFTPAttributes | int:
        return self._attrs(path, follow=False)

    def open(self, path: str, flags: int, attr: paramiko.SFTPAttributes) -> object:
        try:
            fd = os.open(path, flags, 0o644)
        except OSError as exc:
            return paramiko.SFTPServer.convert_errno(exc.errno)
        mode = "r+b" if flags & os.O_RDWR else ("wb" if flags & os.O_WRONLY else "rb")
        handle = paramiko.SFTPHandle(flags)
        fh = os.fdopen(fd, mode)
        handle.readfile = handle.writefile = fh
        handle.stat = lambda: paramiko.SFTPAttributes.from_stat(os.fstat(fh.fileno()))
        return handle

    def _call(self, fn, *args: str) -> int:  # type: ignore[no-untyped-def]
        try:
            fn(*args)
        except OSError as exc:
            return paramiko.SFTPServer.convert_errno(exc.errno)
        return paramiko.SFTP_OK

    def remove(self, path: str) -> int:
        return self._call(os.remove, path)

    def rename(self, old: str, new: str) -> int:
        return self._call(os.rename, old, new)

    def posix_rename(self, old: str, new: str) -> int:
        return self._call(os.replace, old, new)

    def mkdir(self, path: str, attr: paramiko.SFTPAttributes) -> int:
        return self._call(os.mkdir, path)


EOF_WAIT_S = 10.0


def _exec(channel: paramiko.Channel, command: str) -> None:
    """Run `command` as sshd does: /bin/sh in a new session, stdin/stdout/stderr piped."""
    proc = subprocess.Popen(
        ["/bin/sh", "-c", command],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    assert proc.stdin and proc.stdout and proc.stderr

    def feed() -> None:
        with contextlib.suppress(OSError, EOFError, paramiko.SSHException):
            while data := channel.recv(65536):
                proc.stdin.write(data)
                proc.stdin.flush()
        with contextlib.suppress(OSError):
            proc.stdin.close()

    def pump(src, send) -> None:  # type: ignore[no-untyped-def]
        for chunk in iter(lambda: src.read1(65536), b""):
            with contextlib.suppress(OSError, EOFError, paramiko.SSHException):
                send(chunk)

    threads = [
        threading.Thread(target=feed, daemon=True),
        threading.Thread(target=pump, args=(proc.stdout, channel.sendall), daemon=True),
        threading.Thread(target=pump, args=(proc.stderr, channel.sendall_stderr), daemon=True),
    ]
    for t in threads:
        t.start()
    rc = proc.wait()
    threads[1].join()
    threads[2].join()
    # The client sends EOF only after paramiko sent the exec request's success reply: closing
    # before that (a fast command on a loaded machine) fails exec_command with "Channel
    # closed", a race real sshd does not have (it replies before it starts the command).
    threads[0].join(timeout=EOF_WAIT_S)
    with contextlib.suppress(OSError, EOFError, paramiko.SSHException):
        if rc >= 0:  # killed by a signal: sshd sends exit-signal, not exit-status
            channel.send_exit_status(rc)
        channel.shutdown_write()
        channel.close()


class _Interface(paramiko.ServerInterface):
    def __init__(self, client_key: paramiko.PKey) -> None:
        self.client_key = client_key

    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        ok = key.get_base64() == self.client_key.get_base64()
        return paramiko.AUTH_SUCCESSFUL if ok else paramiko.AUTH_FAILED

    def check_channel_request(self, kind: str, chanid: int) -> int:
        if kind == "session":
            return paramiko.OPEN_SUCCEEDED
        return paramiko.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED

    def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes) -> bool:
        threading.Thread(target=_exec, args=(channel, command.decode()), daemon=True).start()
        return True


class FakeSshd:
    """An SSH server on 127.0.0.1:<free port> that counts the connections it accepted."""

    def __init__(self, host_key: paramiko.PKey, client_key: paramiko.PKey) -> None:
        self.host_key = host_key
        self.client_key = client_key
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(32)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self.transports: list[paramiko.Transport] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        transport = paramiko.Transport(conn)
        transport.add_server_key(self.host_key)
        transport.set_subsystem_handler("sftp", paramiko.SFTPServer, _Sftp)
        with self._lock:
            self.connections += 1
            self.transports.append(transport)
        with contextlib.suppress(paramiko.SSHException, EOFError, OSError):
            transport.start_server(server=_Interface(self.client_key))

    def drop_all(self) -> None:
        with self._lock:
            transports, self.transports = self.transports, []
        for t in transports:
            t.close()

    def close(self) -> None:
        self.sock.close()
        self.drop_all()


@dataclass
class Rig:
    sshd: FakeSshd
    dir: Path
    key_file: Path
    closed_port: int

    def known_hosts(self, kind: str) -> Path:
        """A known_hosts file: 'good' (the server's key), 'empty', or 'wrong' (another key)."""
        path = self.dir / f"known_hosts_{kind}_{time.monotonic_ns()}"
        key = {"good": self.sshd.host_key, "wrong": paramiko.ECDSAKey.generate()}.get(kind)
        line = f"[127.0.0.1]:{self.sshd.port} {key.get_name()} {key.get_base64()}\n" if key else ""
        path.write_text(line)
        return path

    def config(self, known_hosts: Path) -> Path:
        path = self.dir / f"ssh_config_{time.monotonic_ns()}"
        common = (
            f"    User tester\n    IdentityFile {self.key_file}\n    IdentitiesOnly yes\n"
            f"    UserKnownHostsFile {known_hosts}\n"
        )
        path.write_text(
            f"Host fake1 fake2 fake3 fake4\n    HostName 127.0.0.1\n    Port {self.sshd.port}\n"
            + common
            + f"Host closed\n    HostName 127.0.0.1\n    Port {self.closed_port}\n"
            + common
            + f"Host nowhere\n    HostName 127.0.0.9\n    Port {self.closed_port}\n"
            + common
        )
        return path

    def transport(self, kind: str = "good", **options: object) -> SshTransport:
        opts = SshOptions(
            config_file=str(self.config(self.known_hosts(kind))),
            connect_timeout_s=5,
            **options,  # type: ignore[arg-type]
        )
        return SshTransport(opts, nodes=["fake1", "fake2", "fake3", "fake4"])


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    tmp = tmp_path_factory.mktemp("ssh")
    client_key = paramiko.ECDSAKey.generate()
    key_file = tmp / "id_ecdsa"
    client_key.write_private_key_file(str(key_file))
    sshd = FakeSshd(paramiko.ECDSAKey.generate(), client_key)
    yield Rig(sshd, tmp, key_file, _closed_port())
    sshd.close()


@pytest.fixture
def ssh(rig: Rig) -> Iterator[SshTransport]:
    with rig.transport() as transport:
        yield transport


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def _wait_until(predicate, limit_s: float = 15.0) -> bool:  # type: ignore[no-untyped-def]
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


# ---------------------------------------------------------------- ssh config resolution


def test_resolve_target_applies_ssh_config(tmp_path: Path) -> None:
    cfg = paramiko.SSHConfig.from_text(
        "Host gpu1\n    HostName 10.0.0.5\n    Port 2222\n    User alice\n"
        "    IdentityFile ~/.ssh/id_gpu\n    IdentitiesOnly yes\n"
        "    UserKnownHostsFile ~/kh1 /etc/kh2\n"
        "Host jumpy\n    ProxyJump bastion\n"
        "Host proxied\n    ProxyCommand ssh -W %h:%p bastion\n"
        "Host direct\n    ProxyCommand none\n    ProxyJump none\n"
    )
    t = resolve_target("gpu1", config=cfg)
    home = os.path.expanduser("~")
    assert (t.hostname, t.port, t.user) == ("10.0.0.5", 2222, "alice")
    assert t.identity_files == (f"{home}/.ssh/id_gpu",)
    assert t.identities_only
    assert t.known_hosts == (f"{home}/kh1", "/etc/kh2")
    assert t.address == "alice@10.0.0.5:2222"

    plain = resolve_target("other", config=cfg)
    assert (plain.hostname, plain.port, plain.identity_files) == ("other", 22, ())
    assert plain.known_hosts == (f"{home}/.ssh/known_hosts",)
    assert not plain.identities_only
    assert plain.proxy_command is None
    assert resolve_target("proxied", config=cfg).proxy_command == "ssh -W proxied:22 bastion"
    assert resolve_target("direct", config=cfg).proxy_command is None
    with pytest.raises(TransportError, match="jumpy: ProxyJump is not supported"):
        resolve_target("jumpy", config=cfg)


def test_missing_config_file_means_plain_names(tmp_path: Path) -> None:
    transport = SshTransport(SshOptions(config_file=str(tmp_path / "none")), nodes=["a"])
    assert transport.target("a").hostname == "a"


# ---------------------------------------------------------------- run


def test_run_returns_exit_code_and_both_streams(ssh: SshTransport) -> None:
    res = ssh.run("fake1", "echo out; echo err >&2; exit 3", timeout=20)
    assert res == CommandResult("fake1", "echo out; echo err >&2; exit 3", 3, "out\n", "err\n")
    with pytest.raises(TransportError, match=r"probe failed on node fake1 \(exit 3\): err"):
        res.check("probe")


def test_run_uses_a_posix_shell_and_keeps_quoting(ssh: SshTransport) -> None:
    res = ssh.run("fake1", "printf '%s|' \"a b\" 'c\"d' $((1+2))", timeout=20)
    assert res.stdout == 'a b|c"d|3|'


def test_stdin_is_fed_then_closed_and_never_logged(
    ssh: SshTransport, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    res = ssh.run("fake1", "cat; echo; echo done", timeout=20, stdin=CANARY)
    assert res.stdout == f"{CANARY}\ndone\n"
    # without stdin, the command still sees end-of-file at once
    assert ssh.run("fake1", "cat; echo eof", timeout=20).stdout == "eof\n"
    assert CANARY not in caplog.text


def test_large_output_on_both_streams(ssh: SshTransport) -> None:
    res = ssh.run("fake1", "head -c 3000000 /dev/zero; head -c 2000000 /dev/zero >&2", timeout=60)
    assert (len(res.stdout), len(res.stderr)) == (3_000_000, 2_000_000)


def _connected(ssh: SshTransport, node: str) -> None:
    """Open `node`'s connection before a command timed at 1 s, which is killed only if it
    printed its process group by then. A cold run pays paramiko's handshake (both ends in this
    process) too: 0.05 s idle, up to 0.19 s beside 10 busy loops here, against 0.14 s warm;
    the 1 s then covers a channel, a fork and an echo."""
    assert ssh.run(node, "true", timeout=20).ok


def test_timeout_ends_the_command_and_its_process_group(ssh: SshTransport, rig: Rig) -> None:
    pidfile = rig.dir / "sleeper.pid"
    command = f"sleep 300 & echo $! > {pidfile}; wait"
    _connected(ssh, "fake2")
    with pytest.raises(TransportError) as err:
        ssh.run("fake2", command, timeout=1, stdin=CANARY)
    message = str(err.value)
    assert "timed out after 1s on node fake2" in message
    assert "sleep 300 &" in message
    assert CANARY not in message
    pid = int(pidfile.read_text())
    assert _wait_until(lambda: _gone(pid)), f"sleep {pid} survived the timeout"
    assert ssh.run("fake2", "echo still usable", timeout=20).stdout == "still usable\n"


def test_timeout_kills_a_command_that_ignores_term(ssh: SshTransport, rig: Rig) -> None:
    pidfile = rig.dir / "stubborn.pid"
    _connected(ssh, "fake2")
    with pytest.raises(TransportError, match="timed out"):
        ssh.run("fake2", f"trap '' TERM; sleep 301 & echo $! > {pidfile}; wait", timeout=1)
    pid = int(pidfile.read_text())
    assert _wait_until(lambda: _gone(pid)), f"sleep {pid} survived TERM and KILL"


def test_stdin_the_command_never_reads_ends_as_a_timeout(ssh: SshTransport) -> None:
    big = "x" * 8_000_000  # more than the SSH window and the pipe can hold
    with pytest.raises(TransportError, match="timed out after 1s on node fake4: sleep 60"):
        ssh.run("fake4", "sleep 60", timeout=1, stdin=big)
    assert ssh.run("fake4", "echo fine", timeout=20).stdout == "fine\n"


def test_connection_lost_mid_command_is_an_error(rig: Rig) -> None:
    started = rig.dir / f"started-{time.monotonic_ns()}"
    with rig.transport() as ssh, ThreadPoolExecutor(1) as pool:
        future = pool.submit(ssh.run, "fake1", f"touch {started}; sleep 30", timeout=60)
        assert _wait_until(started.exists)
        rig.sshd.drop_all()
        with pytest.raises(TransportError, match="node fake1: connection lost while running"):
            future.result()
        assert ssh.run("fake1", "echo back", timeout=20).stdout == "back\n"


def test_parallel_runs_on_one_node_share_one_connection(rig: Rig) -> None:
    before = rig.sshd.connections
    with rig.transport() as ssh, ThreadPoolExecutor(max_workers=12) as pool:
        results = list(pool.map(lambda i: ssh.run("fake1", f"echo {i}", timeout=30), range(24)))
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(24)]
    assert rig.sshd.connections - before == 1


def test_run_all_fans_out_over_nodes(rig: Rig) -> None:
    before = rig.sshd.connections
    with rig.transport() as ssh:
        results = run_all(ssh, ssh.nodes, "echo hi", timeout=30)
    assert list(results) == ["fake1", "fake2", "fake3", "fake4"]
    assert all(r.ok and r.stdout == "hi\n" for r in results.values())
    assert rig.sshd.connections - before == 4


def test_reconnects_after_the_connection_drops(rig: Rig) -> None:
    with rig.transport() as ssh:
        assert ssh.run("fake3", "echo a", timeout=20).stdout == "a\n"
        rig.sshd.drop_all()
        assert ssh.run("fake3", "echo b", timeout=20).stdout == "b\n"


# ---------------------------------------------------------------- put / get


def test_put_and_get_round_trip(ssh: SshTransport, tmp_path: Path) -> None:
    local = tmp_path / "in.bin"
    local.write_bytes(os.urandom(300_000))
    remote = tmp_path / "remote" / "deep" / "copy.bin"
    ssh.put("fake1", local, str(remote))
    assert remote.read_bytes() == local.read_bytes()
    back = tmp_path / "back" / "copy.bin"
    ssh.get("fake1", str(remote), back)
    assert back.read_bytes() == local.read_bytes()
    assert sorted(p.name for p in remote.parent.iterdir()) == ["copy.bin"]  # no .part left


def test_get_of_a_missing_file_names_node_and_leaves_nothing(
    ssh: SshTransport, tmp_path: Path
) -> None:
    with pytest.raises(TransportError, match=r"no file /nonexistent/x on node fake2"):
        ssh.get("fake2", "/nonexistent/x", tmp_path / "out" / "x")
    assert list((tmp_path / "out").iterdir()) == []


# ---------------------------------------------------------------- host keys and reachability


def test_unknown_host_key_is_rejected_by_default(rig: Rig) -> None:
    with rig.transport("empty") as ssh, pytest.raises(TransportError) as err:
        ssh.run("fake1", "true", timeout=20)
    assert "node fake1 (tester@127.0.0.1" in str(err.value)
    assert "not found in known_hosts" in str(err.value)
    assert "accept_new_host_keys" in str(err.value)


def test_changed_host_key_is_refused_even_when_accepting_new_ones(rig: Rig) -> None:
    with (
        rig.transport("wrong", accept_new_host_keys=True) as ssh,
        pytest.raises(TransportError, match="does not match the known_hosts entry"),
    ):
        ssh.run("fake1", "true", timeout=20)


def test_accept_new_host_keys_saves_the_key(rig: Rig) -> None:
    known = rig.known_hosts("empty")
    opts = SshOptions(config_file=str(rig.config(known)), accept_new_host_keys=True)
    with SshTransport(opts, nodes=["fake1"]) as ssh:
        assert ssh.run("fake1", "echo ok", timeout=20).ok
    entry = known.read_text().split()
    assert entry[0] == f"[127.0.0.1]:{rig.sshd.port}"
    assert entry[2] == rig.sshd.host_key.get_base64()
    strict = SshOptions(config_file=str(rig.config(known)))
    with SshTransport(strict, nodes=["fake1"]) as ssh:
        assert ssh.run("fake1", "echo ok", timeout=20).ok


def test_check_reachable_names_every_unreachable_node(rig: Rig) -> None:
    with rig.transport() as ssh:
        ssh.check_reachable()  # fake1..fake4 all answer
        with pytest.raises(TransportError) as err:
            ssh.check_reachable(["fake1", "closed", "nowhere"])
    message = str(err.value)
    assert message.startswith("2 of 3 node(s) unreachable")
    assert "closed: node closed (tester@127.0.0.1" in message
    assert "nowhere: node nowhere (tester@127.0.0.9" in message
    assert "fake1" not in message


def test_wrong_client_key_is_an_authentication_error(rig: Rig, tmp_path: Path) -> None:
    other = tmp_path / "other_key"
    paramiko.ECDSAKey.generate().write_private_key_file(str(other))
    cfg = rig.config(rig.known_hosts("good"))
    cfg.write_text(cfg.read_text().replace(str(rig.key_file), str(other)))
    with (
        SshTransport(SshOptions(config_file=str(cfg)), nodes=["fake1"]) as ssh,
        pytest.raises(TransportError, match="node fake1 .*authentication failed"),
    ):
        ssh.run("fake1", "true", timeout=20)


# ---------------------------------------------------------------- LocalTransport


def test_local_transport_runs_commands() -> None:
    local = LocalTransport()
    res = local.run("n0", "echo out; echo err >&2; exit 2", timeout=20)
    assert (res.returncode, res.stdout, res.stderr) == (2, "out\n", "err\n")
    assert local.run("n0", "cat", timeout=20, stdin="abc").stdout == "abc"
    assert local.run("n0", "cat; echo eof", timeout=20).stdout == "eof\n"


def test_local_transport_timeout_names_node_and_command() -> None:
    with pytest.raises(TransportError, match="timed out after 1s on node n0: sleep 30"):
        LocalTransport().run("n0", "sleep 30", timeout=1, stdin=CANARY)


def test_local_transport_put_get(tmp_path: Path) -> None:
    local = LocalTransport()
    src = tmp_path / "a.txt"
    src.write_text("x")
    local.put("n0", src, str(tmp_path / "d" / "b.txt"))
    local.get("n0", str(tmp_path / "d" / "b.txt"), tmp_path / "e" / "c.txt")
    assert (tmp_path / "e" / "c.txt").read_text() == "x"
    with pytest.raises(TransportError, match="no file"):
        local.get("n0", str(tmp_path / "missing"), tmp_path / "f")


def test_run_all_keeps_node_order() -> None:
    results = run_all(LocalTransport(), ["c", "a", "b"], "echo $$", timeout=20)
    assert list(results) == ["c", "a", "b"]
    assert all(r.ok for r in results.values())


@pytest.mark.parametrize("kind", ["local", "ssh"])
def test_private_get_is_never_readable_by_others(
    kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """A file copied back with `private` (a record that may hold the API key) is 0600."""
    transport = LocalTransport() if kind == "local" else request.getfixturevalue("ssh")
    remote = tmp_path / "node" / "record.jsonl"
    remote.parent.mkdir()
    remote.write_text("{}\n")
    old = os.umask(0o022)
    try:
        transport.get("fake1", str(remote), tmp_path / "a" / "r.jsonl", private=True)
        transport.get("fake1", str(remote), tmp_path / "a" / "s.jsonl")
    finally:
        os.umask(old)
    assert (tmp_path / "a" / "r.jsonl").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "a" / "s.jsonl").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "a" / "r.jsonl").read_text() == "{}\n"


def test_an_unreachable_node_is_unreachable_with_the_doctor_hint(rig: Rig) -> None:
    """Issue 27: an SSH failure says Unreachable and how to look (not SmokeFailed)."""
    with rig.transport() as ssh, pytest.raises(Unreachable) as err:
        ssh.run("closed", "true", timeout=20)
    message = str(err.value)
    assert message.startswith("node closed (tester@127.0.0.1")
    assert "connection refused on port" in message
    assert message.endswith("; run `servesweep doctor` to check every node")
