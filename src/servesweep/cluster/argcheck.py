"""Every launch command of a run, parsed by the engine's own argument parser where it will run
(in the image, or by the node's python) before the first start: a flag that SGLang does not
know, or a value it rejects, fails in seconds instead of after a 10-minute start."""

from __future__ import annotations

import hashlib
import json
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

MARK = "SERVESWEEP-ARGS "

# The PD router's module per engine kind (serving.engines.router_command starts it).
ROUTER_MODULES = {"sglang": "sglang_router.launch_router", "sim": "servesweep.sim.router"}
MINI_LB = "--mini-lb"

# The parser of each engine kind: SGLang's own (`ServerArgs.add_cli_args`, as
# `sglang.srt.server_args.prepare_server_args` builds it), or the sim's.
PARSERS = {
    "sglang": (
        "import argparse\n"
        "from sglang.srt.server_args import ServerArgs\n"
        "p = argparse.ArgumentParser(prog='sglang.launch_server')\n"
        "ServerArgs.add_cli_args(p)\n"
    ),
    "sim": "from servesweep.sim.cli import build_parser\np = build_parser()\n",
}

# Parse each command's arguments; argparse's error() (unknown flag, ambiguous prefix, a
# rejected value or choice) raises instead of exiting, and each result is one marked line.
SNIPPET = """import json, sys


def parser():
{factory}    return p


def fail(message):
    raise ValueError(message)


for item in json.loads(sys.argv[1]):
    p = parser()
    p.error = fail
    try:
        p.parse_args(item["args"])
        error = None
    except (Exception, SystemExit) as exc:
        error = str(exc) or type(exc).__name__
    print({mark!r} + json.dumps({{"label": item["label"], "error": error}}), flush=True)
"""


@dataclass(frozen=True)
class LaunchArgs:
    """The arguments of one launch command (after `-m <module>`), and what it starts."""

    label: str  # e.g. "server config moe_runner_backend~marlin, prefill rank 0"
    args: list[str]


@dataclass(frozen=True)
class Rejected:
    """A launch command the engine's parser refused, and its message (names the flag)."""

    label: str
    error: str


def snippet(engine_kind: str) -> str:
    """The Python program that parses commands (JSON in argv[1]) with the engine's parser."""
    factory = "".join(f"    {line}\n" for line in PARSERS[engine_kind].splitlines())
    return SNIPPET.format(factory=factory, mark=MARK)


def parse_command(*, python: str, engine_kind: str, launches: Sequence[LaunchArgs]) -> str:
    """A shell command that parses every launch (each distinct argument list once)."""
    unique = list({json.dumps(x.args): x for x in launches}.values())
    items = json.dumps([{"label": x.label, "args": x.args} for x in unique])
    return f"{python} -c {shlex.quote(snippet(engine_kind))} {shlex.quote(items)}"


def rejected(output: str) -> tuple[int, list[Rejected]]:
    """(commands parsed, those refused) from the program's output."""
    results = [
        json.loads(line[len(MARK) :]) for line in output.splitlines() if line.startswith(MARK)
    ]
    return len(results), [Rejected(r["label"], r["error"]) for r in results if r["error"]]


def router_help(*, python: str, engine_kind: str) -> str:
    """The router's own `--help` (sglang-router has `--mini-lb` up to 0.3.2; its successor
    smg has none): smoked in the image before P and D spend a start."""
    return f"{python} -m {ROUTER_MODULES[engine_kind]} --help"


def digest(launches: Sequence[LaunchArgs]) -> str:
    """A key of the set of argument lists (labels aside): equal sets parse alike."""
    unique = sorted({json.dumps(x.args) for x in launches})
    return hashlib.sha256(json.dumps(unique).encode()).hexdigest()[:12]
