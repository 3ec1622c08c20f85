"""Tests of the servesweep CLI: commands (no node touched), status, down, one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from servesweep.workflow.cli import main
from tests.helpers import REPO

SEED = str(REPO / "config" / "experiments" / "moe_prefill_gate.yaml")


def test_commands_prints_every_docker_and_launch_command(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SUDO_PASSWORD", raising=False)
    monkeypatch.delenv("SUDO_PASSWORD_FILE", raising=False)
    assert main(["commands", "--configfile", SEED]) == 0
    lines = capsys.readouterr().out.splitlines()
    commands = [line for line in lines if "docker run -d" in line]
    assert len(commands) == 4 * 4  # 4 server configs x 4 nodes, one command per line
    # the compile-cache folder made private first, then mounted
    assert all("} && sudo -S -p '' docker run -d" in c for c in commands)
    assert all(c.startswith("{ { mkdir -m 0700 /tmp/servesweep-") for c in commands)
    assert all("compile-cache/image_kimi3-sglang-mxfp4_phase5-" in c for c in commands)
    # multi-node: a dry fire before each start (preflight.dry_fire)
    assert any(
        ln.startswith("# dry fire")
        and """--json-model-override-args '{"num_hidden_layers": 1}'""" in ln
        for ln in lines
    )
    # The image build (every node at once), its smoke commands and content checks
    image = lines[: lines.index(next(ln for ln in lines if ln.startswith("# server ")))]
    assert image[0].startswith("# image: build_images, on every node at once")
    assert image[1].startswith("sudo -S -p '' docker build -t kimi3-sglang-mxfp4:phase5 -f ")
    assert sum("# smoke: exit 0" in ln for ln in image) == 1 + 5  # the version probe + 5
    checks = [ln for ln in image if "# check " in ln]
    assert [c.split("# check ")[1].split(":")[0] for c in checks] == [
        "flashinfer-patched-wheel",
        "flashinfer-aot-libs",
    ]
    # The client line per cell-repeat of a server config: bench_serving with its own seed
    clients = [ln for ln in lines if "sglang.benchmark.serving" in ln]
    assert len(clients) == 2 * 3  # 2 concurrencies x 3 repeats
    seeds = {ln.split("--seed ")[1].split()[0] for ln in clients}
    assert len(seeds) == 6 and "1" not in seeds
    for flag in ("--gpus", "--device", "--privileged"):
        assert not any(flag in ln for ln in clients)
    # what runs: the key on stdin, the record where run_client has the client write it
    import hashlib

    tag = "moe_runner_backend~marlin,chunked_prefill_size~8192/concurrency~8/r1"
    digest = hashlib.sha256(tag.encode()).hexdigest()[:12]
    [first] = [ln for ln in clients if f"--tag {tag}" in ln or f"--tag '{tag}'" in ln]
    assert "--env-file /dev/stdin" in first  # docker: the key comes on stdin
    assert f"/client/{digest}.jsonl" in first and f"/client/{digest}.log" in first
    # The key comes on stdin (`--env-file /dev/stdin`), never in the command (docs/access.md).
    assert all("' sglang.launch_server --model-path" in c for c in commands)
    assert all("--env-file /dev/stdin" in c and "SERVESWEEP_API_KEY=" not in c for c in commands)
    assert sum("--node-rank 3" in c for c in commands) == 4
    assert sum("--moe-runner-backend flashinfer_mxfp4" in c for c in commands) == 8


def test_commands_apply_env_narrowing(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EP_SIZE", "4")
    monkeypatch.setenv("BACKENDS_CSV", "marlin")
    monkeypatch.setenv("CHUNKED_PREFILL_SIZES_CSV", "16384")
    assert main(["commands", "--configfile", SEED]) == 0
    commands = [c for c in capsys.readouterr().out.splitlines() if "docker run -d" in c]
    assert len(commands) == 4
    assert all("--tp-size 32 --ep-size 4" in c for c in commands)


def test_bad_config_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(Path(SEED).read_text().replace("repeats: 3", "repeats: 3\nrepeat: 2"))
    assert main(["commands", "--configfile", str(bad)]) == 1
    err = capsys.readouterr().err.strip()
    assert (
        err == "servesweep: ConfigError: config key 'repeat': unknown key (did you mean 'repeats'?)"
    )


def test_status_and_down_without_a_server(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RUN_ID", "cli-test")
    default = str(REPO / "config" / "config.yaml")
    assert main(["status", "--configfile", default, "--results", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    # Status reads the node: other owners' servers on this machine (parallel tests) show too.
    rows = [line for line in out.splitlines() if "mine=" in line]
    assert "run cli-test: no server running on local" in out or rows
    assert not [r for r in rows if "mine=true" in r]
    assert main(["down", "--configfile", default, "--results", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"run cli-test: found no server or service of this config under {tmp_path}" in out
    assert out.rstrip().endswith("nothing stopped")


def test_the_default_results_are_the_checkouts_from_any_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `servesweep down` from another folder hashed ./results into another owner and stopped
    # nothing while saying it had
    from servesweep.workflow.cli import checkout_results

    checkout = tmp_path / "checkout"
    (checkout / "config").mkdir(parents=True)
    (checkout / "Snakefile").write_text("")
    cfg = checkout / "config" / "x.yaml"
    cfg.write_text("")
    monkeypatch.chdir(tmp_path)
    assert checkout_results("checkout/config/x.yaml") == checkout / "results"
    assert checkout_results(REPO / "config" / "config.yaml") == REPO / "results"
    loose = tmp_path / "loose.yaml"
    loose.write_text("")
    assert checkout_results(loose) == Path("results")


def test_the_pd_router_container_gets_no_gpu_device_or_privileged_flags(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SUDO_PASSWORD", raising=False)
    monkeypatch.delenv("SUDO_PASSWORD_FILE", raising=False)
    pd = str(REPO / "config" / "experiments" / "pd_standard.yaml")
    assert main(["commands", "--configfile", pd]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "docker run -d" in ln]
    router = [ln for ln in lines if "servesweep.role=router" in ln]
    engines = [ln for ln in lines if "servesweep.role=router" not in ln]
    assert len(router) == 1 and len(engines) == 8
    for flag in ("--gpus", "--device", "--privileged"):
        assert flag not in router[0]
        assert all(flag in ln for ln in engines)


def test_nodes_reads_the_log_and_the_labels(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import yaml

    from servesweep.core.events import EventLog

    monkeypatch.delenv("RUN_ID", raising=False)
    raw = yaml.safe_load(
        (REPO / "config/experiments/moe_prefill_gate_local_2pools.yaml").read_text()
    )
    nodes = [f"cli-nodes-{i}" for i in range(8)]  # no other test's server carries these
    raw["cluster"]["nodes"] = nodes
    cfg = tmp_path / "exp.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    args = ["nodes", "--configfile", str(cfg), "--results", str(tmp_path)]
    log = EventLog(tmp_path / raw["run_id"] / "orchestrator.log")
    log.emit("start", fp="a", server="A", nodes=",".join(nodes[:4]), pool=0)
    log.emit("start", fp="b", server="B", nodes=",".join(nodes[4:]), pool=1)
    assert main(args) == 0
    assert "2 server starts" in capsys.readouterr().out
    log.emit("start", fp="c", server="C", nodes=",".join(nodes[3:7]), pool=1)
    assert main(args) == 1
    out = capsys.readouterr().out
    assert "server C (pool 1) started on cli-nodes-3 held by fp a of pool 0" in out


def test_up_runs_preflight_before_it_starts_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import socket

    import yaml

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        raw = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
        raw["engine"] |= {"port": port, "dist_init_port": "auto"}
        cfg = tmp_path / "up.yaml"
        cfg.write_text(yaml.safe_dump(raw))
        results = tmp_path / "results"
        args = ["up", "--configfile", str(cfg), "--results", str(results)]
        assert main(args) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"servesweep: PreflightFailed: node local: port {port} is already in use "
        f"(server moe_runner_backend~marlin,chunked_prefill_size~8192 needs it); stop what "
        f"holds it or change the port"
    ]
    assert not list(results.glob(".services/*.json")), "no service was started"


def test_down_refuses_while_a_run_measures_on_the_service(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import fcntl
    import json

    from servesweep.config.load import load_experiment_file
    from servesweep.config.matrix import server_specs
    from servesweep.config.paths import RunPaths
    from servesweep.serving.state import ServerState

    monkeypatch.setenv("RUN_ID", "svc")
    default = REPO / "config" / "config.yaml"
    exp = load_experiment_file(default, {"RUN_ID": "svc"})
    paths = RunPaths.for_run(exp, tmp_path)
    fp = server_specs(exp)[0].fingerprint
    state = ServerState(fp, server_specs(exp)[0].id, "http://127.0.0.1:1", service=True)
    paths.service_record(fp).parent.mkdir(parents=True)
    paths.service_record(fp).write_text(json.dumps(state.to_dict()))
    paths.service_runs(fp).write_text("2026-12-02T06:00:00Z suite-a\n")
    [lock] = paths.node_locks(exp.cluster.nodes)  # shared by every run of the results root
    lock.parent.mkdir(parents=True)
    args = ["down", "--configfile", str(default), "--results", str(tmp_path)]
    with lock.open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # suite-a's cell job, measuring
        held.write("suite-a 4242")
        held.flush()
        assert main(args) == 1
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"servesweep: ServesweepError: run suite-a (service {fp}) is ")
        assert "\n" not in err and paths.service_record(fp).exists()
    assert main(args) == 0  # the cell is done: down stops the service
    assert "stopped 1 server set(s)" in capsys.readouterr().out
    assert not paths.service_record(fp).exists()


def test_version(capsys):
    from servesweep import __version__
    from servesweep.workflow.cli import main

    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out == f"servesweep {__version__}\n"


def test_nodes_counts_only_this_checkouts_servers():
    from servesweep.cluster.pools import label_overlaps
    from servesweep.cluster.runtime import Labelled
    from servesweep.workflow.cli import others_line, split_by_owner

    def server(owner: str, run: str, fp: str) -> Labelled:
        labels = {"owner": owner, "run": run, "fingerprint": fp, "node": "local"}
        return Labelled(node="local", handle=f"{owner}-{fp}", labels=labels)

    me = "me@host:/work/wt-answer/results"
    found = [server(me, "r1", "a"), server("bob@host:/x", "sim-b", "b")]
    found.append(server("eve@host:/y", "sim-e", "c"))
    ours, others = split_by_owner(found, owner=me)
    assert [o.handle for o in ours] == [f"{me}-a"]
    assert label_overlaps(ours) == []  # not "node local: 3 server sets"
    assert len(label_overlaps(found)) == 1  # what `nodes` counted before
    assert others_line(others) == (
        "info: 2 server processes of other owners on the nodes (not counted): "
        "local: bob@host:/x run sim-b; local: eve@host:/y run sim-e"
    )
    assert others_line([]) is None
