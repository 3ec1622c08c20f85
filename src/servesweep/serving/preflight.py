"""Preflight before any server start: P/D agreement, IB devices, image, free ports."""

from __future__ import annotations

import datetime as dt
import logging
import shlex
from dataclasses import dataclass
from typing import Any

from servesweep.cluster import gpuidle
from servesweep.cluster.owner import KIND_LABEL, SERVER_KIND
from servesweep.cluster.pools import narrow, node_pools
from servesweep.cluster.runtime import label_env
from servesweep.cluster.transport import node_address
from servesweep.config.experiment import AUTO_PORT, Experiment
from servesweep.config.guesses import ENGINE_VERSION, guessed
from servesweep.config.matrix import ServerSpec, server_specs
from servesweep.config.paths import RunPaths
from servesweep.config.schema import PD_ROLES
from servesweep.core.errors import PreflightFailed
from servesweep.serving import launchcheck
from servesweep.serving.engines import listening_ports
from servesweep.serving.neighbours import check_foreign
from servesweep.serving.servers import ServerManager
from servesweep.serving.state import ServerState

PROBE_TIMEOUT_S = 30.0
logger = logging.getLogger(__name__)


def pd_agreement(spec: ServerSpec) -> dict[str, Any]:
    """Page size and KV-cache dtype of P and D (config validation already refused a mismatch)."""
    if spec.router is None:
        return {}
    roles = {r.name: r.args for r in spec.roles}
    out: dict[str, Any] = {}
    for key in ("page_size", "kv_cache_dtype"):
        p, d = getattr(roles["prefill"], key), getattr(roles["decode"], key)
        if p != d:
            raise PreflightFailed(f"server {spec.id}: {key} differs: prefill {p!r}, decode {d!r}")
        out[key] = p
    return out


def _ib_devices(spec: ServerSpec) -> list[tuple[str, str]]:
    pairs = []
    for role in spec.roles:
        if role.name in PD_ROLES and role.args.disaggregation_ib_device:
            for dev in role.args.disaggregation_ib_device.split(","):
                pairs += [(node, dev.strip()) for node in role.nodes]
    return list(dict.fromkeys(pairs))


def reused_servers(exp: Experiment, manager: ServerManager) -> list[ServerState]:
    """Server sets of ours that this run measures on without a new start: the `servesweep up`
    service of a server config, and a server set this run left up (either is reused or, on
    another config, stopped before the next start)."""
    states = [manager.service(spec.fingerprint) for spec in server_specs(exp)]
    states += [up_in(manager.paths, p.index) for p in node_pools(exp)]
    return list({s.fingerprint + s.run_id: s for s in states if s is not None}.values())


def our_gpu_pids(node: str, states: list[ServerState], manager: ServerManager) -> dict[int, str]:
    """pid -> "server <id> (service <fp>|run <run>)" for the processes of `states` on `node`."""
    ours: dict[int, str] = {}
    for state in states:
        what = f"service {state.fingerprint}" if state.service else f"run {state.run_id}"
        for rank in state.ranks:
            if rank.node == node:
                for pid in manager.runtime.host_pids(node, rank.handle):
                    ours[pid] = f"server {state.server_id} ({what})"
    return ours


def sim_host_gpus(exp: Experiment) -> int:
    """How many GPUs a simulated host shows: gpus_per_node, or up to the highest gpu_ids."""
    ids = [i for node_ids in exp.cluster.gpu_ids.values() for i in node_ids]
    return max([exp.cluster.gpus_per_node, *(i + 1 for i in ids)])


