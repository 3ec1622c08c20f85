"""Stage SGLang's own bench_serving from the PyPI wheel so it runs without torch (SGLANG.md 2)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Mapping
from pathlib import Path

SGLANG_VERSION = "0.5.23"
WHEEL_CACHE = Path("~/.cache/servesweep/wheels").expanduser()
BENCH_MODULE = "sglang.benchmark.serving"
BENCH_PREFIX = "sglang/benchmark/"

# Stub modules bench imports from sglang.srt (the real ones pull torch).
STUBS = {
    "sglang/__init__.py": "",
    "sglang/srt/__init__.py": "",
    "sglang/srt/disaggregation/__init__.py": "",
    "sglang/srt/disaggregation/utils.py": 'FAKE_BOOTSTRAP_HOST = "2.2.2.2"\n',
    "sglang/srt/utils/__init__.py": "",
    "sglang/srt/utils/network.py": '''"""Stub of sglang.srt.utils.network for bench_serving."""


def _host(host):
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def resolve_base_url(base_url, host, port):
    return base_url if base_url else f"http://{_host(host)}:{port}"


def resolve_host_port(base_url, host, port):
    return base_url if base_url else f"{_host(host)}:{port}"
''',
    # HF `datasets` is only needed by datasets bench never loads for random-ids.
    "datasets.py": (
        "def load_dataset(*args, **kwargs):\n"
        '    raise RuntimeError("datasets is stubbed out for bench_serving random-ids")\n'
    ),
}


class WheelNotFound(RuntimeError):
    """No sglang wheel in $SGLANG_WHEEL or the cache, and downloading it failed."""


def find_wheel(
    version: str = SGLANG_VERSION, *, cache: Path = WHEEL_CACHE, download: bool = True
) -> Path:
    """$SGLANG_WHEEL, else a cached `sglang-<version>-*.whl`, else `pip download` into the
    cache (the only step that needs the network)."""
    env = os.environ.get("SGLANG_WHEEL")
    if env:
        path = Path(env).expanduser()
        if not path.is_file():
            raise WheelNotFound(f"SGLANG_WHEEL={env} is not a file")
        return path
    found = sorted(cache.glob(f"sglang-{version}-*.whl"))
    if found:
        return found[-1]
    if not download:
        raise WheelNotFound(f"no sglang-{version} wheel in {cache}")
    cache.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", f"sglang=={version}", "--no-deps"]
    res = subprocess.run([*cmd, "-d", str(cache)], capture_output=True, text=True)
    found = sorted(cache.glob(f"sglang-{version}-*.whl"))
    if res.returncode != 0 or not found:
        raise WheelNotFound(f"pip download sglang=={version} failed: {res.stderr[-500:]}")
    return found[-1]


def stage_bench(*, wheel: Path, dest: Path) -> Path:
    """Extract `sglang/benchmark/` plus the stubs into `dest`; put `dest` on PYTHONPATH."""
    dest.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as zf:
        members = [n for n in zf.namelist() if n.startswith(BENCH_PREFIX)]
        if not any(n.endswith("benchmark/serving.py") for n in members):
            raise WheelNotFound(f"{wheel} has no {BENCH_PREFIX}serving.py (sglang < 0.5.17?)")
        zf.extractall(dest, members=members)
    for rel, text in STUBS.items():
        path = dest / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return dest


def bench_env(*, staged: Path, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for running the staged bench: offline HF, loopback never proxied."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(staged), env.get("PYTHONPATH")) if p)
    env["HF_HUB_OFFLINE"] = "1"
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    return env


def cached_stage(*, dest: Path, version: str = SGLANG_VERSION) -> Path:
    """Find (or download) the wheel and stage it into a fresh `dest`."""
    if dest.exists():
        shutil.rmtree(dest)
    return stage_bench(wheel=find_wheel(version), dest=dest)
