"""Builtin load generator: bench_serving's CLI subset and record, over one aiohttp pool."""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import math
import os
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
from tqdm import tqdm

from servesweep.core.errors import ClientError
from servesweep.measure.loadgen import API_KEY_ENV
from servesweep.measure.loadgen.metrics import RequestResult, build_record, record_line
from servesweep.measure.loadgen.selfcheck import SelfCheck

try:  # orjson parses bench's cumulative chunks ~2x faster; same results as json
    from orjson import dumps as _orjson_dumps
    from orjson import loads as _loads
except ImportError:  # pragma: no cover - orjson is optional
    _orjson_dumps = None
    _loads = json.loads

log = logging.getLogger(__name__)

# Deliberate differences from bench_serving 0.5.23 (same CLI subset, same record keys):
# - prompts are always sent as `input_ids` (no tokenizer): same ids as bench --tokenize-prompt
#   when --vocab-size equals the tokenizer's vocab_size; `total_output_tokens_retokenized`
#   is the server's count (the record says so with the extra key "client"), except against
#   the sim (/server_info version "*-sim"), whose word-level text it re-counts;
# - TTFT is also stamped by a first chunk whose text is empty but whose completion_tokens
#   grew (a special token): bench leaves ttft 0 for a 1-token output that decodes to "";
# - a `data: {"error": ...}` line fails the request with that text (bench: silent success);
#   HTTP errors read "HTTP <status> <reason>: <body>", exceptions "<Type>: <message>";
# - one ClientSession with a keep-alive pool (bench opens a session per request);
# - with --max-concurrency and request rate inf, `concurrency` workers take the prompts in
#   order (bench creates every task up front and queues them on a semaphore: the same dispatch
#   order, without thousands of waiting tasks for the garbage collector to walk);
# - the 1 s pause before the measured run only follows warmup requests; one /server_info
#   call, inside `duration` as bench's first call is;
# - nothing completed -> no record and exit 1 (bench writes NaN metrics);
# - the payload is input_ids + sampling_params + stream only (no lora/logprob defaults);
# - a streamed chunk's cumulative `output_ids` are skipped, not decoded (`decode_chunk`): a
#   malformed id list would fail bench's request, not ours;
# - the request timeout is asyncio's, around the request (bench: aiohttp's session timeout).

DEFAULT_PORT = 30000
READ_BUFSIZE = 10 * 1024**2  # bench's aiohttp read buffer: long cumulative SSE lines
DEFAULT_REQUEST_TIMEOUT_S = 6 * 60 * 60.0  # bench's session timeout
SETTLE_S = 1.0  # bench sleeps this long between warmup and the measured run
WARMUP_MAX_OUTPUT = 32
INFO_TIMEOUT_S = 30.0  # GET /server_info after the run
JSON_HEADERS = {"Content-Type": "application/json"}


@dataclass(frozen=True)
class BenchOptions:
    """One benchmark invocation (the CLI flags, bench_serving's names in comments)."""

    base_url: str
    input_len: int = 1024  # --random-input-len
    output_len: int = 1024  # --random-output-len
    range_ratio: float = 0.0  # --random-range-ratio
    num_prompts: int = 1000
    max_concurrency: int | None = None
    request_rate: float = math.inf
    seed: int = 42
    warmup_requests: int = 1
    stream: bool = True  # not --disable-stream
    tag: str | None = None
    vocab_size: int = 32000  # builtin only: bench takes it from the tokenizer
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S  # builtin only
    ready_check_timeout_s: float = 60.0
    disable_tqdm: bool = False
    backend: str = "sglang"
    dataset_name: str = "random-ids"
    extra_request_body: dict[str, Any] = field(default_factory=dict)  # merged into each payload
    self_check: bool = True  # builtin only: CPU, event-loop lag, GC pauses (loadgen.selfcheck)


@dataclass(frozen=True)
class Prompt:
    """One request to send: its intended lengths and its encoded JSON body."""

    input_len: int
    output_len: int
    body: bytes


def random_lens(*, rng: np.random.RandomState, full_len: int, ratio: float, num: int) -> list[int]:
    """bench's `compute_random_lens`: U[max(int(L*ratio), 1), L], drawn even when ratio is 1."""
    return rng.randint(max(int(full_len * ratio), 1), full_len + 1, size=num).tolist()


@dataclass(frozen=True)
class Row:
    """One random-ids dataset row: ids are `(first_id + j) % vocab_size` for j < input_len."""

    first_id: int
    input_len: int
    output_len: int

    def input_ids(self, vocab_size: int) -> list[int]:
        return ((self.first_id + np.arange(self.input_len)) % vocab_size).tolist()


