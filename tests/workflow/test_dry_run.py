"""`snakemake -n` ends with the plan's one line: cell-repeats, server starts, image builds and
the estimate, as `servesweep plan` computes them."""

from __future__ import annotations

from pathlib import Path

from tests.helpers import run_snakemake


def test_dry_run_ends_with_the_plan_line(tmp_path: Path) -> None:
    env = {"RUN_ID": "dry", "BACKENDS_CSV": "marlin", "CONCURRENCIES_CSV": "16"}
    proc = run_snakemake(tmp_path, "-n", env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith(
        "servesweep plan: run dry: 6 of 6 cell-repeats to run (6 missing), 2 server starts, "
        "0 image builds;"
        " estimated "
    ), last
    assert "of GPU time" in last
    assert "servesweep plan:" not in proc.stderr
    # A real run parses the same Snakefile: no plan line there (checked without running one).
    proc = run_snakemake(tmp_path, "--cores", "1", "--unlock", env=env)
    assert proc.returncode == 0 and "servesweep plan:" not in proc.stdout + proc.stderr


def test_lint_finds_only_the_documented_software_lint(tmp_path: Path) -> None:
    """`snakemake --lint` names nothing but the per-rule conda/container lint, which is
    intended (docs/architecture.md, "snakemake --lint")."""
    proc = run_snakemake(tmp_path, "--lint", env={"RUN_ID": "lint"})
    lints = {
        line.strip()
        for line in (proc.stdout + proc.stderr).splitlines()
        if line.strip().startswith("* ")
    }
    assert lints == {"* Specify a conda environment or container for each rule.:"}, lints
