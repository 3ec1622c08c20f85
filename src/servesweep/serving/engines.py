"""Command builders: `sglang.launch_server` per node and rank, and the simulator (same flags)."""

from __future__ import annotations

import re
import zlib
from collections.abc import Mapping
from dataclasses import dataclass

from servesweep.cluster.argcheck import MINI_LB, ROUTER_MODULES, LaunchArgs
from servesweep.cluster.transport import node_address
from servesweep.config.experiment import Experiment, port_number
from servesweep.config.guesses import ENGINE_VERSION, guessed
from servesweep.config.load import env_var_of
from servesweep.config.matrix import RoleSpec, ServerSpec, server_specs
from servesweep.config.schema import PD_ROLES, SimFaults
from servesweep.core.errors import ConfigError

# MoE runner choices of `--moe-runner-backend` per SGLang version (SGLANG.md section 3).
MOE_RUNNERS_0_5_9 = (
    "auto deep_gemm triton triton_kernel flashinfer_trtllm flashinfer_cutlass flashinfer_mxfp4 "
    "flashinfer_cutedsl cutlass"
).split()
# Read from the 0.5.17 wheel (server_args.MOE_RUNNER_BACKEND_CHOICES) for the H200 rehearsal;
# taken for every release from marlin's arrival (0.5.12) on, up to the one after it.
MOE_RUNNERS_0_5_17 = (
    MOE_RUNNERS_0_5_9
    + (
        "experimental_sgl_trtllm flashinfer_trtllm_routed aiter marlin humming "
        "experimental_sgl_marlin hpc_ops"
    ).split()
)
MOE_RUNNERS_0_5_23 = (
    MOE_RUNNERS_0_5_17
    + "flashinfer_megamoe lora_cutedsl lora_triton lora_marlin megamoe intel_xpu".split()
)
MARLIN_SINCE = (0, 5, 12)
# `--cuda-graph-max-bs` became an alias of `--cuda-graph-max-bs-decode` in 0.5.14 and an
# argparse error (ambiguous) in 0.5.20 (SGLANG.md section 1).
GRAPH_BS_DECODE_SINCE = (0, 5, 14)
AFTER_0_5_17 = (0, 5, 18)


def parse_version(version: str) -> tuple[int, ...]:
    """'0.5.10.post1' -> (0, 5, 10)."""
    parts = []
    for piece in version.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def moe_runners(version: str) -> list[str]:
    """The `--moe-runner-backend` choices of a pinned SGLang version."""
    parsed = parse_version(version)
    if parsed >= AFTER_0_5_17:
        return MOE_RUNNERS_0_5_23
    if parsed >= MARLIN_SINCE:
        return MOE_RUNNERS_0_5_17
    return MOE_RUNNERS_0_5_9


def cuda_graph_flag(version: str) -> str:
    """The flag that bounds the captured decode batch sizes in SGLang `version`."""
    if parse_version(version) >= GRAPH_BS_DECODE_SINCE:
        return "--cuda-graph-max-bs-decode"
    return "--cuda-graph-max-bs"


def check_supported(exp: Experiment, spec: ServerSpec) -> None:
    """Refuse arguments the pinned SGLang version would reject at launch. A guessed version
    refuses nothing here: build_images parses every command with the image's own parser."""
    if guessed(exp.guesses, ENGINE_VERSION):
        return
    for role in spec.roles:
        runner = role.args.moe_runner_backend
        if runner is not None and runner not in moe_runners(exp.engine.version):
            if "moe_runner_backend" in exp.matrix.server:
                key = "matrix.server.moe_runner_backend"
            elif role.name in exp.roles and "moe_runner_backend" in exp.roles[role.name].server:
                key = f"roles.{role.name}.server.moe_runner_backend"
            else:
                key = "server.moe_runner_backend"
            raise ConfigError(
                f"config key '{key}': {runner!r} is not a MoE runner of SGLang "
                f"{exp.engine.version} (choices: {', '.join(moe_runners(exp.engine.version))})"
            )


