"""Tests of workflow.ratelimit: Snakemake's rate limiter is dropped, and only where meant."""

from __future__ import annotations

import logging
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from servesweep.workflow.ratelimit import unthrottle_scheduler


def test_only_the_local_executor_is_unthrottled() -> None:
    scheduler = SimpleNamespace(job_rate_limiter=object())
    assert not unthrottle_scheduler(SimpleNamespace(local_exec=False, scheduler=scheduler))
    assert scheduler.job_rate_limiter is not None
    assert unthrottle_scheduler(SimpleNamespace(local_exec=True, scheduler=scheduler))
    assert scheduler.job_rate_limiter is None


def test_a_snakemake_without_the_attribute_gets_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        done = unthrottle_scheduler(SimpleNamespace(local_exec=True, scheduler=SimpleNamespace()))
    assert not done
    assert "job_rate_limiter" in caplog.text


UNTHROTTLE_SNAKEFILE = """
from servesweep.workflow.ratelimit import unthrottle_scheduler

if config["unthrottle"]:
    onstart:
        unthrottle_scheduler(workflow)

onsuccess:
    with open("limiter.txt", "w") as fh:
        fh.write(type(workflow.scheduler.job_rate_limiter).__name__)

rule done:
    output: "done.txt"
    shell: "touch {output}"
"""


@pytest.mark.workflow
@pytest.mark.parametrize(("unthrottle", "limiter"), [(True, "NoneType"), (False, "JobRateLimiter")])
def test_unthrottle_scheduler_drops_the_rate_limiter_of_a_real_run(
    tmp_path: Path, unthrottle: bool, limiter: str
) -> None:
    # The control run shows the attribute exists in the installed Snakemake: without it the
    # getattr in unthrottle_scheduler would silently do nothing.
    (tmp_path / "Snakefile").write_text(UNTHROTTLE_SNAKEFILE)
    exe = shutil.which("snakemake")
    assert exe, "snakemake is not installed"
    proc = subprocess.run(
        [exe, "--cores", "1", "--config", f"unthrottle={unthrottle}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "limiter.txt").read_text() == limiter
