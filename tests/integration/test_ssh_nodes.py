"""SshTransport against real sshd nodes (127.0.0.2-5): fan-out, files, timeouts, host keys."""

from __future__ import annotations

import os
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from servesweep.cluster.ssh import SshTransport
from servesweep.cluster.transport import run_all
from servesweep.config.schema import SshOptions
from servesweep.core.errors import TransportError
from tests.integration.nodes import ADDRESSES, NODES, wait_until

pytestmark = pytest.mark.integration


def _config_with(nodes_dir: Path, tmp_path: Path, *, known_hosts: Path | None = None) -> Path:
    """The nodes' ssh config plus an unreachable node9 (127.0.0.9), optionally other known_hosts."""
    text = (nodes_dir / "ssh_config").read_text()
    if known_hosts is not None:
        text = text.replace(str(nodes_dir / "known_hosts"), str(known_hosts))
    text += (
        "Host node9\n    HostName 127.0.0.9\n    User root\n"
        f"    IdentityFile {nodes_dir / 'id_ed25519'}\n    IdentitiesOnly yes\n"
    )
    path = tmp_path / "ssh_config"
    path.write_text(text)
    return path


def test_run_on_all_nodes_in_parallel(ssh: SshTransport) -> None:
    results = run_all(ssh, NODES, 'echo "$SSH_CONNECTION"; id -un; echo e >&2', timeout=60)
    assert list(results) == list(NODES)
    for node, res in results.items():
        assert res.ok, res
        connection, user = res.stdout.split("\n")[:2]
        assert connection.split()[2:] == [ADDRESSES[node], "22"]
        assert user == "root"
        assert res.stderr == "e\n"


def test_stdin_reaches_the_command(ssh: SshTransport) -> None:
    res = ssh.run("node2", "wc -c; cat", timeout=60, stdin="abc\n")
    assert res.stdout == "4\n"
    assert ssh.run("node2", "cat; echo eof", timeout=60).stdout == "eof\n"


def test_one_connection_per_node_under_parallel_use(ssh_options: SshOptions) -> None:
    with SshTransport(ssh_options, nodes=NODES) as ssh, ThreadPoolExecutor(16) as pool:
        jobs = [(NODES[i % 4], i) for i in range(32)]
        results = list(
            pool.map(lambda j: ssh.run(j[0], f'echo {j[1]} "$SSH_CONNECTION"', timeout=60), jobs)
        )
    client_ports: dict[str, set[str]] = {}
    for (node, i), res in zip(jobs, results, strict=True):
        number, client, port = res.stdout.split()[:3]
        assert number == str(i)
        client_ports.setdefault(node, set()).add(port)
    assert {n: len(p) for n, p in client_ports.items()} == {n: 1 for n in NODES}


def test_put_and_get_on_all_nodes_in_parallel(ssh: SshTransport, tmp_path: Path) -> None:
    remote_dir = f"/tmp/servesweep-it-{uuid.uuid4().hex[:8]}"

    def round_trip(node: str) -> bytes:
        local = tmp_path / f"{node}.bin"
        local.write_bytes(node.encode() + os.urandom(200_000))
        ssh.put(node, local, f"{remote_dir}/{node}/data.bin")
        back = tmp_path / "back" / node / "data.bin"
        ssh.get(node, f"{remote_dir}/{node}/data.bin", back)
        return back.read_bytes() == local.read_bytes()

    try:
        with ThreadPoolExecutor(4) as pool:
            assert list(pool.map(round_trip, NODES)) == [True] * 4
        listing = ssh.run("node1", f"ls {remote_dir}/*", timeout=60).stdout.split()
        assert sorted(x for x in listing if not x.endswith(":")) == ["data.bin"] * 4
    finally:
        ssh.run("node1", f"rm -rf {remote_dir}", timeout=60)


def test_get_missing_file_names_the_node(ssh: SshTransport, tmp_path: Path) -> None:
    with pytest.raises(TransportError, match="no file /nonexistent/f on node node3"):
        ssh.get("node3", "/nonexistent/f", tmp_path / "f")
    assert not (tmp_path / "f").exists()


