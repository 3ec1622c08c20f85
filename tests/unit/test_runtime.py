"""Tests for cluster.runtime: DockerRuntime command lines and calls (through a real shell, with
stand-in `docker`/`sudo` programs), host Python mounts, and ProcessRuntime on this machine."""

from __future__ import annotations

import json
import logging
import os
import shlex
import shutil
import stat
import subprocess
import sys
import textwrap
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from servesweep.cluster.runtime import (
    DockerRuntime,
    Launch,
    ProcessRuntime,
    host_python_mounts,
    node_dir_prep,
    owner_dir,
)
from servesweep.cluster.secrets import Secret
from servesweep.cluster.transport import LocalTransport
from servesweep.config.schema import RuntimeConfig
from servesweep.core.errors import ConfigError, ServerStartError, TransportError, UnsafeName

CANARY = "canary-pw-7Hq2"

# A docker stand-in: keeps containers in a JSON file, records every call (argv, stdin).
FAKE_DOCKER = r"""
    import hashlib, json, os, sys
    state_dir = os.environ["FAKE_DOCKER_DIR"]
    state_path = os.path.join(state_dir, "containers.json")
    state = json.load(open(state_path)) if os.path.exists(state_path) else {}
    args = sys.argv[1:]
    with open(os.path.join(state_dir, "calls.jsonl"), "a") as fh:
        fh.write(json.dumps({"prog": "docker", "argv": args, "stdin": sys.stdin.read()}) + "\n")

    def save():
        json.dump(state, open(state_path, "w"))

    def lookup(ref):
        for cid, c in state.items():
            if cid == ref or c["name"] == ref:
                return cid
        print(f"Error: No such container: {ref}", file=sys.stderr)
        sys.exit(1)

    cmd = args[0]
    if cmd == "run":
        name = args[args.index("--name") + 1]
        labels = [args[i + 1] for i, a in enumerate(args) if a == "--label"]
        if any(c["name"] == name for c in state.values()):
            print(f"docker: Error response from daemon: Conflict. name {name}", file=sys.stderr)
            sys.exit(125)
        cid = hashlib.sha256(name.encode()).hexdigest()
        state[cid] = {"name": name, "labels": labels, "running": True, "argv": args}
        save()
        print(cid)
    elif cmd == "inspect":
        print("true" if state[lookup(args[-1])]["running"] else "false")
    elif cmd == "logs":
        c = state[lookup(args[-1])]
        print("out of " + c["name"])
        print("err of " + c["name"], file=sys.stderr)
    elif cmd == "rm":
        cid = lookup(args[-1])
        del state[cid]
        save()
        print(args[-1])
    elif cmd == "ps":
        wanted = [args[i + 1].removeprefix("label=") for i, a in enumerate(args) if a == "--filter"]
        for cid, c in state.items():
            if all(w in c["labels"] for w in wanted):
                print(cid)
    else:
        sys.exit(f"fake docker: unknown command {cmd}")
"""

# A sudo stand-in: `sudo -S -p '' cmd...` reads one password line from stdin and checks it.
FAKE_SUDO = r"""
    import json, os, sys
    state_dir = os.environ["FAKE_DOCKER_DIR"]
    args = sys.argv[1:]
    with open(os.path.join(state_dir, "calls.jsonl"), "a") as fh:
        fh.write(json.dumps({"prog": "sudo", "argv": args}) + "\n")
    assert args[:3] == ["-S", "-p", ""], args
    line = sys.stdin.readline()
    if not line:
        sys.exit("sudo: no password was provided")
    expected = open(os.path.join(state_dir, "password")).read()
    if line.rstrip("\n") != expected:
        print("Sorry, try again.", file=sys.stderr)
        sys.exit("sudo: 1 incorrect password attempt")
    os.execvp(args[3], args[3:])
"""


@dataclass
class FakeHost:
    """This machine with stand-in docker and sudo on PATH."""

    dir: Path
    docker: str

    def calls(self) -> list[dict[str, object]]:
        path = self.dir / "calls.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def containers(self) -> dict[str, dict[str, object]]:
        path = self.dir / "containers.json"
        return json.loads(path.read_text()) if path.exists() else {}


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeHost:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (("docker", FAKE_DOCKER), ("sudo", FAKE_SUDO)):
        exe = bin_dir / name
        exe.write_text(f"#!{sys.executable}\n" + textwrap.dedent(body))
        exe.chmod(0o755)
    (tmp_path / "password").write_text(CANARY)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_DOCKER_DIR", str(tmp_path))
    return FakeHost(tmp_path, str(bin_dir / "docker"))


def _config(**changes: object) -> RuntimeConfig:
    base: dict[str, object] = {"kind": "docker", "image": "lmsysorg/sglang:v0.5.9"}
    return RuntimeConfig.model_validate({**base, **changes})


