"""Tests of cluster.gpusampling and analysis.gpufigures: loop parsing, trapezoid energy over a
recorded H200 series, the sampler over a fake looping nvidia-smi, the simulated curve, and a
real-GPU capture."""

from __future__ import annotations

import json
import math
import os
import shlex
import time
from pathlib import Path

import pytest

from servesweep.analysis import gpufigures
from servesweep.cluster import gpusampling, telemetry
from servesweep.cluster.transport import CommandResult, LocalTransport
from servesweep.core import gpufile
from tests.helpers import wait_until

DATA = Path(__file__).resolve().parents[1] / "data"
SERIES = DATA / "nvidia-smi-series" / "loop-500ms-idle-load-idle.csv"
# The capture benchmarks/gpu_sampler_check.py writes on a real GPU (committed by the lead).
CAPTURE = Path(
    os.environ.get("SERVESWEEP_GPU_CAPTURE", DATA / "nvidia-smi-h200-check" / "samples.csv")
)


def series_rows(node: str = "n1") -> list[dict]:
    """The recorded series as sample rows of one node (as the loop's rows would be)."""
    meta = {"node": node, "phase": gpufile.PHASE_SAMPLE, "status": "ok", "detail": ""}
    return [{**meta, **r} for r in telemetry.parse_with_header(SERIES.read_text())]


def window(start: str, end: str) -> list[dict]:
    return gpusampling.window_rows(gpufile.parse_timestamp(start), gpufile.parse_timestamp(end))


def test_timestamps_round_trip():
    t = gpufile.parse_timestamp("2026/12/01 14:13:27.970")
    assert gpufile.format_timestamp(t) == "2026/12/01 14:13:27.970"


def test_energy_is_the_hand_computed_trapezoid_over_the_recorded_capture():
    # samples 14:13:56.016 691.33 W, 56.516 691.69 W, 57.017 692.36 W, 57.518 692.40 W:
    # 0.500*(691.33+691.69)/2 + 0.501*(691.69+692.36)/2 + 0.501*(692.36+692.40)/2
    hand = 0.500 * 691.51 + 0.501 * 692.025 + 0.501 * 692.38
    rows = series_rows() + window("2026/12/01 14:13:56.016", "2026/12/01 14:13:57.518")
    figures = gpufigures.sample_figures(rows)
    assert figures["gpu_energy_j"] == pytest.approx(hand, abs=1e-3)  # epoch floats: ~1e-7 s
    assert figures["gpu_energy_j"] == pytest.approx(1039.341905, abs=1e-3)
    assert figures["gpu_power_mean_w"] == pytest.approx(hand / 1.502, rel=1e-6)
    assert figures["gpu_power_peak_w"] == 692.40
    assert figures["gpu_mem_used_peak_mib"] == 1139
    assert figures["gpu_util_mean_pct"] == 100
    assert figures["gpu_samples"] == 4
    assert figures["gpu_source"] == "measured"


def test_window_edges_between_samples_are_interpolated():
    # half-way between 56.016 (691.33 W) and 56.516 (691.69 W), to 56.516: 0.25 s
    rows = series_rows() + window("2026/12/01 14:13:56.266", "2026/12/01 14:13:56.516")
    figures = gpufigures.sample_figures(rows)
    assert figures["gpu_energy_j"] == pytest.approx(0.25 * (691.51 + 691.69) / 2, rel=1e-6)


def test_a_window_between_two_samples_has_a_peak_at_least_its_mean():
    """A cell shorter than the interval: no sample inside, the mean comes from the edges."""
    idle, loaded = series_rows()[0], series_rows()[-1]
    rows = [
        idle | {"timestamp": "2026/12/01 14:14:00.000", "power_draw_w": 100.0},
        loaded | {"timestamp": "2026/12/01 14:14:01.000", "power_draw_w": 700.0},
        *window("2026/12/01 14:14:00.400", "2026/12/01 14:14:00.600"),
    ]
    figures = gpufigures.sample_figures(rows)
    assert figures["gpu_power_mean_w"] == pytest.approx(400.0, rel=1e-6)
    assert figures["gpu_power_peak_w"] == pytest.approx(460.0, rel=1e-6)  # the 0.6 s edge
    assert figures["gpu_samples"] == 0


