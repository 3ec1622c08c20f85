"""Tests of core.terminal: text from data printed without escape sequences."""

from __future__ import annotations

from servesweep.core.terminal import visible, visible_lines


def test_escapes_and_controls_are_shown_printable_text_kept():
    text = "a\x1b[2J\x1b]0;t\x07b\tc\u202ed é ✓ \x7f\x9b"
    assert visible(text) == "a\\x1b[2J\\x1b]0;t\\x07b\\x09c\\u202ed é ✓ \\x7f\\x9b"
    assert visible("plain text, 1.5 ms") == "plain text, 1.5 ms"


def test_lines_keep_their_breaks():
    assert visible_lines("one\x1b\ntwo\r") == "one\\x1b\ntwo\\x0d"
