"""The attempts this agent holds, on disk: so that the next start knows what a killed agent left held.

An attempt is recorded (in the spool's `held/`) before its claim and forgotten once it has ended: claim
stale, or its report or release spooled (which then speaks for it). Forgotten, its record moves to the
attempts this host took (`taken.py`), so a copy of its assignment is dropped even after a restart. An
attempt still recorded at start was held by an agent that did not live to end it: the step processes it
left are killed first (`orphans.py`), so nothing of it runs on the device any more, and the attempt is
released at once rather than left for its lease to run out and the device's post-expiry grace to pass.
The records are read once at start (`take_left`): each gives way to a spooled release, and is moved to the
taken attempts only once that release is on disk (the spooled release is removed only once the scheduler
answered it).

The methods do blocking file I/O on small files; the async ones run it in a thread.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass

from devsched.agent.spool import Records, Spool, report_key
from devsched.agent.taken import TakenAttempts
from devsched.protocol import messages as wire

#: Why an attempt left by an earlier agent is given back.
RESTART_REASON = "agent restarted: the attempt's steps were stopped when its earlier agent ended"

logger = logging.getLogger(__name__)

#: The spool directory of the records.
KIND = "held"


@dataclass(frozen=True, slots=True)
class HeldAttempt:
    """An attempt held by this host: enough to name it to the scheduler."""

    task_id: str
    attempt: int
    lease_id: str
    device_id: str

    @classmethod
    def of(cls, assignment: wire.Assignment) -> HeldAttempt:
        """The attempt an assignment gives."""
        a = assignment
        return cls(str(a.task_id), a.attempt, str(a.lease_id), a.device_id)

    @property
    def key(self) -> str:
        """Its record's key: the key of its report."""
        return report_key(self.task_id, self.attempt)

    def log_fields(self) -> dict[str, object]:
        """Its ids, for log lines."""
        return asdict(self)

    def release(self, reason: str = RESTART_REASON) -> wire.ReleaseRequest:
        """The release that gives it back (no result: what ran of it died with the earlier agent)."""
        return wire.ReleaseRequest(
            task_id=uuid.UUID(self.task_id), attempt=self.attempt, lease_id=uuid.UUID(self.lease_id), reason=reason
        )


def _parse(body: bytes) -> HeldAttempt:
    data = json.loads(body)
    return HeldAttempt(str(data["task_id"]), int(data["attempt"]), str(data["lease_id"]), str(data["device_id"]))


class HeldAttempts:
    """The spool's records of held attempts."""

    def __init__(self, records: Records, taken: TakenAttempts) -> None:
        self._records = records
        self.taken = taken

    @classmethod
    def in_spool(cls, spool: Spool) -> HeldAttempts:
        """The records in `spool`, and the attempts taken (blocking: creates their directories)."""
        return cls(spool.records(KIND), TakenAttempts.in_spool(spool))

    def _to_taken(self, key: str) -> None:
        self._records.move(key, self.taken.records)
        self.taken.added()

    async def hold(self, attempt: HeldAttempt) -> None:
        """Record `attempt` durably; a spool that cannot be written is logged, and the attempt runs anyway."""
        await asyncio.to_thread(self.hold_now, attempt)

    def hold_now(self, attempt: HeldAttempt) -> None:
        """`hold`, blocking: for a thread that does the attempt's other file work too."""
        body = json.dumps(asdict(attempt), separators=(",", ":")).encode()
        try:
            self._records.put(attempt.key, body)
        except OSError as exc:
            logger.error("held attempt could not be recorded", extra={**attempt.log_fields(), "error": repr(exc)})

    async def forget(self, attempt: HeldAttempt) -> None:
        """Move the record of `attempt` (it has ended) to the attempts taken."""
        await asyncio.to_thread(self.forget_now, attempt)

    def forget_now(self, attempt: HeldAttempt) -> None:
        """`forget`, blocking: for a thread that does the attempt's other file work too."""
        try:
            self._to_taken(attempt.key)
        except OSError as exc:
            logger.error(
                "held attempt record not moved to the taken attempts",
                extra={**attempt.log_fields(), "error": repr(exc)},
            )

    def keys(self) -> list[str]:
        """The keys of the attempts recorded as held, oldest first (blocking)."""
        return self._records.keys_by_age()

    def take_left(
        self, reported: set[str], hand_over: Callable[[HeldAttempt], object] | None = None
    ) -> list[HeldAttempt]:
        """The attempts recorded by an earlier run, each handed over, then its record moved to the taken ones.

        Blocking. An attempt whose report or release is in the spool (its attempt key in `reported`) ended:
        that is resent, and the attempt is not counted. `hand_over` (spool the attempt's release) runs before
        a record is moved; if it raises `OSError` the record stays for the next start. A record that cannot
        be read is dropped with a warning.
        """
        left = []
        for key, body in self._records.items():
            try:
                attempt = _parse(body)
            except (ValueError, KeyError, TypeError) as exc:
                logger.warning("unreadable held attempt record dropped", extra={"spool_key": key, "error": repr(exc)})
                self._records.remove(key)
                continue
            if attempt.key not in reported:
                left.append(attempt)
                if hand_over is not None:
                    try:
                        hand_over(attempt)
                    except OSError as exc:
                        logger.error(
                            "held attempt not handed over; kept for the next start",
                            extra={**attempt.log_fields(), "error": repr(exc)},
                        )
                        continue
            self._to_taken(key)
        return left