def sample_rows(
    *,
    rng: np.random.RandomState,
    num_prompts: int,
    input_len: int,
    output_len: int,
    range_ratio: float,
    vocab_size: int,
) -> list[Row]:
    """bench's random-ids sampling: the same RNG draws in the same order, so the same ids."""
    input_lens = random_lens(rng=rng, full_len=input_len, ratio=range_ratio, num=num_prompts)
    output_lens = random_lens(rng=rng, full_len=output_len, ratio=range_ratio, num=num_prompts)
    offsets = rng.randint(0, vocab_size, size=num_prompts)
    return [
        Row(first_id=int(offsets[i]) + i, input_len=n, output_len=out)
        for i, (n, out) in enumerate(zip(input_lens, output_lens, strict=True))
    ]


def request_body(
    *, input_ids: list[int], output_len: int, stream: bool, extra: dict[str, Any] | None = None
) -> bytes:
    """The `/generate` payload the builtin sends (bench's sglang payload, minus defaults);
    `extra` (--extra-request-body) replaces top-level keys, as in bench."""
    payload = {
        "input_ids": input_ids,
        "sampling_params": {"temperature": 0.0, "max_new_tokens": output_len, "ignore_eos": True},
        "stream": stream,
        **(extra or {}),
    }
    if _orjson_dumps is not None:  # same compact JSON, ~10x faster for long id lists
        return _orjson_dumps(payload)
    return json.dumps(payload, separators=(",", ":")).encode()


def _error_text(error: Any) -> str:
    return "mid-stream error: " + (error if isinstance(error, str) else json.dumps(error))


_TEXT_FIRST = b'{"text":'
_IDS_KEY = b'"output_ids":'


def decode_chunk(line: bytes) -> Any:
    """`_loads(line)`, except that a chunk shaped `{"text": ..., "output_ids": [...], ...}`
    (SGLang's and the sim's) comes back without `output_ids`, which the parser never reads: they
    are cumulative, and decoding them into ints was most of the JSON work per token. The ids
    are skipped, not checked; any other shape is decoded whole."""
    ids = line.find(_IDS_KEY) if line.startswith(_TEXT_FIRST) else -1
    comma = line.rfind(b",", 0, ids)  # between the text and the ids
    end = line.find(b"]", ids)  # a flat list of ints holds no other `]`
    if (
        comma > len(_TEXT_FIRST)
        and end > 0
        and line[end + 1 : end + 2] == b","
        and (
            line.startswith(b"[", ids + len(_IDS_KEY))
            or line.startswith(b" [", ids + len(_IDS_KEY))
        )
    ):
        # A JSON string holds no unescaped quote, so the first `"output_ids":` is a key. Both
        # parts decode only if it is the top level's, right after the text: before it, the text
        # must be one value; after it, an id list with nested lists or strings, or a nested
        # `"output_ids":`, leaves a tail that does not decode. Else: decode the whole line.
        try:
            text = _loads(line[len(_TEXT_FIRST) : comma])
            data = _loads(b"{" + line[end + 2 :])
        except ValueError:
            return _loads(line)
        if data and "text" not in data and "output_ids" not in data:  # `,}`, repeated keys
            data["text"] = text
            return data
    return _loads(line)


def parse_lines(lines: list[bytes], times: list[float], res: RequestResult) -> None:
    """Apply bench's stream parser to received lines (for tests; the client parses inline)."""
    state = _StreamState(res)
    for line, now in zip(lines, times, strict=True):
        if not state.feed(line, now):
            return
    state.finish()