def smi_command(exp: Experiment, manager: ServerManager, node: str) -> str | None:
    """What answers nvidia-smi's queries on `node`: nvidia-smi; on the sim's nodes on this
    machine, the sim's own (servesweep.sim.smi: GPUs held while a sim server of this checkout
    runs on the node, or a process marks them); None for sim nodes elsewhere (idle)."""
    if exp.engine.kind != "sim":
        return "nvidia-smi"
    if not exp.cluster.local:
        return None
    holder = label_env({KIND_LABEL: SERVER_KIND, "node": node, **manager.owner.labels()})
    argv = [exp.engine.python, "-m", "servesweep.sim.smi", "--sim-node", node]
    argv += ["--sim-gpus", str(sim_host_gpus(exp)), "--sim-scope", manager.owner.checkout]
    for key, value in holder.items():
        argv += ["--sim-holder", f"{key}={value}"]
    return shlex.join(argv)


def gpus_idle(*, exp: Experiment, manager: ServerManager) -> list[dict[str, Any]]:
    """Every node's GPUs idle (no compute process, memory below the threshold) or held only by
    a server of ours that this run reuses (`servesweep up`'s service, seed 003's flow), and as
    many as the config says; PreflightFailed names node, GPU, pid and memory. The sim's local
    nodes answer the same queries (smi_command); its remote ones are idle. A GPU that prefill
    and decode share (cluster.gpu_ids) shows the processes of both nodes: ours on either."""
    reused = reused_servers(exp, manager)
    out = []
    for node in exp.cluster.nodes:
        smi = smi_command(exp, manager, node)
        if smi is None:
            out.append({"node": node, "simulated": True, "idle": True})
            continue
        res = manager.transport.run(node, gpuidle.probe_command(smi), timeout=PROBE_TIMEOUT_S)
        if not res.ok:
            raise PreflightFailed(f"node {node}: nvidia-smi failed: {res.stderr.strip()[:200]}")
        ours: dict[int, str] = {}
        for sharer in exp.cluster.gpu_sharers(node) if reused else []:
            ours |= our_gpu_pids(sharer, reused, manager)
        count, reason = gpuidle.judge_probe(
            node,
            res.stdout,
            expected=exp.cluster.gpus_per_node,
            max_used_mib=exp.preflight.gpu_idle_max_memory_mib,
            ours=ours,
            visible=exp.cluster.visible_gpus(node),
        )
        if reason is not None:
            raise PreflightFailed(reason)
        held = {
            gpu.index: holder
            for gpu in gpuidle.parse(*gpuidle.split_probe(res.stdout))
            if (holder := gpuidle.held_by_ours(gpu, ours))
        }
        entry: dict[str, Any] = {"node": node, "gpus": count, "idle": not held}
        if held:
            entry["held_by_ours"] = held
        out.append(entry)
    return out


def up_in(paths: RunPaths, pool: int) -> ServerState | None:
    """The server set of this run that pool `pool` has up, or None."""
    return ServerState.load(paths.current_server_of(pool))


# The engine's installed version, read from the package's metadata (no import: 0.1 s, not the
# 10-30 s an `import sglang` takes on a GPU node).
VERSION_PROBE = "import importlib.metadata as m; print(m.version('sglang'))"


def engine_versions(*, exp: Experiment, manager: ServerManager) -> dict[str, str]:
    """The SGLang version installed on every node, for plain processes (an image's, docker's
    or a Slurm site's, is read by build_images); PreflightFailed when it is not the pinned
    `engine.version` (a guessed one is observed: a warning, the found version recorded)."""
    if exp.engine.kind != "sglang" or exp.runtime.imaged:
        return {}
    found = {}
    for node in exp.cluster.nodes:
        cmd = f"{shlex.quote(exp.engine.python)} -c {shlex.quote(VERSION_PROBE)}"
        res = manager.transport.run(node, cmd, timeout=PROBE_TIMEOUT_S)
        version = res.stdout.strip().splitlines()[-1] if res.ok and res.stdout.strip() else ""
        if not version:
            raise PreflightFailed(
                f"node {node}: no sglang package for {exp.engine.python} "
                f"({(res.stderr.strip().splitlines() or ['no output'])[-1][:160]})"
            )
        if version != exp.engine.version:
            if not guessed(exp.guesses, ENGINE_VERSION):
                raise PreflightFailed(
                    f"node {node}: sglang {version} is installed, engine.version pins "
                    f"{exp.engine.version}"
                )
            logger.warning(
                "node %s: engine.version %s is a guess; sglang %s is installed",
                node,
                exp.engine.version,
                version,
            )
        found[node] = version
    return found