def test_whole_series_idle_load_idle():
    figures = gpufigures.sample_figures(series_rows())
    assert 79 < figures["gpu_power_mean_w"] < 692
    assert figures["gpu_power_peak_w"] > 690
    assert figures["gpu_samples"] == 94


def test_per_node_power_sums_gpus_and_nodes():
    a, b = series_rows("a"), series_rows("b")
    two_gpus = [r | {"index": 1.0} for r in a]
    interleaved = [r for pair in zip(a, two_gpus, strict=True) for r in pair]
    rows = interleaved + b + window("2026/12/01 14:13:56.016", "2026/12/01 14:13:57.518")
    one = gpufigures.sample_figures(series_rows() + window(
        "2026/12/01 14:13:56.016", "2026/12/01 14:13:57.518"))  # fmt: skip
    figures = gpufigures.sample_figures(rows)
    assert figures["gpu_energy_j"] == pytest.approx(3 * one["gpu_energy_j"])
    assert figures["gpu_power_peak_w"] == pytest.approx(3 * 692.40)
    assert figures["gpu_node_power_w"].startswith("a=1383.")
    assert ";b=692." in figures["gpu_node_power_w"]


def test_node_without_nvidia_smi_gives_no_number():
    rows = [
        {"node": "n1", "phase": "sample", "status": "unavailable", "detail": "not found"},
        *window("2026/12/01 14:13:56.016", "2026/12/01 14:13:57.518"),
    ]
    figures = gpufigures.sample_figures(rows)
    assert figures["gpu_source"] == "unavailable"
    assert math.isnan(figures["gpu_energy_j"]) and math.isnan(figures["gpu_power_mean_w"])
    partial = gpufigures.sample_figures(rows + series_rows("n2"))
    assert partial["gpu_source"] == "partial"
    assert partial["gpu_energy_j"] == pytest.approx(1039.341905, abs=1e-3)


def test_unfinished_last_line_is_dropped():
    text = "2026/12/01 14:13:56.016, 0, GPU-x, 691.33, 700, 100, 25, 1139, 143771, 1440, 3201, 57"
    text += ", P0\n"
    rows = gpusampling.parse_loop_output(text + text[:20], node="n1")
    assert len(rows) == 1 and rows[0]["power_draw_w"] == 691.33


class PerNodePath(LocalTransport):
    """Local transport where each node sees its own PATH (one fake machine per node)."""

    def __init__(self, paths: dict[str, str]) -> None:
        self.paths = paths

    def run(self, node, command, *, timeout, stdin=None):
        prefix = f"PATH={shlex.quote(self.paths[node])}; export PATH; "
        res = super().run(node, prefix + command, timeout=timeout, stdin=stdin)
        return CommandResult(node, command, res.returncode, res.stdout, res.stderr)


def fake_gpu_nodes(tmp_path: Path) -> PerNodePath:
    """Node `gpu` has a looping fake nvidia-smi (one line per 50 ms), node `nogpu` none."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nvidia-smi"
    line = "GPU-x, 691.33, 700.00, 100, 25, 1139, 143771, 1440, 3201, 57, P0"
    fake.write_text(
        "#!/bin/sh\n"
        f'case "$*" in *"--query-gpu={",".join(gpusampling.SAMPLE_FIELDS)}'
        ' --format=csv,noheader,nounits --loop-ms=50") ;; *) exit 2 ;; esac\n'
        "while :; do now=$(date '+%Y/%m/%d %H:%M:%S.%3N'); "
        f'echo "$now, 0, {line}"; sleep 0.05; done\n'
    )
    fake.chmod(0o755)
    empty = tmp_path / "empty"
    empty.mkdir()
    system = "/usr/bin:/bin"
    return PerNodePath({"gpu": f"{bin_dir}:{system}", "nogpu": f"{empty}:{system}"})


def gone(pid: int) -> bool:
    """Whether process `pid` has exited (a zombie counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):  # it went between two polls
        return True


def lines_in(path: str) -> int:
    """Finished lines the loop has written to `path` so far (0 before it exists)."""
    try:
        return Path(path).read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