class _StreamState:
    """bench_serving's `async_request_sglang_generate` parser, one line at a time."""

    __slots__ = ("res", "st", "ttft", "last_ts", "last_len", "text", "output_len", "latency")

    def __init__(self, res: RequestResult) -> None:
        self.res = res
        self.st = res.start_time
        self.ttft = 0.0
        self.last_ts = res.start_time
        self.last_len = 0
        self.text = ""
        self.output_len = res.output_len
        self.latency = 0.0

    def feed(self, raw: bytes, now: float) -> bool:
        """Consume one line received at `now`; False if it was an error line (stop reading)."""
        line = raw.strip()
        if not line:
            return True
        self.latency = now - self.st
        if line.startswith(b"data: "):
            line = line[6:]
        if line == b"[DONE]":
            return True
        data = decode_chunk(line)
        if "error" in data:
            self.res.error = _error_text(data["error"])
            return False
        meta = data.get("meta_info") or {}
        if meta.get("prompt_tokens"):
            self.res.prompt_len = meta["prompt_tokens"]
        text = data.get("text")
        if text:
            output_len = meta["completion_tokens"]
            self.text = text
            self.output_len = output_len
            if self.ttft == 0.0:
                self.ttft = now - self.st
            else:
                new = output_len - self.last_len
                if new == 0:
                    return True
                if new == 1:
                    self.res.itl.append(now - self.last_ts)
                else:
                    self.res.itl.extend([(now - self.last_ts) / new] * new)
            self.last_ts = now
            self.last_len = output_len
        elif self.ttft == 0.0 and meta.get("completion_tokens"):
            # the first token arrived but decodes to nothing (a special token)
            self.output_len = self.last_len = meta["completion_tokens"]
            self.ttft = now - self.st
            self.last_ts = now
        return True

    def finish(self) -> None:
        """The stream ended normally: the request succeeded (bench's definition)."""
        res = self.res
        res.success = True
        res.ttft = self.ttft
        res.latency = self.latency
        res.output_len = self.output_len
        res.generated_text = self.text


async def read_stream(
    content: aiohttp.StreamReader, state: _StreamState, clock: Callable[[], float]
) -> bool:
    """Feed each line of a streamed body to `state`, timed when its bytes arrived; False if a
    line was an error line. One read per network chunk, not one per line (two per SSE event)."""
    pending = b""
    readany = content.readany  # iter_any() without its iterator's extra coroutine per chunk
    while data := await readany():
        now = clock()
        if pending:
            data = pending + data
        *lines, pending = data.split(b"\n")
        for line in lines:
            if line and not state.feed(line, now):
                return False
    return not pending or state.feed(pending, clock())


async def send_request(
    *,
    session: aiohttp.ClientSession,
    url: str,
    prompt: Prompt,
    stream: bool,
    timeout_s: float,
) -> RequestResult:
    """POST one `/generate` and time it; failures are returned with their error text."""
    clock = time.perf_counter
    res = RequestResult(
        input_len=prompt.input_len, prompt_len=prompt.input_len, output_len=prompt.output_len
    )
    res.start_time = clock()
    state = _StreamState(res)
    try:
        # asyncio's timeout, not aiohttp's: one timer per request, where aiohttp's enters and
        # leaves a timer context at every chunk the stream waits for
        async with (
            asyncio.timeout(timeout_s),
            session.post(url, data=prompt.body, headers=JSON_HEADERS) as resp,
        ):
            if resp.status != 200:
                res.error = f"HTTP {resp.status} {resp.reason or ''}: {await resp.text()}"
            elif stream:
                if await read_stream(resp.content, state, clock):
                    state.finish()
            else:
                body = await resp.read()
                if state.feed(body, clock()):
                    state.finish()
    except TimeoutError:
        res.error = f"TimeoutError: no complete response within {timeout_s:g} s"
    except Exception as exc:
        res.error = f"{type(exc).__name__}: {exc}"
    if not res.success:
        res.output_len = 0
    return res


async def wait_ready(*, session: aiohttp.ClientSession, base_url: str, timeout_s: float) -> None:
    """Poll `GET /v1/models` every second until 200 (bench's ready check)."""
    deadline = time.monotonic() + timeout_s
    url = f"{base_url}/v1/models"
    while True:
        try:
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=5)) as resp:
                if resp.status == 200:
                    return
        except (aiohttp.ClientError, TimeoutError):
            pass
        if time.monotonic() >= deadline:
            raise ClientError(f"server at {url} not ready within {timeout_s:g} s")
        await asyncio.sleep(1.0)


async def fetch_server_info(
    *, session: aiohttp.ClientSession, base_url: str
) -> tuple[dict[str, Any] | None, float | None]:
    """`GET /server_info` (None unless 200) and its spec accept length, as bench reads them."""
    try:
        timeout = aiohttp.ClientTimeout(total=INFO_TIMEOUT_S)
        async with session.get(f"{base_url}/server_info", timeout=timeout) as resp:
            if resp.status != 200:
                return None, None
            info = await resp.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        log.warning("GET %s/server_info failed: %s", base_url, exc)
        return None, None
    if not isinstance(info, dict):
        return None, None
    source = info["decode"][0] if info.get("decode") else info
    states = source.get("internal_states") or []
    accept = states[0].get("avg_spec_accept_length") if states else None
    return info, accept


