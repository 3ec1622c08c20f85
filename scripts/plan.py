"""Adapter for rule plan: print what is missing and how long it should take."""

from pathlib import Path

from servesweep import scripting
from servesweep.plan import make_plan


def main() -> None:
    exp, paths = scripting.experiment(snakemake)
    plan = make_plan(exp=exp, paths=paths, results_dir=Path(paths.root).parent)
    print(plan.render(), end="")


scripting.run(main)
