"""Slurm command lines (exact), allocation names and the slurm config keys: no cluster needed."""

from __future__ import annotations

import shlex
from typing import Any

import pytest
import yaml

from servesweep.cluster.runtime import Launch
from servesweep.cluster.secrets import Secret
from servesweep.cluster.slurm import (
    SlurmRuntime,
    SlurmTransport,
    allocation_name,
    salloc_argv,
    step_argv,
)
from servesweep.config.load import load_experiment
from servesweep.config.schema import SlurmOptions
from servesweep.core.errors import ConfigError
from tests.helpers import REPO, deep_update

SLURM_DEFAULT = REPO / "config" / "experiments" / "default_slurm_local.yaml"


def _exp(**changes: Any):
    raw = deep_update(yaml.safe_load(SLURM_DEFAULT.read_text()), changes)
    return load_experiment(raw, {})


def _launch(**kw: Any) -> Launch:
    base = {
        "name": "servesweep-u-abc-run1-fp-server-r0",
        "node": "node1",
        "argv": ["python3", "-m", "sglang.launch_server", "--model-path", "/m x"],
        "log_path": "/tmp/servesweep-u-abc/run1/s/node1.log",
        "labels": {"run": "run1", "fingerprint": "fp"},
    }
    return Launch(**{**base, **kw})


def test_salloc_line_carries_every_option_and_withdraws_a_pending_request() -> None:
    options = SlurmOptions(
        partition="gpu",
        account="proj-1",
        time_limit="1-02:00:00",
        exclusive=True,
        sbatch_flags=["--qos=high", "--constraint=h200&ib"],
        pending_timeout_s=42,
    )
    argv = salloc_argv(
        name="servesweep-a-r-n1+n2", nodes=["n1", "n2"], options=options, gpus_per_node=8
    )
    assert argv == [
        "salloc",
        "--no-shell",
        "--job-name=servesweep-a-r-n1+n2",
        "--nodes=2",
        "--nodelist=n1,n2",
        "--partition=gpu",
        "--account=proj-1",
        "--time=1-02:00:00",
        "--exclusive",
        "--gres=gpu:8",
        "--immediate=42",
        "--qos=high",
        "--constraint=h200&ib",
    ]
    assert "--gres" not in " ".join(
        salloc_argv(name="x", nodes=["n1"], options=SlurmOptions(gpus_per_node=0), gpus_per_node=8)
    )


def test_allocation_name_is_owner_run_and_pool() -> None:
    assert allocation_name(owner_tag="u-abc", run_id="r1", nodes=["node3", "node4"]) == (
        "servesweep-u-abc-r1-node3+node4"
    )


def test_step_is_one_overlapping_task_on_one_node() -> None:
    assert step_argv("17", "node2", name="s") == [
        "srun", "--jobid=17", "--overlap", "-N1", "-n1", "-w", "node2", "--quiet", "--job-name=s"
    ]  # fmt: skip


def test_process_rank_is_an_srun_step_with_labels_and_a_quoted_log() -> None:
    exp = _exp(run_id="run1")
    runtime = SlurmRuntime(SlurmTransport(exp), exp.runtime)
    line = runtime.command_line(_launch())
    words = shlex.split(line)
    assert words[0] == "srun" and words[1].startswith("--jobid=$(squeue -h -u ")
    assert words[2:8] == ["--overlap", "-N1", "-n1", "-w", "node1", "--quiet"]
    assert "--job-name=servesweep-u-abc-run1-fp-server-r0" in words
    assert "--gres=gpu:8" in words
    inner = words[-1]
    assert words[-3:-1] == ["/bin/sh", "-c"]
    assert "{ env SERVESWEEP_LABEL_RUN=run1 SERVESWEEP_LABEL_FINGERPRINT=fp python3 -m" in inner
    assert "'/m x'" in inner and "> /tmp/servesweep-u-abc/run1/s/node1.log 2>&1" in inner
    # the log is also followed to the step's stdout: the head keeps a copy (allocation lost)
    assert "tail -n +1 -F --pid=$pid /tmp/servesweep-u-abc/run1/s/node1.log" in inner


