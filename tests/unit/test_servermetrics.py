"""The server's side of a cell: /metrics parsed, recorded and derived (measure/servermetrics)."""

from __future__ import annotations

import http.server
import math
import threading
from pathlib import Path

import pytest

from servesweep.cluster import promtext
from servesweep.config.schema import TelemetryConfig
from servesweep.measure import servermetrics
from servesweep.sim.engine import StageLatency
from servesweep.sim.server import stage_histogram

ROOT = Path(__file__).resolve().parents[2]
TRACE = ROOT / "docs/rehearsal/h200-2026-12-02/calls/1/metrics.jsonl.xz"
FIRST_SERVER = "http://127.0.0.1:53473"  # the trace's first server set (its second: 38861)


def test_the_real_trace_gives_the_load_and_stage_figures() -> None:
    """SGLang 0.5.17's /metrics, every 0.5 s (full scrapes, then deltas): the first server's
    load over its whole series and its per-stage latencies (non-PD: no TTFT breakdown)."""
    lines = [x for x in servermetrics.read_lines(TRACE) if x["url"] == FIRST_SERVER]
    figures = servermetrics.derive(lines, client_ttft_ms=100.0)
    assert figures["server_scrapes"] == 122
    assert figures["server_running_reqs_peak"] == 7
    assert figures["server_queue_reqs_peak"] == 7
    assert 0 < figures["server_running_reqs_mean"] < 7
    assert figures["server_kv_usage_peak"] == pytest.approx(0.02)
    assert figures["server_cache_hit_rate_peak"] == 0
    stages = figures["stages"][""]
    assert set(stages) == {"request_process", "prefill_forward", "chunked_prefill"}
    assert stages["prefill_forward"]["requests"] == 597
    assert stages["prefill_forward"]["mean_ms"] == pytest.approx(51.625, abs=0.01)
    assert 0 < stages["prefill_forward"]["p50_ms"] <= stages["prefill_forward"]["p99_ms"]
    assert not set(servermetrics.TTFT_COLUMNS) & set(figures), "no NaN kept"
    assert all(math.isnan(servermetrics.columns(figures)[c]) for c in servermetrics.TTFT_COLUMNS)


def test_a_window_keeps_only_its_rounds() -> None:
    lines = [x for x in servermetrics.read_lines(TRACE) if x["url"] == FIRST_SERVER]
    start = lines[0]["t"]
    idle = servermetrics.derive(lines, window=(start, start + 5.0))
    assert idle["server_scrapes"] == 10  # every ~0.5 s
    assert idle["server_running_reqs_peak"] == 0


def test_the_parse_keys_series_by_family_and_labels() -> None:
    """The one parse of /metrics (the watchdog's and the recorder's): series, sums, labels."""
    text = "\n".join(
        [
            "# HELP sglang:num_running_reqs x",
            'sglang:num_running_reqs{model_name="m",tp_rank="0"} 3.0',
            'sglang:num_queue_reqs{model_name="m"} 2.0',
            'sglang:generation_tokens_total{model_name="m"} 10.0',
        ]
    )
    sample = promtext.parse(text)
    assert promtext.total(sample, "sglang:num_running_reqs") == 3.0
    assert promtext.labels('a{x="1",le="+Inf"}') == {"x": "1", "le": "+Inf"}


def _exposition(stages: dict[str, list[float]]) -> str:
    found = {}
    for stage, seconds in stages.items():
        hist = StageLatency()
        for s in seconds:
            hist.observe(s)
        found[stage] = hist
    return "\n".join(stage_histogram(found, labels='model_name="m"'))


def _scrape(t: float, n: int, role: str, text: str) -> dict:
    return {"t": t, "n": n, "url": f"http://{role}", "role": role, "full": promtext.parse(text)}


