"""PD disaggregation between simulator processes: the prefill side's bootstrap server and KV
sender, the decode side's receiver, and the handshake between them over real HTTP.

Protocol (both ends are `python -m servesweep.sim` processes; the mini-LB router sends the
same request, with `bootstrap_host/port/room`, to a prefill and a decode server):

1. decode, first request for a bootstrap address: `GET /route?prefill_dp_rank=-1&...` on the
   prefill server's bootstrap port -> its parallel info (SGLang's `PrefillServerInfo` keys:
   attn_tp_size, attn_cp_size, dp_size, pp_size, page_size, kv_cache_dtype,
   follow_bootstrap_room). A different page size or KV dtype raises SGLang's RuntimeError
   in the decode scheduler (the process dies, see server.py).
2. decode: `POST /sim/kv_transfer {room, peer, decode_tp_size}` on the bootstrap port and
   wait (long poll): this registers the decode side for the room.
3. prefill: the request waits in the bootstrap queue until the room is registered, is
   prefilled, then its KV cache "crosses" the link (transfer.py: warm-up per decode peer,
   fixed latency, bytes over shared bandwidth; sleeping simulated time x time scale). It logs
   `KV transfer done: room=...` and answers the long poll with the first token id.
4. decode: logs `RDMA ready ack: room=...`, admits the request with its whole prompt already
   prefilled and streams from the first token on.

The log strings in EVIDENCE_PATTERNS are what the workflow counts as proof of the P->D path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import aiohttp
from aiohttp import web

from servesweep.sim.transfer import TransferLink, TransferModel, link_bandwidth, plan_transfer

logger = logging.getLogger(__name__)

# Evidence lines (exact prefixes; the workflow counts them in the service logs).
KV_TRANSFER_DONE = "KV transfer done: room="  # prefill: one line per transferred request
RDMA_READY_ACK = "RDMA ready ack: room="  # decode: one line per received KV cache
EVIDENCE_PATTERNS: Mapping[str, str] = MappingProxyType(
    {"prefill": KV_TRANSFER_DONE, "decode": RDMA_READY_ACK}
)
# SGLang's own line (disaggregation/mooncake/conn.py `_send_mamba_state_slice`, logged with
# `warning_once`: once per prefill process) when P and D attention TP sizes differ.
STATE_SLICE_LINE = (
    "Using Mamba state slice transfer for different TP sizes between prefill and decode."
)
RDMA_ENDPOINTS_LINE = "Mooncake RDMA endpoints established"
# SGLang's (CommonKVBootstrapServer._run_server), once on a prefill server: "... on host:port".
BOOTSTRAP_LINE = "CommonKVBootstrapServer started successfully on"
FAKE_BOOTSTRAP_HOST = "2.2.2.2"  # sglang.srt.disaggregation.utils: no transfer at all
TRANSFER_PATH = "/sim/kv_transfer"
ROUTE_QUERY = "prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1"
INFO_FETCH_ATTEMPTS = 3
INFO_FETCH_RETRY_S = 0.5
HTTP_TIMEOUT_S = 5.0


def _env_seconds(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return default


def bootstrap_timeout_s() -> float:
    """How long prefill waits for the decode side to register a room (SGLang's env)."""
    return _env_seconds("SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", 300.0)


def waiting_timeout_s() -> float:
    """How long decode waits for a room's KV cache (SGLang's env)."""
    return _env_seconds("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", 300.0)


class PDMismatch(RuntimeError):
    """Prefill and decode servers disagree on page size or KV dtype (SGLang's message)."""


class KVTransferFailed(Exception):
    """A room's KV cache never arrived (prefill failed, timed out, or is unreachable)."""


@dataclass(frozen=True)
class Bootstrap:
    """Where a request's KV cache comes from: the mini-LB's bootstrap_host/port/room."""

    host: str
    port: int
    room: int

    @property
    def addr(self) -> str:
        host = f"[{self.host}]" if ":" in self.host and not self.host.startswith("[") else self.host
        return f"{host}:{self.port}"

    @property
    def fake(self) -> bool:
        return self.host == FAKE_BOOTSTRAP_HOST


def bootstrap_of(body: Mapping[str, Any], *, default_port: int) -> Bootstrap | None:
    """The request's bootstrap fields (None when it has none); a null port means the
    server's own --disaggregation-bootstrap-port, as SGLang's scheduler does. ValueError on
    malformed fields."""
    host, port, room = (
        body.get("bootstrap_host"),
        body.get("bootstrap_port"),
        body.get("bootstrap_room"),
    )
    if host is None and room is None:
        return None
    if isinstance(host, list) or isinstance(room, list):
        raise ValueError("batched bootstrap fields are not supported by the simulator")
    if not isinstance(host, str) or not host:
        raise ValueError(f"bootstrap_host must be a host name, got {host!r}")
    if isinstance(room, bool) or not isinstance(room, int):
        raise ValueError(f"bootstrap_room must be an integer, got {room!r}")
    if port is None:
        port = default_port
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise ValueError(f"bootstrap_port must be a port number or null, got {port!r}")
    return Bootstrap(host=host.strip("[]"), port=port, room=room)


def parallel_info(
    *,
    tp_size: int,
    dp_size: int,
    pp_size: int,
    page_size: int,
    kv_cache_dtype: str,
    http_port: int,
    transfer_backend: str,
    ib_device: str | None,
) -> dict[str, Any]:
    """What the prefill bootstrap's `/route` sentinel query returns (SGLang's keys + sim's)."""
    return {
        "attn_tp_size": tp_size // max(1, dp_size),
        "attn_cp_size": 1,
        "dp_size": dp_size,
        "pp_size": pp_size,
        "page_size": page_size,
        "kv_cache_dtype": kv_cache_dtype,
        "follow_bootstrap_room": False,
        "prefill_http_port": http_port,
        "tp_size": tp_size,
        "transfer_backend": transfer_backend,
        "ib_device": ib_device,
    }


def check_compatible(*, info: Mapping[str, Any], page_size: int, kv_cache_dtype: str) -> None:
    """SGLang's `try_ensure_parallel_info` sanity checks on the decode side."""
    theirs = info.get("page_size")
    if theirs is not None and theirs != page_size:
        raise PDMismatch(
            f"Page size mismatch: prefill server has page_size={theirs}, "
            f"but decode server has page_size={page_size}. "
            f"Both servers must use the same --page-size value."
        )
    dtype = info.get("kv_cache_dtype")
    if dtype is not None and dtype != kv_cache_dtype:
        raise PDMismatch(
            f"KV cache dtype mismatch: prefill server has kv_cache_dtype={dtype}, "
            f"but decode server has kv_cache_dtype={kv_cache_dtype}. "
            f"Both servers must use the same --kv-cache-dtype value."
        )


# ---------------------------------------------------------------------- prefill side


class KVSender:
    """The prefill server's transfer engine: RDMA endpoint warm-up once per decode peer, a
    fixed latency per transfer, then the bytes over a link shared by concurrent transfers
    (simulated seconds x time scale; time scale 0 makes transfers instant)."""

    def __init__(
        self,
        *,
        model: TransferModel,
        kv_bytes_per_token: float,
        prefill_tp: int,
        ib_device: str | None,
        backend: str,
        kv_cache_dtype: str | None,
        time_scale: float,
    ) -> None:
        self.model = model
        self.kv_bytes_per_token = kv_bytes_per_token
        self.prefill_tp = prefill_tp
        self.backend = backend
        self.kv_cache_dtype = kv_cache_dtype
        self.time_scale = time_scale
        self._loop = asyncio.get_running_loop()
        self._t0 = self._loop.time()
        self._link = TransferLink(
            bandwidth=link_bandwidth(model=model, ib_device=ib_device),
            max_parallel=model.max_parallel,
        )
        self._waiters: dict[int, asyncio.Future[float]] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._peers: dict[str, asyncio.Future[None]] = {}
        self._keys = 0
        self._slice_warned = False

    def _sim_now(self) -> float:
        return (self._loop.time() - self._t0) / self.time_scale

    async def _sleep_sim(self, seconds: float) -> None:
        if seconds > 0 and self.time_scale > 0:
            await asyncio.sleep(seconds * self.time_scale)

    async def _endpoints(self, peer: str) -> None:
        """Establish the RDMA endpoints to `peer` once; concurrent transfers wait for it."""
        ready = self._peers.get(peer)
        if ready is None:
            ready = self._loop.create_future()
            self._peers[peer] = ready
            setup = self.model.endpoint_setup_s if self.backend != "fake" else 0.0
            logger.info(f"Mooncake: establishing RDMA endpoints with decode peer {peer} ...")
            await self._sleep_sim(setup)
            logger.info(f"{RDMA_ENDPOINTS_LINE} with {peer} (setup {setup:.3f} s simulated)")
            ready.set_result(None)
        await asyncio.shield(ready)

    def _reschedule(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        nxt = self._link.next_completion()
        if nxt is not None:
            self._timer = self._loop.call_at(self._t0 + nxt * self.time_scale, self._on_timer, nxt)

    def _finish(self, keys: list[Any], *, at: float) -> None:
        for key in keys:
            waiter = self._waiters.pop(int(key), None)
            if waiter is not None and not waiter.done():
                waiter.set_result(at)

    def _on_timer(self, due: float) -> None:
        self._timer = None
        now = max(self._sim_now(), due)
        self._finish(self._link.advance(now), at=due)
        self._reschedule()

    async def send(self, *, room: int, tokens: int, peer: str, decode_tp: int) -> float:
        """Move one request's KV cache to `peer`; return the simulated seconds it took
        (endpoint warm-up + fixed latency + time on the link, by the simulated clock)."""
        setup = 0.0
        if peer not in self._peers:
            setup = self.model.endpoint_setup_s if self.backend != "fake" else 0.0
        await self._endpoints(peer)
        plan = plan_transfer(
            model=self.model,
            tokens=tokens,
            kv_bytes_per_token=self.kv_bytes_per_token,
            decode_tp=decode_tp,
            kv_cache_dtype=self.kv_cache_dtype,
            backend=self.backend,
        )
        await self._sleep_sim(plan.base_latency_s)
        on_link = 0.0
        if self.time_scale > 0 and plan.nbytes > 0:
            self._keys += 1
            key = self._keys
            waiter: asyncio.Future[float] = self._loop.create_future()
            self._waiters[key] = waiter
            entered = self._sim_now()
            self._finish(self._link.add(key=key, nbytes=plan.nbytes, now=entered), at=entered)
            self._reschedule()
            try:
                on_link = max(0.0, await waiter - entered)
            finally:
                self._waiters.pop(key, None)
        simulated = setup + plan.base_latency_s + on_link
        if decode_tp != self.prefill_tp and not self._slice_warned:
            self._slice_warned = True
            logger.warning(
                f"{STATE_SLICE_LINE} Prefill attn_tp_size={self.prefill_tp}, "
                f"Decode attn_tp_size={decode_tp}. Performance may be affected."
            )
        logger.info(
            f"{KV_TRANSFER_DONE}{room}, tokens={tokens}, bytes={plan.nbytes:.0f}, "
            f"state slice TP{self.prefill_tp}->TP{decode_tp}, peer={peer}, "
            f"backend={self.backend}, {simulated:.3f} s"
        )
        return simulated

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()


@dataclass(eq=False)
class Room:
    """One bootstrap room on the prefill side: the decode side's registration and the
    transfer's outcome (a JSON-able dict with `status` ok|failed)."""

    room: int
    registered: asyncio.Event = field(default_factory=asyncio.Event)
    peer: str = ""
    decode_tp: int = 1
    result: asyncio.Future[dict[str, Any]] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )

    def resolve(self, outcome: dict[str, Any]) -> None:
        if not self.result.done():
            self.result.set_result(outcome)


class PrefillBootstrap:
    """The bootstrap HTTP server of a prefill server's rank 0 (`--disaggregation-bootstrap-
    port`): parallel info for decode servers and their per-room registration."""

    def __init__(self, *, info: dict[str, Any], fail: bool = False) -> None:
        self.info = info
        self.fail = fail  # --sim-fail-transfer: the KV sent never arrives
        self.rooms: dict[int, Room] = {}
        self._runner: web.AppRunner | None = None

    def room(self, room: int) -> Room:
        """The room's state, created by whichever side arrives first."""
        state = self.rooms.get(room)
        if state is None:
            state = self.rooms[room] = Room(room=room)
        return state

    def drop(self, room: int) -> None:
        self.rooms.pop(room, None)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/route", self._route)
        app.router.add_get("/health", self._health)
        app.router.add_post(TRANSFER_PATH, self._transfer)
        return app

    async def start(self, *, host: str, port: int) -> int:
        """Listen (raises OSError if the port is taken); return the bound port."""
        self._runner = web.AppRunner(self.app(), access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, reuse_address=True)
        try:
            await site.start()
        except OSError:
            await self._runner.cleanup()
            raise
        addresses = self._runner.addresses
        bound = int(addresses[0][1]) if addresses else port
        logger.info(f"{BOOTSTRAP_LINE} {host}:{bound}")
        return bound

    async def close(self) -> None:
        for state in self.rooms.values():
            state.resolve({"status": "failed", "reason": "the prefill server is shutting down"})
        if self._runner is not None:
            await self._runner.cleanup()

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="OK")

    async def _route(self, request: web.Request) -> web.Response:
        return web.json_response(self.info)

    async def _transfer(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
            room_id = int(body["room"])
            peer = str(body["peer"])
            decode_tp = int(body.get("decode_tp_size", 1))
        except (ValueError, KeyError, TypeError):
            return web.json_response({"status": "failed", "reason": "bad registration"}, status=400)
        state = self.room(room_id)
        state.peer, state.decode_tp = peer, decode_tp
        state.registered.set()
        try:
            outcome = await state.result
        finally:
            self.drop(room_id)
        if self.fail:
            logger.error(f"KV transfer of room {room_id} to {peer} failed (--sim-fail-transfer)")
            outcome = {"status": "failed", "reason": "the transfer engine lost the KV cache"}
        return web.json_response(outcome)


# ---------------------------------------------------------------------- decode side


class DecodeReceiver:
    """The decode server's side: prefill parallel info (checked once per bootstrap address)
    and the per-room wait for the KV cache."""

    def __init__(self, *, page_size: int, kv_cache_dtype: str, tp_size: int, peer: str) -> None:
        self.page_size = page_size
        self.kv_cache_dtype = kv_cache_dtype
        self.tp_size = tp_size
        self.peer = peer
        self.infos: dict[str, dict[str, Any]] = {}
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0),
                timeout=aiohttp.ClientTimeout(total=None, connect=HTTP_TIMEOUT_S),
            )
        return self._session

    async def ensure_parallel_info(self, addr: str) -> dict[str, Any]:
        """Fetch and check the prefill server's info once (PDMismatch on a mismatch,
        KVTransferFailed when it cannot be fetched)."""
        cached = self.infos.get(addr)
        if cached is not None:
            return cached
        url = f"http://{addr}/route?{ROUTE_QUERY}"
        info: dict[str, Any] | None = None
        for attempt in range(INFO_FETCH_ATTEMPTS):
            try:
                async with self._http().get(
                    url, timeout=aiohttp.ClientTimeout(total=HTTP_TIMEOUT_S)
                ) as resp:
                    if resp.status == 200:
                        info = await resp.json()
                        break
                    text = await resp.text()
                    logger.error(f"Failed to get prefill server info: {resp.status}, {text}")
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                logger.error(f"Error fetching prefill server info from bootstrap: {exc}")
            if attempt < INFO_FETCH_ATTEMPTS - 1:
                logger.info(
                    f"Prefill server info not available from {addr}, "
                    f"retrying ({attempt + 1}/{INFO_FETCH_ATTEMPTS})..."
                )
                await asyncio.sleep(INFO_FETCH_RETRY_S)
        if info is None:
            raise KVTransferFailed(
                f"Could not fetch prefill parallel info from bootstrap_addr: {addr}"
            )
        check_compatible(info=info, page_size=self.page_size, kv_cache_dtype=self.kv_cache_dtype)
        self.infos[addr] = info
        logger.info(
            f"Prefill parallel info for [{addr}]: attn_tp_size={info.get('attn_tp_size')}, "
            f"pp_size={info.get('pp_size')}, page_size={info.get('page_size')}, "
            f"kv_cache_dtype={info.get('kv_cache_dtype')}"
        )
        return info

    async def receive(self, bootstrap: Bootstrap, *, timeout_s: float) -> dict[str, Any]:
        """Register for the room and wait until its KV cache arrived; returns the prefill
        side's outcome (tokens, first_token_id, ...). KVTransferFailed otherwise."""
        body = {"room": bootstrap.room, "peer": self.peer, "decode_tp_size": self.tp_size}
        url = f"http://{bootstrap.addr}{TRANSFER_PATH}"
        try:
            async with self._http().post(
                url, json=body, timeout=aiohttp.ClientTimeout(total=timeout_s)
            ) as resp:
                outcome = await resp.json()
        except TimeoutError:
            raise KVTransferFailed(
                f"KVTransferError(bootstrap_room={bootstrap.room}): Request timed out after "
                f"{timeout_s:.1f}s in KVPoll.WaitingForInput"
            ) from None
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            logger.error(
                f"Failed to get kvcache from prefill instance, it might be dead "
                f"(bootstrap_addr={bootstrap.addr}, room={bootstrap.room}): {exc}"
            )
            raise KVTransferFailed(
                f"KVTransferError(bootstrap_room={bootstrap.room}): Failed to get kvcache "
                f"from prefill instance {bootstrap.addr}"
            ) from None
        if outcome.get("status") != "ok":
            raise KVTransferFailed(
                f"KVTransferError(bootstrap_room={bootstrap.room}): "
                f"{outcome.get('reason', 'the prefill side failed')}"
            )
        logger.info(
            f"{RDMA_READY_ACK}{bootstrap.room}, tokens={outcome.get('tokens')}, "
            f"prefill={bootstrap.addr}"
        )
        return outcome

    async def close(self) -> None:
        if self._session is not None:
            with contextlib.suppress(Exception):
                await self._session.close()