def make_prompts(options: BenchOptions, rng: np.random.RandomState) -> list[Prompt]:
    """The measured requests, then bench's warmup request (the first prompt, at most 32
    output tokens); bodies are encoded before any timing starts."""
    rows = sample_rows(
        rng=rng,
        num_prompts=options.num_prompts,
        input_len=options.input_len,
        output_len=options.output_len,
        range_ratio=options.range_ratio,
        vocab_size=options.vocab_size,
    )
    warm = Row(rows[0].first_id, rows[0].input_len, min(rows[0].output_len, WARMUP_MAX_OUTPUT))
    return [
        Prompt(
            input_len=row.input_len,
            output_len=row.output_len,
            body=request_body(
                input_ids=row.input_ids(options.vocab_size),
                output_len=row.output_len,
                stream=options.stream,
                extra=options.extra_request_body,
            ),
        )
        for row in [*rows, warm]
    ]


async def closed_loop(
    prompts: list[Prompt],
    *,
    concurrency: int,
    send: Callable[[Prompt], Awaitable[RequestResult]],
    done: Callable[[], Any],
) -> list[RequestResult]:
    """`concurrency` workers send the prompts in order, each the next one as soon as its
    previous request finished: bench's dispatch order with a semaphore and request rate inf."""
    results: list[RequestResult | None] = [None] * len(prompts)
    order = iter(range(len(prompts)))  # shared: every worker takes the next index

    async def worker() -> None:
        for i in order:
            results[i] = await send(prompts[i])
            done()

    await asyncio.gather(*(worker() for _ in range(min(concurrency, len(prompts)))))
    return [r for r in results if r is not None]


async def run_benchmark(options: BenchOptions) -> dict[str, Any]:
    """Run warmup and the measured requests; return the record with per-request details."""
    rng = np.random.RandomState(options.seed)  # bench seeds numpy's global RNG the same way
    *prompts, warm = make_prompts(options, rng)
    # The prompts (and everything imported) live until the end: keep the garbage collector's
    # full collections from walking them during the run (bench's p99 TTFT suffers from that).
    gc.freeze()
    try:
        return await _run(options, prompts=prompts, warm=warm, rng=rng)
    finally:
        gc.unfreeze()


def auth_headers(env: Mapping[str, str]) -> dict[str, str]:
    """bench_serving's header for the server's `--api-key` (from OPENAI_API_KEY)."""
    key = env.get(API_KEY_ENV)
    return {"Authorization": f"Bearer {key}"} if key else {}


async def _run(
    options: BenchOptions, *, prompts: list[Prompt], warm: Prompt, rng: np.random.RandomState
) -> dict[str, Any]:
    url = f"{options.base_url}/generate"
    connector = aiohttp.TCPConnector(limit=0)  # the semaphore is the only concurrency cap
    session = aiohttp.ClientSession(
        connector=connector,
        read_bufsize=READ_BUFSIZE,
        timeout=aiohttp.ClientTimeout(total=None),
        headers=auth_headers(os.environ),
    )
    async with session:
        if options.ready_check_timeout_s > 0:
            await wait_ready(
                session=session, base_url=options.base_url, timeout_s=options.ready_check_timeout_s
            )
        semaphore = asyncio.Semaphore(options.max_concurrency) if options.max_concurrency else None

        async def limited(prompt: Prompt, done: Callable[[], Any] | None) -> RequestResult:
            try:
                if semaphore is None:
                    return await _send(prompt)
                async with semaphore:
                    return await _send(prompt)
            finally:
                if done is not None:
                    done()

        async def _send(prompt: Prompt) -> RequestResult:
            return await send_request(
                session=session,
                url=url,
                prompt=prompt,
                stream=options.stream,
                timeout_s=options.request_timeout_s,
            )

        if options.warmup_requests > 0:
            log.info("starting warmup with %d request(s)", options.warmup_requests)
            warm_results = await asyncio.gather(
                *(limited(warm, None) for _ in range(options.warmup_requests))
            )
            if not any(r.success for r in warm_results):
                raise ClientError(f"warmup failed: {warm_results[0].error}")
            await asyncio.sleep(SETTLE_S)

        log.info(
            "sending %d request(s) to %s (max concurrency %s, request rate %s)",
            len(prompts),
            url,
            options.max_concurrency,
            options.request_rate,
        )
        pbar = tqdm(total=len(prompts), file=sys.stderr, disable=options.disable_tqdm)
        check = SelfCheck() if options.self_check else None
        if check is not None:
            check.start()
        start = time.perf_counter()
        if options.max_concurrency and not math.isfinite(options.request_rate):
            results = await closed_loop(
                prompts, concurrency=options.max_concurrency, send=_send, done=pbar.update
            )
        else:  # timed arrivals (or no cap): one task per request, as bench does
            tasks = []
            for prompt in prompts:
                tasks.append(asyncio.create_task(limited(prompt, pbar.update)))
                if math.isfinite(options.request_rate):
                    await asyncio.sleep(rng.exponential(1.0 / options.request_rate))
            results = list(await asyncio.gather(*tasks))
        pbar.close()
        self_check = check.stop() if check is not None else {}
        # bench stops its clock after its /server_info call, so duration includes it
        server_info, accept_length = await fetch_server_info(
            session=session, base_url=options.base_url
        )
        duration = time.perf_counter() - start
    settings = {
        "tag": options.tag,
        "backend": options.backend,
        "dataset_name": options.dataset_name,
        "request_rate": options.request_rate,
        "max_concurrency": options.max_concurrency,
        "sharegpt_output_len": None,
        "random_input_len": options.input_len,
        "random_output_len": options.output_len,
        "random_range_ratio": options.range_ratio,
    }
    record = build_record(
        settings=settings,
        server_info=server_info,
        accept_length=accept_length,
        duration_s=duration,
        results=results,
        retokenize=sim_retokenizer(server_info),
    )
    record.update(self_check)
    return record


