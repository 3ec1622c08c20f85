"""One rank's life: startup logs and delays, rendezvous, HTTP on rank 0, signals, faults."""

from __future__ import annotations

import argparse
import asyncio
import errno
import logging
import os
import signal
import socket
import traceback
from typing import Any

from aiohttp import web

from servesweep.sim.cli import resolved_args, split_addr
from servesweep.sim.cluster import ClusterHost, ClusterPeer
from servesweep.sim.costmodel import CostModel, Topology, max_total_num_tokens
from servesweep.sim.engine import DisaggQueues, Engine
from servesweep.sim.logs import READY_LINE, SGLANG_SRC, fatal_exit, scheduler_traceback
from servesweep.sim.mooncake import server_args_lines, transfer_engine_lines
from servesweep.sim.pd import DecodeReceiver, KVSender, PrefillBootstrap, parallel_info
from servesweep.sim.profiles import SimProfile, get_profile
from servesweep.sim.scheduler import new_scheduler
from servesweep.sim.server import Faults, PDContext, SimServer
from servesweep.sim.tokens import PromptCounter, TextNoise

logger = logging.getLogger(__name__)

HTTP_SHUTDOWN_TIMEOUT_S = 1.0
PD_WARMUP_START = "Start of pd disaggregation warmup ..."
PD_WARMUP_END = "End of disaggregation warmup"
WARMUP_PROMPT_TOKENS = 7  # "The capital city of France is"
WARMUP_MAX_NEW_TOKENS = 8
NCCL_LINE = "NCCL error: remote process exited or there was a network error"


def topology_of(ns: argparse.Namespace) -> Topology:
    """The cost-model topology the flags describe."""
    return Topology(
        tp_size=ns.tp_size,
        ep_size=ns.ep_size,
        dp_size=ns.dp_size,
        pp_size=ns.pp_size,
        nnodes=ns.nnodes,
        moe_runner_backend=ns.moe_runner_backend,
    )


def faults_of(ns: argparse.Namespace) -> Faults:
    """The per-request faults the --sim-* flags ask for."""
    return Faults(
        http_500_at=frozenset(ns.sim_http_500_at),
        midstream_error_at=frozenset(ns.sim_midstream_error_at),
        hang_at=frozenset(ns.sim_hang_at),
    )


def _nccl_lost(who: str) -> None:
    logger.error(f"{NCCL_LINE} ({who} is gone)")
    fatal_exit(
        message=scheduler_traceback(
            error=(
                "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:2012, "
                "remote process exited or there was a network error, NCCL version 2.27.3\n"
                "ncclRemoteError: A call failed possibly due to a network error or a remote "
                f"process exiting prematurely.\nLast error:\nsocket recv: {who} closed the "
                "connection"
            )
        )
    )


