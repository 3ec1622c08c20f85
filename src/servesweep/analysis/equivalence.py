"""Output equivalence: a candidate server config's probe answers against its baseline's
(measure.probe), per prompt and as one verdict (docs/equivalence.md).

Per prompt, the greedy answers agree on a prefix; up to and including the first position where
they part, both saw the same context, so the candidate's logprob of the baseline's token is
comparable with the baseline's own. The verdict:
- `same outputs`: every token equal, every compared logprob within 1e-6;
- `within numerical tolerance`: every compared logprob within the tolerance, and where the
  greedy tokens part, the two tokens were a near-tie on both sides (top-1 margin within it);
- `outputs differ`: anything else (a token the other side did not even rank in its top-k, a
  logprob off by more than the tolerance, a flip that was no near-tie).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from servesweep.measure.probefile import Answer, ProbeAnswers

SAME = "same outputs"
WITHIN = "within numerical tolerance"
DIFFER = "outputs differ"
NOT_COMPARABLE = "not comparable"
VERDICTS = (SAME, WITHIN, DIFFER, NOT_COMPARABLE)
# Logprobs printed from the same float32 computation agree to this (JSON round trip included).
EXACT = 1e-6


@dataclass(frozen=True)
class PromptComparison:
    """One prompt: how far the greedy answers agree and the largest same-context logprob gap."""

    prompt: str
    tokens: int
    agree_prefix: int
    first_token_agrees: bool
    max_logprob_diff: float | None
    verdict: str
    why: str = ""


@dataclass(frozen=True)
class Comparison:
    """A candidate's answers against a baseline's: the figures and the verdict."""

    baseline: str
    candidate: str
    verdict: str
    prompts: int
    first_token_agree: int
    prefix_min: int
    prefix_mean: float
    output_len: int
    max_logprob_diff: float | None
    tolerance: float
    baseline_axes: dict[str, Any] = field(default_factory=dict)
    candidate_axes: dict[str, Any] = field(default_factory=dict)
    baseline_run: str = ""
    candidate_run: str = ""
    why: str = ""
    per_prompt: list[PromptComparison] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        """One line: the verdict, first-token agreement, greedy prefix, largest logprob gap."""
        if self.verdict == NOT_COMPARABLE:
            return f"{self.verdict}: {self.why}"
        gap = "n/a" if self.max_logprob_diff is None else f"{self.max_logprob_diff:.4f}"
        text = (
            f"{self.verdict}: first token {self.first_token_agree}/{self.prompts} agree, greedy "
            f"prefix min {self.prefix_min} (mean {self.prefix_mean:.1f}) of {self.output_len}, "
            f"max |dlogprob| {gap} (tolerance {self.tolerance:g})"
        )
        return f"{text}; {self.why}" if self.why else text


def _logprob_of(answer: Answer, pos: int, token: int) -> float | None:
    """`answer`'s logprob of `token` at `pos`: its own token's, else from its top-k (None when
    it did not rank it or gave no logprobs)."""
    if pos < len(answer.tokens) and answer.tokens[pos] == token:
        own = answer.logprobs[pos] if pos < len(answer.logprobs) else None
        if own is not None:
            return own
    top = answer.top[pos] if pos < len(answer.top) else []
    return next((lp for lp, t in top if t == token), None)


def compare_prompt(base: Answer, cand: Answer, *, tolerance: float) -> PromptComparison:
    """One prompt's answers compared (see the module's docstring)."""
    n = min(len(base.tokens), len(cand.tokens))
    prefix = next((i for i in range(n) if base.tokens[i] != cand.tokens[i]), n)
    has_logprobs = any(x is not None for x in base.logprobs) and any(
        x is not None for x in cand.logprobs
    )
    diffs: list[float] = []
    unranked = None
    for pos in range(min(prefix + 1, n)):
        token = base.tokens[pos]
        b_lp, c_lp = _logprob_of(base, pos, token), _logprob_of(cand, pos, token)
        if b_lp is None or c_lp is None:
            if has_logprobs and unranked is None:
                unranked = pos
            continue
        diffs.append(abs(b_lp - c_lp))
    gap = max(diffs) if diffs else None

    def result(verdict: str, why: str = "") -> PromptComparison:
        return PromptComparison(
            prompt=base.prompt,
            tokens=n,
            agree_prefix=prefix,
            first_token_agrees=n > 0 and prefix > 0,
            max_logprob_diff=gap,
            verdict=verdict,
            why=why,
        )

    if len(base.tokens) != len(cand.tokens):
        return result(DIFFER, f"{len(cand.tokens)} tokens vs {len(base.tokens)}")
    if unranked is not None:
        return result(
            DIFFER, f"position {unranked}: the baseline's token is not in the other's top-k"
        )
    if gap is not None and gap > tolerance:
        return result(DIFFER, f"logprob off by {gap:.4f} on the same context")
    if prefix == n:
        exact = gap is None or gap <= EXACT
        return result(SAME if exact else WITHIN)
    if not has_logprobs:
        return result(DIFFER, f"tokens part at position {prefix} (no logprobs to judge)")
    # The tokens part at `prefix`: a near-tie on both sides is numerical noise.
    b_tok, c_tok = base.tokens[prefix], cand.tokens[prefix]
    margins = [
        _margin(base, prefix, b_tok, c_tok),
        _margin(cand, prefix, c_tok, b_tok),
    ]
    if all(m is not None and m <= tolerance for m in margins):
        return result(WITHIN, f"position {prefix}: a near-tie (margins {_fmt(margins)})")
    return result(DIFFER, f"position {prefix}: tokens part with margins {_fmt(margins)}")


def _margin(answer: Answer, pos: int, chosen: int, other: int) -> float | None:
    a, b = _logprob_of(answer, pos, chosen), _logprob_of(answer, pos, other)
    return None if a is None or b is None else a - b


def _fmt(values: Sequence[float | None]) -> str:
    return ", ".join("unranked" if v is None else f"{v:.4f}" for v in values)


def compare_answers(base: ProbeAnswers, cand: ProbeAnswers, *, tolerance: float) -> Comparison:
    """A candidate's probe answers against the baseline's; `not comparable` when they answered
    different probes (another probe key)."""
    common = {
        "baseline": base.server,
        "candidate": cand.server,
        "baseline_axes": dict(base.axes),
        "candidate_axes": dict(cand.axes),
        "baseline_run": base.run_id,
        "candidate_run": cand.run_id,
        "tolerance": tolerance,
    }
    if base.probe_key != cand.probe_key:
        return Comparison(
            **common,
            verdict=NOT_COMPARABLE,
            prompts=0,
            first_token_agree=0,
            prefix_min=0,
            prefix_mean=0.0,
            output_len=0,
            max_logprob_diff=None,
            why=f"different probes ({base.probe_key} vs {cand.probe_key})",
        )
    theirs = {a.prompt: a for a in cand.answers}
    rows = [
        compare_prompt(a, theirs[a.prompt], tolerance=tolerance)
        for a in base.answers
        if a.prompt in theirs
    ]
    missing = len(base.answers) - len(rows)
    gaps = [r.max_logprob_diff for r in rows if r.max_logprob_diff is not None]
    verdicts = {r.verdict for r in rows}
    verdict = (
        DIFFER
        if DIFFER in verdicts or missing or not rows
        else WITHIN
        if WITHIN in verdicts
        else SAME
    )
    worst = next((r for r in rows if r.verdict == DIFFER), None) or next(
        (r for r in rows if r.verdict == WITHIN and r.why), None
    )
    why = f"{missing} prompt(s) unanswered" if missing else ""
    if worst is not None and worst.why:
        why = f"{worst.prompt}: {worst.why}" + (f"; {why}" if why else "")
    return Comparison(
        **common,
        verdict=verdict,
        prompts=len(rows),
        first_token_agree=sum(r.first_token_agrees for r in rows),
        prefix_min=min((r.agree_prefix for r in rows), default=0),
        prefix_mean=(sum(r.agree_prefix for r in rows) / len(rows)) if rows else 0.0,
        output_len=max((r.tokens for r in rows), default=0),
        max_logprob_diff=max(gaps) if gaps else None,
        why=why,
        per_prompt=rows,
    )


def pairs(
    probes: Sequence[ProbeAnswers], baseline: Mapping[str, Any]
) -> list[tuple[ProbeAnswers, ProbeAnswers]]:
    """(baseline, candidate) per candidate server config: the config whose baseline axis has
    the baseline's value and every other axis the candidate's."""
    if not baseline:
        return []
    axis, value = next(iter(baseline.items()))
    found = []
    for cand in probes:
        if cand.axes.get(axis) == value:
            continue
        twin = {**cand.axes, axis: value}
        base = next((p for p in probes if p.axes == twin), None)
        if base is not None:
            found.append((base, cand))
    return found


def verdicts(
    probes: Sequence[ProbeAnswers], *, baseline: Mapping[str, Any], tolerance: float
) -> dict[str, Any]:
    """equivalence.json: every candidate's comparison with its baseline, and a note when there
    is none (no baseline axis, or no baseline twin probed)."""
    comparisons = [compare_answers(b, c, tolerance=tolerance) for b, c in pairs(probes, baseline)]
    note = None
    if not baseline:
        note = "no baseline: each server config's answers are kept for `servesweep compare`"
    elif not comparisons:
        note = "no candidate server config has a probed baseline twin"
    return {
        "tolerance": tolerance,
        "baseline": dict(baseline),
        "servers": {p.server: {"axes": p.axes, "probe_key": p.probe_key} for p in probes},
        "comparisons": [c.to_dict() for c in comparisons],
        "note": note,
    }


def differing(equivalence: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The comparisons of an equivalence.json (or summary.json's copy) whose outputs differ."""
    return [c for c in (equivalence or {}).get("comparisons") or [] if c.get("verdict") == DIFFER]


