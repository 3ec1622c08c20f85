"""What a server start costs: the compile-cache folder that outlives a container, and the
CUDA-graph bound the matrix gives (`server.cuda_graph_max_bs: auto`)."""

from __future__ import annotations

import copy
import os
import stat
import subprocess
from pathlib import Path

import pytest
import yaml

from servesweep.cluster.owner import Owner
from servesweep.cluster.runtime import (
    COMPILE_CACHE_ENV,
    DockerRuntime,
    ProcessRuntime,
    cache_dir_prep,
    compile_cache_dir,
    purge_cache_line,
)
from servesweep.cluster.transport import LocalTransport
from servesweep.config.load import load_experiment, load_experiment_file
from servesweep.config.matrix import server_specs
from servesweep.serving.engines import ROUTER_ROLE, rank_commands
from servesweep.serving.launches import rank_launches
from servesweep.sim.cli import parse_args
from servesweep.sim.node import decode_graph_share

ROOT = Path(__file__).resolve().parents[2]
OWNER = Owner(user="alice", host="h", checkout="0123456789ab")


def _launches(exp, spec):  # type: ignore[no-untyped-def]
    return rank_launches(
        exp, spec, labels={}, owner=OWNER, pool=0, log_path=lambda role, node: f"/tmp/x/{node}"
    )


