"""Where every file of a run lives: the one definition of the results layout (DESIGN.md 3)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from servesweep.config.experiment import Experiment
from servesweep.config.matrix import CellRepeat, image_key
from servesweep.core.names import safe_segment

CellFile = Literal["raw", "gpu", "metrics", "bench", "job"]
# The files of a cell-repeat, relative to the run folder, as Snakemake patterns: the rules take
# them from here (RunPaths.cell_pattern), the package fills them in (cell_file). `job` is the
# run_cell job's own log (logsetup.job_logging); `bench` the client's.
CELL_FILES: dict[CellFile, str] = {
    "raw": "raw/{server}/{client}/r{repeat}.jsonl",
    "gpu": "gpu/{server}/{client}/r{repeat}.csv",
    "metrics": "metrics/{server}/{client}/r{repeat}.jsonl.gz",  # measure/servermetrics.py
    "bench": "bench/{server}/{client}/r{repeat}.log",
    "job": "logs/run_cell/{server}/{client}/r{repeat}.log",
}
# Files the server lifecycle leaves in service/<server>/ besides the server logs.
CLIENT_LOGS = frozenset({"warmup.log"})


def cell_file(
    run_dir: str | Path, kind: CellFile, *, server_id: str, client_id: str, repeat: int
) -> Path:
    """One file of a cell-repeat of the run folder `run_dir` (ids that are no single path
    segment raise UnsafeName: a record's `backend` never writes outside the run)."""
    rel = CELL_FILES[kind].format(
        server=safe_segment(server_id, what="server id"),
        client=safe_segment(client_id, what="client id"),
        repeat=int(repeat),
    )
    return Path(run_dir, rel)


def aggregate_cells(
    *, selected: Sequence[CellRepeat], configured: Sequence[CellRepeat], paths: RunPaths
) -> list[CellRepeat]:
    """What results.csv and the summary cover: the selected (maybe narrowed) cells, and every
    other cell of the configured matrix that finished in this run (its raw and GPU files
    exist), in matrix order. Narrowing selects what runs; it never shrinks the aggregates."""
    keys = {c.key for c in selected}
    done = [
        c
        for c in configured
        if c.key not in keys and paths.raw(c).exists() and paths.gpu(c).exists()
    ]
    order = {c.key: i for i, c in enumerate(configured)}
    cells = [*selected, *done]
    return sorted(cells, key=lambda c: order.get(c.key, len(order)))


@dataclass(frozen=True)
class RunPaths:
    """Where every file of one run lives (DESIGN.md section 3)."""

    root: Path

    @classmethod
    def for_run(cls, exp: Experiment, results_dir: str | Path = "results") -> RunPaths:
        return cls(Path(results_dir) / exp.run_id)

    def cell_pattern(self, kind: CellFile) -> str:
        """A cell file as a Snakemake pattern with wildcards server, client, repeat."""
        return f"{self.root}/{CELL_FILES[kind]}"

    def _cell(self, kind: CellFile, cell: CellRepeat) -> Path:
        return cell_file(
            self.root, kind, server_id=cell.server.id, client_id=cell.client.id, repeat=cell.repeat
        )

    def raw(self, cell: CellRepeat) -> Path:
        return self._cell("raw", cell)

    def raw_files(self) -> set[str]:
        """Every raw record in the run folder (raw/<server>/<client>/<file>, raw/.superseded/
        left out), as str(self.raw(cell)) gives them: one listing instead of a stat per cell."""
        found: set[str] = set()
        for server in _entries(self.root / "raw"):
            if server.name.startswith(".") or not server.is_dir():
                continue
            for client in _entries(Path(server.path)):
                if client.is_dir():
                    found.update(e.path for e in _entries(Path(client.path)) if e.is_file())
        return found

    def bench_log(self, cell: CellRepeat) -> Path:
        return self._cell("bench", cell)

    def job_log(self, cell: CellRepeat) -> Path:
        """The run_cell job's own log (logs/run_cell/...)."""
        return self._cell("job", cell)

    def gpu(self, cell: CellRepeat) -> Path:
        return self._cell("gpu", cell)

    def metrics(self, cell: CellRepeat) -> Path:
        """The cell's /metrics series of every server rank (measure/servermetrics.py)."""
        return self._cell("metrics", cell)

    def existing_metrics(self, cells: Iterable[CellRepeat]) -> list[Path]:
        """The series of `cells` that exist (a record measured before series were recorded,
        or with `telemetry.metrics_interval_s: 0`, has none)."""
        return [p for p in map(self.metrics, cells) if p.exists()]

    @property
    def superseded(self) -> Path:
        """Records a rerun replaced, kept: raw/.superseded/<UTC time>/<cell files as in the
        run> (no cell id starts with '.', so no pattern matches them)."""
        return self.root / "raw" / ".superseded"

    def service(self, server_id: str) -> Path:
        return self.root / "service" / safe_segment(server_id, what="server id")

    def service_files(self) -> dict[str, list[Path]]:
        """What the servers of this run left in service/<server>/: server logs, /server_info
        snapshots, warm-up records (what exists: a reused server logs where it was started)."""
        folders = sorted(p for p in (self.root / "service").glob("*") if p.is_dir())
        return {
            "logs": [
                p for f in folders for p in sorted(f.glob("*.log")) if p.name not in CLIENT_LOGS
            ],
            "server_info": [
                f / "server_info.json" for f in folders if (f / "server_info.json").exists()
            ],
            "warmup": [f / "warmup.jsonl" for f in folders if (f / "warmup.jsonl").exists()],
        }

    @property
    def preflight(self) -> Path:
        return self.root / "preflight.json"

    def images(self, exp: Experiment) -> Path:
        """Image evidence shared by every run of this results root, keyed by the image's
        content (images.image_key): results/.images/<key>/."""
        return self.root.parent / ".images" / image_key(exp)

    def builds(self, exp: Experiment) -> list[Path]:
        """Image-check evidence per node (docker, pyxis and apptainer): <images>/<node>.json."""
        if not exp.runtime.imaged:
            return []
        return [self.images(exp) / f"{n}.json" for n in exp.cluster.nodes]

    def build_logs(self, exp: Experiment) -> list[Path]:
        """The build and check log of each node, beside its evidence."""
        return [p.with_suffix(".log") for p in self.builds(exp)]

    def prerequisites(self, exp: Experiment) -> list[Path]:
        """Evidence every cell needs before its server starts: image checks, then preflight."""
        return [*self.builds(exp), self.preflight]

    @property
    def services(self) -> Path:
        """Services brought up by `servesweep up`, shared by every run of this results root
        (a run id never starts with '.')."""
        return self.root.parent / ".services"

    def service_record(self, fingerprint: str) -> Path:
        """The state of the service with this fingerprint (ServerState JSON)."""
        return self.services / f"{fingerprint}.json"

    def service_runs(self, fingerprint: str) -> Path:
        """Which runs used that service: one `<UTC time> <run id>` line per run."""
        return self.services / f"{fingerprint}.runs"

    @property
    def current_server(self) -> Path:
        return self.current_server_of(0)

    def current_server_of(self, pool: int) -> Path:
        """The state of the server set pool `pool` runs (servesweep.cluster.pools; pool 0's
        keeps the one-pool name)."""
        name = "current.json" if pool == 0 else f"current~pool_{pool}.json"
        return self.root / "service" / name

    @property
    def pools(self) -> Path:
        """Which pool each server config runs in (servesweep.cluster.pools.PoolPlan)."""
        return self.root / "pools.json"

    def pool_stopped(self, pool: int) -> Path:
        """Written when a cell of pool `pool` failed: its other cells of this invocation do not
        start (removed when the next invocation starts)."""
        return self.root / "service" / f"pool_{pool}.stopped"

    def node_locks(self, nodes: Sequence[str]) -> list[Path]:
        """The locks a cell job holds while it measures on these nodes, one per node, shared
        by every run of this results root (two RUN_IDs of one checkout never measure on one
        node at once), in the order they are taken."""
        names = sorted(safe_segment(n, what="node") for n in nodes)
        return [self.root.parent / ".locks" / f"node~{name}.lock" for name in names]

    @property
    def run_lock(self) -> Path:
        """The lock a snakemake of this run holds for its whole life (locks.hold_run_lock): a
        second live one (after `snakemake --unlock`, or with `--nolock`) stops at its start."""
        return self.root / ".locks" / "run.lock"

    def cell_lock(self, cell: CellRepeat) -> Path:
        """The lock of one cell-repeat: a second live job of it (after `snakemake --unlock` on
        a live run) is refused instead of measuring it twice."""
        raw = self.raw(cell).relative_to(self.root / "raw")
        return (self.root / ".locks" / raw).with_suffix(".lock")

    @property
    def orchestrator_log(self) -> Path:
        return self.root / "orchestrator.log"

    @property
    def console_log(self) -> Path:
        """What each invocation printed to the console, appended after a header line
        (servesweep.workflow.console)."""
        return self.root / "console.log"

    @property
    def manifest(self) -> Path:
        return self.root / "manifest.json"

    @property
    def results_csv(self) -> Path:
        return self.root / "results.csv"

    @property
    def requests_csv(self) -> Path:
        return self.root / "requests.csv"

    @property
    def summary_json(self) -> Path:
        return self.root / "summary.json"

    @property
    def landing_rst(self) -> Path:
        """The report's landing page (servesweep.analysis.landing), the Snakefile's `report:` once
        written."""
        return self.root / "report.rst"

    @property
    def report_html(self) -> Path:
        """The run's standalone HTML report (rule write_report)."""
        return self.root / "report.html"

    @property
    def progress(self) -> Path:
        """The cell-repeats a run has to write and its start time (servesweep.workflow.progress)."""
        return self.logs / "progress.json"

    @property
    def logscan_json(self) -> Path:
        return self.root / "logscan.json"

    @property
    def probe_pattern(self) -> str:
        """A server config's equivalence probe answers, a Snakemake pattern (wildcard server)."""
        return f"{self.root}/equivalence/{{server}}.json"

    def probe(self, server_id: str) -> Path:
        """The equivalence probe's answers of one server config (measure.probe)."""
        return self.root / "equivalence" / f"{safe_segment(server_id, what='server id')}.json"

    @property
    def equivalence_json(self) -> Path:
        """Each candidate's outputs against its baseline's (analysis.equivalence)."""
        return self.root / "equivalence.json"

    @property
    def plots(self) -> Path:
        return self.root / "plots"

    @property
    def logs(self) -> Path:
        """Logs of the jobs that are not about one cell (rules' `log:`)."""
        return self.root / "logs"

    def gpu_gap(self, node: str, detail: str) -> Path:
        """Holds the first warning that a node's GPU figures are unavailable for `detail`:
        its existence keeps later cells of the run from repeating it."""
        digest = hashlib.sha256(detail.encode()).hexdigest()[:12]
        node = safe_segment(node, what="node")
        return self.logs / "gpu_unavailable" / f"{node}~{digest}.log"


def _entries(folder: Path) -> list[os.DirEntry[str]]:
    """The entries of `folder` ([] where there is none)."""
    try:
        with os.scandir(folder) as it:
            return list(it)
    except (FileNotFoundError, NotADirectoryError):
        return []
