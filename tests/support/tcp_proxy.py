"""An asyncio TCP proxy on a free loopback port, for network faults between real processes.

Put between an agent and NATS, or between the services and Postgres (clients are given the proxy's port), it
forwards bytes both ways until a test switches a fault on:

- `delay(0.2, 0.1)`: every chunk from the server waits 200 ± 100 ms, so every round trip takes that much
  longer (`both_ways`: chunks to the server wait too); order is kept, as on a long link;
- `blackhole()`: nothing passes either way and nothing is closed (a half-open connection: the far side is
  gone without a FIN); new connections are accepted and stay silent, as behind a partition. `heal()` then
  resets the blackholed connections, as the peer's kernel would answer their next segment with an RST;
- `reset()`: an RST on every open connection (SO_LINGER 0), now;
- `mute_after_commit(marker)`: the reply to the next `COMMIT` of a Postgres transaction whose statements
  contain `marker` is lost: the server commits, the client never hears, and the connection stays silent
  (half-open) until `heal()` resets it. The commit whose outcome the service cannot know;
- with `nats=True`, rules on the messages from the server (`drop_when`, `hold_when`): the stream is cut into
  NATS protocol frames (`MSG`/`HMSG` with their payload, or one control line), and a rule drops a frame or
  holds it back for some seconds while later frames pass. Dropping replies to an agent's requests, or the
  JetStream deliveries to it, keeps the NATS protocol intact where dropping bytes would break it.

It runs in the test's event loop: tests that use it must not block that loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import socket
import struct
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Self

_CHUNK = 65536
#: How asyncpg ends a transaction: a simple query.
_COMMIT = re.compile(rb"COMMIT;")
_BEGIN = re.compile(rb"BEGIN[ ;]")
#: The extended protocol's Execute of the unnamed portal, any row limit (how asyncpg runs a prepared statement).
_EXECUTE = re.compile(rb"E\x00\x00\x00\x09\x00.{4}", re.DOTALL)
_ROLLBACK = re.compile(rb"ROLLBACK;")


@dataclass(frozen=True)
class Frame:
    """One NATS protocol frame from the server: `MSG`/`HMSG` (with subject and reply) or a control line."""

    op: str
    raw: bytes
    subject: str = ""
    reply: str | None = None

    @property
    def is_message(self) -> bool:
        """Whether it carries a message (`MSG` or `HMSG`)."""
        return self.op in ("MSG", "HMSG")

    @property
    def status(self) -> int | None:
        """The status code of a JetStream status message (`NATS/1.0 404`, `408`: a pull that found nothing)."""
        if self.op != "HMSG":
            return None
        header = self.raw[self.raw.find(b"\r\n") + 2 :]
        match = re.match(rb"NATS/1\.0 (\d{3})", header)
        return int(match.group(1)) if match else None

    @property
    def delivery(self) -> int | None:
        """For a JetStream delivery (reply `$JS.ACK...`), which delivery of the message this is (1, 2, ...)."""
        if self.reply is None or not self.reply.startswith("$JS.ACK."):
            return None
        tokens = self.reply.split(".")
        # $JS.ACK.<stream>.<consumer>.<delivered>... or, with domain and account hash, two tokens more
        index = 4 if len(tokens) == 9 else 6
        return int(tokens[index])


#: Decides about a frame from the server: True to apply the rule's action (drop it, hold it).
Rule = Callable[[Frame], bool]


def replies_to(inbox_prefix: str) -> Rule:
    """Replies to requests made from `inbox_prefix`: messages to it that are neither JetStream deliveries nor
    the status messages that end a pull (those are JetStream's, not a service's replies)."""
    return lambda f: f.is_message and f.subject.startswith(inbox_prefix) and f.delivery is None and f.status is None


def deliveries(*, first_only: bool = False) -> Rule:
    """JetStream deliveries to a pull consumer (`first_only`: not the redeliveries)."""
    return lambda f: (d := f.delivery) is not None and (d == 1 or not first_only)


def sometimes(rule: Rule, fraction: float, seed: int = 7) -> Rule:
    """`rule`, for a seeded random `fraction` of the frames it matches."""
    rng = random.Random(seed)
    return lambda f: rule(f) and rng.random() < fraction


class _FrameCutter:
    """Cuts a byte stream from a NATS server into whole frames."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, data: bytes) -> list[Frame]:
        self._buffer += data
        frames = []
        while True:
            end = self._buffer.find(b"\r\n")
            if end < 0:
                return frames
            line = self._buffer[:end]
            parts = line.split()
            op = parts[0].upper().decode() if parts else ""
            if op in ("MSG", "HMSG"):
                size = int(parts[-1])
                total = end + 2 + size + 2
                if len(self._buffer) < total:
                    return frames
                args = [p.decode() for p in parts[1:]]
                # MSG subject sid [reply] size / HMSG subject sid [reply] header_size total_size
                plain = 3 if op == "MSG" else 4
                reply = args[2] if len(args) == plain + 1 else None
                frames.append(Frame(op, self._buffer[:total], args[0], reply))
            else:
                total = end + 2
                frames.append(Frame(op, self._buffer[:total]))
            self._buffer = self._buffer[total:]


