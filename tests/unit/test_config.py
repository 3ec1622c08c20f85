"""Tests of servesweep.config: validation, env narrowing, matrix expansion, fingerprints."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from servesweep.config.load import load_experiment, load_experiment_file
from servesweep.config.matrix import (
    cell_repeats,
    client_specs,
    measured_config,
    server_specs,
    workload_key,
)
from servesweep.config.paths import RunPaths
from servesweep.core.errors import ConfigError
from tests.helpers import deep_update

ROOT = Path(__file__).resolve().parents[2]
DEFAULT = ROOT / "config" / "config.yaml"


@pytest.fixture()
def raw() -> dict:
    return yaml.safe_load(DEFAULT.read_text())


def test_default_matrix_is_seed_000(raw: dict) -> None:
    exp = load_experiment(raw, {})
    cells = cell_repeats(exp)
    assert len(cells) == 2 * 2 * 2 * 3
    assert len(server_specs(exp)) == 4
    assert [c.id for c in client_specs(exp)] == ["concurrency~8", "concurrency~16"]
    w = cells[0].client.workload
    assert (w.input_len, w.output_len, w.num_requests, w.dataset) == (16384, 1, 40, "random-ids")
    assert exp.baseline == {"moe_runner_backend": "marlin"}
    assert exp.server.disable_radix_cache


def test_cells_are_grouped_by_server_with_one_priority_each(raw: dict) -> None:
    cells = cell_repeats(load_experiment(raw, {}))
    seen: list[str] = []
    for cell in cells:
        if not seen or seen[-1] != cell.server.id:
            assert cell.server.id not in seen, "cells of one server config must be contiguous"
            seen.append(cell.server.id)
    priorities = {c.server.id: c.server.priority for c in cells}
    assert len(set(priorities.values())) == len(priorities) == 4


def test_repeats_are_interleaved_within_a_server_config(raw: dict) -> None:
    cells = cell_repeats(load_experiment(raw, {}))  # 4 server configs x 2 clients x 3 repeats
    by_priority = sorted(cells, key=lambda c: -c.priority)
    order = [(c.server.id, c.repeat, c.client.id) for c in by_priority]
    first = [o for o in order if o[0] == order[0][0]]
    assert order[:6] == first, "one server config drains before the next"
    assert [r for _, r, _ in first] == [1, 1, 2, 2, 3, 3]  # r1 of every client cell, then r2
    clients = [c.id for c in client_specs(load_experiment(raw, {}))]
    assert [c for _, _, c in first] == clients * 3, "client configs in config order"
    assert len({c.priority for c in cells}) == len(cells), "no tie left to Snakemake"
    # every cell of a config above every cell of the next one
    lowest = min(c.priority for c in cells if c.server.id == order[0][0])
    assert all(c.priority < lowest for c in cells if c.server.id != order[0][0])


def test_paths_are_self_describing(raw: dict) -> None:
    exp = load_experiment(raw, {})
    cell = cell_repeats(exp)[0]
    paths = RunPaths.for_run(exp)
    assert str(paths.raw(cell)) == (
        "results/moe-prefill-sim/raw/moe_runner_backend~marlin,chunked_prefill_size~8192/"
        "concurrency~8/r1.jsonl"
    )


def test_cell_patterns_are_the_paths_of_cells(raw: dict) -> None:
    exp = load_experiment(raw, {})
    paths = RunPaths.for_run(exp)
    for cell in cell_repeats(exp):
        ids = {"server": cell.server.id, "client": cell.client.id, "repeat": cell.repeat}
        assert paths.cell_pattern("raw").format(**ids) == str(paths.raw(cell))
        assert paths.cell_pattern("gpu").format(**ids) == str(paths.gpu(cell))
        assert paths.cell_pattern("bench").format(**ids) == str(paths.bench_log(cell))


def test_env_narrowing_sets_axes_and_coerces_types(raw: dict) -> None:
    env = {
        "BACKENDS_CSV": "flashinfer_mxfp4",
        "CONCURRENCIES_CSV": "16",
        "CHUNKED_PREFILL_SIZES_CSV": "8192, 16384",
        "RUN_ID": "probe-1",
        "EP_SIZE": "4",
    }
    exp = load_experiment(raw, env)
    cells = cell_repeats(exp)
    assert len(cells) == 6
    assert exp.run_id == "probe-1"
    assert exp.server.ep_size == 4
    assert exp.matrix.server["chunked_prefill_size"] == [8192, 16384]
    assert exp.matrix.client["concurrency"] == [16]
    # The baseline is not in the narrowed matrix: no deltas, no error.
    assert exp.baseline == {}


def test_fingerprint_changes_with_server_args_only(raw: dict) -> None:
    base = {s.id: s.fingerprint for s in server_specs(load_experiment(raw, {}))}
    assert len(set(base.values())) == 4
    more_requests = copy.deepcopy(raw)
    more_requests["workload"]["num_requests"] = 80
    assert {s.id: s.fingerprint for s in server_specs(load_experiment(more_requests, {}))} == base
    page = copy.deepcopy(raw)
    page["server"]["page_size"] = 32
    changed = {s.id: s.fingerprint for s in server_specs(load_experiment(page, {}))}
    assert not set(changed.values()) & set(base.values())


def test_fingerprint_is_independent_of_run_id(raw: dict) -> None:
    a = server_specs(load_experiment(raw, {}))
    b = server_specs(load_experiment(raw, {"RUN_ID": "other"}))
    assert [s.fingerprint for s in a] == [s.fingerprint for s in b]


@pytest.mark.parametrize(
    ("mutate", "key"),
    [
        (lambda r: r.update(foo=1), "'foo': unknown key"),
        (lambda r: r["workload"].update(num_requests="many"), "'workload.num_requests'"),
        (lambda r: r["matrix"]["client"].update(concurrency=[]), "empty axis"),
        (lambda r: r["matrix"]["server"].update(page_sz=[1]), "matrix.server.page_sz"),
        (lambda r: r.update(baseline={"moe_runner_backend": "triton"}), "baseline.moe_runner"),
        (lambda r: r["cluster"].update(nodes=["a", "a"]), "duplicate node"),
        (lambda r: r["cluster"].update(transport="ssh", local_nodes=["x"]), "local_nodes"),
        (
            lambda r: r["cluster"].update(local_nodes=r["cluster"]["nodes"][:1]),
            "needs transport ssh",
        ),
        (lambda r: r["server"].update(tp_size=6, ep_size=6), "tp_size*pp_size"),
        (lambda r: r["server"].update(ep_size=3), "'server.ep_size': 3 does not divide"),
        (lambda r: r["matrix"]["client"].update(concurrency=[8, 8]), "duplicate values"),
        (lambda r: r.update(run_id="a/b"), "'run_id'"),
        (lambda r: r["runtime"].update(kind="docker"), "'runtime.image': required"),
        (lambda r: r.update(repeats=0), "'repeats'"),
    ],
)
def test_bad_config_is_one_line_naming_the_key(raw: dict, mutate, key: str) -> None:
    mutate(raw)
    with pytest.raises(ConfigError) as info:
        load_experiment(raw, {})
    message = str(info.value)
    assert key in message
    assert "\n" not in message


def test_bad_env_value_names_the_axis(raw: dict) -> None:
    with pytest.raises(ConfigError, match="chunked_prefill_size"):
        load_experiment(raw, {"CHUNKED_PREFILL_SIZES_CSV": "big"})
    with pytest.raises(ConfigError, match="CONCURRENCIES_CSV=. , .: empty list"):
        load_experiment(raw, {"CONCURRENCIES_CSV": " , "})


def test_load_experiment_file(tmp_path: Path) -> None:
    exp = load_experiment_file(DEFAULT)
    assert exp.run_id == "moe-prefill-sim"
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a list\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_experiment_file(bad)


def test_committed_json_schema_matches_the_models() -> None:
    import json

    from servesweep.config.experiment import json_schema

    committed = json.loads((ROOT / "schemas" / "experiment.schema.json").read_text())
    assert committed == json.loads(json.dumps(json_schema())), (
        "regenerate schemas/experiment.schema.json from servesweep.config.experiment.json_schema()"
    )


def _ids_and_fps(raw: dict) -> dict[str, str]:
    return {s.id: s.fingerprint for s in server_specs(load_experiment(raw, {}))}


def test_ids_use_one_canonical_axis_order(raw: dict) -> None:
    flipped = copy.deepcopy(raw)
    flipped["matrix"]["server"] = dict(reversed(list(raw["matrix"]["server"].items())))
    flipped["matrix"]["client"] = dict(reversed(list(raw["matrix"]["client"].items())))
    assert _ids_and_fps(flipped) == _ids_and_fps(raw)
    a, b = load_experiment(raw, {}), load_experiment(flipped, {})
    assert {c.id for c in client_specs(a)} == {c.id for c in client_specs(b)}


@pytest.mark.parametrize(
    "reach",
    [
        {"engine": {"port": 31111, "dist_init_port": 21111, "ready_timeout_s": 5}},
        {"runtime": {"sudo": True}},
        {"server": {"disaggregation_bootstrap_port": 9000}},
        {"workload": {"request_timeout_s": 7}},
    ],
)
def test_how_a_server_is_reached_is_not_in_its_identity(raw: dict, reach: dict) -> None:
    changed = deep_update(raw, reach)
    assert _ids_and_fps(changed) == _ids_and_fps(raw)
    a, b = load_experiment(raw, {}), load_experiment(changed, {})
    assert measured_config(a) == measured_config(b)
    assert [workload_key(c.workload) for c in client_specs(a)] == [
        workload_key(c.workload) for c in client_specs(b)
    ]


@pytest.mark.parametrize(
    "measured",
    [
        {"engine": {"version": "0.5.9"}},
        {"engine": {"model_path": "sim/other"}},
        {"runtime": {"kind": "docker", "image": "sglang:other"}},
        {"server": {"page_size": 32}},
        {"server": {"extra_args": ["--enable-foo"]}},
        {"cluster": {"gpus_per_node": 4}, "server": {"tp_size": 4, "ep_size": 4}},
    ],
)
def test_what_defines_the_measurement_is_in_the_fingerprint(raw: dict, measured: dict) -> None:
    before, after = _ids_and_fps(raw), _ids_and_fps(deep_update(raw, measured))
    assert before.keys() == after.keys()
    assert all(before[k] != after[k] for k in before)


def test_auto_ports_only_with_the_local_transport(raw: dict) -> None:
    assert load_experiment(raw, {}).engine.port == "auto"
    remote = deep_update(raw, {"cluster": {"transport": "ssh"}})
    with pytest.raises(ConfigError, match="config key 'engine.port': 'auto' needs cluster"):
        load_experiment(remote, {})


def test_plot_metrics_must_be_summary_metrics(raw: dict) -> None:
    from servesweep.analysis.summary import plot_metrics
    from servesweep.core.errors import ConfigError

    assert plot_metrics(load_experiment(raw, {}))[0] == "ttft_p50_ms"
    bad = copy.deepcopy(raw) | {"plots": {"metrics": ["goodput_rps", "nope"]}}
    with pytest.raises(ConfigError, match=r"^config key 'plots.metrics': 'nope' is not a summary"):
        plot_metrics(load_experiment(bad, {}))


def test_derived_seeds_are_per_client_and_repeat_and_leave_fingerprints_alone(raw: dict) -> None:
    exp = load_experiment(raw, {})
    cells = cell_repeats(exp)
    by_name = {(c.client.id, c.repeat): c.seed for c in cells}
    assert len(set(by_name.values())) == len(by_name), "every client config and repeat: own seed"
    assert all(c.seed == by_name[c.client.id, c.repeat] for c in cells), "same for every server"
    assert all(c.workload.seed == c.seed for c in cells)
    reseeded = load_experiment(deep_update(raw, {"workload": {"seed": 2}}), {})
    assert [s.fingerprint for s in server_specs(reseeded)] == [
        s.fingerprint for s in server_specs(exp)
    ]
    assert {c.seed for c in cell_repeats(reseeded)}.isdisjoint(by_name.values())


def test_client_kind_env_picks_the_load_generator(raw: dict) -> None:
    raw = copy.deepcopy(raw)
    raw["client"] = {"tokenizer": "/models/k"}
    assert load_experiment(raw, {"CLIENT_KIND": "bench_serving"}).client.kind == "bench_serving"
    assert load_experiment(raw, {}).client.kind == "builtin"
    with pytest.raises(ConfigError, match=r"env CLIENT_KIND='': empty"):
        load_experiment(raw, {"CLIENT_KIND": ""})
    with pytest.raises(ConfigError, match=r"client\.kind"):
        load_experiment(raw, {"CLIENT_KIND": "vllm"})
