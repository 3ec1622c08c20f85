"""The builtin client's fast paths: chunked stream reading, closed-loop dispatch, GC freeze."""

from __future__ import annotations

import asyncio
import gc
import json

import pytest
from aiohttp import web

from servesweep.measure.loadgen.builtin import (
    BenchOptions,
    Prompt,
    closed_loop,
    run_benchmark,
    send_request,
)
from servesweep.measure.loadgen.metrics import RequestResult


def event(text: str, n: int) -> bytes:
    meta = {"completion_tokens": n, "prompt_tokens": 7}
    return b"data: " + json.dumps({"text": text, "meta_info": meta}).encode() + b"\n\n"


async def serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


def stream_app(pieces: list[bytes]) -> web.Application:
    """/generate streams `pieces` as separate network writes, a little apart."""

    async def generate(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for piece in pieces:
            await resp.write(piece)
            await asyncio.sleep(0.01)
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/generate", generate)
    return app


async def post_stream(pieces: list[bytes]) -> RequestResult:
    import aiohttp

    runner, base = await serve(stream_app(pieces))
    try:
        async with aiohttp.ClientSession() as session:
            return await send_request(
                session=session,
                url=f"{base}/generate",
                prompt=Prompt(input_len=7, output_len=3, body=b"{}"),
                stream=True,
                timeout_s=10,
            )
    finally:
        await runner.cleanup()


def test_lines_split_across_network_chunks_parse_like_whole_lines():
    whole = event(" a", 1) + event(" a b", 2) + event(" a b c", 3) + b"data: [DONE]"
    # cut mid-line and mid-JSON; the last line has no newline (read at end of stream)
    pieces = [whole[:10], whole[10:70], whole[70:71], whole[71:-5], whole[-5:]]
    res = asyncio.run(post_stream(pieces))
    assert res.success and res.error == ""
    assert res.output_len == 3 and res.generated_text == " a b c"
    assert len(res.itl) == 2 and all(x >= 0 for x in res.itl)
    assert 0 < res.ttft <= res.latency
    assert res.prompt_len == 7


def test_error_line_in_a_later_chunk_fails_the_request():
    err = b'data: {"error": {"message": "boom"}}\n\n'
    res = asyncio.run(post_stream([event(" a", 1), err[:15], err[15:], b"data: [DONE]\n\n"]))
    assert not res.success and res.output_len == 0
    assert "mid-stream error" in res.error and "boom" in res.error


def test_closed_loop_keeps_order_and_the_cap():
    prompts = [Prompt(input_len=i, output_len=1, body=b"") for i in range(25)]
    started: list[int] = []
    in_flight = 0
    peak = 0
    done = []

    async def send(prompt: Prompt) -> RequestResult:
        nonlocal in_flight, peak
        started.append(prompt.input_len)
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.001 * (prompt.input_len % 4))  # uneven service times
        in_flight -= 1
        return RequestResult(input_len=prompt.input_len, prompt_len=prompt.input_len)

    results = asyncio.run(
        closed_loop(prompts, concurrency=4, send=send, done=lambda: done.append(1))
    )
    assert started == list(range(25))  # dispatched in prompt order
    assert peak == 4
    assert [r.input_len for r in results] == list(range(25))  # results in prompt order
    assert len(done) == 25


def counting_app() -> tuple[web.Application, dict[str, int]]:
    """A minimal SGLang-like server counting concurrent /generate requests."""
    seen = {"in_flight": 0, "peak": 0, "total": 0}

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"data": []})

    async def info(request: web.Request) -> web.Response:
        return web.json_response({"internal_states": [{"avg_spec_accept_length": None}]})

    async def generate(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        seen["in_flight"] += 1
        seen["total"] += 1
        seen["peak"] = max(seen["peak"], seen["in_flight"])
        try:
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            await asyncio.sleep(0.005)
            n = body["sampling_params"]["max_new_tokens"]
            await resp.write(event(" x" * n, n) + b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp
        finally:
            seen["in_flight"] -= 1

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_get("/server_info", info)
    app.router.add_post("/generate", generate)
    return app, seen


@pytest.mark.parametrize("rate", [float("inf"), 2000.0])
def test_run_benchmark_caps_concurrency_and_unfreezes_gc(rate):
    async def scenario() -> tuple[object, dict[str, int]]:
        app, seen = counting_app()
        runner, base = await serve(app)
        try:
            options = BenchOptions(
                base_url=base,
                input_len=16,
                output_len=2,
                range_ratio=1.0,
                num_prompts=40,
                max_concurrency=5,
                request_rate=rate,
                warmup_requests=0,
                disable_tqdm=True,
                ready_check_timeout_s=5,
            )
            return await run_benchmark(options), seen
        finally:
            await runner.cleanup()

    record, seen = asyncio.run(scenario())
    assert record["completed"] == 40 and seen["total"] == 40
    assert seen["peak"] <= 5
    assert gc.get_freeze_count() == 0
