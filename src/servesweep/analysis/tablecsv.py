"""CSV text of a long table (requests.csv) exactly as pandas' to_csv writes it, faster."""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Sequence

import numpy as np
import pandas as pd


def _row_text(values: Sequence[object]) -> str:
    """One CSV row as pandas writes it (csv.writer, minimal quoting), without its newline."""
    buf = io.StringIO()
    csv.writer(buf, lineterminator=os.linesep).writerow(values)  # it quotes what holds one
    return buf.getvalue()[: -len(os.linesep)]


def _fast_path(df: pd.DataFrame, ids: int) -> bool:
    """Whether `df` has the layout runs_csv_text formats itself: `ids` leading columns of
    int64 or of str values (no missing one), then float64 columns."""
    head, tail = df.dtypes.iloc[:ids], df.dtypes.iloc[ids:]
    if not all(t == np.float64 for t in tail) or len(tail) == 0:
        return False
    for col, dtype in head.items():
        if dtype == np.int64:
            continue
        if not pd.api.types.is_string_dtype(dtype):
            return False
        if not all(isinstance(v, str) for v in df[col].unique()):
            return False
    return True


def runs_csv_text(df: pd.DataFrame, *, ids: int) -> str:
    """`df.to_csv(index=False)`'s text for a table whose first `ids` columns repeat in runs
    (one run of rows per cell-repeat) and whose other columns are floats: each run's ids are
    formatted once, each float column at once (float repr, as pandas writes them; NaN empty).
    A table of any other layout is written by pandas itself."""
    if not _fast_path(df, ids):
        return df.to_csv(index=False)
    newline = os.linesep  # pandas' default lineterminator
    n = len(df)
    id_values = [df[c].to_numpy() for c in df.columns[:ids]]
    if n:
        changed = np.zeros(n - 1, dtype=bool)
        for v in id_values:
            changed |= v[1:] != v[:-1]
        starts = np.flatnonzero(np.r_[True, changed])
    else:
        starts = np.array([], dtype=np.intp)
    prefixes = [_row_text([v[s] for v in id_values]) + "," for s in starts.tolist()]
    prefix = np.repeat(np.array(prefixes, dtype=object), np.diff(np.r_[starts, n])).tolist()
    columns = []
    for col in df.columns[ids:]:
        v = df[col].to_numpy(dtype=float)
        text = list(map(float.__repr__, v.tolist()))
        for i in np.flatnonzero(np.isnan(v)).tolist():
            text[i] = ""
        columns.append(text)
    row = "{}" + ",".join(["{}"] * len(columns)) + newline.replace("{", "{{").replace("}", "}}")
    return _row_text(list(df.columns)) + newline + "".join(map(row.format, prefix, *columns))
