"""Tests of serving.servers on the real sim: reuse, restart, stale removal, start failures."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from servesweep.cluster import http
from servesweep.cluster.access import open_cluster
from servesweep.cluster.pools import label_overlaps, node_overlaps
from servesweep.config.load import load_experiment
from servesweep.config.matrix import server_specs
from servesweep.config.paths import RunPaths
from servesweep.core.errors import NodeShared, ServerConflict, ServerStartError
from servesweep.core.events import read_events
from servesweep.serving.servers import ServerManager
from tests.helpers import DEFAULT_CONFIG, deep_update, free_port


def _manager(tmp_path: Path, **changes) -> ServerManager:
    raw = yaml.safe_load(DEFAULT_CONFIG.read_text())
    raw = deep_update(
        raw,
        {
            "run_id": "unit-servers",
            "engine": {
                "port": free_port(),
                "dist_init_port": free_port(),
                "ready_timeout_s": 30,
                "sim": {"time_scale": 0.001, "startup_s": 1},
            },
        },
    )
    exp = load_experiment(deep_update(raw, changes), {})
    return ServerManager(
        exp, RunPaths(tmp_path / "results" / exp.run_id), cluster=open_cluster(exp)
    )


@pytest.fixture()
def manager(tmp_path: Path):
    m = _manager(tmp_path)
    yield m
    m.stop_all(reason="test teardown")


def _events(m: ServerManager) -> list[str]:
    return [e for _, e, _ in read_events(m.paths.orchestrator_log)]


def test_ensure_starts_then_reuses_then_restarts_on_new_fingerprint(
    manager: ServerManager,
) -> None:
    first, second = server_specs(manager.exp)[:2]
    state, fresh = manager.ensure(first)
    assert fresh
    assert http.status(f"{state.base_url}/health") == 200
    again, fresh = manager.ensure(first)
    assert not fresh and again.ranks[0].handle == state.ranks[0].handle
    commands = (manager.paths.service(first.id) / "commands.sh").read_text()
    assert "--moe-runner-backend marlin" in commands
    assert (manager.paths.service(first.id) / "server_info.json").exists()
    new, _ = manager.ensure(second)
    assert new.fingerprint == second.fingerprint
    assert not manager.runtime.is_running("local", state.ranks[0].handle)
    log = (manager.paths.service(first.id) / "local.log").read_text()
    assert "The server is fired up and ready to roll!" in log
    assert _events(manager) == ["start", "ready", "reuse", "stop", "start", "ready"]


def test_stale_server_is_found_by_label_and_removed(manager: ServerManager) -> None:
    spec = server_specs(manager.exp)[0]
    state, _ = manager.ensure(spec)
    manager.paths.current_server.unlink()  # as after a SIGKILL of the orchestrator
    assert manager.runtime.find("local", manager.labels()) == [state.ranks[0].handle]
    manager.stop_all(reason="down")
    assert manager.runtime.find("local", manager.labels()) == []
    assert "stale" in _events(manager)


def test_failed_start_names_node_and_log_and_leaves_nothing(tmp_path: Path) -> None:
    m = _manager(tmp_path, engine={"sim": {"faults": {"fail_start": True}}})
    spec = server_specs(m.exp)[0]
    with pytest.raises(ServerStartError) as info:
        m.ensure(spec)
    message = str(info.value)
    assert "node local" in message
    kept = message.rsplit("log ", 1)[1]
    assert kept.startswith(str(m.local_log_path(spec.id, "server", "local")) + ".failed-")
    assert "Traceback" in Path(kept).read_text(), "the failed start's log is kept apart"
    assert m.runtime.find("local", m.labels()) == []
    assert m.current() is None
    assert _events(m)[-2:] == ["start-failed", "stop"]


def test_ready_timeout(tmp_path: Path) -> None:
    m = _manager(
        tmp_path, engine={"ready_timeout_s": 1, "sim": {"startup_s": 600, "time_scale": 1.0}}
    )
    spec = server_specs(m.exp)[0]
    with pytest.raises(ServerStartError, match="not ready after 1s"):
        m.ensure(spec)
    assert m.runtime.find("local", m.labels()) == []


def _twin(first: ServerManager, tmp_path: Path, **changes) -> ServerManager:
    """A second checkout: same run_id and config, another results root (another owner)."""
    raw = first.exp.model_dump(mode="json")
    exp = load_experiment(deep_update(raw, changes), {})
    return ServerManager(
        exp,
        RunPaths(tmp_path / "other-checkout" / "results" / exp.run_id),
        cluster=open_cluster(exp),
    )


def test_owner_labels_name_and_node_paths(manager: ServerManager, tmp_path: Path) -> None:
    other = _twin(manager, tmp_path)
    assert manager.owner.checkout != other.owner.checkout
    assert manager.owner.user == other.owner.user and manager.owner.host == other.owner.host
    spec = server_specs(manager.exp)[0]
    (_, mine), (_, theirs) = manager.launches(spec)[0], other.launches(spec)[0]
    assert mine.name != theirs.name and manager.owner.tag in mine.name
    assert mine.labels["owner"] == manager.owner.label
    assert mine.labels["ports"] == f"{manager.exp.engine.port}"
    assert manager.node_dir() != other.node_dir()


def test_two_owners_same_run_id_never_stop_each_other(
    manager: ServerManager, tmp_path: Path
) -> None:
    other = _twin(manager, tmp_path, engine={"port": free_port(), "dist_init_port": free_port()})
    spec, their_spec = server_specs(manager.exp)[0], server_specs(other.exp)[0]
    assert spec.fingerprint == their_spec.fingerprint  # the port is not part of it
    mine, _ = manager.ensure(spec)
    try:
        theirs, fresh = other.ensure(their_spec)
        assert fresh, "another owner's server is never reused"
        other.stop_all(reason="their down")
        assert manager.runtime.is_running("local", mine.ranks[0].handle)
        assert not other.runtime.is_running("local", theirs.ranks[0].handle)
        manager.paths.current_server.unlink()  # our state lost (SIGKILL): stale by label
        other.stop_all(reason="their down again")
        assert manager.runtime.is_running("local", mine.ranks[0].handle)
    finally:
        other.stop_all(reason="test teardown")


def test_another_owners_server_on_our_port_is_one_line_naming_the_owner(
    manager: ServerManager, tmp_path: Path
) -> None:
    other = _twin(manager, tmp_path)
    spec = server_specs(manager.exp)[0]
    theirs, _ = other.ensure(spec)
    try:
        with pytest.raises(ServerConflict) as info:
            manager.ensure(spec)
        message = str(info.value)
        assert "\n" not in message and other.owner.label in message
        assert "servesweep down --force" in message
        assert other.runtime.is_running("local", theirs.ranks[0].handle)
        removed = manager.remove_foreign([spec])
        assert [r.handle for r in removed] == [theirs.ranks[0].handle]
        assert not other.runtime.is_running("local", theirs.ranks[0].handle)
        assert "force-stop" in _events(manager)
    finally:
        other.stop_all(reason="test teardown")


def test_auto_ports_are_picked_at_start_and_recorded(tmp_path: Path) -> None:
    m = _manager(tmp_path, engine={"port": "auto", "dist_init_port": "auto"})
    other = _twin(m, tmp_path)
    spec = server_specs(m.exp)[0]
    assert spec.roles[0].port == 0
    try:
        mine, _ = m.ensure(spec)
        theirs, _ = other.ensure(spec)
        assert mine.base_url != theirs.base_url and not mine.base_url.endswith(":0")
        assert http.status(f"{mine.base_url}/health") == 200
        again, fresh = m.ensure(spec)
        assert not fresh and again.base_url == mine.base_url
    finally:
        m.stop_all(reason="test teardown")
        other.stop_all(reason="test teardown")


def test_a_service_outlives_runs_and_is_reused_whatever_the_run_id(tmp_path: Path) -> None:
    up = _manager(tmp_path)
    up.service_mode = True
    spec = server_specs(up.exp)[0]
    service, fresh = up.ensure(spec)
    assert fresh and service.service
    run_a = _manager(tmp_path, run_id="run-a")
    run_a.exp = run_a.exp.model_copy(update={"engine": up.exp.engine})
    try:
        assert run_a.paths.services == up.paths.services
        state, fresh = run_a.ensure(spec)
        assert not fresh and state.ranks[0].handle == service.ranks[0].handle
        reuse = [f for _, e, f in read_events(run_a.paths.orchestrator_log) if e == "reuse"]
        assert reuse == [{"fp": spec.fingerprint, "server": spec.id, "service": spec.fingerprint}]
        run_a.stop_all(reason="workflow finished")  # a run stops only what it started
        assert run_a.runtime.is_running("local", service.ranks[0].handle)
        # Other owners' servers on this machine show too (e.g. a parallel test run).
        [row] = [r for r in run_a.status() if r["mine"] == "true"]
        assert row["service"] == spec.fingerprint and row["owner"] == up.owner.label
        assert row["used_by"] == "unit-servers,run-a" and row["uptime_s"] != "?"
        assert row["health"] == "200"
        run_a.stop_all(reason="servesweep down", services=True)
        assert not run_a.runtime.is_running("local", service.ranks[0].handle)
        assert [r for r in run_a.status() if r["mine"] == "true"] == []
        assert up.service(spec.fingerprint) is None
    finally:
        up.stop_all(reason="test teardown", services=True)


def test_a_start_refuses_a_node_that_another_pool_holds(tmp_path: Path) -> None:
    first = _manager(tmp_path)
    second = ServerManager(first.exp, first.paths, cluster=first.cluster, pool=1)
    a, b = server_specs(first.exp)[:2]
    try:
        state, _ = first.ensure(a)
        # pool 1's stale search (its labels) leaves pool 0's server alone; its start refuses
        with pytest.raises(NodeShared, match=r"node local holds server .* of pool 0"):
            second.ensure(b)
        assert first.runtime.is_running("local", state.ranks[0].handle)
        assert second.paths.current_server_of(1).exists() is False
        found = first.runtime.labelled("local", {"run": first.exp.run_id})
        assert {f.labels["pool"] for f in found} == {"0"} and label_overlaps(found) == []
    finally:
        first.stop_all(reason="test teardown")
        second.stop_all(reason="test teardown")
    assert node_overlaps(read_events(first.paths.orchestrator_log)) == []