def _launch(**changes: object) -> Launch:
    fields: dict[str, object] = {
        "name": "ss-run1-abc-r0",
        "node": "node1",
        "argv": ["python3", "-m", "sglang.launch_server", "--model-path", "/models/m"],
        "log_path": "/tmp/unused.log",
        "env": {"NCCL_DEBUG": "INFO"},
        "labels": {"run": "run1", "fp": "abc", "rank": "0"},
    }
    return Launch(**{**fields, **changes})  # type: ignore[arg-type]


# ---------------------------------------------------------------- command lines


def test_command_line_has_every_docker_flag_in_order() -> None:
    runtime = _config(
        shm_size="32g",
        privileged=True,
        devices=["/dev/infiniband"],
        ulimits=["memlock=-1", "stack=67108864"],
        env={"HF_TOKEN": "x", "NCCL_DEBUG": "WARN"},
        mounts=["/models:/models:ro"],
    )
    rt = DockerRuntime(LocalTransport(), runtime, sudo_password=None)
    line = rt.command_line(_launch())
    assert shlex.split(line) == [
        "docker", "run", "-d", "--name", "ss-run1-abc-r0", "--network", "host",
        "--ipc", "host", "--gpus", "all", "--shm-size", "32g", "--privileged",
        "--device", "/dev/infiniband", "--ulimit", "memlock=-1", "--ulimit", "stack=67108864",
        "-e", "HF_TOKEN=x", "-e", "NCCL_DEBUG=INFO", "-v", "/models:/models:ro",
        "--label", "servesweep.run=run1", "--label", "servesweep.fp=abc",
        "--label", "servesweep.rank=0", "lmsysorg/sglang:v0.5.9",
        "python3", "-m", "sglang.launch_server", "--model-path", "/models/m",
    ]  # fmt: skip


def test_command_line_minimal_and_without_gpus() -> None:
    rt = DockerRuntime(LocalTransport(), _config(), sudo_password=None, gpus=None)
    line = rt.command_line(_launch(env={}, labels={}, argv=["true"]))
    assert line == (
        "docker run -d --name ss-run1-abc-r0 --network host --ipc host --shm-size 32g "
        "lmsysorg/sglang:v0.5.9 true"
    )
    rt2 = DockerRuntime(LocalTransport(), _config(), sudo_password=None, gpus="device=0,1")
    assert "--gpus device=0,1 " in rt2.command_line(_launch())


def test_command_line_quotes_for_the_shell() -> None:
    argv = ["python3", "-c", "print('a b'); import sys", "--x=$HOME", "`id`", ";rm -rf /"]
    env = {"WEIRD": 'a\'b "c" $d'}
    rt = DockerRuntime(LocalTransport(), _config(), sudo_password=None)
    line = rt.command_line(_launch(argv=argv, env=env, labels={"note": "x y"}))
    words = shlex.split(line)
    assert words[-len(argv) :] == argv
    assert 'WEIRD=a\'b "c" $d' in words
    assert "servesweep.note=x y" in words


def test_sudo_command_line_never_contains_the_password() -> None:
    rt = DockerRuntime(LocalTransport(), _config(sudo=True), sudo_password=CANARY)
    line = rt.command_line(_launch())
    assert line.startswith("sudo -S -p '' docker run -d ")
    assert CANARY not in line
    # the same line without a password (what commands.sh shows)
    no_pw = DockerRuntime(LocalTransport(), _config(sudo=True), sudo_password=None)
    assert no_pw.command_line(_launch()) == line


def test_password_is_ignored_without_runtime_sudo() -> None:
    rt = DockerRuntime(LocalTransport(), _config(), sudo_password=CANARY)
    assert rt.command_line(_launch()).startswith("docker run ")


def test_runtime_without_image_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="runtime.image"):
        DockerRuntime(LocalTransport(), RuntimeConfig(), sudo_password=None)


# ---------------------------------------------------------------- calls, through a real shell


def test_start_inspect_logs_find_stop(host: FakeHost) -> None:
    rt = DockerRuntime(LocalTransport(), _config(), sudo_password=None, docker=host.docker)
    launch = _launch(argv=["python3", "-c", "print('a b')"])
    handle = rt.start(launch)
    assert len(handle) == 64
    stored = host.containers()[handle]
    assert stored["argv"][-3:] == ["python3", "-c", "print('a b')"]  # type: ignore[index]
    assert rt.is_running("node1", handle)
    assert rt.logs("node1", handle, launch.log_path) == (
        "out of ss-run1-abc-r0\nerr of ss-run1-abc-r0\n"
    )
    assert rt.find("node1", {"run": "run1"}) == [handle]
    assert rt.find("node1", {"run": "run1", "fp": "abc"}) == [handle]
    assert rt.find("node1", {"run": "other"}) == []
    rt.stop("node1", handle)
    assert not rt.is_running("node1", handle)
    assert rt.logs("node1", handle, launch.log_path) == ""
    rt.stop("node1", handle)  # already gone: fine
    assert rt.find("node1", {"run": "run1"}) == []
    programs = {c["prog"] for c in host.calls()}
    assert programs == {"docker"}


