"""How a server process lives on a node: a detached process group, or a docker container."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shlex
import site
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from servesweep.cluster.secrets import Secret, scrub
from servesweep.cluster.transport import CommandResult, Transport
from servesweep.config.schema import RuntimeConfig
from servesweep.core.errors import ConfigError, ServerStartError, TransportError
from servesweep.core.names import env_name, safe_segment

logger = logging.getLogger(__name__)

LABEL_PREFIX = "servesweep."
ENV_LABEL_PREFIX = "SERVESWEEP_LABEL_"
CLIENT_ENV = f"{ENV_LABEL_PREFIX}ROLE=client"  # a one-shot client's label
COMMAND_TIMEOUT_S = 60.0
# Prefix of each owner's private node directory `/tmp/servesweep-<owner tag>` (client records,
# logs; mounted into one-shot containers): owner_dir, node_dir_prep.
ONESHOT_DIR = "/tmp/servesweep"


@dataclass(frozen=True)
class Launch:
    """One server process to start on one node."""

    name: str
    node: str
    argv: list[str]
    log_path: str
    env: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    # False for the PD router: no --gpus, --device or --privileged (it only forwards HTTP).
    accelerators: bool = True
    # (NAME, value): an environment variable the process gets through the command's stdin,
    # never through argv, a file or a label (the service's API key, docs/access.md).
    secret_env: tuple[str, Secret] | None = None
    # The node's compile-cache folder (compile_cache_dir): made private before the start,
    # mounted at the same path into a container; its variables are in `env`.
    cache_dir: str | None = None


@dataclass(frozen=True)
class Labelled:
    """A process or container found on a node, with the labels it carries."""

    node: str
    handle: str
    labels: dict[str, str]


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

    def ended(self, node: str, handle: str) -> str:
        """What the cluster says of a process that is not running ("": nothing more than
        that it exited; Slurm: its allocation's state and reason)."""
        ...

    def stop(self, node: str, handle: str) -> None:
        """Stop and remove; succeeds if it is already gone."""
        ...

    def find(self, node: str, labels: dict[str, str]) -> list[str]:
        """Handles of processes on `node` carrying all `labels` (stale-server search)."""
        ...

    def labelled(self, node: str, labels: dict[str, str]) -> list[Labelled]:
        """Every process on `node` carrying all `labels`, with all its labels (any owner)."""
        ...

    def identity(self, node: str, handle: str) -> str:
        """What tells this process from a later one with the same handle (its start time);
        "" when it is gone."""
        ...

    def host_pids(self, node: str, handle: str) -> set[int]:
        """The node's pids of every process of server `handle` (as nvidia-smi lists them)."""
        ...

    def owns(self, node: str, handle: str, labels: dict[str, str], identity: str) -> bool:
        """Whether `handle` is still the process we started: it carries all `labels` and (when
        `identity` is known) the same identity. Checked before any signal."""
        ...

    def oneshot_line(self, launch: Launch, *, gpus: bool = False) -> str:
        """The shell command that runs `launch` to completion, output into its log_path."""
        ...

    def secret_env(self, node: str, handle: str, name: str) -> Secret | None:
        """The value of environment variable `name` the process was started with (read back
        over the transport, never logged); None if it has none or is gone."""
        ...

    def run_oneshot(self, launch: Launch, *, timeout: float, gpus: bool = False) -> CommandResult:
        """Run `launch` to completion (client, smoke test); its output goes to log_path."""
        ...


def owner_dir(tag: str) -> str:
    """An owner's private directory on a node, `ONESHOT_DIR-<owner tag>` (node_dir_prep makes
    it 0700 and refuses one that is a symlink or another user's)."""
    return f"{ONESHOT_DIR}-{safe_segment(tag, what='owner tag')}"


# Where SGLang's JIT compilers keep their output (each under the compile-cache folder):
# Triton's kernels, TorchInductor's (torch.compile), FlashInfer's JIT modules (the library
# appends .cache/flashinfer), DeepGEMM's kernels (SGLang overwrites DG_JIT_CACHE_DIR with
# SGLANG_DG_CACHE_DIR on import, so both are set) and the CUDA driver's PTX JIT cache.
COMPILE_CACHE_ENV = {
    "TRITON_CACHE_DIR": "triton",
    "TORCHINDUCTOR_CACHE_DIR": "inductor",
    "FLASHINFER_WORKSPACE_BASE": "flashinfer",
    "SGLANG_DG_CACHE_DIR": "deep_gemm",
    "DG_JIT_CACHE_DIR": "deep_gemm",
    "CUDA_CACHE_PATH": "cuda",
}
COMPILE_CACHE = "compile-cache"


def compile_cache_key(runtime: RuntimeConfig, engine_version: str) -> str:
    """The cache folder's name: the image's (docker, pyxis, apptainer) or, for the process
    runtime, the SGLang version's, as one path segment plus a hash of the whole name (two
    images never share a folder, whatever their names fold to)."""
    name = f"image:{runtime.image}" if runtime.imaged else f"sglang:{engine_version}"
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._-")[:80]
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return safe_segment(f"{readable}-{digest}", what="compile cache key")


def compile_cache_dir(runtime: RuntimeConfig, *, engine_version: str, owner_tag: str) -> str | None:
    """The node folder of this image's (or SGLang version's) compile caches; None when
    `runtime.compile_cache.enabled` is off."""
    cache = runtime.compile_cache
    if not cache.enabled:
        return None
    base = cache.base or f"{owner_dir(owner_tag)}/{COMPILE_CACHE}"
    return f"{base}/{compile_cache_key(runtime, engine_version)}"


def compile_cache_env(path: str) -> dict[str, str]:
    """The variables that point SGLang's JIT compilers into the cache folder `path`."""
    return {name: f"{path}/{sub}" for name, sub in COMPILE_CACHE_ENV.items()}


def cache_dir_prep(path: str) -> str:
    """Shell: make the compile-cache folder `path` and its parent (the base) private: each a
    real folder (no symlink) of the calling user, mode 0700; else fail naming it."""
    base = os.path.dirname(path)
    checks = " && ".join(
        f"[ -d {d} ] && [ ! -L {d} ] && [ -O {d} ] && chmod 0700 {d}"
        for d in (shlex.quote(base), shlex.quote(path))
    )
    return (
        f"{{ {node_dir_prep(path)} && mkdir -p -m 0700 {shlex.quote(path)}; if {checks}; "
        f'then :; else echo "servesweep: compile cache {path} on $(hostname) is no private '
        f"folder of $(id -un) (a symlink or another user's): remove it\" >&2; false; fi; }}"
    )


def purge_cache_line(path: str) -> str:
    """Shell: remove the compile-cache folder `path` if it is a real folder of the calling
    user (another user's, or a link, is left alone and named). Prints `purged` or `absent`."""
    d = shlex.quote(path)
    return (
        f"if [ ! -e {d} ] && [ ! -L {d} ]; then echo absent; "
        f"elif [ -d {d} ] && [ ! -L {d} ] && [ -O {d} ]; then rm -rf {d} && echo purged; "
        f'else echo "servesweep: {path} on $(hostname) is not ours: left alone" >&2; false; fi'
    )


def private_root(path: str) -> str | None:
    """The owner directory `path` lies in (None: a path elsewhere, e.g. under results/)."""
    prefix = f"{ONESHOT_DIR}-"
    if not path.startswith(prefix):
        return None
    end = path.find("/", len(prefix))
    return path if end < 0 else path[:end]


def node_dir_prep(path: str) -> str:
    """Shell: create the parent of `path` on a node. Under an owner directory that directory is
    made first (mode 0700) and must be a directory of the calling user, not a symlink: another
    user of the node who made it first (or planted a link) makes the command fail, naming it."""
    parent = f'mkdir -p "$(dirname {shlex.quote(path)})"'
    root = private_root(path)
    if root is None:
        return parent
    d = shlex.quote(root)
    return (
        f"{{ mkdir -m 0700 {d} 2>/dev/null; "
        f"if [ -d {d} ] && [ ! -L {d} ] && [ -O {d} ] && chmod 0700 {d}; then {parent}; "
        f'else echo "servesweep: {root} on $(hostname) is no private directory of '
        f"$(id -un) (a symlink or another user's): remove it\" >&2; false; fi; }}"
    )


def read_secret_line(launch: Launch) -> str:
    """Shell: read `launch.secret_env`'s value from stdin into its (exported) variable."""
    if launch.secret_env is None:
        return ""
    name = env_name(launch.secret_env[0], what="secret variable")
    # Its own statement: an asynchronous list after it (`... &`) would read /dev/null.
    return f"IFS= read -r {name} || exit 1; export {name}; "


def secret_stdin(launch: Launch) -> str:
    """The stdin line carrying `launch.secret_env`'s value ("" without one)."""
    return "" if launch.secret_env is None else launch.secret_env[1].reveal() + "\n"


def env_value(environ: str, name: str) -> Secret | None:
    """`name`'s value in a NUL- or newline-separated environment listing."""
    for entry in environ.replace("\0", "\n").splitlines():
        if entry.startswith(f"{name}="):
            return Secret(entry.split("=", 1)[1])
    return None


def env_assigns(env: dict[str, str]) -> str:
    """Shell: `NAME=value` words for `env`, each quoted whole (a name that is no name raises
    UnsafeName: it never reaches the shell)."""
    return " ".join(
        shlex.quote(f"{env_name(k, what='environment variable')}={v}") for k, v in env.items()
    )


def label_env(labels: dict[str, str]) -> dict[str, str]:
    """Labels as environment variables (how a plain process carries them)."""
    return {ENV_LABEL_PREFIX + k.upper(): v for k, v in labels.items()}


class ProcessRuntime:
    """A detached process group started through the transport (`setsid`), labelled by env."""

    def __init__(self, transport: Transport, env: Mapping[str, str] | None = None) -> None:
        self.transport = transport
        self.env = dict(env or {})  # runtime.env: every process's (a launch's own wins)

    def command_line(self, launch: Launch) -> str:
        assigns = env_assigns({**self.env, **launch.env, **label_env(launch.labels)})
        argv = " ".join(shlex.quote(a) for a in launch.argv)
        log = shlex.quote(launch.log_path)
        return (
            f"{read_secret_line(launch)}{node_dir_prep(launch.log_path)} && "
            f"{launch_cache_prep(launch)}"
            f"env {assigns} setsid {argv} > {log} 2>&1 < /dev/null & echo $!"
        )

    def start(self, launch: Launch) -> str:
        res = self.transport.run(
            launch.node,
            self.command_line(launch),
            timeout=COMMAND_TIMEOUT_S,
            stdin=secret_stdin(launch),
        )
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

    def ended(self, node: str, handle: str) -> str:
        return ""

    def logs(self, node: str, handle: str, log_path: str) -> str:
        res = self.transport.run(node, f"cat {shlex.quote(log_path)}", timeout=COMMAND_TIMEOUT_S)
        return res.stdout

    def stop(self, node: str, handle: str, grace_s: float = 10.0) -> None:
        # A server leads its group (setsid); a client is one process of its job's group.
        pgid = int(handle)
        kill = "kill -{sig} -{pgid} 2>/dev/null || kill -{sig} {pgid} 2>/dev/null"
        self.transport.run(node, kill.format(sig="TERM", pgid=pgid), timeout=COMMAND_TIMEOUT_S)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if not self.is_running(node, handle):
                return
            time.sleep(0.1)
        self.transport.run(node, kill.format(sig="KILL", pgid=pgid), timeout=COMMAND_TIMEOUT_S)

    def identity(self, node: str, handle: str) -> str:
        # Field 22 of /proc/PID/stat: start time in clock ticks since boot (after "comm) ").
        cmd = f"sed 's/.*) //' /proc/{int(handle)}/stat 2>/dev/null | cut -d' ' -f20"
        res = self.transport.run(node, cmd, timeout=COMMAND_TIMEOUT_S)
        return res.stdout.strip() if res.ok else ""

    def host_pids(self, node: str, handle: str) -> set[int]:
        # Every process of the session `setsid` began (SGLang's scheduler and detokenizer
        # subprocesses, which hold the GPU, stay in it).
        cmd = f"ps -e -o pid=,sid= | awk '$2 == {int(handle)} {{print $1}}'"
        res = self.transport.run(node, cmd, timeout=COMMAND_TIMEOUT_S)
        return {int(p) for p in res.stdout.split() if p.isdigit()} if res.ok else set()

    def owns(self, node: str, handle: str, labels: dict[str, str], identity: str) -> bool:
        pid = int(handle)
        # The environment stays in a shell variable: it may hold a secret (never in a file).
        script = f'e=$(tr "\\0" "\\n" < /proc/{pid}/environ 2>/dev/null) && {_has_all(labels)}'

        res = self.transport.run(node, script, timeout=COMMAND_TIMEOUT_S)
        if not res.ok:
            return False
        return not identity or self.identity(node, handle) == identity

    def oneshot_line(self, launch: Launch, *, gpus: bool = False) -> str:
        env = env_assigns({**self.env, **launch.env, **label_env(launch.labels)})
        log = shlex.quote(launch.log_path)
        argv = shlex.join(launch.argv)
        return (
            f"{read_secret_line(launch)}{node_dir_prep(launch.log_path)} && "
            f"env {env} {argv} > {log} 2>&1"
        )

    def run_oneshot(self, launch: Launch, *, timeout: float, gpus: bool = False) -> CommandResult:
        return self.transport.run(
            launch.node, self.oneshot_line(launch), timeout=timeout, stdin=secret_stdin(launch)
        )

    def secret_env(self, node: str, handle: str, name: str) -> Secret | None:
        cmd = f"cat /proc/{int(handle)}/environ 2>/dev/null"
        res = self.transport.run(node, cmd, timeout=COMMAND_TIMEOUT_S)
        return env_value(res.stdout, name) if res.ok else None

    def find(self, node: str, labels: dict[str, str]) -> list[str]:
        script = (
            f"for p in {_candidates(labels)}; do "
            'e=$(tr "\\0" "\\n" < $p/environ 2>/dev/null) || continue; '
            f"if {_has_all(labels)}; then pid=${{p#/proc/}}; "
            'echo "$pid $(ps -o ppid=,pgid= -p $pid) $(printf "%s\\n" "$e" | grep -cxF '
            f'{CLIENT_ENV})"; fi; done'
        )
        res = self.transport.run(node, script, timeout=COMMAND_TIMEOUT_S)
        found: dict[str, tuple[str, str, bool]] = {}
        for line in res.stdout.splitlines():
            fields = line.split()
            if len(fields) == 4 and fields[0].isdigit():
                found[fields[0]] = (fields[1], fields[2], fields[3] != "0")
        # A server leads its process group (setsid); a client is one process of its job's
        # group, the top labelled one of its tree (its children inherit the labels).
        return [
            pid
            for pid, (ppid, pgid, client) in found.items()
            if pgid == pid or (client and ppid not in found)
        ]

    def labelled(self, node: str, labels: dict[str, str]) -> list[Labelled]:
        script = (
            f"for p in {_candidates(labels)}; do "
            'e=$(tr "\\0" "\\n" < $p/environ 2>/dev/null) || continue; '
            f"if {_has_all(labels)}; then pid=${{p#/proc/}}; "
            '[ "$(ps -o pgid= -p $pid | tr -d " ")" = "$pid" ] || continue; '
            f'echo "@pid $pid"; printf "%s\\n" "$e" | grep "^{ENV_LABEL_PREFIX}"; fi; done'
        )
        res = self.transport.run(node, script, timeout=COMMAND_TIMEOUT_S)
        found: list[Labelled] = []
        for line in res.stdout.splitlines():
            if line.startswith("@pid "):
                found.append(Labelled(node, line.split()[1], {}))
            elif found and "=" in line:
                key, value = line.removeprefix(ENV_LABEL_PREFIX).split("=", 1)
                found[-1].labels[key.lower()] = value
        return found


def launch_cache_prep(launch: Launch) -> str:
    """Shell: `cache_dir_prep && ` for a launch with a compile-cache folder ("" without)."""
    return "" if launch.cache_dir is None else f"{cache_dir_prep(launch.cache_dir)} && "


def _candidates(labels: dict[str, str]) -> str:
    """Shell: the /proc/PID directories worth checking with `_has_all`: those whose environment
    holds the longest wanted label (the most telling), found by one grep over every environment
    (the loop forked `tr` and `grep` for each process of the node: about a second a scan on a
    busy machine)."""
    wanted = [f"{k}={v}" for k, v in label_env(labels).items()]
    if not wanted:
        return "/proc/[0-9]*"
    found = f"grep -lF -e {shlex.quote(max(wanted, key=len))} /proc/[0-9]*/environ 2>/dev/null"
    return f"$({found} | sed 's,/environ$,,')"


def _has_all(labels: dict[str, str]) -> str:
    """Shell: whether the environment listing in `$e` carries every label (printf is a builtin:
    the listing is in no argv)."""
    wanted = [f"{k}={v}" for k, v in label_env(labels).items()]
    return (
        " && ".join(f'printf "%s\\n" "$e" | grep -qxF {shlex.quote(w)}' for w in wanted) or "true"
    )


# ---------------------------------------------------------------- docker

START_TIMEOUT_S = 900.0  # `docker run` may have to pull the image first
_NO_SUCH = "no such container"


class DockerRuntime:
    """One container per server (`docker run -d --network host`), labelled, optionally via sudo.

    With `runtime.sudo` every docker call is `sudo -S -p '' docker ...` and the password goes to
    sudo on stdin (never into argv, logs or exceptions). Without a password stdin is empty, so
    passwordless sudo works and a required password fails at once (never waits on a terminal).
    """

    def __init__(
        self,
        transport: Transport,
        runtime: RuntimeConfig,
        *,
        sudo_password: str | Secret | None,
        gpus: str | None = "all",
        docker: str = "docker",
        command_timeout_s: float = COMMAND_TIMEOUT_S,
        start_timeout_s: float = START_TIMEOUT_S,
    ) -> None:
        if not runtime.image:
            raise ConfigError("runtime.image is required for the docker runtime")
        self.transport = transport
        self.runtime = runtime
        self.image = runtime.image
        self.gpus = gpus
        self.docker = docker
        self.command_timeout_s = command_timeout_s
        self.start_timeout_s = start_timeout_s
        if sudo_password is not None and not isinstance(sudo_password, Secret):
            sudo_password = Secret(sudo_password)
        self._password = sudo_password if runtime.sudo else None

    def _prefix(self) -> str:
        docker = shlex.quote(self.docker)
        return f"sudo -S -p '' {docker}" if self.runtime.sudo else docker

    def _stdin(self, launch: Launch | None = None) -> str | None:
        """The password's line (read by sudo, which reads one line), then `launch`'s secret
        variable as `NAME=value` (read by `docker run --env-file /dev/stdin`): a restricted
        sudoers rule keeps no caller variable (`--preserve-env` is refused)."""
        secret = ""
        if launch is not None and launch.secret_env is not None:
            secret = f"{launch.secret_env[0]}={launch.secret_env[1].reveal()}\n"
        if not self.runtime.sudo:
            return secret or None
        return ("" if self._password is None else self._password.reveal() + "\n") + secret

    def run_docker(self, node: str, args: str, *, timeout: float | None = None) -> CommandResult:
        """Run `docker <args>` on `node` (through sudo when configured)."""
        res = self.transport.run(
            node,
            f"{self._prefix()} {args}",
            timeout=self.command_timeout_s if timeout is None else timeout,
            stdin=self._stdin(),
        )
        if self._password is None:
            return res
        # Defence in depth: nothing sudo or docker print may carry the password onwards.
        return CommandResult(
            res.node,
            res.command,
            res.returncode,
            scrub(res.stdout, self._password),
            scrub(res.stderr, self._password),
        )

    def command_line(self, launch: Launch) -> str:
        run = shlex.join(self._run_args(launch, detach=True, gpus=True))
        return f"{launch_cache_prep(launch)}{self._prefix()} {run}"

    def docker_prefix(self) -> str:
        """How docker is called on the nodes (`docker`, or sudo's form of it)."""
        return self._prefix()

    def _run_args(self, launch: Launch, *, detach: bool, gpus: bool) -> list[str]:
        rt = self.runtime
        args = ["run", "-d" if detach else "--rm", "--name", launch.name]
        args += ["--network", "host", "--ipc", "host"]
        if gpus and self.gpus is not None and launch.accelerators:
            args += ["--gpus", self.gpus]
        args += ["--shm-size", rt.shm_size]
        if rt.privileged and launch.accelerators:
            args.append("--privileged")
        for device in rt.devices if launch.accelerators else []:
            args += ["--device", device]
        for ulimit in rt.ulimits:
            args += ["--ulimit", ulimit]
        for key, value in {**rt.env, **launch.env}.items():
            args += ["-e", f"{env_name(key, what='environment variable')}={value}"]
        if launch.secret_env is not None:
            args += ["--env-file", "/dev/stdin"]  # NAME=value after sudo's line (_stdin)
        root = None if detach else private_root(launch.log_path)
        own = [] if root is None else [f"{root}:{root}"]
        if launch.cache_dir is not None:
            own.append(f"{launch.cache_dir}:{launch.cache_dir}")
        for mount in [*rt.mounts, *own]:
            args += ["-v", mount]
        for key, value in launch.labels.items():
            args += ["--label", f"{LABEL_PREFIX}{key}={value}"]
        return [*args, self.image, *launch.argv]

    def oneshot_line(self, launch: Launch, *, gpus: bool = False) -> str:
        log = shlex.quote(launch.log_path)
        run = shlex.join(self._run_args(launch, detach=False, gpus=gpus))
        return f"{node_dir_prep(launch.log_path)} && {self._prefix()} {run} > {log} 2>&1"

    def run_oneshot(self, launch: Launch, *, timeout: float, gpus: bool = False) -> CommandResult:
        """`docker run --rm` to completion; on a timeout the container is removed too."""
        try:
            return self.transport.run(
                launch.node,
                self.oneshot_line(launch, gpus=gpus),
                timeout=timeout,
                stdin=self._stdin(launch),
            )
        except TransportError:
            self.run_docker(launch.node, f"rm -f {shlex.quote(launch.name)}")
            raise

    def start(self, launch: Launch) -> str:
        res = self.transport.run(
            launch.node,
            self.command_line(launch),
            timeout=self.start_timeout_s,
            stdin=self._stdin(launch),
        )
        lines = res.stdout.strip().splitlines()
        handle = lines[-1].strip() if lines else ""
        if not res.ok or not re.fullmatch(r"[0-9a-f]{12,64}", handle):
            tail = " | ".join((res.stderr or res.stdout).strip().splitlines()[-3:])
            raise ServerStartError(
                f"could not start container {launch.name} on node {launch.node} "
                f"(exit {res.returncode}): {scrub(tail, self._password)}"
            )
        logger.info("node %s: started container %s (%s)", launch.node, launch.name, handle[:12])
        return handle

    def is_running(self, node: str, handle: str) -> bool:
        fmt = shlex.quote("{{.State.Running}}")
        res = self.run_docker(node, f"inspect --type container -f {fmt} {shlex.quote(handle)}")
        if not res.ok and _NO_SUCH not in res.stderr.lower():
            res.check(f"docker inspect {handle[:12]}")
        return res.ok and res.stdout.strip() == "true"

    def ended(self, node: str, handle: str) -> str:
        return ""

    def logs(self, node: str, handle: str, log_path: str) -> str:
        """The container's stdout and stderr as one stream (`docker logs`); '' if it is gone."""
        res = self.run_docker(node, f"logs {shlex.quote(handle)} 2>&1")
        if not res.ok:
            if _NO_SUCH in res.stdout.lower():
                logger.warning("node %s: no container %s, so no logs", node, handle[:12])
                return ""
            tail = " | ".join(res.stdout.strip().splitlines()[-3:])
            raise TransportError(
                f"docker logs {handle[:12]} failed on node {node} (exit {res.returncode}): {tail}"
            )
        return res.stdout

    def host_pids(self, node: str, handle: str) -> set[int]:
        res = self.run_docker(node, f"top {shlex.quote(handle)} -eo pid")
        return {int(p) for p in res.stdout.split() if p.isdigit()} if res.ok else set()

    def stop(self, node: str, handle: str) -> None:
        res = self.run_docker(node, f"rm -f {shlex.quote(handle)}")
        if not res.ok and _NO_SUCH not in res.stderr.lower():
            res.check(f"docker rm -f {handle[:12]}")
        logger.info("node %s: removed container %s", node, handle[:12])

    def identity(self, node: str, handle: str) -> str:
        fmt = shlex.quote("{{.Created}}")
        res = self.run_docker(node, f"inspect --type container -f {fmt} {shlex.quote(handle)}")
        return res.stdout.strip() if res.ok else ""

    def secret_env(self, node: str, handle: str, name: str) -> Secret | None:
        fmt = shlex.quote("{{range .Config.Env}}{{println .}}{{end}}")
        res = self.run_docker(node, f"inspect --type container -f {fmt} {shlex.quote(handle)}")
        return env_value(res.stdout, name) if res.ok else None

    def owns(self, node: str, handle: str, labels: dict[str, str], identity: str) -> bool:
        fmt = shlex.quote("{{json .Config.Labels}}|{{.Created}}")
        res = self.run_docker(node, f"inspect --type container -f {fmt} {shlex.quote(handle)}")
        if not res.ok or "|" not in res.stdout:
            return False
        text, created = res.stdout.strip().rsplit("|", 1)
        try:
            found = json.loads(text) or {}
        except ValueError:
            return False
        if any(found.get(f"{LABEL_PREFIX}{k}") != v for k, v in labels.items()):
            return False
        return not identity or created == identity

    def find(self, node: str, labels: dict[str, str]) -> list[str]:
        filters = " ".join(
            f"--filter {shlex.quote(f'label={LABEL_PREFIX}{k}={v}')}" for k, v in labels.items()
        )
        res = self.run_docker(node, f"ps -aq --no-trunc {filters}").check("docker ps")
        return res.stdout.split()

    def labelled(self, node: str, labels: dict[str, str]) -> list[Labelled]:
        handles = self.find(node, labels)
        if not handles:
            return []
        fmt = shlex.quote("{{.Id}} {{json .Config.Labels}}")
        ids = " ".join(shlex.quote(h) for h in handles)
        res = self.run_docker(node, f"inspect --type container -f {fmt} {ids}")
        found = []
        for line in res.stdout.splitlines():
            handle, _, blob = line.partition(" ")
            try:
                raw = json.loads(blob) or {}
            except ValueError:
                continue
            found.append(
                Labelled(
                    node,
                    handle,
                    {
                        k.removeprefix(LABEL_PREFIX): v
                        for k, v in raw.items()
                        if k.startswith(LABEL_PREFIX)
                    },
                )
            )
        return found


def host_python_mounts() -> list[str]:
    """Read-only bind mounts that let this machine's Python (and servesweep) run in an empty image.

    Used with `servesweep-sim:local` (a `docker import` of an empty tar, see
    .ci/setup_nodes.sh); add `-e PATH=<sys.prefix>/bin:/usr/bin:/bin` so `python3` resolves.
    """
    paths = ["/lib", "/lib64", "/usr/lib", sys.base_prefix, sys.prefix, *site.getsitepackages()]
    package = Path(__file__).resolve().parents[2]  # the dir holding servesweep/
    paths.append(str(package))
    kept: list[str] = []
    for path in sorted({os.path.normpath(p) for p in paths if os.path.exists(p)}, key=len):
        if not any(path == k or path.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(path)
    return [f"{p}:{p}:ro" for p in kept]
