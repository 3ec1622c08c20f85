"""Tests of cluster.images with a docker stand-in that runs smoke commands on this host."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
import yaml

from servesweep.cluster import moekernel
from servesweep.cluster.images import build_image, build_images, version_probe
from servesweep.cluster.owner import Owner
from servesweep.cluster.runtime import DockerRuntime
from servesweep.cluster.transport import LocalTransport
from servesweep.config.load import load_experiment, load_experiment_file
from servesweep.config.matrix import image_key
from servesweep.core.errors import DOCTOR_HINT, SmokeFailed, Unreachable
from servesweep.serving.engines import launch_targets
from tests.helpers import DEFAULT_CONFIG, REPO, deep_update
from tests.support.sglang_server import sglang_env

OWNER = Owner(user="tester", host="h", checkout="0123456789ab")

# `docker image inspect` answers for one image; `docker run --rm ... IMAGE argv` runs argv here;
# `docker build`/`pull` print a line. Every call is recorded.
FAKE_DOCKER = r"""
    import json, os, subprocess, sys, time
    args = sys.argv[1:]
    with open(os.environ["FAKE_DOCKER_CALLS"], "a") as fh:
        fh.write(json.dumps(args) + "\n")
    image = os.environ["FAKE_DOCKER_IMAGE"]
    bases = os.environ.get("FAKE_DOCKER_BASES", "").split(",")
    barrier = os.environ.get("FAKE_DOCKER_BARRIER")  # dir: builds wait for each other
    if args[:2] == ["image", "inspect"]:
        if args[-1] in bases:
            sys.exit(0)
        if args[-1] != image:
            sys.exit(f"Error: No such image: {args[-1]}")
        print(json.dumps({"Id": "sha256:" + "ab" * 32, "RepoDigests": [image + "@sha256:cd"],
                          "Created": "2026-11-01T00:00:00Z"}))
    elif args[0] == "run":
        ran = next(a for a in args if a in (image, *bases))
        argv = args[args.index(ran) + 1:]
        env = dict(os.environ)  # FAKE_DOCKER_TREES: what each image holds, at one path
        trees = json.loads(os.environ.get("FAKE_DOCKER_TREES", "{}"))
        if ran in trees:
            site = os.environ["FAKE_DOCKER_SITE"]
            if os.path.lexists(site):
                os.remove(site)
            os.symlink(trees[ran], site)
            env["PYTHONPATH"] = site
        sys.exit(subprocess.run(argv, env=env).returncode)
    elif args[0] in ("build", "pull"):
        if barrier and args[0] == "build":  # both nodes' builds must be running at once
            open(os.path.join(barrier, str(os.getpid())), "w").close()
            for _ in range(200):
                if len(os.listdir(barrier)) >= 2:
                    break
                time.sleep(0.05)
            else:
                sys.exit("fake docker: the other node's build never started alongside")
        print(f"fake {args[0]} of {args[2] if args[0] == 'build' else args[1]} done")
    else:
        sys.exit(f"fake docker: unknown command {args}")
