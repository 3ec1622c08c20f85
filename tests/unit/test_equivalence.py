"""Output equivalence (analysis.equivalence) on real answers of two MoE runners and on the
sim's model (sim.answers), the probe's prompts (measure.probe) and its answers file."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from servesweep.analysis.equivalence import (
    DIFFER,
    NOT_COMPARABLE,
    SAME,
    WITHIN,
    across_runs,
    compare_answers,
    pairs,
    row_verdict,
    verdicts,
    with_verdicts,
)
from servesweep.measure.probe import parse_answer, probe_key, prompts
from servesweep.measure.probefile import Answer, ProbeAnswers, from_runner_probe, read_probe
from servesweep.sim.answers import greedy
from tests.support.runs import experiment

REAL = Path(__file__).parents[1] / "data" / "equivalence"


def real_answers(runner: str) -> ProbeAnswers:
    """What SGLang 0.5.17 answered under `runner` (probe.py's file, as written on the H100)."""
    data = json.loads((REAL / "runners-h100-2026-12-07.json").read_text())
    probe = from_runner_probe(data, run_id="h100")[runner]
    return replace(probe, server=runner, axes={"moe_runner_backend": runner}, probe_key="probe")


def test_real_answers_against_themselves_are_the_same_outputs():
    triton = real_answers("triton")
    result = compare_answers(triton, triton, tolerance=0.05)
    assert result.verdict == SAME
    assert result.first_token_agree == result.prompts == 4
    assert result.prefix_min == 8 and result.max_logprob_diff == 0.0


def test_real_runner_pair_is_numerical_noise_at_a_calibrated_tolerance():
    """triton_kernel vs triton on the rehearsal model: 28 of 32 greedy tokens equal, the 4 that
    differ follow a flip between two exactly tied tokens (margin 0.0000), and logprobs on the
    same context differ by up to 0.094 (bf16 kernels)."""
    base, cand = real_answers("triton"), real_answers("triton_kernel")
    loose = compare_answers(base, cand, tolerance=0.25)
    assert loose.verdict == WITHIN
    assert loose.first_token_agree == 4
    assert loose.prefix_min == 1
    assert 0.09 < loose.max_logprob_diff < 0.1
    flip = next(r for r in loose.per_prompt if r.agree_prefix < r.tokens)
    assert flip.verdict == WITHIN and "near-tie" in flip.why
    # Below the kernels' own noise the same pair is called different: the tolerance matters.
    assert compare_answers(base, cand, tolerance=0.05).verdict == DIFFER


def test_wrong_tokens_at_full_speed_differ_whatever_the_tolerance():
    base = real_answers("triton")
    shifted = [
        replace(
            a,
            tokens=[t + 1 for t in a.tokens],
            top=[[(lp, t + 1) for lp, t in pos] for pos in a.top],
        )
        for a in base.answers
    ]
    result = compare_answers(base, replace(base, answers=shifted), tolerance=10.0)
    assert result.verdict == DIFFER
    assert result.first_token_agree == 0 and result.prefix_min == 0
    assert "not in the other's top-k" in result.why


def test_answers_of_another_probe_are_not_comparable():
    base = real_answers("triton")
    result = compare_answers(base, replace(base, probe_key="other"), tolerance=0.2)
    assert result.verdict == NOT_COMPARABLE and "different probes" in result.line()


def test_sim_model_runner_noise_is_within_and_corruption_differs():
    def probe(runner: str, corrupt: bool = False) -> ProbeAnswers:
        answers = [
            Answer(prompt=f"p{key}", tokens=g.tokens, logprobs=[t[0][0] for t in g.top], top=g.top)
            for key in (1, 2, 3)
            for g in [greedy(key=key, length=16, runner=runner, corrupt=corrupt, top_k=5)]
        ]
        return replace(real_answers("triton"), server=runner, answers=answers)

    marlin = probe("marlin")
    assert compare_answers(marlin, probe("marlin"), tolerance=0.05).verdict == SAME
    assert compare_answers(marlin, probe("flashinfer_mxfp4"), tolerance=0.05).verdict == WITHIN
    bad = compare_answers(marlin, probe("flashinfer_mxfp4", corrupt=True), tolerance=0.05)
    assert bad.verdict == DIFFER and bad.first_token_agree == 0


def test_verdicts_pair_each_candidate_with_its_baseline_twin_and_reach_summary_and_rows():
    def at(runner: str, chunk: int) -> ProbeAnswers:
        return replace(
            real_answers(runner),
            server=f"{runner}-{chunk}",
            axes={"moe_runner_backend": runner, "chunked_prefill_size": chunk},
        )

    probes = [at("triton", 8192), at("triton_kernel", 8192), at("triton", 2048)]
    baseline = {"moe_runner_backend": "triton"}
    assert [(b.server, c.server) for b, c in pairs(probes, baseline)] == [
        ("triton-8192", "triton_kernel-8192")
    ]
    result = verdicts(probes, baseline=baseline, tolerance=0.2)
    assert [c["verdict"] for c in result["comparisons"]] == [WITHIN]
    assert verdicts(probes, baseline={}, tolerance=0.2)["note"].startswith("no baseline")
    summary = {
        "deltas": [
            {
                "axes": {
                    "moe_runner_backend": "triton_kernel",
                    "chunked_prefill_size": 8192,
                    "concurrency": 8,
                }
            }
        ]
    }
    with_verdicts(summary, result)
    assert summary["deltas"][0]["outputs"] == WITHIN
    assert "per_prompt" not in summary["equivalence"]["comparisons"][0]
    row = {"moe_runner_backend": "triton", "chunked_prefill_size": 2048}
    assert row_verdict(result, row) == "baseline"
    assert (
        row_verdict(result, {"moe_runner_backend": "triton_kernel", "chunked_prefill_size": 8192})
        == WITHIN
    )
    assert (
        row_verdict(result, {"moe_runner_backend": "triton_kernel", "chunked_prefill_size": 2048})
        == ""
    )


def test_probe_prompts_are_fixed_and_cover_the_matrix_input_lengths():
    exp = experiment()
    first, again = prompts(exp), prompts(exp)
    assert first == again
    lengths = {len(p.ids) for p in first}
    assert set(exp.equivalence.lengths) <= lengths
    assert exp.workload.input_len in lengths
    low, high = exp.equivalence.token_ids
    assert all(low <= t < high for p in first for t in p.ids)
    changed = exp.model_copy(
        update={"equivalence": exp.equivalence.model_copy(update={"output_len": 7})}
    )
    assert probe_key(changed) != probe_key(exp)


def test_parse_answer_reads_sglang_meta_info_and_refuses_an_empty_answer():
    body = {
        "text": "ab",
        "output_ids": [5, 6],
        "meta_info": {
            "output_token_logprobs": [[-0.5, 5, None], [-0.25, 6, None]],
            "output_top_logprobs": [[[-0.5, 5, None], [-1.5, 9, None]], [[-0.25, 6, None]]],
        },
    }
    answer = parse_answer("p", body)
    assert answer.tokens == [5, 6] and answer.logprobs == [-0.5, -0.25]
    assert answer.top[0] == [(-0.5, 5), (-1.5, 9)]
    with pytest.raises(ValueError, match="no output tokens"):
        parse_answer("p", {"meta_info": {}})


def test_answers_file_round_trip_and_a_foreign_file_is_named(tmp_path):
    probe = real_answers("triton")
    path = tmp_path / "a.json"
    path.write_text(json.dumps(probe.to_dict()))
    assert read_probe(path) == probe
    (tmp_path / "b.json").write_text("{}")
    with pytest.raises(ValueError, match="b.json"):
        read_probe(tmp_path / "b.json")


def test_a_run_against_an_earlier_run_compares_each_common_server_config():
    first = real_answers("triton")
    again = replace(first, run_id="later")
    other = replace(real_answers("triton_kernel"), server="only-in-b")
    rows = across_runs([first], [again, other], tolerance=0.25)
    assert [(r["candidate"], r["verdict"]) for r in rows] == [("triton", SAME)]
    assert rows[0]["candidate_run"] == "later" and "per_prompt" not in rows[0]
