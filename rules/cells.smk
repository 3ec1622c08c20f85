# One job per cell-repeat; servers are started lazily inside run_cell (DESIGN.md section 5),
# one server set at a time per node pool (resource pool_<i>).
# Image checks and preflight run first (PREREQUISITES in common.smk).


rule run_cell:
    input:
        prerequisites=CELL_PREREQUISITES,
        # Only after .snakemake/ was lost (an input function costs per job at 10k cells).
        changed=cell_changed if CHANGED else [],
    output:
        raw=PATHS.cell_pattern("raw"),
        gpu=PATHS.cell_pattern("gpu"),
    log:
        # The job's log first: a cell whose server fails to start has no bench log.
        job=PATHS.cell_pattern("job"),
        bench=PATHS.cell_pattern("bench"),
        # The servers' /metrics during the cell: a log, so a record measured before the
        # series existed is not measured again for want of one (Snakemake reruns a job for a
        # missing output, never for a missing log).
        metrics=PATHS.cell_pattern("metrics"),
    priority: cell_priority
    resources:
        **CELL_RESOURCES,
    params:
        fingerprint=cell_fingerprint,
        workload=cell_workload,
        # Client, warm-up: a change reruns the cell (the record carries them too).
        measured_with=cell_measured_with,
    # No `message:`: a per-job cost at 10k cells (docs/performance.md).
    script:
        "../scripts/run_cell.py"


rule probe_outputs:
    input:
        prerequisites=CELL_PREREQUISITES,
    output:
        json=PATHS.probe_pattern,
    log:
        f"{LOGS}/probe_outputs/{{server}}.log",
    # Right after its server's start and warm-up, before its cells (config/matrix.py).
    priority: probe_priority_of
    resources:
        **PROBE_RESOURCES,
    params:
        fingerprint=probe_fingerprint,
        # A changed probe reruns the probe, never the cells (they do not depend on it).
        probe=PROBE_KEY,
    message:
        "equivalence probe of server {wildcards.server}: greedy answers and top-k logprobs"
    script:
        "../scripts/probe_outputs.py"


rule preflight:
    input:
        builds=ancient(BUILDS),
    output:
        json=PATHS.preflight,
    log:
        f"{LOGS}/preflight.log",
    priority: PREREQUISITE_PRIORITY
    resources:
        **EVERY_POOL,
    params:
        servers=SERVER_FINGERPRINTS,
    message:
        "preflight: P/D agreement, IB devices, image, free ports"
    script:
        "../scripts/preflight.py"


rule build_images:
    output:
        # results/.images/<image key>/<node>.json: shared by every run with this image.
        json=BUILDS,
    log:
        job=f"{LOGS}/build_images.log",
        nodes=BUILD_LOGS,
    priority: PREREQUISITE_PRIORITY
    # One job for every node: the nodes build at once inside it (transport fan-out). The
    # resource only keeps cells from measuring while the nodes build (docs/architecture.md).
    resources:
        **EVERY_POOL,
    params:
        image=EXP.runtime.image,
    message:
        "image {params.image}: base image, build/pull, smoke and checks on every node at once"
    script:
        "../scripts/build_images.py"
