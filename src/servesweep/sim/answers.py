"""The sim's stand-in for a model's greedy answers, for requests that ask for logprobs (the
equivalence probe): tokens and top-k logprobs are a function of the prompt's content, so every
server config answers a prompt alike. A MoE runner adds its own numerical noise (at most 1e-3,
far below a top-1 margin of 0.7), and `--sim-corrupt` answers other tokens at full speed, as
a broken kernel or a KV transfer that hands decode the wrong cache would."""

from __future__ import annotations

import hashlib
import zlib
from dataclasses import dataclass
from typing import Any

VOCAB = 32000
MARGIN = 0.7  # between consecutive ranks of the top-k
NOISE = 1e-3  # a runner's largest logprob offset


@dataclass(frozen=True)
class Greedy:
    """A whole greedy answer: per position the chosen token and the top-k (logprob, token)."""

    tokens: list[int]
    top: list[list[tuple[float, int]]]

    def meta(self, n: int, top_k: int) -> dict[str, Any]:
        """SGLang's meta_info logprob fields for the first `n` tokens."""
        return {
            "output_token_logprobs": [
                [top[0][0], tok, None] for tok, top in zip(self.tokens[:n], self.top, strict=False)
            ],
            "output_top_logprobs": [
                [[lp, t, None] for lp, t in pos[:top_k]] for pos in self.top[:n]
            ],
        }


def content_key(body: dict[str, Any]) -> int:
    """A prompt's content as a number: its token ids, else its text."""
    ids = body.get("input_ids")
    data = repr(ids) if ids is not None else str(body.get("text"))
    return zlib.crc32(data.encode())


def greedy(*, key: int, length: int, runner: str, corrupt: bool, top_k: int = 5) -> Greedy:
    """The answer to a prompt of content `key`: `length` tokens, `max(top_k, 2)` ranked each."""
    salt = "corrupt" if corrupt else "model"
    tokens, tops = [], []
    for pos in range(length):
        digest = hashlib.sha256(f"{salt}:{key}:{pos}".encode()).digest()
        ranked: list[int] = []
        for j in range(0, len(digest) - 1, 2):
            tok = 100 + int.from_bytes(digest[j : j + 2], "big") % (VOCAB - 100)
            if tok not in ranked:
                ranked.append(tok)
            if len(ranked) == max(top_k, 2):
                break
        top = [
            (-1.0 - MARGIN * rank + _noise(runner, key, pos, rank), tok)
            for rank, tok in enumerate(ranked)
        ]
        tokens.append(top[0][1])
        tops.append(top)
    return Greedy(tokens=tokens, top=tops)


def _noise(runner: str, key: int, pos: int, rank: int) -> float:
    """A runner's numerical offset, stable for the runner and position."""
    return (zlib.crc32(f"{runner}:{key}:{pos}:{rank}".encode()) % 1000) / 1000 * NOISE