def sim_retokenizer(server_info: dict[str, Any] | None) -> Callable[[str], int] | None:
    """The sim's word-level token count when the server is the sim, else None (no tokenizer:
    the record keeps the server's count)."""
    version = (server_info or {}).get("version")
    if not (isinstance(version, str) and version.endswith("-sim")):
        return None
    from servesweep.sim.tokens import count_text_tokens

    return count_text_tokens


# ---------------------------------------------------------------- command line


def resolve_base_url(*, base_url: str | None, host: str, port: int) -> str:
    """`--base-url` wins; else `http://host:port` (IPv6 hosts in brackets)."""
    if base_url:
        return base_url.rstrip("/")
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{port}"


def build_parser() -> argparse.ArgumentParser:
    """bench_serving's flags that the builtin supports, with bench's defaults."""
    p = argparse.ArgumentParser(
        prog="python -m servesweep.measure.loadgen.builtin",
        description="Builtin SGLang load generator (bench_serving CLI subset and record).",
    )
    p.add_argument("--backend", default="sglang", choices=["sglang"])
    p.add_argument("--base-url", default=None)
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--port", type=int, default=DEFAULT_PORT)
    p.add_argument("--dataset-name", default="random-ids", choices=["random-ids"])
    p.add_argument("--random-input-len", type=int, default=1024)
    p.add_argument("--random-output-len", type=int, default=1024)
    p.add_argument("--random-range-ratio", type=float, default=0.0)
    p.add_argument("--num-prompts", type=int, default=1000)
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--request-rate", type=float, default=math.inf)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--output-file", default=None)
    p.add_argument("--output-details", action="store_true")
    p.add_argument("--disable-stream", action="store_true")
    p.add_argument("--tag", default=None)
    p.add_argument("--warmup-requests", type=int, default=1)
    p.add_argument(
        "--tokenize-prompt",
        action="store_true",
        help="accepted for bench_serving compatibility; the builtin always sends input_ids",
    )
    p.add_argument("--ready-check-timeout-sec", type=float, default=60.0)
    p.add_argument("--disable-tqdm", action="store_true")
    p.add_argument("--vocab-size", type=int, default=32000, help="builtin only: id range")
    p.add_argument(
        "--no-self-check",
        action="store_true",
        help="builtin only: leave out the client's CPU / event-loop lag / GC self-check",
    )
    p.add_argument(
        "--extra-request-body",
        default=None,
        help="a JSON object merged into each request payload (top-level keys), as in bench",
    )
    p.add_argument(
        "--request-timeout-sec",
        type=float,
        default=DEFAULT_REQUEST_TIMEOUT_S,
        help="builtin only: a request not finished within this many seconds fails",
    )
    return p


