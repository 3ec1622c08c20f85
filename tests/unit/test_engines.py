"""Tests of servesweep.serving.engines: launch commands per rank, version checks, sim flags."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from servesweep.config.load import load_experiment
from servesweep.config.matrix import server_specs
from servesweep.core.errors import ConfigError
from servesweep.serving.engines import (
    KEYED_LAUNCH,
    base_url,
    check_experiment,
    moe_runners,
    parse_version,
    rank_commands,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def raw() -> dict:
    """The embedded default with its "auto" ports fixed (the numbers the assertions use)."""
    raw = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    raw["engine"] |= {"port": 30000, "dist_init_port": 20000}
    return raw


def _flag(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_sim_command_has_sglang_flags_and_sim_flags(raw: dict) -> None:
    exp = load_experiment(raw, {})
    spec = server_specs(exp)[0]
    [cmd] = rank_commands(exp, spec)
    # The keyed launch: the API key comes from the environment, never from argv.
    assert cmd.argv[:4] == ["python3", "-c", KEYED_LAUNCH, "servesweep.sim"] and cmd.keyed
    assert "--api-key" not in cmd.argv and "--enable-metrics" in cmd.argv
    assert _flag(cmd.argv, "--moe-runner-backend") == "marlin"
    assert _flag(cmd.argv, "--chunked-prefill-size") == "8192"
    assert _flag(cmd.argv, "--tp-size") == "8"
    assert _flag(cmd.argv, "--host") == "127.0.0.1"
    assert "--disable-radix-cache" in cmd.argv
    assert "--nnodes" not in cmd.argv  # single node
    assert _flag(cmd.argv, "--sim-time-scale") == str(exp.engine.sim.time_scale)
    seeds = {_flag(rank_commands(exp, s)[0].argv, "--sim-seed") for s in server_specs(exp)}
    assert len(seeds) == 4, "each server config gets its own noise stream"
    assert base_url(exp, spec) == "http://127.0.0.1:30000"


def test_multi_node_sglang_ranks(raw: dict) -> None:
    raw = copy.deepcopy(raw)
    raw["cluster"] = {
        "transport": "ssh",
        "nodes": ["n601", "n602", "n603", "n604"],
        "addresses": {"n601": "10.0.0.1"},
        "gpus_per_node": 8,
    }
    raw["engine"]["kind"] = "sglang"
    raw["server"].update(tp_size=32, ep_size=32)
    exp = load_experiment(raw, {})
    cmds = rank_commands(exp, server_specs(exp)[0])
    assert [c.node for c in cmds] == ["n601", "n602", "n603", "n604"]
    for rank, cmd in enumerate(cmds):
        assert cmd.argv[:4] == ["python3", "-c", KEYED_LAUNCH, "sglang.launch_server"]
        assert _flag(cmd.argv, "--node-rank") == str(rank)
        assert _flag(cmd.argv, "--nnodes") == "4"
        assert _flag(cmd.argv, "--dist-init-addr") == "10.0.0.1:20000"
        assert _flag(cmd.argv, "--host") == "0.0.0.0"
        assert not any(a.startswith("--sim-") for a in cmd.argv)


def test_moe_runner_checked_against_pinned_version(raw: dict) -> None:
    assert parse_version("0.5.10.post1") == (0, 5, 10)
    assert "marlin" in moe_runners("0.5.23")
    assert "marlin" not in moe_runners("0.5.9")
    # server_args.MOE_RUNNER_BACKEND_CHOICES of the 0.5.17 wheel (the H200 rehearsal's)
    assert sorted(moe_runners("0.5.17")) == sorted(
        "auto deep_gemm triton triton_kernel flashinfer_trtllm experimental_sgl_trtllm "
        "flashinfer_trtllm_routed flashinfer_cutlass flashinfer_mxfp4 flashinfer_cutedsl cutlass "
        "aiter marlin humming experimental_sgl_marlin hpc_ops".split()
    )
    assert "megamoe" in moe_runners("0.5.23") and "megamoe" not in moe_runners("0.5.17")
    raw = copy.deepcopy(raw)
    raw["engine"]["version"] = "0.5.9"
    exp = load_experiment(raw, {})
    with pytest.raises(ConfigError, match="'marlin' is not a MoE runner of SGLang 0.5.9"):
        check_experiment(exp, server_specs(exp))


def test_sim_fault_flags(raw: dict) -> None:
    raw = copy.deepcopy(raw)
    raw["engine"]["sim"]["faults"] = {
        "http_500_at": [3],
        "midstream_error_at": [1, 2],
        "crash_after": 5,
        "fail_start": True,
    }
    exp = load_experiment(raw, {})
    argv = rank_commands(exp, server_specs(exp)[0])[0].argv
    assert _flag(argv, "--sim-http-500-at") == "3"
    assert _flag(argv, "--sim-midstream-error-at") == "1,2"
    assert _flag(argv, "--sim-crash-after") == "5"
    assert "--sim-fail-start" in argv


def test_corrupting_sims_are_the_listed_runners_and_pd_decode(raw: dict) -> None:
    raw = copy.deepcopy(raw)
    raw["engine"]["sim"]["faults"] = {"corrupt_runners": ["flashinfer_mxfp4"]}
    exp = load_experiment(raw, {})
    flagged = {
        spec.axes["moe_runner_backend"]: "--sim-corrupt" in rank_commands(exp, spec)[0].argv
        for spec in server_specs(exp)
    }
    assert flagged == {"marlin": False, "flashinfer_mxfp4": True}
    pd = yaml.safe_load((ROOT / "config" / "experiments" / "pd_standard_local.yaml").read_text())
    pd["engine"]["sim"]["faults"] = {"corrupt_transfer": True}
    exp = load_experiment(pd, {})
    ranks = rank_commands(exp, server_specs(exp)[0])
    corrupt = {r.role for r in ranks if "--sim-corrupt" in r.argv}
    assert corrupt == {"decode"}


def test_no_key_where_sglang_refuses_one(raw: dict) -> None:
    """Multi-tokenizer mode asserts no API key (0.5.9, 0.5.23): such a server starts without."""
    raw = copy.deepcopy(raw)
    raw["server"]["extra_args"] = ["--tokenizer-worker-num", "4"]
    exp = load_experiment(raw, {})
    [cmd] = rank_commands(exp, server_specs(exp)[0])
    assert not cmd.keyed and cmd.argv[1] == "-m"
