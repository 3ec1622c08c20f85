"""`python -m servesweep.sim.router`: sglang-router's PD mini-LB (`--pd-disaggregation
--mini-lb`), same CLI subset as `python -m sglang_router.launch_router`.

Per `/generate` (and `/v1/completions`, `/v1/chat/completions`) it picks a random prefill
and decode server, adds `bootstrap_host` (the prefill URL's host name), `bootstrap_port` (the
port given after the prefill URL, or null) and a random 63-bit `bootstrap_room`, POSTs the
same body to both, and returns the decode server's response (streamed through as is; for a
stream the status is always 200, as the real mini-LB's StreamingResponse). It also serves
`/health` (always 200), `/health_generate` and `/flush_cache` (fanned out to every server),
`/get_server_info` (`{internal_states, prefill: [...], decode: [...]}`), `/get_model_info`,
`/model_info` and `/v1/models` (from the first prefill server). Like sglang-router 0.3.2's
mini-LB (a FastAPI app; seen on one H100, 2026-12-07) it has no `/server_info` and no
`/metrics`: those, like any path it has no route for, get FastAPI's 404
`{"detail": "Not Found"}`. Log lines follow the mini-LB under uvicorn; `READY_LINE` is logged
once the port is bound.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import json
import logging
import os
import random
import signal
import sys
import time
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from servesweep.sim.logs import setup_logging

logger = logging.getLogger(__name__)

READY_LINE = "Uvicorn running on"
MINI_LB_WARNING = "MiniLB is only for debugging purposes, it only supports random policy!"
POLICIES = ("random", "round_robin", "cache_aware", "power_of_two", "manual")
STREAM_CHUNK = 64 * 1024
SHUTDOWN_TIMEOUT_S = 1.0


class RouterArgsError(ValueError):
    """The router's command line cannot describe a PD mini-LB."""


@dataclass(frozen=True)
class RouterArgs:
    """What the mini-LB needs from the command line."""

    host: str
    port: int
    prefill: tuple[tuple[str, int | None], ...]
    decode: tuple[str, ...]
    policy: str
    request_timeout_secs: float
    log_level: str
    mini_lb: bool
    no_workers_after: int | None = None


def build_parser() -> argparse.ArgumentParser:
    """sglang_router.launch_router's flags that matter for a PD mini-LB (plus a few no-ops)."""
    p = argparse.ArgumentParser(
        prog="python -m servesweep.sim.router",
        description="Simulated sglang-router PD mini-LB (drop-in for sglang_router.launch_router).",
    )
    add = p.add_argument
    add("--host", type=str, default="127.0.0.1")
    add("--port", type=int, default=30000)
    add("--worker-urls", type=str, nargs="*", default=[])
    add("--policy", type=str, default="cache_aware", choices=POLICIES)
    add("--prefill-policy", type=str, default=None, choices=POLICIES)
    add("--decode-policy", type=str, default=None, choices=POLICIES)
    add("--mini-lb", action="store_true")
    add("--pd-disaggregation", action="store_true")
    add("--prefill", nargs="+", action="append", metavar="URL [BOOTSTRAP_PORT]")
    add("--decode", nargs=1, action="append", metavar="URL")
    add("--worker-startup-timeout-secs", type=int, default=600)
    add("--worker-startup-check-interval", type=int, default=30)
    add("--request-timeout-secs", type=int, default=1800)
    add("--max-payload-size", type=int, default=512 * 1024 * 1024)
    add("--log-level", type=str, default="info", choices=("debug", "info", "warning", "error"))
    add("--log-dir", type=str, default=None)
    add("--prometheus-port", type=int, default=29000)
    add("--prometheus-host", type=str, default="127.0.0.1")
    sim = p.add_argument_group("simulator (not sglang-router)")
    sim.add_argument(
        "--sim-no-workers-after",
        type=int,
        default=None,
        metavar="N",
        help="after N generate requests every worker's circuit is open: each request gets 503 "
        "and sglang-router's (Rust) error line",
    )
    return p


