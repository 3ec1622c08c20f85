"""How a server process lives on a node: a detached process group, or a docker container."""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass, field
from typing import Protocol

from servesweep.errors import ServerStartError
from servesweep.transport import Transport

LABEL_PREFIX = "servesweep."
ENV_LABEL_PREFIX = "SERVESWEEP_LABEL_"
COMMAND_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Launch:
    """One server process to start on one node."""

    name: str
    node: str
    argv: list[str]
    log_path: str
    env: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)


class Runtime(Protocol):
    """Starts, inspects and removes server processes on nodes."""

    def command_line(self, launch: Launch) -> str:
        """The exact shell command `start` runs (written to service/<server>/commands.sh)."""
        ...

    def start(self, launch: Launch) -> str:
        """Start detached; return a handle (pid or container id)."""
        ...

    def is_running(self, node: str, handle: str) -> bool: ...

    def logs(self, node: str, handle: str, log_path: str) -> str:
        """The process's whole log so far."""
        ...

    def stop(self, node: str, handle: str) -> None:
        """Stop and remove; succeeds if it is already gone."""
        ...

    def find(self, node: str, labels: dict[str, str]) -> list[str]:
        """Handles of processes on `node` carrying all `labels` (stale-server search)."""
        ...


def label_env(labels: dict[str, str]) -> dict[str, str]:
    """Labels as environment variables (how a plain process carries them)."""
    return {ENV_LABEL_PREFIX + k.upper(): v for k, v in labels.items()}


class ProcessRuntime:
    """A detached process group started through the transport (`setsid`), labelled by env."""

    def __init__(self, transport: Transport) -> None:
        self.transport = transport

    def command_line(self, launch: Launch) -> str:
        env = {**launch.env, **label_env(launch.labels)}
        assigns = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        argv = " ".join(shlex.quote(a) for a in launch.argv)
        log = shlex.quote(launch.log_path)
        return (
            f"mkdir -p $(dirname {log}) && "
            f"env {assigns} setsid {argv} > {log} 2>&1 < /dev/null & echo $!"
        )

    def start(self, launch: Launch) -> str:
        res = self.transport.run(launch.node, self.command_line(launch), timeout=COMMAND_TIMEOUT_S)
        pid = res.stdout.strip().splitlines()[-1] if res.stdout.strip() else ""
        if not res.ok or not pid.isdigit():
            raise ServerStartError(
                f"could not start {launch.name} on node {launch.node}: {res.stderr.strip()}"
            )
        return pid

    def is_running(self, node: str, handle: str) -> bool:
        # A zombie (state Z) counts as gone.
        cmd = f"ps -o stat= -p {int(handle)}"
        res = self.transport.run(node, cmd, timeout=COMMAND_TIMEOUT_S)
        return res.ok and bool(res.stdout.strip()) and not res.stdout.strip().startswith("Z")

    def logs(self, node: str, handle: str, log_path: str) -> str:
        res = self.transport.run(node, f"cat {shlex.quote(log_path)}", timeout=COMMAND_TIMEOUT_S)
        return res.stdout

    def stop(self, node: str, handle: str, grace_s: float = 10.0) -> None:
        pgid = int(handle)
        self.transport.run(node, f"kill -TERM -{pgid} 2>/dev/null", timeout=COMMAND_TIMEOUT_S)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if not self.is_running(node, handle):
                return
            time.sleep(0.1)
        self.transport.run(node, f"kill -KILL -{pgid} 2>/dev/null", timeout=COMMAND_TIMEOUT_S)

    def find(self, node: str, labels: dict[str, str]) -> list[str]:
        wanted = [f"{k}={v}" for k, v in label_env(labels).items()]
        greps = " && ".join(f'grep -qxF {shlex.quote(w)} "$t"' for w in wanted)
        script = (
            "t=$(mktemp); for p in /proc/[0-9]*; do "
            'tr "\\0" "\\n" < $p/environ > "$t" 2>/dev/null || continue; '
            f"if {greps}; then pid=${{p#/proc/}}; "
            '[ "$(ps -o pgid= -p $pid | tr -d " ")" = "$pid" ] && echo $pid; fi; done; rm -f "$t"'
        )
        res = self.transport.run(node, script, timeout=COMMAND_TIMEOUT_S)
        return [line for line in res.stdout.split() if line.isdigit()]
