# servesweep: LLM-serving benchmark matrices as file targets. Table of contents only;
# logic lives in src/servesweep/ (see docs/architecture.md, config/README.md).
import os

from snakemake.utils import min_version

min_version("9.0")


# The embedded default; `--configfile` replaces it (profile: replace-workflow-config).
configfile: os.path.join(workflow.basedir, "config", "config.yaml")


include: "rules/common.smk"
include: "rules/cells.smk"
include: "rules/analysis.smk"
include: "rules/compare.smk"
include: "rules/report.smk"


# The report opens on the run's answer (results/<run>/report.rst) once it is written.
report: report_page()


rule all:
    default_target: True
    input:
        prerequisites=PREREQUISITES,
        # Listed here, not only under results.csv: a deleted raw file must rerun its cell.
        raw=RAW_FILES,
        results=PATHS.results_csv,
        summary=PATHS.summary_json,
        plots=[*DELTA_PLOTS.values(), *METRIC_VS_PLOTS.values()],
        manifest=PATHS.manifest,
        landing=PATHS.landing_rst,
        report=PATHS.report_html,
        cases=all_case_tables(),
    # A message instead of Snakemake's listing of every input (several KB at 24 cells).
    message:
        f"run {EXP.run_id}: {len(RAW_FILES)} cell-repeats, results.csv, summary.json, plots, report.html"


onstart:
    lock_run()
    keep_console()
    check_secrets_at_start()
    start_pools()
    remove_partial_files()
    supersede_replaced()
    unthrottle_scheduler(workflow)
    hangup_like_sigterm()
    start_progress()


onsuccess:
    stop_servers("workflow finished")
    print_answer()
    fail_validation()


onerror:
    report_lost_cells()
    stop_servers("workflow failed")
    report_missing()
