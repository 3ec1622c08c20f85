"""Tests of servesweep.workflow.manifest: config, fingerprints, versions, git SHA."""

from pathlib import Path

from servesweep.config.load import load_experiment_file
from servesweep.config.matrix import server_specs
from servesweep.config.paths import RunPaths
from servesweep.workflow.manifest import build_manifest, git_sha, package_versions
from servesweep.workflow.plan import pool_plan
from tests.helpers import DEFAULT_CONFIG, REPO


def test_manifest_has_config_fingerprints_versions(tmp_path: Path) -> None:
    exp = load_experiment_file(DEFAULT_CONFIG)
    paths = RunPaths(tmp_path / exp.run_id)
    spec = server_specs(exp)[0]
    info = paths.service(spec.id) / "server_info.json"
    info.parent.mkdir(parents=True)
    info.write_text('{"version": "0.5.23-sim"}')
    found = paths.service_files()["server_info"]
    assert found == [info]
    pools = pool_plan(exp=exp, paths=paths, results_dir=tmp_path)
    manifest = build_manifest(exp=exp, server_info=found, repo=REPO, pools=pools)
    assert manifest["run_id"] == exp.run_id
    assert [s["fingerprint"] for s in manifest["servers"]] == [
        s.fingerprint for s in server_specs(exp)
    ]
    assert manifest["servers"][0]["engine_version_reported"] == "0.5.23-sim"
    assert manifest["pools"] == [{"pool": 0, "nodes": ["local"], "servers": pools.servers(0)}]
    assert {s["pool"] for s in manifest["servers"]} == {0}
    assert manifest["servers"][1]["engine_version_reported"] is None
    assert manifest["config"]["workload"]["input_len"] == 16384
    assert manifest["engine"]["version_pinned"] == "0.5.23"
    assert "snakemake" in manifest["versions"]


def test_git_sha_outside_git_is_unknown(tmp_path: Path) -> None:
    assert git_sha(tmp_path) == "unknown"
    assert len(git_sha(REPO).split("+")[0]) == 40
    assert package_versions()["servesweep"]


def test_the_manifest_carries_the_image_evidence_and_the_guesses(tmp_path: Path) -> None:
    """results/.images/ lies outside the run folder: a copied run folder must still hold the
    image's digests, checks, packages and launch-command parse."""
    import json

    exp = load_experiment_file(REPO / "config" / "experiments" / "moe_prefill_gate.yaml")
    paths = RunPaths(tmp_path / exp.run_id)
    evidence = {
        "node": "601",
        "image": exp.runtime.image,
        "image_id": "sha256:ab",
        "repo_digests": ["img@sha256:cd"],
        "engine_version": "0.5.17",
        "engine_version_guessed": True,
        "packages": {"sglang": "0.5.17", "mooncake": []},
        "launch_commands_parsed": 4,
        "smoke": [{"command": "x", "returncode": 0, "output": "0.5.17"}],
        "checks": [{"name": "c", "expect": "y", "output": "n", "matched": False, "guess": True}],
    }
    build = paths.images(exp) / "601.json"
    build.parent.mkdir(parents=True)
    build.write_text(json.dumps(evidence))
    pools = pool_plan(exp=exp, paths=paths, results_dir=tmp_path)
    manifest = build_manifest(exp=exp, server_info=[], repo=REPO, pools=pools, builds=[build])
    image = manifest["images"][0]
    assert image["evidence"] == evidence
    assert image["packages"]["sglang"] == "0.5.17" and image["engine_version_guessed"]
    assert image["checks"][0]["guess"] is True and image["launch_commands_parsed"] == 4
    assert manifest["engine"]["version_guessed"] is True
    assert {"key": "engine.version", "value": "0.5.23"} in manifest["guesses"]
