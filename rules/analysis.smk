# Tables, summary, plots and manifest from the raw cell-repeat files.


rule collect_results:
    input:
        raw=all_raw(),
        gpu=all_gpu(),
    output:
        csv=report(
            f"{RUN_DIR}/results.csv",
            caption="../report/results.rst",
            category="Tables",
        ),
    log:
        f"{RUN_DIR}/logs/collect_results.log",
    params:
        cells=CELL_KEYS,
    message:
        "results.csv: one row per cell-repeat"
    script:
        "../scripts/collect_results.py"


rule summarize:
    input:
        raw=all_raw(),
        csv=PATHS.results_csv,
        logscan=f"{RUN_DIR}/logscan.json",
    output:
        json=report(
            f"{RUN_DIR}/summary.json",
            caption="../report/summary.rst",
            category="Tables",
        ),
    log:
        f"{RUN_DIR}/logs/summarize.log",
    message:
        "summary.json: medians over repeats and deltas vs the baseline"
    script:
        "../scripts/summarize.py"


rule scan_logs:
    input:
        raw=all_raw(),
    output:
        json=f"{RUN_DIR}/logscan.json",
    log:
        f"{RUN_DIR}/logs/scan_logs.log",
    params:
        evidence=EXP.evidence,
        cells=CELL_KEYS,
    message:
        "final scan of every server log: fatal patterns and evidence counts"
    script:
        "../scripts/scan_logs.py"


rule write_case_table:
    input:
        csv=PATHS.results_csv,
    output:
        md=f"{RUN_DIR}/cases.md",
        html=report(
            f"{RUN_DIR}/cases.html", caption="../report/cases.rst", category="Tables"
        ),
    log:
        f"{RUN_DIR}/logs/write_case_table.log",
    message:
        "case table (Case | Requests | Input TPS | TTFT | TPOT)"
    script:
        "../scripts/write_case_table.py"


rule plot_deltas:
    input:
        json=PATHS.summary_json,
    output:
        png=report(
            f"{RUN_DIR}/plots/delta_{{metric}}.png",
            caption="../report/deltas.rst",
            category="Deltas vs baseline",
        ),
    log:
        f"{RUN_DIR}/logs/plot_deltas_{{metric}}.log",
    message:
        "delta plot of {wildcards.metric}"
    script:
        "../scripts/plot_deltas.py"


rule plot_metric_vs:
    input:
        csv=PATHS.results_csv,
    output:
        png=report(
            f"{RUN_DIR}/plots/{{metric}}_vs_{{x}}.png",
            caption="../report/metric_vs.rst",
            category="Metrics vs client axis",
        ),
    log:
        f"{RUN_DIR}/logs/plot_{{metric}}_vs_{{x}}.log",
    message:
        "{wildcards.metric} vs {wildcards.x}"
    script:
        "../scripts/plot_metric_vs.py"


rule write_manifest:
    input:
        raw=all_raw(),
    output:
        json=report(
            f"{RUN_DIR}/manifest.json",
            caption="../report/manifest.rst",
            category="Tables",
        ),
    log:
        f"{RUN_DIR}/logs/write_manifest.log",
    params:
        config=EXP.model_dump_json(),
    message:
        "manifest.json: resolved config, fingerprints, versions"
    script:
        "../scripts/write_manifest.py"
