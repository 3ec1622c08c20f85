"""Fault injection flags on a real simulator subprocess over real HTTP."""

from __future__ import annotations

import http.client
import json
import socket
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.support.simprocess import SimProcess, start_sim

FAST = ["--model", "sim/m", "--port", "0", "--sim-time-scale", "0.001", "--sim-startup-s", "1"]


def post(url: str, body: dict[str, Any], timeout: float = 30) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def health(url: str) -> int:
    try:
        with urllib.request.urlopen(url + "/health", timeout=30) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code


def gen(n: int = 4, *, stream: bool = True) -> dict[str, Any]:
    return {"input_ids": [3] * 64, "stream": stream, "sampling_params": {"max_new_tokens": n}}


def sse_events(raw: bytes) -> list[str]:
    return [x.removeprefix(b"data: ").decode() for x in raw.split(b"\n\n") if x.strip()]


def test_fail_start_logs_a_traceback_and_exits_1(tmp_path: Path) -> None:
    proc = start_sim(argv=[*FAST, "--sim-fail-start"], log_path=tmp_path / "s.log")
    assert proc.wait_exit() == 1
    log = proc.log()
    assert "Load weight begin." in log
    assert "Scheduler hit an exception: Traceback (most recent call last):" in log
    assert "CUDA out of memory" in log
    assert "fired up" not in log


def test_per_request_faults_follow_arrival_order_and_skip_health_checks(
    tmp_path: Path,
) -> None:
    argv = [
        *FAST,
        "--sim-http-500-at",
        "1,4",
        "--sim-midstream-error-at",
        "2",
        "--sim-hang-at",
        "3",
    ]
    with start_sim(argv=argv, log_path=tmp_path / "s.log") as proc:
        proc.wait_ready()
        url = proc.url
        status, raw = post(url + "/generate", gen())  # index 0: fine
        assert status == 200 and sse_events(raw)[-1] == "[DONE]"
        assert health(url) == 200  # health checks take no index
        status, raw = post(url + "/generate", gen())  # index 1: HTTP 500
        assert status == 500 and json.loads(raw)["error"]["code"] == 500
        assert health(url) == 200
        status, raw = post(url + "/generate", gen())  # index 2: mid-stream error
        events = sse_events(raw)
        assert status == 200 and events[-1] == "[DONE]" and len(events) == 2
        error = json.loads(events[0])["error"]
        assert error["code"] == 500 and error["retryable"] is False and error["message"]
        assert set(error) == {"message", "type", "code", "retryable"}
        with pytest.raises((TimeoutError, socket.timeout)):  # index 3: never answered
            post(url + "/generate", gen(), timeout=1.0)
        status, raw = post(url + "/v1/completions", {"prompt": "x", "max_tokens": 2})
        assert status == 500 and json.loads(raw)["object"] == "error"  # index 4 (OpenAI)
        status, raw = post(url + "/generate", gen(stream=False))  # index 5: fine again
        assert status == 200 and json.loads(raw)["meta_info"]["completion_tokens"] == 4
        assert health(url) == 200
    assert "Traceback" not in proc.log()


def test_crash_after_n_requests_kills_the_server_with_a_scheduler_traceback(
    tmp_path: Path,
) -> None:
    with start_sim(argv=[*FAST, "--sim-crash-after", "2"], log_path=tmp_path / "s.log") as proc:
        proc.wait_ready()
        url = proc.url
        for _ in range(2):
            status, raw = post(url + "/generate", gen())
            assert status == 200 and sse_events(raw)[-1] == "[DONE]"
        assert health(url) == 200  # an uncounted request does not trigger the crash
        with pytest.raises((http.client.HTTPException, ConnectionError, urllib.error.URLError)):
            status, raw = post(url + "/generate", gen())
            assert sse_events(raw)[-1] == "[DONE]"  # (not reached when the crash is clean)
        code = proc.wait_exit()
    assert code != 0
    log = proc.log()
    assert "Scheduler hit an exception: Traceback (most recent call last):" in log
    assert "--sim-crash-after 2" in log


