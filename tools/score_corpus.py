"""Score `servesweep check` on the real corpus, tuned-on and held-out files apart (issue 28).

Every file of tests/fixtures/real/INDEX.md is judged as `servesweep check` judges it; a file is
held-out when `sha256(file name) % 3 == 0` (`checks.split_of`, fixed before the scanner
changed). Prints the headline per split, the score per label kind and every wrong verdict;
`--write` refreshes the table in docs/validation.md (between its score markers). Exit 1 when
the held-out goals (>= 90% of fatal logs caught, 0 false alarms, every silent failure caught,
0 healthy records invalid) are not met.

    python tools/score_corpus.py [--write]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from servesweep.measure import checks  # noqa: E402

CORPUS = REPO / "tests" / "fixtures" / "real"
DOC = REPO / "docs" / "validation.md"
BEGIN = "<!-- score_corpus: begin -->"
END = "<!-- score_corpus: end -->"


def refresh(doc: Path, table: str) -> None:
    """Replace the text between BEGIN and END in `doc` with `table`."""
    text = doc.read_text()
    head, sep, rest = text.partition(BEGIN)
    if not sep or END not in rest:
        raise SystemExit(f"{doc}: no {BEGIN} ... {END} markers")
    tail = rest.split(END, 1)[1]
    doc.write_text(f"{head}{BEGIN}\n{table}{END}{tail}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="refresh docs/validation.md")
    args = parser.parse_args(argv)
    rows = checks.corpus_rows(CORPUS)
    table = checks.render_scores(rows)
    print(table, end="")
    held_out = checks.split_scores(rows)["held-out"]
    print(f"held-out goals: {'met' if held_out.goals_met() else 'NOT met'}")
    if args.write:
        refresh(DOC, table)
    return 0 if held_out.goals_met() else 1


if __name__ == "__main__":
    sys.exit(main())
