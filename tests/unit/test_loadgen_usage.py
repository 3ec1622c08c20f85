"""Tests of the outside usage wrapper, run for real around small Python children, and of its
line's parser."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from servesweep.measure.loadgen import usage

PY = sys.executable
BURN = "import time\nwhile time.process_time() < 0.5: pass"
WAIT_S = 30.0  # bound of every wait for a condition below (not a timed assert)


def run_wrapped(code: str, *, env: dict[str, str] | None = None) -> tuple[int, str]:
    """The wrapper around `python -c code`, run to its end: its exit code and stderr."""
    proc = subprocess.run(
        usage.wrapped([PY, "-c", code], python=PY),
        capture_output=True,
        text=True,
        timeout=WAIT_S,
        env=env,
    )
    return proc.returncode, proc.stderr


def figures(stderr: str) -> usage.ProcessUsage:
    found = usage.parse(stderr)
    assert found is not None, stderr
    return found


def test_cpu_burning_child_is_counted_a_sleeping_one_near_zero():
    # CPU seconds, not shares: a loaded machine gives the burner a fraction of a core (23 % seen
    # at load 4-15 on 2 cores, 14 % at load 13 here), but what it burned is still counted.
    rc, err = run_wrapped(BURN)
    burn = usage.columns(figures(err).to_dict())
    assert rc == 0
    assert burn["client_process_cpu_s"] >= 0.5  # the child burns until it has used 0.5 s
    assert burn["client_process_cpu_s"] <= burn["client_process_wall_s"] * 1.05  # one thread
    rc, err = run_wrapped("import time; time.sleep(1.0)")
    sleep = usage.columns(figures(err).to_dict())
    assert rc == 0 and sleep["client_process_wall_s"] >= 1.0
    # The sleeper's CPU is its interpreter start-up: ~0.03 s, 0.04 s at load 13 here (CPU time
    # grows little under load, unlike wall time). A wrapper that counted wall time as CPU gives
    # >= 1.0 s, one that counted the burner's or its own time wrongly misses the 0.5 s above.
    assert sleep["client_process_cpu_s"] < 0.25
    assert sleep["client_process_cpu_pct"] < 25  # < 0.25 s over >= 1.0 s: load only lowers it
    assert figures(err).max_rss_kb > 1000  # a Python process holds megabytes


def test_exit_code_and_signal_death_pass_through():
    rc, err = run_wrapped("raise SystemExit(3)")
    assert rc == 3 and figures(err).returncode == 3
    assert err.rstrip().endswith("}") and err.count(usage.MARK) == 1  # one line, the last
    rc, err = run_wrapped("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert rc == 128 + signal.SIGKILL and figures(err).returncode == 128 + signal.SIGKILL


def test_child_gets_the_environment_and_the_client_argv_unchanged():
    code = "import os, sys; sys.exit(0 if os.environ['OPENAI_API_KEY'] == 'k' else 5)"
    assert run_wrapped(code, env={**os.environ, "OPENAI_API_KEY": "k"})[0] == 0
    argv = usage.wrapped(["py", "-m", "x", "--flag"], python="python3")
    assert argv[:2] == ["python3", "-c"] and argv[3:] == ["py", "-m", "x", "--flag"]
    assert "servesweep" not in argv[2].replace(usage.MARK, "")  # SGLang's image lacks it
    assert "'" not in argv[2] and "\n" not in argv[2]  # one plainly quoted line in commands.sh


def _start_child_reporting_pid(
    tmp_path: Path, *, prelude: str = "", own_group: bool = False
) -> tuple[subprocess.Popen[str], int]:
    """The wrapper around a child that runs `prelude`, writes its pid and then sleeps; both
    pids. `own_group`: the wrapper leads a process group of its own (for a Ctrl-C to it)."""
    pid_file = tmp_path / "child.pid"
    code = (
        f"import os, signal, time; {prelude}"
        f"open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"
    )
    wrapper = subprocess.Popen(
        usage.wrapped([PY, "-c", code], python=PY),
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=own_group,
    )
    deadline = time.monotonic() + WAIT_S
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline, "the child never started"
        time.sleep(0.02)
    return wrapper, int(pid_file.read_text())


def _gone(pid: int) -> bool:
    """Whether a process has exited (a zombie counts as gone), waiting up to WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state == "Z":
            return True
        time.sleep(0.02)
    return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_wrapper_reaches_the_child(tmp_path, sig):
    wrapper, child = _start_child_reporting_pid(tmp_path)
    try:
        wrapper.send_signal(sig)
        _, err = wrapper.communicate(timeout=WAIT_S)
    finally:
        wrapper.kill()
    assert _gone(child), "the child outlived its wrapper"
    # Either signal ends the child by SIGTERM; the wrapper's own code names the one it got
    # (130 for Ctrl-C), so the job tells an interruption from the client's own failure.
    assert figures(err).returncode == 128 + signal.SIGTERM
    assert wrapper.returncode == 128 + sig