def model_on_node(exp: Experiment) -> str | None:
    """Where the engine's model directory lies on a node: `engine.model_path`, through the
    runtime's bind mount that holds it (a docker image sees `dst`, the node has `src`); None
    for a relative label (the sim's) or a hub id."""
    path = exp.engine.model_path
    if not path.startswith("/"):
        return None
    if exp.runtime.imaged:
        for mount in exp.runtime.mounts:
            src, _, rest = mount.partition(":")
            dst = rest.split(":")[0]
            if path == dst or path.startswith(dst.rstrip("/") + "/"):
                return src + path[len(dst.rstrip("/")) :]
    return path


def model_present(*, exp: Experiment, manager: ServerManager) -> dict[str, str]:
    """The model directory is readable and holds a config.json on every node (a start would
    otherwise spend its imports first); PreflightFailed names node and path."""
    path = model_on_node(exp)
    if path is None or exp.engine.kind == "sim":  # the sim reads no model
        return {}
    quoted = shlex.quote(path)
    out = {}
    for node in exp.cluster.nodes:
        res = manager.transport.run(
            node, f"test -r {quoted}/config.json && test -x {quoted}", timeout=PROBE_TIMEOUT_S
        )
        if not res.ok:
            raise PreflightFailed(
                f"node {node}: model {path} is missing or unreadable (no readable "
                f"config.json in it; engine.model_path {exp.engine.model_path})"
            )
        out[node] = path
    return out


# One line per IB port (`port <dev>/<port> <state> <link layer> <RoCE v2 GID indices>`), then
# what decides GPUDirect RDMA: `peermem` (nvidia_peermem, or the older nv_peer_mem, loaded),
# `nvidia_open` (the NVIDIA open kernel module, the one that exports GPU memory as dma-buf),
# `nic_dmabuf <symbol>` per NIC driver that registers dma-buf memory regions
# (mlx5_ib_reg_user_mr_dmabuf, ...). A bare `dma_buf` in /proc/kallsyms decides nothing: every
# kernel with DRM has it. `$1` is the root the paths are read under ("" on a node).
RDMA_PROBE = r"""r=$1
for p in "$r"/sys/class/infiniband/*/ports/*; do
  [ -e "$p/state" ] || continue
  d=${p%/ports/*}; g=
  for t in "$p"/gid_attrs/types/*; do
    case "$(cat "$t" 2>/dev/null)" in *[Vv]2*) ;; *) continue ;; esac
    case "$(cat "$p/gids/${t##*/}" 2>/dev/null)" in
      ""|0000:0000:0000:0000:0000:0000:0000:0000) ;;
      *) g="$g,${t##*/}" ;;
    esac
  done
  l=$(tr -d ' ' < "$p/link_layer" 2>/dev/null)
  echo "port ${d##*/}/${p##*/} $(tr -d ' ' < "$p/state") ${l:-unknown} ${g#,}"
done
{ [ -d "$r/sys/module/nvidia_peermem" ] || [ -d "$r/sys/module/nv_peer_mem" ]; } && echo peermem
grep -qs 'Open Kernel Module' "$r/proc/driver/nvidia/version" && echo nvidia_open
grep -os '[A-Za-z0-9_]*_reg_user_mr_dmabuf' "$r/proc/kallsyms" | sort -u | sed 's/^/nic_dmabuf /'
exit 0"""


@dataclass(frozen=True)
class IbPort:
    state: str  # `4:ACTIVE`
    link_layer: str  # InfiniBand, or Ethernet (RoCE)
    roce_v2_gids: tuple[str, ...]  # GID indices of type RoCE v2 with an address

    def describe(self) -> str:
        if self.link_layer == "InfiniBand":
            return f"{self.state} IB"
        if self.link_layer == "Ethernet":
            gids = ",".join(self.roce_v2_gids) or "none"
            return f"{self.state} RoCE (RoCE v2 GID {gids})"
        return f"{self.state} link layer {self.link_layer}"


