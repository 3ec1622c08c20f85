"""CLI: SGLang's flag names, aliases, choices and argparse errors (exit 2)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from servesweep.sim.cli import (
    MOE_RUNNER_BACKENDS,
    parse_args,
    parse_faults_env,
    resolved_args,
    split_addr,
)


def test_workflow_flags_parse_with_sglang_names_and_defaults() -> None:
    ns = parse_args(
        [
            "--model-path",
            "/models/k",
            "--tp-size",
            "32",
            "--ep-size",
            "32",
            "--nnodes",
            "4",
            "--node-rank",
            "3",
            "--dist-init-addr",
            "10.0.0.1:20000",
            "--moe-runner-backend",
            "marlin",
            "--chunked-prefill-size",
            "8192",
            "--page-size",
            "64",
            "--kv-cache-dtype",
            "fp8_e4m3",
            "--disable-radix-cache",
            "--mem-fraction-static",
            "0.85",
            "--max-running-requests",
            "64",
            "--trust-remote-code",
            "--log-level",
            "warning",
            "--enable-metrics",
            "--disaggregation-mode",
            "prefill",
            "--disaggregation-bootstrap-port",
            "9000",
            "--disaggregation-ib-device",
            "mlx5_0,mlx5_1",
            "--disaggregation-transfer-backend",
            "nixl",
            "--skip-server-warmup",
            "--watchdog-timeout",
            "600",
            "--served-model-name",
            "kimi",
            "--tokenizer-path",
            "/tok",
            "--host",
            "0.0.0.0",
            "--port",
            "31000",
            "--sim-time-scale",
            "0.01",
            "--sim-seed",
            "3",
            "--sim-startup-s",
            "5",
            "--sim-http-500-at",
            "1,3",
            "--sim-midstream-error-at",
            "2",
            "--sim-hang-at",
            "4",
            "--sim-crash-after",
            "7",
            "--sim-fail-start",
        ]
    )
    assert (ns.tp_size, ns.ep_size, ns.nnodes, ns.node_rank) == (32, 32, 4, 3)
    assert ns.moe_runner_backend == "marlin" and ns.chunked_prefill_size == 8192
    assert ns.disable_radix_cache and ns.enable_metrics and ns.trust_remote_code
    assert ns.disaggregation_mode == "prefill" and ns.disaggregation_bootstrap_port == 9000
    assert ns.sim_http_500_at == [1, 3] and ns.sim_hang_at == [4] and ns.sim_crash_after == 7
    assert ns.sim_fail_start and ns.sim_time_scale == 0.01


def test_defaults_and_resolved_args() -> None:
    ns = parse_args(["--model", "sim/x"])
    assert (ns.host, ns.port, ns.tp_size, ns.moe_runner_backend) == ("127.0.0.1", 30000, 1, "auto")
    assert ns.sim_time_scale == 1.0 and ns.sim_startup_s == 30.0 and ns.sim_http_500_at == []
    args = resolved_args(ns)
    assert args["model_path"] == args["served_model_name"] == args["tokenizer_path"] == "sim/x"
    assert args["disaggregation_mode"] == "null"


def test_aliases_and_unique_prefixes_work_like_sglang() -> None:
    ns = parse_args(["--model", "m", "--tensor-parallel-size", "8", "--ep", "4", "--dp", "2"])
    assert (ns.tp_size, ns.ep_size, ns.dp_size) == (8, 4, 2)
    assert parse_args(["--model", "m", "--nccl-init-addr", "h:1"]).dist_init_addr == "h:1"
    assert parse_args(["--model", "m", "--tp", "2"]).tp_size == 2


def test_sglang_0_5_23_runner_choices() -> None:
    for name in ("marlin", "flashinfer_mxfp4", "triton", "flashinfer_trtllm", "deep_gemm"):
        assert name in MOE_RUNNER_BACKENDS
        assert parse_args(["--model", "m", "--moe-runner-backend", name])


@pytest.mark.parametrize(
    "argv",
    [
        ["--tp-size", "8"],  # --model-path is required
        ["--model", "m", "--moe-runner-backend", "nope"],
        ["--model", "m", "--disaggregation-mode", "both"],
        ["--model", "m", "--nnodes", "2"],  # no --dist-init-addr
        ["--model", "m", "--nnodes", "2", "--node-rank", "2", "--dist-init-addr", "h:1"],
        ["--model", "m", "--nnodes", "2", "--dist-init-addr", "nohostport"],
        ["--model", "m", "--tp-size", "8", "--ep-size", "3"],
        ["--model", "m", "--chunked-prefill-size", "0"],
        ["--model", "m", "--sim-http-500-at", "a,b"],
        ["--model", "m", "--sim-time-scale", "-1"],
        ["--model", "m", "--cuda-graph-max-bs", "8"],  # unknown (removed in 0.5.20)
    ],
)
def test_bad_flags_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(argv)
    assert exc.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_unknown_flag_makes_the_process_exit_2() -> None:
    res = subprocess.run(
        [sys.executable, "-m", "servesweep.sim", "--model", "m", "--no-such-flag"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 2
    assert "unrecognized arguments: --no-such-flag" in res.stderr


def test_split_addr() -> None:
    assert split_addr("10.0.0.1:20000") == ("10.0.0.1", 20000)
    assert split_addr("[::1]:5") == ("::1", 5)
    with pytest.raises(ValueError):
        split_addr("host")


def test_zero_time_scale_is_the_zero_cost_mode_and_profiles_are_named() -> None:
    ns = parse_args(["--model", "m", "--sim-time-scale", "0", "--sim-profile",
                     "kimi-k3-rtx6000d-pd"], env={})  # fmt: skip
    assert ns.sim_time_scale == 0.0 and ns.sim_profile == "kimi-k3-rtx6000d-pd"
    assert parse_args(["--model", "m"], env={}).sim_profile == "default"


def test_faults_from_env_merge_with_flags() -> None:
    env = {
        "SERVESWEEP_SIM_FAULTS": json.dumps(
            {"http_500_at": [3, 1], "sim-hang-at": "7", "crash_after": 5, "fail_start": False}
        )
    }
    ns = parse_args(["--model", "m", "--sim-http-500-at", "1,2"], env=env)
    assert ns.sim_http_500_at == [1, 2, 3] and ns.sim_hang_at == [7]
    assert ns.sim_crash_after == 5 and not ns.sim_fail_start
    flag_wins = parse_args(["--model", "m", "--sim-crash-after", "2"], env=env)
    assert flag_wins.sim_crash_after == 2
    on = parse_args(["--model", "m"], env={"SERVESWEEP_SIM_FAULTS": '{"sim_fail_start": true}'})
    assert on.sim_fail_start


@pytest.mark.parametrize(
    "value",
    ["not json", "[1]", '{"nope": 1}', '{"crash_after": -1}', '{"hang_at": ["a"]}',
     '{"fail_start": 1}', '{"midstream_error_at": "x,y"}'],
)  # fmt: skip
def test_bad_fault_env_exits_2(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(["--model", "m"], env={"SERVESWEEP_SIM_FAULTS": value})
    assert exc.value.code == 2
    assert "SERVESWEEP_SIM_FAULTS" in capsys.readouterr().err


def test_fault_env_keys_parse() -> None:
    assert parse_faults_env('{"sim_http_500_at": "0,4", "crash-after": null}') == {
        "http_500_at": [0, 4],
        "crash_after": None,
    }