@dataclass(frozen=True)
class RankCommand:
    """The launch command of one rank of one role (or the router) on one node."""

    role: str
    node: str
    rank: int
    argv: list[str]
    env: dict[str, str]
    keyed: bool = False  # started by KEYED_LAUNCH: needs API_KEY_ENV in its environment


# The service's API key (docs/access.md): the process reads it from its environment and hands
# it to SGLang's `--api-key` inside Python, so it is in no process's argv; a forked filter masks
# it in everything the server prints (SGLang logs its server_args, key included).
API_KEY_ENV = "SERVESWEEP_API_KEY"
KEYED_LAUNCH = ";".join(
    [
        "import os,runpy,sys",
        f"k=os.environ['{API_KEY_ENV}'].encode()",
        "r,w=os.pipe()",
        # the child (fork() == 0) masks the key in every line, until the server's end
        "os.fork() or [os.close(w),[os.write(1,x.replace(k,b'***')) for x in os.fdopen(r,'rb')]"
        ",os._exit(0)]",
        "os.close(r)",
        "os.dup2(w,1)",
        "os.dup2(w,2)",
        "os.close(w)",
        "m=sys.argv.pop(1)",
        "sys.argv[0]=m",
        # `--api-key=KEY`: a URL-safe key may start with '-' (argparse would take it for a flag)
        "sys.argv+=['--api-key='+k.decode()]",
        "runpy.run_module(m,run_name='__main__',alter_sys=True)",
    ]
)  # one line: commands.sh keeps one line per command


def keyed(spec: ServerSpec) -> bool:
    """Whether a server set gets an API key: a single role (SGLang's `--api-key`, every pinned
    version). A PD set has none: sglang-router 0.3.2 checks no key from its clients and its
    --mini-lb forwards none to the workers; nor does a server SGLang refuses a key with
    (`--tokenizer-worker-num` > 1 asserts no key; 0.5.23's `--grpc-port` refuses one)
    (docs/access.md)."""
    if spec.router is not None:
        return False
    for role in spec.roles:
        extra = [str(a) for a in role.args.extra_args]
        for i, arg in enumerate(extra):
            name, _, inline = arg.partition("=")
            value = inline or (extra[i + 1] if i + 1 < len(extra) else "")
            if name == "--grpc-port" or (name == "--tokenizer-worker-num" and value != "1"):
                return False
    return True


ROUTER_ROLE = "router"
DEFAULT_BOOTSTRAP_PORT = 8998


def server_host(exp: Experiment) -> str:
    """Interface HTTP servers listen on: loopback locally, every interface on a cluster."""
    return "127.0.0.1" if exp.cluster.local else "0.0.0.0"


def role_url(exp: Experiment, role: RoleSpec) -> str:
    """URL of a role's rank 0."""
    return f"http://{node_address(exp.cluster, role.nodes[0])}:{role.port}"


def base_url(exp: Experiment, spec: ServerSpec) -> str:
    """URL clients use: the router of a PD set, else rank 0 of the only role."""
    if spec.router is not None:
        return f"http://{node_address(exp.cluster, spec.router.node)}:{spec.router.port}"
    return role_url(exp, spec.roles[0])


def listening_ports(exp: Experiment, spec: ServerSpec) -> list[tuple[str, int]]:
    """(node, port) pairs the server set will listen on."""
    ports: list[tuple[str, int]] = []
    for role in spec.roles:
        ports.append((role.nodes[0], role.port))
        if len(role.nodes) > 1:
            ports.append((role.nodes[0], role.dist_init_port))
        if role.name == "prefill":
            bootstrap = role.args.disaggregation_bootstrap_port or DEFAULT_BOOTSTRAP_PORT
            ports.append((role.nodes[0], bootstrap))
    if spec.router is not None:
        ports.append((spec.router.node, port_number(spec.router.port)))
    return list(dict.fromkeys(ports))


