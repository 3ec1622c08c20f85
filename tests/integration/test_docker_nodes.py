"""DockerRuntime on real nodes: containers from the imported image over SSH, as root and as the
unprivileged `sweeper` through `sudo -S` (password on stdin, never in argv, files or errors)."""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import threading
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from servesweep.cluster.runtime import DockerRuntime, Launch
from servesweep.cluster.secrets import Secret
from servesweep.cluster.ssh import SshTransport
from servesweep.config.schema import RuntimeConfig
from servesweep.core.errors import ServerStartError
from servesweep.serving.engines import API_KEY_ENV
from tests.integration.nodes import free_port, root_docker, wait_until

pytestmark = pytest.mark.integration

HELLO = (
    "import sys, time; print('hello from the container', flush=True); "
    "print('and its stderr', file=sys.stderr, flush=True); time.sleep(600)"
)


def _launch(name: str, node: str, labels: dict[str, str], argv: list[str]) -> Launch:
    return Launch(name=name, node=node, argv=argv, log_path="/unused", labels=labels)


def test_container_lifecycle_as_root(
    ssh: SshTransport,
    docker_node: str,
    sim_runtime: RuntimeConfig,
    run_label: dict[str, str],
    cleanup: list[tuple[str, str]],
) -> None:
    rt = root_docker(ssh, sim_runtime)
    name = f"ss-{run_label['run']}"
    cleanup.append((docker_node, name))
    labels = {**run_label, "rank": "0"}
    handle = rt.start(_launch(name, docker_node, labels, ["python3", "-c", HELLO]))
    assert rt.is_running(docker_node, handle)
    assert wait_until(lambda: "and its stderr" in rt.logs(docker_node, handle, "/unused"))
    logs = rt.logs(docker_node, handle, "/unused")
    assert "hello from the container\n" in logs
    assert rt.find(docker_node, run_label) == [handle]
    assert rt.find("node3", run_label) == [handle]  # one daemon behind all four nodes here
    assert rt.find(docker_node, {"run": run_label["run"] + "-other"}) == []
    assert rt.find(docker_node, labels) == [handle]
    assert rt.find(docker_node, {**run_label, "rank": "1"}) == []  # labels are ANDed
    rt.stop(docker_node, handle)
    assert not rt.is_running(docker_node, handle)
    assert rt.find(docker_node, run_label) == []
    assert rt.logs(docker_node, handle, "/unused") == ""
    rt.stop(docker_node, handle)  # already gone: fine


def test_exited_container_is_not_running_but_keeps_its_logs(
    ssh: SshTransport,
    docker_node: str,
    sim_runtime: RuntimeConfig,
    run_label: dict[str, str],
    cleanup: list[tuple[str, str]],
) -> None:
    rt = root_docker(ssh, sim_runtime)
    name = f"ss-{run_label['run']}"
    cleanup.append((docker_node, name))
    argv = ["python3", "-c", "import sys; print('dying'); sys.exit(3)"]
    handle = rt.start(_launch(name, docker_node, run_label, argv))
    assert wait_until(lambda: not rt.is_running(docker_node, handle))
    assert rt.logs(docker_node, handle, "/unused") == "dying\n"
    assert rt.find(docker_node, run_label) == [handle]  # found for stale-server cleanup
    rt.stop(docker_node, handle)


def test_start_failure_names_container_and_node(
    ssh: SshTransport,
    docker_node: str,
    sim_runtime: RuntimeConfig,
    run_label: dict[str, str],
    cleanup: list[tuple[str, str]],
) -> None:
    rt = root_docker(ssh, sim_runtime)
    name = f"ss-{run_label['run']}"
    cleanup.append((docker_node, name))
    rt.start(_launch(name, docker_node, run_label, ["python3", "-c", HELLO]))
    with pytest.raises(ServerStartError) as err:  # the same name again
        rt.start(_launch(name, "node2", run_label, ["python3", "-c", HELLO]))
    assert f"could not start container {name} on node node2" in str(err.value)
    assert "already in use" in str(err.value)


