# servesweep: LLM-serving benchmark matrices as file targets. Table of contents only;
# logic lives in src/servesweep/ (see ../shared/DESIGN.md, config/README.md).
from snakemake.utils import min_version

min_version("9.0")


report: "report/method.rst"


include: "rules/common.smk"
include: "rules/cells.smk"
include: "rules/analysis.smk"
include: "rules/compare.smk"
include: "rules/ops.smk"


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
        cases=all_case_tables(),


onstart:
    unthrottle_scheduler(workflow)
    # Jobs fork from a process that imports their code once (servesweep/forkserver.py).
    forkserver.start(jobs.FIRST, jobs.THEN, log=f"{RUN_DIR}/logs/forkserver.log")


onsuccess:
    forkserver.stop()
    stop_servers("workflow finished")


onerror:
    forkserver.stop()
    stop_servers("workflow failed")
