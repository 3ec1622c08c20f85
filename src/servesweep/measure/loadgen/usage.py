"""The client's wall and CPU time from the outside: a wrapper process around either client."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

# The line the wrapper prints to stderr (the bench log) after its child ended.
MARK = "servesweep-client-usage: "
# The raw record's key for the figures (ProcessUsage.to_dict); absent: none measured.
RECORD_KEY = "servesweep_client_process"
# results.csv columns from them (NaN without figures: imported runs, older records).
CPU_PCT_COLUMN = "client_process_cpu_pct"  # % of one core: selfcheck.saturated's fallback
COLUMNS = ("client_process_wall_s", "client_process_cpu_s", CPU_PCT_COLUMN)

# `python -c WRAPPER CLIENT_ARGV...`: it must not import servesweep (SGLang's image lacks it).
# It starts the client as its child (which dies with it: PR_SET_PDEATHSIG, SIGKILL), ends it
# by SIGTERM on SIGTERM or SIGINT (a stopped job leaves no client behind: isolation.stop_clients
# signals the top labelled process, the docker runtime removes the whole container). SIGINT is
# not passed on as such: a Ctrl-C to the process group reaches the child too, and asyncio (both
# clients) takes a second SIGINT as a KeyboardInterrupt raised wherever the loop happens to be,
# which can leave its shutdown waiting forever; neither client handles SIGTERM. It waits
# (os.wait4: the child's rusage, its waited-for children included), prints MARK and the
# figures (the child's code, 128 + N for signal N), and exits with the child's code, or with
# 128 + the signal it got itself (130 for Ctrl-C), so the job can tell an interruption from a
# failure of the client. One line without single quotes: commands.sh keeps one line per
# command, quoted plainly.
WRAPPER = ";".join(
    [
        "import json,os,signal,subprocess,sys,time",
        'd=getattr(__import__("ctypes").CDLL(None),"prctl",None)',
        "t=time.monotonic()",
        "p=subprocess.Popen(sys.argv[1:],preexec_fn=d and (lambda:d(1,9)))",
        "r=[]",
        "g=[]",
        "[signal.signal(s,lambda n,f:r or g.append(n) or os.kill(p.pid,signal.SIGTERM)) for s in"
        " (signal.SIGTERM,signal.SIGINT)]",
        "_,w,u=os.wait4(p.pid,0)",
        "r.append(1)",
        "w=os.waitstatus_to_exitcode(w)",
        "p.returncode=c=128-w if w<0 else w",
        f"sys.stderr.write({json.dumps(MARK)}+json.dumps(dict(wall_s=time.monotonic()-t,"
        'cpu_user_s=u.ru_utime,cpu_sys_s=u.ru_stime,max_rss_kb=u.ru_maxrss,returncode=c))+"\\n")',
        "sys.exit(128+g[0] if g else c)",
    ]
)


def wrapped(argv: list[str], *, python: str) -> list[str]:
    """`argv` run under WRAPPER by `python` (the interpreter on the client's node)."""
    return [python, "-c", WRAPPER, *argv]


@dataclass(frozen=True)
class ProcessUsage:
    """What the wrapper measured: the client process's wall time from start to exit, its user
    and system CPU time, peak resident memory, exit code."""

    wall_s: float
    cpu_user_s: float
    cpu_sys_s: float
    max_rss_kb: int
    returncode: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def cpu_s(self) -> float:
        return self.cpu_user_s + self.cpu_sys_s


def parse(text: str) -> ProcessUsage | None:
    """The figures on the last MARK line of a bench log; None when there is none or it does
    not hold finite non-negative numbers under every key."""
    at = text.rfind(MARK)
    if at < 0:
        return None
    line = text[at + len(MARK) :].split("\n", 1)[0]
    try:
        data = json.loads(line)
        return from_dict(data)
    except (ValueError, TypeError):
        return None


def from_dict(data: Any) -> ProcessUsage:
    """ProcessUsage of a RECORD_KEY value; ValueError/TypeError when it is not one."""
    if not isinstance(data, Mapping):
        raise TypeError(f"not a mapping: {data!r}")
    values = {}
    for name, kind in (
        ("wall_s", float),
        ("cpu_user_s", float),
        ("cpu_sys_s", float),
        ("max_rss_kb", int),
        ("returncode", int),
    ):
        value = data.get(name)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"{name}: not a number: {value!r}")
        if not math.isfinite(value) or value < 0 or (kind is int and value != int(value)):
            raise ValueError(f"{name}: {value!r}")
        values[name] = kind(value)
    return ProcessUsage(**values)


def columns(value: Any) -> dict[str, float]:
    """COLUMNS of a record's RECORD_KEY value: wall and CPU time (user + system) [s], CPU as %
    of one core; NaN when the value is absent or malformed."""
    try:
        found = from_dict(value)
    except (ValueError, TypeError):
        return dict.fromkeys(COLUMNS, math.nan)
    pct = 100.0 * found.cpu_s / found.wall_s if found.wall_s > 0 else math.nan
    return dict(zip(COLUMNS, (found.wall_s, found.cpu_s, pct), strict=True))