@dataclass(frozen=True)
class RdmaState:
    ports: dict[str, IbPort]  # `<device>/<port>`
    peermem: bool
    nvidia_open: bool
    nic_dmabuf: tuple[str, ...]

    @property
    def gpudirect(self) -> str | None:
        """How GPU memory reaches the NIC: the peermem module, or dma-buf (the NVIDIA open
        kernel module exports it, the NIC driver registers it); None: neither."""
        if self.peermem:
            return "nvidia_peermem loaded"
        if self.nvidia_open and self.nic_dmabuf:
            return f"dma-buf (NVIDIA open kernel module, {', '.join(self.nic_dmabuf)})"
        return None


def rdma_state(manager: ServerManager, node: str, *, root: str = "") -> RdmaState:
    """What `node` shows of its IB ports and GPUDirect RDMA (paths read under `root`)."""
    command = f"sh -c {shlex.quote(RDMA_PROBE)} rdma {shlex.quote(root)}"
    res = manager.transport.run(node, command, timeout=PROBE_TIMEOUT_S)
    ports, flags, dmabuf = {}, set(), []
    for line in res.stdout.splitlines():
        word, _, rest = line.partition(" ")
        if word == "port":
            name, state, link, *gids = rest.split(" ")
            ports[name] = IbPort(state, link, tuple(filter(None, ",".join(gids).split(","))))
        elif word == "nic_dmabuf":
            dmabuf.append(rest.strip())
        else:
            flags.add(word)
    return RdmaState(ports, "peermem" in flags, "nvidia_open" in flags, tuple(dmabuf))


def ib_ports(manager: ServerManager, node: str) -> dict[str, str]:
    """`<device>/<port>` -> its state and link layer (`4:ACTIVE IB`, `4:ACTIVE RoCE (...)`)."""
    return {k: p.describe() for k, p in rdma_state(manager, node).ports.items()}


def rdma_problems(
    exp: Experiment, manager: ServerManager, node: str, devices: list[str], *, root: str = ""
) -> tuple[list[str], str]:
    """What a PD node lacks for a KV transfer over `devices`: a port not ACTIVE, a RoCE port
    without a RoCE v2 GID, no GPUDirect RDMA (neither nvidia_peermem loaded nor the dma-buf
    path: the NVIDIA open kernel module and a NIC driver that registers dma-buf memory),
    memlock not unlimited (in the container: runtime.ulimits memlock=-1). A PD pair that is
    "ready" without them fails on its first transfer. Returns (problems, what was seen: per
    port IB or RoCE)."""
    rdma = rdma_state(manager, node, root=root)
    problems = []
    for dev in devices:
        mine = {k: p for k, p in rdma.ports.items() if k.split("/")[0] == dev}
        if not mine or any("ACTIVE" not in p.state for p in mine.values()):
            problems.append(f"{dev} ports {({k: p.state for k, p in mine.items()}) or 'none'}")
        problems += [
            f"{k} is RoCE with no RoCE v2 GID (no IP address on its interface?)"
            for k, p in mine.items()
            if p.link_layer == "Ethernet" and not p.roce_v2_gids
        ]
    if rdma.gpudirect is None:
        problems.append(
            "no GPUDirect RDMA: nvidia_peermem not loaded, and no dma-buf path (NVIDIA open "
            f"kernel module {'yes' if rdma.nvidia_open else 'no'}, NIC driver dma-buf "
            f"registration {', '.join(rdma.nic_dmabuf) or 'none'})"
        )
    memlock = manager.transport.run(node, "ulimit -l", timeout=PROBE_TIMEOUT_S).stdout.strip()
    memlock = memlock or "?"
    if exp.runtime.containers and "memlock=-1" not in exp.runtime.ulimits:
        problems.append("runtime.ulimits lacks memlock=-1 (the container's memlock)")
    elif not exp.runtime.containers and memlock != "unlimited":
        problems.append(f"memlock {memlock} (not unlimited)")
    seen = ", ".join(f"{k} {p.describe()}" for k, p in rdma.ports.items()) or "no IB port"
    return problems, f"{seen}; GPUDirect {rdma.gpudirect or 'none'}; memlock {memlock}"


