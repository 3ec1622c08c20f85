"""Tests of analysis.plots on the default 8-cell matrix and on narrowed 1-cell matrices."""

from __future__ import annotations

from pathlib import Path

import matplotlib.colors
import numpy as np
import pandas as pd
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import LineCollection, PathCollection
from matplotlib.figure import Figure

from servesweep.analysis import labels, plots
from servesweep.analysis.results import METRICS, result_row
from servesweep.analysis.summary import summarize
from servesweep.config.load import load_experiment_file
from servesweep.config.matrix import cell_repeats

CONFIG = Path(__file__).resolve().parents[2] / "config" / "config.yaml"
# flashinfer_mxfp4 helps at chunk 8192 and hurts at 16384; concurrency 16 doubles latency.
EFFECT = {
    ("marlin", 8192): 1.0,
    ("marlin", 16384): 1.0,
    ("flashinfer_mxfp4", 8192): 0.8,
    ("flashinfer_mxfp4", 16384): 1.25,
}
REPEAT = {1: 1.0, 2: 1.1, 3: 0.95}


def results_for(effect: dict | None = None, **env: str) -> tuple[object, pd.DataFrame]:
    """A results table as collect_results builds it, with known effects, no files."""
    exp = load_experiment_file(CONFIG, env)
    effect = effect or EFFECT
    rows = []
    for cell in cell_repeats(exp):
        s = cell.server.axes
        f = effect[(s["moe_runner_backend"], s["chunked_prefill_size"])] * REPEAT[cell.repeat]
        f *= 2.0 if cell.client.axes["concurrency"] == 16 else 1.0
        metrics = {m: np.nan for m in METRICS}
        metrics |= {
            "ttft_p50_ms": 1000 * f,
            "ttft_p95_ms": 1500 * f,
            "ttft_p99_ms": 1800 * f,
            "e2e_p50_ms": 1000 * f,
            "input_tps": 60000 / f,
            "completed": 40,
            "total_output_tokens": 40,
        }
        rows.append(result_row(run_id=exp.run_id, cell=cell, metrics=metrics, gpu={}))
    return exp, pd.DataFrame(rows)


def summary_for(exp, df: pd.DataFrame) -> dict:
    return summarize(
        results=df,
        baseline=exp.baseline,
        server_axes=list(exp.matrix.server),
        client_axes=list(exp.matrix.client),
    )


def bar_widths(fig: Figure) -> list[float]:
    ax = fig.axes[0]
    return sorted(p.get_width() for c in ax.containers for p in c if not np.isnan(p.get_width()))


def message(fig: Figure) -> str:
    return "\n".join(t.get_text() for ax in fig.axes for t in ax.texts)


def points(ax) -> np.ndarray:
    offsets = [c.get_offsets() for c in ax.collections if isinstance(c, PathCollection)]
    return np.concatenate(offsets) if offsets else np.empty((0, 2))


@pytest.fixture(scope="module")
def default():
    exp, df = results_for()
    return exp, df, summary_for(exp, df)


def test_plot_deltas_default_matrix(default, tmp_path):
    _, _, summary = default
    fig = plots.plot_deltas(summary, metric="ttft_p50_ms")
    assert isinstance(fig, Figure)
    assert bar_widths(fig) == pytest.approx([-20.0, -20.0, 25.0, 25.0])
    ax = fig.axes[0]
    assert "lower is better: negative bars are improvements" in ax.get_xlabel()
    assert {t.get_text() for t in ax.get_legend().get_texts()} == {"better", "worse"}
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels[0] == "flashinfer_mxfp4\nchunked_prefill_size=8192, concurrency=8"
    assert any(np.allclose(line.get_xdata(), 0) for line in ax.lines)  # the zero line
    assert "moe_runner_backend=marlin" in fig.get_suptitle()

    path = tmp_path / "plots" / "delta_ttft_p50_ms.png"
    plots.save_figure(fig, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in path.parent.iterdir()] == ["delta_ttft_p50_ms.png"]


def whiskers(ax) -> list[tuple[float, float]]:
    segs = [s for c in ax.collections if isinstance(c, LineCollection) for s in c.get_segments()]
    return sorted((float(s[0][0]), float(s[1][0])) for s in segs)


