"""An image's difference to the image it is built FROM (pip freeze delta, files under the
sglang package with hashes), and the breaches of what `runtime.build.contract` says must not
change."""

from __future__ import annotations

import re
import shlex
from typing import Any

from servesweep.config.schema import ImageContract

# One JSON line: every distribution's version (normalized names; the first on sys.path
# wins, as for an import), where the sglang package lives, and a hash of each of its files.
INVENTORY_PROBE = """import hashlib, importlib.metadata as m, importlib.util as u, json, pathlib, re
packages = {}
for d in m.distributions():
    packages.setdefault(re.sub(r"[-_.]+", "-", d.metadata["Name"] or "").lower(), d.version)
spec = u.find_spec("sglang")
root = pathlib.Path(spec.origin).parent if spec and spec.origin else None
files = {}
for f in sorted(root.rglob("*")) if root else []:
    if f.is_file() and "__pycache__" not in f.parts:
        files[f.relative_to(root).as_posix()] = hashlib.sha256(f.read_bytes()).hexdigest()[:16]
print(json.dumps({"packages": packages, "sglang_root": str(root) if root else None,
                  "files": files}))
"""

FROM_LINE = re.compile(r"^\s*FROM\s+(?:--platform=\S+\s+)?(\S+)", re.I | re.M)


def inventory_probe(python: str) -> str:
    """The shell command printing an image's inventory (run in the image)."""
    return f"{python} -c {shlex.quote(INVENTORY_PROBE)}"


def last_from(dockerfile_text: str) -> str | None:
    """The image the final stage of a Dockerfile starts FROM; None when it is an ARG."""
    found = FROM_LINE.findall(dockerfile_text)
    if not found or "$" in found[-1]:
        return None
    return found[-1]


def delta(base: dict[str, Any], built: dict[str, Any]) -> dict[str, Any]:
    """What differs: {name: [base version, built version]} per distribution, the sglang
    package's location in each, {path: [base hash, built hash]} per sglang file (None:
    absent)."""
    bp, cp = base.get("packages") or {}, built.get("packages") or {}
    bf, cf = base.get("files") or {}, built.get("files") or {}
    return {
        "packages": {
            n: [bp.get(n), cp.get(n)] for n in sorted({*bp, *cp}) if bp.get(n) != cp.get(n)
        },
        "sglang_root": [base.get("sglang_root"), built.get("sglang_root")],
        "sglang_files": {
            f: [bf.get(f), cf.get(f)] for f in sorted({*bf, *cf}) if bf.get(f) != cf.get(f)
        },
    }


def normalized(name: str) -> str:
    """A distribution name as PEP 503 compares it (the probe's keys are normalized so)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def breaches(contract: ImageContract, diff: dict[str, Any]) -> list[str]:
    """One phrase per breach of the contract ([] when none): a distribution added that
    `packages_may_be_added` does not name, one changed that `packages_may_change` does not
    name, any removed; the sglang package moved; another count of changed sglang files."""
    out = []
    may_change = {normalized(n) for n in contract.packages_may_change}
    may_be_added = {normalized(n) for n in contract.packages_may_be_added}
    for name, (was, now) in diff["packages"].items():
        if was is None:
            if name not in may_be_added:
                out.append(f"package {name} {now} added")
        elif now is None:
            out.append(f"package {name} {was} removed")
        elif name not in may_change:
            out.append(f"package {name} changed {was} -> {now}")
    base_root, built_root = diff["sglang_root"]
    if contract.same_sglang_tree and base_root != built_root:
        out.append(f"the sglang package moved: {base_root} -> {built_root} (tree replaced)")
    changed = len(diff["sglang_files"])
    if contract.sglang_files_changed is not None and changed != contract.sglang_files_changed:
        names = ", ".join(list(diff["sglang_files"])[:5]) or "none"
        out.append(
            f"{changed} sglang files differ, the contract says {contract.sglang_files_changed} "
            f"({names})"
        )
    return out
