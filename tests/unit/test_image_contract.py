"""The seeds' image contracts against real wheels' metadata: tiny wheels with the real
distribution names and versions, installed by pip into one throwaway venv per image, read by
the image-inventory probe build_images runs in an image (cluster.contract), and judged by the
contract each seed config declares."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from servesweep.cluster import contract
from servesweep.config.load import load_experiment_file
from servesweep.config.schema import ImageContract
from tests.helpers import REPO

# The sglang wheel's files; the seeds change some of them in place (patch -p1 in the image).
SGLANG_FILES = {
    "__init__.py": '__version__ = "0.5.23"\n',
    "srt/layers/moe/fused_moe_triton/layer.py": "# fused moe layer\n",
    "srt/layers/quantization/mxfp4.py": "# mxfp4 method\n",
    "srt/disaggregation/decode.py": "# decode\n",
    "srt/managers/scheduler_pp_mixin.py": "# pp mixin\n",
    "srt/server_args.py": "# server args\n",
}
SEED000_FILES = ["srt/layers/moe/fused_moe_triton/layer.py", "srt/layers/quantization/mxfp4.py"]
SEED003_FILES = ["srt/disaggregation/decode.py", "srt/managers/scheduler_pp_mixin.py"]


def _wheel(folder: Path, name: str, version: str, files: dict[str, str] | None = None) -> Path:
    """A pure-Python wheel of distribution `name` at `version` (files: module path -> text)."""
    stem = f"{name.replace('-', '_')}-{version}"
    info = f"{stem}.dist-info"
    members = dict(files or {f"{name.replace('-', '_')}_stub/__init__.py": ""})
    members[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    members[f"{info}/WHEEL"] = "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
    record = []
    for path, text in members.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{path},sha256={digest.decode()},{len(text.encode())}")
    members[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,"]) + "\n"
    path = folder / f"{stem}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for member, text in members.items():
            zf.writestr(member, text)
    return path


class _Image:
    """One venv at one path, built in layers as a Dockerfile builds an image: pip installs
    wheels (upgrading what is there), sglang files are changed in place (patch -p1); the
    inventory is what the probe build_images runs in an image prints."""

    def __init__(self, root: Path) -> None:
        self.root = root
        venv.create(root, with_pip=False)
        self.python = root / "bin" / "python"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "PYTHON"))}

    def install(self, *wheels: Path) -> _Image:
        subprocess.run(
            [sys.executable, "-m", "pip", "--isolated", "--python", str(self.python), "install"]
            + ["--no-index", "--no-deps", "--no-compile", "--quiet", *map(str, wheels)],
            check=True,
            env={**self.env, "PIP_CONFIG_FILE": os.devnull},
        )
        return self

    def patch(self, *files: str) -> _Image:
        (site,) = self.root.glob("lib/python*/site-packages")
        for rel in files:
            target = site / "sglang" / rel
            target.write_text(target.read_text() + "# patched\n")
        return self

    def inventory(self) -> dict:
        out = subprocess.run(
            contract.inventory_probe(str(self.python)),
            shell=True,
            capture_output=True,
            text=True,
            check=True,
            env=self.env,
        )
        return json.loads(out.stdout.splitlines()[-1])

    def save(self, to: Path) -> None:
        shutil.copytree(self.root, to, symlinks=True)

    def restore(self, saved: Path) -> None:
        shutil.rmtree(self.root)
        shutil.copytree(saved, self.root, symlinks=True)


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """The inventories of the seeds' images and of wrong ones, all at one path (as images)."""
    folder = tmp_path_factory.mktemp("images")
    sglang = {f"sglang/{rel}": text for rel, text in SGLANG_FILES.items()}
    w = {
        "sglang": _wheel(folder, "sglang", "0.5.23", sglang),
        "sgl-kernel": _wheel(folder, "sgl-kernel", "0.3.20"),
        "torch": _wheel(folder, "torch", "2.9.1"),
        "torch-2.10.0": _wheel(folder, "torch", "2.10.0"),
        "flashinfer": _wheel(folder, "flashinfer-python", "0.6.1"),
        "flashinfer-patched": _wheel(folder, "flashinfer-python", "0.6.1+sm120mxfp4"),
        "flashinfer-0.7.0": _wheel(folder, "flashinfer-python", "0.7.0"),
        "mooncake": _wheel(folder, "mooncake-transfer-engine", "0.3.12.post1"),
    }
    image = _Image(folder / "image")
    out = {}
    image.install(w["sglang"], w["sgl-kernel"], w["torch"], w["flashinfer"])
    out["base"] = image.inventory()
    # seed 000's Dockerfile: the patched FlashInfer wheel, two SGLang files patched = phase5
    out["phase5"] = image.install(w["flashinfer-patched"]).patch(*SEED000_FILES).inventory()
    image.save(folder / "phase5")
    out["phase5+third file"] = image.patch("srt/server_args.py").inventory()
    image.restore(folder / "phase5")
    out["phase5+torch"] = image.install(w["torch-2.10.0"]).inventory()
    image.restore(folder / "phase5")
    # seed 003's Dockerfile.pd on phase5: Mooncake, the two PRs' files
    out["pd"] = image.install(w["mooncake"]).patch(*SEED003_FILES).inventory()
    image.save(folder / "pd")
    out["pd+third file"] = image.patch("srt/server_args.py").inventory()
    image.restore(folder / "pd")
    out["pd+flashinfer"] = image.install(w["flashinfer-0.7.0"]).inventory()
    return out


