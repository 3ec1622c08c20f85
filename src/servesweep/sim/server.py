"""SGLang's HTTP API on rank 0 (aiohttp): health, info, /generate, /v1/completions, metrics."""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

try:  # optional: 3x faster parsing of long input_ids bodies (zero-cost benchmarking)
    from orjson import loads as _loads
except ImportError:  # pragma: no cover - orjson is a test extra
    _loads = json.loads

from servesweep.sim.answers import Greedy, content_key, greedy
from servesweep.sim.engine import STAGE_BUCKETS_S, Engine, RequestStream, StageLatency
from servesweep.sim.logs import (
    DECODE_HANDSHAKE_FRAMES,
    disconnect_traceback,
    fatal_exit,
    scheduler_traceback,
)
from servesweep.sim.pd import (
    Bootstrap,
    DecodeReceiver,
    KVSender,
    KVTransferFailed,
    PDMismatch,
    PrefillBootstrap,
    bootstrap_of,
    bootstrap_timeout_s,
    waiting_timeout_s,
)
from servesweep.sim.scheduler import RequestRejected
from servesweep.sim.tokens import PromptCounter

logger = logging.getLogger(__name__)

VERSION = "0.5.23-sim"
DEFAULT_MAX_NEW_TOKENS = 128  # /generate sampling_params default (SGLang)
DEFAULT_MAX_TOKENS = 16  # /v1/completions default (OpenAI, SGLang)
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


class BadRequest(ValueError):
    """The request body is not something SGLang would accept."""


@dataclass(frozen=True)
class Faults:
    """Which counted requests (0-based arrival order) fail and how."""

    http_500_at: frozenset[int] = frozenset()
    midstream_error_at: frozenset[int] = frozenset()
    hang_at: frozenset[int] = frozenset()


@dataclass(frozen=True)
class Prompt:
    """A parsed request: prompt length, output budget, streaming, PD bootstrap fields."""

    prompt_tokens: int
    max_new_tokens: int
    stream: bool
    include_usage: bool = False
    model: str | None = None
    bootstrap: Bootstrap | None = None
    skip_special_tokens: bool = True
    # A request with return_logprob: the sim model's whole greedy answer (answers.py).
    answer: Greedy | None = None
    top_logprobs: int = 0


@dataclass
class PDContext:
    """A PD server's role and its transfer machinery (pd.py)."""

    mode: str  # "prefill" | "decode"
    default_bootstrap_port: int
    bootstrap: PrefillBootstrap | None = None
    sender: KVSender | None = None
    receiver: DecodeReceiver | None = None


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


