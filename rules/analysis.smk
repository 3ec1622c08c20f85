# Tables, summary, plots and manifest from the raw cell-repeat files. Only collect_results
# lists the cells' files; rules after it depend on results.csv (fewer DAG edges).


rule collect_results:
    input:
        # GPU snapshots are read too, but come from the same run_cell jobs as the raw files:
        # listing them would add 10k DAG edges at 10k cells and order nothing.
        raw=RAW_FILES,
        # Brings image checks + preflight into every DAG that needs cells (results.csv,
        # summary.json, plots...), where they run first (common.smk, PREREQUISITES).
        prerequisites=PREREQUISITES,
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
        csv=PATHS.results_csv,
    output:
        json=f"{RUN_DIR}/logscan.json",
    log:
        f"{RUN_DIR}/logs/scan_logs.log",
    params:
        evidence=EXP.evidence,
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


rule plot_results:
    input:
        summary=PATHS.summary_json,
        csv=PATHS.results_csv,
    output:
        deltas=[
            report(p, caption="../report/deltas.rst", category="Deltas vs baseline")
            for p in DELTA_PLOTS.values()
        ],
        metric_vs=[
            report(
                p, caption="../report/metric_vs.rst", category="Metrics vs client axis"
            )
            for p in METRIC_VS_PLOTS.values()
        ],
    log:
        f"{RUN_DIR}/logs/plot_results.log",
    params:
        deltas=list(DELTA_PLOTS),
        metric_vs=list(METRIC_VS_PLOTS),
        x=PLOT_X,
    message:
        "plots: deltas vs baseline and metrics vs the client axis"
    script:
        "../scripts/plot_results.py"


rule write_manifest:
    input:
        csv=PATHS.results_csv,
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
