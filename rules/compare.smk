# Cross-run comparison: results/<A>/compare/<B>/comparison.{json,csv,png} = run B vs run A,
# the same cells matched by server id + client id. Run B need not be in the current config.
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
    params:
        tolerance=EXP.equivalence.logprob_tolerance,
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
    params:
        metrics=PLOT_METRICS,
    message:
        "comparison plot of run {wildcards.run_b} vs run {wildcards.run_a}"
    script:
        "../scripts/plot_comparison.py"
