"""runs_csv_text writes what pandas' to_csv(index=False) writes."""

import numpy as np
import pandas as pd
import pytest

from servesweep.analysis.tablecsv import runs_csv_text

TABLES = {
    "empty": pd.DataFrame(
        {
            "server_id": pd.Series([], dtype=object),
            "client_id": pd.Series([], dtype=object),
            "repeat": np.array([], dtype=np.int64),
            "ttft_ms": np.array([], dtype=float),
        }
    ),
    "quoting and floats": pd.DataFrame(
        {
            "server_id": ['a,"b"', 'a,"b"', "x\ny", "c"],
            "client_id": ["k", "k", "k", ""],
            "repeat": np.array([1, 1, 1, 2]),
            "ttft_ms": [1e-7, np.nan, -0.0, 1e16],
            "e2e_ms": [np.inf, 1.5, 2.0, 2068.8588072585044],
        }
    ),
    "pandas strings": pd.DataFrame(
        {"server_id": pd.Series(["a", "a"], dtype="string"), "repeat": [1, 2], "x": [0.1, 0.2]}
    ),
    # other layouts: written by pandas itself
    "missing id": pd.DataFrame({"server_id": ["a", None], "repeat": [1, 2], "x": [1.0, 2.0]}),
    "float ids": pd.DataFrame({"server_id": ["a", "b"], "repeat": [1.0, np.nan], "x": [1.0, 2.0]}),
}


@pytest.mark.parametrize("name", TABLES)
def test_same_text_as_pandas(name):
    df = TABLES[name]
    ids = 3 if "client_id" in df else 2
    assert runs_csv_text(df, ids=ids) == df.to_csv(index=False)
