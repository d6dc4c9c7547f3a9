"""Subject, stream, service and consumer names, all derived from one prefix.

Deriving every name from the prefix is what lets two deployments share one NATS account untouched.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from devsched.core.ids import is_token

if TYPE_CHECKING:
    from devsched.protocol.endpoints import Endpoint

#: The prefix when none is configured.
DEFAULT_PREFIX = "devsched"


class HostVerb(StrEnum):
    """The last token of a host subject `P.host.<host_id>.<verb>`.

    The requests among them are endpoints of `devsched.protocol.endpoints`, each with its models there.
    """

    #: Request: replace the host's device list.
    REGISTER = "register"
    #: Request: a sign of life.
    HEARTBEAT = "heartbeat"
    #: Request: start an assigned attempt.
    CLAIM = "claim"
    #: Request: extend a lease, report progress.
    RENEW = "renew"
    #: Request (an addition): extend several of the host's leases at once.
    RENEWALS = "renewals"
    #: Request: the outcome of an attempt.
    REPORT = "report"
    #: Request (an addition): the outcomes of several of the host's attempts at once.
    REPORTS = "reports"
    #: Request (an addition): give an attempt back; it is requeued (agent shutdown, drain, restart).
    RELEASE = "release"
    #: Published by the scheduler (core NATS): renew now, a cancellation is pending; or (an addition)
    #: a drain notice: finish the running work, take no more, exit.
    NUDGE = "nudge"
    #: Request (an addition): store a file of an attempt's artifacts, whose chunks the host has just
    #: published on `P.host.<host_id>.upload.<task_id>.<attempt>.<upload_id>`.
    ARTIFACT = "artifact"


def _require_token(what: str, value: str) -> str:
    if not is_token(value):
        raise ValueError(f"{what} must be 1 to 64 of A-Z a-z 0-9 _ -, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class Subjects:
    """All names for one prefix (`P` in PROTOCOL.md).

    Raises:
        ValueError: the prefix is not a single subject token.
    """

    prefix: str = DEFAULT_PREFIX

    def __post_init__(self) -> None:
        _require_token("prefix", self.prefix)

    # -- request/reply endpoints (`devsched.protocol.endpoints`) ----------------------------------------

    def endpoint(self, endpoint: Endpoint[Any, Any], host_id: str | None = None) -> str:
        """Where a request to `endpoint` goes: `P.api.<group>.<verb>`, or `P.host.<host_id>.<verb>` for a host's.

        Raises:
            ValueError: a host endpoint without a host id (or one that is not a token), or an operator
                endpoint with one.
        """
        if not endpoint.host:
            if host_id is not None:
                raise ValueError(f"{endpoint.name} is not a host endpoint: no host id in its subject")
            return f"{self.prefix}.api.{endpoint.group}.{endpoint.verb}"
        if host_id is None:
            raise ValueError(f"{endpoint.name} is a host endpoint: its subject names the host")
        return f"{self.prefix}.host.{_require_token('host id', host_id)}.{endpoint.verb}"

    def served(self, endpoint: Endpoint[Any, Any]) -> str:
        """The subject the scheduler serves `endpoint` on: `P.host.*.<verb>` for every host, else its subject."""
        return f"{self.prefix}.host.*.{endpoint.verb}" if endpoint.host else self.endpoint(endpoint)

    # -- host subjects ---------------------------------------------------------------------------------

    def host(self, host_id: str, verb: HostVerb | str) -> str:
        """`P.host.<host_id>.<verb>`: what a host sends to (or, for nudge, listens on).

        Raises:
            ValueError: `host_id` is not a token (a `*` or `.` would widen the subject), or unknown verb.
        """
        return f"{self.prefix}.host.{_require_token('host id', host_id)}.{HostVerb(verb)}"

    def parse_host(self, subject: str) -> tuple[str, HostVerb]:
        """The host id and verb of a concrete host subject, such as a request's subject in a handler.

        Raises:
            ValueError: not `P.host.<host_id>.<verb>` for this prefix, or the id is not a token.
        """
        parts = subject.split(".")
        if len(parts) != 4 or parts[0] != self.prefix or parts[1] != "host":
            raise ValueError(f"not a host subject of prefix {self.prefix!r}: {subject!r}")
        try:
            verb = HostVerb(parts[3])
        except ValueError:
            raise ValueError(f"unknown host verb in {subject!r}") from None
        return _require_token("host id", parts[2]), verb

    def host_id_of(self, subject: str) -> str:
        """The host id of a concrete host subject (see `parse_host`)."""
        return self.parse_host(subject)[0]

    def host_log(self, host_id: str, task_id: uuid.UUID | str, attempt: int) -> str:
        """`P.host.<host_id>.log.<task_id>.<attempt>` (an addition): where a host streams an attempt's output.

        Under the host's own subjects, so NATS permissions let a host write only its own logs; readers take
        the attempt's host from the task view, so another host cannot put lines into it.

        Raises:
            ValueError: `host_id` is not a token, `task_id` not a UUID, or `attempt` below 1.
        """
        if attempt < 1:
            raise ValueError(f"attempt must be >= 1, got {attempt}")
        return f"{self.prefix}.host.{_require_token('host id', host_id)}.log.{uuid.UUID(str(task_id))}.{attempt}"

    def host_logs(self, host_id: str) -> str:
        """`P.host.<host_id>.log.>`: every log subject of one host (what its NATS permissions allow)."""
        return f"{self.prefix}.host.{_require_token('host id', host_id)}.log.>"

    @property
    def host_log_all(self) -> str:
        """`P.host.*.log.>`: the subjects of the logs stream."""
        return f"{self.prefix}.host.*.log.>"

    def host_upload(self, host_id: str, task_id: uuid.UUID | str, attempt: int, upload_id: str) -> str:
        """`P.host.<host_id>.upload.<task_id>.<attempt>.<upload_id>` (an addition): one artifact's chunks.

        Under the host's own subjects, like its logs: NATS permissions let a host publish only its own
        uploads, and the scheduler reads a commit's chunks only from the committing host's subject.

        Raises:
            ValueError: `host_id` or `upload_id` is not a token, `task_id` not a UUID, or `attempt` below 1.
        """
        if attempt < 1:
            raise ValueError(f"attempt must be >= 1, got {attempt}")
        host, upload = _require_token("host id", host_id), _require_token("upload id", upload_id)
        return f"{self.prefix}.host.{host}.upload.{uuid.UUID(str(task_id))}.{attempt}.{upload}"

    def host_uploads(self, host_id: str) -> str:
        """`P.host.<host_id>.upload.>`: every upload subject of one host (what its NATS permissions allow)."""
        return f"{self.prefix}.host.{_require_token('host id', host_id)}.upload.>"

    @property
    def host_upload_all(self) -> str:
        """`P.host.*.upload.>`: the subjects of the uploads stream."""
        return f"{self.prefix}.host.*.upload.>"

    # -- JetStream ---------------------------------------------------------------------------------------

    def assign(self, host_id: str) -> str:
        """`P.assign.<host_id>`: where the host's assignments are published."""
        return f"{self.prefix}.assign.{_require_token('host id', host_id)}"

    @property
    def assign_all(self) -> str:
        """`P.assign.>`: the subjects of the assignments stream."""
        return f"{self.prefix}.assign.>"

    def task_events(self, task_id: uuid.UUID | str) -> str:
        """`P.events.task.<task_id>`: where one task's events are published."""
        return f"{self.prefix}.events.task.{uuid.UUID(str(task_id))}"

    @property
    def task_events_all(self) -> str:
        """`P.events.task.*`: every task's events (for watchers)."""
        return f"{self.prefix}.events.task.*"

    def device_events(self, device_id: str) -> str:
        """`P.events.device.<device_id>`: where one device's health events are published (quarantined, returned)."""
        return f"{self.prefix}.events.device.{_require_token('device id', device_id)}"

    @property
    def device_events_all(self) -> str:
        """`P.events.device.*`: every device's health events."""
        return f"{self.prefix}.events.device.*"

    @property
    def events_all(self) -> str:
        """`P.events.>`: the subjects of the events stream."""
        return f"{self.prefix}.events.>"

    @property
    def internal_wake(self) -> str:
        """`P.internal.wake` (an addition, core NATS): the sweeper wakes every scheduler's loops with it.

        Its body is a `devsched.protocol.wake.Wake`.
        """
        return f"{self.prefix}.internal.wake"

    @property
    def host_jetstream_api(self) -> str:
        """`P.js.API`: the JetStream API prefix of a host that is a NATS account of its own.

        Such an account imports its consumer's `$JS.API.CONSUMER.{INFO,MSG.NEXT}` subjects mapped here: an
        account without JetStream answers `$JS.API.>` itself (503, "JetStream not enabled"), first.
        """
        return f"{self.prefix}.js.API"

    @property
    def _stream_prefix(self) -> str:
        return self.prefix.upper().replace("-", "_")

    @property
    def assignments_stream(self) -> str:
        """`<PU>_ASSIGNMENTS`, e.g. `DEVSCHED_ASSIGNMENTS`."""
        return f"{self._stream_prefix}_ASSIGNMENTS"

    @property
    def events_stream(self) -> str:
        """`<PU>_EVENTS`, e.g. `DEVSCHED_EVENTS`."""
        return f"{self._stream_prefix}_EVENTS"

    @property
    def logs_stream(self) -> str:
        """`<PU>_LOGS` (an addition), e.g. `DEVSCHED_LOGS`: step output of earlier versions.

        Before the per-host streams (`host_logs_stream`); retired to `retired_logs`, read until its records age out.
        """
        return f"{self._stream_prefix}_LOGS"

    @property
    def uploads_stream(self) -> str:
        """`<PU>_UPLOADS` (an addition): artifact chunks of earlier versions.

        Before the per-host streams (`host_uploads_stream`); retired to `retired_uploads`.
        """
        return f"{self._stream_prefix}_UPLOADS"

    def host_logs_stream(self, host_id: str) -> str:
        """`<PU>_LOGS_<host_id>` (an addition): one host's step output, `P.host.<host_id>.log.>`.

        One stream a host, so that its byte share is the stream's `max_bytes`: JetStream limits a stream or
        an exact subject, never a subject prefix, and a host flooding its own stream evicts only its own.
        """
        return f"{self._stream_prefix}_LOGS_{_require_token('host id', host_id)}"

    def host_uploads_stream(self, host_id: str) -> str:
        """`<PU>_UPLOADS_<host_id>` (an addition): one host's artifact chunks, `P.host.<host_id>.upload.>`."""
        return f"{self._stream_prefix}_UPLOADS_{_require_token('host id', host_id)}"

    @property
    def retired_logs(self) -> str:
        """`P.retired.logs`: the one subject of the retired shared `<PU>_LOGS` (nobody publishes to it).

        Its records stay readable (a consumer's filter need not be among the stream's subjects) until they
        age out; the per-host streams then own `P.host.<host_id>.log.>`.
        """
        return f"{self.prefix}.retired.logs"

    @property
    def retired_uploads(self) -> str:
        """`P.retired.uploads`: the one subject of the retired shared `<PU>_UPLOADS`."""
        return f"{self.prefix}.retired.uploads"

    @property
    def artifacts_bucket(self) -> str:
        """`<PU>_ARTIFACTS` (an addition): the Object Store bucket of stored artifacts (stream `OBJ_<PU>_ARTIFACTS`)."""
        return f"{self._stream_prefix}_ARTIFACTS"

    @property
    def web_revoked_bucket(self) -> str:
        """`<PU>_WEB_REVOKED` (an addition): the key-value bucket of the dashboard's logged-out sessions.

        Stream `KV_<PU>_WEB_REVOKED`: one key per session id, kept until that session's cookie expires.
        """
        return f"{self._stream_prefix}_WEB_REVOKED"

    @staticmethod
    def consumer(host_id: str) -> str:
        """`host-<host_id>`: the durable pull consumer of one host on the assignments stream."""
        return f"host-{_require_token('host id', host_id)}"

    # -- the service -----------------------------------------------------------------------------------

    @property
    def service_name(self) -> str:
        """`P-scheduler`: `devsched-scheduler` by default, distinct per deployment in `nats micro ls`."""
        return f"{self.prefix}-scheduler"

    @property
    def queue_group(self) -> str:
        """The queue group every scheduler replica's endpoints join (one per deployment)."""
        return f"{self.prefix}-scheduler"