def startup_noise(ns: argparse.Namespace) -> None:
    """Warnings real healthy starts print (tests/fixtures/real): a torch UserWarning, the MoE
    kernel-config fallback, and NCCL WARN lines when ranks span nodes."""
    print(
        "/usr/local/lib/python3.12/dist-packages/torch/_dynamo/variables/functions.py:1575: "
        "UserWarning: Dynamo detected a call to a `functools.lru_cache`-wrapped function. "
        "Dynamo ignores the cache wrapper and directly traces the wrapped function.",
        flush=True,
    )
    print("  torch._dynamo.utils.warn_once(msg)", flush=True)
    if ns.ep_size > 1 or getattr(ns, "moe_runner_backend", None):
        logger.warning(
            "Using default MoE kernel config. Performance might be sub-optimal! Config file "
            f"not found at {SGLANG_SRC}/layers/moe/fused_moe_triton/configs/triton_3_4_0/"
            "E=384,N=256,device_name=SIM.json, you can create them with "
            "https://github.com/sgl-project/sglang/tree/main/benchmark/kernels/fused_moe_triton"
        )
    if ns.nnodes > 1:
        host = socket.gethostname()
        for gpu in range(min(ns.tp_size // max(ns.nnodes, 1), 2)):
            print(
                f"{host}:{os.getpid()}:{os.getpid() + 17 + gpu} [{gpu}] NCCL WARN NET/IB : "
                "mlx5_0:1 Got async event : GID table change",
                flush=True,
            )


# SGLang's largest captured decode batch without --cuda-graph-max-bs (0.5.17 on an H100).
DEFAULT_CUDA_GRAPH_MAX_BS = 256


def decode_graph_share(max_bs: int | None) -> float:
    """A model, not a measurement: the decode graphs' capture time in proportion to the
    largest batch captured (`--cuda-graph-max-bs-decode` against SGLang's default); prefill graphs
    are bounded by the chunk size, not by it."""
    if max_bs is None:
        return 1.0
    return min(1.0, max_bs / DEFAULT_CUDA_GRAPH_MAX_BS)


async def _load(ns: argparse.Namespace, *, model: CostModel, capacity: int) -> None:
    """Log SGLang's startup milestones over --sim-startup-s simulated seconds."""
    scale, total = ns.sim_time_scale, ns.sim_startup_s
    gpus = ns.tp_size * ns.pp_size
    avail = model.hbm_gb_per_gpu - 0.5
    weights = min(model.weights_gb / gpus, 0.7 * model.hbm_gb_per_gpu)  # display only
    logger.info(f"Load weight begin. avail mem={avail:.2f} GB")
    if not ns.sim_clean:
        startup_noise(ns)
    if ns.sim_fail_start:
        await asyncio.sleep(0.3 * total * scale)
        fatal_exit(
            message=scheduler_traceback(
                startup=True,
                error=(
                    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB. "
                    f"GPU 0 has a total capacity of {model.hbm_gb_per_gpu:.2f} GiB of which "
                    "1.02 GiB is free. (injected by --sim-fail-start)"
                ),
            )
        )
    await asyncio.sleep(0.6 * total * scale)
    logger.info(
        f"Load weight end. type=SimForCausalLM, dtype=torch.bfloat16, "
        f"avail mem={avail - weights:.2f} GB, mem usage={weights:.2f} GB."
    )
    await asyncio.sleep(0.1 * total * scale)
    kv_gb = capacity * model.kv_bytes_per_token / 1e9 / 2
    logger.info(
        f"KV Cache is allocated. #tokens: {capacity}, K size: {kv_gb:.2f} GB, "
        f"V size: {kv_gb:.2f} GB"
    )
    logger.info("Capture cuda graph begin. This can take up to several minutes.")
    full = 0.3 * total * scale
    # SGLang 0.5.17's summary line (real logs: tests/fixtures/real/logs/): a prefill role
    # captures prefill graphs only, a decode role decode graphs only, a whole server both.
    prefill = {"prefill": full, "decode": 0.0}.get(ns.disaggregation_mode, 0.8 * full)
    graphs = prefill + (full - prefill) * decode_graph_share(ns.cuda_graph_max_bs_decode)
    await asyncio.sleep(graphs)
    logger.info(f"Capture cuda graph end. Time elapsed: {graphs:.2f} s.")
    logger.info(
        f"Engine startup timings (s): load_weight={0.6 * total * scale:.2f}, "
        f"kv_cache_allocation={0.1 * total * scale:.2f}, scheduler_e2e={total * scale:.2f}, "
        f"cuda_graph={{prefill={prefill:.2f}, decode={graphs - prefill:.2f}, "
        "target_verify=0.00, draft_prefill=0.00, draft_decode=0.00, draft_extend=0.00}, "
        f"tokenizer_e2e={total * scale + 0.5:.2f}"
    )


def _die_if_failed(task: asyncio.Task[None]) -> None:
    """A bug in the simulated scheduler ends the process like a real scheduler crash."""
    if task.cancelled() or task.exception() is None:
        return
    exc = task.exception()
    assert exc is not None
    text = "".join(traceback.format_exception(exc)).rstrip()
    fatal_exit(message="Scheduler hit an exception: " + text)


def _install_signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()

    def on_signal(sig: signal.Signals) -> None:
        logger.info(f"Received {sig.name}; shutting down.")
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)


async def run_node(ns: argparse.Namespace, *, launch_command: str) -> int:
    """Run this rank until SIGTERM (exit 0) or a fatal error (the process exits non-zero)."""
    args = resolved_args(ns)
    logger.info("server_args=ServerArgs(" + ", ".join(f"{k}={v!r}" for k, v in args.items()) + ")")
    if ns.disaggregation_mode in ("prefill", "decode"):
        for level, message in server_args_lines(
            backend=ns.disaggregation_transfer_backend, ib_device=ns.disaggregation_ib_device
        ):
            getattr(logger, level)(message)
    stop = asyncio.Event()
    _install_signals(stop)
    if ns.node_rank == 0:
        return await _run_rank0(ns, args=args, stop=stop, launch_command=launch_command)
    return await _run_peer(ns, stop=stop)


async def _bind_http(
    server: SimServer, *, host: str, port: int, reuse_port: bool = False
) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(server.app(), access_log=None, shutdown_timeout=HTTP_SHUTDOWN_TIMEOUT_S)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port, reuse_address=True, reuse_port=reuse_port).start()
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            logger.error("OSError: [Errno 98] Address already in use")
        fatal_exit(message=f"ERROR:    {exc}")
    bound = runner.addresses[0][1] if runner.addresses else port
    return runner, int(bound)


