"""Prompt token counts and the simulated output tokens (ids and words)."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

# Output token k of a request is the word WORDS[id % len(WORDS)] (with a leading space). Each
# is a single token for common BPE/SentencePiece vocabularies (GPT-2, Llama, Qwen, DeepSeek),
# so a client re-tokenizing the text gets (about) as many tokens as were generated.
WORDS = (" the", " of", " and", " to", " in", " is", " that", " for")
CHARS_PER_TOKEN = 4


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
