"""Tests of config.site: site files under experiments, guesses, and the commands warnings."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from servesweep.config.load import load_experiment, load_experiment_file
from servesweep.config.site import apply_site, guessed_values
from servesweep.core.errors import ConfigError
from servesweep.workflow.cli import main
from tests.helpers import REPO

PD = REPO / "config" / "experiments" / "pd_standard.yaml"


def _site(tmp_path: Path) -> Path:
    site = tmp_path / "site"
    site.mkdir()
    (site / "lab.yaml").write_text(
        yaml.safe_dump(
            {
                "guesses": ["engine.model_path", "engine.version"],
                "engine": {"model_path": "/m", "version": "0.5.9", "port": 31234},
            }
        )
    )
    return site


def test_experiment_keys_win_over_the_site_and_overridden_guesses_are_not_warned(
    tmp_path: Path,
) -> None:
    site = _site(tmp_path)
    raw = {"site": "lab", "engine": {"version": "0.5.23"}, "run_id": "x"}
    merged = apply_site(raw, site)
    assert merged["engine"] == {"model_path": "/m", "version": "0.5.23", "port": 31234}
    assert [(k, v) for k, v, _ in guessed_values(raw, site)] == [("engine.model_path", "/m")]


def test_a_missing_site_file_is_one_line_naming_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config key 'site': no site file"):
        load_experiment({"site": "nowhere"}, {}, site_dir=tmp_path)


def test_the_seed_experiment_takes_its_facts_from_its_site_file() -> None:
    exp = load_experiment_file(PD, {})
    assert exp.site == "rtx6000d"
    assert exp.engine.model_path == "/data/models/Kimi-K3"
    assert exp.secrets.sudo_password_file == "/data/hzy/.sudo_password"


def test_commands_warns_on_guesses_and_unresolved_aliases(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("SUDO_PASSWORD", raising=False)
    monkeypatch.delenv("SUDO_PASSWORD_FILE", raising=False)
    assert main(["commands", "--configfile", str(PD)]) == 0
    err = capsys.readouterr().err.splitlines()
    assert "warning: evidence.d_rdma_ready_ack = " in err[0] and "pd_standard.yaml" in err[0]
    assert "warning: evidence.p_kv_inflight = " in err[1] and "pd_standard.yaml" in err[1]
    [model] = [line for line in err if "warning: engine.model_path = " in line]
    assert "'/data/models/Kimi-K3' is a guess" in model and "rtx6000d.yaml" in model
    # runtime.build.base and runtime.build.contract.sglang_files_changed too; and the NIC
    # settings the seed's cluster needs
    assert sum("is a guess" in line for line in err) == 15
    for nic in ("cluster.socket_ifname = 'bond0'", "runtime.env.NCCL_IB_HCA = 'mlx5_0,"):
        assert any(f"warning: {nic}" in line and "pd_standard.yaml" in line for line in err)
    assert any("warning: runtime.env.MC_GID_INDEX = " in line for line in err)
    assert any("runtime.build.contract.sglang_files_changed" in line for line in err)
    aliases = [line for line in err if "no ssh alias resolves" in line]
    assert len(aliases) == 8 and "601:20000 would be used" in aliases[0]


def test_the_default_site_folder_is_the_checkouts() -> None:
    from servesweep.config.site import DEFAULT_SITE_DIR

    assert Path(__file__).resolve().parents[2] / "config" / "site" == DEFAULT_SITE_DIR
    assert DEFAULT_SITE_DIR.is_dir()


@pytest.mark.parametrize("name", ["moe_prefill_gate", "pd_standard", "pd_pp1_control"])
def test_every_real_config_lists_its_guesses_in_commands(
    name: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SUDO_PASSWORD", raising=False)
    monkeypatch.delenv("SUDO_PASSWORD_FILE", raising=False)
    path = REPO / "config" / "experiments" / f"{name}.yaml"
    exp = load_experiment_file(path, {})
    assert main(["commands", "--configfile", str(path)]) == 0
    err = capsys.readouterr().err
    for key in exp.guesses:
        assert f"warning: {key} = " in err, key
    # seed 000's image tag, Dockerfile, model mount and path, NCCL_IB_HCA, ports, version
    expected = {"runtime.image", "runtime.mounts", "engine.model_path", "engine.version"}
    expected |= {"engine.port", "engine.dist_init_port"}
    if name == "moe_prefill_gate":
        expected |= {"runtime.build.dockerfile", "runtime.env.NCCL_IB_HCA"}
    else:
        expected |= {"evidence.d_rdma_ready_ack"}
    assert expected <= set(exp.guesses)


def test_a_guess_must_name_a_config_key_and_enters_lists_by_name(tmp_path: Path) -> None:
    from servesweep.config.guesses import lookup

    data = {"runtime": {"checks": [{"name": "mooncake-0.3.12.post1", "expect": "x"}]}}
    assert lookup(data, "runtime.checks.mooncake-0.3.12.post1.expect") == (True, "x")
    assert lookup(data, "runtime.checks.other") == (False, None)
    raw = yaml.safe_load(PD.read_text())
    raw["guesses"] = ["engine.no_such_key"]
    with pytest.raises(ConfigError, match="guesses.*'engine.no_such_key' names no config key"):
        load_experiment(raw, {}, site_dir=PD.parents[1] / "site")


def test_an_alias_bomb_in_a_site_file_is_one_line(tmp_path: Path) -> None:
    """Issue 26 item 14: the site is merged (copied) too; 9 levels of 9 aliases refused."""
    levels = ["a: &l0 [x, x, x, x, x, x, x, x, x]"]
    levels += [f"b{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 9)]
    (tmp_path / "bomb.yaml").write_text("\n".join(levels) + "\n")
    with pytest.raises(ConfigError) as err:
        apply_site({"site": "bomb"}, tmp_path)
    assert str(err.value).startswith(f"config key 'site': {tmp_path / 'bomb.yaml'}: key 'b5': ")
    assert "expands to more than 100,000 values" in str(err.value)


def test_the_pd_config_carries_the_nic_settings_of_the_seeds_cluster_as_guesses() -> None:
    """Seed 003's cluster: NCCL's HCAs, the ranks' socket interface and Mooncake's MC_* env,
    each a listed guess (named by `commands` and `doctor`, never enforced)."""
    from servesweep.serving.engines import socket_env

    exp = load_experiment_file(PD, {})
    assert exp.runtime.env["NCCL_IB_HCA"] == exp.server.disaggregation_ib_device
    mooncake = [k for k in exp.runtime.env if k.startswith("MC_")]
    assert mooncake == ["MC_GID_INDEX"]
    assert socket_env(exp) == {"GLOO_SOCKET_IFNAME": "bond0", "NCCL_SOCKET_IFNAME": "bond0"}
    nic = {
        "cluster.socket_ifname",
        "runtime.env.NCCL_IB_HCA",
        *(f"runtime.env.{k}" for k in mooncake),
    }
    assert nic <= set(exp.guesses)