def _server_flags(exp: Experiment, role: RoleSpec, rank: int) -> list[str]:
    args = role.args
    flags = ["--model-path", exp.engine.model_path]
    if exp.engine.served_model_name:
        flags += ["--served-model-name", exp.engine.served_model_name]
    flags += ["--host", server_host(exp), "--port", str(role.port)]
    # Request counters and load gauges on /metrics (the watchdog, the isolation check and the
    # request-count comparison read them; /metrics needs no key).
    flags.append("--enable-metrics")
    flags += ["--tp-size", str(args.tp_size), "--ep-size", str(args.ep_size)]
    flags += ["--dp-size", str(args.dp_size), "--pp-size", str(args.pp_size)]
    if len(role.nodes) > 1:
        addr = f"{node_address(exp.cluster, role.nodes[0])}:{role.dist_init_port}"
        flags += ["--nnodes", str(len(role.nodes)), "--node-rank", str(rank)]
        flags += ["--dist-init-addr", addr]
    if role.name in PD_ROLES:
        flags += ["--disaggregation-mode", role.name]
    optional = {
        "--moe-runner-backend": args.moe_runner_backend,
        "--chunked-prefill-size": args.chunked_prefill_size,
        "--page-size": args.page_size,
        "--kv-cache-dtype": args.kv_cache_dtype,
        "--mem-fraction-static": args.mem_fraction_static,
        "--max-running-requests": args.max_running_requests,
        "--disaggregation-transfer-backend": args.disaggregation_transfer_backend,
        "--disaggregation-ib-device": args.disaggregation_ib_device,
        "--disaggregation-bootstrap-port": args.disaggregation_bootstrap_port,
        "--speculative-algorithm": args.speculative_algorithm,
        # "auto" resolved (config.matrix); the flag's name follows the pinned version
        cuda_graph_flag(exp.engine.version): args.cuda_graph_max_bs,
    }
    for flag, value in optional.items():
        if value is not None:
            flags += [flag, str(value)]
    if args.disable_radix_cache:
        flags.append("--disable-radix-cache")
    if args.trust_remote_code:
        flags.append("--trust-remote-code")
    return flags + list(args.extra_args)


def _sim_flags(exp: Experiment, spec: ServerSpec, node: str) -> list[str]:
    sim = exp.engine.sim
    # Each server config gets its own noise stream; the same config reproduces it.
    seed = (sim.seed + zlib.crc32(spec.fingerprint.encode())) % 2**31
    flags = ["--sim-time-scale", str(sim.time_scale), "--sim-seed", str(seed)]
    flags += ["--sim-startup-s", str(sim.startup_s)]
    if not sim.noise:
        flags.append("--sim-clean")
    if sim.profile:
        flags += ["--sim-profile", sim.profile]
    faults = sim.faults
    if faults.fail_start or node in faults.fail_start_nodes:
        flags.append("--sim-fail-start")
    if corrupts(faults, spec, node):
        flags.append("--sim-corrupt")
    if faults.fail_transfer and any(r.name == "prefill" and node in r.nodes for r in spec.roles):
        flags.append("--sim-fail-transfer")
    if faults.crash_after is not None:
        flags += ["--sim-crash-after", str(faults.crash_after)]
        if faults.crash_kind != "scheduler":
            flags += ["--sim-crash-kind", faults.crash_kind]
    for flag, indices in (
        ("--sim-http-500-at", faults.http_500_at),
        ("--sim-midstream-error-at", faults.midstream_error_at),
        ("--sim-hang-at", faults.hang_at),
    ):
        if indices:
            flags += [flag, ",".join(str(i) for i in indices)]
    return flags


def corrupts(faults: SimFaults, spec: ServerSpec, node: str) -> bool:
    """Whether the sim rank on `node` answers wrong tokens: its role's MoE runner is one of
    `corrupt_runners`, or it is a PD decode rank under `corrupt_transfer`."""
    for role in spec.roles:
        if node not in role.nodes:
            continue
        if role.args.moe_runner_backend in faults.corrupt_runners:
            return True
        if faults.corrupt_transfer and role.name == "decode":
            return True
    return False


