"""Text from files and data made safe to print on a terminal: no escape sequence gets through."""

from __future__ import annotations


def visible(text: str) -> str:
    """`text` with every character a terminal would act on rather than show (ESC and the other
    control characters, newlines included, bidirectional overrides and other format
    characters) written as its Python escape, `\\x1b` or `\\u202e`; printable text unchanged."""
    return "".join(c if c.isprintable() else _escape(c) for c in text)


def _escape(char: str) -> str:
    code = ord(char)
    return (
        f"\\x{code:02x}"
        if code < 0x100
        else f"\\u{code:04x}"
        if code < 0x10000
        else f"\\U{code:08x}"
    )


def visible_lines(text: str) -> str:
    """`text` line by line through `visible` (its own line breaks kept)."""
    return "\n".join(visible(line) for line in text.split("\n"))