class _Link:
    """One proxied connection: the client's streams, the upstream's, and the pumps between them."""

    def __init__(self, proxy: TcpProxy, client: tuple[asyncio.StreamReader, asyncio.StreamWriter]) -> None:
        self.proxy = proxy
        self.client_reader, self.client_writer = client
        self.upstream_writer: asyncio.StreamWriter | None = None
        self.blackholed = proxy.blackholed
        #: Nothing from the server passes (its replies are lost); set by `mute_after_commit`.
        self.muted = False
        self._marked = False
        self._in_transaction = False
        self.tasks: list[asyncio.Task[None]] = []
        self._due = {"up": 0.0, "down": 0.0}
        self._queues: dict[str, asyncio.Queue[tuple[float, bytes]]] = {"up": asyncio.Queue(), "down": asyncio.Queue()}
        self._writers: dict[str, asyncio.Task[None]] = {}

    async def run(self) -> None:
        if self.blackholed:  # a partition: the connection opens and nothing ever answers
            await self._discard(self.client_reader)
            return
        try:
            reader, self.upstream_writer = await asyncio.open_connection(*self.proxy.upstream)
        except OSError:
            self.abort()
            return
        self.tasks = [
            asyncio.create_task(self._pump(self.client_reader, self.upstream_writer, "up")),
            asyncio.create_task(self._pump(reader, self.client_writer, "down")),
        ]
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.abort()

    async def _discard(self, reader: asyncio.StreamReader) -> None:
        with contextlib.suppress(OSError):
            while await reader.read(_CHUNK):
                pass

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, direction: str) -> None:
        cutter = _FrameCutter() if direction == "down" and self.proxy.nats else None
        try:
            while data := await reader.read(_CHUNK):
                if self.blackholed or (self.muted and direction == "down"):
                    continue
                if direction == "up" and self.proxy.commit_marker is not None:
                    self._watch_commit(data)
                if cutter is None:
                    await self._send(writer, data, direction)
                    continue
                for frame in cutter.feed(data):
                    await self._route(frame, writer)
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            self.abort()

    def _watch_commit(self, data: bytes) -> None:
        """Mute this connection where a change carrying the armed marker commits (once).

        In a transaction that is its COMMIT; a statement outside one (the store's one-statement path)
        commits by itself, so the connection is muted before that statement's Execute goes on (asyncpg
        prepares a statement, with its text, in a round trip of its own before it executes it).
        """
        proxy = self.proxy
        assert proxy.commit_marker is not None
        if _BEGIN.search(data):
            self._in_transaction = True
        if proxy.commit_marker.search(data):
            self._marked = True
        if self._marked and not self._in_transaction and _EXECUTE.search(data):
            # prepared first (its text passed with the marker), executed now: it commits by itself
            self._mute_commit()
            return
        if _ROLLBACK.search(data):
            self._marked = self._in_transaction = False
        elif _COMMIT.search(data):
            if self._marked:
                self._mute_commit()
            self._in_transaction = False

    def _mute_commit(self) -> None:
        self.muted = True  # before the commit goes on: its reply must not get through
        self.proxy.commit_marker = None
        self.proxy.counts["muted_commits"] += 1
        self._marked = self._in_transaction = False

    async def _route(self, frame: Frame, writer: asyncio.StreamWriter) -> None:
        proxy = self.proxy
        if frame.is_message:
            proxy.seen[frame.delivery or 0] += 1
        if proxy.drop_rule is not None and proxy.drop_rule(frame):
            proxy.counts["dropped"] += 1
            return
        if proxy.hold_rule is not None and proxy.hold_rule(frame):
            proxy.counts["held"] += 1
            self.tasks.append(asyncio.create_task(self._later(writer, frame.raw, proxy.hold_s)))
            return
        await self._send(writer, frame.raw, "down")

    async def _later(self, writer: asyncio.StreamWriter, data: bytes, seconds: float) -> None:
        await asyncio.sleep(seconds)
        if not self.blackholed and not writer.is_closing():
            writer.write(data)

    async def _send(self, writer: asyncio.StreamWriter, data: bytes, direction: str) -> None:
        delay = self.proxy.sample_delay(direction)
        if delay <= 0 and self._queues[direction].empty():
            if not writer.is_closing():
                writer.write(data)
                await writer.drain()
            return
        # Delayed chunks go through a queue, so reading goes on meanwhile: delays overlap as on a long link
        # (a latency, not a bandwidth), and order is kept (never before the previous chunk).
        due = max(self._due[direction], time.monotonic() + delay)
        self._due[direction] = due
        if direction not in self._writers:
            self._writers[direction] = asyncio.create_task(self._write_due(writer, direction))
            self.tasks.append(self._writers[direction])
        self._queues[direction].put_nowait((due, data))

    async def _write_due(self, writer: asyncio.StreamWriter, direction: str) -> None:
        queue = self._queues[direction]
        with contextlib.suppress(OSError):
            while True:
                due, data = await queue.get()
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                if self.blackholed or writer.is_closing():
                    continue
                writer.write(data)
                await writer.drain()

    def abort(self, *, rst: bool = False) -> None:
        """Close both sides at once; with `rst`, the client gets an RST instead of a FIN."""
        for writer in (self.client_writer, self.upstream_writer):
            if writer is None or writer.transport.is_closing():
                continue
            if rst:
                sock = writer.get_extra_info("socket")
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
        for task in self.tasks:
            if task is not asyncio.current_task():
                task.cancel()