class SimServer:
    """Request handlers and the health state of rank 0."""

    def __init__(
        self,
        *,
        args: dict[str, Any],
        engine: Engine,
        counter: PromptCounter,
        faults: Faults,
        launch_command: str,
        max_total_num_tokens: int,
        pd: PDContext | None = None,
    ) -> None:
        self.args = args
        self.pd = pd
        self.engine = engine
        self.counter = counter
        self.faults = faults
        self.launch_command = launch_command
        self.max_total_num_tokens = max_total_num_tokens
        self.ready = False
        self.stopping = False
        self.created = int(time.time())
        self._next_index = 0
        self._health_timeout_s = float(os.environ.get("SGLANG_HEALTH_CHECK_TIMEOUT", "20"))

    @property
    def model_name(self) -> str:
        return str(self.args["served_model_name"])

    def app(self) -> web.Application:
        """The aiohttp application with SGLang's routes (behind `--api-key` when set)."""
        middlewares = [api_key_middleware(self.args["api_key"])] if self.args.get("api_key") else []
        app = web.Application(client_max_size=256 * 1024 * 1024, middlewares=middlewares)
        r = app.router
        r.add_get("/health", self.health)
        r.add_get("/health_generate", self.health)
        r.add_get("/ready", self.ready_check)
        r.add_get("/v1/models", self.models)
        for path in ("/model_info", "/get_model_info"):
            r.add_get(path, self.model_info)
        for path in ("/server_info", "/get_server_info"):
            r.add_get(path, self.server_info)
        r.add_route("GET", "/flush_cache", self.flush_cache)
        r.add_route("POST", "/flush_cache", self.flush_cache)
        r.add_post("/generate", self.generate)
        r.add_post("/v1/completions", self.completions)
        r.add_get("/metrics", self.metrics)
        r.add_get("/v1/loads", self.loads)
        r.add_get("/get_load", self.get_load)
        return app

    # ------------------------------------------------------------------ info

    async def health(self, request: web.Request) -> web.Response:
        if not self.ready or self.stopping:
            # uvicorn's access line, as real SGLang logs each probe before its ready line
            peer = request.remote or "127.0.0.1"
            logger.info(f'INFO:     {peer} - "GET {request.path} HTTP/1.1" 503 Service Unavailable')
            return web.Response(status=503)
        ok = await self.engine.probe(timeout_s=self._health_timeout_s)
        return web.Response(status=200 if ok and not self.stopping else 503)

    async def ready_check(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.ready and not self.stopping else 503)

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": self.model_name,
                        "object": "model",
                        "created": self.created,
                        "owned_by": "sglang",
                        "root": self.model_name,
                        "max_model_len": self.engine.scheduler.policy.context_length,
                    }
                ],
            }
        )

    async def model_info(self, request: web.Request) -> web.Response:
        a = self.args
        return web.json_response(
            {
                "model_path": a["model_path"],
                "served_model_name": a["served_model_name"],
                "tokenizer_path": a["tokenizer_path"],
                "is_generation": True,
                "preferred_sampling_params": None,
                "weight_version": "default",
                "load_format": "auto",
                "reasoning_parser": None,
                "tool_call_parser": None,
                "disaggregation_mode": a["disaggregation_mode"],
                "has_image_understanding": False,
                "has_audio_understanding": False,
                "model_type": "sim",
                "architectures": ["SimForCausalLM"],
            }
        )

    def server_info_dict(self) -> dict[str, Any]:
        """Resolved args + launch command + scheduler facts, as SGLang's /server_info."""
        policy = self.engine.scheduler.policy
        states = [
            {
                "last_gen_throughput": self.engine.stats.last_gen_throughput,
                "avg_spec_accept_length": None,
            }
            for _ in range(max(1, int(self.args["dp_size"])))
        ]
        return {
            **self.args,
            "launch_command": self.launch_command,
            "max_total_num_tokens": self.max_total_num_tokens,
            "max_req_input_len": policy.context_length - 1,
            "internal_states": states,
            "version": VERSION,
            "frontend": "servesweep.sim",
        }

    async def server_info(self, request: web.Request) -> web.Response:
        return web.json_response(self.server_info_dict())

    async def flush_cache(self, request: web.Request) -> web.Response:
        if self.engine.idle:
            logger.info("Cache flushed successfully!")  # SGLang's scheduler line
            return web.Response(
                status=200,
                text="Cache flushed.\nPlease check backend logs for more details. "
                "(When there are running or waiting requests, the operation will not be "
                "performed.)\n",
            )
        return web.Response(
            status=400,
            text="Cache not flushed. Please check backend logs for more details. "
            "(When there are running or waiting requests, the operation will not be "
            "performed.)\n",
        )

    async def loads(self, request: web.Request) -> web.Response:
        """SGLang's `/v1/loads` (newer versions): per-DP running and waiting requests."""
        sched = self.engine.scheduler
        load = {
            "dp_rank": 0,
            "num_running_reqs": len(sched.running),
            "num_waiting_reqs": len(sched.waiting),
            "num_used_tokens": 0,
            "token_usage": sched.token_usage,
        }
        return web.json_response(
            {
                "timestamp": datetime.now(UTC).isoformat(),
                "version": VERSION,
                "accelerator": "sim",
                "num_accelerators": 1,
                "loads": [load],
            }
        )

    async def get_load(self, request: web.Request) -> web.Response:
        """SGLang's /get_load: requests held per DP rank (the simulated GPU power follows it)."""
        sched = self.engine.scheduler
        waiting = len(sched.waiting)
        return web.json_response(
            [{"dp_rank": 0, "num_reqs": len(sched.running) + waiting, "num_waiting_reqs": waiting}]
        )

    async def metrics(self, request: web.Request) -> web.Response:
        if not self.args.get("enable_metrics"):
            return web.Response(status=404, text="Not Found")
        sched, stats, disagg = self.engine.scheduler, self.engine.stats, self.engine.disagg
        label = f'{{model_name="{self.model_name}"}}'
        rows = [
            ("num_running_reqs", "gauge", "The number of running requests.", len(sched.running)),
            ("num_queue_reqs", "gauge", "The number of requests in the waiting queue.",
             len(sched.waiting)),
            ("gen_throughput", "gauge", "The generation throughput (token/s).",
             stats.last_gen_throughput),
            ("token_usage", "gauge", "The token usage.", sched.token_usage),
            ("cache_hit_rate", "gauge", "The prefix cache hit rate.", 0.0),
            ("kv_used_tokens", "gauge", "KV cache tokens in use.", sched.kv_used),
            ("num_prefill_bootstrap_queue_reqs", "gauge", "Requests in the bootstrap queue.",
             disagg.bootstrap if disagg else 0),
            ("num_prefill_inflight_queue_reqs", "gauge", "Requests in the inflight queue.",
             disagg.inflight if disagg else 0),
            ("num_decode_prealloc_queue_reqs", "gauge", "Requests in the prealloc queue.",
             disagg.prealloc if disagg else 0),
            ("num_decode_transfer_queue_reqs", "gauge", "Requests in the transfer queue.",
             disagg.transfer if disagg else 0),
            ("prompt_tokens_total", "counter", "Number of prefill tokens processed.",
             stats.prompt_tokens_total),
            ("generation_tokens_total", "counter", "Number of generation tokens processed.",
             stats.generation_tokens_total),
            ("num_requests_total", "counter", "Number of requests processed.",
             stats.requests_total),
        ]  # fmt: skip
        lines = []
        for name, kind, help_text, value in rows:
            lines += [
                f"# HELP sglang:{name} {help_text}",
                f"# TYPE sglang:{name} {kind}",
                f"sglang:{name}{label} {float(value)}",
            ]
        lines += ["# HELP sglang:realtime_tokens_total Tokens computed, per forward pass.",
                  "# TYPE sglang:realtime_tokens_total counter"]  # fmt: skip
        for mode, value in (
            ("prefill_compute", stats.realtime_prefill_tokens),
            ("decode", stats.realtime_decode_tokens),
        ):
            lines.append(
                f'sglang:realtime_tokens_total{{mode="{mode}",{label[1:-1]}}} {float(value)}'
            )
        lines += stage_histogram(stats.stages, labels=label[1:-1])
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    # ------------------------------------------------------------------ generation

    def _count_text(self, text: Any) -> int:
        if isinstance(text, str):
            return self.counter.count(text)
        if isinstance(text, list) and len(text) == 1 and isinstance(text[0], str):
            return self.counter.count(text[0])
        raise BadRequest("batched or non-string prompts are not supported by the simulator")

    @staticmethod
    def _count_ids(ids: Any) -> int:
        # sum() is a C loop: it raises on strings, None and lists, and gives a float when any
        # id is a float, so an int total means every id is an integer.
        if isinstance(ids, list):
            try:
                if isinstance(sum(ids), int):
                    return len(ids)
            except TypeError:
                pass
        raise BadRequest("input_ids must be a list of integers (batches are not supported)")

    def _parse_generate(self, body: dict[str, Any]) -> Prompt:
        if body.get("input_ids") is not None:
            n = self._count_ids(body["input_ids"])
        elif body.get("text") is not None:
            n = self._count_text(body["text"])
        else:
            raise BadRequest("Either text or input_ids should be provided.")
        params = body.get("sampling_params") or {}
        if not isinstance(params, dict):
            raise BadRequest("sampling_params must be an object")
        max_new = _int(params.get("max_new_tokens", DEFAULT_MAX_NEW_TOKENS))
        stream = bool(body.get("stream"))
        top_k = _int(body.get("top_logprobs_num") or 0)
        answer = None
        if body.get("return_logprob"):
            answer = greedy(
                key=content_key(body),
                length=max_new,
                runner=str(self.args.get("moe_runner_backend")),
                corrupt=bool(self.args.get("sim_corrupt")),
                top_k=top_k,
            )
        return Prompt(
            prompt_tokens=n,
            max_new_tokens=max_new,
            stream=stream,
            bootstrap=self._bootstrap(body),
            skip_special_tokens=bool(params.get("skip_special_tokens", True)),
            answer=answer,
            top_logprobs=top_k,
        )

    def _bootstrap(self, body: dict[str, Any]) -> Bootstrap | None:
        if self.pd is None:
            return None
        try:
            return bootstrap_of(body, default_port=self.pd.default_bootstrap_port)
        except ValueError as exc:
            raise BadRequest(str(exc)) from None

    def _parse_completion(self, body: dict[str, Any]) -> Prompt:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and all(isinstance(i, int) for i in prompt):
            n = len(prompt)
        elif prompt is not None:
            n = self._count_text(prompt)
        else:
            raise BadRequest("prompt is required")
        options = body.get("stream_options") or {}
        return Prompt(
            prompt_tokens=n,
            max_new_tokens=_int(body.get("max_tokens") or DEFAULT_MAX_TOKENS),
            stream=bool(body.get("stream")),
            include_usage=bool(isinstance(options, dict) and options.get("include_usage")),
            model=body.get("model"),
            bootstrap=self._bootstrap(body),
            skip_special_tokens=bool(body.get("skip_special_tokens", True)),
        )

    async def _read(self, request: web.Request) -> dict[str, Any]:
        try:
            body = _loads(await request.read())
        except (json.JSONDecodeError, UnicodeDecodeError, ValueError) as exc:
            raise BadRequest(f"invalid JSON body: {exc}") from None
        if not isinstance(body, dict):
            raise BadRequest("the JSON body must be an object")
        return body

    async def _admit(
        self, request: web.Request, *, openai: bool
    ) -> tuple[int | None, Prompt] | web.StreamResponse:
        """Parse the body, assign the arrival index, apply hang/500 faults. A request that asks
        for logprobs (the equivalence probe) gets no index, as a health check gets none: the
        faults' indices and the crash count the measured traffic only."""
        if not self.ready or self.stopping:
            return _error(503, "The server is not ready.", openai=openai)
        try:
            body = await self._read(request)
            prompt = self._parse_completion(body) if openai else self._parse_generate(body)
        except BadRequest as exc:
            return _error(400, str(exc), openai=openai)
        if prompt.answer is not None:
            return None, prompt
        index = self._next_index
        self._next_index += 1
        if index in self.faults.hang_at:
            logger.warning(f"Request #{index} will never be answered (--sim-hang-at).")
            await asyncio.Event().wait()
        if index in self.faults.http_500_at:
            logger.warning(f"Request #{index}: injected HTTP 500 (--sim-http-500-at).")
            await self._fail_room(request, reason=f"injected HTTP 500 for request #{index}")
            return _error(500, f"Injected internal error for request #{index}.", openai=openai)
        return index, prompt

    async def _fail_room(self, request: web.Request, *, reason: str) -> None:
        """Prefill: a request that fails before it starts fails its room too, so the decode
        side learns it at once (as SGLang's KV sender reports KVPoll.Failed)."""
        if self.pd is None or self.pd.bootstrap is None:
            return
        try:
            body = await request.json()
            room = int(body["bootstrap_room"])
        except (ValueError, KeyError, TypeError, UnicodeDecodeError):
            return
        self.pd.bootstrap.room(room).resolve({"status": "failed", "reason": reason})

    def _submit(self, prompt: Prompt) -> RequestStream:
        return self.engine.submit(
            prompt_tokens=prompt.prompt_tokens,
            max_new_tokens=prompt.max_new_tokens,
            counted=prompt.answer is None,
            skip_special_tokens=prompt.skip_special_tokens,
            tokens=prompt.answer.tokens if prompt.answer else None,
        )

    async def _start(self, prompt: Prompt, *, openai: bool) -> RequestStream | web.Response:
        """Queue the request; a decode server first waits for its KV cache from prefill."""
        if self.pd is None or self.pd.mode != "decode":
            try:
                return self._submit(prompt)
            except RequestRejected as exc:
                return _error(400, str(exc), openai=openai)
        arrival = asyncio.get_running_loop().time()
        first_token = None
        bootstrap = prompt.bootstrap
        if bootstrap is not None and not bootstrap.fake:
            receiver, queues = self.pd.receiver, self.engine.disagg
            assert receiver is not None and queues is not None
            queues.prealloc += 1
            try:
                await receiver.ensure_parallel_info(bootstrap.addr)
            except PDMismatch as exc:
                fatal_exit(
                    message=scheduler_traceback(
                        error=f"RuntimeError: {exc}", frames=DECODE_HANDSHAKE_FRAMES
                    )
                )
            finally:
                queues.prealloc -= 1
            loop = asyncio.get_running_loop()
            bootstrapped = loop.time()
            if prompt.answer is None:
                self.engine.stats.observe_stage("decode_bootstrap", bootstrapped - arrival)
            queues.transfer += 1
            queues.preallocated_tokens += prompt.prompt_tokens
            try:
                outcome = await receiver.receive(bootstrap, timeout_s=waiting_timeout_s())
            except KVTransferFailed as exc:
                logger.error(f"Abort request (room={bootstrap.room}): {exc}")
                return _error(500, str(exc), openai=openai)
            finally:
                queues.transfer -= 1
                queues.preallocated_tokens -= prompt.prompt_tokens
            if prompt.answer is None:
                self.engine.stats.observe_stage("decode_transferred", loop.time() - bootstrapped)
            first_token = outcome.get("first_token_id")
        try:
            return self.engine.submit(
                prompt_tokens=prompt.prompt_tokens,
                max_new_tokens=prompt.max_new_tokens,
                counted=prompt.answer is None,
                prefilled=prompt.prompt_tokens,
                first_token=first_token if isinstance(first_token, int) else None,
                arrival_wall=arrival,
                skip_special_tokens=prompt.skip_special_tokens,
                tokens=prompt.answer.tokens if prompt.answer else None,
            )
        except RequestRejected as exc:
            return _error(400, str(exc), openai=openai)

    async def generate(self, request: web.Request) -> web.StreamResponse:
        admitted = await self._admit(request, openai=False)
        if isinstance(admitted, web.StreamResponse):
            return admitted
        index, prompt = admitted
        if self.pd is not None and self.pd.mode == "prefill":
            return await self._prefill_only(request, index=index, prompt=prompt, openai=False)
        started = await self._start(prompt, openai=False)
        if isinstance(started, web.StreamResponse):
            return started
        stream = started
        midstream = index in self.faults.midstream_error_at
        if not prompt.stream:
            return await self._generate_whole(stream, prompt, midstream=midstream, index=index)

        async def write_events(resp: web.StreamResponse) -> None:
            sent = -1
            while True:
                await stream.wait_change()
                if midstream:
                    await self._midstream_error(resp, stream, index=index)
                    break
                if len(stream.output_ids) > sent or stream.finished:
                    sent = len(stream.output_ids)
                    await resp.write(_sse(self._generate_chunk(stream, prompt)))
                if stream.finished:
                    await resp.write(SSE_DONE)
                    break

        return await self._stream_response(request, stream, write_events)

    async def _stream_response(
        self,
        request: web.Request,
        stream: RequestStream,
        write_events: Callable[[web.StreamResponse], Awaitable[None]],
    ) -> web.StreamResponse:
        """An SSE response with the events `write_events` writes: a client that disconnects or
        a cancelled handler aborts the request."""
        resp = web.StreamResponse(status=200, headers=SSE_HEADERS)
        try:
            await resp.prepare(request)
            await write_events(resp)
            await resp.write_eof()
        except ConnectionError:
            self._client_gone(stream)
            return resp
        except asyncio.CancelledError:
            self.engine.abort(stream)
            raise
        return resp

    async def _generate_whole(
        self, stream: RequestStream, prompt: Prompt, *, midstream: bool, index: int
    ) -> web.Response:
        while not stream.finished:
            await stream.wait_change()
            if midstream:
                self.engine.abort(stream)
                logger.warning(f"Request #{index}: injected error (--sim-midstream-error-at).")
                return _error(400, f"Injected error for request #{index}.", openai=False)
        return web.json_response(self._generate_chunk(stream, prompt))

    async def _midstream_error(
        self, resp: web.StreamResponse, stream: RequestStream, *, index: int
    ) -> None:
        self.engine.abort(stream)
        logger.warning(f"Request #{index}: injected mid-stream error (--sim-midstream-error-at).")
        error = {
            "message": f"Injected mid-stream error for request #{index}.",
            "type": "InternalServerError",
            "code": 500,
            "retryable": False,
        }
        await resp.write(_sse({"error": error}))
        await resp.write(SSE_DONE)

    def _generate_chunk(self, stream: RequestStream, prompt: Prompt) -> dict[str, Any]:
        n = len(stream.output_ids)
        meta: dict[str, Any] = {
            "id": stream.rid,
            "finish_reason": {"type": "length", "length": n} if stream.finished else None,
            "prompt_tokens": prompt.prompt_tokens,
            "weight_version": "default",
            "num_retractions": 0,
            "reasoning_tokens": 0,
            "completion_tokens": n,
            "cached_tokens": 0,
        }
        if stream.finished:
            meta["e2e_latency"] = stream.e2e_latency
        if prompt.answer is not None:
            meta.update(prompt.answer.meta(n, prompt.top_logprobs))
        return {"text": stream.text, "output_ids": list(stream.output_ids), "meta_info": meta}

    async def completions(self, request: web.Request) -> web.StreamResponse:
        admitted = await self._admit(request, openai=True)
        if isinstance(admitted, web.StreamResponse):
            return admitted
        index, prompt = admitted
        if self.pd is not None and self.pd.mode == "prefill":
            return await self._prefill_only(request, index=index, prompt=prompt, openai=True)
        started = await self._start(prompt, openai=True)
        if isinstance(started, web.StreamResponse):
            return started
        stream = started
        midstream = index in self.faults.midstream_error_at
        cid = f"cmpl-{uuid.uuid4().hex}"
        model = prompt.model or self.model_name
        if not prompt.stream:
            while not stream.finished:
                await stream.wait_change()
                if midstream:
                    self.engine.abort(stream)
                    return _error(400, f"Injected error for request #{index}.", openai=True)
            choice = {
                "index": 0,
                "text": stream.text,
                "logprobs": None,
                "finish_reason": "length",
                "matched_stop": None,
            }
            return web.json_response(
                {
                    "id": cid,
                    "object": "text_completion",
                    "created": int(time.time()),
                    "model": model,
                    "choices": [choice],
                    "usage": _usage(stream),
                }
            )

        async def write_events(resp: web.StreamResponse) -> None:
            sent = 0
            while True:
                await stream.wait_change()
                if midstream:
                    await self._midstream_error(resp, stream, index=index)
                    break
                delta = stream.text[sent:]
                sent = len(stream.text)
                if delta or stream.finished:
                    chunk = {
                        "id": cid,
                        "object": "text_completion",
                        "created": int(time.time()),
                        "model": model,
                        "choices": [
                            {
                                "index": 0,
                                "text": delta,
                                "logprobs": None,
                                "finish_reason": "length" if stream.finished else None,
                                "matched_stop": None,
                            }
                        ],
                        "usage": None,
                    }
                    await resp.write(_sse(chunk))
                if stream.finished:
                    if prompt.include_usage:
                        usage = {
                            "id": cid,
                            "object": "text_completion",
                            "created": int(time.time()),
                            "model": model,
                            "choices": [],
                            "usage": _usage(stream),
                        }
                        await resp.write(_sse(usage))
                    await resp.write(SSE_DONE)
                    break

        return await self._stream_response(request, stream, write_events)

    async def _prefill_only(
        self, request: web.Request, *, index: int | None, prompt: Prompt, openai: bool
    ) -> web.StreamResponse:
        """A prefill server's request: wait for the decode side (bootstrap queue), prefill,
        sample the first token, transfer the KV cache, answer with that one token."""
        assert self.pd is not None and self.pd.bootstrap is not None
        loop = asyncio.get_running_loop()
        arrival = loop.time()
        bootstrap = prompt.bootstrap
        room = None
        queues = self.engine.disagg
        assert queues is not None
        if bootstrap is not None and not bootstrap.fake:
            room = self.pd.bootstrap.room(bootstrap.room)
            timeout = bootstrap_timeout_s()
            queues.bootstrap += 1
            try:
                await asyncio.wait_for(room.registered.wait(), timeout)
            except TimeoutError:
                message = (
                    f"KVTransferError(bootstrap_room={bootstrap.room}): Request timed out "
                    f"after {timeout:.1f}s in KVPoll.Bootstrapping"
                )
                logger.error(message)
                room.resolve({"status": "failed", "reason": message})
                self.pd.bootstrap.drop(bootstrap.room)
                return _error(500, message, openai=openai)
            finally:
                queues.bootstrap -= 1
            if prompt.answer is None:
                self.engine.stats.observe_stage("prefill_bootstrap", loop.time() - arrival)
        try:
            stream = self.engine.submit(
                prompt_tokens=prompt.prompt_tokens,
                max_new_tokens=1,
                counted=prompt.answer is None,
                arrival_wall=arrival,
            )
        except RequestRejected as exc:
            if room is not None:
                room.resolve({"status": "failed", "reason": str(exc)})
            return _error(400, str(exc), openai=openai)
        try:  # prefilled, the request is in the inflight queue until its KV cache left
            while not stream.finished:
                await stream.wait_change()
                if index in self.faults.midstream_error_at:
                    self.engine.abort(stream)
                    logger.warning(f"Request #{index}: injected error (--sim-midstream-error-at).")
                    message = f"Injected error for request #{index}."
                    if room is not None:
                        room.resolve({"status": "failed", "reason": message})
                    return _error(500, message, openai=openai)
            first = stream.output_ids[0] if stream.output_ids else None
            if room is not None:
                assert self.pd.sender is not None and bootstrap is not None
                sending = loop.time()
                await self.pd.sender.send(
                    room=bootstrap.room,
                    tokens=prompt.prompt_tokens,
                    peer=room.peer,
                    decode_tp=room.decode_tp,
                )
                if stream.counted:
                    stats = self.engine.stats
                    stats.observe_stage("prefill_transfer_kv_cache", loop.time() - sending)
                room.resolve(
                    {
                        "status": "ok",
                        "room": bootstrap.room,
                        "tokens": prompt.prompt_tokens,
                        "first_token_id": first,
                    }
                )
        finally:
            if not stream.finished:  # the handler was cancelled mid-prefill
                self.engine.abort(stream)
            self.engine.transfer_done(stream)
        if openai:
            body: dict[str, Any] = {
                "id": f"cmpl-{uuid.uuid4().hex}",
                "object": "text_completion",
                "created": int(time.time()),
                "model": prompt.model or self.model_name,
                "choices": [
                    {
                        "index": 0,
                        "text": stream.text,
                        "logprobs": None,
                        "finish_reason": "length",
                        "matched_stop": None,
                    }
                ],
                "usage": _usage(stream),
            }
        else:
            body = self._generate_chunk(stream, prompt)
        if not prompt.stream:
            return web.json_response(body)
        resp = web.StreamResponse(status=200, headers=SSE_HEADERS)
        try:
            await resp.prepare(request)
            await resp.write(_sse(body))
            await resp.write(SSE_DONE)
            await resp.write_eof()
        except ConnectionError:
            pass
        return resp

    def _client_gone(self, stream: RequestStream) -> None:
        """The client closed the connection mid-stream: abort quietly, like SGLang."""
        self.engine.abort(stream)
        logger.info(f"Abort request {stream.rid}: the client disconnected.")
        if self.engine.noise.enabled:
            logger.error(disconnect_traceback(rid=stream.rid, task=990000 + stream.seq))


