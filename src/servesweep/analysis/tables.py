"""results.csv and requests.csv read back (light: the summary's job needs no more of results)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd


def read_results_csv(path: str | Path) -> pd.DataFrame:
    """Read results.csv back (integer columns stay integers where they have no gaps)."""
    return pd.read_csv(path)


def read_requests_csv(path: str | Path) -> pd.DataFrame:
    """Read requests.csv back; the floats come back bit for bit (tests/unit/test_results.py)."""
    return pd.read_csv(path, dtype={"server_id": str, "client_id": str})
