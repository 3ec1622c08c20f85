"""Tests of cluster.telemetry with recorded nvidia-smi output and fake nvidia-smi scripts."""

from __future__ import annotations

import math
import re
import shlex
import shutil
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

from servesweep.analysis import gpufigures
from servesweep.cluster import telemetry
from servesweep.cluster.transport import CommandResult, LocalTransport
from servesweep.core import gpufile

DATA = Path(__file__).resolve().parents[1] / "data"
RECORDED = DATA / "nvidia-smi"
EIGHT = DATA / "nvidia-smi-8gpu"
IDLE_8 = EIGHT / "query-idle-8gpu-noheader-nounits.csv"
LOAD_8 = EIGHT / "query-load-8gpu-noheader-nounits.csv"
CAT = shutil.which("cat")
SLEEP = shutil.which("sleep")


def fake_nvidia_smi(bin_dir: Path, output: Path, *, extra: str = "") -> Path:
    """An `nvidia-smi` that checks it got exactly our query, then prints a recorded file."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "nvidia-smi"
    query, fmt = telemetry.snapshot_command().split()[1:]
    script.write_text(
        "#!/bin/sh\n"
        f'if [ $# -ne 2 ] || [ "$1" != {shlex.quote(query)} ] || [ "$2" != {shlex.quote(fmt)} ]; '
        'then echo "unexpected arguments: $*" >&2; exit 2; fi\n'
        f"{extra}"
        f"exec {CAT} {shlex.quote(str(output))}\n"
    )
    script.chmod(0o755)
    return script


class PerNodePath(LocalTransport):
    """Local transport where each node sees its own PATH (one fake machine per node)."""

    def __init__(self, paths: dict[str, Path]) -> None:
        self.paths = paths

    def run(self, node, command, *, timeout, stdin=None):
        prefix = f"PATH={shlex.quote(str(self.paths[node]))}; export PATH; "
        res = super().run(node, prefix + command, timeout=timeout, stdin=stdin)
        return CommandResult(node, command, res.returncode, res.stdout, res.stderr)


def without(rows: list[dict], *keys: str) -> list[dict]:
    """`rows` with `keys` left out."""
    return [{k: v for k, v in row.items() if k not in keys} for row in rows]


# ---------------------------------------------------------------- command and parsers


def test_query_fields_are_the_recorded_query():
    readme = (RECORDED / "README.md").read_text()
    recorded = re.search(r"--query-gpu=([a-z_.,\s]+)", readme).group(1)  # the first query
    assert list(gpufile.QUERY_FIELDS) == re.sub(r"\s+", "", recorded).split(",")
    cmd = telemetry.snapshot_command()
    assert cmd.startswith("nvidia-smi --query-gpu=timestamp,index,uuid,")
    assert cmd.endswith(",clocks.sm,clocks.mem,pstate --format=csv,noheader,nounits")


def test_parse_with_header_load():
    (row,) = telemetry.parse_with_header((RECORDED / "query-load.csv").read_text())
    assert row["index"] == 0
    assert row["name"] == "NVIDIA H200"
    assert row["driver_version"] == "580.159.04"
    assert row["memory_total_mib"] == 143771
    assert row["memory_used_mib"] == 21491
    assert row["utilization_gpu_pct"] == 100
    assert row["power_draw_w"] == pytest.approx(691.43)
    assert row["clocks_sm_mhz"] == 1515  # header says clocks.current.sm [MHz]
    assert row["clocks_mem_mhz"] == 3201
    assert row["pstate"] == "P0"
    assert isinstance(row["memory_used_mib"], float) and isinstance(row["index"], float)


def test_both_formats_of_the_idle_capture_agree():
    with_header = telemetry.parse_with_header((RECORDED / "query-idle.csv").read_text())
    noheader = telemetry.parse_noheader((RECORDED / "query-idle-noheader-nounits.csv").read_text())
    assert [list(r) for r in with_header] == [list(r) for r in noheader]
    # Two captures 27 ms apart: everything but the timestamp is identical.
    assert without(with_header, "timestamp") == without(noheader, "timestamp")
    assert noheader[0]["power_draw_w"] == pytest.approx(127.69)
    assert noheader[0]["memory_used_mib"] == 0


def test_parse_subset_of_fields_from_a_sampling_loop():
    rows = telemetry.parse_with_header((RECORDED / "query-loop-500ms.csv").read_text())
    assert list(rows[0]) == ["index", "power_draw_w", "utilization_gpu_pct", "memory_used_mib"]
    assert len(rows) == 8
    assert max(r["power_draw_w"] for r in rows) == pytest.approx(692.75)
    assert {r["memory_used_mib"] for r in rows} == {21491}


def test_eight_gpu_samples_match_the_recordings():
    idle = telemetry.parse_noheader(IDLE_8.read_text())
    load = telemetry.parse_noheader(LOAD_8.read_text())
    assert [r["index"] for r in idle] == list(range(8)) == [r["index"] for r in load]
    recorded_load = telemetry.parse_with_header((RECORDED / "query-load.csv").read_text())
    assert without(load, "index") == without(recorded_load, "index") * 8


def test_not_available_values_are_nan_and_garbage_is_an_error():
    line = (RECORDED / "query-idle-noheader-nounits.csv").read_text().strip()
    values = line.split(", ")
    values[12] = "[N/A]"  # power.draw
    values[14] = "[Not Supported]"  # clocks.sm
    (row,) = telemetry.parse_noheader(", ".join(values))
    assert math.isnan(row["power_draw_w"])
    assert math.isnan(row["clocks_sm_mhz"])
    values[7] = "lots"
    with pytest.raises(ValueError, match="memory.used"):
        telemetry.parse_noheader(", ".join(values))
    with pytest.raises(ValueError, match="16 values for 17 fields"):
        telemetry.parse_noheader(", ".join(values[:-1]))


# ---------------------------------------------------------------- snapshots on nodes


def test_snapshot_with_fake_nvidia_smi_on_path(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    fake_nvidia_smi(bin_dir, IDLE_8)
    monkeypatch.setenv("PATH", f"{bin_dir}:{Path(CAT).parent}")
    rows = telemetry.take_snapshot(
        transport=LocalTransport(), nodes=["local"], phase="before", timeout=30
    )
    assert [list(r) for r in rows] == [list(gpufile.SNAPSHOT_COLUMNS)] * 8
    assert {(r["node"], r["phase"], r["status"]) for r in rows} == {("local", "before", "ok")}
    assert [r["index"] for r in rows] == list(range(8))
    assert sum(r["memory_total_mib"] for r in rows) == 8 * 143771


def test_snapshot_frame_types():
    rows = telemetry.node_rows(CommandResult("n", "c", 0, IDLE_8.read_text(), ""), phase="after")
    rows += telemetry.node_rows(CommandResult("m", "c", 127, "", "not found"), phase="after")
    df = telemetry.snapshot_frame(rows)
    assert list(df.columns) == list(gpufile.SNAPSHOT_COLUMNS)
    assert df["power_limit_w"].dtype == "float64"
    assert str(df["index"].dtype) == "Int64"
    assert str(df["name"].dtype) == "string" and pd.isna(df["name"].iloc[8])
    assert df["detail"].iloc[0] == ""


def test_snapshot_without_nvidia_smi_is_unavailable_not_invented(tmp_path, monkeypatch):
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    (row,) = telemetry.take_snapshot(
        transport=LocalTransport(), nodes=["local"], phase="after", timeout=30
    )
    assert list(row) == list(gpufile.SNAPSHOT_COLUMNS)
    assert row["status"] == "unavailable"
    assert row["detail"] == "nvidia-smi not found on node local"
    values = [row[gpufile.COLUMNS[f]] for f in gpufile.QUERY_FIELDS]
    assert all(v is None or math.isnan(v) for v in values)


def test_failing_nvidia_smi_is_unavailable_with_its_message(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "nvidia-smi"
    script.write_text(
        "#!/bin/sh\necho \"NVIDIA-SMI has failed because it couldn't communicate with the "
        'NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running."\n'
        "exit 9\n"
    )
    script.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    (row,) = telemetry.take_snapshot(
        transport=LocalTransport(), nodes=["gpu-a"], phase="before", timeout=30
    )
    assert row["status"] == "unavailable"
    detail = row["detail"]
    assert detail.startswith("nvidia-smi failed on node gpu-a (exit 9): NVIDIA-SMI has failed")


def test_snapshot_runs_nodes_in_parallel(tmp_path):
    # Each fake nvidia-smi waits (bounded) until all three nodes have started it; run one
    # after the other, the first would give up and its node would be `unavailable`.
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    wait = (
        f': > {shlex.quote(str(barrier))}/"$$"\n'
        "i=0\n"
        f"while set -- {shlex.quote(str(barrier))}/*; [ $# -lt 3 ]; do\n"
        '  i=$((i+1)); if [ $i -gt 600 ]; then echo "barrier: only $# of 3" >&2; exit 3; fi\n'
        f"  {SLEEP} 0.05\n"
        "done\n"
    )
    nodes = ["n1", "n2", "n3"]
    paths = {}
    for node in nodes:
        fake_nvidia_smi(tmp_path / node, IDLE_8, extra=wait)
        paths[node] = tmp_path / node
    rows = telemetry.take_snapshot(
        transport=PerNodePath(paths), nodes=nodes, phase="before", timeout=60
    )
    assert {r["status"] for r in rows} == {"ok"}, [r["detail"] for r in rows]
    assert Counter(r["node"] for r in rows) == {"n1": 8, "n2": 8, "n3": 8}
    assert list(dict.fromkeys(r["node"] for r in rows)) == nodes


def test_mixed_nodes_and_round_trip(tmp_path):
    fake_nvidia_smi(tmp_path / "gpu", IDLE_8)
    (tmp_path / "nogpu").mkdir()
    transport = PerNodePath({"a": tmp_path / "gpu", "b": tmp_path / "nogpu"})
    before = telemetry.take_snapshot(transport=transport, nodes=["a", "b"], phase="before")
    fake_nvidia_smi(tmp_path / "gpu", LOAD_8)
    after = telemetry.take_snapshot(transport=transport, nodes=["a", "b"], phase="after")
    both = before + after
    path = tmp_path / "gpu" / "cell" / "r1.csv"
    gpufile.write_snapshot(path, both)
    assert [p.name for p in path.parent.iterdir()] == ["r1.csv"]  # no temp file left
    lines = path.read_text().splitlines()
    assert lines[0] == ",".join(gpufile.SNAPSHOT_COLUMNS)
    # The node without nvidia-smi: status and reason, every value empty.
    b_line = next(line for line in lines if line.startswith("b,before,"))
    assert (
        b_line == "b,before,unavailable,nvidia-smi not found on node b" + "," * 18
    )  # 17 query fields, clock_offset_s
    back = gpufile.read_snapshot(path)
    assert back[:8] == before[:8]  # the GPU rows read back equal (none has a missing value)
    pd.testing.assert_frame_equal(telemetry.snapshot_frame(back), telemetry.snapshot_frame(both))
    # A typed frame's records (numpy floats, pandas' NA) write the same values.
    again = tmp_path / "again.csv"
    gpufile.write_snapshot(again, telemetry.snapshot_frame(both).to_dict("records"))
    pd.testing.assert_frame_equal(
        telemetry.snapshot_frame(gpufile.read_snapshot(again)), telemetry.snapshot_frame(both)
    )

    figures = gpufigures.snapshot_figures(back)
    assert figures["gpu_status"] == "partial"
    assert figures["gpu_count"] == 8


def test_gpu_figures_over_before_and_after():
    meta = {"node": "a", "status": "ok"}
    idle = [{**r, **meta, "phase": "before"} for r in telemetry.parse_noheader(IDLE_8.read_text())]
    load = [{**r, **meta, "phase": "after"} for r in telemetry.parse_noheader(LOAD_8.read_text())]
    figures = gpufigures.snapshot_figures(idle + load)
    assert figures == {
        "gpu_count": 8,
        "gpu_mem_used_peak_mib": 21491.0,
        "gpu_power_peak_w": pytest.approx(691.43),
        "gpu_util_mean_pct": 100.0,
        "gpu_status": "ok",
    }
    # The utilisation figure is of the after phase only.
    idle_only = gpufigures.snapshot_figures(idle)
    assert idle_only["gpu_mem_used_peak_mib"] == 0
    assert math.isnan(idle_only["gpu_util_mean_pct"])
    assert list(figures) == list(gpufigures.GPU_FIGURES)


def test_gpu_figures_unavailable_are_nan():
    rows = telemetry.node_rows(
        CommandResult("local", "nvidia-smi", 127, "", "sh: 1: nvidia-smi: not found"),
        phase="before",
    )
    figures = gpufigures.snapshot_figures(rows)
    assert figures["gpu_status"] == "unavailable"
    assert all(math.isnan(figures[k]) for k in gpufigures.GPU_FIGURES if k != "gpu_status")
    assert gpufigures.snapshot_figures([])["gpu_status"] == "unavailable"


def test_node_rows_empty_or_unparsable_output():
    empty = telemetry.node_rows(CommandResult("x", "c", 0, "\n", ""), phase="after")
    assert empty[0]["detail"] == "nvidia-smi listed no GPUs on node x"
    junk = telemetry.node_rows(
        CommandResult("x", "c", 0, "No devices were found\n", ""), phase="after"
    )
    assert junk[0]["status"] == "unavailable"
    assert junk[0]["detail"].startswith("nvidia-smi output on node x not parsed: row 1: 1 values")


def test_unknown_phase_is_refused():
    with pytest.raises(ValueError, match="phase"):
        telemetry.take_snapshot(transport=LocalTransport(), nodes=["a"], phase="during")


# ---------------------------------------------------------------- snapshot files

HEADER = ",".join(gpufile.SNAPSHOT_COLUMNS)
EMPTY_VALUES = "," * (len(gpufile.COLUMNS) - 1)
N = len(gpufile.SNAPSHOT_COLUMNS)  # 22: META_COLUMNS, the query fields, clock_offset_s


def snapshot_text(*rows: str, header: str = HEADER) -> str:
    return "\n".join([header, *rows]) + "\n"


def test_parse_snapshot_types_ok_unavailable_and_na_values():
    load = LOAD_8.read_text().splitlines()[0]  # one GPU of the recorded 8-GPU output
    gpu = ",".join(v.strip() for v in load.split(","))
    na_power = gpu.split(",")
    na_power[gpufile.QUERY_FIELDS.index("power.draw")] = "[N/A]"
    rows = gpufile.parse_snapshot(
        snapshot_text(
            f"a,after,ok,,{gpu},",  # no clock_offset_s: a snapshot row
            f"a,after,ok,,{','.join(na_power)},",
            f"b,after,unavailable,nvidia-smi not found on node b,{EMPTY_VALUES}",
        )
    )
    assert [list(r) for r in rows] == [list(gpufile.SNAPSHOT_COLUMNS)] * 3
    ok, na, gone = rows
    assert ok["detail"] == "" and ok["status"] == "ok"
    assert ok["index"] == 0.0 and isinstance(ok["memory_used_mib"], float)
    assert isinstance(ok["uuid"], str) and ok["uuid"].startswith("GPU-")
    assert math.isnan(na["power_draw_w"])  # `[N/A]` as nvidia-smi prints it: NaN
    assert na["memory_used_mib"] == ok["memory_used_mib"]
    assert gone["detail"] == "nvidia-smi not found on node b"
    assert gone["uuid"] is None and gone["pstate"] is None
    assert all(math.isnan(gone[c]) for c in ("index", "memory_used_mib", "power_draw_w"))
    figures = gpufigures.snapshot_figures(rows)
    assert figures["gpu_status"] == "partial" and figures["gpu_count"] == 1
    assert figures["gpu_power_peak_w"] == ok["power_draw_w"]  # the NaN one left out


def test_parse_snapshot_unknown_absent_columns_and_blank_lines():
    text = snapshot_text(
        "",
        "n,before,ok,,3,5000,x",
        "",
        header="node,phase,status,detail,index,memory_used_mib,extra",
    )
    (row,) = gpufile.parse_snapshot(text)
    assert "extra" not in row and list(row) == list(gpufile.SNAPSHOT_COLUMNS)
    assert (row["index"], row["memory_used_mib"]) == (3.0, 5000.0)
    assert row["uuid"] is None and math.isnan(row["power_draw_w"])
    assert gpufile.parse_snapshot(HEADER + "\n") == []


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty GPU snapshot"),
        (snapshot_text(f"a,after,ok,,{EMPTY_VALUES}", "a,after,ok,"), f"row 2: 4 values for {N}"),
        (snapshot_text(f"a,after,ok,,{EMPTY_VALUES},"), f"row 1: {N + 1} values for {N}"),
        (
            snapshot_text("a,after,ok,,t,0,u,n,p,d,80,lots,0,0,0,0,0,0,0,0,P0,"),
            "row 1: field memory.used: not a number: 'lots'",
        ),
    ],
)
def test_parse_snapshot_malformed_rows_are_errors(text, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        gpufile.parse_snapshot(text)


def test_read_snapshot_names_the_file(tmp_path):
    path = tmp_path / "r1.csv"
    path.write_text(snapshot_text("a,after,ok"))
    with pytest.raises(ValueError, match=re.escape(f"GPU snapshot {path}: row 1: 3 values")):
        gpufile.read_snapshot(path)


def test_gpu_figures_of_frame_records_with_missing_values():
    rows = telemetry.node_rows(CommandResult("n", "c", 0, IDLE_8.read_text(), ""), phase="after")
    rows += telemetry.node_rows(CommandResult("m", "c", 127, "", "not found"), phase="after")
    records = telemetry.snapshot_frame(rows).to_dict("records")  # pd.NA where missing
    assert gpufigures.snapshot_figures(records) == gpufigures.snapshot_figures(rows)
    assert gpufigures.snapshot_figures(records)["gpu_count"] == 8


def test_the_sims_figures_say_simulated_not_unavailable():
    # a default sim run's GPU file: snapshots without nvidia-smi, the sim's curve in the window
    snapshot = [
        {"node": "local", "phase": p, "status": "unavailable",
         "detail": "nvidia-smi not found on node local"}
        for p in ("before", "after")
    ]  # fmt: skip
    window = [
        {"phase": "window-start", "timestamp": "2026/12/02 06:31:25.000"},
        {"phase": "window-end", "timestamp": "2026/12/02 06:31:27.000"},
    ]
    samples = [
        {"node": "local", "phase": "sample", "status": "simulated",
         "detail": "simulated: follows the sim's /get_load, not measured",
         "timestamp": f"2026/12/02 06:31:2{s}.000", "index": float(i),
         "utilization_gpu_pct": 100.0, "power_draw_w": 600.0, "power_limit_w": 700.0}
        for s in range(4, 9) for i in range(8)
    ]  # fmt: skip
    figures = gpufigures.gpu_figures(snapshot + window + samples)
    assert figures["gpu_source"] == "simulated"
    assert figures["gpu_status"] == "simulated"
    assert figures["gpu_power_mean_w"] == pytest.approx(4800.0)
    # a real node without nvidia-smi and no samples stays unavailable
    assert gpufigures.gpu_figures(snapshot + window)["gpu_status"] == "unavailable"
