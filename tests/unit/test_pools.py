"""Tests of cluster.pools: pools from the topology, narrowing, balanced and stable assignment."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from servesweep.cluster.pools import (
    PoolPlan,
    assign,
    every_pool,
    label_overlaps,
    locate,
    missing_report,
    narrow,
    node_overlaps,
    node_pools,
    pooled_cells,
    pooled_specs,
    write_plan,
)
from servesweep.cluster.runtime import Labelled
from servesweep.config.load import load_experiment, load_experiment_file
from servesweep.config.matrix import server_specs
from servesweep.config.paths import RunPaths
from servesweep.core.errors import ConfigError
from servesweep.core.events import EventLog
from servesweep.serving.engines import listening_ports
from servesweep.workflow.plan import make_plan, pool_plan
from tests.helpers import DEFAULT_CONFIG, REPO, deep_update

TWO_POOLS = REPO / "config" / "experiments" / "moe_prefill_gate_local_2pools.yaml"
PD_LOCAL = REPO / "config" / "experiments" / "pd_standard_local.yaml"


def _two_pools(**cluster: object) -> dict:
    raw = yaml.safe_load(TWO_POOLS.read_text())
    return deep_update(raw, {"cluster": cluster}) if cluster else raw


def test_default_keeps_one_pool_and_its_fingerprints(tmp_path: Path) -> None:
    exp = load_experiment_file(DEFAULT_CONFIG)
    plan = pool_plan(exp=exp, paths=RunPaths(tmp_path / exp.run_id), results_dir=tmp_path)
    assert [p.nodes for p in plan.pools] == [("local",)]
    assert set(plan.assignment.values()) == {0} and plan.estimates == {}
    assert pooled_specs(exp, plan) == server_specs(exp)
    assert every_pool(plan) == {"pool_0": 1}


def test_auto_pools_split_the_site_by_the_topology() -> None:
    exp = load_experiment(_two_pools())
    pools = node_pools(exp)
    assert [p.nodes for p in pools] == [
        ("s601", "s602", "s603", "s604"),
        ("s605", "s606", "s607", "s608"),
    ]
    # a 9th node does not make a third pool
    exp = load_experiment(_two_pools(nodes=[f"s60{i}" for i in range(1, 10)]))
    assert len(node_pools(exp)) == 2


@pytest.mark.parametrize(
    ("pools", "message"),
    [
        ([["s601", "s602", "s603", "s604"], ["s604", "s605", "s606", "s607"]], "node s604"),
        ([["s601", "s602", "s603", "s604"], ["s605", "s606"]], "pool 1 has 2 nodes"),
        ([["s601", "s602", "s603", "x"]], "['x'] not in cluster.nodes"),
    ],
)
def test_bad_pools_are_one_line_naming_the_key(pools: list, message: str) -> None:
    with pytest.raises(ConfigError, match="cluster.pools") as info:
        load_experiment(_two_pools(pools=pools))
    assert message in str(info.value) and "\n" not in str(info.value)


def test_too_many_pools_and_bad_nodes_per_server() -> None:
    nodes = [f"n{i}" for i in range(20)]
    raw = _two_pools(nodes=nodes, nodes_per_server=1, pools="auto")
    raw["server"] = {"tp_size": 8, "ep_size": 8}
    with pytest.raises(ConfigError, match=r"cluster.pools.*20 pools, at most 16"):
        load_experiment(raw)
    with pytest.raises(ConfigError, match="cluster.nodes_per_server"):
        load_experiment(_two_pools(nodes_per_server=9))


def test_a_pool_runs_on_its_own_nodes_and_ports() -> None:
    raw = _two_pools()
    raw["engine"] |= {"port": 30000, "dist_init_port": 20000}
    exp = load_experiment(raw)
    first, second = (narrow(exp, p) for p in node_pools(exp))
    a, b = server_specs(first)[0], server_specs(second)[0]
    assert a.roles[0].nodes == ("s601", "s602", "s603", "s604")
    assert b.roles[0].nodes == ("s605", "s606", "s607", "s608")
    assert listening_ports(first, a) == [("s601", 30000), ("s601", 20000)]
    assert listening_ports(second, b) == [("s605", 30100), ("s605", 20100)]
    assert a.fingerprint != b.fingerprint  # other nodes: another server set
    assert second.cluster.nodes[0] == "s605"  # its client node
    assert locate(exp, server_id=b.id, fingerprint=b.fingerprint)[1].pool == 1
    with pytest.raises(ConfigError, match="no pool"):
        locate(exp, server_id=b.id, fingerprint="0" * 12)


def test_pd_pools_are_pairs_of_prefill_and_decode_sets() -> None:
    raw = yaml.safe_load(PD_LOCAL.read_text())
    extra = ["p611", "p612", "p613", "p614", "d615", "d616", "d617", "d618"]
    raw["cluster"] |= {"nodes": raw["cluster"]["nodes"] + extra, "pools": "auto"}
    exp = load_experiment(raw)
    pools = node_pools(exp)
    assert len(pools) == 2 and pools[1].nodes == tuple(extra)
    second = narrow(exp, pools[1])
    spec = server_specs(second)[0]
    roles = {r.name: r.nodes for r in spec.roles}
    assert roles == {"prefill": tuple(extra[:4]), "decode": tuple(extra[4:])}
    assert spec.router is not None and spec.router.node == "d615" and spec.router.port == 31100
    assert ("p611", 8998 + 100) in listening_ports(second, spec)  # bootstrap port per pool


def test_assignment_balances_estimates_and_stays_when_the_matrix_grows() -> None:
    exp = load_experiment(_two_pools())
    pools = node_pools(exp)
    estimates = {"a": 10.0, "b": 6.0, "c": 5.0, "d": 1.0}
    first = assign(server_ids=list(estimates), pools=pools, estimates=estimates, previous={})
    assert first == {"a": 0, "b": 1, "c": 1, "d": 0}  # 11 s and 11 s
    # a new, long config goes to the less loaded pool; the old ones keep their node sets
    previous = {sid: pools[i].nodes for sid, i in first.items()}
    grown = {"e": 20.0, **estimates}
    second = assign(server_ids=list(grown), pools=pools, estimates=grown, previous=previous)
    assert {k: second[k] for k in first} == first and second["e"] == 0


def test_plan_persists_and_keeps_the_assignment(tmp_path: Path) -> None:
    exp = load_experiment(_two_pools())
    paths = RunPaths(tmp_path / exp.run_id)
    plan = pool_plan(exp=exp, paths=paths, results_dir=tmp_path)
    assert sorted(plan.assignment.values()) == [0, 0, 1, 1]
    write_plan(paths.pools, plan)
    # a matrix extended by a backend: the four configs keep their pools
    raw = _two_pools()
    raw["matrix"]["server"]["moe_runner_backend"].append("triton")
    bigger = load_experiment(raw)
    again = pool_plan(exp=bigger, paths=paths, results_dir=tmp_path)
    assert {k: again.assignment[k] for k in plan.assignment} == plan.assignment
    text = make_plan(exp=exp, paths=paths, results_dir=tmp_path).render()
    assert "node pools: 2" in text and "pool 1: nodes s605,s606,s607,s608" in text


def test_missing_report_names_pool_and_cause(tmp_path: Path) -> None:
    exp = load_experiment(_two_pools())
    paths = RunPaths(tmp_path / exp.run_id)
    plan = pool_plan(exp=exp, paths=paths, results_dir=tmp_path)
    cells = pooled_cells(exp, plan)
    done = [c for c in cells if c.server.pool == 0]
    for cell in done:
        paths.raw(cell).parent.mkdir(parents=True, exist_ok=True)
        paths.raw(cell).write_text("{}\n")
    failed = next(c for c in cells if c.server.pool == 1)
    log = EventLog(paths.orchestrator_log)
    log.emit("cell-failed", cell=failed.key, error="server start failed on node s605")
    text = missing_report(cells, paths)
    assert text.startswith("missing cells: 12 of 24 (pool 1: 12)")
    assert f"{failed.key} (pool 1): server start failed on node s605" in text
    assert missing_report(done, paths) == ""
    assert missing_report([c for c in cells if c is not failed], paths) == ""  # none failed
    assert isinstance(plan, PoolPlan)


def test_overlaps_from_the_log_and_from_labels() -> None:
    def ev(stamp: str, event: str, **fields: str) -> tuple[str, str, dict[str, str]]:
        return (f"2026-01-01T00:00:0{stamp}Z", event, fields)

    clean = [
        ev("1", "start", fp="a", server="A", nodes="n1,n2", pool="0"),
        ev("2", "start", fp="b", server="B", nodes="n3,n4", pool="1"),
        ev("3", "stop", fp="a", server="A", pool="0"),
        ev("4", "start", fp="c", server="C", nodes="n1,n2", pool="0"),
    ]
    assert node_overlaps(clean) == []
    bad = [*clean, ev("5", "start", fp="d", server="D", nodes="n2,n3", pool="1")]
    found = " | ".join(node_overlaps(bad))
    assert found.count("server D (pool 1) started on") == 2
    assert "n2 held by fp c of pool 0" in found and "n3 held by fp b of pool 1" in found
    labels = {"run": "r", "pool": "0", "fingerprint": "a", "node": "n1"}
    same = [Labelled("n1", "1", labels), Labelled("n1", "2", labels)]
    assert label_overlaps(same) == []
    other = Labelled("n1", "3", {**labels, "pool": "1", "fingerprint": "b"})
    assert label_overlaps([*same, other]) == [
        "node n1: 2 server sets: run r pool 0 fp a; run r pool 1 fp b"
    ]


def test_the_pd_sim_takes_auto_ports_for_every_role_and_the_router() -> None:
    from servesweep.serving.engines import listening_ports as ports_of
    from servesweep.serving.launches import resolve_ports

    raw = yaml.safe_load(PD_LOCAL.read_text())
    for role in ("prefill", "decode"):
        raw["roles"][role] |= {"port": "auto", "dist_init_port": "auto"}
    raw["router"]["port"] = "auto"
    exp = load_experiment(raw)
    spec = resolve_ports(server_specs(exp)[0])
    found = [p for _, p in ports_of(exp, spec)]
    assert all(isinstance(p, int) and p > 0 for p in found) and len(set(found)) == len(found)
    raw["cluster"]["transport"] = "ssh"
    needs_local = r"'roles\.prefill\.port': 'auto' needs cluster.transport"
    with pytest.raises(ConfigError, match=needs_local):
        load_experiment(raw)
