"""Who owns a server on a shared node: user, host and a hash of the checkout's results root."""

from __future__ import annotations

import getpass
import hashlib
import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path

# Label keys (docker labels `servesweep.<key>`, process env SERVESWEEP_LABEL_<KEY>).
OWNER_LABEL = "owner"
CHECKOUT_LABEL = "checkout"
RUN_LABEL = "run"
PORTS_LABEL = "ports"
POOL_LABEL = "pool"  # the node pool (index) a server set runs in (servesweep.cluster.pools)
# Label every server process carries (what a search for any servesweep server filters on).
KIND_LABEL = "kind"
SERVER_KIND = "server"
# Label of a service brought up by `servesweep up` (its fingerprint): stale cleanup skips it.
SERVICE_LABEL = "service"


@dataclass(frozen=True)
class Owner:
    """One checkout of one user on one host: what may stop the servers it labelled."""

    user: str
    host: str
    checkout: str  # 12 hex digits of sha256 over the absolute results root

    @property
    def label(self) -> str:
        """`user@host:checkout`, the value of the `owner` label and of error messages."""
        return f"{self.user}@{self.host}:{self.checkout}"

    @property
    def tag(self) -> str:
        """A name segment for container names and node paths: `<user>-<checkout>`."""
        return f"{_safe(self.user)}-{self.checkout}"

    def labels(self) -> dict[str, str]:
        return {OWNER_LABEL: self.label, CHECKOUT_LABEL: self.checkout}


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", text) or "user"


def checkout_hash(results_root: str | Path) -> str:
    """Hash of the absolute results root: two checkouts (or results dirs) never share it."""
    path = os.path.realpath(os.path.abspath(str(results_root)))
    return hashlib.sha256(path.encode()).hexdigest()[:12]


def current_owner(results_root: str | Path) -> Owner:
    """The owner of servers started from this process for results under `results_root`."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return Owner(user=user, host=socket.gethostname(), checkout=checkout_hash(results_root))