def test_plot_deltas_intervals_and_verdicts():
    # flashinfer_mxfp4 at chunk 16384 is 3% slower: the repeat spread (+-10%) swamps it.
    exp, df = results_for({**EFFECT, ("flashinfer_mxfp4", 16384): 1.03})
    summary = summary_for(exp, df)
    fig = plots.plot_deltas(summary, metric="ttft_p50_ms")
    ax = fig.axes[0]
    assert bar_widths(fig) == pytest.approx([-20.0, -20.0, 3.0, 3.0])
    assert {t.get_text() for t in ax.get_legend().get_texts()} == {"better", "within noise"}
    want = sorted(
        (d["metrics"]["ttft_p50_ms"]["ci_low"], d["metrics"]["ttft_p50_ms"]["ci_high"])
        for d in summary["deltas"]
    )
    # pytest.approx compares flat sequences only (pytest >= 9 rejects nested ones)
    np.testing.assert_allclose(whiskers(ax), want)
    # 3 repeats, record values only: the interval is [min/max, max/min] of the two cells.
    assert want[0] == pytest.approx((100 * (0.8 * 0.95 / 1.1 - 1), 100 * (0.8 * 1.1 / 0.95 - 1)))
    texts = [t.get_text() for t in ax.texts]
    firsts = [t.splitlines()[0] for t in texts]
    assert any(t.startswith("+3.0% [") and t.endswith("within noise") for t in firsts)
    assert any(t.startswith("-20.0% [") and t.endswith("better") for t in firsts)
    # beside each %: the baseline's absolute median, in the metric's unit
    base = summary["deltas"][0]["metrics"]["ttft_p50_ms"]["baseline_median"]
    assert texts[0].splitlines()[1] == f"of baseline {labels.value_text(base, 'ttft_p50_ms')}"
    assert fig.get_suptitle().startswith("TTFT p50 [ms]: change of the median vs baseline")
    assert ax.get_xlabel().startswith("change vs baseline, %")
    assert "95% bootstrap interval" in fig.get_suptitle()
    assert "coarse intervals (repeats per cell: 3," in fig.get_suptitle()
    colors = {tuple(p.get_facecolor()[:3]) for p in ax.patches if p.get_width() > 0}
    assert colors == {matplotlib.colors.to_rgb(plots.VERDICT_COLORS["within noise"])}


def test_plot_deltas_one_repeat_is_unknown_without_whiskers():
    exp, df = results_for()
    summary = summary_for(exp, df[df.repeat == 1])
    d = summary["deltas"][0]["metrics"]["ttft_p50_ms"]
    assert d["verdict"] == "unknown" and d["ci_low"] is None and d["better"] is True
    fig = plots.plot_deltas(summary, metric="ttft_p50_ms")
    assert {t.get_text() for t in fig.axes[0].get_legend().get_texts()} == {"unknown"}
    assert whiskers(fig.axes[0]) == []
    assert "coarse intervals (repeats per cell: 1," in fig.get_suptitle()


def test_plot_deltas_of_a_summary_without_intervals():
    exp, df = results_for()
    old = summarize(
        results=df,
        baseline=exp.baseline,
        server_axes=list(exp.matrix.server),
        client_axes=list(exp.matrix.client),
        bootstrap=None,
    )
    assert "method" not in old and "ci_low" not in old["cells"][0]["metrics"]["ttft_p50_ms"]
    fig = plots.plot_deltas(old, metric="ttft_p50_ms")
    assert bar_widths(fig) == pytest.approx([-20.0, -20.0, 25.0, 25.0])
    assert {t.get_text() for t in fig.axes[0].get_legend().get_texts()} == {"unknown"}


def test_plot_deltas_throughput_sign_convention(default):
    _, _, summary = default
    fig = plots.plot_deltas(summary, metric="input_tps")
    assert bar_widths(fig) == pytest.approx([-20.0, -20.0, 25.0, 25.0])
    assert "higher is better: positive bars are improvements" in fig.axes[0].get_xlabel()


def test_plot_deltas_without_baseline_says_so(tmp_path):
    exp, df = results_for(BACKENDS_CSV="flashinfer_mxfp4", CONCURRENCIES_CSV="8")
    fig = plots.plot_deltas(summary_for(exp, df), metric="ttft_p50_ms")
    assert bar_widths(fig) == []
    assert "no baseline in this run" in message(fig)
    plots.save_figure(fig, tmp_path / "empty.png")
    assert (tmp_path / "empty.png").stat().st_size > 0


