"""Shared test helpers: free ports, experiment files, running real snakemake."""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from tests.support.simprocess import free_port  # noqa: F401 (re-exported)

REPO = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = REPO / "config" / "config.yaml"


def two_configs_one_cell() -> dict[str, Any]:
    """The smallest matrix that starts two server configs: the MoE runners marlin and
    flashinfer_mxfp4, one client cell of 8 requests at concurrency 4 (a fresh dict per call)."""
    return {
        "matrix": {
            "server": {
                "moe_runner_backend": ["marlin", "flashinfer_mxfp4"],
                "chunked_prefill_size": [8192],
            },
            "client": {"concurrency": [4]},
        },
        "workload": {"input_len": 2048, "num_requests": 8},
    }


def deep_update(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """Recursively merge `changes` into a copy of `base` (lists are replaced)."""
    out = copy.deepcopy(base)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_update(out[key], value)
        else:
            out[key] = value
    return out


def experiment_file(directory: Path, changes: dict[str, Any], name: str = "exp.yaml") -> Path:
    """The default experiment with `changes` merged in and fresh ports, written to a file."""
    raw = yaml.safe_load(DEFAULT_CONFIG.read_text())
    raw = deep_update(raw, {"engine": {"port": free_port(), "dist_init_port": free_port()}})
    raw = deep_update(raw, changes)
    path = directory / name
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def run_snakemake(
    workdir: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 900
) -> subprocess.CompletedProcess[str]:
    """Run the real snakemake CLI on this repo's Snakefile in `workdir`."""
    exe = shutil.which("snakemake")
    assert exe, "snakemake is not installed"
    full_env = {**os.environ, **(env or {})}
    for var in (
        "RUN_ID",
        "BACKENDS_CSV",
        "CHUNKED_PREFILL_SIZES_CSV",
        "CONCURRENCIES_CSV",
        "EP_SIZE",
        "SUITE",
    ):
        if env is None or var not in env:
            full_env.pop(var, None)
    return subprocess.run(
        [exe, "-s", str(REPO / "Snakefile"), "-d", str(workdir), *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
    )


def wait_until(predicate: Callable[[], bool], limit_s: float = 30.0) -> bool:
    """Poll `predicate` until it holds or `limit_s` passes (a bound, not a timing assert)."""
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()
