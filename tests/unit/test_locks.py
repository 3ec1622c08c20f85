"""measure.locks.hold_run_lock: one live snakemake per run."""

from __future__ import annotations

import pytest

from servesweep.core.errors import RunLocked
from servesweep.measure.locks import hold_run_lock


def test_a_second_holder_of_a_run_is_refused_naming_the_first(tmp_path):
    path = tmp_path / "run" / ".locks" / "run.lock"
    first = hold_run_lock(path, run_id="r1", holder="snakemake pid 11")
    try:
        with pytest.raises(
            RunLocked, match=r"run r1 .*another live snakemake \(snakemake pid 11\)"
        ):
            hold_run_lock(path, run_id="r1", holder="snakemake pid 12")
        assert path.read_text() == "snakemake pid 11"  # the refused one wrote nothing
    finally:
        first.close()
    again = hold_run_lock(path, run_id="r1", holder="snakemake pid 12")  # released with its file
    again.close()
    assert path.read_text() == "snakemake pid 12"
