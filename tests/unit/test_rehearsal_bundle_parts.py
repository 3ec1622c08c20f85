"""tools/rehearsal/run.sh gathers a bundle carried as parts, one per device call: the device
tool's 64 MiB carry counts the checkout too, and the whole bundle stopped fitting beside it."""

from __future__ import annotations

import io
import lzma
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

from tests.helpers import REPO


def bundle(files: dict[str, bytes]) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return lzma.compress(raw.getvalue())


def carry(checkout: Path, parts: dict[str, bytes]) -> None:
    """A fresh copy of the checkout per call: only what this call carries is in .bundle/."""
    shutil.rmtree(checkout / ".bundle", ignore_errors=True)
    (checkout / ".bundle").mkdir()
    for name, data in parts.items():
        (checkout / ".bundle" / name).write_bytes(data)


def call(checkout: Path, tmp: Path, step: str) -> tuple[int, str]:
    env = {**os.environ, "OUT": str(tmp / "out"), "WORK": str(tmp / "work")}
    (tmp / "out").mkdir(exist_ok=True)
    proc = subprocess.run(
        ["bash", "tools/rehearsal/run.sh", step],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return proc.returncode, proc.stdout


def split(data: bytes, n: int, name: str) -> list[dict[str, bytes]]:
    size = -(-len(data) // n)
    return [{f"{name}.tar.xz.{k + 1}of{n}": data[k * size : (k + 1) * size]} for k in range(n)]


def test_parts_carried_in_separate_calls_unpack_once_all_are_there(tmp_path: Path) -> None:
    checkout = tmp_path / "checkout"
    (checkout / "tools").mkdir(parents=True)
    shutil.copytree(REPO / "tools" / "rehearsal", checkout / "tools" / "rehearsal")
    site = bundle({"site.txt": b"site", "noise": os.urandom(4000)})
    pd = bundle({"pd.txt": b"pd", "noise2": os.urandom(4000)})
    site_1, site_2 = split(site, 2, "site")
    pd_1, pd_2 = split(pd, 2, "pd")

    carry(checkout, site_1)
    rc, out = call(checkout, tmp_path, "receive")
    assert rc == 0 and "bundle site: 1 of 2 parts here" in out
    carry(checkout, {})
    rc, out = call(checkout, tmp_path, "builtin")  # a step before the bundle is whole
    assert rc == 2 and "no complete bundle" in out
    carry(checkout, site_2)
    rc, out = call(checkout, tmp_path, "receive")
    assert rc == 0 and "bundle: complete and unpacked" in out
    assert (tmp_path / "work" / "site" / "site.txt").read_bytes() == b"site"

    carry(checkout, pd_1)
    rc, out = call(checkout, tmp_path, "receive")
    assert rc == 0 and "bundle pd: 1 of 2 parts here" in out
    carry(checkout, {})
    rc, out = call(checkout, tmp_path, "pd-probe")
    assert rc == 2 and "the PD bundle is incomplete" in out
    carry(checkout, pd_2)
    rc, out = call(checkout, tmp_path, "receive")
    assert rc == 0 and (tmp_path / "work" / "site" / "pd.txt").read_bytes() == b"pd"
    assert not list((tmp_path / "work" / "parts").iterdir())  # parts are not kept twice