def test_plot_deltas_one_cell_of_the_baseline():
    exp, df = results_for(
        BACKENDS_CSV="marlin", CHUNKED_PREFILL_SIZES_CSV="8192", CONCURRENCIES_CSV="16"
    )
    assert len(df) == 3
    fig = plots.plot_deltas(summary_for(exp, df), metric="ttft_p50_ms")
    assert "only the baseline moe_runner_backend=marlin ran" in message(fig)


def test_plot_deltas_of_a_metric_without_deltas(default):
    _, _, summary = default
    fig = plots.plot_deltas(summary, metric="tpot_p50_ms")  # output length 1: no TPOT
    assert bar_widths(fig) == []
    assert "no tpot_p50_ms deltas" in message(fig)


def test_plot_metric_vs_default_matrix(default, tmp_path):
    _, df, _ = default
    fig = plots.plot_metric_vs(
        df,
        metric="ttft_p50_ms",
        x="concurrency",
        hue="moe_runner_backend",
        col="chunked_prefill_size",
    )
    assert [ax.get_title() for ax in fig.axes[:2]] == [
        "chunked_prefill_size=8192",
        "chunked_prefill_size=16384",
    ]
    for ax, chunk in zip(fig.axes[:2], (8192, 16384), strict=True):
        sub = df[df.chunked_prefill_size == chunk]
        pts = points(ax)
        assert len(pts) == 12  # 2 backends x 2 concurrencies x 3 repeats
        assert sorted(pts[:, 1]) == pytest.approx(sorted(sub["ttft_p50_ms"]))
        medians = sub.groupby(["moe_runner_backend", "concurrency"])["ttft_p50_ms"].median()
        drawn = sorted(y for line in ax.lines for y in line.get_ydata() if len(line.get_ydata()))
        assert drawn == pytest.approx(sorted(medians))
        assert list(ax.get_xticks()) == [8, 16]
    assert "lower is better" in fig.get_suptitle()
    plots.save_figure(fig, tmp_path / "ttft_p50_ms_vs_concurrency.png")


def test_plot_metric_vs_a_panel_per_pool(default):
    _, df, _ = default
    pooled = df.assign(pool=[i % 2 for i in range(len(df))])
    fig = plots.plot_metric_vs(
        pooled, metric="ttft_p50_ms", x="concurrency", hue="moe_runner_backend", col="pool"
    )
    assert [ax.get_title() for ax in fig.axes[:2]] == ["pool=0", "pool=1"]
    assert [len(points(ax)) for ax in fig.axes[:2]] == [12, 12]


def test_plot_metric_vs_one_cell_and_no_grouping():
    exp, df = results_for(
        BACKENDS_CSV="marlin", CHUNKED_PREFILL_SIZES_CSV="8192", CONCURRENCIES_CSV="16"
    )
    fig = plots.plot_metric_vs(
        df, metric="input_tps", hue="moe_runner_backend", col="chunked_prefill_size"
    )
    assert len(points(fig.axes[0])) == 3
    assert "higher is better" in fig.get_suptitle()
    plain = plots.plot_metric_vs(df, metric="input_tps")
    assert len(points(plain.axes[0])) == 3


def test_plot_metric_vs_labels_units_zero_and_repeats_on_top(default):
    _, df, _ = default
    sim = df.assign(engine_kind="sim", sim_time_scale=0.005)
    fig = plots.plot_metric_vs(sim, metric="ttft_p50_ms", hue="moe_runner_backend")
    ax = fig.axes[0]
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("client concurrency [requests]", "TTFT p50 [ms]")
    assert ax.get_ylim()[0] == 0
    assert "SIMULATED engine (time scale 0.005" in fig.get_suptitle()
    # every repeat is a dot drawn above the medians' line, whose markers are open circles
    dots = [c for c in ax.collections if isinstance(c, PathCollection)]
    assert len(points(ax)) == len(df)
    line_z = max(line.get_zorder() for line in ax.lines)
    assert all(c.get_zorder() > line_z for c in dots)
    assert all(line.get_markerfacecolor() == "none" for line in ax.lines if line.get_marker())
    real = plots.plot_metric_vs(df.assign(engine_kind="sglang"), metric="ttft_p50_ms")
    assert "SIMULATED" not in real.get_suptitle()


