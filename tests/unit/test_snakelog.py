"""Snakemake's console through servesweep's logger plugin (servesweep.workflow.snakelog)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from servesweep.workflow import snakelog
from tests.helpers import REPO

# What Snakemake 9.27 formats for a missing --configfile (shortened).
MISSING = """Traceback (most recent call last):
  File ".../snakemake/common/configfile.py", line 38, in load_configfile
    config = _load_configfile(configpath)
FileNotFoundError: [Errno 2] No such file or directory: 'config/experiments/nope.yaml'"""
NOT_YAML = (
    "WorkflowError:\nConfig file is not valid JSON or YAML. In case of YAML, make sure to not "
    "mix whitespace and tab indentation."
)


@pytest.mark.parametrize(
    ("argv", "files"),
    [
        (["snakemake", "-n", "--configfile", "a.yaml"], ["a.yaml"]),
        (["snakemake", "--configfile=a.yaml", "all"], ["a.yaml"]),
        (["snakemake", "--configfiles", "a.yaml", "b.yaml", "-n"], ["a.yaml", "b.yaml"]),
        (["snakemake", "--cores", "1", "all"], []),
    ],
)
def test_configfiles_of_a_command_line(argv, files):
    assert snakelog.configfiles(argv) == files


def test_the_refresh_command_keeps_the_workflow_config_and_environment():
    argv = [
        "snakemake",
        "-s",
        "/c/Snakefile",
        "-d",
        "/w",
        "--cores",
        "2",
        "-f",
        "results/x~a,b/r1.jsonl",
    ]
    argv += ["--configfile", "my runs/one.yaml"]
    env = {"BACKENDS_CSV": "marlin", "RUN_ID": "r 1", "HOME": "/root"}
    assert snakelog.refresh_command(argv, env) == (
        "RUN_ID='r 1' BACKENDS_CSV=marlin snakemake --cores 1 -s /c/Snakefile -d /w all "
        "--configfile 'my runs/one.yaml'"
    )
    assert snakelog.refresh_command(["snakemake", "-f", "x"], {}) == "snakemake --cores 1 all"


def test_comparison_targets_of_a_command_line():
    argv = ["snakemake", "--cores", "1", "results/a/compare/b/comparison.json"]
    argv += ["results/a/compare/b/comparison.png", "/w/results/c/compare/d/comparison.csv"]
    argv += ["--configfile", "a.yaml", "results/a/report.html", "all"]
    assert snakelog.comparison_targets(argv) == [
        "results/a/compare/b/comparison.json",
        "/w/results/c/compare/d/comparison.json",
    ]
    assert snakelog.comparison_targets(["snakemake", "--cores", "1", "all"]) == []


def test_a_missing_configfile_is_one_line():
    argv = ["snakemake", "-n", "--configfile", "config/experiments/nope.yaml"]
    line = snakelog.console_text(text=MISSING, error=True, argv=argv, quiet=set())
    assert line == (
        "servesweep: ConfigError: config file config/experiments/nope.yaml: "
        "No such file or directory"
    )


def test_a_yaml_error_names_its_line(tmp_path: Path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("run_id: x\nmatrix: [1\nrepeats: 2\n")
    argv = ["snakemake", "--configfile", str(bad)]
    line = snakelog.console_text(text=NOT_YAML, error=True, argv=argv, quiet=set())
    assert line.startswith(f"servesweep: ConfigError: config file {bad}: not valid YAML (line 3")


def test_other_errors_and_lines_pass_unchanged():
    argv = ["snakemake", "--configfile", "config/config.yaml"]
    other = "Error in rule run_cell:\n    jobid: 3"
    assert snakelog.console_text(text=other, error=True, argv=argv, quiet=set()) == other
    # a readable config file: Snakemake's own message stays
    assert snakelog.console_text(text=NOT_YAML, error=True, argv=argv, quiet=set()) == NOT_YAML


def test_quiet_mode_drops_the_scheduler_lines_only():
    quiet = {"rules", "progress"}
    for chatter in ("Select jobs to execute...", "Execute 1 jobs...", "Execute 12 jobs..."):
        assert snakelog.console_text(text=chatter, error=False, argv=[], quiet=quiet) is None
        assert snakelog.console_text(text=chatter, error=False, argv=[], quiet=set()) == chatter
    line = "[3/24] a/b/r1  TTFT p50 628 ms"
    assert snakelog.console_text(text=line, error=False, argv=[], quiet=quiet) == line


def test_snakemake_with_a_missing_configfile_prints_one_servesweep_line(tmp_path: Path):
    proc = subprocess.run(
        [sys.executable, "-m", "snakemake", "-n", "--configfile", "config/experiments/nope.yaml"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert proc.returncode == 1
    lines = [x for x in (proc.stdout + proc.stderr).splitlines() if x.strip()]
    assert len(lines) <= 2, lines
    assert (
        "servesweep: ConfigError: config file config/experiments/nope.yaml: "
        "No such file or directory"
    ) in lines


def test_the_profiles_use_the_plugin_and_quiet_mode():
    import yaml

    default = yaml.safe_load((REPO / "profiles" / "default" / "config.yaml").read_text())
    assert default["logger"] == ["servesweep"]
    quiet = yaml.safe_load((REPO / "profiles" / "quiet" / "config.yaml").read_text())
    assert {"rules", "progress"} <= set(quiet["quiet"])


def test_snakemake_finds_the_plugin():
    from snakemake_interface_logger_plugins.registry import LoggerPluginRegistry

    plugin = LoggerPluginRegistry().get_plugin("servesweep")
    assert plugin.log_handler.__module__ == "snakemake_logger_plugin_servesweep"