def _prefill_entry(items: list[str]) -> tuple[str, int | None]:
    if len(items) > 2:
        raise RouterArgsError(f"--prefill takes URL [BOOTSTRAP_PORT], got {' '.join(items)}")
    url = items[0]
    if len(items) == 1 or items[1].lower() == "none":
        return url, None
    try:
        return url, int(items[1])
    except ValueError:
        raise RouterArgsError(
            f"Invalid bootstrap port: {items[1]}. Must be a number or 'none'"
        ) from None


def parse_args(argv: Sequence[str] | None = None) -> RouterArgs:
    """Parse the command line; argparse errors exit 2, PD errors raise RouterArgsError."""
    ns = build_parser().parse_args(argv)
    prefill = tuple(_prefill_entry(items) for items in ns.prefill or [])
    decode = tuple(items[0] for items in ns.decode or [])
    if not ns.pd_disaggregation:
        raise RouterArgsError("MiniLB only supports PD disaggregation mode")
    if not prefill or not decode:
        raise RouterArgsError("MiniLB requires at least one prefill and one decode server")
    return RouterArgs(
        host=ns.host,
        port=ns.port,
        prefill=prefill,
        decode=decode,
        policy=ns.policy,
        request_timeout_secs=float(ns.request_timeout_secs),
        log_level=ns.log_level,
        mini_lb=ns.mini_lb,
        no_workers_after=ns.sim_no_workers_after,
    )


def maybe_wrap_ipv6(address: str) -> str:
    try:
        ipaddress.IPv6Address(address)
    except ValueError:
        return address
    return f"[{address}]"


def new_room(rng: random.Random) -> int:
    """A random 63-bit bootstrap room, as the mini-LB draws it."""
    return rng.randint(0, 2**63 - 1)


def batch_size(body: dict[str, Any]) -> int | None:
    """None for one prompt, else the batch size (the mini-LB's `_get_request_batch_size`)."""
    text = body.get("text")
    if text is not None:
        return None if isinstance(text, str) else len(text)
    ids = body.get("input_ids")
    if ids:
        return None if isinstance(ids[0], int) else len(ids)
    return None


@web.middleware
async def fastapi_errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """FastAPI's answer to a path (404) or method (405) with no route: `{"detail": reason}`."""
    try:
        return await handler(request)
    except (web.HTTPNotFound, web.HTTPMethodNotAllowed) as exc:
        return web.json_response({"detail": exc.reason}, status=exc.status)


