"""Asyncio driver of the scheduler: sleeps each simulated step x time scale, streams tokens."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from dataclasses import dataclass, field

from servesweep.sim.logs import (
    detokenizer_traceback,
    fatal_exit,
    native_crash_exit,
    scheduler_traceback,
)
from servesweep.sim.scheduler import Scheduler, SimRequest, StepResult
from servesweep.sim.tokens import SPECIAL_TOKEN_ID, TextNoise, output_id

logger = logging.getLogger(__name__)

# Sleeps shorter than the event loop's ~1 ms timer granularity are skipped (the sim runs ahead
# and sleeps longer later); a lag beyond MAX_LAG_S is forgotten instead of caught up in a burst.
MIN_SLEEP_S = 0.002
MAX_LAG_S = 0.1
# SGLang logs every prefill batch and every 40th decode step (`--decode-log-interval`). The sim
# logs every prefill batch too, except in zero-cost mode (time scale 0: at most one a second),
# and a decode line at most once a wall second.
PREFILL_LOG_MIN_WALL_S = 1.0
DECODE_LOG_INTERVAL_STEPS = 40
DECODE_LOG_MIN_WALL_S = 1.0


@dataclass(eq=False)
class RequestStream:
    """The HTTP side of one request: cumulative output, completion, and a change signal.

    Wall times are event-loop seconds; everything a client sees is in wall time."""

    req: SimRequest
    seq: int
    counted_index: int | None  # arrival order among counted requests; None: uncounted
    arrival_wall: float
    output_ids: list[int] = field(default_factory=list)
    text: str = ""
    finished: bool = False
    finish_wall: float | None = None
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    first_token: int | None = None  # sampled elsewhere (PD: by the prefill server)
    skip_special_tokens: bool = True  # SGLang's sampling_params default
    tokens: list[int] | None = None  # the sim model's answer (answers.py): these, in order
    inflight: bool = False  # PD prefill: prefilled, its KV cache not yet sent
    queued_wall: float = 0.0  # when it entered the scheduler's waiting queue

    @property
    def rid(self) -> str:
        return self.req.rid

    @property
    def counted(self) -> bool:
        return self.counted_index is not None

    @property
    def e2e_latency(self) -> float | None:
        if self.finish_wall is None:
            return None
        return self.finish_wall - self.arrival_wall

    async def wait_change(self) -> None:
        """Wait until new tokens or completion were delivered since the last call."""
        await self.changed.wait()
        self.changed.clear()


@dataclass
class DisaggQueues:
    """The PD queues SGLang's batch lines count (0.5.16+, `metrics_reporter.py`). Prefill:
    `bootstrap` requests wait for their decode peer's handshake, `inflight` ones are prefilled
    and their KV transfer runs. Decode: `prealloc` requests wait for the handshake with their
    prefill server, `transfer` ones for their KV cache, which holds `preallocated_tokens`."""

    mode: str  # "prefill" | "decode"
    bootstrap: int = 0
    inflight: int = 0
    prealloc: int = 0
    transfer: int = 0
    preallocated_tokens: int = 0


# SGLang 0.5.17's buckets of sglang:per_stage_req_latency_seconds (0.001 s x 1.62^i).
STAGE_BUCKETS_S = tuple(0.001 * 1.62**i for i in range(30))


@dataclass
class StageLatency:
    """One stage label of sglang:per_stage_req_latency_seconds: sum, count, bucket counts."""

    total_s: float = 0.0
    count: int = 0
    buckets: list[int] = field(default_factory=lambda: [0] * len(STAGE_BUCKETS_S))

    def observe(self, seconds: float) -> None:
        self.total_s += seconds
        self.count += 1
        for i, le in enumerate(STAGE_BUCKETS_S):
            if seconds <= le:
                self.buckets[i] += 1
                break


@dataclass
class EngineStats:
    """Counters and gauges for /metrics and /server_info."""

    # Per request, counted when it finishes (as real SGLang counts them: a long request moves
    # none of them until its end).
    prompt_tokens_total: int = 0
    generation_tokens_total: int = 0
    requests_total: int = 0
    # Per step (SGLang 0.5.17's realtime_tokens_total{mode=...}): every forward pass.
    realtime_prefill_tokens: int = 0
    realtime_decode_tokens: int = 0
    last_gen_throughput: float = 0.0
    # SGLang's RequestStage latencies (wall seconds, as the client's): counted requests only.
    stages: dict[str, StageLatency] = field(default_factory=dict)

    def observe_stage(self, stage: str, seconds: float) -> None:
        self.stages.setdefault(stage, StageLatency()).observe(max(0.0, seconds))


class Engine:
    """Runs the scheduler in (scaled) real time and feeds RequestStreams.

    `time_scale` 0 is the zero-cost mode: no sleeping at all, steps run back to back (one
    event-loop yield each) so clients can be benchmarked against the HTTP layer alone.
    `crash_after` N: the first step with counted request N (0-based arrival order) in flight
    kills the process, so the crash falls inside that request's batch whatever else finishes in
    the same step. It shows with SGLang's scheduler traceback, or as
    `crash_kind` says, the detokenizer process's crash header or a native library's fatal
    signal (UCX's `Caught signal 11`, then SIGSEGV)."""

    def __init__(
        self,
        *,
        scheduler: Scheduler,
        time_scale: float,
        crash_after: int | None = None,
        crash_kind: str = "scheduler",
        noise: TextNoise | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.noise = noise or TextNoise(seed=0, enabled=False)
        self.time_scale = time_scale
        self.crash_after = crash_after
        self.crash_kind = crash_kind
        self.stats = EngineStats()
        self.counted_arrivals = 0
        self._streams: dict[str, RequestStream] = {}
        self._seq = 0
        self._wake = asyncio.Event()
        self._step_done = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        self._anchor_wall = self._loop.time()
        self._anchor_sim = scheduler.now
        self.disagg: DisaggQueues | None = None  # a PD server's queues (set by its node)
        self._finished_uncounted: dict[str, RequestStream] = {}  # inflight until logged
        self._last_prefill_log = -1e9
        self._prefill_tic = self._loop.time()  # the last prefill line (its throughput's start)
        self._decode_steps = 0
        self._decode_tokens = 0
        self._decode_window_start = self._loop.time()

    # ------------------------------------------------------------------ requests

    @property
    def idle(self) -> bool:
        return not self.scheduler.has_work

    def submit(
        self,
        *,
        prompt_tokens: int,
        max_new_tokens: int,
        counted: bool,
        prefilled: int = 0,
        first_token: int | None = None,
        arrival_wall: float | None = None,
        skip_special_tokens: bool = True,
        tokens: list[int] | None = None,
    ) -> RequestStream:
        """Queue a request; raises RequestRejected if it can never run. `prefilled` tokens
        of the prompt already have their KV cache (PD decode: all of them)."""
        if not self.scheduler.has_work:
            self._catch_up_idle()  # the arrival's simulated time is its wall time
        req = SimRequest(
            rid=uuid.uuid4().hex,
            prompt_tokens=prompt_tokens,
            max_new_tokens=max_new_tokens,
            arrival=self.scheduler.now,
            prefilled=prefilled,
        )
        self.scheduler.submit(req)
        stream = RequestStream(
            req=req,
            seq=self._seq,
            counted_index=self.counted_arrivals if counted else None,
            arrival_wall=self._loop.time() if arrival_wall is None else arrival_wall,
            first_token=first_token,
            skip_special_tokens=skip_special_tokens,
            tokens=tokens,
            queued_wall=self._loop.time(),
        )
        self._seq += 1
        self.counted_arrivals += counted
        self._streams[req.rid] = stream
        self._wake.set()
        return stream

    def abort(self, stream: RequestStream) -> None:
        """Drop a request (client gone, injected error); frees its KV reservation."""
        self.scheduler.abort(stream.req)
        self._streams.pop(stream.rid, None)

    async def wait_step(self) -> None:
        """Wait for the next completed step."""
        await self._step_done.wait()

    def transfer_done(self, stream: RequestStream) -> None:
        """PD prefill: the request's KV cache left (or will never leave): it quits the
        inflight queue and frees its KV cache."""
        if stream.inflight and self.disagg is not None:
            stream.inflight = False
            self.disagg.inflight -= 1
            self.scheduler.release(stream.req)

    async def probe(self, *, timeout_s: float) -> bool:
        """SGLang's health check: a 1-token request; healthy when any step completes."""
        stream = self.submit(prompt_tokens=1, max_new_tokens=1, counted=False)
        try:
            async with asyncio.timeout(timeout_s):
                await self.wait_step()
            return True
        except TimeoutError:
            return False
        finally:
            if not stream.finished:
                self.abort(stream)

    async def run_to_completion(self, *, prompt_tokens: int, max_new_tokens: int) -> None:
        """Submit an uncounted request and wait for it (server warmup)."""
        stream = self.submit(
            prompt_tokens=prompt_tokens, max_new_tokens=max_new_tokens, counted=False
        )
        while not stream.finished:
            await stream.wait_change()

    # ------------------------------------------------------------------ loop

    def _check_crash(self) -> None:
        if self.crash_after is not None and any(
            s.counted_index is not None and s.counted_index >= self.crash_after
            for s in self._streams.values()
        ):
            injected = f"--sim-crash-after {self.crash_after}"
            if self.crash_kind == "native":
                native_crash_exit(injected=injected)
            if self.crash_kind == "detokenizer":
                fatal_exit(message=detokenizer_traceback(injected=injected))
            fatal_exit(
                message=scheduler_traceback(
                    error=(
                        "RuntimeError: CUDA error: an illegal memory access was encountered "
                        f"(injected by {injected})"
                    ),
                )
            )

    def _catch_up_idle(self) -> None:
        """An idle engine's simulated clock follows wall time: move it to now, re-anchor."""
        if self.time_scale > 0:
            now = self._loop.time()
            idle_sim = (now - self._anchor_wall) / self.time_scale
            self.scheduler.advance_to(self._anchor_sim + idle_sim)
            self._anchor_wall, self._anchor_sim = now, self.scheduler.now

    async def run(self) -> None:
        """Step forever; wall time of a step's end = anchor + simulated elapsed x time scale."""
        while True:
            if not self.scheduler.has_work:
                self._wake.clear()
                await self._wake.wait()
                self._catch_up_idle()
            self._check_crash()
            result = self.scheduler.step()
            if self.time_scale == 0:
                await asyncio.sleep(0)  # let the HTTP side queue more work, then go on
                self._deliver(result)
                self._log_batch(result)
                self._no_transfer(result)
                done, self._step_done = self._step_done, asyncio.Event()
                done.set()
                continue
            target = self._anchor_wall + (result.end - self._anchor_sim) * self.time_scale
            delay = target - self._loop.time()
            if delay >= MIN_SLEEP_S:
                await asyncio.sleep(delay)
            else:  # the event loop cannot sleep this briefly: run ahead, catch up later
                await asyncio.sleep(0)
                if delay < -MAX_LAG_S:  # stalled (CPU contention): forget the lag
                    self._anchor_wall, self._anchor_sim = self._loop.time(), result.end
            self._deliver(result)
            self._log_batch(result)
            self._no_transfer(result)
            done, self._step_done = self._step_done, asyncio.Event()
            done.set()

    def _deliver(self, result: StepResult) -> None:
        now = self._loop.time()
        for req in result.emitted:
            stream = self._streams.get(req.rid)
            if stream is None or req.aborted:
                continue
            new = range(len(stream.output_ids), req.generated)
            if stream.counted and not stream.output_ids and new:
                # Its first token: a decode server's first step after the KV cache came
                # (SGLang's decode_waiting), else the end of its prefill (prefill_forward).
                decode = self.disagg is not None and self.disagg.mode == "decode"
                stage = "decode_waiting" if decode else "prefill_forward"
                self.stats.observe_stage(stage, now - stream.queued_wall)
            for k in new:
                if stream.tokens is not None and k < len(stream.tokens):
                    token = stream.tokens[k]
                elif k == 0 and stream.first_token is not None:
                    token = stream.first_token
                elif k == 0 and self.noise.special(
                    seq=stream.seq, max_new_tokens=req.max_new_tokens
                ):
                    token = SPECIAL_TOKEN_ID
                else:
                    token = output_id(seq=stream.seq, k=k)
                stream.output_ids.append(token)
                stream.text += self.noise.piece(
                    token_id=token, seq=stream.seq, k=k, skip_special=stream.skip_special_tokens
                )
            stream.changed.set()
        self.stats.realtime_prefill_tokens += result.prefill_tokens
        self.stats.realtime_decode_tokens += result.decode_seqs
        prefill_server = self.disagg is not None and self.disagg.mode == "prefill"
        for req in result.finished:
            stream = self._streams.pop(req.rid, None)
            if stream is None:
                continue
            stream.finished = True
            if prefill_server and self.disagg is not None:
                stream.inflight = True  # SGLang moves it to the inflight queue, then logs
                self.disagg.inflight += 1
                self.scheduler.hold(req)  # its KV cache stays until it was sent
                if not stream.counted:
                    self._finished_uncounted[req.rid] = stream
            if stream.counted:
                self.stats.requests_total += 1
                self.stats.prompt_tokens_total += req.prompt_tokens
                self.stats.generation_tokens_total += len(stream.output_ids)
            stream.finish_wall = now
            stream.changed.set()

    def _no_transfer(self, result: StepResult) -> None:
        """Uncounted requests (warm-up, health probes) have a fake bootstrap room: their
        "transfer" ends at once, after the batch line that counts them (as SGLang's)."""
        for req in result.finished:
            stream = self._finished_uncounted.pop(req.rid, None)
            if stream is not None:
                self.transfer_done(stream)

    def _log_batch(self, result: StepResult) -> None:
        """SGLang 0.5.16+'s batch lines (`metrics_reporter.py`), with a PD server's queues."""
        now = self._loop.time()
        queues = self.disagg
        mode = queues.mode if queues is not None else None
        usage = self.scheduler.token_usage
        # a decode server's batches are prebuilt from transferred KV: no prefill line
        for report in result.prefills if mode != "decode" else ():
            if self.time_scale == 0 and now - self._last_prefill_log < PREFILL_LOG_MIN_WALL_S:
                break
            gap, self._prefill_tic = now - self._prefill_tic, now
            self._last_prefill_log = now
            throughput = report.tokens / gap if gap > 0 else 0.0
            line = (
                f"Prefill batch, #new-seq: {report.seqs}, #new-token: {report.tokens}, "
                f"#cached-token: 0, token usage: {usage:.2f}, #running-req: {report.running}, "
                f"#queue-req: {result.queued}, #pending-token: {report.pending_tokens}, "
            )
            if queues is not None and mode == "prefill":
                line += (
                    f"#bootstrap-req: {queues.bootstrap}, #inflight-req: {queues.inflight}, "
                    "#optimistic-req: 0, "
                )
            logger.info(line + f"cuda graph: True, input throughput (token/s): {throughput:.2f}")
        if result.decode_seqs:
            self._decode_steps += 1
            self._decode_tokens += result.decode_seqs
        elapsed = now - self._decode_window_start
        if (
            self._decode_steps >= DECODE_LOG_INTERVAL_STEPS
            and elapsed >= DECODE_LOG_MIN_WALL_S
            and mode != "prefill"
        ):
            self.stats.last_gen_throughput = self._decode_tokens / elapsed if elapsed > 0 else 0.0
            line = (
                f"Decode batch, #running-req: {result.running}, #token: {result.kv_used}, "
                f"token usage: {usage:.2f}, "
            )
            if queues is not None and mode == "decode":
                capacity = self.scheduler.policy.max_total_num_tokens
                line += (
                    f"pre-allocated usage: {queues.preallocated_tokens / capacity:.2f}, "
                    f"#prealloc-req: {queues.prealloc}, #transfer-req: {queues.transfer}, "
                    "#retracted-req: 0, "
                )
            logger.info(
                line + f"cuda graph: True, "
                f"gen throughput (token/s): {self.stats.last_gen_throughput:.2f}, "
                f"#queue-req: {result.queued}"
            )
            self._decode_steps = self._decode_tokens = 0
            self._decode_window_start = now
        elif not self.scheduler.has_work:
            self._decode_window_start = now
            self._decode_steps = self._decode_tokens = 0

    async def close(self, task: asyncio.Task[None]) -> None:
        """Cancel the loop task."""
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