def run_preflight(*, exp: Experiment, manager: ServerManager) -> dict[str, Any]:
    """Every check for every server config; raise PreflightFailed naming node and reason."""
    transport = manager.transport
    transport.check_reachable(exp.cluster.nodes)
    # A server set of this run that is still up holds its ports; ensure() replaces it.
    current = next(filter(None, (up_in(manager.paths, p.index) for p in node_pools(exp))), None)
    checks: dict[str, Any] = {"pd": {}, "ib_devices": [], "image": [], "ports": []}
    # Every server config as every pool would run it (nodes, ports shifted per pool).
    pooled = [(narrow(exp, p), s) for p in node_pools(exp) for s in server_specs(narrow(exp, p))]
    for pool_exp, spec in pooled:
        checks["pd"][spec.id] = pd_agreement(spec)
        for node, dev in _ib_devices(spec):
            if exp.engine.kind == "sim":  # simulated nodes have simulated RDMA devices
                checks["ib_devices"].append({"node": node, "device": dev, "simulated": True})
                continue
            res = transport.run(
                node, f"test -e /sys/class/infiniband/{shlex.quote(dev)}", timeout=PROBE_TIMEOUT_S
            )
            if not res.ok:
                raise PreflightFailed(
                    f"node {node}: IB device {dev} not present (/sys/class/infiniband/{dev})"
                )
            problems, seen = rdma_problems(exp, manager, node, [dev])
            if problems:
                raise PreflightFailed(f"node {node}: RDMA for PD: {'; '.join(problems)} ({seen})")
            checks["ib_devices"].append({"node": node, "device": dev, "rdma": seen})
        if current is not None:
            checks["ports"].append(
                {"server": spec.id, "skipped": f"server {current.server_id} of this run is up"}
            )
            continue
        if manager.service(spec.fingerprint) is not None:
            checks["ports"].append({"server": spec.id, "skipped": "its service is up (reused)"})
            continue
        # another owner's server: name it, not just the port
        check_foreign(manager.runtime, manager.exp, spec, owner=manager.owner)
        for node, port in listening_ports(pool_exp, spec):
            if port == AUTO_PORT:
                checks["ports"].append({"node": node, "port": "auto"})
                continue
            probe = f"bash -c 'exec 3<>/dev/tcp/{node_address(pool_exp.cluster, node)}/{port}'"
            if transport.run(node, f"{probe} 2>/dev/null", timeout=PROBE_TIMEOUT_S).ok:
                raise PreflightFailed(
                    f"node {node}: port {port} is already in use (server {spec.id} needs it); "
                    f"stop what holds it or change the port"
                )
            checks["ports"].append({"node": node, "port": port, "free": True})
    checks["model"] = model_present(exp=exp, manager=manager)
    checks["engine_versions"] = engine_versions(exp=exp, manager=manager)
    checks["gpus"] = gpus_idle(exp=exp, manager=manager)
    checks["launch_args"] = launchcheck.check_launch_args(exp=exp, manager=manager)
    if manager.cluster.containers:
        fmt = shlex.quote("{{.Id}}")
        for node in exp.cluster.nodes:
            res = manager.runtime.run_docker(  # type: ignore[attr-defined]
                node, f"image inspect -f {fmt} {shlex.quote(exp.runtime.image or '')}"
            )
            if not res.ok:
                raise PreflightFailed(f"node {node}: image {exp.runtime.image} not present")
            checks["image"].append({"node": node, "image_id": res.stdout.strip()})
    return {"run_id": exp.run_id, "checked_at": dt.datetime.now(dt.UTC).isoformat(), **checks}
