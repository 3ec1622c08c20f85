"""report.html: one self-contained page written by `all` (rule write_report), the answer first.

The same answer as the landing page of `snakemake --report` (servesweep.analysis.landing), then
every plot with its caption, links to the tables, and the method. It is written by the package,
not by Snakemake's report generator: `snakemake --report` from a rule would run a second
Snakemake on the same working directory while the first holds its lock and marks the job's
output incomplete (docs/architecture.md).
"""

from __future__ import annotations

import html
import logging
from collections.abc import Sequence

log = logging.getLogger(__name__)

STYLE = """<style>
body { font-family: system-ui, sans-serif; max-width: 72rem; margin: 1rem auto; padding: 0 1rem; }
table { border-collapse: collapse; font-size: 0.85rem; }
td, th { border: 1px solid #ddd; padding: .3rem .5rem; vertical-align: top; text-align: left; }
td.num { text-align: right; white-space: nowrap; }
.sim { background: #fff4d6; border-left: 4px solid #d9a400; padding: .4rem .8rem; }
img { max-width: 100%; border: 1px solid #ddd; }
figure { margin: 1rem 0; }
</style>"""  # noqa: E501


def rst_to_html(text: str) -> str:
    """The body of a reStructuredText document as HTML (docutils, Snakemake's report
    dependency)."""
    from docutils.core import publish_parts

    overrides = {"report_level": 5, "halt_level": 5, "doctitle_xform": False}
    return publish_parts(text, writer="html5", settings_overrides=overrides)["html_body"]


def report_html(
    *,
    run_id: str,
    answer: Sequence[str],
    plots: Sequence[tuple[str, str]],
    tables: Sequence[tuple[str, str]],
    method_rst: str,
) -> str:
    """The page: `answer` (HTML blocks of landing.answer_parts), `plots` as (caption,
    <figure> of landing.image_figure), `tables` as (name, path relative to the page), then
    the method."""
    e = html.escape
    parts = [
        "<!DOCTYPE html>",
        "<html lang='en'><head><meta charset='utf-8'>",
        f"<title>servesweep run {e(run_id)}</title>{STYLE}</head><body>",
        f"<h1>Run {e(run_id)}: what it measured</h1>",
        *answer,
    ]
    if tables:
        parts.append("<h2 id='tables'>Tables</h2><ul>")
        parts += [f"<li><a href='{e(path)}'>{e(name)}</a></li>" for name, path in tables]
        parts.append("</ul>")
    if plots:
        parts.append("<h2 id='all-plots'>All plots</h2>")
        parts += [figure for _, figure in plots]
    parts.append("<h2 id='method'>Method</h2>")
    parts.append(rst_to_html(method_rst))
    parts.append("</body></html>")
    log.info("report.html of run %s: %d plots, %d tables", run_id, len(plots), len(tables))
    return "\n".join(parts) + "\n"
