"""The storage budgets must fit the JetStream store, with room kept for the assignments.

Every stream the scheduler makes is capped: events (`events_max_bytes`), the artifacts bucket
(`artifacts_max_bytes`), the dashboard's revoked sessions (`revoked_sessions_max_bytes`), and each host's
logs and uploads streams (its share of `logs_max_bytes` and `uploads_max_bytes`, `max_hosts` hosts at
most). Their sum plus `jetstream_reserve_bytes` must not exceed what the store offers: the account's
JetStream storage limit when it has one (`js.account_info()`), else `jetstream_store_bytes` (the server's
`max_file_store` or its volume, which JetStream does not tell an account). A scheduler whose budgets
exceed the store refuses to start: once the store is full the relay cannot publish an assignment, and
nothing is dispatched anywhere.

JetStream itself then holds each stream to its cap, and reserves each cap from the store when the stream is
made: a stream that does not fit is refused (a host's registration is then 507 `storage_full`).
"""

from __future__ import annotations

from dataclasses import dataclass

from nats.js import JetStreamContext

from devsched.scheduler.settings import SchedulerSettings


class StoreTooSmall(Exception):
    """The budgets exceed the JetStream store: the scheduler does not start (its message is the one line)."""


@dataclass(frozen=True, slots=True)
class Budget:
    """The bytes each part may take; `None` for a part without a cap."""

    events: int | None
    logs: int | None
    uploads: int | None
    artifacts: int | None
    revoked_sessions: int
    reserve: int

    @classmethod
    def of(cls, settings: SchedulerSettings) -> Budget:
        """The budget of `settings`."""

        def cap(value: int) -> int | None:
            return None if value < 0 else value

        logs, uploads = settings.logs_host_max_bytes, settings.uploads_host_max_bytes
        return cls(
            events=cap(settings.events_max_bytes),
            logs=None if logs < 0 else logs * settings.max_hosts,
            uploads=None if uploads < 0 else uploads * settings.max_hosts,
            artifacts=cap(settings.artifacts_max_bytes),
            revoked_sessions=settings.revoked_sessions_max_bytes,
            reserve=settings.jetstream_reserve_bytes,
        )

    def uncapped(self) -> list[str]:
        """The settings of the parts without a cap."""
        parts = {
            "events_max_bytes": self.events,
            "logs_max_bytes": self.logs,
            "uploads_max_bytes": self.uploads,
            "artifacts_max_bytes": self.artifacts,
        }
        return [name for name, value in parts.items() if value is None]

    @property
    def total(self) -> int:
        """The bytes of every capped part, plus the reserve."""
        parts = (self.events, self.logs, self.uploads, self.artifacts)
        return sum(p for p in parts if p is not None) + self.revoked_sessions + self.reserve


def problem(budget: Budget, store: int | None) -> str | None:
    """Why `budget` does not fit a store of `store` bytes (`None`: its size is unknown), or None."""
    if store is None:
        return None
    uncapped = budget.uncapped()
    if uncapped:
        return (
            f"JetStream storage budget: {', '.join(uncapped)} has no cap (-1), but the store holds {store} bytes; "
            "set a cap"
        )
    if budget.total > store:
        return (
            f"JetStream storage budget: events {budget.events} + logs {budget.logs} + uploads {budget.uploads} + "
            f"artifacts {budget.artifacts} + revoked sessions {budget.revoked_sessions} + reserve {budget.reserve} "
            f"= {budget.total} bytes, more than the "
            f"{store} bytes of the store; lower the caps (or max_hosts) or enlarge the store"
        )
    return None


async def store_bytes(js: JetStreamContext, settings: SchedulerSettings) -> int | None:
    """The JetStream store's size for this account: its limit, else `jetstream_store_bytes`; None if unknown.

    Raises:
        nats.errors.Error: JetStream is unreachable or refused.
    """
    info = await js.account_info()
    limits = info.limits
    limit = limits.max_memory if settings.stream_storage == "memory" else limits.max_storage
    if limit is not None and limit > 0:
        return limit
    return settings.jetstream_store_bytes or None


async def check(js: JetStreamContext, settings: SchedulerSettings) -> str | None:
    """Why this scheduler's budgets do not fit the store, or None when they do (or its size is unknown).

    Raises:
        nats.errors.Error: JetStream is unreachable or refused.
    """
    return problem(Budget.of(settings), await store_bytes(js, settings))