def test_pyxis_rank_line_is_exact() -> None:
    exp = _exp(
        run_id="run1",
        runtime={
            "kind": "pyxis",
            "image": "/shared/img/sglang.sqsh",
            "mounts": ["/models:/models"],
        },
    )
    runtime = SlurmRuntime(SlurmTransport(exp), exp.runtime)
    line = runtime._step_line(_launch(), "123", gpus=True)
    inner = 'mkdir -p "$(dirname /tmp/servesweep-u-abc/run1/s/node1.log)"'
    assert line.startswith(
        "srun --jobid=123 --overlap -N1 -n1 -w node1 --quiet "
        "--job-name=servesweep-u-abc-run1-fp-server-r0 --gres=gpu:8 "
        "--container-image=/shared/img/sglang.sqsh "
        "--container-mounts=/models:/models,/tmp/servesweep-u-abc:/tmp/servesweep-u-abc "
        "/bin/sh -c "
    )
    script = shlex.split(line)[-1]
    assert inner in script
    assert script.endswith(
        "exec env SERVESWEEP_LABEL_RUN=run1 SERVESWEEP_LABEL_FINGERPRINT=fp python3 -m "
        "sglang.launch_server --model-path '/m x' > /tmp/servesweep-u-abc/run1/s/node1.log "
        "2>&1 < /dev/null"
    )


def test_apptainer_rank_line_is_exact() -> None:
    exp = _exp(run_id="run1", runtime={"kind": "apptainer", "image": "/shared/img/sglang.sif"})
    runtime = SlurmRuntime(SlurmTransport(exp), exp.runtime)
    script = shlex.split(runtime._step_line(_launch(), "123", gpus=True))[-1]
    assert script.endswith(
        "exec env SERVESWEEP_LABEL_RUN=run1 SERVESWEEP_LABEL_FINGERPRINT=fp apptainer exec --nv "
        "--bind /tmp/servesweep-u-abc:/tmp/servesweep-u-abc /shared/img/sglang.sif python3 -m "
        "sglang.launch_server --model-path '/m x' > /tmp/servesweep-u-abc/run1/s/node1.log "
        "2>&1 < /dev/null"
    )


def test_a_secret_goes_through_stdin_never_the_line() -> None:
    exp = _exp(run_id="run1")
    runtime = SlurmRuntime(SlurmTransport(exp), exp.runtime)
    launch = _launch(secret_env=("SERVESWEEP_API_KEY", Secret("sk-canary-123")))
    line = runtime.command_line(launch)
    assert "sk-canary-123" not in line
    assert "IFS= read -r SERVESWEEP_API_KEY" in line


def test_a_client_step_asks_for_no_gpu() -> None:
    exp = _exp(run_id="run1")
    runtime = SlurmRuntime(SlurmTransport(exp), exp.runtime)
    assert "--gres=none" in shlex.split(runtime.oneshot_line(_launch(accelerators=False)))


