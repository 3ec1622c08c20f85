"""`servesweep doctor`: the facts a run needs, checked over SSH on every node, one line each."""

from __future__ import annotations

import shlex
import shutil
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from servesweep.cluster import clocks, gpuidle
from servesweep.cluster.images import version_probe
from servesweep.cluster.runtime import Launch, owner_dir
from servesweep.cluster.transport import node_address
from servesweep.config.experiment import AUTO_PORT, Experiment
from servesweep.config.guesses import ENGINE_VERSION, guess_values, guessed
from servesweep.config.matrix import server_specs
from servesweep.core.errors import DOCTOR_HINT, TransportError
from servesweep.serving.engines import listening_ports
from servesweep.serving.preflight import ib_ports, model_on_node, rdma_problems
from servesweep.serving.servers import ServerManager

PROBE_TIMEOUT_S = 60.0
MAX_CLOCK_SKEW_S = 1.0
MIN_FREE_GIB = 5.0  # on each node's owner directory and the workflow host's results folder


@dataclass(frozen=True)
class Check:
    """One check on one node: ok, fail or skip, and what was seen."""

    node: str
    name: str
    status: str  # "ok" | "fail" | "skip"
    detail: str

    def line(self) -> str:
        return f"{self.node:<16} {self.name:<12} {self.status:<5} {self.detail}"


def _run(manager: ServerManager, node: str, command: str) -> tuple[bool, str]:
    try:
        res = manager.transport.run(node, command, timeout=PROBE_TIMEOUT_S)
    except TransportError as exc:
        return False, str(exc).splitlines()[0]
    return res.ok, (res.stdout.strip() or res.stderr.strip())


def check_model(exp: Experiment, manager: ServerManager, node: str) -> Check:
    path = model_on_node(exp)
    if path is None:
        return Check(
            node, "model_path", "skip", f"{exp.engine.model_path!r} is a label, not a path"
        )
    ok, _ = _run(manager, node, f"test -e {shlex.quote(path)}")
    return Check(
        node, "model_path", "ok" if ok else "fail", f"{path} {'exists' if ok else 'missing'}"
    )


def check_image(exp: Experiment, manager: ServerManager, node: str) -> Check:
    if not exp.runtime.containers:
        return Check(node, "image", "skip", "runtime.kind process: no image")
    image = exp.runtime.image or ""
    fmt = shlex.quote("{{.Id}}")
    res = manager.runtime.run_docker(  # type: ignore[attr-defined]
        node, f"image inspect -f {fmt} {shlex.quote(image)}"
    )
    if not res.ok:
        return Check(node, "image", "fail", f"{image} not present")
    log = f"{owner_dir(manager.owner.tag)}/doctor/{node}-version.log"
    launch = Launch(
        name=f"servesweep-{manager.owner.tag}-doctor-{node}",
        node=node,
        argv=["sh", "-c", version_probe(exp)],
        log_path=log,
        labels={"role": "doctor", **manager.owner.labels()},
    )
    result = manager.runtime.run_oneshot(launch, timeout=PROBE_TIMEOUT_S * 5)
    _, out = _run(manager, node, f"cat {shlex.quote(log)}")
    version = out.splitlines()[-1].strip() if out else ""
    if exp.engine.kind == "sim":
        ok = result.ok and bool(version)
        detail = f"{image} {res.stdout.strip()[:19]}; servesweep {version or '?'} (sim)"
    else:
        pinned = not guessed(exp.guesses, ENGINE_VERSION)
        ok = result.ok and (version == exp.engine.version or (bool(version) and not pinned))
        detail = (
            f"{image} {res.stdout.strip()[:19]}; sglang {version or '?'} "
            f"(engine.version {exp.engine.version}{'' if pinned else ', a guess: observed'})"
        )
    return Check(node, "image", "ok" if ok else "fail", detail)


