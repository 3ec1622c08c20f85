"""Loading an experiment: YAML, site file, env narrowing, and one-line errors naming the key."""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import TypeAdapter, ValidationError

from servesweep.config.experiment import Experiment
from servesweep.config.schema import ServerArgs, Workload, error_key
from servesweep.config.site import apply_site
from servesweep.core.bounds import TooLarge, check_size
from servesweep.core.errors import ConfigError

# Env variables that set one matrix axis from a comma-separated list (as in seed 000).
SERVER_AXIS_ENV = {
    "BACKENDS_CSV": "moe_runner_backend",
    "CHUNKED_PREFILL_SIZES_CSV": "chunked_prefill_size",
}
CLIENT_AXIS_ENV = {"CONCURRENCIES_CSV": "concurrency"}
# Env variables that set one shared server argument.
SERVER_ARG_ENV = {"EP_SIZE": "ep_size"}
# Env variable that picks the load generator (client.kind: builtin | bench_serving).
CLIENT_KIND_ENV = "CLIENT_KIND"
# Env variables that only select what runs: aggregates still cover every finished cell-repeat
# of the run's configured matrix (config.unnarrowed_env).
NARROWING_ENV = frozenset({*SERVER_AXIS_ENV, *CLIENT_AXIS_ENV, "SUITE"})
# Every env variable an experiment reads (apply_env), in the order a command line shows them.
EXPERIMENT_ENV = (
    "RUN_ID",
    "SUITE",
    CLIENT_KIND_ENV,
    *SERVER_ARG_ENV,
    *SERVER_AXIS_ENV,
    *CLIENT_AXIS_ENV,
)


def first_error(exc: ValidationError) -> str:
    key, msg = error_key(exc)
    return f"{key}: {msg}" if key else msg


def format_error(exc: ValidationError) -> str:
    key, msg = error_key(exc, Experiment)
    return f"config key '{key or '<top level>'}': {msg}"


def _csv(value: str, name: str) -> list[str]:
    """The items of an env list; an empty one, or an empty item (`8,,16`), is an error (an
    unset variable, not an empty one, keeps the config's axis)."""
    items = [v.strip() for v in value.split(",")]
    if not any(items):
        raise ConfigError(
            f"env {name}={value!r}: empty list (unset it to keep the config's values)"
        )
    if not all(items):
        raise ConfigError(f"env {name}={value!r}: empty item in the comma-separated list")
    return items


