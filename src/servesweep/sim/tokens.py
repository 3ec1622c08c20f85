"""Prompt token counts and the simulated output tokens (ids, words, drift, special tokens)."""

from __future__ import annotations

import hashlib
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

# Output token k of a request is the word WORDS[id % len(WORDS)] (with a leading space). Each
# is a single token for common BPE/SentencePiece vocabularies (GPT-2, Llama, Qwen, DeepSeek),
# so a client re-tokenizing the text gets (about) as many tokens as were generated.
WORDS = (" the", " of", " and", " to", " in", " is", " that", " for")
CHARS_PER_TOKEN = 4


# Noise (on by default, --sim-clean turns it off): now and then a token is a word-suffix piece
# without a leading space, so the client's re-tokenization merges it into the previous word
# (one token fewer: drift like real decode/encode round trips, ratio 0.99-0.9995 per server);
# a 1-token output is sometimes a special token whose text is empty (skip_special_tokens).
SUFFIXES = ("s", "ed", "ing", "er", "ly")
SPECIAL_TOKEN_ID = 1000  # outside the word ids [0, 1000)
SPECIAL_TEXT = "<|im_end|>"  # its text when a request asks skip_special_tokens: false
DRIFT_RATE = (0.0005, 0.01)  # per-token suffix probability, drawn per server seed
SPECIAL_RATE = 0.01  # share of 1-token outputs that are a special token


def _unit(*parts: int) -> float:
    """A deterministic, well-mixed number in [0, 1) from integers (not crc32: consecutive
    request numbers would give correlated draws)."""
    digest = hashlib.blake2b(",".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


@dataclass(frozen=True)
class TextNoise:
    """Which output tokens decode to a suffix piece or to nothing, for one server seed."""

    seed: int
    enabled: bool = True
    special_rate: float = SPECIAL_RATE

    @property
    def drift_rate(self) -> float:
        low, high = DRIFT_RATE
        return low + (high - low) * _unit(self.seed, 3)

    def special(self, *, seq: int, max_new_tokens: int) -> bool:
        """Is the single output token of request `seq` a special token (empty text)?"""
        return self.enabled and max_new_tokens == 1 and _unit(self.seed, seq, 2) < self.special_rate

    def piece(self, *, token_id: int, seq: int, k: int, skip_special: bool = True) -> str:
        """The text of output token `k` (a suffix merges with the word before it; a special
        token is empty text unless the request asked skip_special_tokens: false)."""
        if token_id == SPECIAL_TOKEN_ID:
            return "" if skip_special else SPECIAL_TEXT
        if self.enabled and k > 0 and _unit(self.seed, seq, k, 1) < self.drift_rate:
            return SUFFIXES[token_id % len(SUFFIXES)]
        return output_word(token_id)


def count_text_tokens(text: str) -> int:
    """How many tokens a word-level tokenizer finds in the sim's text (one per word; a suffix
    piece is part of its word): the builtin client's re-tokenized count against the sim."""
    return len(text.split())


def output_id(*, seq: int, k: int) -> int:
    """Deterministic id in [0, 1000) of output token `k` of the request numbered `seq`."""
    return (seq * 7919 + k * 104729 + 17) % 1000


def output_word(token_id: int) -> str:
    """The text piece of one output token id."""
    return WORDS[token_id % len(WORDS)]


class PromptCounter:
    """Counts text prompt tokens with the model's `tokenizer.json` if the path has one,
    else estimates ceil(len(text) / 4) (deterministic; exact lengths need `input_ids`)."""

    def __init__(self, *, paths: list[str | None]) -> None:
        self.source = "estimate (4 characters per token)"
        self._tokenizer: Any = None
        for path in paths:
            if path and (Path(path) / "tokenizer.json").is_file():
                from tokenizers import Tokenizer  # optional dependency, only when present

                self._tokenizer = Tokenizer.from_file(str(Path(path) / "tokenizer.json"))
                self.source = str(Path(path) / "tokenizer.json")
                break

    def count(self, text: str) -> int:
        if self._tokenizer is not None:
            return len(self._tokenizer.encode(text).ids)
        return math.ceil(len(text) / CHARS_PER_TOKEN)