class MiniLB:
    """The mini-LB's handlers over one shared HTTP client session."""

    def __init__(self, args: RouterArgs, *, rng: random.Random | None = None) -> None:
        self.args = args
        self.prefill_urls = [url for url, _ in args.prefill]
        self.bootstrap_ports = [port for _, port in args.prefill]
        self.decode_urls = list(args.decode)
        self.rng = rng or random.Random()
        self._session: aiohttp.ClientSession | None = None
        self.requests = 0

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0),
                timeout=aiohttp.ClientTimeout(total=self.args.request_timeout_secs),
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def app(self) -> web.Application:
        app = web.Application(client_max_size=512 * 1024 * 1024, middlewares=[fastapi_errors])
        r = app.router
        r.add_get("/health", self.health)
        r.add_get("/health_generate", self.health_generate)
        r.add_post("/flush_cache", self.flush_cache)
        r.add_get("/get_server_info", self.get_server_info)
        r.add_get("/get_model_info", self.model_info)
        r.add_get("/model_info", self.model_info)
        r.add_get("/v1/models", self.models)
        r.add_post("/generate", self.generate)
        r.add_post("/v1/completions", self.generate)
        r.add_post("/v1/chat/completions", self.generate)
        return app

    # ------------------------------------------------------------------ fan-out

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def _fan_out(self, method: str, path: str) -> bool:
        async def one(url: str) -> None:
            async with self.session.request(method, f"{url}{path}") as resp:
                await resp.read()

        results = await asyncio.gather(
            *(one(u) for u in [*self.prefill_urls, *self.decode_urls]), return_exceptions=True
        )
        failed = [r for r in results if isinstance(r, BaseException)]
        for exc in failed:
            logger.error(f"{method} {path} fan-out failed: {exc!r}")
        return not failed

    async def health_generate(self, request: web.Request) -> web.Response:
        ok = await self._fan_out("GET", "/health_generate")
        return web.Response(status=200 if ok else 500)

    async def flush_cache(self, request: web.Request) -> web.Response:
        ok = await self._fan_out("POST", "/flush_cache")
        return web.Response(status=200 if ok else 500)

    async def _json(self, url: str) -> Any:
        async with self.session.get(url) as resp:
            return await resp.json(content_type=None)

    async def get_server_info(self, request: web.Request) -> web.Response:
        try:
            prefill = [await self._json(f"{u}/get_server_info") for u in self.prefill_urls]
            decode = [await self._json(f"{u}/get_server_info") for u in self.decode_urls]
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            logger.error(f"get_server_info failed: {exc!r}")
            return web.Response(status=500, text="Internal Server Error")
        states = [s for info in decode for s in info.get("internal_states", [])]
        if not states:
            states = [{"last_gen_throughput": 0.0, "avg_spec_accept_length": None}]
        return web.json_response({"internal_states": states, "prefill": prefill, "decode": decode})

    async def model_info(self, request: web.Request) -> web.Response:
        target = self.prefill_urls[0]
        try:
            async with self.session.get(f"{target}/get_model_info") as resp:
                if resp.status != 200:
                    text = await resp.text()
                    return web.json_response(
                        {
                            "detail": f"Failed to get model info from {target}"
                            f"Status: {resp.status}, Response: {text}"
                        },
                        status=502,
                    )
                return web.json_response(await resp.json(content_type=None))
        except (aiohttp.ClientError, OSError):
            return web.json_response(
                {"detail": "Failed to get model info from backend"}, status=503
            )

    async def models(self, request: web.Request) -> web.Response:
        target = self.prefill_urls[0]
        try:
            async with self.session.get(f"{target}/v1/models") as resp:
                if resp.status != 200:
                    return web.json_response(
                        {"detail": f"Prefill server error: Status {resp.status}"},
                        status=resp.status,
                    )
                return web.json_response(await resp.json(content_type=None))
        except (aiohttp.ClientError, OSError) as exc:
            return web.json_response({"detail": f"Prefill server error: {exc}"}, status=500)

    # ------------------------------------------------------------------ generation

    def select_pair(self) -> tuple[str, int | None, str]:
        p = self.rng.randrange(len(self.prefill_urls))
        d = self.rng.randrange(len(self.decode_urls))
        return self.prefill_urls[p], self.bootstrap_ports[p], self.decode_urls[d]

    def with_bootstrap(
        self, body: dict[str, Any], *, prefill_url: str, bootstrap_port: int | None
    ) -> dict[str, Any]:
        """The body both servers get: the client's plus the bootstrap fields."""
        host = maybe_wrap_ipv6(urllib.parse.urlparse(prefill_url).hostname or "")
        out = dict(body)
        size = batch_size(body)
        if size is None:
            room = new_room(self.rng)
            out.update(bootstrap_host=host, bootstrap_port=bootstrap_port, bootstrap_room=room)
        else:
            out.update(
                bootstrap_host=[host] * size,
                bootstrap_port=[bootstrap_port] * size,
                bootstrap_room=[new_room(self.rng) for _ in range(size)],
            )
        return out

    async def _drain(self, resp: aiohttp.ClientResponse) -> None:
        with contextlib.suppress(aiohttp.ClientError, OSError, asyncio.CancelledError):
            await resp.read()
        resp.release()

    def no_workers(self) -> web.Response | None:
        """With --sim-no-workers-after, once that many requests came: sglang-router's answer
        when every worker's circuit is open (503), and its Rust log line (no [date] brackets:
        `2025-09-04 07:15:26 ERROR target: src/...rs:LINE: message`)."""
        self.requests += 1
        after = self.args.no_workers_after
        if after is None or self.requests <= after:
            return None
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        message = "No available workers (all circuits open or unhealthy)"
        print(
            f"{stamp} ERROR sglang_router_rs::routers::http::pd_router: "
            f"src/routers/http/pd_router.rs:597: {message}",
            flush=True,
        )
        return web.Response(status=503, text=message)

    async def generate(self, request: web.Request) -> web.StreamResponse:
        refused = self.no_workers()
        if refused is not None:
            return refused
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return web.json_response({"detail": "invalid JSON body"}, status=422)
        if not isinstance(body, dict):
            return web.json_response({"detail": "the JSON body must be an object"}, status=422)
        prefill_url, port, decode_url = self.select_pair()
        payload = self.with_bootstrap(body, prefill_url=prefill_url, bootstrap_port=port)
        path = request.path
        if body.get("stream"):
            return await self._stream(request, payload, prefill_url, decode_url, path)
        try:
            p_resp, d_resp = await asyncio.gather(
                self.session.post(f"{prefill_url}{path}", json=payload),
                self.session.post(f"{decode_url}{path}", json=payload),
            )
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            logger.error(f"POST {path} failed: {exc!r}")
            return web.Response(status=500, text="Internal Server Error")
        drain = asyncio.create_task(self._drain(p_resp))
        try:
            result = await d_resp.json(content_type=None)
        except (aiohttp.ClientError, OSError, ValueError, TimeoutError) as exc:
            logger.error(f"POST {path}: bad decode response: {exc!r}")
            return web.Response(status=500, text="Internal Server Error")
        finally:
            d_resp.release()
            await drain
        return web.json_response(result, status=d_resp.status)

    async def _stream(
        self,
        request: web.Request,
        payload: dict[str, Any],
        prefill_url: str,
        decode_url: str,
        path: str,
    ) -> web.StreamResponse:
        resp = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        try:
            p_resp, d_resp = await asyncio.gather(
                self.session.post(f"{prefill_url}{path}", json=payload),
                self.session.post(f"{decode_url}{path}", json=payload),
            )
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            logger.error(f"POST {path} (stream) failed: {exc!r}")
            return resp  # the client sees the stream end without [DONE]
        drain = asyncio.create_task(self._drain(p_resp))
        try:
            async for chunk in d_resp.content.iter_chunked(STREAM_CHUNK):
                await resp.write(chunk)
            await resp.write_eof()
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            logger.error(f"POST {path} (stream) broken: {exc!r}")
        finally:
            d_resp.release()
            await drain
        return resp


