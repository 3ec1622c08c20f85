"""The workflow glue: the jobs Snakemake runs, the CLI, the planner and the manifest."""
