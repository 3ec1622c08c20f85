# One job per cell-repeat; servers are started lazily inside run_cell (DESIGN.md section 5).
# Image checks and preflight run first: see PREREQUISITES in common.smk.


rule run_cell:
    output:  # RunPaths.raw / .gpu / .bench_log as patterns
        raw=f"{RUN_DIR}/raw/{{server}}/{{client}}/r{{repeat}}.jsonl",
        gpu=f"{RUN_DIR}/gpu/{{server}}/{{client}}/r{{repeat}}.csv",
    log:
        bench=f"{RUN_DIR}/bench/{{server}}/{{client}}/r{{repeat}}.log",
    priority: cell_priority
    resources:
        gpu_server=1,
    params:
        fingerprint=cell_fingerprint,
        workload=cell_workload,
    # `shell:`, not `script:`, no `message:`, one placeholder per path: each costs per job at
    # 10k cells (docs/performance.md). The script finds the cell and its gpu/bench files from
    # the raw path (RunPaths); the config reaches it through the environment.
    shell:
        "{PYTHON:q} {RUN_CELL_SCRIPT:q} {output.raw:q}"


rule preflight:
    input:
        builds=ancient(BUILDS),
    output:
        json=f"{RUN_DIR}/preflight.json",
    log:
        f"{RUN_DIR}/logs/preflight.log",
    priority: PREREQUISITE_PRIORITY
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
        json=f"{RUN_DIR}/build/{{node}}.json",
    log:
        f"{RUN_DIR}/build/{{node}}.log",
    priority: PREREQUISITE_PRIORITY
    resources:
        gpu_server=1,
    params:
        image=EXP.runtime.image,
        build=EXP.runtime.model_dump_json(include={"build", "smoke"}),
    message:
        "image {params.image} on node {wildcards.node}: build/pull and capability smoke"
    script:
        "../scripts/build_image.py"