@pytest.mark.parametrize(
    ("changes", "needle"),
    [
        ({"runtime": {"kind": "pyxis", "image": "x.sqsh"}, "cluster": {"transport": "ssh"}},
         "pyxis needs cluster.transport slurm (got ssh)"),
        ({"runtime": {"kind": "docker", "image": "x"}}, "docker does not run under"),
        ({"runtime": {"kind": "apptainer"}}, "required when runtime.kind is apptainer"),
        ({"cluster": {"slurm": {"sbatch_flags": ["-p gpu"]}}}, "'-p gpu' is no `--name`"),
        ({"cluster": {"slurm": {"sbatch_flags": ["--time=1"]}}}, "set by servesweep"),
        ({"cluster": {"slurm": {"time_limit": "forever"}}}, "time_limit"),
        ({"cluster": {"slurm": {"partition": "gpu; rm -rf /"}}}, "partition"),
    ],
)  # fmt: skip
def test_bad_slurm_settings_are_one_line_errors(changes: dict, needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        _exp(**changes)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_seed_000_as_a_slurm_site_prints_the_exact_srun_lines(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from servesweep.workflow.cli import main

    seed = str(REPO / "config" / "experiments" / "moe_prefill_gate_slurm.yaml")
    assert main(["commands", "--configfile", seed]) == 0
    out = capsys.readouterr().out
    ranks = [line for line in out.splitlines() if "-server-r" in line]
    assert len(ranks) == 4 * 4  # 4 server configs x 4 nodes, one step each
    for rank, node in zip(ranks[:4], ["601", "602", "603", "604"], strict=True):
        words = shlex.split(rank)
        assert words[0] == "srun" and words[1].startswith("--jobid=")
        assert ["-w", node] == words[5:7]
        assert "--container-image=/data/images/kimi3-sglang-mxfp4-phase5.sqsh" in words
        assert " sglang.launch_server " in words[-1] and "--tp-size 32" in words[-1]
    clients = [line for line in out.splitlines() if "-client-" in line]
    assert clients and all("--gres=none" in c and "-w 601" in c for c in clients)


@pytest.mark.parametrize(
    ("limit", "seconds"),
    [("30", 1800), ("10:05", 605), ("04:00:00", 14400), ("1-02", 93600), ("2-00:30:10", 174610)],
)
def test_time_limit_in_seconds(limit: str, seconds: int) -> None:
    from servesweep.cluster.slurm import time_limit_seconds

    assert time_limit_seconds(limit) == seconds


def test_the_plan_prints_each_pools_salloc_line_and_checks_the_time_limit(tmp_path) -> None:
    from servesweep.config.paths import RunPaths
    from servesweep.workflow.plan import make_plan

    def plan(limit: str) -> str:
        exp = _exp(
            run_id="run1",
            cluster={"nodes": ["node1", "node2"], "pools": "auto", "nodes_per_server": 1,
                     "slurm": {"time_limit": limit}},
        )  # fmt: skip
        paths = RunPaths.for_run(exp, tmp_path)
        return make_plan(exp=exp, paths=paths, results_dir=tmp_path).render()

    text = plan("04:00:00")
    assert "slurm allocations: 2 (one per pool" in text
    assert "--nodelist=node1 --partition=debug --time=04:00:00 --gres=gpu:8" in text
    assert "-run1-node2 --nodes=1 --nodelist=node2" in text
    assert "slurm time limit 4h00m00s covers the estimate" in text
    assert "WARNING: slurm time limit 1m00s is shorter than the estimate" in plan("1")


SRC = "docker://nvcr.io#org/sglang:0.5.9"
PART = "/shared/img/s.sqsh.partial"


@pytest.mark.parametrize(
    ("kind", "get"),
    [
        ("pyxis", ["enroot", "import", "-o", PART, SRC]),
        ("apptainer", ["apptainer", "pull", PART, SRC]),
    ],
)
def test_an_image_is_imported_once_under_a_lock(kind: str, get: list[str]) -> None:
    exp = _exp(runtime={"kind": kind, "image": "/shared/img/s.sqsh", "source": SRC})
    line = SlurmRuntime(SlurmTransport(exp), exp.runtime).import_line()
    assert line == (
        'mkdir -p "$(dirname /shared/img/s.sqsh)" && flock /shared/img/s.sqsh.lock sh -c '
        + shlex.quote(
            f"if [ -s /shared/img/s.sqsh ]; then echo present; else rm -f {PART} "
            f"&& {shlex.join(get)} && mv {PART} /shared/img/s.sqsh && echo imported; fi"
        )
    )


def test_source_is_for_slurm_containers_and_needs_a_path() -> None:
    with pytest.raises(ConfigError, match="absolute path"):
        _exp(runtime={"kind": "pyxis", "image": "sglang.sqsh", "source": "docker://x"})
    with pytest.raises(ConfigError, match="import"):
        _exp(runtime={"kind": "pyxis", "image": "/i.sqsh", "build": {"pull": True}})