def options_from_args(args: argparse.Namespace) -> BenchOptions:
    """Map parsed CLI arguments to options."""
    return BenchOptions(
        base_url=resolve_base_url(base_url=args.base_url, host=args.host, port=args.port),
        input_len=args.random_input_len,
        output_len=args.random_output_len,
        range_ratio=args.random_range_ratio,
        num_prompts=args.num_prompts,
        max_concurrency=args.max_concurrency,
        request_rate=args.request_rate,
        seed=args.seed,
        warmup_requests=args.warmup_requests,
        stream=not args.disable_stream,
        tag=args.tag,
        vocab_size=args.vocab_size,
        request_timeout_s=args.request_timeout_sec,
        ready_check_timeout_s=args.ready_check_timeout_sec,
        disable_tqdm=args.disable_tqdm,
        extra_request_body=json.loads(args.extra_request_body or "{}"),
        self_check=not args.no_self_check,
    )


def _check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    for flag in ("num_prompts", "random_input_len", "random_output_len", "vocab_size"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be >= 1")
    if args.max_concurrency is not None and args.max_concurrency < 1:
        parser.error("--max-concurrency must be >= 1")
    if not args.request_rate > 0:
        parser.error("--request-rate must be > 0 (inf = all at once)")
    if not 0.0 <= args.random_range_ratio <= 1.0:
        parser.error("--random-range-ratio must be in [0, 1]")
    try:
        extra = json.loads(args.extra_request_body or "{}")
    except json.JSONDecodeError as exc:
        parser.error(f"--extra-request-body is not JSON: {exc}")
    if not isinstance(extra, dict):
        parser.error("--extra-request-body must be a JSON object")
    if args.warmup_requests < 0:
        parser.error("--warmup-requests must be >= 0")
    if not args.request_timeout_sec > 0:
        parser.error("--request-timeout-sec must be > 0")


def default_output_file(args: argparse.Namespace) -> str:
    """bench's default name for random datasets: `{backend}_{MMDD}_{n}_{in}_{out}.jsonl`."""
    now = datetime.now().strftime("%m%d")
    return (
        f"{args.backend}_{now}_{args.num_prompts}_"
        f"{args.random_input_len}_{args.random_output_len}.jsonl"
    )


def append_record(path: str | Path, record: dict[str, Any], *, details: bool) -> None:
    """Append the record as one JSONL line, as bench does (`open(..., "a")`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fh.write(record_line(record, details=details))


def format_summary(record: dict[str, Any]) -> str:
    """A short human-readable result table (bench prints a longer one)."""
    rows = [
        ("Backend", "backend"),
        ("Max request concurrency", "max_concurrency"),
        ("Successful requests", "completed"),
        ("Benchmark duration (s)", "duration"),
        ("Total input tokens", "total_input_tokens"),
        ("Total generated tokens", "total_output_tokens"),
        ("Request throughput (req/s)", "request_throughput"),
        ("Output token throughput (tok/s)", "output_throughput"),
        ("Concurrency", "concurrency"),
        ("Median E2E Latency (ms)", "median_e2e_latency_ms"),
        ("Median TTFT (ms)", "median_ttft_ms"),
        ("P99 TTFT (ms)", "p99_ttft_ms"),
        ("Median TPOT (ms)", "median_tpot_ms"),
        ("Median ITL (ms)", "median_itl_ms"),
    ]
    lines = ["{:=^50}".format(" Serving Benchmark Result (builtin) ")]
    for label, key in rows:
        value = record.get(key)
        text = f"{value:.2f}" if isinstance(value, float) else str(value)
        lines.append(f"{label + ':':<40} {text}")
    lines.append("=" * 50)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """CLI entry: 0 if a record was appended (failed requests included), 1 if none completed."""
    parser = build_parser()
    args = parser.parse_args(argv)
    _check_args(parser, args)
    if not logging.getLogger().handlers:
        logging.basicConfig(
            level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s"
        )
    options = options_from_args(args)
    log.info("options: %s", options)
    try:
        record = asyncio.run(run_benchmark(options))
    except ClientError as exc:
        log.error("%s", exc)
        return 1
    except KeyboardInterrupt:  # Ctrl-C reaches the whole process group: one line, no traceback
        log.error("interrupted by SIGINT (Ctrl-C); no record written")
        return 130
    errors = [e for e in record["errors"] if e]
    if errors:
        log.warning("%d request(s) failed; first error: %s", len(errors), errors[0])
    if not record["completed"]:
        log.error("no request completed; no record written")
        return 1
    output_file = args.output_file or default_output_file(args)
    append_record(output_file, record, details=args.output_details)
    print(format_summary(record), flush=True)
    log.info("record appended to %s", output_file)
    return 0


if __name__ == "__main__":
    sys.exit(main())