# SGLang's auth (srt/utils/auth.py): probes and scraping need no key.
OPEN_PREFIXES = ("/health", "/ready", "/metrics")


def stage_histogram(stages: dict[str, StageLatency], *, labels: str) -> list[str]:
    """sglang:per_stage_req_latency_seconds as SGLang prints it: per stage label, cumulative
    buckets (STAGE_BUCKETS_S, then +Inf), _sum and _count."""
    name = "sglang:per_stage_req_latency_seconds"
    lines = [f"# HELP {name} The latency of each stage of requests.", f"# TYPE {name} histogram"]
    for stage, hist in sorted(stages.items()):
        tags = f'{labels},stage="{stage}"'
        held = 0
        for le, n in zip(STAGE_BUCKETS_S, hist.buckets, strict=True):
            held += n
            lines.append(f'{name}_bucket{{{tags},le="{le!r}"}} {float(held)}')
        lines.append(f'{name}_bucket{{{tags},le="+Inf"}} {float(hist.count)}')
        lines.append(f"{name}_sum{{{tags}}} {hist.total_s!r}")
        lines.append(f"{name}_count{{{tags}}} {float(hist.count)}")
    return lines


def api_key_middleware(key: str) -> Any:
    """SGLang's `--api-key`: every other request needs `Authorization: Bearer <key>`, else 401
    `{"error": "Unauthorized"}` before any handler runs (nothing is counted or queued)."""

    @web.middleware
    async def check(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.method == "OPTIONS" or request.path.startswith(OPEN_PREFIXES):
            return await handler(request)
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token, key):
            return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    return check


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise BadRequest(f"max_new_tokens/max_tokens must be a non-negative integer, got {value!r}")
    return value


def _usage(stream: RequestStream) -> dict[str, int]:
    prompt, completion = stream.req.prompt_tokens, len(stream.output_ids)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _error(status: int, message: str, *, openai: bool) -> web.Response:
    """SGLang's error bodies: OpenAI shape for /v1/*, {"error": {...}} for /generate."""
    kind = {400: "BadRequestError", 500: "InternalServerError", 503: "ServiceUnavailableError"}
    if openai:
        body: dict[str, Any] = {
            "object": "error",
            "message": message,
            "type": kind.get(status, "Error"),
            "param": None,
            "code": status,
        }
    else:
        body = {"error": {"message": message, "type": kind.get(status, "Error"), "code": status}}
    return web.json_response(body, status=status)