# Below, waits are for what the loop did, not for a time it takes: on a loaded machine each of
# its 50 ms rounds (a `date` and a `sleep` forked) takes longer, and a signalled process exits
# later. WAIT_S bounds each wait (not a timed assert).
WAIT_S = 30.0


def test_sampler_runs_a_loop_per_node_and_stops_it_by_pid(tmp_path):
    sampler = gpusampling.NvidiaSmiSampler(
        transport=fake_gpu_nodes(tmp_path),
        nodes=["gpu", "nogpu"],
        interval_ms=50,
        remote_dir=str(tmp_path / "remote"),
        max_s=60,
    )
    sampler.start()
    pid = sampler.pids["gpu"]
    assert list(sampler.pids) == ["gpu"]
    assert wait_until(lambda: lines_in(sampler._out("gpu")) >= 3, WAIT_S)
    rows = sampler.stop()
    assert wait_until(lambda: gone(pid), WAIT_S), "the loop outlived stop()"  # max_s is 60
    unavailable = [r for r in rows if r["status"] == "unavailable"]
    assert [r["detail"] for r in unavailable] == ["nvidia-smi not found on node nogpu"]
    samples = [r for r in rows if r["status"] == "ok"]
    assert len(samples) >= 3 and {r["node"] for r in samples} == {"gpu"}
    assert not list((tmp_path / "remote").iterdir())  # the loop's file and folder are removed


def test_a_loop_nobody_stops_ends_by_itself(tmp_path):
    """Snakemake SIGKILLed mid-cell never calls stop(): the loop ends after max_s."""
    sampler = gpusampling.NvidiaSmiSampler(
        transport=fake_gpu_nodes(tmp_path),
        nodes=["gpu"],
        interval_ms=50,
        remote_dir=str(tmp_path / "remote"),
        max_s=2,
    )
    sampler.start()
    pid = sampler.pids["gpu"]
    # A loop without its limit samples on: it would still run when the wait gives up.
    assert wait_until(lambda: gone(pid), WAIT_S), "the loop outlived its max_s"
    # It ended after sampling, not at its start (say, a limit of 0 s, or arguments the fake
    # refuses). Two of ~35 rounds in 2 s; a loaded machine's slower rounds still give several.
    assert lines_in(sampler._out("gpu")) >= 2


def test_a_stale_loop_never_writes_into_a_new_samplers_file(tmp_path):
    """A killed run's loop keeps writing at its old offset; were the rerun's loop to truncate
    and reuse that file, the rerun would read NUL bytes (CI, stop 21). Each sampler has its
    own folder, and a corrupt file gives an unavailable row, not an exception."""
    transport = fake_gpu_nodes(tmp_path)
    kwargs = {"transport": transport, "nodes": ["gpu"], "interval_ms": 50, "max_s": 60}
    stale = gpusampling.NvidiaSmiSampler(remote_dir=str(tmp_path / "remote"), **kwargs)
    fresh = gpusampling.NvidiaSmiSampler(remote_dir=str(tmp_path / "remote"), **kwargs)
    assert stale.remote_dir != fresh.remote_dir
    good = "2026/12/01 14:13:56.016, 0, GPU-x, 691.33, 700, 100, 25, 1139, 143771, 1440, 3201"
    good += ", 57, P0\n"
    with pytest.raises(ValueError, match="does not match format"):
        gpusampling.parse_loop_output("\0" * 64 + good, node="gpu")
    fresh.start()
    out = Path(fresh._out("gpu"))
    assert wait_until(lambda: lines_in(str(out)) >= 1, WAIT_S)  # the fresh loop writes to it
    with out.open("r+b") as f:  # what the stale writer did to the shared file in CI
        f.seek(4096)
        f.write(b"2026/12/01 17:09:49.564, 0, GPU-x, 1, 1, 1, 1, 1, 1, 1, 1, 1, P0\n")
    rows = fresh.stop()
    assert [r["status"] for r in rows] == ["unavailable"]
    assert "not parsed" in rows[0]["detail"]


