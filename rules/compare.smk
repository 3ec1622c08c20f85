# Cross-run comparison: results/<A>/compare/<B>/comparison.{json,csv,png} = run B vs run A,
# the same cells matched by server id + client id. Run B need not be in the current config.
from pathlib import Path

from servesweep.compare import run_inputs

RESULTS_ROOT = str(PATHS.root.parent)


def compare_inputs(wildcards):
    files = {}
    for side, run in (("a", wildcards.run_a), ("b", wildcards.run_b)):
        current = all_raw() if run == EXP.run_id else None
        found = run_inputs(run_dir=Path(RESULTS_ROOT) / run, current_raw=current)
        files[f"csv_{side}"] = found["csv"]
        files[f"raw_{side}"] = found["raw"]
    return files


rule compare_runs:
    input:
        unpack(compare_inputs),
    output:
        json=report(
            f"{RESULTS_ROOT}/{{run_a}}/compare/{{run_b}}/comparison.json",
            caption="../report/compare.rst",
            category="Cross-run comparison",
        ),
        csv=report(
            f"{RESULTS_ROOT}/{{run_a}}/compare/{{run_b}}/comparison.csv",
            caption="../report/compare_table.rst",
            category="Cross-run comparison",
        ),
    log:
        f"{RESULTS_ROOT}/{{run_a}}/logs/compare_{{run_b}}.log",
    wildcard_constraints:
        run_a=r"[A-Za-z0-9][A-Za-z0-9._-]*",
        run_b=r"[A-Za-z0-9][A-Za-z0-9._-]*",
    message:
        "comparison of run {wildcards.run_b} vs run {wildcards.run_a}"
    script:
        "../scripts/compare_runs.py"


rule plot_comparison:
    input:
        json=f"{RESULTS_ROOT}/{{run_a}}/compare/{{run_b}}/comparison.json",
    output:
        png=report(
            f"{RESULTS_ROOT}/{{run_a}}/compare/{{run_b}}/comparison.png",
            caption="../report/compare_plot.rst",
            category="Cross-run comparison",
        ),
    log:
        f"{RESULTS_ROOT}/{{run_a}}/logs/plot_comparison_{{run_b}}.log",
    wildcard_constraints:
        run_a=r"[A-Za-z0-9][A-Za-z0-9._-]*",
        run_b=r"[A-Za-z0-9][A-Za-z0-9._-]*",
    params:
        metrics=PLOT_METRICS,
    message:
        "comparison plot of run {wildcards.run_b} vs run {wildcards.run_a}"
    script:
        "../scripts/plot_comparison.py"