def page_size_of(ns: argparse.Namespace) -> int:
    """The page size the server runs with (SGLang's auto default: 1 for the simulator)."""
    return int(ns.page_size or 1)


async def _start_pd(
    ns: argparse.Namespace, *, args: dict[str, Any], profile: SimProfile, http_port: int
) -> PDContext | None:
    """PD roles: the prefill side's bootstrap server and KV sender, or the decode receiver."""
    mode = ns.disaggregation_mode
    if mode not in ("prefill", "decode"):
        return None
    ctx = PDContext(mode=mode, default_bootstrap_port=ns.disaggregation_bootstrap_port)
    logger.info(
        f"Disaggregation mode: {mode}, transfer backend: {ns.disaggregation_transfer_backend}, "
        f"ib devices: {ns.disaggregation_ib_device}, profile: {profile.name}"
    )
    if mode == "decode":
        ctx.receiver = DecodeReceiver(
            page_size=page_size_of(ns),
            kv_cache_dtype=ns.kv_cache_dtype,
            tp_size=ns.tp_size,
            peer=f"{ns.host}:{http_port}",
        )
        return ctx
    ctx.bootstrap = PrefillBootstrap(
        info=parallel_info(
            tp_size=ns.tp_size,
            dp_size=ns.dp_size,
            pp_size=ns.pp_size,
            page_size=page_size_of(ns),
            kv_cache_dtype=ns.kv_cache_dtype,
            http_port=http_port,
            transfer_backend=ns.disaggregation_transfer_backend,
            ib_device=ns.disaggregation_ib_device,
        ),
        fail=ns.sim_fail_transfer,
    )
    ctx.sender = KVSender(
        model=profile.transfer,
        kv_bytes_per_token=profile.cost.kv_bytes_per_token,
        prefill_tp=ns.tp_size // max(1, ns.dp_size),
        ib_device=ns.disaggregation_ib_device,
        backend=ns.disaggregation_transfer_backend,
        kv_cache_dtype=ns.kv_cache_dtype,
        time_scale=ns.sim_time_scale,
    )
    try:
        bound = await ctx.bootstrap.start(host=ns.host, port=ns.disaggregation_bootstrap_port)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            logger.error("OSError: [Errno 98] Address already in use")
        fatal_exit(message=f"Failed to start the bootstrap server: {exc}")
    args["disaggregation_bootstrap_port"] = bound
    ctx.default_bootstrap_port = bound
    return ctx


def _transfer_engine_start(ns: argparse.Namespace) -> None:
    """Mooncake's start lines (glog, on stdout) once the scheduler sets up disaggregation.
    Every rank of a real PD server prints them; the sim's rank 0 does (a peer's log has no
    batch or ready line after them, which the log scan would read as a process that stopped)."""
    host = ns.host if ns.host not in ("0.0.0.0", "::", "") else "127.0.0.1"
    for line in transfer_engine_lines(
        backend=ns.disaggregation_transfer_backend,
        ib_device=ns.disaggregation_ib_device,
        host=host,
        env=os.environ,
        noise=not ns.sim_clean,
    ):
        print(line, flush=True)


async def _close_pd(ctx: PDContext | None) -> None:
    if ctx is None:
        return
    if ctx.bootstrap is not None:
        await ctx.bootstrap.close()
    if ctx.sender is not None:
        ctx.sender.close()
    if ctx.receiver is not None:
        await ctx.receiver.close()