def test_stop_leaves_a_pid_that_is_not_a_loop_alone(tmp_path):
    out = tmp_path / "x.csv"
    out.write_text("")
    res = LocalTransport().run(
        "n", gpusampling.stop_command(pid=os.getpid(), out=str(out)), timeout=10
    )
    assert res.ok  # this test process is not an nvidia-smi loop: still alive


def test_simulated_curve_follows_the_load(monkeypatch):
    sampler = gpusampling.SimulatedSampler(
        loads={"local": "http://127.0.0.1:1", "router": None},
        gpus={"local": [0, 1], "router": [0, 1]},
        interval_s=0.001,
    )
    loads = iter([0, 4, 0])
    monkeypatch.setattr(sampler, "_held", lambda url: float(next(loads)))
    for _ in range(3):
        sampler.sample()
    power = [r["power_draw_w"] for r in sampler.rows if r["index"] == 0 and r["node"] == "local"]
    idle = [r["power_draw_w"] for r in sampler.rows if r["node"] == "router"]
    assert idle == [gpusampling.SIM_IDLE_W] * 6  # a node without a role: idle GPUs
    assert power[0] == pytest.approx(gpusampling.SIM_IDLE_W)
    assert power[1] > 600 and power[2] == power[0]
    assert {r["status"] for r in sampler.rows} == {"simulated"}
    assert gpufigures.sample_figures(sampler.rows)["gpu_source"] == "simulated"


def test_real_gpu_capture_rises_and_falls_with_the_load():
    """benchmarks/gpu_sampler_check.py's capture on a real GPU: power and SM utilisation are
    higher during the matmul load than in the idle periods before and after it."""
    if not CAPTURE.is_file():
        pytest.skip(f"no real-GPU capture at {CAPTURE} (benchmarks/gpu_sampler_check.py)")
    phases = json.loads(CAPTURE.with_name("phases.json").read_text())
    every = gpusampling.parse_loop_output(CAPTURE.read_text(), node="gpu")
    load_s = (phases["load_start"], phases["load_end"])

    def loaded_power(index: float) -> float:
        return max(
            (r["power_draw_w"] for r in every if r["index"] == index
             and load_s[0] <= gpufile.parse_timestamp(r["timestamp"]) <= load_s[1]),
            default=0.0,
        )  # fmt: skip

    busy = max({r["index"] for r in every}, key=loaded_power)  # the GPU the matmul ran on
    rows = [r for r in every if r["index"] == busy]

    def mean(column: str, start: float, end: float) -> float:
        values = [
            r[column]
            for r in rows
            if start <= gpufile.parse_timestamp(r["timestamp"]) <= end and not math.isnan(r[column])
        ]
        assert values, f"no samples between {start} and {end}"
        return sum(values) / len(values)

    settle = 2.0  # seconds each side of a change left out (ramp up and down)
    idle1 = (phases["idle_start"] + settle, phases["load_start"] - settle)
    load = (phases["load_start"] + settle, phases["load_end"] - settle)
    idle2 = (phases["load_end"] + settle, phases["idle_end"] - settle)
    for column, rise in (("power_draw_w", 1.5), ("utilization_gpu_pct", None)):
        before, during, after = (mean(column, *w) for w in (idle1, load, idle2))
        if rise is None:
            assert during > before + 50 and during > after + 50, (before, during, after)
        else:
            assert during > rise * before and during > rise * after, (before, during, after)


def _ahead(rows: list[dict], seconds: float) -> list[dict]:
    """The rows as a node whose clock is `seconds` ahead of the workflow host stamps them."""
    return [
        r | {"timestamp": gpufile.format_timestamp(
            gpufile.parse_timestamp(r["timestamp"]) + seconds)}
        for r in rows
    ]  # fmt: skip


