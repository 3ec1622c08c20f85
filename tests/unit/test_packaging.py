"""The lock, pyproject.toml, the conda env and the README's install lines agree."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[2]
LOCK = REPO / "requirements-lock.txt"


def locked_versions() -> dict[str, str]:
    """name -> version of the pins that apply to this interpreter (markers evaluated)."""
    pins: dict[str, str] = {}
    env = default_environment()
    for line in LOCK.read_text().splitlines():
        if not line or line.startswith((" ", "#")):
            continue
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate(env):
            (spec,) = req.specifier
            assert spec.operator == "==", line
            pins[canonicalize_name(req.name)] = spec.version
    return pins


def direct_requirements() -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return [
        Requirement(r)
        for r in (*project["dependencies"], *project["optional-dependencies"]["test"])
    ]


def test_every_direct_requirement_is_pinned_within_its_range():
    pins = locked_versions()
    for req in direct_requirements():
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is not in the lock: run bash .ci/lock.sh"
        assert req.specifier.contains(pins[name], prereleases=True), (
            f"lock pins {req.name}=={pins[name]} outside {req.specifier}: run bash .ci/lock.sh"
        )


def test_conda_env_installs_through_the_lock():
    env_file = REPO / "envs" / "servesweep.yaml"
    pip_lines = next(
        d["pip"]
        for d in yaml.safe_load(env_file.read_text())["dependencies"]
        if isinstance(d, dict)
    )
    constraints = [line.split(None, 1)[1] for line in pip_lines if line.startswith("-c ")]
    assert [(env_file.parent / c).resolve() for c in constraints] == [LOCK]


def test_readme_install_lines_use_the_lock():
    installs = re.findall(r"^pip install .*$", (REPO / "README.md").read_text(), re.M)
    assert len(installs) >= 2
    assert all("-c requirements-lock.txt" in line for line in installs)


def test_readme_links_only_files_in_the_repo():
    """Every Markdown link of the README that is no URL names a file of this checkout."""
    text = (REPO / "README.md").read_text()
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    assert targets, "the README links its docs"
    local = [t for t in targets if "://" not in t]
    missing = [t for t in local if not (REPO / t).is_file() or ".." in Path(t).parts]
    assert not missing, missing
