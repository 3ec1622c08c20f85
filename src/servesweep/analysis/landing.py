"""The report's landing page (`snakemake --report`): the run's answer first, as reStructuredText.

Snakemake shows the workflow description (the Snakefile's `report:`) as the report's first
page; once a run has its summary, that description is this page: who ran what (simulated or
real), the deltas with their intervals and verdicts, the key plots, the warnings, then the
method. Snakemake renders it through Jinja and docutils, so the page is raw HTML blocks inside
`{% raw %}`; its <style> block also fixes the report's content pane, which centres pages
vertically and so cut the top off any page taller than the window.
"""

from __future__ import annotations

import base64
import html
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from servesweep.analysis import labels, stats
from servesweep.analysis.cautions import cautions, sim_noise
from servesweep.analysis.planned import key_plots  # noqa: F401 (re-exported)

log = logging.getLogger(__name__)

# Rows of the delta table on the page; summary.json holds them all.
MAX_DELTA_ROWS = 60
VERDICT_COLORS = {
    stats.BETTER: "#1b9e77",
    stats.WORSE: "#d95f02",
    stats.NOISE: "#6b6b6b",
    stats.UNKNOWN: "#9a9a9a",
}
# The report's content pane is `flex items-center h-screen overflow-auto`: content taller
# than the window is centred, its top above the pane and out of scroll reach. Start at the top,
# let the description use the width, and put the rule graph below it when space is short.
STYLE = """<style>
#app div.flex.items-center.justify-center.h-screen { align-items: flex-start !important; }
#app div.grow.flex.gap-3.p-3.items-start { flex-wrap: wrap; }
#app div.prose.max-w-lg { max-width: 72rem !important; }
#servesweep-answer table { font-size: 0.8rem; }
#servesweep-answer td, #servesweep-answer th { padding: .3rem .5rem !important; vertical-align: top; }
#servesweep-answer td.num { text-align: right; white-space: nowrap; }
#servesweep-answer .sim { background: #fff4d6; border-left: 4px solid #d9a400; padding: .4rem .8rem; }
#servesweep-answer img { max-width: 100%; border: 1px solid #ddd; }
</style>"""  # noqa: E501


def _e(value: Any) -> str:
    return html.escape(str(value))


def _num(value: float | None, digits: str = ".1f") -> str:
    return "n/a" if value is None else format(value, digits)


def identity(
    *,
    run_id: str,
    manifest: Mapping[str, Any],
    builds: Sequence[Mapping[str, Any]],
) -> list[tuple[str, str]]:
    """(field, value) rows: run id, simulated or real, engine version, image and digest,
    nodes, commit."""
    engine = manifest.get("engine") or {}
    config = manifest.get("config") or {}
    sim = (config.get("engine") or {}).get("sim") or {}
    kind = engine.get("kind")
    if kind == "sim":
        what = f"SIMULATED (servesweep.sim, time scale {sim.get('time_scale')})"
    else:
        what = f"real ({kind})"
    reported = sorted(
        {str(s["engine_version_reported"]) for s in manifest.get("servers") or []
         if s.get("engine_version_reported")}
    )  # fmt: skip
    version = f"{engine.get('version_pinned')} pinned"
    if engine.get("version_guessed"):
        found = sorted({str(b["engine_version"]) for b in builds if b.get("engine_version")})
        version = f"{engine.get('version_pinned')} guessed"
        if found:
            version += f"; the image has {', '.join(found)}"
    if reported:
        version += f"; servers report {', '.join(reported)}"
    digests = sorted({d for b in builds for d in b.get("repo_digests") or []})
    ids = sorted({str(b["image_id"]) for b in builds if b.get("image_id")})
    image = engine.get("image") or "none (no container runtime)"
    if digests or ids:
        image += f" ({', '.join(digests or ids)})"
    cluster = config.get("cluster") or {}
    nodes = ", ".join(str(n) for n in cluster.get("nodes") or []) or "?"
    return [
        ("run", run_id),
        ("engine", what),
        ("engine version", version),
        ("image", image),
        (
            "nodes",
            f"{nodes} ({cluster.get('transport', '?')}, "
            f"{cluster.get('gpus_per_node', '?')} GPUs per node)",
        ),  # fmt: skip
        (
            "guesses",
            ", ".join(g["key"] for g in manifest.get("guesses") or [])
            or "none (every value confirmed)",
        ),  # observed and recorded, never enforced (servesweep.config.guesses)
        ("commit", str(manifest.get("git_sha", "?"))),
        ("written", str(manifest.get("written_at", "?"))),
    ]