def check_gpus(exp: Experiment, manager: ServerManager, node: str) -> Check:
    if exp.engine.kind == "sim":
        return Check(node, "gpus", "ok", f"{exp.cluster.gpus_per_node} simulated, idle")
    ok, out = _run(manager, node, gpuidle.probe_command())
    if not ok:
        return Check(node, "gpus", "fail", f"nvidia-smi failed: {out[:120]}")
    count, reason = gpuidle.judge_probe(
        node,
        out,
        expected=exp.cluster.gpus_per_node,
        max_used_mib=exp.preflight.gpu_idle_max_memory_mib,
        visible=exp.cluster.visible_gpus(node),
    )
    if reason is not None:
        return Check(node, "gpus", "fail", reason.removeprefix(f"node {node}: "))
    return Check(node, "gpus", "ok", f"{count} idle")


def _ib_devices(exp: Experiment, node: str) -> list[str]:
    """The IB devices the PD roles on `node` are configured with."""
    return sorted(
        {
            d.strip()
            for spec in server_specs(exp)
            for role in spec.roles
            if node in role.nodes and role.args.disaggregation_ib_device
            for d in (role.args.disaggregation_ib_device or "").split(",")
        }
    )


def check_ib(exp: Experiment, manager: ServerManager, node: str) -> Check:
    devices = _ib_devices(exp, node)
    if not devices:
        return Check(node, "ib_devices", "skip", "none configured for this node")
    if exp.engine.kind == "sim":
        return Check(node, "ib_devices", "skip", f"{','.join(devices)} simulated")
    missing = [
        d
        for d in devices
        if not _run(manager, node, f"test -e /sys/class/infiniband/{shlex.quote(d)}")[0]
    ]
    if missing:
        return Check(node, "ib_devices", "fail", f"missing {','.join(missing)}")
    return Check(node, "ib_devices", "ok", ",".join(devices))


def check_ports(exp: Experiment, manager: ServerManager, node: str) -> Check:
    ports = sorted({p for s in server_specs(exp) for n, p in listening_ports(exp, s) if n == node})
    ports = [p for p in ports if p != AUTO_PORT]
    if not ports:
        return Check(node, "ports", "skip", "none fixed on this node")
    address = node_address(exp.cluster, node)
    used = [
        p
        for p in ports
        if _run(manager, node, f"bash -c 'exec 3<>/dev/tcp/{address}/{p}' 2>/dev/null")[0]
    ]
    if used:
        return Check(node, "ports", "fail", f"in use: {','.join(map(str, used))}")
    return Check(node, "ports", "ok", f"free: {','.join(map(str, ports))}")


def check_clock(exp: Experiment, manager: ServerManager, node: str) -> Check:
    before = time.time()
    ok, out = _run(manager, node, clocks.DATE_COMMAND)
    after = time.time()
    try:
        skew = clocks.offset_of(out, before=before, after=after)  # as each cell measures it
    except (ValueError, IndexError):
        return Check(node, "clock", "fail", f"cannot read the clock: {out[:80]}")
    status = "ok" if ok and abs(skew) < MAX_CLOCK_SKEW_S else "fail"
    return Check(node, "clock", status, f"skew {skew:+.3f} s (limit {MAX_CLOCK_SKEW_S:.0f} s)")


def check_disk(exp: Experiment, manager: ServerManager, node: str) -> Check:
    ok, out = _run(manager, node, "mkdir -p /tmp && df -Pk /tmp | tail -1")
    try:
        free_gib = int(out.split()[3]) / 2**20
    except (ValueError, IndexError):
        return Check(node, "disk", "fail", f"df failed: {out[:80]}")
    status = "ok" if ok and free_gib >= MIN_FREE_GIB else "fail"
    return Check(node, "disk", status, f"/tmp {free_gib:.1f} GiB free (need {MIN_FREE_GIB:.0f})")


# `ip -o link` without iproute2 falls back to /sys: "<name> <operstate> <addresses>" per line.
_INTERFACES = (
    'for d in /sys/class/net/*; do n=${d##*/}; [ "$n" = lo ] && continue; '
    "a=$(ip -o -4 addr show dev \"$n\" 2>/dev/null | awk '{print $4}' | paste -sd, -); "
    'echo "$n $(cat $d/operstate) ${a:--}"; done'
)