"""


@pytest.fixture()
def docker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    exe = tmp_path / "docker"
    exe.write_text(f"#!{sys.executable}\n" + textwrap.dedent(FAKE_DOCKER))
    exe.chmod(0o755)
    calls = tmp_path / "calls.jsonl"
    monkeypatch.setenv("FAKE_DOCKER_CALLS", str(calls))
    monkeypatch.setenv("FAKE_DOCKER_IMAGE", "img:test")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    return calls


def _exp(**runtime: object):
    raw = yaml.safe_load(DEFAULT_CONFIG.read_text())
    raw = deep_update(
        raw,
        {
            # a run id of its own: the one-shot containers' logs live under the owner's folder
            # by run id, shared by every test of this module on parallel workers otherwise
            "run_id": f"img-{uuid.uuid4().hex[:8]}",
            "runtime": {"kind": "docker", "image": "img:test", "gpus": None, **runtime},
            "engine": {"python": sys.executable},
        },
    )
    return load_experiment(raw, {})


def _runtime(exp) -> DockerRuntime:
    return DockerRuntime(LocalTransport(), exp.runtime, sudo_password=None, gpus=None)


def test_build_and_smoke_evidence(tmp_path: Path, docker: Path) -> None:
    exp = _exp(
        build={"dockerfile": "/ctx/Dockerfile", "context": "/ctx"},
        smoke=["echo flashinfer_mxfp4 available"],
    )
    log = tmp_path / "build" / "n1.log"
    evidence = build_image(exp=exp, node="n1", runtime=_runtime(exp), log=log, owner=OWNER)
    assert evidence["method"] == "build"
    assert evidence["image_id"] == "sha256:" + "ab" * 32
    assert evidence["repo_digests"] == ["img:test@sha256:cd"]
    assert evidence["engine_version"]  # servesweep's version, printed inside the "image"
    assert evidence["smoke"][-1]["output"] == "flashinfer_mxfp4 available"
    calls = [json.loads(line) for line in docker.read_text().splitlines()]
    assert calls[0][:5] == ["build", "-t", "img:test", "-f", "/ctx/Dockerfile"]
    assert "fake build of img:test done" in log.read_text()


def test_failed_smoke_names_node_command_and_log(tmp_path: Path, docker: Path) -> None:
    exp = _exp(smoke=["echo checking; exit 3"])
    log = tmp_path / "n1.log"
    with pytest.raises(SmokeFailed) as info:
        build_image(exp=exp, node="n1", runtime=_runtime(exp), log=log, owner=OWNER)
    message = str(info.value)
    assert "node n1" in message and "exit 3" in message and str(log) in message
    assert "checking" in log.read_text()


def test_missing_image_and_engine_version_mismatch(
    tmp_path: Path, docker: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    exp = _exp()
    rt = _runtime(exp)
    rt.image = "other:tag"
    with pytest.raises(SmokeFailed, match="not present on node n1"):
        build_image(exp=exp, node="n1", runtime=rt, log=tmp_path / "a.log", owner=OWNER)
    sglang = load_experiment(
        deep_update(exp.model_dump(mode="json"), {"engine": {"kind": "sglang"}}), {}
    )
    assert "import sglang" in version_probe(sglang)
    fake = tmp_path / "pkgs" / "sglang"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('__version__ = "0.5.9"\n')
    monkeypatch.setenv("PYTHONPATH", str(fake.parent))
    with pytest.raises(SmokeFailed, match="has SGLang 0.5.9, but engine.version pins 0.5.23"):
        build_image(
            exp=sglang, node="n1", runtime=_runtime(sglang), log=tmp_path / "b.log", owner=OWNER
        )


def test_checks_record_their_output_and_a_mismatch_names_the_check(
    tmp_path: Path, docker: Path
) -> None:
    checks = [
        {"name": "mooncake", "command": "echo 0.3.12.post1", "expect": r"^0\.3\.12\.post1$"},
        {"name": "aot-libs", "command": "echo 12 libs", "expect": r"^[1-9]\d* libs$"},
    ]
    exp = _exp(checks=checks)
    evidence = build_image(
        exp=exp, node="n1", runtime=_runtime(exp), log=tmp_path / "a.log", owner=OWNER
    )
    assert [(c["name"], c["output"], c["matched"]) for c in evidence["checks"]] == [
        ("mooncake", "0.3.12.post1", True),
        ("aot-libs", "12 libs", True),
    ]
    assert "[check mooncake rc=0 matched=True]" in (tmp_path / "a.log").read_text()
    bad = _exp(checks=[{**checks[0], "command": "echo 0.3.11"}])
    with pytest.raises(SmokeFailed) as info:
        build_image(exp=bad, node="n1", runtime=_runtime(bad), log=tmp_path / "b.log", owner=OWNER)
    text = str(info.value)
    assert "failed check mooncake on node n1" in text and "last line: 0.3.11" in text


def test_base_image_is_ensured_before_the_build(
    tmp_path: Path, docker: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    build = {
        "dockerfile": "/ctx/Dockerfile.pd",
        "context": "/ctx",
        "base": {"image": "phase5:base"},
    }
    exp = _exp(build=build)
    with pytest.raises(SmokeFailed, match="base image phase5:base is missing on node n1"):
        build_image(exp=exp, node="n1", runtime=_runtime(exp), log=tmp_path / "a.log", owner=OWNER)
    calls = [json.loads(line) for line in docker.read_text().splitlines()]
    assert not [c for c in calls if c[0] == "build"], "nothing built on a missing base"
    pulled = _exp(build={**build, "base": {"image": "phase5:base", "pull": True}})
    evidence = build_image(
        exp=pulled, node="n1", runtime=_runtime(pulled), log=tmp_path / "b.log", owner=OWNER
    )
    assert evidence["base"] == {"image": "phase5:base", "method": "pull"}
    calls = [json.loads(line) for line in docker.read_text().splitlines()]
    verbs = [c[0] for c in calls if c[0] in ("pull", "build")]
    assert verbs == ["pull", "build"], "the base first, then the image on it"
    monkeypatch.setenv("FAKE_DOCKER_BASES", "phase5:base")
    evidence = build_image(
        exp=exp, node="n1", runtime=_runtime(exp), log=tmp_path / "c.log", owner=OWNER
    )
    assert evidence["base"] == {"image": "phase5:base", "method": "present"}


def test_every_node_builds_at_once_and_the_key_follows_the_content(
    tmp_path: Path, docker: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    monkeypatch.setenv("FAKE_DOCKER_BARRIER", str(barrier))
    exp = _exp(build={"dockerfile": "/ctx/Dockerfile", "context": "/ctx"})
    logs = {n: tmp_path / f"{n}.log" for n in ("n1", "n2")}
    evidence = build_images(exp=exp, runtime=_runtime(exp), logs=logs, owner=OWNER)
    assert sorted(evidence) == ["n1", "n2"]  # the barrier fails a build that runs alone
    assert all(e["image_key"] == image_key(exp) for e in evidence.values())
    renamed = load_experiment(deep_update(exp.model_dump(mode="json"), {"run_id": "other"}), {})
    assert image_key(renamed) == image_key(exp), "a new RUN_ID shares the evidence"
    rebuilt = _exp(
        build={"dockerfile": "/ctx/Dockerfile", "context": "/ctx", "build_args": {"A": "1"}}
    )
    assert image_key(rebuilt) != image_key(exp)


def test_a_guessed_version_and_check_are_recorded_not_enforced(
    tmp_path: Path, docker: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = tmp_path / "pkgs" / "sglang"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('__version__ = "0.5.17"\n')
    dist = tmp_path / "pkgs" / "sglang-0.5.17.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.17\n")
    monkeypatch.setenv("PYTHONPATH", str(fake.parent))
    check = {"name": "patched-wheel", "command": "echo 0.6.1", "expect": r"\+"}
    raw = deep_update(
        _exp(checks=[check]).model_dump(mode="json"),
        {
            "engine": {"kind": "sglang"},
            "guesses": ["engine.version", "runtime.checks.patched-wheel"],
        },
    )
    guessed = load_experiment(raw, {})
    evidence = build_image(
        exp=guessed, node="n1", runtime=_runtime(guessed), log=tmp_path / "a.log", owner=OWNER
    )
    assert evidence["engine_version"] == "0.5.17" and evidence["engine_version_guessed"]
    assert evidence["packages"]["sglang"] == "0.5.17"  # read from the image's metadata
    assert evidence["checks"][0]["matched"] is False and evidence["checks"][0]["guess"]
    assert (
        "engine.version 0.5.23 is a guess; the image has SGLang 0.5.17"
        in (tmp_path / "a.log").read_text()
    )
    pinned = load_experiment({**raw, "guesses": ["runtime.checks.patched-wheel"]}, {})
    with pytest.raises(SmokeFailed, match="has SGLang 0.5.17, but engine.version pins 0.5.23"):
        build_image(
            exp=pinned, node="n1", runtime=_runtime(pinned), log=tmp_path / "b.log", owner=OWNER
        )
    confirmed = load_experiment({**raw, "guesses": ["engine.version"]}, {})
    with pytest.raises(SmokeFailed, match="failed check patched-wheel on node n1"):
        build_image(
            exp=confirmed,
            node="n1",
            runtime=_runtime(confirmed),
            log=tmp_path / "c.log",
            owner=OWNER,
        )


def test_mooncake_is_accepted_by_its_family_and_the_evidence_names_the_member(
    tmp_path: Path, docker: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pd = yaml.safe_load((REPO / "config" / "experiments" / "pd_standard.yaml").read_text())
    check = next(c for c in pd["runtime"]["checks"] if c["name"].startswith("mooncake"))
    check = {**check, "command": check["command"].replace("python3", sys.executable, 1)}
    pkgs = tmp_path / "pkgs"
    dist = pkgs / "mooncake_transfer_engine_cuda13-0.3.12.post1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: mooncake-transfer-engine-cuda13\nVersion: 0.3.12.post1\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(pkgs))
    exp = _exp(checks=[check])
    evidence = build_image(
        exp=exp, node="n1", runtime=_runtime(exp), log=tmp_path / "a.log", owner=OWNER
    )
    assert evidence["checks"][0]["output"] == "mooncake-transfer-engine-cuda13 0.3.12.post1"
    assert evidence["packages"]["mooncake"] == ["mooncake-transfer-engine-cuda13==0.3.12.post1"]


def test_every_launch_command_is_parsed_in_the_image_before_any_start(
    tmp_path: Path, docker: Path
) -> None:
    """The sim's own parser, run in the "image" by the same probe as SGLang's on the cluster:
    an unknown flag fails build_image with the server config and the flag."""
    exp = _exp()
    launches = launch_targets(exp)
    assert launches and all("--model-path" in x.args for x in launches)
    evidence = build_image(
        exp=exp,
        node="n1",
        runtime=_runtime(exp),
        log=tmp_path / "a.log",
        owner=OWNER,
        launches=launches,
    )
    assert evidence["launch_commands_parsed"] == len({json.dumps(x.args) for x in launches})
    bad = load_experiment(
        deep_update(exp.model_dump(mode="json"), {"server": {"extra_args": ["--bogus-flag"]}}), {}
    )
    with pytest.raises(SmokeFailed) as info:
        build_image(
            exp=bad,
            node="n1",
            runtime=_runtime(bad),
            log=tmp_path / "b.log",
            owner=OWNER,
            launches=launch_targets(bad),
        )
    text = str(info.value)
    assert "rejects the launch command of server config" in text
    assert "unrecognized arguments: --bogus-flag" in text and "node n1" in text


@pytest.mark.contract
def test_sglangs_own_parser_in_the_image_rejects_an_unknown_flag_and_value(
    tmp_path: Path, docker: Path, monkeypatch: pytest.MonkeyPatch, staged_sglang: Path
) -> None:
    """SGLang 0.5.23's real ServerArgs parser (from its wheel) parses seed 000's commands in
    the "image"; a flag it does not know, a value it rejects, and a flag it removed fail
    build_image in seconds, naming the server config and the flag."""
    for key, value in sglang_env(staged=staged_sglang).items():
        monkeypatch.setenv(key, value)
    seed = yaml.safe_load((REPO / "config" / "experiments" / "moe_prefill_gate.yaml").read_text())
    raw = deep_update(
        _exp().model_dump(mode="json"),
        {"engine": {"kind": "sglang"}, "server": seed["server"], "matrix": seed["matrix"]},
    )
    raw["server"]["tp_size"] = raw["server"]["ep_size"] = 8  # the stand-in's one node
    exp = load_experiment(raw, {})
    launches = launch_targets(exp)
    assert {x.args[x.args.index("--moe-runner-backend") + 1] for x in launches} == {
        "marlin",
        "flashinfer_mxfp4",
    }
    evidence = build_image(
        exp=exp,
        node="n1",
        runtime=_runtime(exp),
        log=tmp_path / "a.log",
        owner=OWNER,
        launches=launches,
    )
    assert evidence["engine_version"] == "0.5.23"
    assert evidence["launch_commands_parsed"] == len({json.dumps(x.args) for x in launches})
    cases = {
        "--bogus-flag": "unrecognized arguments: --bogus-flag",
        "--cuda-graph-max-bs=8": "ambiguous option: --cuda-graph-max-bs",  # removed in 0.5.20
        "--kv-cache-dtype=int3": "argument --kv-cache-dtype: invalid choice: 'int3'",
    }
    for i, (flag, message) in enumerate(cases.items()):
        bad = load_experiment(deep_update(raw, {"server": {"extra_args": [flag]}}), {})
        with pytest.raises(SmokeFailed) as info:
            build_image(
                exp=bad,
                node="n1",
                runtime=_runtime(bad),
                log=tmp_path / f"b{i}.log",
                owner=OWNER,
                launches=launch_targets(bad),
            )
        text = str(info.value)
        assert "sglang argument parser rejects the launch command of server config " in text
        assert message in text, text


def _pd_exp(python: str):
    raw = yaml.safe_load((REPO / "config" / "experiments" / "pd_standard_local.yaml").read_text())
    raw = deep_update(
        raw,
        {
            "runtime": {"kind": "docker", "image": "img:test", "gpus": None},
            "engine": {"python": python},
        },
    )
    return load_experiment(raw, {})


def test_the_routers_own_help_is_smoked_and_must_list_mini_lb(tmp_path: Path, docker: Path) -> None:
    """The sim router lists --mini-lb; a router without it (smg) fails build_image, not the
    first start after P and D have loaded."""
    exp = _pd_exp(sys.executable)
    assert exp.router is not None and exp.router.mini_lb
    evidence = build_image(
        exp=exp, node="p601", runtime=_runtime(exp), log=tmp_path / "a.log", owner=OWNER
    )
    assert evidence["router_help"]["mini_lb"] is True
    # An image whose router has no --mini-lb: its python answers the router's --help alone.
    python = tmp_path / "python"
    python.write_text(
        "#!/bin/sh\n"
        'if [ "$2" = servesweep.sim.router ]; then echo "usage: smg [--policy P]"; exit 0; fi\n'
        f'exec {sys.executable} "$@"\n'
    )
    python.chmod(0o755)
    smg = _pd_exp(str(python))
    with pytest.raises(SmokeFailed, match="router.mini_lb is set, but the image's router has no"):
        build_image(
            exp=smg, node="p601", runtime=_runtime(smg), log=tmp_path / "b.log", owner=OWNER
        )


@pytest.mark.contract
def test_the_pr_checks_read_the_symbols_the_prs_add_to_the_installed_sglang(
    tmp_path: Path, docker: Path, monkeypatch: pytest.MonkeyPatch, staged_sglang: Path
) -> None:
    """Seed 003's PR checks pass on SGLang 0.5.23 (which holds both PRs) without any patch
    file; without #31869's symbol the build fails naming the check; #32797's symbol is a guess
    (recorded, not enforced)."""
    pd = load_experiment(
        yaml.safe_load((REPO / "config" / "experiments" / "pd_standard.yaml").read_text()),
        {},
        site_dir=REPO / "config" / "site",
    )
    checks = [
        {**c.model_dump(), "command": c.command.replace("python3", sys.executable, 1)}
        for c in pd.runtime.checks
        if c.name.startswith("sglang-pr-")
    ]
    assert "runtime.checks.sglang-pr-32797" in pd.guesses
    guess = {"guesses": ["runtime.checks.sglang-pr-32797"]}
    raw = {**_exp(checks=checks).model_dump(mode="json"), **guess}
    exp = load_experiment(raw, {})
    monkeypatch.setenv("PYTHONPATH", str(staged_sglang))
    evidence = build_image(
        exp=exp, node="n1", runtime=_runtime(exp), log=tmp_path / "a.log", owner=OWNER
    )
    assert [(c["name"], c["output"]) for c in evidence["checks"]] == [
        ("sglang-pr-31869", "PR 31869 applied"),
        ("sglang-pr-32797", "PR 32797 applied"),
    ]
    older = tmp_path / "older"  # an SGLang tree from before both PRs
    for rel in (
        "__init__.py",
        "srt/disaggregation/decode.py",
        "srt/managers/scheduler_pp_mixin.py",
    ):
        text = (staged_sglang / "sglang" / rel).read_text()
        text = text.replace("poll_and_all_reduce_pp(", "poll(").replace(
            "_route_aborts_to_bad(", "x("
        )
        (older / "sglang" / rel).parent.mkdir(parents=True, exist_ok=True)
        (older / "sglang" / rel).write_text(text)
    monkeypatch.setenv("PYTHONPATH", str(older))
    with pytest.raises(SmokeFailed, match="failed check sglang-pr-31869 on node n1"):
        build_image(exp=exp, node="n1", runtime=_runtime(exp), log=tmp_path / "b.log", owner=OWNER)
    only_32797 = load_experiment(deep_update(raw, {"runtime": {"checks": checks[1:]}}), {})
    evidence = build_image(
        exp=only_32797,
        node="n1",
        runtime=_runtime(only_32797),
        log=tmp_path / "c.log",
        owner=OWNER,
    )
    assert evidence["checks"][0]["matched"] is False and evidence["checks"][0]["guess"]


# A stand-in for SGLang's one-batch benchmark on a GPU without one runner's kernel: the run of
# FAKE_MISSING_KERNEL fails as a CUDA kernel built without SM120 does; FAKE_DEAD_RANK exits 0
# without a batch (a TP rank died, the parent does not say); others print rank 0's batch.
FAKE_BENCH_ONE_BATCH = """import sys
args = sys.argv[1:]
backend = args[args.index("--moe-runner-backend") + 1]
assert args[args.index("--load-format") + 1] == "dummy"
if backend == __import__("os").environ.get("FAKE_MISSING_KERNEL"):
    print("Traceback (most recent call last):")
    print("torch.AcceleratorError: CUDA error: no kernel image is available for execution "
          "on the device")
    sys.exit(1)
