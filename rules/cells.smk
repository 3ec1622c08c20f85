# One job per cell-repeat; servers are started lazily inside run_cell (DESIGN.md section 5).
# Image checks and preflight run first: preflight.json is an input of every cell.


rule run_cell:
    input:
        # ancient: re-checked evidence does not rerun finished cells. One file, not the image
        # evidence too (preflight needs that): one DAG edge per cell (docs/architecture.md).
        preflight=ancient(PATHS.preflight),
    output:
        raw=PATHS.cell_pattern("raw"),
        gpu=PATHS.cell_pattern("gpu"),
    log:
        bench=PATHS.cell_pattern("bench"),
        job=PATHS.cell_pattern("job"),
    priority: cell_priority
    resources:
        gpu_server=1,
    params:
        fingerprint=cell_fingerprint,
        workload=cell_workload,
    # No `message:`: a per-job cost at 10k cells (docs/performance.md).
    script:
        "../scripts/run_cell.py"


rule preflight:
    input:
        builds=ancient(BUILDS),
    output:
        json=PATHS.preflight,
    log:
        f"{LOGS}/preflight.log",
    resources:
        gpu_server=1,
    params:
        servers=SERVER_FINGERPRINTS,
    message:
        "preflight: P/D agreement, IB devices, image, free ports"
    script:
        "../scripts/preflight.py"


rule build_image:
    output:
        json=str(PATHS.build("{node}")),
    log:
        f"{RUN_DIR}/build/{{node}}.log",
    resources:
        gpu_server=1,
    params:
        image=EXP.runtime.image,
        build=EXP.runtime.model_dump_json(include={"build", "smoke"}),
    message:
        "image {params.image} on node {wildcards.node}: build/pull and capability smoke"
    script:
        "../scripts/build_image.py"
