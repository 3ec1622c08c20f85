"""The dry fire on the real sim: the PD topology with dummy weights answers one request
through the router before the real start; a dead KV transfer fails it, before the real start."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from servesweep.cluster.access import open_cluster
from servesweep.config.experiment import dry_fire_enabled
from servesweep.config.load import load_experiment
from servesweep.config.matrix import server_specs
from servesweep.config.paths import RunPaths
from servesweep.core.errors import DryFireFailed
from servesweep.core.events import EventLog, read_events
from servesweep.serving.servers import ServerManager
from tests.helpers import DEFAULT_CONFIG, deep_update, free_port

ROOT = Path(__file__).resolve().parents[2]
PD_LOCAL = ROOT / "config/experiments/pd_standard_local.yaml"


def _pd_raw(**changes: object) -> dict:
    raw = yaml.safe_load(PD_LOCAL.read_text())
    ports = {
        "roles": {
            "prefill": {
                "port": free_port(),
                "dist_init_port": free_port(),
                "server": {"disaggregation_bootstrap_port": free_port()},
            },
            "decode": {"port": free_port(), "dist_init_port": free_port()},
        },
        "router": {"port": free_port()},
        "run_id": "unit-dry-fire",
        "engine": {"ready_timeout_s": 60, "sim": {"time_scale": 0.001, "startup_s": 1}},
    }
    return deep_update(deep_update(raw, ports), changes)


def _manager(tmp_path: Path, raw: dict) -> ServerManager:
    exp = load_experiment(raw, {}, site_dir=ROOT / "config/site")
    return ServerManager(
        exp, RunPaths(tmp_path / "results" / exp.run_id), cluster=open_cluster(exp)
    )


def _events(m: ServerManager) -> list[tuple[str, dict]]:
    return [(e, f) for _, e, f in read_events(m.paths.orchestrator_log)]


def test_dry_fire_is_on_for_pd_and_multi_node_and_can_be_set() -> None:
    assert dry_fire_enabled(load_experiment(_pd_raw(), {}))
    single = yaml.safe_load(DEFAULT_CONFIG.read_text())
    assert not dry_fire_enabled(load_experiment(single, {}))
    assert dry_fire_enabled(load_experiment(deep_update(single, {"preflight": {"dry_fire": True}})))
    assert not dry_fire_enabled(load_experiment(_pd_raw(preflight={"dry_fire": False}), {}))


def test_pd_dry_fire_proves_the_path_then_the_real_start_follows(tmp_path: Path) -> None:
    m = _manager(tmp_path, _pd_raw())
    spec = server_specs(m.exp)[0]
    try:
        state, fresh = m.ensure(spec)
        names = [e for e, _ in _events(m)]
        assert names.index("dry-fire") < names.index("dry-fire-done") < names.index("start")
        assert names.index("start") < names.index("ready")
        assert float(dict(_events(m))["dry-fire-done"]["seconds"]) > 0
        stopped = [f for e, f in _events(m) if e == "stop"]
        assert stopped[0]["fp"] == f"{spec.fingerprint}-dry" and stopped[0]["reason"] == "dry fire"
        script = (m.paths.service(spec.id) / "dry-fire-commands.sh").read_text()
        # prefill is PP8: eight layers keep one per pipeline stage
        assert "--load-format dummy" in script and '{"num_hidden_layers": 8}' in script
        assert "--load-format" not in (m.paths.service(spec.id) / "commands.sh").read_text()
        assert fresh and state.fingerprint == spec.fingerprint
    finally:
        m.stop_all(reason="test teardown")


def test_a_dead_kv_transfer_is_caught_by_the_dry_fire_before_the_real_start(
    tmp_path: Path,
) -> None:
    m = _manager(tmp_path, _pd_raw(engine={"sim": {"faults": {"fail_transfer": True}}}))
    spec = server_specs(m.exp)[0]
    try:
        with pytest.raises(DryFireFailed) as err:
            m.ensure(spec)
        message = str(err.value)
        assert len(message.splitlines()) == 1
        assert message.startswith(f"dry fire of server {spec.id}: the request to http://")
        assert "role decode node d605 log " in message and "KVTransferError" in message
        names = [e for e, _ in _events(m)]
        assert "dry-fire-failed" in names and "start" not in names  # the real start never began
        assert m.current() is None  # nothing left running or recorded
    finally:
        m.stop_all(reason="test teardown")


def test_the_plan_counts_a_dry_fire_per_start_when_it_is_on(tmp_path: Path) -> None:
    from servesweep.workflow.plan import (
        ROUTER_START_S,
        SGLANG_DRY_FIRE_S,
        History,
        read_history,
        start_estimate,
        start_s,
    )

    raw = yaml.safe_load((ROOT / "config/experiments/pd_standard.yaml").read_text())
    site = ROOT / "config/site"
    exp = load_experiment(raw, {}, site_dir=site)
    spec = server_specs(exp)[0]
    none = History(ready_s={}, cell_s={})
    # prefill and decode on disjoint nodes: one wave of engines, then the router
    assert (
        start_estimate(exp, spec, none) == start_s(exp, spec) + SGLANG_DRY_FIRE_S + ROUTER_START_S
    )
    off = load_experiment(deep_update(raw, {"preflight": {"dry_fire": False}}), {}, site_dir=site)
    assert start_estimate(off, server_specs(off)[0], none) == start_s(exp, spec)
    # history: a measured dry fire replaces the guess
    log = EventLog(tmp_path / "earlier-run" / "orchestrator.log")
    log.emit("dry-fire-done", fp=spec.fingerprint, seconds="40.00")
    log.emit("ready", fp=spec.fingerprint, server=spec.id, seconds="300.00")
    assert start_estimate(exp, spec, read_history(tmp_path)) == 340.0
    sim = load_experiment(_pd_raw(), {})
    assert start_estimate(sim, server_specs(sim)[0], none) == 2 * start_s(sim, server_specs(sim)[0])


def test_the_dry_fire_requires_each_enforced_evidence_pattern_once(tmp_path: Path) -> None:
    never = {"d_never": {"pattern": "no such line", "role": "decode"}}
    m = _manager(tmp_path, _pd_raw(evidence=never))
    spec = server_specs(m.exp)[0]
    try:
        with pytest.raises(DryFireFailed, match="no d_never evidence .* role decode node d605 log"):
            m.ensure(spec)
        assert "start" not in [e for e, _ in _events(m)]
    finally:
        m.stop_all(reason="test teardown")
    # a guessed pattern is counted, never enforced: the dry fire passes
    m = _manager(tmp_path / "g", _pd_raw(evidence=never, guesses=["evidence.d_never"]))
    try:
        m.ensure(server_specs(m.exp)[0])
        names = [e for e, _ in _events(m)]
        assert "dry-fire-done" in names and "dry-fire-role-ready" in names
        assert [f["role"] for e, f in _events(m) if e == "role-ready"] == [
            "prefill",
            "decode",
            "router",
        ]
    finally:
        m.stop_all(reason="test teardown")


def test_a_router_without_workers_fails_the_dry_fire_naming_the_router(tmp_path: Path) -> None:
    m = _manager(tmp_path, _pd_raw(engine={"sim": {"faults": {"router_no_workers_after": 0}}}))
    try:
        with pytest.raises(DryFireFailed, match=r"failed \(HTTP 503\); role router node d605 log"):
            m.ensure(server_specs(m.exp)[0])
    finally:
        m.stop_all(reason="test teardown")