class TcpProxy:
    """A TCP proxy from a free loopback port to `upstream`; see the module docstring for its faults.

    Args:
        upstream: `(host, port)` of the real server.
        nats: Cut the server's stream into NATS frames, so that `drop_when` and `hold_when` can act on messages.
        seed: Seed of the delays' jitter.
    """

    def __init__(self, upstream: tuple[str, int], *, nats: bool = False, seed: int = 1) -> None:
        self.upstream = upstream
        self.nats = nats
        self.port = 0
        self.blackholed = False
        self.drop_rule: Rule | None = None
        self.hold_rule: Rule | None = None
        self.hold_s = 0.0
        self.commit_marker: re.Pattern[bytes] | None = None
        #: What the rules did: `dropped`, `held`, `resets`.
        self.counts: Counter[str] = Counter()
        #: NATS messages seen from the server, by JetStream delivery count (0: not a JetStream delivery).
        self.seen: Counter[int] = Counter()
        self._delay: tuple[float, float] | None = None
        self._delay_both_ways = False
        self._rng = random.Random(seed)
        self._links: set[_Link] = set()
        self._server: asyncio.Server | None = None

    async def start(self) -> Self:
        """Listen on a free loopback port (`port`)."""
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        """Stop listening and close every connection."""
        if self._server is not None:
            self._server.close()
        for link in list(self._links):
            link.abort()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def url(self, scheme: str = "nats") -> str:
        """`scheme://127.0.0.1:<port>`."""
        return f"{scheme}://127.0.0.1:{self.port}"

    @property
    def connections(self) -> int:
        """Connections open through the proxy now."""
        return len(self._links)

    # -- faults ------------------------------------------------------------------------------------------

    def delay(self, mean_s: float = 0.2, jitter_s: float = 0.1, *, both_ways: bool = False) -> None:
        """Delay every chunk from the server (`both_ways`: and to it) by `mean_s` ± `jitter_s`, keeping order."""
        self._delay = (mean_s, jitter_s)
        self._delay_both_ways = both_ways

    def sample_delay(self, direction: str) -> float:
        """The delay of the next chunk going `direction` (`up`: to the server; 0 without `delay`)."""
        if self._delay is None or (direction == "up" and not self._delay_both_ways):
            return 0.0
        mean, jitter = self._delay
        return max(0.0, self._rng.uniform(mean - jitter, mean + jitter))

    def drop_when(self, rule: Rule) -> None:
        """Drop the NATS frames from the server that `rule` matches (needs `nats=True`)."""
        assert self.nats, "frame rules need nats=True"
        self.drop_rule = rule

    def hold_when(self, rule: Rule, seconds: float) -> None:
        """Hold the NATS frames from the server that `rule` matches for `seconds`; later frames pass them."""
        assert self.nats, "frame rules need nats=True"
        self.hold_rule, self.hold_s = rule, seconds

    def mute_after_commit(self, marker: bytes) -> None:
        """Lose the reply to the next COMMIT of a transaction whose statements match `marker` (a regex)."""
        self.commit_marker = re.compile(marker, re.IGNORECASE)

    def blackhole(self) -> None:
        """Forward nothing, close nothing: every connection, open or new, goes silent both ways."""
        self.blackholed = True
        for link in self._links:
            link.blackholed = True

    def reset(self) -> None:
        """Send an RST on every open connection now; new connections pass as before."""
        self.counts["resets"] += len(self._links)
        for link in list(self._links):
            link.abort(rst=True)

    def heal(self) -> None:
        """Forward everything again; blackholed and muted connections are reset (their far side forgot them)."""
        self._delay = None
        self.drop_rule = self.hold_rule = None
        self.commit_marker = None
        self.blackholed = False
        for link in list(self._links):
            if link.blackholed or link.muted:
                self.counts["resets"] += 1
                link.abort(rst=True)

    # -- connections ---------------------------------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        link = _Link(self, (reader, writer))
        self._links.add(link)
        try:
            await link.run()
        finally:
            self._links.discard(link)
            link.abort()