def test_ctrl_c_to_the_group_ends_a_child_that_half_handles_sigint(tmp_path):
    """A Ctrl-C reaches the wrapper and its child alike; a child that takes SIGINT as a request
    to wind down and then never does (asyncio after a second SIGINT can) still ends."""
    wrapper, child = _start_child_reporting_pid(
        tmp_path, prelude="signal.signal(signal.SIGINT, lambda n, f: None); ", own_group=True
    )
    try:
        os.killpg(wrapper.pid, signal.SIGINT)
        _, err = wrapper.communicate(timeout=WAIT_S)
    finally:
        wrapper.kill()
    assert _gone(child), "the child outlived the Ctrl-C"
    assert figures(err).returncode == 128 + signal.SIGTERM
    assert wrapper.returncode == 128 + signal.SIGINT  # an interruption, as the job reports it


def test_a_killed_wrapper_takes_its_child_along(tmp_path):
    wrapper, child = _start_child_reporting_pid(tmp_path)
    wrapper.kill()  # SIGKILL: no handler runs; the child's parent-death signal does
    wrapper.communicate(timeout=WAIT_S)
    assert _gone(child), "the child outlived its SIGKILLed wrapper"


LINE = {"wall_s": 2.0, "cpu_user_s": 0.5, "cpu_sys_s": 0.25, "max_rss_kb": 90000, "returncode": 0}


def test_parse_the_last_marked_line_even_after_output_without_a_newline():
    text = f"bench output\n{usage.MARK}{json.dumps({**LINE, 'wall_s': 9.0})}\n"
    text += f"partial tqdm bar{usage.MARK}{json.dumps(LINE)}\n"
    assert usage.parse(text) == usage.ProcessUsage(**LINE)
    assert usage.columns(LINE) == {
        "client_process_wall_s": 2.0,
        "client_process_cpu_s": 0.75,
        "client_process_cpu_pct": pytest.approx(37.5),
    }


@pytest.mark.parametrize(
    "text",
    [
        "",
        "Serving Benchmark Result\n",
        f"{usage.MARK}{{not json\n",
        f"{usage.MARK}{json.dumps({**LINE, 'wall_s': 'long'})}\n",
        f"{usage.MARK}{json.dumps({**LINE, 'cpu_user_s': -1})}\n",
        f"{usage.MARK}{json.dumps({**LINE, 'returncode': True})}\n",
        f"{usage.MARK}{json.dumps({k: v for k, v in LINE.items() if k != 'cpu_sys_s'})}\n",
        f"{usage.MARK}[1, 2]\n",
        f"{usage.MARK}" + json.dumps(LINE)[:20],  # cut short (a full disk)
    ],
)
def test_missing_or_garbled_line_is_no_figures(text):
    assert usage.parse(text) is None


@pytest.mark.parametrize("value", [None, {}, "x", {**LINE, "wall_s": math.nan}])
def test_columns_of_an_absent_or_bad_record_value_are_nan(value):
    assert all(math.isnan(v) for v in usage.columns(value).values())
    assert list(usage.columns(value)) == list(usage.COLUMNS)