def test_plot_metric_vs_bad_column_and_no_values(default):
    _, df, _ = default
    with pytest.raises(ValueError, match="page_size"):
        plots.plot_metric_vs(df, metric="ttft_p50_ms", col="page_size")
    fig = plots.plot_metric_vs(df, metric="itl_p50_ms")  # all NaN in this table
    assert "no ITL p50 [ms] values" in message(fig)


def test_write_run_plots_writes_every_figure_of_the_run(default, tmp_path):
    exp, df, summary = default
    hue, col = plots.series_axes(list(exp.matrix.server), exp.baseline)
    assert (hue, col) == ("moe_runner_backend", "chunked_prefill_size")
    deltas = {m: tmp_path / f"delta_{m}.png" for m in ("ttft_p50_ms", "input_tps")}
    metric_vs = {"ttft_p50_ms": tmp_path / "ttft_p50_ms_vs_concurrency.png"}
    plots.write_run_plots(
        summary=summary,
        results=df,
        deltas=deltas,
        metric_vs=metric_vs,
        x="concurrency",
        hue=hue,
        col=col,
    )
    for path in [*deltas.values(), *metric_vs.values()]:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", path
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        p.name for p in [*deltas.values(), *metric_vs.values()]
    )


def _many_deltas(n: int) -> dict:
    deltas = [
        {
            "axes": {"moe_runner_backend": "flashinfer_mxfp4", "concurrency": i},
            "metrics": {
                "ttft_p50_ms": {
                    "delta_pct": float(i if i % 2 else -i),
                    "ci_low": None,
                    "ci_high": None,
                    "verdict": "better",
                }
            },
        }
        for i in range(n)
    ]
    return {"baseline": {"moe_runner_backend": "marlin"}, "deltas": deltas}


def test_plot_deltas_of_a_large_matrix_shows_the_largest_changes():
    n = plots.MAX_DELTA_ROWS + 25
    fig = plots.plot_deltas(_many_deltas(n), metric="ttft_p50_ms")
    widths = sorted(abs(w) for w in bar_widths(fig))
    assert widths == [float(i) for i in range(25, n)]  # the 40 largest |changes|
    labels = [t.get_text().split("\n")[-1] for t in fig.axes[0].get_yticklabels()]
    assert labels == [f"concurrency={i}" for i in range(25, n)]  # in the summary's order
    assert f"the {plots.MAX_DELTA_ROWS} largest |changes| of {n} cells" in fig.get_suptitle()
    assert fig.get_size_inches()[1] < 2.4 + 0.65 * (plots.MAX_DELTA_ROWS + 1)


def test_plot_comparison_of_a_large_matrix_shows_the_largest_changes_per_metric():
    n = plots.MAX_DELTA_ROWS + 5
    cells = [
        {"label": f"cell {i}", "metrics": {"ttft_p50_ms": {"delta_pct": i, "verdict": "worse"}}}
        for i in range(n)
    ]
    fig = plots.plot_comparison(
        {"run_a": "a", "run_b": "b", "cells": cells, "metrics": ["ttft_p50_ms"]}
    )
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == [f"cell {i}" for i in range(5, n)]
    assert ax.get_title().endswith(f"the {plots.MAX_DELTA_ROWS} largest |changes| of {n} cells")


def test_plot_metric_vs_many_client_values_keeps_matplotlibs_ticks():
    n = plots.MAX_X_TICKS + 30
    df = pd.DataFrame({"concurrency": range(1, n + 1), "ttft_p50_ms": np.linspace(1, 2, n)})
    fig = plots.plot_metric_vs(df, metric="ttft_p50_ms", x="concurrency")
    ticks = fig.axes[0].get_xticks()
    assert len(ticks) <= plots.MAX_X_TICKS, ticks
    assert len(points(fig.axes[0])) == n


def _words(text: str) -> str:
    """A title with its wrapping undone."""
    return " ".join(text.split())


