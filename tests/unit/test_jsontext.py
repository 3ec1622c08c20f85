"""indented_json writes what json.dumps(indent=2, allow_nan=False) writes."""

import json
import math

import numpy as np
import pytest

from servesweep.core.jsontext import indented_json


@pytest.mark.parametrize(
    "value",
    [
        [],
        {},
        1,
        "s",
        None,
        [[]],
        {"a": {"b": []}},
        {"a": [1, 2.5, None, True, False, 'é\n"x', -0.0, 1e300, 1e-7, (1, (2,))], "b": {"c": {}}},
    ],
)
def test_same_text_as_json_dumps(value):
    assert indented_json(value) == json.dumps(value, indent=2, allow_nan=False)


def test_leaf_and_keys():
    def leaf(v):
        if isinstance(v, np.generic):
            v = v.item()
        return None if isinstance(v, float) and not math.isfinite(v) else v

    value = {1: [np.float64(0.1), np.int64(3), float("nan")]}
    assert indented_json(value, leaf=leaf) == json.dumps({"1": [0.1, 3, None]}, indent=2)


@pytest.mark.parametrize(
    ("value", "error"),
    [({"x": float("nan")}, ValueError), ({"x": object()}, TypeError), ([np.int64(1)], TypeError)],
)
def test_errors_as_json(value, error):
    with pytest.raises(error):
        json.dumps(value, indent=2, allow_nan=False)
    with pytest.raises(error):
        indented_json(value)
