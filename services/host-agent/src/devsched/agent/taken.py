"""The attempts this host took, on disk: so that an agent started again still drops a copy of one.

An assignment may arrive more than once: JetStream redelivers what was not acked, and the scheduler's
resync publishes an unclaimed attempt's assignment again. A repeated claim of the same lease succeeds, so
what keeps an attempt from running twice is the intake's memory of the attempts it took; this keeps that
memory across a restart. An attempt's held record (`held.py`, written before its claim) is moved here
when the attempt ends instead of being deleted, so taking an attempt costs no write of its own; the next
start remembers what is here, what is still held (the earlier agent died holding it), and every attempt
with a report or release in the spool. The newest `KEEP` records are kept (by when they were written:
when the attempt was taken).

The methods do blocking file I/O on small files; call them from a thread in async code.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from devsched.agent.attempt import AttemptKey
from devsched.agent.spool import Records, Spool

logger = logging.getLogger(__name__)

#: The spool directory of the records.
KIND = "taken"
#: Records kept: as many attempts as the intake remembers (`devsched.agent.intake.REMEMBERED_ATTEMPTS`).
KEEP = 4096


def attempt_key(key: str) -> AttemptKey | None:
    """The attempt of a spool key `<task_id>.<attempt>` (a report's key, `spool.report_key`); None if not one."""
    task_id, _, attempt = key.rpartition(".")
    if not task_id or not attempt.isdigit():
        return None
    return task_id, int(attempt)


class TakenAttempts:
    """The records of the attempts this host took, newest `keep` of them."""

    def __init__(self, records: Records, *, keep: int = KEEP) -> None:
        self.records = records
        self._keep = max(keep, 1)
        self._added = 0

    @classmethod
    def in_spool(cls, spool: Spool, *, keep: int = KEEP) -> TakenAttempts:
        """The records in `spool` (creates their directory)."""
        return cls(spool.records(KIND), keep=keep)

    def load(self) -> list[AttemptKey]:
        """The attempts recorded, oldest first, after dropping all but the newest `keep`."""
        keys = self._prune()
        return [a for a in (attempt_key(k) for k in keys) if a is not None]

    def added(self) -> None:
        """A record was moved here: drop the oldest once a quarter of `keep` more has come since the last time."""
        self._added += 1
        if self._added >= max(self._keep // 4, 1):
            self._prune()

    def _prune(self) -> list[str]:
        self._added = 0
        keys = self.records.keys_by_age()
        excess = max(len(keys) - self._keep, 0)
        if excess:
            self.records.remove_all(keys[:excess])
        return keys[excess:]


def remembered(taken: Iterable[AttemptKey], *spooled_keys: Iterable[str]) -> list[AttemptKey]:
    """The attempts a starting agent remembers: `taken`, then those named by spool keys (held, reported)."""
    found = dict.fromkeys(taken)
    for keys in spooled_keys:
        for key in keys:
            attempt = attempt_key(key)
            if attempt is not None:
                found[attempt] = None
    return list(found)
