"""The output-equivalence probe: a fixed, seeded prompt set sent to a server config after its
warm-up and before its cells (greedy decoding, top-k logprobs), and its answers file
(equivalence/<server>.json). analysis.equivalence compares two such files."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import random
import time
from typing import Any

from servesweep.cluster import http
from servesweep.cluster.secrets import Secret
from servesweep.config.experiment import Experiment
from servesweep.config.matrix import ServerSpec, client_specs
from servesweep.core.errors import ProbeFailed
from servesweep.measure.cells import engine_label, flush_radix_cache, run_warmup
from servesweep.measure.probefile import VERSION, Answer, ProbeAnswers, Prompt
from servesweep.serving.servers import ServerManager

logger = logging.getLogger(__name__)


def probe_lengths(exp: Experiment) -> list[int]:
    """The configured lengths and every input length of the matrix (of every case, whichever
    suite runs: seed 003's suites under their own RUN_IDs answer the same probe), ascending."""
    if exp.cases:
        matrix = {int(case.get("input_len", exp.workload.input_len)) for case in exp.cases.values()}
    else:
        matrix = {c.workload.input_len for c in client_specs(exp)}
    return sorted(set(exp.equivalence.lengths) | matrix)


def settings(exp: Experiment) -> dict[str, Any]:
    """What decides the probe's prompts and answers (not the tolerance: a comparison's)."""
    cfg = exp.equivalence
    return {
        "lengths": probe_lengths(exp),
        "prompts_per_length": cfg.prompts_per_length,
        "output_len": cfg.output_len,
        "top_logprobs": cfg.top_logprobs,
        "seed": cfg.seed,
        "token_ids": list(cfg.token_ids),
    }


def probe_key(exp: Experiment) -> str:
    """A short hash of `settings`: two answer files compare only when their keys are equal,
    and a changed key reruns the probe (rule probe_outputs' params), never the cells."""
    text = json.dumps({"version": VERSION, **settings(exp)}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def prompts(exp: Experiment) -> list[Prompt]:
    """The probe's prompts: `prompts_per_length` per length, each its own seeded random ids
    (the same on every machine and Python: string seeds hash with SHA-512)."""
    cfg = exp.equivalence
    low, high = cfg.token_ids
    out = []
    for length in probe_lengths(exp):
        for k in range(1, cfg.prompts_per_length + 1):
            rng = random.Random(f"servesweep-probe:{cfg.seed}:{length}:{k}")
            out.append(Prompt(f"L{length}#{k}", [rng.randrange(low, high) for _ in range(length)]))
    return out


def request_body(exp: Experiment, prompt: Prompt) -> dict[str, Any]:
    """SGLang's native /generate request: greedy, exactly output_len tokens, top-k logprobs."""
    cfg = exp.equivalence
    return {
        "input_ids": prompt.ids,
        "sampling_params": {
            "temperature": 0.0,
            "max_new_tokens": cfg.output_len,
            "ignore_eos": True,
        },
        "return_logprob": True,
        "top_logprobs_num": cfg.top_logprobs,
        "stream": False,
    }


def parse_answer(prompt: str, body: Any) -> Answer:
    """An Answer from SGLang's /generate JSON (meta_info.output_token_logprobs: [logprob,
    token id, text] per token; output_top_logprobs: per token a list of such); ValueError
    when it holds no output tokens."""
    if not isinstance(body, dict):
        raise ValueError(f"answer is {type(body).__name__}, not a JSON object")
    meta = body.get("meta_info") or {}
    pairs = meta.get("output_token_logprobs")
    if pairs:
        tokens = [int(p[1]) for p in pairs]
        logprobs = [None if p[0] is None else float(p[0]) for p in pairs]
    else:
        tokens = [int(t) for t in body.get("output_ids") or []]
        logprobs = [None] * len(tokens)
    if not tokens:
        raise ValueError("no output tokens (neither output_token_logprobs nor output_ids)")
    top = [
        [(float(a[0]), int(a[1])) for a in (pos or []) if a and a[0] is not None]
        for pos in (meta.get("output_top_logprobs") or [])
    ]
    return Answer(prompt=prompt, tokens=tokens, logprobs=logprobs, top=top)


def ask(*, url: str, exp: Experiment, prompt: Prompt, key: Secret | None, server: str) -> Answer:
    """One probe request to `url`/generate; ProbeFailed naming the server and prompt."""
    status, body = http.post_json(
        f"{url}/generate",
        request_body(exp, prompt),
        timeout=exp.equivalence.request_timeout_s,
        key=key,
    )
    if status != 200:
        raise ProbeFailed(
            f"server {server}: equivalence probe {prompt.name} ({len(prompt.ids)} tokens) "
            f"answered {status if status is not None else 'nothing'} at {url}/generate"
        )
    try:
        return parse_answer(prompt.name, body)
    except (ValueError, TypeError, IndexError, KeyError) as exc:
        raise ProbeFailed(
            f"server {server}: equivalence probe {prompt.name}: unreadable answer: {exc}"
        ) from None


def run_probe(*, exp: Experiment, spec: ServerSpec, manager: ServerManager) -> ProbeAnswers:
    """Ensure the server config runs (started and warmed up like a cell's), send every probe
    prompt one at a time to its entry point (the router for PD), then flush the radix cache of
    every role that keeps one, so no cell reuses the probe's prefixes."""
    started = time.monotonic()
    manager.events.emit("probe-start", server=spec.id, fp=spec.fingerprint)
    state, fresh = manager.ensure(spec)
    if fresh and exp.warmup_after_start:
        run_warmup(exp=exp, server=spec, manager=manager, state=state)
    key = manager.api_key(state)
    answers = [
        ask(url=state.base_url, exp=exp, prompt=p, key=key, server=spec.id) for p in prompts(exp)
    ]
    flush_radix_cache(server=spec, tag=f"{spec.id}/probe", manager=manager, state=state)
    seconds = time.monotonic() - started
    manager.events.emit(
        "probe-done", server=spec.id, fp=spec.fingerprint, prompts=len(answers),
        seconds=f"{seconds:.2f}",
    )  # fmt: skip
    return ProbeAnswers(
        server=spec.id,
        axes=dict(spec.axes),
        fingerprint=spec.fingerprint,
        probe_key=probe_key(exp),
        settings=settings(exp),
        engine=engine_label(exp),
        answers=answers,
        measured_at=dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        seconds=round(seconds, 3),
        run_id=exp.run_id,
    )