def apply_env(raw: Mapping[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
    """Return a copy of the raw config with RUN_ID, SUITE, CLIENT_KIND, EP_SIZE and the *_CSV
    axes applied."""
    data = json.loads(json.dumps(dict(raw), default=str))
    if "RUN_ID" in env:
        if not env["RUN_ID"].strip():
            raise ConfigError(
                "env RUN_ID='': empty (unset it to keep the config's run_id, or name the run)"
            )
        data["run_id"] = env["RUN_ID"]
    if env.get("SUITE"):
        data["suite"] = env["SUITE"]
    if CLIENT_KIND_ENV in env:
        if not env[CLIENT_KIND_ENV].strip():
            raise ConfigError(
                f"env {CLIENT_KIND_ENV}={env[CLIENT_KIND_ENV]!r}: empty (unset it to keep the "
                "config's client.kind)"
            )
        data.setdefault("client", {})["kind"] = env[CLIENT_KIND_ENV].strip()
    for var, arg in SERVER_ARG_ENV.items():
        if var in env:
            if not env[var].strip():
                raise ConfigError(f"env {var}={env[var]!r}: empty (unset it to keep the config's)")
            data.setdefault("server", {})[arg] = env[var]
    matrix = data.setdefault("matrix", {})
    for side, table in (("server", SERVER_AXIS_ENV), ("client", CLIENT_AXIS_ENV)):
        for var, axis in table.items():
            if var in env:
                matrix.setdefault(side, {})[axis] = _csv(env[var], var)
    return data


def env_var_of_key(key: str, env: Mapping[str, str]) -> str | None:
    """The env variable that set config key `key` (EP_SIZE: server.ep_size, ...), if one did."""
    keys = {
        "RUN_ID": "run_id",
        "SUITE": "suite",
        CLIENT_KIND_ENV: "client.kind",
        **{var: f"server.{arg}" for var, arg in SERVER_ARG_ENV.items()},
    }
    return next((var for var, k in keys.items() if k == key and var in env), None)


def unnarrowed_env(env: Mapping[str, str]) -> dict[str, str]:
    """`env` without the variables that narrow what runs (the run's full matrix)."""
    return {k: v for k, v in env.items() if k not in NARROWING_ENV}


def env_var_of(side: str, axis: str, env: Mapping[str, str]) -> str | None:
    """The env variable that set this matrix axis, if one did."""
    table = SERVER_AXIS_ENV if side == "server" else CLIENT_AXIS_ENV
    return next((var for var, name in table.items() if name == axis and var in env), None)


def _coerce_axes(data: dict[str, Any], env: Mapping[str, str]) -> None:
    """Coerce axis values to their field types so '8192' from an env CSV equals 8192; a value
    that is not one names the env variable it came from, if any."""
    matrix = data.get("matrix") or {}
    for side, model in (("server", ServerArgs), ("client", Workload)):
        for name, values in (matrix.get(side) or {}).items():
            field = model.model_fields.get(name)
            if field is None or not isinstance(values, list):
                continue
            adapter = TypeAdapter(field.annotation)
            for value in values:
                try:
                    adapter.validate_python(value)
                except ValidationError as exc:
                    var = env_var_of(side, name, env)
                    key = f"config key 'matrix.{side}.{name}'"
                    if var:
                        key = f"env {var}={env[var]!r}: {key}: {value!r}"
                    raise ConfigError(f"{key}: {first_error(exc)}") from None
            matrix[side][name] = [adapter.validate_python(v) for v in values]


def load_experiment(
    raw: Mapping[str, Any],
    env: Mapping[str, str] | None = None,
    *,
    site_dir: str | Path | None = None,
    default_config: str | Path = "config/config.yaml",
) -> Experiment:
    """Validate a raw config (e.g. Snakemake's `config`) over its site file (`site:`), after
    env narrowing. `default_config`: the embedded default, as the hint for a config of
    `--config` overrides alone names it.

    The baseline must be in the configured matrix; after narrowing it may be absent (then no
    deltas are computed for the missing side).
    """
    env = env or {}
    try:
        check_size(raw)  # before anything copies it (a YAML alias bomb expands on copy)
    except TooLarge as exc:
        raise ConfigError(str(exc)) from None
    raw = apply_site(raw, site_dir)
    try:
        Experiment.model_validate(raw)
    except ValidationError as exc:
        hint = ""
        if not {"cluster", "engine", "matrix"} & set(raw):
            hint = (
                " (the config holds only overrides: --config replaces the embedded default;"
                f" keep the default under them: `{overrides_command(raw, default_config)}`)"
            )
        raise ConfigError(format_error(exc) + hint) from None
    data = apply_env(raw, env)
    _coerce_axes(data, env)
    baseline = data.pop("baseline", {}) or {}
    try:
        exp = Experiment.model_validate(data)
    except ValidationError as exc:
        key, _ = error_key(exc, Experiment)
        var = env_var_of_key(key, env)
        if var is not None:  # the value came from the environment: name the variable first
            raise ConfigError(f"env {var}={env[var]!r}: {format_error(exc)}") from None
        raise ConfigError(format_error(exc) + " (after env narrowing)") from None
    kept = {
        k: v
        for k, v in baseline.items()
        if v in exp.matrix.server.get(k, exp.matrix.client.get(k, []))
    }
    return exp.model_copy(update={"baseline": kept})


def overrides_command(overrides: Mapping[str, Any], default_config: str | Path) -> str:
    """`snakemake --configfile <default> --config k=v ...`: the overrides over the default
    (its path relative to the working folder where it lies under it, else absolute)."""
    path = Path(default_config).resolve()
    shown = path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path
    items = [
        f"{k}={v if isinstance(v, str | int | float) else json.dumps(v)}"
        for k, v in overrides.items()
    ]
    return shlex.join(["snakemake", "--configfile", str(shown), "--config", *items])


def site_dir_of(path: str | Path) -> Path | None:
    """config/site next to the folder of an experiment file (config/experiments/x.yaml), if
    there is one; else the checkout's (servesweep.config.site.DEFAULT_SITE_DIR)."""
    candidate = Path(path).resolve().parent.parent / "site"
    return candidate if candidate.is_dir() else None


def load_experiment_file(path: str | Path, env: Mapping[str, str] | None = None) -> Experiment:
    """Read a YAML experiment file and validate it (see `load_experiment`)."""
    return load_experiment(read_config_file(path), env, site_dir=site_dir_of(path))


def read_config_file(path: str | Path) -> dict[str, Any]:
    """A YAML config file's mapping; a missing, unreadable or malformed file is a ConfigError."""
    try:
        with open(path) as fh:
            raw = yaml.safe_load(fh) or {}
    except RecursionError:
        raise ConfigError(f"config file {path}: nested too deep") from None
    except OSError as exc:
        raise ConfigError(f"config file {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"config file {path}: not valid YAML{where}: {problem}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: top level must be a mapping")
    return raw
