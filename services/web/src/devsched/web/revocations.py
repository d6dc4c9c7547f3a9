"""The logged-out sessions of every replica, shared through the NATS key-value bucket `<PU>_WEB_REVOKED`.

A logout puts the session id (never the cookie) into the bucket with a TTL that ends the entry when the
cookie expires. Each replica follows the bucket with an ordered consumer that replays it at start and then
follows it, into its own `RevokedIds`, so checking a session stays an in-memory lookup.

Fail closed: the set is complete only once the replay is done, while the connection is the one the watch
was made on (after a reconnection the bucket is replayed again), and while the watch's consumer answers a
probe every `PROBE_S`. Until then no session is live on this replica (`Sessions.check`), actions answer
503, and the replica is not ready. The scheduler makes the bucket (`KV_<PU>_WEB_REVOKED`); the web's NATS
user may only write to it and follow it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time

import nats.errors
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js.api import DeliverPolicy
from nats.js.errors import NotFoundError

from devsched.web.sessions import Revoked, RevokedIds

log = logging.getLogger("devsched.web.revocations")

#: Seconds between two probes of the watch (its consumer's info: proof that server and consumer answer).
PROBE_S = 2.0
#: Seconds one probe (and every other JetStream API call of the watch) may take.
PROBE_TIMEOUT_S = 2.0
#: Seconds without an answered probe after which the set is no longer trusted.
STALE_S = 3 * PROBE_S
#: Seconds before a failed watch is made again.
RETRY_S = 1.0
#: Seconds a starting replica waits for the bucket's replay before it serves anyway (not ready meanwhile).
LOAD_WAIT_S = 5.0
#: The expiry given to an entry whose value is not one (only a writer with the web's credentials makes one):
#: revoked for as long as this process runs.
FOREVER = 2**62
#: The headers of a key-value delete or purge; the bucket refuses neither, but a revocation is never undone.
_KV_OPERATION = "KV-Operation"


class NotRecorded(Exception):
    """The revocation was not written to the bucket: the other replicas do not know of it."""


class Revocations:
    """This replica's view of the bucket: `ids` (for `Sessions`), `publish` for a logout, `follow` to run."""

    def __init__(self, nc: NatsClient, bucket: str, *, publish_timeout_s: float) -> None:
        self._nc = nc
        self._js = nc.jetstream(timeout=PROBE_TIMEOUT_S)
        self._bucket = bucket
        self._stream = f"KV_{bucket}"
        self._prefix = f"$KV.{bucket}."
        self._publish_timeout_s = publish_timeout_s
        self.ids = RevokedIds(complete=lambda: self.problem() is None)
        #: The connection's reconnection count when the current watch caught up; -1: not caught up.
        self._caught_up_on = -1
        #: The current watch's number: messages of an earlier one are dropped.
        self._watch = 0
        self._probed_at = -math.inf
        self._why = "the revoked sessions are not loaded yet"
        self._logged: str | None = None
        self._loaded = asyncio.Event()

    def problem(self) -> str | None:
        """Why sessions cannot be checked on this replica now, or None when every logout is known here."""
        if not self._nc.is_connected:
            return "NATS is not connected"
        if self._caught_up_on != self._nc.stats["reconnects"]:
            return self._why
        if time.monotonic() - self._probed_at > STALE_S:
            return f"the watch of {self._bucket} has not answered for {STALE_S:g} s"
        return None

    async def loaded(self, timeout_s: float) -> bool:
        """Whether the bucket was replayed once, waiting up to `timeout_s` for it."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._loaded.wait(), timeout_s)
        return self._loaded.is_set()

    async def publish(self, revoked: Revoked, now: float) -> None:
        """Record the logout for every replica, until its cookie expires.

        Raises:
            NotRecorded: NATS or the bucket did not take it (away, missing, full).
        """
        ttl = max(1, math.ceil(revoked.expires_at - now)) + 1  # whole seconds, never short of the cookie's life
        try:
            await self._js.publish(
                self._prefix + revoked.session_id,
                str(revoked.expires_at).encode(),
                timeout=self._publish_timeout_s,
                msg_ttl=ttl,
            )
        except (nats.errors.Error, TimeoutError) as exc:
            raise NotRecorded(_describe(exc)) from exc

    async def follow(self) -> None:
        """Follow the bucket into `ids` until cancelled, making the watch again whenever it fails."""
        while True:
            try:
                await self._follow_once()
            except NotFoundError:
                self._lost(f"no bucket {self._bucket} (the scheduler makes it at start)")
            except (nats.errors.Error, TimeoutError) as exc:
                self._lost(f"the watch of {self._bucket} failed: {_describe(exc)}")
            except Exception as exc:  # a bug must not end the watch for good: sessions stay closed meanwhile
                log.exception("the watch of the revoked sessions failed")
                self._lost(f"the watch of {self._bucket} failed: {_describe(exc)}")
            await asyncio.sleep(RETRY_S)

    async def _follow_once(self) -> None:
        """One watch: replay the bucket, then follow it while the connection and the consumer answer."""
        reconnects = self._nc.stats["reconnects"]
        self._watch += 1
        watch = self._watch
        self._caught_up_on = -1
        await self._js.stream_info(self._stream)  # NotFoundError: no bucket yet

        async def on_entry(msg: Msg) -> None:
            if watch != self._watch:
                return  # a message of an earlier watch, still queued
            self._apply(msg)
            if msg.metadata.num_pending == 0:
                self._caught_up(reconnects)

        sub = await self._js.subscribe(
            self._prefix + ">",
            stream=self._stream,
            cb=on_entry,
            ordered_consumer=True,
            deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
            inactive_threshold=60.0,
        )
        try:
            info = await sub.consumer_info()
            self._probed_at = time.monotonic()
            if info.num_pending == 0 and (info.delivered is None or info.delivered.stream_seq == 0):
                self._caught_up(reconnects)  # an empty bucket
            while True:
                await asyncio.sleep(PROBE_S)
                if self._nc.stats["reconnects"] != reconnects or not self._nc.is_connected:
                    self._lost("NATS reconnected: the revoked sessions are being loaded again")
                    return
                await sub.consumer_info()  # the server and the consumer answer (else raised: watched anew)
                self._probed_at = time.monotonic()
        finally:
            self._watch += 1
            self._caught_up_on = -1
            with contextlib.suppress(nats.errors.Error):  # the connection is gone: so is the subscription
                await sub.unsubscribe()

    def _apply(self, msg: Msg) -> None:
        session_id = msg.subject.removeprefix(self._prefix)
        if msg.headers and _KV_OPERATION in msg.headers:
            log.warning("a deletion in the revoked sessions' bucket is ignored: a logout is never undone")
            return
        text = msg.data.decode("ascii", "replace")
        expires_at = int(text) if text.isdigit() and len(text) <= 12 else FOREVER
        self.ids.add(session_id, expires_at, time.time())

    def _caught_up(self, reconnects: int) -> None:
        if self._caught_up_on == reconnects:
            return
        self._caught_up_on = reconnects
        self._probed_at = time.monotonic()
        self._logged = None
        self._loaded.set()
        log.info("revoked sessions loaded", extra={"bucket": self._bucket, "revoked": len(self.ids)})

    def _lost(self, why: str) -> None:
        self._caught_up_on = -1
        self._why = why
        if why != self._logged:  # once per cause, not once a retry
            self._logged = why
            log.warning("sessions cannot be checked: %s", why, extra={"bucket": self._bucket})


async def start(revocations: Revocations | None) -> asyncio.Task[None] | None:
    """Follow the bucket in a task, once its replay is done (or `LOAD_WAIT_S` passed: not ready till then)."""
    if revocations is None:
        return None
    task = asyncio.create_task(revocations.follow(), name="devsched-web revoked sessions")
    await revocations.loaded(LOAD_WAIT_S)
    return task


async def stop(task: asyncio.Task[None] | None) -> None:
    """Stop following the bucket."""
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
