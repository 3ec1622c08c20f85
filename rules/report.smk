# report.html: one self-contained page, the answer first (servesweep.analysis.htmlreport); the
# interactive report stays `snakemake --report` (docs/architecture.md says why not from a rule).


rule write_report:
    input:
        summary=PATHS.summary_json,
        csv=PATHS.results_csv,
        manifest=PATHS.manifest,
        builds=BUILDS,
        events=run_events,
        method=os.path.join(workflow.basedir, "report", "method.rst"),
        key_plots=list(KEY_PLOTS.values()),
        validation=all_case_tables()[1:],
        plots=[
            *DELTA_PLOTS.values(),
            *METRIC_VS_PLOTS.values(),
            *ENERGY_PLOTS,
            *TTFT_PLOTS,
            SERVER_SERIES_PLOT,
        ],
        tables=[
            PATHS.results_csv,
            PATHS.summary_json,
            PATHS.manifest,
            *all_case_tables(),
        ],
    output:
        html=str(PATHS.report_html),
    log:
        f"{LOGS}/write_report.log",
    params:
        metrics=PLOT_METRICS,
        captions=list(KEY_PLOTS),
    message:
        "report.html: the answer, every plot, the method"
    script:
        "../scripts/write_report.py"
