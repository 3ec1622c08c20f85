"""Stage SGLang's whole package from its PyPI wheel, with import stubs, so its real server
argument parser (`sglang.srt.server_args.ServerArgs.add_cli_args`) runs without a GPU."""

from __future__ import annotations

import os
import shutil
import zipfile
from collections.abc import Mapping
from pathlib import Path

STUBS = Path(__file__).with_name("sglang_import_stubs.py")


def stage_sglang(*, wheel: Path, dest: Path) -> Path:
    """Extract `sglang/` and its dist-info (the package metadata) into `dest`, and the import
    stubs as `dest/stubs/sitecustomize.py`; put both on PYTHONPATH (sglang_env)."""
    dest.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        members = [
            n for n in names if n.startswith("sglang/") or n.split("/")[0].endswith(".dist-info")
        ]
        zf.extractall(dest, members=members)
    (dest / "stubs").mkdir(exist_ok=True)
    shutil.copyfile(STUBS, dest / "stubs" / "sitecustomize.py")
    return dest


def sglang_env(*, staged: Path, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment in which `import sglang.srt.server_args` works from the staged tree (CPU
    platform, so no device is probed)."""
    env = dict(os.environ if base is None else base)
    paths = (str(staged / "stubs"), str(staged), env.get("PYTHONPATH"))
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    env["SGLANG_USE_CPU_ENGINE"] = "1"
    env["HF_HUB_OFFLINE"] = "1"
    return env