def router_command(exp: Experiment, spec: ServerSpec) -> RankCommand:
    """The PD router in front of rank 0 of prefill and decode."""
    router = spec.router
    assert router is not None
    prefill, decode = (next(r for r in spec.roles if r.name == n) for n in PD_ROLES)
    bootstrap = prefill.args.disaggregation_bootstrap_port or DEFAULT_BOOTSTRAP_PORT
    module = ["-m", ROUTER_MODULES[exp.engine.kind]]
    argv = [exp.engine.python, *module, "--pd-disaggregation"]
    if router.mini_lb:
        argv.append(MINI_LB)
    argv += ["--prefill", role_url(exp, prefill), str(bootstrap)]
    argv += ["--decode", role_url(exp, decode)]
    argv += ["--host", server_host(exp), "--port", str(router.port), "--policy", router.policy]
    no_workers = exp.engine.sim.faults.router_no_workers_after
    if exp.engine.kind == "sim" and no_workers is not None:
        argv += ["--sim-no-workers-after", str(no_workers)]
    return RankCommand(role=ROUTER_ROLE, node=router.node, rank=0, argv=argv, env={})


def socket_env(exp: Experiment) -> dict[str, str]:
    """The interface every rank's Gloo and NCCL bootstrap use (`cluster.socket_ifname`);
    `server.env` may still override either."""
    name = exp.cluster.socket_ifname
    return {} if name is None else {"GLOO_SOCKET_IFNAME": name, "NCCL_SOCKET_IFNAME": name}


def device_env(exp: Experiment, node: str) -> dict[str, str]:
    """CUDA_VISIBLE_DEVICES of a node that is a slice of its host (`cluster.gpu_ids`); it
    wins over `server.env`, as telemetry counts only those GPUs."""
    ids = exp.cluster.visible_gpus(node)
    return {} if ids is None else {"CUDA_VISIBLE_DEVICES": ",".join(map(str, ids))}


def rank_commands(exp: Experiment, spec: ServerSpec) -> list[RankCommand]:
    """Every process of a server set in start order: each role's ranks (rank 0 first),
    then the router."""
    check_supported(exp, spec)
    if exp.engine.kind == "sglang":
        module = ["-m", "sglang.launch_server"]
    else:
        module = ["-m", "servesweep.sim"]
    commands = []
    key = keyed(spec)
    if key:
        module = ["-c", KEYED_LAUNCH, module[1]]
    for role in spec.roles:
        for rank, node in enumerate(role.nodes):
            argv = [exp.engine.python, *module, *_server_flags(exp, role, rank)]
            if exp.engine.kind == "sim":
                argv += _sim_flags(exp, spec, node)
            commands.append(
                RankCommand(
                    role=role.name,
                    node=node,
                    rank=rank,
                    argv=argv,
                    env={**socket_env(exp), **role.args.env, **device_env(exp, node)},
                    keyed=key,
                )
            )
    if spec.router is not None:
        commands.append(router_command(exp, spec))
    return commands


def check_experiment(
    exp: Experiment, specs: list[ServerSpec], env: Mapping[str, str] | None = None
) -> None:
    """Check every server config against the pinned engine version (before anything starts);
    a refused matrix value that an env variable set names that variable and its value."""
    try:
        for spec in specs:
            check_supported(exp, spec)
    except ConfigError as exc:
        match = re.match(r"config key 'matrix\.(server|client)\.(\w+)'", str(exc))
        var = env_var_of(match.group(1), match.group(2), env or {}) if match else None
        if var is None:
            raise
        raise ConfigError(f"env {var}={(env or {})[var]!r}: {exc}") from None


def launch_targets(exp: Experiment) -> list[LaunchArgs]:
    """Every server launch command of the run (each server config, role and rank) as the
    arguments its engine's parser sees (build_images parses them in the image); the router
    has its own parser (smoked by `--help`)."""
    module = "sglang.launch_server" if exp.engine.kind == "sglang" else "servesweep.sim"
    out = []
    for spec in server_specs(exp):
        for cmd in rank_commands(exp, spec):
            if cmd.role == ROUTER_ROLE:
                continue
            out.append(
                LaunchArgs(
                    label=f"server config {spec.id}, {cmd.role} rank {cmd.rank} (node {cmd.node})",
                    args=cmd.argv[cmd.argv.index(module) + 1 :],
                )
            )
    return out
