# Operations that produce no file: plan what is missing, stop servers after a hard kill.


rule plan:
    log:
        f"{RUN_DIR}/logs/plan.log",
    message:
        "plan: missing cell-repeats, server starts, estimated wall time"
    script:
        "../scripts/plan.py"


rule down:
    log:
        f"{RUN_DIR}/logs/down.log",
    message:
        "stop every server of run {EXP.run_id}"
    script:
        "../scripts/down.py"