@pytest.mark.skipif(
    importlib.util.find_spec("servesweep.sim.__main__") is None,
    reason="servesweep.sim has no __main__ yet",
)
def test_sim_in_a_container_answers_health_on_the_host(
    ssh: SshTransport,
    docker_node: str,
    sim_runtime: RuntimeConfig,
    run_label: dict[str, str],
    cleanup: list[tuple[str, str]],
) -> None:
    rt = root_docker(ssh, sim_runtime)
    port = free_port()
    name = f"ss-{run_label['run']}"
    cleanup.append((docker_node, name))
    argv = [
        "python3", "-m", "servesweep.sim", "--model-path", "m", "--port", str(port),
        "--sim-startup-s", "0", "--sim-time-scale", "0.001",
    ]  # fmt: skip
    handle = rt.start(_launch(name, docker_node, run_label, argv))

    def healthy() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as resp:
                return resp.status == 200
        except (urllib.error.URLError, OSError):
            return False

    ok = wait_until(lambda: healthy() or not rt.is_running(docker_node, handle), limit_s=90)
    assert ok and healthy(), rt.logs(docker_node, handle, "/unused")[-3000:]
    rt.stop(docker_node, handle)


# ---------------------------------------------------------------- sudo as the sweeper user


class ProcessScanner:
    """Watches every process's argv and environment on this machine for a string."""

    def __init__(self, needle: str, parts: tuple[str, ...] = ("cmdline", "environ")) -> None:
        self.needle = needle.encode()
        self.parts = parts
        self.hits: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        me = str(os.getpid())
        while not self._stop.is_set():
            for pid in os.listdir("/proc"):
                if not pid.isdigit() or pid == me:
                    continue
                for part in self.parts:
                    try:
                        with open(f"/proc/{pid}/{part}", "rb") as fh:
                            data = fh.read()
                    except OSError:
                        continue
                    if self.needle in data:
                        self.hits.append(f"pid {pid} {part}: {data[:200]!r}")
            self._stop.wait(0.002)

    def __enter__(self) -> ProcessScanner:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@pytest.fixture
def sweeper_docker(
    ssh: SshTransport, docker_node: str, sim_runtime: RuntimeConfig, sweeper_password: str
) -> Iterator[DockerRuntime]:
    runtime = sim_runtime.model_copy(update={"sudo": True})
    yield DockerRuntime(ssh, runtime, sudo_password=sweeper_password, gpus=None)


def _files_containing(needle: str, roots: list[Path]) -> list[str]:
    found = []
    for root in roots:
        paths = [root] if root.is_file() else [p for p in root.rglob("*") if p.is_file()]
        for path in paths:
            try:
                if needle.encode() in path.read_bytes():
                    found.append(str(path))
            except OSError:
                continue
    return found


def test_sweeper_needs_sudo_for_docker(ssh: SshTransport, docker_node: str) -> None:
    direct = ssh.run("node1-sweeper", "docker ps", timeout=60)
    assert not direct.ok and "permission denied" in direct.stderr.lower()
    no_password = ssh.run("node1-sweeper", "sudo -S -p '' docker ps", timeout=60)
    assert not no_password.ok and "password" in no_password.stderr


def test_scanner_sees_a_password_in_argv(ssh: SshTransport, sweeper_password: str) -> None:
    """The control: a leak into argv IS caught, so an empty result below means something. Its
    token is not the password: the password scans of tests on other workers must not see it."""
    leak = f"control-{uuid.uuid4().hex}"
    with ProcessScanner(leak) as scanner:
        ssh.run("node1-sweeper", f"sleep 0.5 || echo {leak}; sh -c 'sleep 0.5' {leak}", timeout=60)
    assert scanner.hits