def test_energy_and_goodput_page(default, tmp_path):
    _, df, _ = default
    data = df.assign(
        gpu_source="simulated",
        gpu_power_mean_w=5000.0 + df["concurrency"],
        joules_per_input_token=0.01,
        goodput_rps=df["request_throughput_rps"],
        slo_pct=100.0,
    )
    fig = plots.plot_energy_goodput(data, x="concurrency", hue="moe_runner_backend")
    assert "GPU power: simulated" in _words(fig.get_suptitle())
    shown = [ax for ax in fig.axes if ax.get_visible() and ax.get_title()]
    titles = [ax.get_title().split(" (")[0] for ax in shown]
    assert titles == [labels.label(m) for m in plots.ENERGY_PAGE_METRICS]
    assert all(ax.get_ylim()[0] == 0 for ax in shown)  # y from zero
    power = shown[0]
    assert sorted(points(power)[:, 1]) == pytest.approx(sorted(data["gpu_power_mean_w"]))
    empty = plots.plot_energy_goodput(df.assign(goodput_rps=np.nan), x="concurrency")
    assert "no goodput [req/s] values (no SLO configured)" in message(empty)
    assert "CLIENT SATURATED" not in _words(fig.get_suptitle())
    flagged = plots.plot_energy_goodput(data.assign(client_saturated=True), x="concurrency")
    assert f"CLIENT SATURATED in {len(data)} cell-repeat(s)" in _words(flagged.get_suptitle())
    plots.save_figure(fig, tmp_path / "energy_goodput_vs_concurrency.png")


def _inside(fig: Figure) -> None:
    """Every line and dot of every panel lies inside that panel's y limits (read after a draw,
    as the saved PNG shows them)."""
    fig.canvas.draw()
    for ax in fig.axes:
        low, high = ax.get_ylim()
        ys = [y for line in ax.lines for y in np.asarray(line.get_ydata(), dtype=float)]
        ys += list(points(ax)[:, 1])
        assert all(low <= y <= high for y in ys if np.isfinite(y)), (ax.get_title(), low, high)


def _two_chunks(high_panel: int) -> pd.DataFrame:
    """input_tps per (backend, chunk, concurrency, repeat): the `high_panel` chunk ~3x higher,
    flashinfer above marlin (the winner)."""
    rows = []
    for chunk in (8192, 16384):
        scale = 3.0 if chunk == high_panel else 1.0
        for backend, gain in (("marlin", 1.0), ("flashinfer_mxfp4", 1.1)):
            for c in (8, 16):
                for r in (1, 2, 3):
                    rows.append(
                        {
                            "moe_runner_backend": backend,
                            "chunked_prefill_size": chunk,
                            "concurrency": c,
                            "repeat": r,
                            "input_tps": 1000.0 * scale * gain * (1 + c / 100) + r,
                            "gpu_power_mean_w": 100.0 * scale * gain + r,
                        }
                    )
    return pd.DataFrame(rows)


@pytest.mark.parametrize("high_panel", [8192, 16384])
def test_metric_vs_panels_sharing_y_show_every_line(high_panel):
    data = _two_chunks(high_panel)
    fig = plots.plot_metric_vs(
        data, metric="input_tps", x="concurrency", hue="moe_runner_backend",
        col="chunked_prefill_size",
    )  # fmt: skip
    _inside(fig)
    low, high = fig.axes[0].get_ylim()
    assert low == 0 and high >= data["input_tps"].max()
    # the winner's line (flashinfer, the highest) is drawn in full in the higher panel
    lines = [line.get_ydata() for ax in fig.axes for line in ax.lines]
    top = max(max(y) for y in lines if len(y))
    assert top <= high


def test_energy_page_has_a_panel_per_chunk_size_not_one_pooled_line():
    data = _two_chunks(16384).assign(gpu_source="simulated")
    fig = plots.plot_energy_goodput(
        data, x="concurrency", hue="moe_runner_backend", col="chunked_prefill_size"
    )
    assert "a panel per chunked_prefill_size" in _words(fig.get_suptitle())
    power = [ax for ax in fig.axes if "GPU power" in ax.get_title() or "power" in ax.get_title()]
    assert [ax.get_title().split(":")[0] for ax in power] == [
        "chunked_prefill_size=8192",
        "chunked_prefill_size=16384",
    ]
    for ax, chunk in zip(power, (8192, 16384), strict=True):
        expected = data.loc[data["chunked_prefill_size"] == chunk, "gpu_power_mean_w"]
        assert sorted(points(ax)[:, 1]) == pytest.approx(sorted(expected))
    _inside(fig)


def _text_boxes(fig: Figure) -> list[tuple[str, object]]:
    """(text, window extent) of the figure's title and every panel title, as drawn into a PNG
    (Agg, the saved figure's dpi)."""
    canvas = FigureCanvasAgg(fig)
    fig.set_dpi(plots.DPI)
    canvas.draw()
    renderer = canvas.get_renderer()
    texts = [fig._suptitle] if fig._suptitle is not None else []
    texts += [ax.title for ax in fig.axes if ax.get_visible() and ax.get_title()]
    return [(t.get_text(), t.get_window_extent(renderer)) for t in texts]