def test_crash_after_zero_crashes_on_the_first_request(tmp_path: Path) -> None:
    with start_sim(argv=[*FAST, "--sim-crash-after", "0"], log_path=tmp_path / "s.log") as proc:
        proc.wait_ready()  # warmup is not a counted request
        with pytest.raises((http.client.HTTPException, ConnectionError, urllib.error.URLError)):
            post(proc.url + "/generate", gen(stream=False))
        assert proc.wait_exit() != 0
    assert "Scheduler hit an exception:" in proc.log()


@pytest.mark.parametrize(
    ("kind", "fatal", "exit_code"),
    [
        # issue 28: a crash in another process, a native library's crash
        ("detokenizer", "process_exception", 1),
        ("native", "native_crash", -11),
    ],
)
def test_crash_kinds_kill_the_server_as_sglang_dies(
    tmp_path: Path, kind: str, fatal: str, exit_code: int
) -> None:
    from servesweep.serving import logscan

    argv = [*FAST, "--sim-crash-after", "0", "--sim-crash-kind", kind]
    with start_sim(argv=argv, log_path=tmp_path / "s.log") as proc:
        proc.wait_ready()
        with pytest.raises((http.client.HTTPException, ConnectionError, urllib.error.URLError)):
            post(proc.url + "/generate", gen(stream=False))
        assert proc.wait_exit() == exit_code
    findings = logscan.fatal_findings(proc.log())
    assert findings and findings[0].name == fatal
    assert "Scheduler hit an exception" not in proc.log()


def test_request_before_ready_is_refused_and_takes_no_index(tmp_path: Path) -> None:
    from tests.support.simprocess import free_port

    port = free_port()
    argv = [
        "--model",
        "m",
        "--port",
        str(port),
        "--sim-startup-s",
        "0.8",
        "--sim-http-500-at",
        "0",
        "--skip-server-warmup",
    ]
    proc: SimProcess
    with start_sim(argv=argv, log_path=tmp_path / "s.log") as proc:
        proc.wait_for_line("Load weight begin.")
        status, _ = post(f"http://127.0.0.1:{port}/generate", gen(1))
        assert status == 503
        proc.wait_ready()
        assert post(f"http://127.0.0.1:{port}/generate", gen(1))[0] == 500


def test_faults_from_the_environment_act_like_the_flags(tmp_path: Path) -> None:
    env = {"SERVESWEEP_SIM_FAULTS": json.dumps({"http_500_at": [0], "midstream_error_at": "1"})}
    with start_sim(argv=FAST, log_path=tmp_path / "s.log", env=env) as proc:
        proc.wait_ready()
        status, raw = post(proc.url + "/generate", gen())  # index 0: HTTP 500
        assert status == 500 and json.loads(raw)["error"]["code"] == 500
        status, raw = post(proc.url + "/generate", gen())  # index 1: mid-stream error
        events = sse_events(raw)
        assert status == 200 and "error" in json.loads(events[0]) and events[-1] == "[DONE]"
        status, raw = post(proc.url + "/generate", gen(stream=False))  # index 2: fine
        assert status == 200 and json.loads(raw)["meta_info"]["completion_tokens"] == 4
    log = proc.log()
    assert "Fault injection from SERVESWEEP_SIM_FAULTS:" in log
    assert "sim_http_500_at=[0], sim_midstream_error_at=[1]" in log


def test_bad_fault_env_makes_the_process_exit_2(tmp_path: Path) -> None:
    env = {"SERVESWEEP_SIM_FAULTS": '{"explode": true}'}
    proc = start_sim(argv=FAST, log_path=tmp_path / "s.log", env=env)
    assert proc.wait_exit() == 2
    assert "SERVESWEEP_SIM_FAULTS: unknown key 'explode'" in proc.log()