def delta_rows(summary: Mapping[str, Any], metrics: Sequence[str]) -> list[dict[str, Any]]:
    """One row per candidate cell and metric of `metrics` (summary.json's deltas)."""
    rows = []
    for delta in summary.get("deltas") or []:
        for metric in metrics:
            m = (delta.get("metrics") or {}).get(metric)
            if m:
                rows.append({"cell": delta["label"], "metric": metric, **m})
    return rows


def _delta_table(rows: Sequence[Mapping[str, Any]], baseline: str) -> str:
    head = (
        "<tr><th>candidate cell</th><th>metric</th><th>baseline median</th>"
        "<th>candidate median</th><th>change</th><th>95% interval</th><th>verdict</th></tr>"
    )
    body = []
    shown = rows[:MAX_DELTA_ROWS]
    for i, r in enumerate(shown):
        m = r["metric"]
        cell = ""
        if i == 0 or shown[i - 1]["cell"] != r["cell"]:
            span = next(
                (j for j in range(i, len(shown)) if shown[j]["cell"] != r["cell"]), len(shown)
            )
            cell = f"<td rowspan='{span - i}'>{_e(r['cell'])}</td>"
        interval = (
            f"[{labels.pct(r['ci_low'])}, {labels.pct(r['ci_high'])}]%"
            if r.get("ci_low") is not None and r.get("ci_high") is not None
            else "none"
        )
        change = "n/a" if r.get("delta_pct") is None else f"{labels.pct(r['delta_pct'])}%"
        verdict = r.get("verdict") or stats.UNKNOWN
        color = VERDICT_COLORS.get(verdict, "#000")
        body.append(
            f"<tr>{cell}<td>{_e(labels.label(m))}</td>"
            f"<td class='num'>{_e(labels.value_text(r.get('baseline_median'), m))}</td>"
            f"<td class='num'>{_e(labels.value_text(r.get('candidate_median'), m))}</td>"
            f"<td class='num'>{change}</td><td class='num'>{interval}</td>"
            f"<td style='color:{color};font-weight:bold'>{_e(verdict)}</td></tr>"
        )
    more = ""
    if len(rows) > MAX_DELTA_ROWS:
        more = f"<p>First {MAX_DELTA_ROWS} of {len(rows)} rows; summary.json has them all.</p>"
    return (
        f"<p>Each cell against its twin with baseline {_e(baseline)}: medians over repeats, "
        "change = 100 x (candidate - baseline) / baseline, its 95% bootstrap interval, and "
        "the verdict: better/worse only when the interval excludes 0 and the p-value adjusted "
        "over all tests of this table and summary.json (Benjamini-Hochberg, 5% false-discovery "
        "rate; see the method) is below 5%.</p>"
        f"<table id='deltas'><thead>{head}</thead><tbody>{''.join(body)}</tbody></table>{more}"
    )


def _cells_table(summary: Mapping[str, Any], metrics: Sequence[str]) -> str:
    """Medians per cell (the answer of a run without deltas)."""
    head = "<tr><th>cell</th><th>n</th>" + "".join(
        f"<th>{_e(labels.label(m))}</th>" for m in metrics
    )
    body = []
    for cell in (summary.get("cells") or [])[:MAX_DELTA_ROWS]:
        values = "".join(
            "<td class='num'>"
            + _e(labels.value_text(((cell.get("metrics") or {}).get(m) or {}).get("median"), m))
            + "</td>"
            for m in metrics
        )
        body.append(f"<tr><td>{_e(cell['label'])}</td><td>{cell['n']}</td>{values}</tr>")
    return (
        "<p>Medians over repeats per cell:</p>"
        f"<table id='cells'><thead>{head}</thead><tbody>{''.join(body)}</tbody></table>"
    )


def warnings(
    *,
    summary: Mapping[str, Any],
    results: pd.DataFrame,
    events: Sequence[tuple[str, str, Mapping[str, str]]],
) -> list[str]:
    """What a reader must know before trusting the numbers (analysis.cautions: the same
    sentences as the console's answer block)."""
    return cautions(summary=summary, results=results, events=events)


def image_figure(path: Path, caption: str) -> str:
    """A PNG embedded (base64) as a <figure> with its caption."""
    # lines of 76: docutils refuses lines over 10,000 characters, and a URL parser drops the
    # newlines inside a data: URL
    data = base64.encodebytes(path.read_bytes()).decode().strip()
    return (
        f"<figure><img alt='{_e(caption)}' src='data:image/png;base64,{data}'/>"
        f"<figcaption>{_e(caption)}</figcaption></figure>"
    )


def _raw(block: str) -> str:
    return ".. raw:: html\n\n" + "".join(f"   {line}\n" for line in block.splitlines()) + "\n"


