# Tables, summary, plots and manifest. collect_results reads every cell's files and writes
# results.csv + requests.csv, which the rules after it read (fewer DAG edges). It is a
# checkpoint: what the servers left in service/ (logs, warm-ups, /server_info) is known after it.


checkpoint collect_results:
    input:
        raw=AGGREGATED_RAW,
        gpu=AGGREGATED_GPU,
        # Not read: brings image checks + preflight into every DAG that needs cells.
        prerequisites=PREREQUISITES,
        equivalence=EQUIVALENCE,
    output:
        csv=report(
            str(PATHS.results_csv),
            caption="../report/results.rst",
            category="Tables",
        ),
        requests=str(PATHS.requests_csv),
    log:
        f"{LOGS}/collect_results.log",
    # The cells are read in this many processes (the run's last jobs: its cores are free).
    threads: TABLE_THREADS
    params:
        # Sorted: the matrix's key order must not rerun it (docs/identity.md).
        cells=sorted(AGGREGATED_KEYS),
        min_retokenized_ratio=EXP.validation.min_retokenized_ratio,
        slo=SLO,
    message:
        "results.csv: one row per cell-repeat; requests.csv: one row per request"
    script:
        "../scripts/collect_results.py"


rule summarize:
    input:
        csv=PATHS.results_csv,
        requests=PATHS.requests_csv,
        logscan=PATHS.logscan_json,
        warmup=ancient(service_files("warmup")),
        equivalence=EQUIVALENCE,
    output:
        json=report(
            str(PATHS.summary_json),
            caption="../report/summary.rst",
            category="Tables",
        ),
    log:
        f"{LOGS}/summarize.log",
    # The cells are resampled in this many processes (the same figures for any number).
    threads: TABLE_THREADS
    params:
        baseline=CONFIGURED.baseline,
        server_axes=SERVER_AXES,
        client_axes=CLIENT_AXES,
        gate=GATE,
    message:
        "summary.json: medians over repeats and deltas vs the baseline"
    script:
        "../scripts/summarize.py"


rule compare_outputs:
    input:
        probes=PROBES,
    output:
        json=str(PATHS.equivalence_json),
    log:
        f"{LOGS}/compare_outputs.log",
    params:
        baseline=CONFIGURED.baseline,
        tolerance=EXP.equivalence.logprob_tolerance,
    message:
        "equivalence.json: each candidate's answers against its baseline's"
    script:
        "../scripts/compare_outputs.py"


rule scan_logs:
    input:
        # results.csv is not read: a rerun cell (results.csv newer) rescans the logs.
        csv=PATHS.results_csv,
        # ancient: the last server is stopped after the jobs (onsuccess), which writes to its
        # log; that must not make the next run rescan (and re-summarize, re-plot).
        logs=ancient(service_files("logs")),
    output:
        json=PATHS.logscan_json,
    log:
        f"{LOGS}/scan_logs.log",
    params:
        evidence=EVIDENCE_PATTERNS,
        service_root=f"{RUN_DIR}/service",
    message:
        "final scan of every server log: fatal patterns and evidence counts"
    script:
        "../scripts/scan_logs.py"


rule write_case_table:
    input:
        csv=PATHS.results_csv,
        reference=REFERENCE_FILES,
    output:
        md=f"{RUN_DIR}/cases.md",
        html=report(
            f"{RUN_DIR}/cases.html", caption="../report/cases.rst", category="Tables"
        ),
    log:
        f"{LOGS}/write_case_table.log",
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
        energy=[
            report(p, caption="../report/energy.rst", category="Energy and goodput")
            for p in ENERGY_PLOTS
        ],
        ttft=[
            report(p, caption="../report/ttft_breakdown.rst", category="Server side")
            for p in TTFT_PLOTS
        ],
    log:
        f"{LOGS}/plot_results.log",
    params:
        deltas=list(DELTA_PLOTS),
        metric_vs=list(METRIC_VS_PLOTS),
        x=PLOT_X,
        facet=EXP.plots.facet,
    message:
        "plots: deltas vs baseline and metrics vs the client axis"
    script:
        "../scripts/plot_results.py"


rule write_manifest:
    input:
        # results.csv is not read: the manifest is written once the cells ran.
        csv=PATHS.results_csv,
        server_info=ancient(service_files("server_info")),
        builds=ancient(BUILDS),
    output:
        json=report(
            str(PATHS.manifest),
            caption="../report/manifest.rst",
            category="Tables",
        ),
    log:
        f"{LOGS}/write_manifest.log",
    params:
        # Ports, addresses and timeouts change nothing here (docs/identity.md).
        config=measured_config(CONFIGURED),
        repo=workflow.basedir,
    message:
        "manifest.json: resolved config, fingerprints, versions"
    script:
        "../scripts/write_manifest.py"


rule write_landing_page:
    input:
        summary=PATHS.summary_json,
        csv=PATHS.results_csv,
        manifest=PATHS.manifest,
        builds=BUILDS,
        events=run_events,
        method=os.path.join(workflow.basedir, "report", "method.rst"),
        plots=list(KEY_PLOTS.values()),
        # A case run's answer: its table against the reference (cases.html), shown first.
        validation=all_case_tables()[1:],
    output:
        rst=str(PATHS.landing_rst),
    log:
        f"{LOGS}/write_landing_page.log",
    params:
        metrics=PLOT_METRICS,
        captions=list(KEY_PLOTS),
    message:
        "report landing page: identity, deltas, warnings, key plots"
    script:
        "../scripts/write_landing_page.py"


rule plot_server_series:
    input:
        csv=PATHS.results_csv,
        metrics=server_series,
    output:
        png=report(
            SERVER_SERIES_PLOT,
            caption="../report/server_series.rst",
            category="Server side",
        ),
    log:
        f"{LOGS}/plot_server_series.log",
    message:
        "plots: the servers' running, queued requests and KV usage over each cell's window"
    script:
        "../scripts/plot_server_series.py"