@pytest.mark.parametrize("saturated", [False, True])
def test_energy_page_titles_lie_inside_the_figure_and_do_not_overlap(saturated):
    """The sim's long title (power source, repeats, panels, time scale, saturation) and the
    panel titles (`chunked_prefill_size=...: <metric> (<direction> is better)`) as rendered."""
    data = _two_chunks(16384).assign(
        gpu_source="simulated",
        engine_kind="sim",
        sim_time_scale=0.005,
        client_saturated=saturated,
        joules_per_input_token=0.01,
        output_tokens_per_watt=2.0,
        goodput_rps=1.0,
        slo_pct=100.0,
    )
    fig = plots.plot_energy_goodput(
        data, x="concurrency", hue="moe_runner_backend", col="chunked_prefill_size"
    )
    boxes = _text_boxes(fig)
    assert len(boxes) == 1 + 2 * len(plots.ENERGY_PAGE_METRICS)
    whole = fig.bbox
    for text, box in boxes:
        inside = whole.x0 <= box.x0 and box.x1 <= whole.x1 and whole.y0 <= box.y0
        assert inside and box.y1 <= whole.y1, (text, box, whole)
    for i, (text, box) in enumerate(boxes):
        for other, obox in boxes[i + 1 :]:
            assert not box.overlaps(obox), (text, other)


def test_ttft_breakdown_stacks_the_parts_per_cell_beside_the_clients_ttft():
    """PD: one stacked bar per (server, case), its segments the mean parts over repeats."""
    rows = [
        {"server_id": "pd", "client_id": case, "repeat": r, "ttft_mean_ms": 100.0 * k,
         "ttft_bootstrap_ms": 5.0, "ttft_queue_ms": 0.0, "ttft_prefill_ms": 40.0 * k + r,
         "ttft_transfer_ms": 30.0, "ttft_first_decode_ms": 2.0}
        for k, case in enumerate(["case~a", "case~b"], start=1)
        for r in (0, 2)
    ]  # fmt: skip
    fig = plots.plot_ttft_breakdown(pd.DataFrame(rows))
    ax = fig.axes[0]
    bars = ax.patches
    assert len(bars) == 2 * 5  # two cells, five parts
    prefill = bars[4:6]  # bootstrap, queue, then prefill: two bars each
    assert sorted(b.get_width() for b in prefill) == [41.0, 81.0]  # means over the repeats
    ends = sorted(b.get_x() + b.get_width() for b in bars[-2:])
    assert ends == [78.0, 118.0]
    assert "client's mean TTFT" in [t.get_text() for t in ax.get_legend().get_texts()]


def test_ttft_breakdown_without_stages_says_so():
    fig = plots.plot_ttft_breakdown(pd.DataFrame([{"server_id": "s", "client_id": "c"}]))
    assert "no TTFT breakdown" in " ".join(t.get_text() for t in fig.axes[0].texts)


def test_server_series_has_a_panel_per_cell_over_its_window(tmp_path):
    """One panel per cell (its first repeat), running/queued and KV usage inside the window."""
    from servesweep.measure import servermetrics

    def scrape(t, n, running):
        body = {
            'sglang:num_running_reqs{m="x"}': str(running),
            'sglang:token_usage{m="x"}': "0.5",
            'sglang:num_queue_reqs{m="x"}': "2",
        }
        return {"t": t, "n": n, "url": "u", "role": "server", "full": body}

    paths = []
    for cell in ("c~1", "c~2"):
        for repeat in (1, 2):
            path = tmp_path / "metrics" / "s" / cell / f"r{repeat}.jsonl.gz"
            lines = [scrape(100.0 + i, i, i) for i in range(6)]
            servermetrics.write_series(path, {"window": [101.0, 104.0]}, lines)
            paths.append(path)
    fig = plots.plot_server_series(paths, results=pd.DataFrame())
    panels = [ax for ax in fig.axes if ax.get_title()]
    assert [ax.get_title() for ax in panels] == ["s / c~1", "s / c~2"]
    running = panels[0].get_lines()[0]
    assert list(running.get_xdata()) == [0.0, 1.0, 2.0, 3.0]  # seconds into the window
    assert list(running.get_ydata()) == [1.0, 2.0, 3.0, 4.0]
