"""Site files (config/site/<name>.yaml): a cluster's facts, each guessed value marked."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from servesweep.core.bounds import TooLarge, check_size
from servesweep.core.errors import ConfigError

SITE_KEY = "site"
GUESSES_KEY = "guesses"  # dotted keys whose values nobody has confirmed on the cluster yet
# The site folder of this checkout (config/site next to config/experiments).
DEFAULT_SITE_DIR = Path(__file__).resolve().parents[3] / "config" / "site"


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def site_path(name: str, site_dir: str | Path | None = None) -> Path:
    return Path(site_dir or DEFAULT_SITE_DIR) / f"{name}.yaml"


def read_site(name: str, site_dir: str | Path | None = None) -> tuple[dict[str, Any], list[str]]:
    """(the site's config keys, its guessed dotted keys); ConfigError names the key."""
    path = site_path(name, site_dir)
    if not path.is_file():
        raise ConfigError(f"config key 'site': no site file {path}")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"config key 'site': {path} must be a mapping")
    try:
        check_size(data)  # a YAML alias bomb expands when the site is merged
    except TooLarge as exc:
        where = str(exc).removeprefix("config key ")
        raise ConfigError(f"config key 'site': {path}: key {where}") from None
    guesses = data.pop(GUESSES_KEY, []) or []
    if not isinstance(guesses, list) or not all(isinstance(g, str) for g in guesses):
        raise ConfigError(f"config key 'site': {path}: {GUESSES_KEY} must be a list of keys")
    return data, guesses


def apply_site(raw: Mapping[str, Any], site_dir: str | Path | None = None) -> dict[str, Any]:
    """The experiment over its site file: experiment values win, `site` stays as the name;
    `guesses` holds the experiment's own and the site's guesses it still takes."""
    name = raw.get(SITE_KEY)
    if not name:
        return dict(raw)
    site, _ = read_site(str(name), site_dir)
    merged = _merge(site, raw)
    own = raw.get(GUESSES_KEY) or []
    if isinstance(own, list):  # else the schema names the key
        taken = [key for key, _, _ in guessed_values(raw, site_dir) if key not in own]
        merged[GUESSES_KEY] = [*own, *taken]
    return merged


def _lookup(data: Mapping[str, Any], dotted: str) -> tuple[bool, Any]:
    node: Any = data
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False, None
        node = node[part]
    return True, node


def guessed_values(
    raw: Mapping[str, Any], site_dir: str | Path | None = None
) -> list[tuple[str, Any, Path]]:
    """Values the experiment still takes from its site file's guesses (not overridden)."""
    name = raw.get(SITE_KEY)
    if not name:
        return []
    site, guesses = read_site(str(name), site_dir)
    out = []
    for key in guesses:
        in_site, value = _lookup(site, key)
        overridden, _ = _lookup(raw, key)
        if in_site and not overridden:
            out.append((key, value, site_path(str(name), site_dir)))
    return out
