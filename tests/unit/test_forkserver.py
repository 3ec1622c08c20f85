"""Tests of servesweep.forkserver with real processes: a real server, real job processes."""

from __future__ import annotations

import ast
import importlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from servesweep import forkserver
from tests.helpers import REPO, wait_until

JOBS = "tests.support.forkjobs"
# What scripts/<rule>.py does: hand argv to forkserver.run_job.
JOB_SCRIPT = (
    "import sys; from servesweep import forkserver; forkserver.run_job(sys.argv[1], sys.argv[2:])"
)


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A running fork server that preloaded the test jobs; the socket path."""
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    path = forkserver.start([JOBS], log=tmp_path / "forkserver.log")
    try:
        yield path
    finally:
        forkserver.stop()


def job(target: str, *argv: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", JOB_SCRIPT, f"{JOBS}:{target}", *argv],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        process_group=0,  # as Snakemake's jobs share its group: one group to signal
    )


def server_pid() -> int:
    assert forkserver._server is not None
    return forkserver._server.pid


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def ends(pid: int) -> bool:
    """Whether process `pid` is gone within 10 s."""
    return wait_until(lambda: not alive(pid), limit_s=10)


def test_job_runs_in_a_child_of_the_server_with_the_callers_files_cwd_env_and_argv(
    server: str, tmp_path: Path
) -> None:
    proc = job("report", "3", "x y", cwd=tmp_path, env={"FORKJOB_MARKER": "m1"})
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 3, err
    seen = json.loads(out)
    assert seen["ppid"] == server_pid() != proc.pid
    assert seen["cwd"] == str(tmp_path)
    assert seen["argv"] == ["3", "x y"]
    assert seen["sys_argv"] == ["-c", f"{JOBS}:report", "3", "x y"]
    assert seen["marker"] == "m1"
    assert err == "to stderr\n"


def test_exit_statuses_and_errors_come_back_as_the_interpreter_reports_them(
    server: str, tmp_path: Path
) -> None:
    ok = job("report", "0", cwd=tmp_path)
    assert ok.wait(timeout=60) == 0
    message = job("fail", "message", cwd=tmp_path)
    _, err = message.communicate(timeout=60)
    assert (message.returncode, err) == (1, "job said no\n")
    broken = job("fail", "raise", cwd=tmp_path)
    _, err = broken.communicate(timeout=60)
    assert broken.returncode == 1
    assert "Traceback" in err and "ValueError: job broke" in err


def test_the_child_joins_the_job_process_group_and_gets_its_ctrl_c(
    server: str, tmp_path: Path
) -> None:
    pid_file = tmp_path / "child.pid"
    proc = job("wait", str(pid_file), cwd=tmp_path)
    assert wait_until(pid_file.exists, limit_s=10), "the job did not start"
    child = int(pid_file.read_text())
    assert os.getpgid(child) == proc.pid
    os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C: once to each process of the group
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130
    assert err.count("job interrupted") == 1
    assert ends(child)


def test_sigterm_to_the_job_process_alone_reaches_the_child(server: str, tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    proc = job("wait", str(pid_file), cwd=tmp_path)
    assert wait_until(pid_file.exists, limit_s=10), "the job did not start"
    proc.terminate()  # what Snakemake does to a job it cancels
    proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM
    assert ends(int(pid_file.read_text()))


def test_sigkill_to_the_job_group_ends_the_child_and_what_it_started(
    server: str, tmp_path: Path
) -> None:
    """Snakemake SIGKILLed with its jobs' group: nothing of the job may go on writing files."""
    pid_file = tmp_path / "child.pid"
    proc = job("wait", str(pid_file), "spawn", cwd=tmp_path)
    assert wait_until(lambda: pid_file.exists() and " " in pid_file.read_text(), limit_s=10)
    child, grandchild = map(int, pid_file.read_text().split())
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert ends(child) and ends(grandchild)