#: The JetStream header that names a message for de-duplication.
MSG_ID_HEADER = "Nats-Msg-Id"


def assignment_msg_id(task_id: uuid.UUID | str, attempt: int) -> str:
    """`Nats-Msg-Id` of an assignment: `<task_id>.<attempt>`, so a re-relayed one is stored once."""
    return f"{uuid.UUID(str(task_id))}.{attempt}"


def assignment_resend_msg_id(task_id: uuid.UUID | str, attempt: int, at_ms: int) -> str:
    """`Nats-Msg-Id` of an assignment published again (an addition): `<task_id>.<attempt>.resync.<at_ms>`.

    The scheduler's resync publishes an unclaimed attempt's assignment again, `at_ms` being the Unix time of
    its pass in milliseconds: an id of its own each time, so that the duplicate window (which may outlive a
    purge of the stream) never swallows the copy as the first publication, or as an earlier copy.
    """
    return f"{assignment_msg_id(task_id, attempt)}.resync.{at_ms}"


def event_msg_id(task_id: uuid.UUID | str, seq: int) -> str:
    """`Nats-Msg-Id` of a task event: `<task_id>:<seq>` (an addition: the protocol only asks for uniqueness).

    A colon, not a dot, so it can never equal an assignment's `<task_id>.<attempt>`, wherever ids of both
    kinds meet (logs, a tool that reads both streams).
    """
    return f"{uuid.UUID(str(task_id))}:{seq}"


def device_event_msg_id(device_id: str, ref: int) -> str:
    """`Nats-Msg-Id` of a device event: `device.<device_id>.<ref>`, `ref` the event's outbox row id.

    A device has no event counter of its own; the outbox id is unique and the same for every relay of the
    row, so a re-relayed event is stored once. The `device.` head keeps it apart from task ids.
    """
    return f"device.{_require_token('device id', device_id)}.{ref}"


def log_msg_id(lease_id: uuid.UUID | str, seq: int) -> str:
    """`Nats-Msg-Id` of a log record: `<lease_id>.<seq>` (see `devsched.protocol.logs.LogRecord`)."""
    return f"{uuid.UUID(str(lease_id))}.{seq}"
