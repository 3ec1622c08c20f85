"""Bad configs: each kind is refused with one line naming the key, before anything starts."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from servesweep.cluster.secrets import sudo_password
from servesweep.config.load import load_experiment, load_experiment_file
from servesweep.config.matrix import server_specs
from servesweep.core.errors import ConfigError, SecretError, ServesweepError
from servesweep.serving.engines import check_experiment
from tests.helpers import DEFAULT_CONFIG, REPO, deep_update

PD_CONFIG = REPO / "config" / "experiments" / "pd_standard_local.yaml"


@dataclass(frozen=True)
class Bad:
    """One kind of bad configuration: how to make it, and what the error must name."""

    kind: str
    key: str  # must appear in the message
    change: dict[str, Any] = field(default_factory=dict)
    edit: Callable[[dict[str, Any]], None] | None = None
    env: dict[str, str] = field(default_factory=dict)
    base: Path = DEFAULT_CONFIG
    words: tuple[str, ...] = ()  # further words the message must contain
    exact: str | None = None  # the key `config key '...'` quotes (default: `key`; "": none)


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(raw: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node = raw
        for p in parents:
            node = node[p]
        node[last] = value

    return edit


def alias_bomb(levels: int = 9, width: int = 9) -> list[Any]:
    """Nested lists sharing each level (what YAML aliases load as): 9**9 values once copied,
    a few hundred objects in memory (yaml.safe_dump writes it back with anchors and aliases)."""
    node: list[Any] = ["x"] * width
    for _ in range(levels - 1):
        node = [node] * width
    return node


CONFIG_KINDS = [
    Bad("unknown key", "colour", {"colour": "blue"}, words=("unknown key",)),
    Bad(
        "unknown nested key (typo)",
        "engine.sim.faults.crash_afterr",
        {"engine": {"sim": {"faults": {"crash_afterr": 3}}}},
        words=("unknown key",),
    ),
    Bad("wrong type", "workload.num_requests", {"workload": {"num_requests": "many"}}),
    Bad("value out of range", "workload.num_requests", {"workload": {"num_requests": 0}}),
    Bad(
        "empty axis",
        "matrix.server.moe_runner_backend",
        {"matrix": {"server": {"moe_runner_backend": []}}},
        words=("empty axis",),
    ),
    Bad(
        "axis that is no argument",
        "matrix.client.concurency",
        {"matrix": {"client": {"concurency": [8]}}},
    ),
    Bad(
        "duplicate axis values",
        "matrix.client.concurrency",
        {"matrix": {"client": {"concurrency": [8, 8]}}},
        words=("duplicate",),
    ),
    Bad(
        "baseline not in the matrix",
        "baseline.moe_runner_backend",
        {"baseline": {"moe_runner_backend": "triton"}},
        words=("triton",),
    ),
    Bad(
        "baseline names no axis",
        "baseline.page_size",
        edit=_set("baseline", {"page_size": 64}),
        words=("not a matrix axis",),
    ),
    Bad(
        "duplicate node",
        "cluster",
        {"cluster": {"nodes": ["n1", "n1"], "gpus_per_node": 4}},
        exact="cluster.nodes",
        words=("duplicate node", "n1"),
    ),
    Bad(
        "TP x PP not equal to the GPUs",
        "server.tp_size",
        {"server": {"tp_size": 16, "ep_size": 8}},
        exact="server.tp_size",
        words=("nodes*gpus_per_node",),
    ),
    Bad(
        "EP not dividing TP",
        "ep_size",
        {"server": {"ep_size": 3}},
        words=("tp_size",),
        exact="server.ep_size",
    ),
    Bad(
        "unknown MoE runner for the pinned SGLang version",
        "moe_runner_backend",
        {"engine": {"version": "0.5.9"}},
        exact="matrix.server.moe_runner_backend",
        words=("marlin", "0.5.9"),
    ),
    Bad(
        "docker runtime without an image",
        "runtime",
        {"runtime": {"kind": "docker"}},
        exact="runtime.image",
    ),
    Bad("unknown transport", "cluster.transport", {"cluster": {"transport": "rsh"}}),
    Bad(
        "address for a node not in the cluster",
        "cluster",
        {"cluster": {"addresses": {"elsewhere": "127.0.0.9"}}},
        exact="cluster.addresses",
        words=("elsewhere",),
    ),
    Bad("run id that is no folder name", "run_id", {"run_id": "my run/1"}),
    Bad(
        "node name that is no folder name (it names the node's server log)",
        "cluster.nodes",
        {"cluster": {"nodes": ["../../escape"]}},
        words=("no single path segment",),
    ),
    Bad(
        "matrix value that is no folder name (it is part of the cell's folder)",
        "matrix.server.kv_cache_dtype",
        {"matrix": {"server": {"kv_cache_dtype": ["../../x"]}}},
        words=("no single path segment",),
    ),
    Bad(
        "server env name that is shell code",
        "server.env",
        {"server": {"env": {"A=1; touch X; B": "1"}}},
        words=("no name",),
    ),
    Bad(
        "runtime env name that is no name",
        "runtime.env",
        {"runtime": {"env": {"1X": "1"}}},
        words=("no name",),
    ),
    Bad(
        "chunked prefill size 0",
        "chunked_prefill_size",
        {"matrix": {"server": {"chunked_prefill_size": [0]}}},
        exact="matrix.server.chunked_prefill_size",
    ),
    Bad(
        "memory fraction above 1",
        "server.mem_fraction_static",
        {"server": {"mem_fraction_static": 1.5}},
    ),
    Bad(
        "YAML alias bomb in a matrix axis (9 levels of 9 aliases: 387 million values)",
        "matrix.server.moe_runner_backend",
        edit=_set("matrix.server.moe_runner_backend", alias_bomb()),
        words=("expands to more than 100,000 values",),
    ),
    Bad(
        "misspelt matrix axis",
        "matrix.server.moe_runer_backend",
        {"matrix": {"server": {"moe_runer_backend": ["marlin"]}}},
        words=("not a server argument", "did you mean 'moe_runner_backend'"),
    ),
    Bad(
        "misspelt server argument",
        "server.moe_runer_backend",
        {"server": {"moe_runer_backend": "marlin"}},
        words=("unknown key", "did you mean 'moe_runner_backend'"),
    ),
    Bad(
        "env EP_SIZE that is no integer",
        "EP_SIZE='abc'",
        env={"EP_SIZE": "abc"},
        exact="",
        words=("server.ep_size", "valid integer"),
    ),
    Bad("empty env narrowing", "BACKENDS_CSV", env={"BACKENDS_CSV": " , "}, exact=""),
    Bad(
        "env narrowing to a value of the wrong type",
        "matrix.client.concurrency",
        env={"CONCURRENCIES_CSV": "eight"},
        exact="",
        words=("CONCURRENCIES_CSV='eight'",),
    ),
    Bad(
        "env narrowing to an empty list",
        "CONCURRENCIES_CSV",
        env={"CONCURRENCIES_CSV": ""},
        exact="",
        words=("empty list",),
    ),
    Bad(
        "env narrowing with an empty item",
        "CONCURRENCIES_CSV",
        env={"CONCURRENCIES_CSV": "8,,16"},
        exact="",
        words=("empty item",),
    ),
    Bad(
        "page size differing between prefill and decode",
        "roles.decode.server.page_size",
        edit=_set("roles.decode.server.page_size", 32),
        base=PD_CONFIG,
        words=("prefill",),
    ),
]


def _raw(bad: Bad) -> dict[str, Any]:
    raw = deep_update(yaml.safe_load(bad.base.read_text()), bad.change)
    if bad.edit is not None:
        bad.edit(raw)
    return raw


def _validate(raw: dict[str, Any], env: dict[str, str]) -> None:
    """What the Snakefile does before anything starts (rules/common.smk)."""
    exp = load_experiment(raw, env)
    check_experiment(exp, server_specs(exp))


def _error(bad: Bad) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        _validate(_raw(bad), bad.env)
    return info.value


@pytest.mark.parametrize("bad", CONFIG_KINDS, ids=[b.kind for b in CONFIG_KINDS])
def test_bad_config_is_one_line_naming_the_key(
    bad: Bad, record_property: Callable[[str, object], None]
) -> None:
    record_property("kind", bad.kind)
    message = str(_error(bad))
    record_property("message", f"servesweep: ConfigError: {message}")
    assert "\n" not in message, message
    assert bad.key in message, message
    if bad.exact != "":  # an env variable is named as such, not as a config key
        assert message.startswith(f"config key '{bad.exact or bad.key}': "), message
    for word in bad.words:
        assert word in message, message


def test_the_base_configs_are_valid() -> None:
    """The kinds above fail because of their change, not because of their base."""
    for base in (DEFAULT_CONFIG, PD_CONFIG):
        _validate(yaml.safe_load(base.read_text()), {})


def test_yaml_that_is_no_mapping_is_one_line(
    tmp_path: Path, record_property: Callable[[str, object], None]
) -> None:
    record_property("kind", "experiment file that is no mapping")
    path = tmp_path / "exp.yaml"
    path.write_text("- just\n- a list\n")
    with pytest.raises(ConfigError) as info:
        load_experiment_file(path)
    record_property("message", f"servesweep: ConfigError: {info.value}")
    assert "\n" not in str(info.value) and str(path) in str(info.value)


# ---------------------------------------------------------------- the sudo password


def _password_file(tmp_path: Path, mode: int) -> Path:
    path = tmp_path / "sudo-password"
    path.write_text("canary-secret\n")
    path.chmod(mode)
    return path


SECRET_KINDS: list[tuple[str, Callable[[Path], dict[str, str]], str]] = [
    (
        "missing password file",
        lambda d: {"SUDO_PASSWORD_FILE": str(d / "nowhere")},
        "does not exist",
    ),
    (
        "password file readable by others",
        lambda d: {"SUDO_PASSWORD_FILE": str(_password_file(d, 0o644))},
        "chmod 600",
    ),
    (
        "password given twice (env and file)",
        lambda d: {
            "SUDO_PASSWORD": "x",
            "SUDO_PASSWORD_FILE": str(_password_file(d, 0o600)),
        },
        "only one",
    ),
    ("empty password", lambda d: {"SUDO_PASSWORD": ""}, "empty"),
]


@pytest.mark.parametrize(
    ("kind", "env", "words"), SECRET_KINDS, ids=[k for k, _, _ in SECRET_KINDS]
)
def test_bad_password_setting_is_one_line_without_the_secret(
    tmp_path: Path,
    kind: str,
    env: Callable[[Path], dict[str, str]],
    words: str,
    record_property: Callable[[str, object], None],
) -> None:
    record_property("kind", kind)
    with pytest.raises(SecretError) as info:
        sudo_password(env(tmp_path))
    message = str(info.value)
    record_property("message", f"servesweep: SecretError: {message}")
    assert "\n" not in message and words in message, message
    assert "SUDO_PASSWORD" in message or "password file" in message, message
    assert "canary-secret" not in message


# ---------------------------------------------------------------- the workflow refuses


def _snakemake(workdir: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("snakemake")
    assert exe, "snakemake is not installed"
    full = {k: v for k, v in os.environ.items() if not k.endswith("_CSV")}
    full.pop("RUN_ID", None)
    full.pop("EP_SIZE", None)
    return subprocess.run(
        [exe, "-s", str(REPO / "Snakefile"), "-d", str(workdir), *args],
        capture_output=True,
        text=True,
        env={**full, **env},
        timeout=300,
    )


WORKFLOW_KINDS = [
    b
    for b in CONFIG_KINDS
    if b.kind
    in (
        "unknown key",
        "baseline not in the matrix",
        "unknown MoE runner for the pinned SGLang version",
        "page size differing between prefill and decode",
        "env narrowing to a value of the wrong type",
        "YAML alias bomb in a matrix axis (9 levels of 9 aliases: 387 million values)",
    )
]


@pytest.mark.workflow
@pytest.mark.parametrize("bad", WORKFLOW_KINDS, ids=[b.kind for b in WORKFLOW_KINDS])
def test_dry_run_with_a_bad_config_prints_that_line_and_starts_nothing(
    tmp_path: Path, bad: Bad
) -> None:
    expected = f"servesweep: ConfigError: {_error(bad)}"
    config = tmp_path / "exp.yaml"
    config.write_text(yaml.safe_dump(_raw(bad), sort_keys=False))
    proc = _snakemake(tmp_path, "-n", "--configfile", str(config), env=bad.env)
    assert proc.returncode != 0
    lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.startswith("servesweep:")]
    assert lines == [expected]
    assert "Traceback" not in proc.stdout + proc.stderr
    assert not (tmp_path / "results").exists(), "nothing was started or written"


@pytest.mark.workflow
def test_run_with_an_unsafe_password_file_starts_nothing(tmp_path: Path) -> None:
    """The password is read when the first job needs a node (image check): one line, and no
    command reached any node (the nodes here do not even exist)."""
    password = _password_file(tmp_path, 0o644)
    raw = deep_update(
        yaml.safe_load(DEFAULT_CONFIG.read_text()),
        {
            "run_id": "bad-password",
            "engine": {"port": 30000, "dist_init_port": 20000},
            "cluster": {
                "transport": "ssh",
                "nodes": ["no-such-node"],
                "ssh": {"config_file": str(tmp_path / "no_ssh_config"), "connect_timeout_s": 1},
            },
            "runtime": {"kind": "docker", "image": "nowhere:latest", "sudo": True},
        },
    )
    config = tmp_path / "exp.yaml"
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    proc = _snakemake(
        tmp_path,
        "--cores",
        "1",
        "all",
        "--configfile",
        str(config),
        env={"SUDO_PASSWORD_FILE": str(password)},
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    [line] = [ln for ln in out.splitlines() if ln.startswith("servesweep:")]
    assert line.startswith("servesweep: SecretError: ") and "chmod 600" in line
    assert "canary-secret" not in out
    run_dir = tmp_path / "results" / "bad-password"
    assert not (run_dir / "orchestrator.log").exists(), "no server was started"
    assert not list(run_dir.glob("build/*.json")), "no image was checked"


def test_every_error_kind_is_a_servesweep_error() -> None:
    assert issubclass(ConfigError, ServesweepError) and issubclass(SecretError, ServesweepError)


def test_overrides_alone_say_how_to_keep_the_default():
    # what `snakemake --config run_id=x` leaves with replace-workflow-config (profile)
    with pytest.raises(ConfigError) as info:
        load_experiment({"run_id": "x"}, {})
    message = str(info.value)
    assert "\n" not in message and "--configfile config/config.yaml" in message


def test_an_empty_run_id_is_an_error():
    from servesweep.config.load import apply_env

    with pytest.raises(ConfigError, match="env RUN_ID='': empty"):
        apply_env({"run_id": "a"}, {"RUN_ID": ""})
    assert apply_env({"run_id": "a"}, {"RUN_ID": "b"})["run_id"] == "b"
    assert apply_env({"run_id": "a"}, {})["run_id"] == "a"