async def serve(args: RouterArgs) -> int:
    """Run the mini-LB until SIGTERM/SIGINT."""
    if args.policy != "random":
        logger.warning("[MiniLB] Overriding policy to random")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    lb = MiniLB(args)
    runner = web.AppRunner(lb.app(), access_log=None, shutdown_timeout=SHUTDOWN_TIMEOUT_S)
    await runner.setup()
    logger.info(f"Started server process [{os.getpid()}]")
    logger.info("Waiting for application startup.")
    logger.info("Application startup complete.")
    try:
        await web.TCPSite(runner, args.host, args.port, reuse_address=True).start()
    except OSError as exc:
        logger.error(
            f"[Errno {exc.errno}] error while attempting to bind on address "
            f"({args.host!r}, {args.port}): {exc.strerror}"
        )
        await runner.cleanup()
        return 1
    port = runner.addresses[0][1] if runner.addresses else args.port
    logger.info(f"{READY_LINE} http://{args.host}:{port} (Press CTRL+C to quit)")
    await stop.wait()
    logger.info("Shutting down")
    await runner.cleanup()
    await lb.close()
    logger.info(f"Finished server process [{os.getpid()}]")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: parse, log like the mini-LB, serve."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parse_args(argv)
    except RouterArgsError as exc:
        setup_logging()
        logger.error(f"ValueError: {exc}")
        return 1
    setup_logging(level=args.log_level)
    if not args.mini_lb:
        logger.warning(
            "servesweep.sim.router implements only the mini-LB; serving as with --mini-lb"
        )
    logger.warning(MINI_LB_WARNING)
    return asyncio.run(serve(args))


if __name__ == "__main__":
    raise SystemExit(main())