def _contract(name: str) -> ImageContract:
    build = load_experiment_file(REPO / "config" / "experiments" / name).runtime.build
    assert build is not None and build.contract is not None, f"{name}: no runtime.build.contract"
    return build.contract


def test_seed_000s_contract_passes_its_patched_image_and_refuses_a_wrong_one(
    images: dict[str, dict],
) -> None:
    """Seed 000: the base's dependency set but the patched FlashInfer wheel
    (0.6.1 -> 0.6.1+sm120mxfp4), exactly two SGLang files changed."""
    c0 = _contract("moe_prefill_gate.yaml")
    diff = contract.delta(images["base"], images["phase5"])
    assert diff["packages"] == {"flashinfer-python": ["0.6.1", "0.6.1+sm120mxfp4"]}
    assert sorted(diff["sglang_files"]) == SEED000_FILES
    assert contract.breaches(c0, diff) == []
    assert contract.breaches(c0, contract.delta(images["base"], images["phase5+torch"])) == [
        "package torch changed 2.9.1 -> 2.10.0"
    ]
    third = contract.delta(images["base"], images["phase5+third file"])
    (found,) = contract.breaches(c0, third)
    assert found.startswith("3 sglang files differ, the contract says 2")
    assert contract.breaches(c0, contract.delta(images["base"], images["pd"])) == [
        "package mooncake-transfer-engine 0.3.12.post1 added",
        "4 sglang files differ, the contract says 2 ("
        + ", ".join(sorted([*SEED000_FILES, *SEED003_FILES]))
        + ")",
    ]


def test_seed_003s_contract_takes_mooncake_added_and_refuses_anything_else(
    images: dict[str, dict],
) -> None:
    """Seed 003: phase5 (seed 000's image) plus Mooncake 0.3.12.post1 and the two PRs' SGLang
    files, nothing else; the site file gives pd_standard.yaml its build and contract."""
    c3 = _contract("pd_standard.yaml")
    assert c3 == _contract("pd_pp1_control.yaml")  # the same image, one contract
    diff = contract.delta(images["phase5"], images["pd"])
    assert diff["packages"] == {"mooncake-transfer-engine": [None, "0.3.12.post1"]}
    assert sorted(diff["sglang_files"]) == SEED003_FILES
    assert contract.breaches(c3, diff) == []
    assert contract.breaches(c3, contract.delta(images["phase5"], images["pd+flashinfer"])) == [
        "package flashinfer-python changed 0.6.1+sm120mxfp4 -> 0.7.0"
    ]
    third = contract.delta(images["phase5"], images["pd+third file"])
    (found,) = contract.breaches(c3, third)
    assert found.startswith("3 sglang files differ, the contract says 2")