def test_timeout_names_node_and_command_and_ends_it(ssh: SshTransport) -> None:
    marker = f"{uuid.uuid4().int % 1000 + 1000}.5"  # a unique `sleep` argument
    with pytest.raises(TransportError) as err:
        ssh.run("node3", f"sleep {marker}; echo never", timeout=1)
    assert str(err.value) == f"command timed out after 1s on node node3: sleep {marker}; echo never"

    def gone() -> bool:
        res = ssh.run(
            "node3", f"ps -eo stat=,args= | grep -v '^Z' | grep -c 'sleep {marker}$'", timeout=60
        )
        return res.stdout.strip() == "0"

    assert wait_until(gone), "the timed-out command still runs on node3"


def test_unreachable_node_is_named(nodes_dir: Path, tmp_path: Path) -> None:
    config = _config_with(nodes_dir, tmp_path)
    with SshTransport(SshOptions(config_file=str(config), connect_timeout_s=5)) as ssh:
        with pytest.raises(TransportError) as err:
            ssh.check_reachable(["node1", "node9", "node2"])
        message = str(err.value)
        assert message.startswith("1 of 3 node(s) unreachable: node9: node node9 (root@127.0.0.9")
        assert "node1" not in message and "node2" not in message
        ssh.check_reachable(["node1", "node2"])


def test_unknown_host_key_is_rejected_then_accepted_on_request(
    nodes_dir: Path, tmp_path: Path
) -> None:
    known = tmp_path / "known_hosts"
    known.write_text("")
    config = str(_config_with(nodes_dir, tmp_path, known_hosts=known))
    with (
        SshTransport(SshOptions(config_file=config)) as ssh,
        pytest.raises(TransportError) as err,
    ):
        ssh.run("node1", "true", timeout=60)
    assert "node node1 (root@127.0.0.2:22)" in str(err.value)
    assert "not found in known_hosts" in str(err.value)
    assert known.read_text() == ""

    with SshTransport(SshOptions(config_file=config, accept_new_host_keys=True)) as ssh:
        assert ssh.run("node1", "echo in", timeout=60).stdout == "in\n"
    host, key_type, key = known.read_text().split()
    server_keys = {p.read_text().split()[1] for p in nodes_dir.glob("ssh_host_*_key.pub")}
    assert host == "127.0.0.2"
    assert key in server_keys

    with SshTransport(SshOptions(config_file=config)) as ssh:  # now known: strict mode passes
        assert ssh.run("node1", "echo again", timeout=60).ok


def test_changed_host_key_is_refused(nodes_dir: Path, tmp_path: Path) -> None:
    # a valid ed25519 key that is not node1's (the client's own) recorded for node1's address
    key_type, key = (nodes_dir / "id_ed25519.pub").read_text().split()[:2]
    known = tmp_path / "known_hosts"
    known.write_text(f"127.0.0.2 {key_type} {key}\n")
    config = str(_config_with(nodes_dir, tmp_path, known_hosts=known))
    with (
        SshTransport(SshOptions(config_file=config, accept_new_host_keys=True)) as ssh,
        pytest.raises(TransportError, match="does not match the known_hosts entry"),
    ):
        ssh.run("node1", "true", timeout=60)
    assert known.read_text() == f"127.0.0.2 {key_type} {key}\n"


def test_unprivileged_user_alias(ssh: SshTransport) -> None:
    res = ssh.run("node4-sweeper", 'id -un; echo "$SSH_CONNECTION"', timeout=60)
    user, connection = res.stdout.splitlines()
    assert user == "sweeper"
    assert connection.split()[2] == "127.0.0.5"


def test_proxy_command_reaches_a_node_through_another(nodes_dir: Path, tmp_path: Path) -> None:
    base = _config_with(nodes_dir, tmp_path)
    marker = tmp_path / "proxy_used"
    config = tmp_path / "ssh_config_proxy"
    config.write_text(
        base.read_text() + "Host node2-via-node1\n    HostName 127.0.0.3\n    User root\n"
        f"    IdentityFile {nodes_dir / 'id_ed25519'}\n    IdentitiesOnly yes\n"
        f"    UserKnownHostsFile {nodes_dir / 'known_hosts'}\n"
        f"    ProxyCommand sh -c 'echo %h:%p > {marker}; exec ssh -F {base} -W %h:%p node1'\n"
    )
    with SshTransport(SshOptions(config_file=str(config))) as ssh:
        res = ssh.run("node2-via-node1", 'echo "$SSH_CONNECTION"', timeout=60)
    assert res.stdout.split()[2:] == ["127.0.0.3", "22"]
    assert marker.read_text() == "127.0.0.3:22\n"  # the proxy carried the connection