def test_failed_start_names_container_node_and_reason(host: FakeHost) -> None:
    rt = DockerRuntime(LocalTransport(), _config(), sudo_password=None, docker=host.docker)
    rt.start(_launch())
    with pytest.raises(ServerStartError) as err:
        rt.start(_launch())
    message = str(err.value)
    assert "container ss-run1-abc-r0 on node node1 (exit 125)" in message
    assert "Conflict" in message


def test_start_refuses_output_that_is_no_container_id() -> None:
    rt = DockerRuntime(LocalTransport(), _config(), sudo_password=None, docker="echo")
    with pytest.raises(ServerStartError, match="could not start container"):
        rt.start(_launch())


def test_sudo_password_goes_to_sudo_on_stdin_only(
    host: FakeHost, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    rt = DockerRuntime(
        LocalTransport(), _config(sudo=True), sudo_password=Secret(CANARY), docker=host.docker
    )
    handle = rt.start(_launch())
    assert rt.is_running("node1", handle)
    assert "out of" in rt.logs("node1", handle, "/x")
    assert rt.find("node1", {"fp": "abc"}) == [handle]
    rt.stop("node1", handle)
    calls = host.calls()
    sudo_calls = [c for c in calls if c["prog"] == "sudo"]
    docker_calls = [c for c in calls if c["prog"] == "docker"]
    assert len(sudo_calls) == len(docker_calls) == 5  # every docker call went through sudo
    assert all(c["argv"][:4] == ["-S", "-p", "", host.docker] for c in sudo_calls)
    assert all(c["stdin"] == "" for c in docker_calls)  # sudo consumed the password line
    assert CANARY not in json.dumps([c["argv"] for c in calls])
    assert CANARY not in json.dumps(host.containers())
    assert CANARY not in caplog.text


def test_wrong_sudo_password_fails_without_showing_it(host: FakeHost) -> None:
    wrong = "canary-wrong-55"
    rt = DockerRuntime(
        LocalTransport(), _config(sudo=True), sudo_password=wrong, docker=host.docker
    )
    with pytest.raises(ServerStartError) as err:
        rt.start(_launch())
    assert "incorrect password" in str(err.value)
    assert wrong not in str(err.value) and CANARY not in str(err.value)
    with pytest.raises(TransportError) as err2:
        rt.find("node1", {"run": "run1"})
    assert wrong not in str(err2.value)
    assert host.containers() == {}


def test_sudo_without_password_gets_empty_stdin(host: FakeHost) -> None:
    rt = DockerRuntime(LocalTransport(), _config(sudo=True), sudo_password=None, docker=host.docker)
    with pytest.raises(ServerStartError, match="no password was provided"):
        rt.start(_launch())


# ---------------------------------------------------------------- host python mounts


def test_host_python_mounts_cover_this_interpreter_and_package() -> None:
    mounts = host_python_mounts()
    sources = [m.split(":")[0] for m in mounts]
    assert all(m == f"{s}:{s}:ro" for m, s in zip(mounts, sources, strict=True))
    assert len(set(sources)) == len(sources)

    def covered(path: str) -> bool:
        return any(covered_by(path, s) for s in sources)

    import servesweep

    assert covered(os.path.realpath(sys.executable)) or covered(sys.executable)
    # the folder holding servesweep/ (the sys.path entry of an editable install), not only it
    assert covered(str(Path(servesweep.__file__).resolve().parents[1]))
    assert covered(os.path.dirname(os.__file__))  # the stdlib
    assert "/lib" in sources and "/usr/lib" in sources
    nested = [(s, o) for s in sources for o in sources if s != o and covered_by(s, o)]
    assert nested == []


def covered_by(path: str, other: str) -> bool:
    return path == other or path.startswith(other.rstrip("/") + "/")


# ---------------------------------------------------------------- ProcessRuntime


def _wait_until(predicate, limit_s: float = 15.0) -> bool:  # type: ignore[no-untyped-def]
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def test_process_runtime_lifecycle(tmp_path: Path) -> None:
    rt = ProcessRuntime(LocalTransport())
    tag = uuid.uuid4().hex[:8]
    log = tmp_path / "logs" / "server.log"
    launch = Launch(
        name="p",
        node="local",
        argv=["sh", "-c", "echo started $GREETING; exec sleep 300"],
        log_path=str(log),
        env={"GREETING": "hi there"},
        labels={"run": tag},
    )
    handle = rt.start(launch)
    try:
        assert rt.is_running("local", handle)
        assert _wait_until(lambda: "started hi there" in rt.logs("local", handle, str(log)))
        assert rt.find("local", {"run": tag}) == [handle]
        assert rt.find("local", {"run": tag + "x"}) == []
    finally:
        rt.stop("local", handle, grace_s=5)
    assert not rt.is_running("local", handle)
    assert rt.find("local", {"run": tag}) == []


def _sh(line: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", "-c", line], cwd=cwd, capture_output=True, text=True)


def test_node_dir_is_private_to_its_owner(tmp_path: Path) -> None:
    """The owner directory is made 0700; one planted first as a symlink (another user of the
    node) makes the command fail, and nothing is written through the link."""
    tag = f"test-{uuid.uuid4().hex[:12]}"
    root = Path(owner_dir(tag))
    try:
        res = _sh(f"{node_dir_prep(f'{root}/run/bench/x.jsonl')} && echo ok", tmp_path)
        assert res.stdout.strip() == "ok", res.stderr
        assert root.is_dir() and not root.is_symlink()
        assert stat.S_IMODE(root.stat().st_mode) == 0o700
        assert (root / "run" / "bench").is_dir()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    target = tmp_path / "victim"
    target.mkdir()
    root.symlink_to(target)
    try:
        res = _sh(f"{node_dir_prep(f'{root}/run/x.log')} && echo ok", tmp_path)
        assert res.returncode != 0 and "ok" not in res.stdout
        assert f"{root} on " in res.stderr and "no private directory" in res.stderr
        assert list(target.iterdir()) == []
    finally:
        root.unlink()


def test_shell_lines_quote_env_and_paths(tmp_path: Path) -> None:
    """A server.env name that is shell code never runs; a path with a space makes no junk
    folders; a name that is no name is refused before any shell line is built."""
    log = tmp_path / "a b" / "c.log"
    res = _sh(node_dir_prep(str(log)), tmp_path)
    assert res.returncode == 0 and log.parent.is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a b"]
    launch = Launch(
        name="p",
        node="local",
        argv=["sh", "-c", "echo $A"],
        log_path=str(log),
        env={"A": "1; touch X; B=2"},
    )
    res = _sh(ProcessRuntime(LocalTransport()).oneshot_line(launch), tmp_path)
    assert res.returncode == 0 and log.read_text() == "1; touch X; B=2\n"
    assert not (tmp_path / "X").exists()
    evil = Launch(
        name="p", node="local", argv=["true"], log_path=str(log), env={"A=1; touch X; B": "1"}
    )
    with pytest.raises(UnsafeName, match="no name"):
        ProcessRuntime(LocalTransport()).oneshot_line(evil)
    with pytest.raises(UnsafeName, match="no name"):
        DockerRuntime(
            LocalTransport(), RuntimeConfig(kind="docker", image="i"), sudo_password=None
        ).command_line(evil)
    assert not (tmp_path / "X").exists()


def test_process_runtime_gives_runtime_env_to_every_process(tmp_path: Path) -> None:
    """runtime.env reaches plain processes as it reaches containers (NCCL_NVLS_ENABLE=0 on the
    GPU machine); a launch's own env wins. Found writing the multi-GPU rehearsal: the process
    runtime dropped it, and `commands` showed no NCCL setting."""
    rt = ProcessRuntime(LocalTransport(), env={"NCCL_NVLS_ENABLE": "0", "SHARED": "runtime"})
    launch = Launch(
        name="p",
        node="local",
        argv=["sh", "-c", "echo $NCCL_NVLS_ENABLE $SHARED"],
        log_path=str(tmp_path / "out.log"),
        env={"SHARED": "launch"},
        labels={},
    )
    assert "NCCL_NVLS_ENABLE=0" in rt.command_line(launch)
    res = _sh(rt.oneshot_line(launch), tmp_path)
    assert res.returncode == 0 and (tmp_path / "out.log").read_text() == "0 launch\n"


def test_a_log_with_an_invalid_utf8_byte_is_read_and_its_finding_named(tmp_path: Path) -> None:
    """A native library wrote one byte that is no UTF-8 into the server's log: reading it
    through the transport (live checks, and the stop that onerror runs) replaces the byte,
    and the fatal line it stands on is still found."""
    from servesweep.serving import logscan

    log = tmp_path / "server.log"
    line = r"[2026-01-01 00:00:00 TP3] \377 NCCL error: unhandled system error"
    subprocess.run(
        ["/bin/sh", "-c", f"printf 'up\\n{line}\\n' > {shlex.quote(str(log))}"], check=True
    )
    assert b"\xff" in log.read_bytes()
    text = ProcessRuntime(LocalTransport()).logs("local", "1", str(log))
    assert "\ufffd NCCL error" in text
    assert [f.name for f in logscan.fatal_findings(text)] == ["nccl_error"]