def _sh(line: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", "-c", line], capture_output=True, text=True, check=False)


# ---------------------------------------------------------------- compile caches


def test_docker_servers_mount_the_image_keyed_cache_with_the_jit_variables() -> None:
    exp = load_experiment_file(ROOT / "config/experiments/moe_prefill_gate.yaml", {})
    runtime = DockerRuntime(LocalTransport(), exp.runtime, sudo_password=None)
    spec = server_specs(exp)[0]
    for _, launch in _launches(exp, spec):
        folder = launch.cache_dir
        assert folder == f"/tmp/servesweep-alice-0123456789ab/compile-cache/{folder.split('/')[-1]}"
        assert folder.split("/")[-1].startswith("image_kimi3-sglang-mxfp4_phase5-")
        line = runtime.command_line(launch)
        assert f"-v {folder}:{folder} " in line and f"-e TRITON_CACHE_DIR={folder}/triton" in line
        assert set(COMPILE_CACHE_ENV) <= set(launch.env)
        # made private before docker could create it as root
        assert line.index("mkdir -p -m 0700") < line.index("docker run")
    # another image, another folder; the process runtime keys by the SGLang version
    other = exp.runtime.model_copy(update={"image": "kimi3-sglang-mxfp4:phase6"})
    assert compile_cache_dir(other, engine_version="0.5.23", owner_tag="t") != compile_cache_dir(
        exp.runtime, engine_version="0.5.23", owner_tag="t"
    )
    plain = exp.runtime.model_copy(update={"kind": "process", "image": None})
    assert "sglang_0.5.17-" in str(compile_cache_dir(plain, engine_version="0.5.17", owner_tag="t"))


def test_cache_can_be_turned_off_or_moved_and_never_changes_a_fingerprint() -> None:
    raw = yaml.safe_load((ROOT / "config/experiments/moe_prefill_gate.yaml").read_text())
    exp = load_experiment_file(ROOT / "config/experiments/moe_prefill_gate.yaml", {})
    moved = copy.deepcopy(raw)
    moved["runtime"]["compile_cache"] = {"base": "/scratch/alice/jit"}
    off = copy.deepcopy(raw)
    off["runtime"]["compile_cache"] = {"enabled": False}
    site = ROOT / "config/site"
    fps = {s.fingerprint for s in server_specs(exp)}
    for changed in (moved, off):
        assert {
            s.fingerprint for s in server_specs(load_experiment(changed, {}, site_dir=site))
        } == fps
    exp_moved = load_experiment(moved, {}, site_dir=site)
    _, launch = _launches(exp_moved, server_specs(exp_moved)[0])[0]
    assert str(launch.cache_dir).startswith("/scratch/alice/jit/image_")
    exp_off = load_experiment(off, {}, site_dir=site)
    _, launch = _launches(exp_off, server_specs(exp_off)[0])[0]
    assert launch.cache_dir is None and "TRITON_CACHE_DIR" not in launch.env
    bad = copy.deepcopy(raw)
    bad["runtime"]["compile_cache"] = {"base": "/scratch/$(id)"}
    with pytest.raises(Exception, match="compile_cache.base"):
        load_experiment(bad, {}, site_dir=site)


def test_the_pd_router_gets_no_cache() -> None:
    raw = yaml.safe_load((ROOT / "config/experiments/pd_standard.yaml").read_text())
    exp = load_experiment(raw, {}, site_dir=ROOT / "config/site")
    launches = _launches(exp, server_specs(exp)[0])
    assert {cmd.role for cmd, launch in launches if launch.cache_dir is None} == {ROUTER_ROLE}


def test_cache_folder_is_made_private_and_a_planted_link_is_refused(tmp_path: Path) -> None:
    base = tmp_path / "base"
    folder = base / "image_x-1234"
    base.mkdir(mode=0o777)
    os.chmod(base, 0o777)
    res = _sh(cache_dir_prep(str(folder)))
    assert res.returncode == 0, res.stderr
    for d in (base, folder):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700
    folder.rmdir()
    (tmp_path / "elsewhere").mkdir()
    folder.symlink_to(tmp_path / "elsewhere")
    res = _sh(cache_dir_prep(str(folder)))
    assert res.returncode != 0 and "no private folder" in res.stderr


def test_process_runtime_start_makes_the_cache_and_hands_the_variables_over(
    tmp_path: Path,
) -> None:
    raw = yaml.safe_load((ROOT / "config/config.yaml").read_text())
    raw["runtime"] = {"compile_cache": {"base": str(tmp_path / "cache")}}
    exp = load_experiment(raw, {})
    _, launch = _launches(exp, server_specs(exp)[0])[0]
    out = tmp_path / "env.txt"
    launch = type(launch)(
        name="t",
        node="local",
        argv=["sh", "-c", f"env > {out}"],
        log_path=str(tmp_path / "log"),
        env=launch.env,
        cache_dir=launch.cache_dir,
    )
    ProcessRuntime(LocalTransport()).start(launch)
    for _ in range(100):
        if out.exists() and "CUDA_CACHE_PATH" in out.read_text():
            break
        subprocess.run(["sleep", "0.05"], check=True)
    assert f"TRITON_CACHE_DIR={launch.cache_dir}/triton" in out.read_text()
    assert stat.S_IMODE(Path(str(launch.cache_dir)).stat().st_mode) == 0o700


def test_purge_removes_our_folder_and_leaves_a_link_alone(tmp_path: Path) -> None:
    folder = tmp_path / "c" / "image_x-1"
    (folder / "triton").mkdir(parents=True)
    assert _sh(purge_cache_line(str(folder))).stdout.strip() == "purged"
    assert not folder.exists()
    assert _sh(purge_cache_line(str(folder))).stdout.strip() == "absent"
    target = tmp_path / "keep"
    target.mkdir()
    folder.symlink_to(target)
    res = _sh(purge_cache_line(str(folder)))
    assert res.returncode != 0 and "not ours" in res.stderr and target.exists()


# ---------------------------------------------------------------- CUDA-graph bound


def _gate(**server: object) -> dict:
    raw = yaml.safe_load((ROOT / "config/experiments/moe_prefill_gate.yaml").read_text())
    raw["server"].update(server)
    return raw


def _argv(raw: dict) -> list[str]:
    exp = load_experiment(raw, {}, site_dir=ROOT / "config/site")
    return rank_commands(exp, server_specs(exp)[0])[0].argv


def test_auto_graph_bound_is_the_largest_concurrency_served_and_fingerprinted_resolved() -> None:
    site = ROOT / "config/site"
    argv = _argv(_gate(cuda_graph_max_bs="auto"))
    # engine.version 0.5.23: the decode flag (0.5.20 refuses the old name)
    assert argv[argv.index("--cuda-graph-max-bs-decode") + 1] == "16"  # concurrency [8, 16]
    old = _gate(cuda_graph_max_bs=4)
    old["engine"]["version"] = "0.5.12"
    old["guesses"].remove("engine.version")
    assert _argv(old)[_argv(old).index("--cuda-graph-max-bs") + 1] == "4"
    assert not any(a.startswith("--cuda-graph") for a in _argv(_gate()))  # unset: SGLang's

    def fps(raw: dict) -> list[str]:
        return [s.fingerprint for s in server_specs(load_experiment(raw, {}, site_dir=site))]

    auto = _gate(cuda_graph_max_bs="auto")
    also_16 = copy.deepcopy(auto)
    also_16["matrix"]["client"]["concurrency"] = [16, 2]
    assert fps(auto) == fps(also_16) == fps(_gate(cuda_graph_max_bs=16))
    assert fps(auto) != fps(_gate())
    only_8 = copy.deepcopy(auto)
    only_8["matrix"]["client"]["concurrency"] = [8]
    assert fps(only_8) == fps(_gate(cuda_graph_max_bs=8)) != fps(auto)


def test_sim_takes_the_bound_and_models_a_shorter_capture() -> None:
    ns = parse_args(["--model", "m", "--cuda-graph-max-bs-decode", "16"], env={})
    assert ns.cuda_graph_max_bs_decode == 16
    assert decode_graph_share(None) == 1.0 and decode_graph_share(512) == 1.0
    assert decode_graph_share(16) == pytest.approx(16 / 256)


def test_down_purge_caches_removes_this_configs_folder_on_every_node(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from servesweep.cluster.owner import current_owner
    from servesweep.config.paths import RunPaths
    from servesweep.serving.launches import node_cache_dir
    from servesweep.workflow.cli import purge_caches

    raw = yaml.safe_load((ROOT / "config/config.yaml").read_text())
    raw["runtime"] = {"compile_cache": {"base": str(tmp_path / "cache")}}
    exp = load_experiment(raw, {})
    paths = RunPaths(tmp_path / "results" / exp.run_id)
    folder = Path(str(node_cache_dir(exp, current_owner(paths.root.parent))))
    (folder / "triton").mkdir(parents=True)
    (tmp_path / "cache" / "another-image").mkdir()
    purge_caches(exp, paths)
    assert f"node local: compile cache {folder}: purged" in capsys.readouterr().out
    assert not folder.exists() and (tmp_path / "cache" / "another-image").exists()


def test_the_manifest_records_the_cache_folder(tmp_path: Path) -> None:
    from servesweep.config.paths import RunPaths
    from servesweep.workflow.manifest import build_manifest
    from servesweep.workflow.plan import pool_plan

    exp = load_experiment_file(ROOT / "config/config.yaml", {})
    paths = RunPaths(tmp_path / exp.run_id)
    pools = pool_plan(exp=exp, paths=paths, results_dir=tmp_path)
    manifest = build_manifest(exp=exp, server_info=[], repo=ROOT, pools=pools, owner_tag="t")
    cache = manifest["compile_cache"]
    assert cache["enabled"] and cache["dir"].startswith("/tmp/servesweep-t/compile-cache/sglang_")
    assert set(cache["env"]) == set(COMPILE_CACHE_ENV)
