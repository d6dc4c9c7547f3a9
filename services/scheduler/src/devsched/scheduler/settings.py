"""The scheduler's settings: the shared ones plus JetStream, relay and assignment tuning."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from devsched.service.settings import Seconds, ServiceSettings


class SchedulerSettings(ServiceSettings):
    """Everything `devsched-scheduler` reads (`DEVSCHED_<NAME>` or `--<name>`)."""

    create_streams: bool = True
    """Create or update the two JetStream streams at start; off when an operator manages them."""
    stream_replicas: int = Field(default=1, ge=1, le=5)
    """Replicas of each stream (3 on a NATS cluster)."""
    stream_storage: Literal["file", "memory"] = "file"
    """Storage of the streams."""
    duplicate_window_s: Seconds = 300.0
    """JetStream de-duplication window by `Nats-Msg-Id`; covers a relay crash between publish and mark."""
    assignments_max_age_s: Seconds = 86400.0
    """Oldest assignment kept in the (work-queue) assignments stream; leases are far shorter."""
    events_max_age_s: Seconds = 7 * 86400.0
    """Oldest event kept in the events stream."""
    events_max_bytes: int = Field(default=-1, ge=-1)
    """Size cap of the events stream in bytes (oldest dropped first); -1 for none."""
    consumer_ack_wait_s: Seconds = 30.0
    """How long an agent has to ack an assignment before JetStream redelivers it."""
    consumer_max_deliver: int = Field(default=10, ge=1)
    """Deliveries of one assignment before JetStream gives up (the lease then expires)."""
    assign_batch: int = Field(default=200, ge=1, le=5000)
    """Tasks assigned per transaction."""
    assign_tick_s: Seconds = 1.0
    """Safety-net period of the assignment loop (it is woken by submits, reports, registrations, releases)."""
    relay_enabled: bool = True
    """Run the outbox relay in this process."""
    relay_batch: int = Field(default=200, ge=1, le=5000)
    """Outbox rows published per transaction."""
    relay_tick_s: Seconds = 1.0
    """Safety-net period of the relay (it is woken by local commits and by the sweeper)."""
    publish_timeout_s: Seconds = 5.0
    """Bound on one JetStream publish acknowledgement."""
    max_concurrency: int = Field(default=64, ge=1, le=10000)
    """Requests handled at once by this process; more wait in NATS's per-subscription queue."""
    shutdown_grace_s: Seconds = 10.0
    """On SIGTERM, how long requests in flight may take to finish."""

    @model_validator(mode="after")
    def _window_within_ages(self) -> SchedulerSettings:
        shortest = min(self.assignments_max_age_s, self.events_max_age_s)
        if self.duplicate_window_s > shortest:
            raise ValueError(f"duplicate_window_s must not exceed the streams' max age ({shortest} s)")
        return self
