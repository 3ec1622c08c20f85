"""Faults where the transport matters: SSH nodes on loopback (sshd) with docker containers."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest

from tests.integration.nodes import ADDRESSES
from tests.reliability.harness import (
    ACROSS,
    SNAKEMAKE_TIMEOUT_S,
    WITHIN,
    Checks,
    FaultShim,
    Run,
    check_killed_during_hang,
    check_rank1_dies,
    check_rerun_after_sigkill,
    check_stopped_cleanly,
    containers,
    docker,
    output,
    rerun_and_check,
    sigkill_mid_cell,
    ssh_sessions,
    wait_for,
)

pytestmark = [pytest.mark.reliability, pytest.mark.integration]

STALE_CLIENT_S = 60  # request timeout of the SIGKILL scenario: its hung client lives that long


def test_rank_above_zero_node_dies_mid_cell(
    checks: Checks,
    make_cluster_run: Callable[..., Run],
    shim: FaultShim,
    reference: pd.DataFrame,
) -> None:
    checks.scenario("a rank > 0 node dies mid-cell (ssh + docker: rank 1's container killed)")
    run = make_cluster_run(WITHIN, nodes=["node1", "node2"])

    def kill_rank1(_: subprocess.Popen[str]) -> None:
        [rank1] = containers(run.run_id, role="server", rank="1")
        docker("kill", rank1)

    check_rank1_dies(
        checks, run, shim, reference, kill_rank1=kill_rank1, node=r"node node[12]\b", died="node2"
    )


def test_ssh_connection_drops_mid_cell(
    checks: Checks,
    make_cluster_run: Callable[..., Run],
    shim: FaultShim,
    nodes_dir: Path,
    reference: pd.DataFrame,
) -> None:
    checks.scenario("the SSH connection drops mid-cell (sshd session serving the run killed)")
    run = make_cluster_run(WITHIN, nodes=["node1"])
    listener = int((nodes_dir / "sshd.pid").read_text().split()[0])

    def drop_ssh(proc: subprocess.Popen[str]) -> None:
        sessions = ssh_sessions(proc.pid, ADDRESSES["node1"], listener=listener)
        assert sessions, "no SSH session of the run found"
        for pid in sessions:
            os.kill(pid, signal.SIGKILL)
        checks.note(f"killed sshd session process(es) {sessions}")

    check_killed_during_hang(
        checks,
        run,
        shim,
        reference,
        kill=drop_ssh,
        cause=r"TransportError: .*(connection lost|closed|cannot)",
        node=r"node node1\b",
    )


def test_image_smoke_fails(
    checks: Checks,
    make_cluster_run: Callable[..., Run],
    reference: pd.DataFrame,
    shim: FaultShim,
) -> None:
    checks.scenario("the image smoke fails (re-validated image, first cell config finished)")
    broken = shim.flag_file("smoke-broken")
    smoke = [f"test ! -e {broken} || {{ echo 'broken kernel'; exit 3; }}"]
    run = make_cluster_run(ACROSS, nodes=["node1"], smoke=smoke)
    marlin = [c for c in run.cells if "marlin" in c]
    narrowed = [str(run.raw(c).relative_to(run.workdir)) for c in marlin]
    first = run.snakemake(
        "--cores", "1", *narrowed, run.targets[-1], env={"BACKENDS_CSV": "marlin"}
    )
    checks.check("the narrowed first run succeeds", first.returncode == 0, output(first)[-3000:])
    images = run.run_dir.parent / ".images"  # shared by run ids, keyed by the image
    builds = sorted(images.glob("*/*.json"))
    checks.check("the image check left evidence", bool(builds), str(builds))
    for path in builds:  # a new image must be re-validated: its evidence is removed
        path.unlink()
    broken.write_text("")
    n_start = len(run.events())
    proc = run.snakemake()
    check_stopped_cleanly(
        checks,
        run,
        proc,
        cause=r"SmokeFailed: .*exit 3",
        node=r"node node1\b",
        finished=1,
        name_cell=False,
    )
    events = [e for _, e, _ in run.events()[n_start:]]
    checks.check("no server started and no cell ran", not events, str(events))
    checks.check("no image evidence for the failed smoke", not list(images.glob("*/*.json")))
    rerun_and_check(checks, run, reference, remove_cause=broken.unlink)


def test_snakemake_is_sigkilled_then_rerun_with_containers(
    checks: Checks,
    make_cluster_run: Callable[..., Run],
    shim: FaultShim,
    reference: pd.DataFrame,
) -> None:
    checks.scenario("snakemake is SIGKILLed mid-cell, then rerun (ssh + docker: stale containers)")
    # A long request timeout keeps the killed run's client container alive through the rerun.
    run = make_cluster_run(WITHIN, nodes=["node1"], request_timeout_s=STALE_CLIENT_S)
    sigkill_mid_cell(checks, run, shim)
    servers = containers(run.run_id, role="server")
    checks.check("the server container outlives snakemake", bool(servers), str(servers))
    stale_clients = set(containers(run.run_id, role="client"))
    checks.check("the killed run's client container outlives it", bool(stale_clients))
    n_events = len(run.events())
    overlap: list[str] = []

    def watch() -> None:
        """When the rerun's client container appears, is an old client still there?"""

        def new_client_or_done() -> bool:
            now = set(containers(run.run_id, role="client"))
            if now - stale_clients:
                overlap.extend(now & stale_clients)
                return True
            return any(
                e.startswith("cell-") and e != "cell-start" for _, e, _ in run.events()[n_events:]
            )

        with contextlib.suppress(AssertionError):
            wait_for(new_client_or_done, limit_s=SNAKEMAKE_TIMEOUT_S)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    check_rerun_after_sigkill(checks, run, reference)
    watcher.join(timeout=60)
    checks.check(
        "no client of the killed run still loads the server when the rerun's cell runs",
        not overlap,
        f"stale client container(s) {[c[:12] for c in overlap]} still running",
    )


def test_nothing_of_a_run_stays_under_tmp(
    checks: Checks, make_cluster_run: Callable[..., Run]
) -> None:
    checks.scenario(
        "a run on an SSH node with docker ends: nothing of it stays under the node's or the "
        "head's /tmp (client and server logs, smoke logs, GPU sample folders)"
    )
    run = make_cluster_run(WITHIN, nodes=["node1"])
    # The loopback nodes share this machine's /tmp: the node's folder and the head's are here.
    before = set(Path("/tmp").glob("*")) | set(Path("/tmp").glob("servesweep-*/*"))
    proc = run.snakemake()
    checks.check("the run succeeds", proc.returncode == 0, output(proc)[-3000:])
    after = set(Path("/tmp").glob("*")) | set(Path("/tmp").glob("servesweep-*/*"))
    found = {p for p in after - before if run.run_id in p.name}
    left = sorted(map(str, found | set(Path("/tmp").glob(f"servesweep-*/{run.run_id}*"))))
    checks.check("no file or folder of the run is left under /tmp", not left, str(left))
    logs = sorted(run.run_dir.glob("bench/**/*.log")) + sorted(run.run_dir.glob("service/*/*.log"))
    checks.check("its client and server logs are in the run folder", len(logs) >= 2, str(logs))
    checks.finish()