def test_the_pd_breakdown_adds_up_the_stages_of_the_sims_histograms() -> None:
    """Histogram deltas between the first and the last round, as the sim serves them: the
    parts are the stage means, their sum is compared with the client's mean TTFT."""
    before_p = _exposition({"prefill_bootstrap": [0.5], "prefill_forward": [0.5]})
    after_p = _exposition(
        {
            "prefill_bootstrap": [0.5, 0.010, 0.030],  # one request before the cell
            "prefill_forward": [0.5, 0.100, 0.300],
            "prefill_transfer_kv_cache": [0.020, 0.040],
        }
    )
    after_d = _exposition(
        {
            "decode_bootstrap": [0.008, 0.012],
            "decode_transferred": [0.2, 0.4],
            "decode_waiting": [0.005, 0.015],
        }
    )
    lines = [
        {"header": {"window": [0.0, 10.0]}},
        _scrape(0.0, 0, "prefill", before_p),
        _scrape(0.0, 0, "decode", ""),
        _scrape(10.0, 1, "prefill", after_p),
        _scrape(10.0, 1, "decode", after_d),
    ]
    # bootstrap 20 + prefill 200 + transfer 30 + first decode 10 = 260 ms
    figures = servermetrics.derive(lines, client_ttft_ms=250.0)
    assert figures["ttft_bootstrap_ms"] == pytest.approx(20.0)
    assert figures["ttft_prefill_ms"] == pytest.approx(200.0)
    assert figures["ttft_transfer_ms"] == pytest.approx(30.0)
    assert figures["ttft_first_decode_ms"] == pytest.approx(10.0)
    assert figures["ttft_prealloc_ms"] == pytest.approx(10.0)  # overlaps bootstrap: not summed
    assert figures["ttft_queue_ms"] == 0.0
    assert figures["ttft_breakdown_ms"] == pytest.approx(260.0)
    assert figures["ttft_breakdown_error_pct"] == pytest.approx(4.0)
    assert figures["stages"]["decode"]["decode_transferred"]["requests"] == 2
    p99 = figures["stages"]["prefill"]["prefill_forward"]["p99_ms"]
    assert 100 < p99 <= 1000 * 0.3 * 1.62  # inside the bucket that holds 0.3 s


def test_quantile_interpolates_inside_its_bucket() -> None:
    buckets = {0.1: 0.0, 0.2: 10.0, math.inf: 10.0}
    assert servermetrics.quantile(buckets, 0.5) == pytest.approx(0.15)
    assert math.isnan(servermetrics.quantile({math.inf: 0.0}, 0.5))


class _Metrics(http.server.BaseHTTPRequestHandler):
    hits: dict[str, int] = {}
    running = 0

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        _Metrics.hits[self.path] = _Metrics.hits.get(self.path, 0) + 1
        if self.path != "/engine/metrics":
            self.send_error(404)
            return
        _Metrics.running += 1
        body = (
            f'sglang:num_running_reqs{{m="x"}} {_Metrics.running}.0\n'
            'sglang:token_usage{m="x"} 0.5\n'
        ).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_the_recorder_writes_full_then_deltas_and_says_a_404_once(tmp_path: Path) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        recorder = servermetrics.MetricsRecorder(
            targets=[("single", f"{base}/engine"), ("router", f"{base}/router")],
            interval_s=0.05,
        )
        recorder.start()
        threading.Event().wait(0.3)
        lines = recorder.stop()
    finally:
        server.shutdown()
    assert _Metrics.hits["/router/metrics"] == 1
    assert recorder.notes == [f"router {base}/router/metrics answers 404: not recorded"]
    assert "full" in lines[0] and all("delta" in x for x in lines[1:])
    assert all("sglang:token_usage" not in str(x.get("delta")) for x in lines[1:])
    path = tmp_path / "metrics" / "r0.jsonl.gz"
    servermetrics.write_series(path, recorder.header((lines[0]["t"], lines[-1]["t"])), lines)
    figures = servermetrics.derive(servermetrics.read_lines(path))
    assert figures["server_scrapes"] == len(lines) >= 3
    assert figures["server_running_reqs_peak"] == len(lines)
    assert figures["server_kv_usage_mean"] == 0.5


def test_an_off_recorder_scrapes_nothing() -> None:
    recorder = servermetrics.MetricsRecorder(targets=[("single", "http://x")], interval_s=0)
    recorder.start()
    assert recorder.stop() == []


def test_a_too_short_interval_is_one_line_naming_the_key() -> None:
    with pytest.raises(ValueError, match="telemetry.metrics_interval_s 0.01"):
        TelemetryConfig(metrics_interval_s=0.01)
    assert TelemetryConfig(metrics_interval_s=0).metrics_interval_s == 0