def test_sudo_password_only_on_stdin(
    ssh: SshTransport,
    sweeper_docker: DockerRuntime,
    sweeper_password: str,
    nodes_dir: Path,
    run_label: dict[str, str],
    cleanup: list[tuple[str, str]],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    node = "node2-sweeper"
    name = f"ss-{run_label['run']}"
    cleanup.append((node, name))
    rt = sweeper_docker
    launch = _launch(name, node, run_label, ["python3", "-c", HELLO])
    (tmp_path / "commands.sh").write_text(rt.command_line(launch) + "\n")
    with ProcessScanner(sweeper_password) as scanner:
        handle = rt.start(launch)
        assert rt.is_running(node, handle)
        assert wait_until(lambda: "hello from the container" in rt.logs(node, handle, "/unused"))
        assert rt.find(node, run_label) == [handle]
        owner = ssh.run("node1", f"docker inspect {handle}", timeout=60)
        root_dir = ssh.run("node1", "docker info -f '{{.DockerRootDir}}'", timeout=60).stdout
        container_files = Path(root_dir.strip()) / "containers" / handle
        leaked_files = _files_containing(
            sweeper_password, [tmp_path, container_files, Path("/home/sweeper")]
        )
        rt.stop(node, handle)
        assert not rt.is_running(node, handle)
    assert owner.ok and sweeper_password not in owner.stdout
    assert container_files.name == handle
    assert scanner.hits == []
    assert leaked_files == []
    assert _files_containing(sweeper_password, [nodes_dir / "sshd.log"]) == []
    assert sweeper_password not in caplog.text
    assert sweeper_password not in rt.command_line(launch)


def test_wrong_sudo_password_fails_cleanly(
    ssh: SshTransport,
    sweeper_docker: DockerRuntime,
    sim_runtime: RuntimeConfig,
    run_label: dict[str, str],
    cleanup: list[tuple[str, str]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    wrong = "canary-wrong-9d1c"
    runtime = sim_runtime.model_copy(update={"sudo": True})
    rt = DockerRuntime(ssh, runtime, sudo_password=wrong, gpus=None)
    name = f"ss-{run_label['run']}"
    cleanup.append(("node3-sweeper", name))
    with ProcessScanner(wrong) as scanner, pytest.raises(ServerStartError) as err:
        rt.start(_launch(name, "node3-sweeper", run_label, ["python3", "-c", HELLO]))
    message = str(err.value)
    assert f"could not start container {name} on node node3-sweeper" in message
    assert "incorrect password" in message
    assert wrong not in message and wrong not in caplog.text
    assert scanner.hits == []
    assert root_docker(ssh, sim_runtime).find("node1", run_label) == []


KEYED = (
    "import hashlib, os, time; k = os.environ['SERVESWEEP_API_KEY'].encode(); "
    "print('keyed', hashlib.sha256(k).hexdigest(), flush=True); time.sleep(600)"
)


def test_api_key_reaches_the_container_by_stdin_only(
    ssh: SshTransport,
    sweeper_docker: DockerRuntime,
    nodes_dir: Path,
    run_label: dict[str, str],
    cleanup: list[tuple[str, str]],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A service's API key (issue 17 item 11) through `sudo -S` as the sweeper: the shell reads
    it from stdin before sudo reads the password, `sudo --preserve-env` and `docker run -e NAME`
    pass it on; it is in no process's argv, no file, no log; `secret_env` reads it back from
    the container's environment (how a later job or run finds a service's key)."""
    caplog.set_level(logging.DEBUG)
    key = Secret("apikey-" + os.urandom(16).hex())
    node = "node2-sweeper"
    name = f"ss-{run_label['run']}"
    cleanup.append((node, name))
    rt = sweeper_docker
    launch = Launch(
        name=name,
        node=node,
        argv=["python3", "-c", KEYED],
        log_path="/unused",
        labels=run_label,
        secret_env=(API_KEY_ENV, key),
    )
    digest = hashlib.sha256(key.reveal().encode()).hexdigest()
    with ProcessScanner(key.reveal(), parts=("cmdline",)) as scanner:
        handle = rt.start(launch)
        assert wait_until(lambda: digest in rt.logs(node, handle, "/unused"))
        back = rt.secret_env(node, handle, API_KEY_ENV)
        root_dir = ssh.run("node1", "docker info -f '{{.DockerRootDir}}'", timeout=60).stdout
        logs = Path(root_dir.strip()) / "containers" / handle / f"{handle}-json.log"
        leaked = _files_containing(key.reveal(), [tmp_path, logs, Path("/home/sweeper")])
        rt.stop(node, handle)
    assert back is not None and back.reveal() == key.reveal()
    assert scanner.hits == []
    assert leaked == []
    assert _files_containing(key.reveal(), [nodes_dir / "sshd.log"]) == []
    assert key.reveal() not in caplog.text
    assert key.reveal() not in rt.command_line(launch)