async def _run_rank0(
    ns: argparse.Namespace, *, args: dict[str, Any], stop: asyncio.Event, launch_command: str
) -> int:
    loop = asyncio.get_running_loop()
    started = loop.time()
    profile = get_profile(ns.sim_profile)
    model = profile.cost
    topology = topology_of(ns)

    def on_lost(rank: int, graceful: bool) -> None:
        if graceful:
            logger.info(f"node_rank {rank} shut down; shutting down.")
            stop.set()
        else:
            _nccl_lost(f"node_rank {rank}")

    cluster = None
    if ns.nnodes > 1:
        host, port = split_addr(ns.dist_init_addr)
        cluster = ClusterHost(host=host, port=port, nnodes=ns.nnodes, on_lost=on_lost)
        try:
            await cluster.start()
        except OSError as exc:
            fatal_exit(message=f"torch.distributed.DistNetworkError: {exc}")
    scheduler = new_scheduler(
        topology=topology,
        model=model,
        chunked_prefill_size=ns.chunked_prefill_size,
        max_prefill_tokens=ns.max_prefill_tokens,
        max_running_requests=ns.max_running_requests,
        page_size=ns.page_size,
        mem_fraction_static=ns.mem_fraction_static,
        kv_cache_dtype=ns.kv_cache_dtype,
        context_length=ns.context_length,
        seed=ns.sim_seed,
    )
    capacity = scheduler.policy.max_total_num_tokens
    engine = Engine(
        scheduler=scheduler,
        time_scale=ns.sim_time_scale,
        crash_after=ns.sim_crash_after,
        crash_kind=ns.sim_crash_kind or "scheduler",
        noise=TextNoise(
            seed=ns.sim_seed, enabled=not ns.sim_clean, special_rate=ns.sim_special_rate
        ),
    )
    counter = PromptCounter(paths=[ns.tokenizer_path, ns.model_path])
    logger.info(f"Text prompts are counted by: {counter.source}")
    server = SimServer(
        args=args,
        engine=engine,
        counter=counter,
        faults=faults_of(ns),
        launch_command=launch_command,
        max_total_num_tokens=capacity,
    )
    runner, port = await _bind_http(
        server, host=ns.host, port=ns.port, reuse_port=ns.sim_reuse_port
    )
    args["port"] = port
    server.pd = await _start_pd(ns, args=args, profile=profile, http_port=port)
    if server.pd is not None:
        engine.disagg = DisaggQueues(mode=server.pd.mode)
    engine_task = asyncio.create_task(engine.run())
    engine_task.add_done_callback(_die_if_failed)

    async def life() -> None:
        await _load(ns, model=model, capacity=capacity)
        if server.pd is not None:
            _transfer_engine_start(ns)
        logger.info(f"Uvicorn running on http://{ns.host}:{port} (Press CTRL+C to quit)")
        if cluster is not None and not cluster.all_joined.is_set():
            left = args["dist_timeout"] - (loop.time() - started)
            try:
                await asyncio.wait_for(cluster.all_joined.wait(), max(left, 0.001))
            except TimeoutError:
                missing = sorted(set(range(1, ns.nnodes)) - set(cluster.members))
                fatal_exit(
                    message=scheduler_traceback(
                        startup=True,
                        error=(
                            "torch.distributed.DistNetworkError: timed out after "
                            f"{args['dist_timeout']}s waiting for node_rank(s) {missing} at "
                            f"{ns.dist_init_addr}"
                        ),
                    )
                )
        if not ns.skip_server_warmup:
            if server.pd is not None:
                logger.info(PD_WARMUP_START)
            prefill_only = server.pd is not None and server.pd.mode == "prefill"
            await engine.run_to_completion(  # a prefill server samples the first token only
                prompt_tokens=WARMUP_PROMPT_TOKENS,
                max_new_tokens=1 if prefill_only else WARMUP_MAX_NEW_TOKENS,
            )
            if server.pd is not None:
                logger.info(f"{PD_WARMUP_END} with status 200 (fake bootstrap host, no transfer)")
        server.ready = True
        logger.info(READY_LINE)

    life_task = asyncio.create_task(life())
    await stop.wait()
    server.stopping = True
    life_task.cancel()
    if cluster is not None:
        await cluster.close()
    await runner.cleanup()
    await _close_pd(server.pd)
    await engine.close(engine_task)
    logger.info("Shutdown complete.")
    return 0


async def _run_peer(ns: argparse.Namespace, *, stop: asyncio.Event) -> int:
    host, port = split_addr(ns.dist_init_addr)
    peer = ClusterPeer(host=host, port=port, rank=ns.node_rank)
    timeout = resolved_args(ns)["dist_timeout"]
    model = get_profile(ns.sim_profile).cost

    def on_lost(graceful: bool) -> None:
        if graceful:
            logger.info("node_rank 0 shut down; exiting.")
            stop.set()
        else:
            _nccl_lost("node_rank 0")

    async def life() -> None:
        logger.info(f"node_rank {ns.node_rank}: joining {ns.dist_init_addr}")
        if not ns.sim_clean:
            startup_noise(ns)
        try:
            await peer.join(timeout_s=timeout)
        except TimeoutError:
            fatal_exit(
                message=scheduler_traceback(
                    startup=True,
                    error=(
                        "torch.distributed.DistNetworkError: The client socket has timed out "
                        f"after {timeout}s while trying to connect to ({host}, {port})."
                    ),
                )
            )
        watch = asyncio.create_task(peer.watch(on_lost))
        capacity = max_total_num_tokens(
            model=model,
            topology=topology_of(ns),
            mem_fraction_static=ns.mem_fraction_static,
            kv_cache_dtype=ns.kv_cache_dtype,
        )
        await _load(ns, model=model, capacity=capacity)
        await watch

    life_task = asyncio.create_task(life())
    await stop.wait()
    life_task.cancel()
    await peer.close()
    logger.info("Shutdown complete.")
    return 0