def test_a_killed_job_process_takes_its_child_along(server: str, tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    proc = job("wait", str(pid_file), cwd=tmp_path)
    assert wait_until(pid_file.exists, limit_s=10), "the job did not start"
    proc.kill()
    proc.wait(timeout=30)
    child = int(pid_file.read_text())
    assert ends(child), "the child outlived its killed job process"
    assert alive(server_pid()), "the server must keep serving other jobs"


def test_without_a_server_the_job_runs_in_its_own_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(forkserver.SOCKET_ENV, raising=False)
    proc = job("report", "0", cwd=tmp_path)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert json.loads(out)["pid"] == proc.pid


def test_an_unreachable_server_leaves_the_job_to_its_own_process(tmp_path: Path) -> None:
    gone = tmp_path / "gone"
    proc = job("report", "0", cwd=tmp_path, env={forkserver.SOCKET_ENV: str(gone)})
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert json.loads(out)["pid"] == proc.pid
    assert err.startswith(f"servesweep: fork server at {gone} is not there")
    assert "running the job in this process" in err


def test_stop_ends_the_server_and_removes_its_socket(tmp_path: Path) -> None:
    path = forkserver.start([], log=tmp_path / "forkserver.log")
    pid = server_pid()
    assert os.environ[forkserver.SOCKET_ENV] == path
    assert oct(Path(path).parent.stat().st_mode & 0o777) == "0o700"
    forkserver.stop()
    assert not alive(pid)
    assert not Path(path).parent.exists()
    assert forkserver.SOCKET_ENV not in os.environ
    assert f"fork server {pid} served 0 jobs" in (tmp_path / "forkserver.log").read_text()


STARTER = """
import os, sys
from servesweep import forkserver
print(forkserver.start([], log=sys.argv[1]), forkserver._server.pid, flush=True)
os.kill(os.getpid(), 9)
"""


def test_the_server_ends_when_snakemake_is_gone(tmp_path: Path) -> None:
    starter = subprocess.run(
        [sys.executable, "-c", STARTER, str(tmp_path / "forkserver.log")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert starter.returncode == -signal.SIGKILL, starter.stderr
    path, pid = starter.stdout.split()
    assert ends(int(pid)), "the server outlived the process that started it"
    assert not Path(path).parent.exists()


def test_a_job_gets_any_picklable_argument(server: str, tmp_path: Path) -> None:
    code = (
        "from servesweep import forkserver; "
        f"forkserver.run_job('{JOBS}:echo', {{'input': ['a.csv'], 'n': 3}})"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"input": ["a.csv"], "n": 3}


def test_a_second_server_imports_the_later_modules_and_takes_over(tmp_path: Path) -> None:
    log = tmp_path / "forkserver.log"
    forkserver.start(["servesweep.forkserver"], ["pandas"], log=log)
    try:
        first = server_pid()
        assert wait_until(lambda: "takes over" in log.read_text(), limit_s=60)
        proc = job("report", "0", cwd=tmp_path)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        successor = json.loads(out)["ppid"]
        assert successor != first
        assert Path(f"/proc/{successor}/stat").read_text().split()[3] == str(first)
    finally:
        forkserver.stop()
    assert ends(successor), "the successor outlived the server"
    text = log.read_text()
    assert f"fork server {successor} takes over, with pandas too" in text
    assert f"fork server {successor} served 1 jobs" in text


def test_every_job_script_only_hands_its_job_to_the_fork_server() -> None:
    """scripts/<rule>.py start a Python process per job: they import the fork server's client
    (standard library only) and nothing else; the job itself lives in the package."""
    for script in sorted((REPO / "scripts").glob("*.py")):
        tree = ast.parse(script.read_text())
        imports = {
            ast.unparse(node) for node in tree.body if isinstance(node, ast.Import | ast.ImportFrom)
        }
        assert imports <= {"import sys", "from servesweep import forkserver"}, script.name
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
        assert [ast.unparse(c.func) for c in calls] == ["forkserver.run_job"], script.name
        module, _, name = ast.literal_eval(calls[0].args[0]).partition(":")
        assert callable(getattr(importlib.import_module(module), name)), script.name


def test_the_fork_server_client_imports_only_the_standard_library() -> None:
    code = (
        "import sys; before = set(sys.modules); import servesweep.forkserver; "
        "print(' '.join(sorted({m.split('.')[0] for m in set(sys.modules) - before})))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    loaded = set(proc.stdout.split()) - {"servesweep"}
    assert loaded <= set(sys.stdlib_module_names), loaded - set(sys.stdlib_module_names)


def test_a_server_that_cannot_import_its_modules_leaves_jobs_to_their_own_process(
    tmp_path: Path,
) -> None:
    log = tmp_path / "forkserver.log"
    forkserver.start(["servesweep.no_such_module"], log=log)
    try:
        pid = server_pid()
        assert ends(pid), "the server should have died on the import"
        proc = job("report", "0", cwd=tmp_path)
        out, err = proc.communicate(timeout=60)
    finally:
        forkserver.stop()
    assert proc.returncode == 0, err
    assert json.loads(out)["pid"] == proc.pid
    assert "running the job in this process" in err
    assert "ModuleNotFoundError: No module named 'servesweep.no_such_module'" in log.read_text()


def test_a_server_that_cannot_start_is_a_warning_and_jobs_run_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)  # a socket path beyond AF_UNIX's 108 bytes
    deep.mkdir(parents=True)
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    log = tmp_path / "forkserver.log"
    assert forkserver.start([JOBS], log=log) is None
    assert "the fork server did not start" in capsys.readouterr().err
    assert forkserver.SOCKET_ENV not in os.environ
    assert "AF_UNIX path too long" in log.read_text()
    proc = job("report", "0", cwd=tmp_path)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert json.loads(out)["pid"] == proc.pid
