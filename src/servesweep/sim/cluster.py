"""Multi-node rendezvous over TCP at --dist-init-addr: rank 0 hosts, ranks > 0 join and stay.

Protocol (one line each): a joining rank sends `rank <R>`, rank 0 answers `ok`; the
connection then stays open. A rank shutting down on purpose sends `bye` before closing; a
connection that closes without `bye` is a lost rank (the NCCL-error case)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

logger = logging.getLogger(__name__)

HANDSHAKE_TIMEOUT_S = 10.0
RETRY_INTERVAL_S = 0.2

# on_lost(rank, graceful): a peer went away; graceful means it said `bye` first.
LostCallback = Callable[[int, bool], None]


async def _read_until_gone(reader: asyncio.StreamReader) -> bool:
    """Read until EOF; True if the peer said `bye` (graceful), False on a bare close."""
    while True:
        try:
            line = await reader.readline()
        except (ConnectionError, OSError):
            return False
        if not line:
            return False
        if line.strip() == b"bye":
            return True


async def _say_bye(writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, OSError, RuntimeError, TimeoutError):
        writer.write(b"bye\n")
        writer.close()
        await asyncio.wait_for(writer.wait_closed(), HANDSHAKE_TIMEOUT_S)


class ClusterHost:
    """Rank 0: accepts ranks 1..nnodes-1 and watches their connections."""

    def __init__(self, *, host: str, port: int, nnodes: int, on_lost: LostCallback) -> None:
        self.host, self.port, self.nnodes = host, port, nnodes
        self.on_lost = on_lost
        self.members: dict[int, asyncio.StreamWriter] = {}
        self.all_joined = asyncio.Event()
        self._closing = False
        self._server: asyncio.Server | None = None
        if nnodes == 1:
            self.all_joined.set()

    async def start(self) -> None:
        """Listen on the dist-init address (raises OSError if the port is taken)."""
        self._server = await asyncio.start_server(self._handle, self.host, self.port)
        logger.info(f"Waiting for {self.nnodes - 1} node(s) at {self.host}:{self.port}")

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), HANDSHAKE_TIMEOUT_S)
            word, _, value = line.decode(errors="replace").strip().partition(" ")
            rank = int(value) if word == "rank" and value.isdigit() else -1
        except (TimeoutError, ConnectionError, OSError):
            rank = -1
        if not 1 <= rank < self.nnodes or rank in self.members or self._closing:
            logger.warning(f"Rejected a dist-init connection (rank {rank})")
            writer.close()
            return
        self.members[rank] = writer
        writer.write(b"ok\n")
        with contextlib.suppress(ConnectionError, OSError):
            await writer.drain()
        peer = writer.get_extra_info("peername")
        logger.info(f"node_rank {rank} joined from {peer[0] if peer else '?'}")
        if len(self.members) == self.nnodes - 1:
            logger.info(f"All {self.nnodes} nodes joined.")
            self.all_joined.set()
        graceful = await _read_until_gone(reader)
        if not self._closing:
            self.on_lost(rank, graceful)

    async def close(self) -> None:
        """Tell every joined rank we are shutting down on purpose, stop listening."""
        self._closing = True
        await asyncio.gather(*(_say_bye(w) for w in self.members.values()))
        if self._server is not None:
            self._server.close()


class ClusterPeer:
    """Rank > 0: joins rank 0 (retrying until a deadline), then watches the connection."""

    def __init__(self, *, host: str, port: int, rank: int) -> None:
        self.host, self.port, self.rank = host, port, rank
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._closing = False

    async def join(self, *, timeout_s: float) -> None:
        """Connect and handshake; raises TimeoutError when rank 0 never answered."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            try:
                reader, writer = await asyncio.open_connection(self.host, self.port)
                writer.write(f"rank {self.rank}\n".encode())
                await writer.drain()
                answer = await asyncio.wait_for(reader.readline(), HANDSHAKE_TIMEOUT_S)
                if answer.strip() == b"ok":
                    self._reader, self._writer = reader, writer
                    logger.info(f"Joined node_rank 0 at {self.host}:{self.port}")
                    return
                writer.close()
            except (ConnectionError, OSError, TimeoutError):
                pass
            if loop.time() >= deadline:
                raise TimeoutError
            await asyncio.sleep(RETRY_INTERVAL_S)

    async def watch(self, on_lost: Callable[[bool], None]) -> None:
        """Return after calling on_lost(graceful) when rank 0 goes away."""
        assert self._reader is not None
        graceful = await _read_until_gone(self._reader)
        if not self._closing:
            on_lost(graceful)

    async def close(self) -> None:
        """Leave on purpose."""
        self._closing = True
        if self._writer is not None:
            await _say_bye(self._writer)