def answer_parts(
    *,
    summary: Mapping[str, Any],
    manifest: Mapping[str, Any],
    results: pd.DataFrame,
    metrics: Sequence[str],
    plots: Sequence[tuple[str, Path]],
    builds: Sequence[Mapping[str, Any]] = (),
    events: Sequence[tuple[str, str, Mapping[str, str]]] = (),
    validation_html: str = "",
) -> list[str]:
    """The answer as HTML blocks (the landing page's and report.html's first part): the sim
    banner, identity, the validation answer of a case run (`validation_html`: its cases.html,
    each case against the reference table, TTFT and TPOT), deltas, medians per cell, warnings,
    key plots."""
    run_id = str(manifest.get("run_id") or summary.get("run_id") or "?")
    ident = identity(run_id=run_id, manifest=manifest, builds=builds)
    engine = manifest.get("engine") or {}
    scale = ((manifest.get("config") or {}).get("engine") or {}).get("sim", {}).get("time_scale")
    sim = labels.sim_note({"kind": engine.get("kind"), "time_scale": scale})
    baseline = ", ".join(f"{k}={v}" for k, v in (summary.get("baseline") or {}).items())
    parts = []
    if sim:
        parts.append(
            f"<p class='sim'><b>{_e(sim)}.</b> Figures are not those of real GPUs; "
            "results.csv has them scaled back to simulated time (simulated_* columns).</p>"
        )
    parts.append(
        "<table id='identity'>"
        + "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in ident)
        + "</table>"
    )
    rows = delta_rows(summary, metrics)
    if validation_html:
        parts.append("<h2 id='answer'>Each case against the reference</h2>")
        parts.append(f"<div id='validation'>{validation_html}</div>")
    if rows:
        anchor = "deltas-heading" if validation_html else "answer"
        parts.append(f"<h2 id='{anchor}'>Deltas vs the baseline</h2>")
        parts.append(_delta_table(rows, baseline or "none"))
    elif not validation_html:
        why = summary.get("note") or "no candidate cell has a baseline twin"
        parts.append("<h2 id='answer'>Deltas vs the baseline</h2>")
        parts.append(
            f"<p id='no-deltas'><b>No deltas in this run:</b> {_e(why)}. "
            "No delta plots are drawn; the medians per cell follow.</p>"
        )
    parts.append(_cells_table(summary, metrics))
    found = warnings(summary=summary, results=results, events=events)
    parts.append("<h2 id='warnings'>Warnings</h2>")
    parts.append(
        "<ul>" + "".join(f"<li>{_e(w)}</li>" for w in found) + "</ul>"
        if found
        else "<p>None: no log findings, no re-tokenization drift, no failed cell attempts.</p>"
    )
    noise = sim_noise(summary)
    if noise:
        parts.append(f"<p id='sim-noise'>{_e(noise)}</p>")
    if plots:
        parts.append("<h2 id='plots'>Key plots</h2>")
        parts.extend(image_figure(path, caption) for caption, path in plots)
    log.info(
        "answer of run %s: %d delta rows, %d warnings, %d plots",
        run_id,
        len(rows),
        len(found),
        len(plots),
    )
    return parts


def landing_page(
    *,
    summary: Mapping[str, Any],
    manifest: Mapping[str, Any],
    results: pd.DataFrame,
    metrics: Sequence[str],
    plots: Sequence[tuple[str, Path]],
    builds: Sequence[Mapping[str, Any]] = (),
    events: Sequence[tuple[str, str, Mapping[str, str]]] = (),
    method_rst: str = "",
    validation_html: str = "",
) -> str:
    """The landing page as reStructuredText (see the module docstring): `metrics` for the
    tables, `plots` (caption, PNG) embedded, `method_rst` appended."""
    run_id = str(manifest.get("run_id") or summary.get("run_id") or "?")
    parts = [STYLE, "<div id='servesweep-answer'>"]
    parts += answer_parts(
        summary=summary,
        manifest=manifest,
        results=results,
        metrics=metrics,
        plots=plots,
        builds=builds,
        events=events,
        validation_html=validation_html,
    )
    parts.append(
        "<h2 id='more'>More</h2><p>Every plot and table is in the menu on the left "
        "(<a href=\"javascript:app.showCategory('Tables')\">Tables</a>: results.csv, "
        "summary.json, manifest.json). How the intervals and verdicts are made and where they "
        "are coarse: <a href='#how-uncertain-the-numbers-are'>the method</a>, below.</p>"
    )
    parts.append("</div>")
    # The heading is a section of its own beside the method's: with a single top-level section
    # docutils would lift the method's title above everything as the document title.
    title = "".join("\\" + c if c in "_*`|\\" else c for c in f"Run {run_id}: what it measured")
    return (
        "{% raw %}\n"
        + f"{title}\n{'=' * len(title)}\n\n"
        + _raw("\n".join(parts))
        + "\n"
        + method_rst.strip()
        + "\n{% endraw %}\n"
    )
