"""The streams and the per-host consumers, created idempotently.

Assignments: WORK-QUEUE retention. An assignment is a command for one host, useless once acked, so the
stream keeps only what is not yet acked (no unbounded growth, and a host consumer that is deleted and
created again does not replay assignments its agent already handled). Work-queue streams allow one
consumer per subject, which is exactly one `host-<id>` per `P.assign.<id>`. `max_age` bounds what a host
that never comes back leaves behind; its leases expired long before.

Events: LIMITS retention with a max age (7 days by default) and an optional size cap: an audit log that
any number of watchers read, with their own consumers, at their own pace.

Logs (an addition): LIMITS retention by age and optional total size, for step output (`logs_stream_config`).

Uploads and the artifacts bucket (additions, issue 12): `devsched.scheduler.artifacts`.

All: file storage, a de-duplication window long enough to cover a relay that crashed between publishing
and marking a row (the next relay republishes within seconds; the window is minutes), configurable replicas.
"""

from __future__ import annotations

import logging

import nats.errors
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import APIError, BadRequestError

from devsched.protocol.subjects import Subjects
from devsched.scheduler.artifacts import bucket_stream_config, uploads_stream_config
from devsched.scheduler.settings import SchedulerSettings

log = logging.getLogger("devsched.scheduler.jetstream")

#: JetStream's error code for "stream name already in use with a different configuration".
_STREAM_NAME_IN_USE = 10058


def stream_configs(subjects: Subjects, settings: SchedulerSettings) -> list[StreamConfig]:
    """The configuration of `<PU>_ASSIGNMENTS`, `<PU>_EVENTS`, `<PU>_LOGS`, `<PU>_UPLOADS` and `OBJ_<PU>_ARTIFACTS`."""
    storage = StorageType(settings.stream_storage)
    return [
        StreamConfig(
            name=subjects.assignments_stream,
            description=f"devsched assignments ({subjects.prefix}): one message per new attempt, per host",
            subjects=[subjects.assign_all],
            retention=RetentionPolicy.WORK_QUEUE,
            storage=storage,
            num_replicas=settings.stream_replicas,
            max_age=settings.assignments_max_age_s,
            duplicate_window=settings.duplicate_window_s,
            discard=DiscardPolicy.OLD,
        ),
        StreamConfig(
            name=subjects.events_stream,
            description=f"devsched task events ({subjects.prefix}): one message per state change",
            subjects=[subjects.events_all],
            retention=RetentionPolicy.LIMITS,
            storage=storage,
            num_replicas=settings.stream_replicas,
            max_age=settings.events_max_age_s,
            max_bytes=settings.events_max_bytes,
            duplicate_window=settings.duplicate_window_s,
            discard=DiscardPolicy.OLD,
            allow_direct=True,
        ),
        logs_stream_config(subjects, settings),
        uploads_stream_config(subjects, settings),
        bucket_stream_config(subjects, settings),
    ]


def logs_stream_config(subjects: Subjects, settings: SchedulerSettings) -> StreamConfig:
    """`<PU>_LOGS`: step output as the agents stream it (`P.host.*.log.>`).

    LIMITS retention, oldest dropped first, by age (7 days by default) and optionally by total size; each
    agent caps its attempts' output itself. Hosts publish into it through their own subjects only (deploy
    accounts) and cannot read it; operators read it with ordered consumers.
    """
    return StreamConfig(
        name=subjects.logs_stream,
        description=f"devsched step output ({subjects.prefix}): records of each attempt's stdout and stderr",
        subjects=[subjects.host_log_all],
        retention=RetentionPolicy.LIMITS,
        storage=StorageType(settings.stream_storage),
        num_replicas=settings.stream_replicas,
        max_age=settings.logs_max_age_s,
        max_bytes=settings.logs_max_bytes,
        duplicate_window=settings.duplicate_window_s,
        discard=DiscardPolicy.OLD,
    )


async def ensure_streams(js: JetStreamContext, subjects: Subjects, settings: SchedulerSettings) -> None:
    """Create the streams, or bring existing ones to our configuration.

    An existing stream whose configuration cannot be changed in place (its retention, say) is left as
    it is with an error logged: it still carries the messages, and replacing it would lose them.

    Raises:
        nats.errors.Error: JetStream is unreachable or refused (the caller retries).
    """
    for config in stream_configs(subjects, settings):
        try:
            await js.add_stream(config)
            log.info("stream ready", extra={"stream": config.name})
        except BadRequestError as exc:
            if exc.err_code != _STREAM_NAME_IN_USE:
                raise
            try:
                await js.update_stream(config)
                log.info("stream updated to the configured settings", extra={"stream": config.name})
            except BadRequestError as update_error:
                log.error(
                    "stream exists with settings that cannot be changed in place; keeping it",
                    extra={"stream": config.name, "error": update_error.description},
                )


def consumer_config(subjects: Subjects, settings: SchedulerSettings, host_id: str) -> ConsumerConfig:
    """The durable pull consumer `host-<host_id>`, filtered to `P.assign.<host_id>`."""
    name = subjects.consumer(host_id)
    return ConsumerConfig(
        name=name,
        durable_name=name,
        description=f"assignments of host {host_id}",
        filter_subject=subjects.assign(host_id),
        deliver_policy=DeliverPolicy.ALL,
        ack_policy=AckPolicy.EXPLICIT,
        ack_wait=settings.consumer_ack_wait_s,
        max_deliver=settings.consumer_max_deliver,
        max_ack_pending=1000,
        num_replicas=settings.stream_replicas,
    )


async def ensure_host_consumer(
    js: JetStreamContext, subjects: Subjects, settings: SchedulerSettings, host_id: str
) -> None:
    """Create (or update to our configuration) the host's durable consumer; idempotent.

    Raises:
        nats.errors.Error: JetStream is unreachable or refused.
    """
    await js.add_consumer(subjects.assignments_stream, consumer_config(subjects, settings, host_id))


#: What a JetStream call can raise when NATS or JetStream is unavailable or refuses.
JETSTREAM_ERRORS: tuple[type[Exception], ...] = (nats.errors.Error, APIError, TimeoutError)
