"""The streams and the per-host consumers, created idempotently.

Assignments: WORK-QUEUE retention. An assignment is a command for one host, useless once acked, so the
stream keeps only what is not yet acked (no unbounded growth, and a host consumer that is deleted and
created again does not replay assignments its agent already handled). Work-queue streams allow one
consumer per subject, which is exactly one `host-<id>` per `P.assign.<id>`. `max_age` bounds what a host
that never comes back leaves behind; its leases expired long before.

Events: LIMITS retention with a max age (7 days by default) and an optional size cap: an audit log that
any number of watchers read, with their own consumers, at their own pace.

Logs and uploads (additions): one stream of each per host, made when it registers (`ensure_host_streams`),
each holding the host's share of the budget, so that a host filling its own evicts or is refused only its
own (`logs_stream_config`, `artifacts.uploads_stream_config`). The budgets fit the store: `budget.py`. A host
writing its logs past its rate share has its logs stream closed to new records for a while (`warden.py`,
`closed_logs_config`).

The artifacts bucket (an addition): `devsched.scheduler.artifacts`.

The dashboard's revoked sessions (an addition): a key-value bucket the web replicas write and follow
(`revoked_sessions_stream_config`).

All: file storage, a de-duplication window long enough to cover a relay that crashed between publishing
and marking a row (the next relay republishes within seconds; the window is minutes), configurable replicas.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable

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
from nats.js.errors import APIError, BadRequestError, NotFoundError, ServerError

from devsched.core.errors import StorageFull
from devsched.protocol.subjects import Subjects
from devsched.scheduler.artifacts import bucket_stream_config, uploads_stream_config
from devsched.scheduler.settings import SchedulerSettings

log = logging.getLogger("devsched.scheduler.jetstream")

#: JetStream's error code for "stream name already in use with a different configuration".
_STREAM_NAME_IN_USE = 10058
#: "subjects overlap with an existing stream".
_SUBJECTS_OVERLAP = 10065
#: "insufficient storage resources available": the store cannot reserve the stream's max_bytes.
_INSUFFICIENT_RESOURCES = 10047


def stream_configs(subjects: Subjects, settings: SchedulerSettings) -> list[StreamConfig]:
    """The configuration of `<PU>_ASSIGNMENTS`, `<PU>_EVENTS`, `OBJ_<PU>_ARTIFACTS` and `KV_<PU>_WEB_REVOKED`.

    Each host's logs and uploads streams are made when it registers (`ensure_host_streams`).
    """
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
        bucket_stream_config(subjects, settings),
        revoked_sessions_stream_config(subjects, settings),
    ]


def revoked_sessions_stream_config(subjects: Subjects, settings: SchedulerSettings) -> StreamConfig:
    """`KV_<PU>_WEB_REVOKED`: the key-value bucket of the dashboard's logged-out session ids (devsched-web).

    One key per session id (history 1), each written with a per-message TTL that ends it when its cookie
    expires (the web knows the session's lifetime; the scheduler does not need to). Append-only for its
    writer: no delete, no purge, no rollup, so a revocation stays until it expires. Capped by
    `revoked_sessions_max_bytes`, new entries refused when full (the logout then says so) rather than older
    revocations dropped. Made here, not by the web, whose NATS user may write and read this bucket only.
    """
    bucket = subjects.web_revoked_bucket
    return StreamConfig(
        name=f"KV_{bucket}",
        description=f"devsched-web revoked sessions ({subjects.prefix}): one key per logout, until its cookie expires",
        subjects=[f"$KV.{bucket}.>"],
        retention=RetentionPolicy.LIMITS,
        storage=StorageType(settings.stream_storage),
        num_replicas=settings.stream_replicas,
        max_msgs_per_subject=1,
        max_bytes=settings.revoked_sessions_max_bytes,
        max_msg_size=1024,
        discard=DiscardPolicy.NEW,
        allow_msg_ttl=True,
        allow_rollup_hdrs=False,
        deny_delete=True,
        deny_purge=True,
    )


def logs_stream_config(subjects: Subjects, settings: SchedulerSettings, host_id: str) -> StreamConfig:
    """`<PU>_LOGS_<host_id>`: one host's step output as its agent streams it (`P.host.<host_id>.log.>`).

    LIMITS retention, the host's own oldest output dropped first, by age (7 days by default) and by its
    share of the logs budget (`logs_host_max_bytes`); each agent caps its attempts' output itself. A host
    publishes into it through its own subjects only (deploy accounts) and cannot read it; operators read it
    with ordered consumers.
    """
    return StreamConfig(
        name=subjects.host_logs_stream(host_id),
        description=f"devsched step output ({subjects.prefix}) of host {host_id}",
        subjects=[subjects.host_logs(host_id)],
        retention=RetentionPolicy.LIMITS,
        storage=StorageType(settings.stream_storage),
        num_replicas=settings.stream_replicas,
        max_age=settings.logs_max_age_s,
        max_bytes=settings.logs_host_max_bytes,
        duplicate_window=settings.duplicate_window_s,
        discard=DiscardPolicy.OLD,
    )


#: The logs stream's metadata key that says it is closed to new records, and until when (Unix seconds).
CLOSED_UNTIL = "devsched_closed_until"


def closed_until(config: StreamConfig) -> float | None:
    """Until when (Unix seconds) a host's logs stream is closed to new records (`warden.py`); None when open."""
    value = (config.metadata or {}).get(CLOSED_UNTIL)
    try:
        return None if value is None else float(value)
    except ValueError:
        return 0.0  # unreadable: closed until long ago, so it is reopened


def closed_logs_config(config: StreamConfig, messages: int, until: float) -> StreamConfig:
    """`config` closed to new records until `until`: discard new, at most the `messages` it holds now.

    JetStream then refuses the host's publishes ("maximum messages exceeded", 503 code 10077) and keeps what
    is stored; records stored after `messages` was read are kept too (lowering `max_msgs` under discard new
    drops nothing). Nobody else's records are touched: the stream is the host's own.
    """
    metadata = {**(config.metadata or {}), CLOSED_UNTIL: f"{until:.3f}"}
    return dataclasses.replace(config, discard=DiscardPolicy.NEW, max_msgs=max(1, messages), metadata=metadata)


def open_logs_config(config: StreamConfig) -> StreamConfig:
    """`config` open again: its limits as `logs_stream_config` has them, the closing mark gone."""
    metadata = {k: v for k, v in (config.metadata or {}).items() if k != CLOSED_UNTIL}
    return dataclasses.replace(config, discard=DiscardPolicy.OLD, max_msgs=-1, metadata=metadata)


async def ensure_streams(js: JetStreamContext, subjects: Subjects, settings: SchedulerSettings) -> None:
    """Create the streams, or bring existing ones to our configuration; retire the shared ones of before.

    The shared logs and uploads streams of earlier versions are retired (`retire_shared_streams`).

    An existing stream whose configuration cannot be changed in place (its retention, say) is left as
    it is with an error logged: it still carries the messages, and replacing it would lose them.

    Raises:
        nats.errors.Error: JetStream is unreachable or refused (the caller retries).
    """
    for config in stream_configs(subjects, settings):
        await _ensure_stream(js, config)
    await retire_shared_streams(js, subjects)


async def _ensure_stream(js: JetStreamContext, config: StreamConfig) -> None:
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


async def retire_shared_streams(js: JetStreamContext, subjects: Subjects) -> None:
    """Move the shared `<PU>_LOGS` and `<PU>_UPLOADS` of earlier versions off the host subjects.

    JetStream refuses streams whose subjects overlap, so each host's own streams can take
    `P.host.<id>.log.>` and `P.host.<id>.upload.>` only once the shared ones let go of them. Each keeps its
    records under a subject nobody publishes to (`P.retired.logs`, `P.retired.uploads`): readers still find
    an attempt's older output there until it ages out (max age and size as they were). Idempotent.
    """
    for name, retired in (
        (subjects.logs_stream, subjects.retired_logs),
        (subjects.uploads_stream, subjects.retired_uploads),
    ):
        try:
            info = await js.stream_info(name)
        except NotFoundError:
            continue
        if info.config.subjects == [retired]:
            continue
        await js.update_stream(dataclasses.replace(info.config, subjects=[retired]))
        log.info("shared stream retired: its records stay readable until they age out", extra={"stream": name})


async def ensure_host_streams(
    js: JetStreamContext,
    subjects: Subjects,
    settings: SchedulerSettings,
    host_id: str,
    *,
    now: Callable[[], float] = time.time,
) -> None:
    """Create (or bring to our configuration) the host's logs and uploads streams; idempotent.

    A host that has none yet is one host more: refused `StorageFull` when `max_hosts` hosts have theirs, or
    when JetStream has no room left to reserve for its share (the server reserves each stream's `max_bytes`
    from its store and refuses a stream that does not fit). A logs stream closed for its host's rate stays
    closed until its time (`now`, Unix seconds); one whose time has passed is opened.

    Raises:
        StorageFull: no room for one host more.
        nats.errors.Error: JetStream is unreachable or refused.
    """
    logs = logs_stream_config(subjects, settings, host_id)
    try:
        info = await js.stream_info(subjects.host_logs_stream(host_id))
        until = closed_until(info.config)
        if until is not None and until > now():
            # closed for its rate (`warden.py`): a registration must not reopen it before its time
            logs = closed_logs_config(logs, info.state.messages, until)
    except NotFoundError:
        hosts = await _hosts_with_streams(js, subjects)
        if hosts >= settings.max_hosts:
            raise StorageFull(
                f"{hosts} hosts have their logs and uploads streams, the most there is room for (max_hosts)",
                max_hosts=settings.max_hosts,
            ) from None
    for config in (logs, uploads_stream_config(subjects, settings, host_id)):
        try:
            await _ensure_stream(js, config)
        except BadRequestError as exc:
            if exc.err_code != _SUBJECTS_OVERLAP:
                raise
            await retire_shared_streams(js, subjects)  # an earlier version's replica took them back
            await _ensure_stream(js, config)
        except ServerError as exc:
            if exc.err_code != _INSUFFICIENT_RESOURCES:
                raise
            raise StorageFull(
                "JetStream has no room left for this host's share of the logs and uploads budgets",
                max_hosts=settings.max_hosts,
            ) from None


async def _hosts_with_streams(js: JetStreamContext, subjects: Subjects) -> int:
    """How many hosts have a logs stream (the streams that take a host's log subjects)."""
    reply = await js._api_request(
        f"{js._prefix}.STREAM.NAMES",
        json.dumps({"subject": subjects.host_log_all}).encode(),
        timeout=js._timeout,
    )
    total = reply.get("total", 0)
    return int(total) if isinstance(total, int) else 0


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
