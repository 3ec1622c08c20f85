"""The equivalence probe's answers file (equivalence/<server>.json): what one server config
answered to the probe (measure.probe writes it, analysis.equivalence reads it)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# The answers file's format; a reader refuses another.
VERSION = 1


@dataclass(frozen=True)
class Prompt:
    """One probe prompt: `L<length>#<k>` and its token ids."""

    name: str
    ids: list[int]


@dataclass(frozen=True)
class Answer:
    """A server's greedy answer to one prompt: its tokens, their logprobs, and per position the
    top-k (logprob, token id) pairs, best first (empty where the server gave none)."""

    prompt: str
    tokens: list[int]
    logprobs: list[float | None]
    top: list[list[tuple[float, int]]] = field(default_factory=list)


@dataclass(frozen=True)
class ProbeAnswers:
    """equivalence/<server>.json: what one server config answered to the probe."""

    server: str
    axes: dict[str, Any]
    fingerprint: str
    probe_key: str
    settings: dict[str, Any]
    engine: dict[str, Any]
    answers: list[Answer]
    measured_at: str = ""
    seconds: float = 0.0
    run_id: str = ""
    version: int = VERSION

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ProbeAnswers:
        if data.get("version") != VERSION:
            raise ValueError(f"probe answers version {data.get('version')!r}, expected {VERSION}")
        answers = [
            Answer(
                prompt=str(a["prompt"]),
                tokens=[int(t) for t in a["tokens"]],
                logprobs=[None if x is None else float(x) for x in a["logprobs"]],
                top=[[(float(lp), int(t)) for lp, t in pos] for pos in a.get("top") or []],
            )
            for a in data["answers"]
        ]
        fields = {k: data[k] for k in cls.__dataclass_fields__ if k in data and k != "answers"}
        return cls(**{**fields, "answers": answers})


def read_probe(path: str | Path) -> ProbeAnswers:
    """An answers file (ValueError naming the file when it is not one)."""
    try:
        return ProbeAnswers.from_dict(json.loads(Path(path).read_text()))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not an equivalence probe answers file: {exc}") from None


def answers_of(paths: Sequence[str | Path]) -> list[ProbeAnswers]:
    """Every answers file of `paths` that exists, read."""
    return [read_probe(p) for p in paths if Path(p).exists()]


def from_runner_probe(data: Mapping[str, Any], *, run_id: str) -> dict[str, ProbeAnswers]:
    """Answers per MoE runner from the runner probe's file (`../shared/tools/equivalence-probe/
    probe.py`, 2026-12-07: per runner, `outputs` of 4 fixed prompts with `tokens`, `logprobs`
    and `top5` [logprob, token] pairs), so real answers taken outside a run compare as a
    run's do. Its prompts are probe.py's own (16, 256, 2048, 8192 ids; 8 tokens; top 5)."""
    out = {}
    for runner, result in data.items():
        answers = [
            Answer(
                prompt=f"p{i}",
                tokens=[int(t) for t in o["tokens"]],
                logprobs=[float(x) for x in o["logprobs"]],
                top=[[(float(lp), int(t)) for lp, t in pos] for pos in o["top5"]],
            )
            for i, o in enumerate(result.get("outputs") or [])
        ]
        out[runner] = ProbeAnswers(
            server=f"moe_runner_backend~{runner}",
            axes={"moe_runner_backend": runner},
            fingerprint="",
            probe_key="probe.py-2026-12-07",
            settings={"lengths": [16, 256, 2048, 8192], "output_len": 8, "top_logprobs": 5},
            engine={"kind": "sglang", "version": "0.5.17"},
            answers=answers,
            run_id=run_id,
        )
    return out