if backend == __import__("os").environ.get("FAKE_DEAD_RANK"):
    sys.exit(0)
print("Prefill. latency: 0.01000 s, throughput:     12800.00 token/s")
"""


def test_the_smoke_runs_each_chosen_moe_kernel_once_and_a_missing_one_fails_naming_it(
    tmp_path: Path, docker: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """runtime.moe_smoke_layers: each MoE runner of the matrix runs once through SGLang's
    bench_one_batch on dummy weights of the model cut to that many layers; a runner whose kernel
    the GPU lacks fails build_image naming runner and GPU. Without a GPU (nvidia-smi absent,
    as on CI) nothing runs and the evidence says so."""
    pkgs = tmp_path / "pkgs"
    (pkgs / "sglang").mkdir(parents=True)
    (pkgs / "sglang" / "__init__.py").write_text('__version__ = "0.5.23"\n')
    (pkgs / "sglang" / "benchmark").mkdir()
    (pkgs / "sglang" / "benchmark" / "__init__.py").write_text("")
    (pkgs / "sglang" / "benchmark" / "one_batch.py").write_text(FAKE_BENCH_ONE_BATCH)
    monkeypatch.setenv("PYTHONPATH", str(pkgs))
    raw = _exp(moe_smoke_layers=4).model_dump(mode="json")
    exp = load_experiment(deep_update(raw, {"engine": {"kind": "sglang"}}), {})
    # no GPU on this machine: said in the evidence, nothing run
    monkeypatch.setenv(
        "PATH",
        os.pathsep.join(
            p for p in os.environ["PATH"].split(os.pathsep) if not (Path(p) / "nvidia-smi").exists()
        ),
    )
    evidence = build_image(
        exp=exp, node="n1", runtime=_runtime(exp), log=tmp_path / "a.log", owner=OWNER
    )
    kernels = {k["backend"]: k for k in evidence["moe_kernels"]}
    assert list(kernels) == ["marlin", "flashinfer_mxfp4"]
    assert all(
        k["ran"] is False and k["reason"].startswith("no GPU visible") for k in kernels.values()
    )
    command = kernels["flashinfer_mxfp4"]["command"]
    assert " flashinfer_mxfp4 --model-path sim/Kimi-K3 --load-format dummy " in command
    assert "--json-model-override-args '{\"num_hidden_layers\": 4}' --tp-size 8" in command
    # an SM120 GPU, the flashinfer_mxfp4 kernel missing for it
    smi = tmp_path / "gpu-bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text("#!/bin/sh\necho 'NVIDIA RTX PRO 6000 Blackwell Server Edition, 12.0'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{smi.parent}{os.pathsep}{os.environ['PATH']}")
    evidence = build_image(
        exp=exp, node="n1", runtime=_runtime(exp), log=tmp_path / "b.log", owner=OWNER
    )
    assert [(k["backend"], k["ran"], k["sm"], k["module"]) for k in evidence["moe_kernels"]] == [
        ("marlin", True, "sm120", "sglang.benchmark.one_batch"),
        ("flashinfer_mxfp4", True, "sm120", "sglang.benchmark.one_batch"),
    ]
    monkeypatch.setenv("FAKE_MISSING_KERNEL", "flashinfer_mxfp4")
    with pytest.raises(SmokeFailed) as info:
        build_image(exp=exp, node="n1", runtime=_runtime(exp), log=tmp_path / "c.log", owner=OWNER)
    assert str(info.value).startswith(
        "image img:test on node n1: the MoE kernel of runner 'flashinfer_mxfp4' does not run "
        "(exit 1): MOE KERNEL FAILED: flashinfer_mxfp4 on NVIDIA RTX PRO 6000 Blackwell Server "
        "Edition (sm120): exit 1; log "
    )
    assert "no kernel image is available" in (tmp_path / "c.log").read_text()
    monkeypatch.setenv("FAKE_MISSING_KERNEL", "")
    monkeypatch.setenv("FAKE_DEAD_RANK", "marlin")
    with pytest.raises(SmokeFailed, match="MOE KERNEL FAILED: marlin on .*: exit 0, no prefill"):
        build_image(exp=exp, node="n1", runtime=_runtime(exp), log=tmp_path / "e.log", owner=OWNER)
    # the sim has no GPU kernel: its image runs none
    sim = _exp(moe_smoke_layers=4)
    assert (
        build_image(exp=sim, node="n1", runtime=_runtime(sim), log=tmp_path / "d.log", owner=OWNER)[
            "moe_kernels"
        ]
        == []
    )


@pytest.mark.contract
def test_the_moe_kernel_runs_take_sglangs_own_server_arguments(staged_sglang: Path) -> None:
    """SGLang 0.5.23's own ServerArgs parser takes the server arguments of every MoE kernel run
    of both seeds; it leaves only the one-batch benchmark's own (its BenchArgs)."""
    code = (
        "import argparse, json, sys\n"
        "from sglang.srt.server_args import ServerArgs\n"
        "p = argparse.ArgumentParser()\n"
        "ServerArgs.add_cli_args(p)\n"
        "a, rest = p.parse_known_args(sys.argv[1:])\n"
        "print(json.dumps([a.moe_runner_backend, a.load_format, a.tp_size, a.ep_size, rest]))\n"
    )
    seen = []
    for name in ("moe_prefill_gate.yaml", "pd_standard.yaml"):
        exp = load_experiment_file(REPO / "config" / "experiments" / name)
        for run in moekernel.kernel_runs(exp):
            args = shlex.split(run.command)[4:]  # after `python3 -c PROBE <runner>`
            out = subprocess.run(
                [sys.executable, "-c", code, *args],
                capture_output=True,
                text=True,
                env=sglang_env(staged=staged_sglang),
                check=True,
            )
            seen.append(json.loads(out.stdout.splitlines()[-1]))
    bench = ["--batch-size", "1", "--input-len", "128", "--output-len", "1"]
    assert seen == [
        ["marlin", "dummy", 8, 8, bench],
        ["flashinfer_mxfp4", "dummy", 8, 8, bench],
        ["flashinfer_mxfp4", "dummy", 4, 4, bench],  # PD prefill: TP4/EP4
        ["marlin", "dummy", 8, 8, bench],
    ]


