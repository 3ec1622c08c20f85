"""report.html, written by `all` (servesweep.analysis.htmlreport, analysisjobs.write_report)."""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from servesweep.analysis import htmlreport  # noqa: E402
from servesweep.workflow.analysisjobs import write_report  # noqa: E402
from tests.helpers import REPO  # noqa: E402
from tests.unit.test_landing import MANIFEST, SUMMARY  # noqa: E402


class _Ids(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: list[str] = []
        self.links: list[str] = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("id"):
            self.ids.append(a["id"])
        if tag == "a" and a.get("href"):
            self.links.append(a["href"])


def test_method_rst_renders_to_html():
    body = htmlreport.rst_to_html((REPO / "report" / "method.rst").read_text())
    assert "How uncertain the numbers are" in body and "<strong>Point estimates.</strong>" in body


def test_the_page_opens_on_the_answer_then_plots_then_the_method(tmp_path: Path):
    png = tmp_path / "plots" / "delta_ttft_p50_ms.png"
    png.parent.mkdir()
    fig, ax = plt.subplots()
    ax.plot([1, 2], [3, 4])
    fig.savefig(png)
    plt.close(fig)
    for name, data in (("summary.json", SUMMARY), ("manifest.json", MANIFEST)):
        (tmp_path / name).write_text(json.dumps(data))
    pd.DataFrame(
        {"run_id": ["r1"], "retokenized_ratio": [1.0], "client_saturated": [False]}
    ).to_csv(tmp_path / "results.csv", index=False)
    out = tmp_path / "report.html"
    write_report(
        summary_json=tmp_path / "summary.json",
        results_csv=tmp_path / "results.csv",
        manifest_json=tmp_path / "manifest.json",
        builds=[],
        events=[],
        method=REPO / "report" / "method.rst",
        metrics=["ttft_p50_ms", "input_tps"],
        key_plots=[("TTFT p50: change vs baseline", png)],
        plots=[png],
        tables=[tmp_path / "results.csv", tmp_path / "summary.json"],
        out=out,
    )
    page = out.read_text()
    parser = _Ids()
    parser.feed(page)
    sections = ["identity", "deltas", "warnings", "all-plots", "method"]
    assert [i for i in parser.ids if i in sections] == sections
    assert parser.links == ["results.csv", "summary.json"]
    assert page.count("data:image/png;base64,") == 2  # the key plot and the plot list
    assert "SIMULATED engine" in page and "How uncertain the numbers are" in page
