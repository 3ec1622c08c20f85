"""Adapter for rule write_case_table: the seed's PD table (markdown and HTML)."""

from servesweep import scripting
from servesweep.casetable import case_table, markdown_table
from servesweep.config import client_specs
from servesweep.files import write_text_atomic
from servesweep.results import read_results_csv


def main() -> None:
    exp, _ = scripting.experiment(snakemake)
    table = case_table(results=read_results_csv(snakemake.input.csv), clients=client_specs(exp))
    note = ""
    if exp.engine.kind == "sim" and exp.engine.sim.time_scale > 0:
        scale = exp.engine.sim.time_scale
        note = (
            f"\nSimulated engine at time_scale {scale}: times are wall-clock; simulated "
            f"seconds = shown / {scale}, simulated TPS = shown x {scale}.\n"
        )
    write_text_atomic(snakemake.output.md, markdown_table(table) + note)
    write_text_atomic(snakemake.output.html, table.to_html(index=False, border=0))


scripting.run(main)