def test_a_node_clock_ahead_is_aligned_by_its_measured_offset():
    """Issue 26 item 7: the window is on the workflow host's clock, a node's samples on its
    own; a node 2.5 s ahead put the load's start outside the window (energy cut by half)."""
    span = window("2026/12/01 14:13:42.000", "2026/12/01 14:13:48.000")  # load from 44.0
    true = gpufigures.sample_figures(series_rows() + span)
    skewed = _ahead(series_rows(), 2.5)
    clock = [{"node": "n1", "phase": "clock", "status": "ok", "clock_offset_s": 2.5}]
    aligned = gpufigures.sample_figures(skewed + clock + span)
    unaligned = gpufigures.sample_figures(skewed + span)  # what a file without the offset gives
    assert aligned["gpu_energy_j"] == pytest.approx(true["gpu_energy_j"], rel=1e-6)
    assert aligned["gpu_clock_offset_s"] == 2.5 and aligned["gpu_clock_skewed"] is True
    assert unaligned["gpu_energy_j"] < 0.75 * true["gpu_energy_j"]
    assert math.isnan(unaligned["gpu_clock_offset_s"])
    print(f"energy {true['gpu_energy_j']:.0f} J; unaligned {unaligned['gpu_energy_j']:.0f} J")


def test_each_cell_measures_the_node_clocks_and_flags_an_offset_over_the_interval(caplog):
    class Ahead:  # a node 2.5 s ahead, another in step, a third that cannot say
        def run(self, node: str, command: str, timeout: float) -> CommandResult:
            assert command == "date +%s.%N"
            shift = {"fast": 2.5, "same": 0.0}.get(node)
            if shift is None:
                return CommandResult(node, command, 1, "", "date: not found")
            return CommandResult(node, command, 0, f"{time.time() + shift:.9f}\n", "")

    from servesweep.cluster import clocks

    rows = clocks.clock_rows(transport=Ahead(), nodes=["fast", "same", "mute"])
    assert [r["status"] for r in rows] == ["ok", "ok", "unavailable"]
    assert rows[0]["clock_offset_s"] == pytest.approx(2.5, abs=0.05)
    assert rows[1]["clock_offset_s"] == pytest.approx(0.0, abs=0.05)
    with caplog.at_level("WARNING"):
        lines = clocks.warn_offsets(rows, interval_s=0.5, cell="s/c/r1")
    assert len(lines) == 1 and lines[0].startswith("cell s/c/r1: node fast's clock is +2.")
    assert "more than the GPU sampling interval (0.5 s)" in lines[0]
    assert lines[0] in caplog.text
    # the rows round-trip through a GPU file (the offset is a column of its own)
    assert (
        gpufile.parse_snapshot("node,phase,status,detail,clock_offset_s\nfast,clock,ok,,2.5\n")[0][
            "clock_offset_s"
        ]
        == 2.5
    )


def test_a_node_clock_that_cannot_be_read_is_flagged_never_taken_as_zero():
    """A node 2.5 s ahead whose `date` failed: its samples were taken as on the host's clock
    (energy low, `gpu_status ok`). Now its window figures are blank and the status names it."""
    span = window("2026/12/01 14:13:42.000", "2026/12/01 14:13:48.000")
    skewed = _ahead(series_rows(), 2.5)
    unread = [
        {
            "node": "n1",
            "phase": "clock",
            "status": "unavailable",
            "detail": "cannot read the clock of node n1: date: not found",
        }
    ]
    snapshot = [
        {"node": "n1", "phase": phase, "status": "ok", "index": 0, "power_draw_w": 80.0}
        for phase in ("before", "after")
    ]
    assert gpufigures.unmeasured_clocks(skewed + unread + span) == {
        "n1": "cannot read the clock of node n1: date: not found"
    }
    found = gpufigures.gpu_figures(snapshot + skewed + unread + span)
    assert found["gpu_status"] == gpufile.STATUS_CLOCK_UNMEASURED == "clock-unmeasured"
    for column in gpufigures.WINDOW_FIGURES:
        assert pd_isna(found[column]), column
    assert found["gpu_count"] == 1 and found["gpu_source"] == "measured"
    # read, the offset aligns them (the figures come back); the sim's curve needs no clock
    read = [{"node": "n1", "phase": "clock", "status": "ok", "clock_offset_s": 2.5}]
    assert gpufigures.gpu_figures(snapshot + skewed + read + span)["gpu_status"] == "ok"
    simulated = [{**r, "status": "simulated"} for r in series_rows()]
    assert gpufigures.unmeasured_clocks(simulated + unread + span) == {}


def pd_isna(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))