def _site_packages(root: Path, *, sglang: dict[str, str], dists: dict[str, str]) -> Path:
    """A stand-in image's packages: the sglang package's files, and dist-info per package."""
    for rel, text in sglang.items():
        (root / "sglang" / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / "sglang" / rel).write_text(text)
    for name, version in dists.items():
        info = root / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return root


def test_the_image_contract_records_the_difference_to_the_base_and_fails_on_a_breach(
    tmp_path: Path, docker: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seed 000's contract: the base's dependency set, exactly two SGLang files changed, the
    same SGLang tree, no newer sgl-kernel. The base is the Dockerfile's last FROM."""
    files = {"__init__.py": "", "srt/a.py": "a", "srt/b.py": "b", "srt/c.py": "c"}
    dists = {"sglang": "0.5.17", "sgl-kernel": "0.3.20", "flashinfer-python": "0.6.1"}
    base = _site_packages(tmp_path / "base", sglang=files, dists=dists)
    good = _site_packages(
        tmp_path / "good",
        sglang={**files, "srt/a.py": "a2", "srt/b.py": "b2"},
        dists={**dists, "flashinfer-python": "0.6.1+patched"},
    )
    newer_kernel = _site_packages(
        tmp_path / "bad",
        sglang={**files, "srt/a.py": "a2", "srt/b.py": "b2", "srt/c.py": "c2"},
        dists={**dists, "sgl-kernel": "0.3.21"},
    )
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text("FROM lmsysorg/sglang:v0.5.17 AS build\nFROM phase4:base\nRUN true\n")
    monkeypatch.setenv("FAKE_DOCKER_BASES", "phase4:base")
    contract = {"packages_may_change": ["flashinfer-python"], "sglang_files_changed": 2}
    exp = _exp(
        build={"dockerfile": str(dockerfile), "context": str(tmp_path), "contract": contract}
    )
    paths = {"phase4:base": str(base), "img:test": str(good)}
    monkeypatch.setenv("FAKE_DOCKER_SITE", str(tmp_path / "site-packages"))
    monkeypatch.setenv("FAKE_DOCKER_TREES", json.dumps(paths))
    evidence = build_image(
        exp=exp, node="n1", runtime=_runtime(exp), log=tmp_path / "a.log", owner=OWNER
    )
    held = evidence["contract"]
    assert held["base"] == "phase4:base"
    assert held["delta"]["packages"] == {"flashinfer-python": ["0.6.1", "0.6.1+patched"]}
    assert sorted(held["delta"]["sglang_files"]) == ["srt/a.py", "srt/b.py"]
    assert all(len(h) == 16 for pair in held["delta"]["sglang_files"].values() for h in pair)
    monkeypatch.setenv("FAKE_DOCKER_TREES", json.dumps({**paths, "img:test": str(newer_kernel)}))
    with pytest.raises(SmokeFailed) as info:
        build_image(exp=exp, node="n1", runtime=_runtime(exp), log=tmp_path / "b.log", owner=OWNER)
    text = str(info.value)
    assert "breaks runtime.build.contract against its base phase4:base" in text
    assert "package sgl-kernel changed 0.3.20 -> 0.3.21" in text
    assert "3 sglang files differ, the contract says 2" in text
    # A guessed file count (seed 003's) is recorded, not enforced; a package breach still is.
    guessed = load_experiment(
        {**exp.model_dump(mode="json"), "guesses": ["runtime.build.contract.sglang_files_changed"]},
        {},
    )
    three_files = _site_packages(
        tmp_path / "three",
        sglang={**files, "srt/a.py": "a2", "srt/b.py": "b2", "srt/c.py": "c2"},
        dists={**dists, "flashinfer-python": "0.6.1+patched"},
    )
    monkeypatch.setenv("FAKE_DOCKER_TREES", json.dumps({**paths, "img:test": str(three_files)}))
    evidence = build_image(
        exp=guessed, node="n1", runtime=_runtime(guessed), log=tmp_path / "c.log", owner=OWNER
    )
    (note,) = evidence["contract"]["guessed_breaches"]
    assert note.startswith("3 sglang files differ, the contract says 2")
    monkeypatch.setenv("FAKE_DOCKER_TREES", json.dumps({**paths, "img:test": str(newer_kernel)}))
    with pytest.raises(SmokeFailed, match="package sgl-kernel changed 0.3.20 -> 0.3.21"):
        build_image(
            exp=guessed, node="n1", runtime=_runtime(guessed), log=tmp_path / "d.log", owner=OWNER
        )


class _UnreachableRuntime(DockerRuntime):
    """Every docker command fails as an SSH connection to a node that is down does."""

    def run_docker(self, node: str, command: str, **_: object):  # type: ignore[override]
        raise Unreachable(
            f"node {node} (tester@127.0.0.9:22): cannot connect: timed out; {DOCTOR_HINT}"
        )


def test_nodes_that_cannot_be_reached_are_unreachable_not_a_failed_smoke(tmp_path: Path) -> None:
    """Issue 27: two nodes down was 'SmokeFailed: ... (also failed on nodes n2)'."""
    exp = _exp()
    runtime = _UnreachableRuntime(LocalTransport(), exp.runtime, sudo_password=None, gpus=None)
    logs = {n: tmp_path / f"{n}.log" for n in ("n1", "n2")}
    with pytest.raises(Unreachable) as err:
        build_images(exp=exp, runtime=runtime, logs=logs, owner=OWNER)
    assert type(err.value) is Unreachable
    assert str(err.value) == (
        "node n1 (tester@127.0.0.9:22): cannot connect: timed out (also failed on nodes n2); "
        f"{DOCTOR_HINT}"
    )