def check_network(exp: Experiment, manager: ServerManager, node: str) -> Check:
    """The node's interfaces (state, IPv4), and `cluster.socket_ifname` among them and up: a
    wrong interface on a multi-NIC node hangs the ranks' start until ready_timeout_s."""
    ok, out = _run(manager, node, _INTERFACES)
    found = {line.split()[0]: line.split()[1] for line in out.splitlines() if len(line.split()) > 2}
    listing = "; ".join(out.splitlines()) or "no interface but lo"
    wanted = exp.cluster.socket_ifname
    if wanted is None:
        return Check(node, "network", "ok" if ok else "fail", f"{listing} (socket_ifname unset)")
    if found.get(wanted) != "up":
        state = found.get(wanted, "absent")
        return Check(node, "network", "fail", f"socket_ifname {wanted} is {state}; {listing}")
    return Check(node, "network", "ok", f"socket_ifname {wanted} up; {listing}")


def check_rdma(exp: Experiment, manager: ServerManager, node: str) -> Check:
    """For PD nodes with IB devices configured: every port ACTIVE, GPUDirect RDMA and memlock
    (preflight.rdma_problems, which preflight runs too); other nodes: the IB ports seen."""
    devices = _ib_devices(exp, node)
    ports = ib_ports(manager, node)
    seen = ", ".join(f"{k} {v}" for k, v in ports.items()) or "no IB port"
    if not devices:
        return Check(node, "rdma", "skip", f"none configured for this node ({seen})")
    if exp.engine.kind == "sim":
        return Check(node, "rdma", "skip", f"{','.join(devices)} simulated")
    problems, detail = rdma_problems(exp, manager, node, devices)
    if problems:
        return Check(node, "rdma", "fail", "; ".join(problems) + f" ({detail})")
    return Check(node, "rdma", "ok", detail)


CHECKS: tuple[Callable[[Experiment, ServerManager, str], Check], ...] = (
    check_model,
    check_image,
    check_gpus,
    check_ib,
    check_network,
    check_rdma,
    check_ports,
    check_clock,
    check_disk,
)


def local_disk(results: Path) -> Check:
    """Free space for results on the workflow host."""
    results.mkdir(parents=True, exist_ok=True)
    free_gib = shutil.disk_usage(results).free / 2**30
    status = "ok" if free_gib >= MIN_FREE_GIB else "fail"
    return Check("(workflow)", "disk", status, f"{results} {free_gib:.1f} GiB free")


def run_doctor(*, exp: Experiment, manager: ServerManager, results: Path) -> list[Check]:
    """Every check on every node (nodes in parallel), in node then check order."""

    def node_checks(node: str) -> list[Check]:
        reach = _run(manager, node, "true")
        if not reach[0]:
            return [Check(node, "reach", "fail", unreachable_line(exp, node, reach[1]))]
        return [check(exp, manager, node) for check in CHECKS]

    with ThreadPoolExecutor(max_workers=max(1, min(8, len(exp.cluster.nodes)))) as pool:
        per_node = list(pool.map(node_checks, exp.cluster.nodes))
    return [c for checks in per_node for c in checks] + [local_disk(results), *guess_lines(exp)]


def unreachable_line(exp: Experiment, node: str, reason: str) -> str:
    """Why `node` gave no session (the transport's words, without its advice to run doctor)
    and the next step: the same connection through the ssh command, which shows its own
    debug output with -v."""
    reason = reason.removesuffix(f"; {DOCTOR_HINT}")
    config = exp.cluster.ssh.config_file if exp.cluster.transport == "ssh" else None
    argv = ["ssh", *(["-F", str(config)] if config else []), node, "true"]
    return f"{reason}; next: fix it and try `{shlex.join(argv)}`"


def guess_lines(exp: Experiment) -> list[Check]:
    """One line per value of the config still marked as a guess (status `guess`: no failure)."""
    return [
        Check("(config)", "guess", "guess", f"{key} = {value!r}: confirm it on the cluster")
        for key, value in guess_values(exp)
    ]
