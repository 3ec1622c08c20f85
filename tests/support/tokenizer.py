"""A small local Hugging Face tokenizer directory for clients that need one offline."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace

SPECIAL = ("[UNK]", "[PAD]")
DEFAULT_VOCAB_SIZE = 4096
# The sim's output words (servesweep.sim.tokens.WORDS, without their leading space).
FALLBACK_SIM_WORDS = ("the", "of", "and", "to", "in", "is", "that", "for")


def sim_words() -> list[str]:
    """The words the simulated engine generates, so they are real vocabulary entries."""
    try:
        from servesweep.sim.tokens import WORDS
    except ImportError:
        return list(FALLBACK_SIM_WORDS)
    return [w.strip() for w in WORDS if w.strip()]


def build_tokenizer(
    dest: Path, *, words: Sequence[str] = (), vocab_size: int = DEFAULT_VOCAB_SIZE
) -> Path:
    """Save a WordLevel tokenizer (whitespace/punctuation pre-split, unknown words -> [UNK],
    so a text re-tokenizes to its word count) that `AutoTokenizer.from_pretrained(dest)` loads.

    The vocabulary is the special tokens, `words` (e.g. the sim's output words), then fillers
    `w0, w1, ...` up to `vocab_size` ids (the random-ids range bench_serving uses).
    """
    from transformers import PreTrainedTokenizerFast

    vocab: dict[str, int] = {}
    for token in (*SPECIAL, *words):
        vocab.setdefault(token, len(vocab))
    filler = 0
    while len(vocab) < vocab_size:
        vocab.setdefault(f"w{filler}", len(vocab))
        filler += 1
    tok = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]")
    dest.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(dest))
    return dest