def verdict_of(equivalence: Mapping[str, Any] | None, axes: Mapping[str, Any]) -> str | None:
    """The verdict of the candidate server config with these axes (None: not compared)."""
    for c in (equivalence or {}).get("comparisons") or []:
        cand = c.get("candidate_axes") or {}
        if cand and all(axes.get(k) == v for k, v in cand.items()):
            return str(c.get("verdict"))
    return None


def row_verdict(equivalence: Mapping[str, Any] | None, row: Mapping[str, Any]) -> str:
    """results.csv's `outputs_verdict` of a row: `baseline` for the baseline's server config,
    the candidate's verdict, else empty (not compared)."""
    if not equivalence:
        return ""
    base = equivalence.get("baseline") or {}
    if base and all(row.get(k) == v for k, v in base.items()):
        return "baseline"
    return verdict_of(equivalence, row) or ""


def with_verdicts(summary: dict[str, Any], equivalence: Mapping[str, Any]) -> None:
    """summary.json's `equivalence` (equivalence.json without the per-prompt rows) and each
    delta's `outputs`: its candidate's verdict, where compared."""
    summary["equivalence"] = {
        "tolerance": equivalence.get("tolerance"),
        "baseline": equivalence.get("baseline"),
        "note": equivalence.get("note"),
        "comparisons": [without_rows(c) for c in equivalence.get("comparisons") or []],
    }
    for delta in summary.get("deltas") or []:
        verdict = verdict_of(equivalence, delta.get("axes") or {})
        if verdict:
            delta["outputs"] = verdict


def across_runs(
    run_a: Sequence[ProbeAnswers], run_b: Sequence[ProbeAnswers], *, tolerance: float
) -> list[dict[str, Any]]:
    """Run B's answers of each server config against run A's of the same server id (a config
    started again, another image or version), without the per-prompt rows."""
    theirs = {p.server: p for p in run_b}
    return [
        without_rows(compare_answers(a, theirs[a.server], tolerance=tolerance).to_dict())
        for a in run_a
        if a.server in theirs
    ]


def without_rows(comparison: Mapping[str, Any]) -> dict[str, Any]:
    """A comparison's figures and verdict without its per-prompt rows (summary, compare)."""
    return {k: v for k, v in comparison.items() if k != "per_prompt"}
