"""`Client`: the async Python client of the devsched control plane, for scripts and CI jobs.

```python
from devsched.client import Client

async with Client.connect("nats://127.0.0.1:4222") as client:
    reply = await client.submit({"steps": [{"name": "hi", "action": "shell", "args": {"command": "echo hi"}}]},
                                selector={"platform": "sim"})
    async with client.watch(reply.task_id) as events:
        async for event in events:
            print(event.seq, event.event, event.status)
    view = await client.get(reply.task_id)
    async with client.logs(reply.task_id) as records:
        async for record in records:
            sys.stdout.buffer.write(record.content())
```

Every method sends one request of the protocol (`P.api.tasks.submit`, ...) and returns the reply's model
from `devsched.protocol.messages`, or raises the typed error of the reply (`NotFound`,
`InvalidRequest` with `details["errors"]`, ...; see `devsched.client.errors`). Every request is safe to
repeat and is retried after a timeout: a submit always carries an idempotency key (the caller's, or one the
client makes), so a retry never creates a second task.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import io
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Generator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Generic, Self, TypeVar

import nats.errors
from nats.aio.client import Client as NatsClient
from pydantic import BaseModel, ValidationError

from devsched.client import artifacts as artifacts_io
from devsched.client.errors import NatsUnreachable, from_validation, invalid
from devsched.client.logs import LogReader
from devsched.client.plans import build_request, load_request
from devsched.client.resubmit import resubmit as resubmit_task
from devsched.client.task_ids import resolve_task_id
from devsched.client.watch import DEFAULT_IDLE_CHECK_S, TaskWatch
from devsched.core.errors import DevschedError
from devsched.core.limits import LIST_LIMIT_DEFAULT
from devsched.core.status import TERMINAL, TaskKind, TaskStatus
from devsched.protocol import endpoints
from devsched.protocol.connection import connect
from devsched.protocol.endpoints import Endpoint
from devsched.protocol.messages import (
    CancelReply,
    CancelRequest,
    DeviceDrainView,
    DeviceForgottenView,
    DrainRequest,
    ForgetDeviceRequest,
    GetTaskRequest,
    HealthCheckDeleteRequest,
    HealthCheckListRequest,
    HealthCheckSetRequest,
    HealthCheckView,
    HostDrainRequest,
    HostsListRequest,
    HostView,
    LabelDeviceRequest,
    ListArtifactsReply,
    ListArtifactsRequest,
    ListTasksReply,
    ListTasksRequest,
    Plan,
    Selector,
    SubmitReply,
    SubmitRequest,
    TaskEvent,
    TaskSummary,
    TaskView,
    TrimmedField,
)
from devsched.protocol.subjects import DEFAULT_PREFIX, Subjects
from devsched.protocol.tls import DEFAULT_NATS_URL, NatsAccess, NatsSettings
from devsched.protocol.transport import request

#: Seconds to wait for each reply.
DEFAULT_TIMEOUT_S = 5.0

#: The prefix of the idempotency keys the client makes for submits that came without one.
AUTO_KEY_PREFIX = "auto-"

M = TypeVar("M", bound=BaseModel)
R = TypeVar("R", bound=BaseModel)
C = TypeVar("C", bound="Client")
TaskId = uuid.UUID | str


def task_uuid(task_id: TaskId, path: str = "task_id") -> uuid.UUID:
    """`task_id` as a UUID.

    Raises:
        InvalidRequest: it is not a UUID (path `task_id`), before anything is sent.
    """
    if isinstance(task_id, uuid.UUID):
        return task_id
    try:
        return uuid.UUID(str(task_id).strip())
    except ValueError:
        raise invalid(path, f"not a task id (a UUID): {str(task_id)[:80]!r}") from None


def _build(model: type[M], **fields: Any) -> M:
    try:
        return model.model_validate(fields)
    except ValidationError as exc:
        raise from_validation(exc) from None


def _without_secrets(nats_url: str) -> str:
    """The URL(s) with any `user:password@` or `token@` replaced by `***@`, for messages."""
    return ",".join(_mask_one(part) for part in nats_url.split(","))


def _mask_one(url: str) -> str:
    scheme, sep, rest = url.strip().partition("://")
    if not sep:
        scheme, rest = "", scheme
    if "@" in rest:
        rest = "***@" + rest.split("@", 1)[1]
    return f"{scheme}{sep}{rest}"


class Client:
    """An async client of one devsched deployment (one subject prefix) over a NATS connection.

    Make one with `await Client.connect(url)` (it owns and closes its connection), or wrap a connection
    you already have with `Client(nc)`. Use it as an async context manager, or call `close()`.

    Args:
        nc: A connected nats-py client.
        prefix: The deployment's subject prefix (`DEVSCHED_SUBJECT_PREFIX`, default `devsched`).
        timeout: Seconds to wait for each reply.
        retries: Extra tries after a timeout or no-responders, for the requests that are safe to repeat.
        owns_connection: Whether `close()` closes `nc`.
    """

    def __init__(
        self,
        nc: NatsClient,
        *,
        prefix: str = DEFAULT_PREFIX,
        timeout: float = DEFAULT_TIMEOUT_S,
        retries: int = 2,
        owns_connection: bool = False,
    ) -> None:
        self.nc = nc
        self.subjects = Subjects(prefix)
        self.timeout = timeout
        self.retries = retries
        self._owns_connection = owns_connection

    @classmethod
    def connect(
        cls,
        nats_url: str = DEFAULT_NATS_URL,
        *,
        prefix: str = DEFAULT_PREFIX,
        creds: Path | str | None = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        connect_timeout: float | None = None,
        retries: int = 2,
        name: str = "devsched-client",
        nkey_seed: Path | str | None = None,
        user: str | None = None,
        password_file: Path | str | None = None,
        tls_ca: Path | str | None = None,
        tls_cert: Path | str | None = None,
        tls_key: Path | str | None = None,
        tls_hostname: str | None = None,
    ) -> Connecting[Self]:
        """Connect to NATS; `await` it for a client that owns the connection, or use it with `async with`.

        `client = await Client.connect(url)` (then `await client.close()`), or
        `async with Client.connect(url) as client: ...`. The connection is retried until
        `connect_timeout` (default: `timeout`) has passed; once made, it reconnects on its own if the
        server goes away for a while.

        Args:
            nats_url: Server URL(s), comma-separated for a cluster.
            prefix: The deployment's subject prefix.
            creds: A NATS credentials file (JWT and nkey seed), for servers that require one.
            timeout: Seconds to wait for each reply.
            connect_timeout: Seconds to keep trying to connect.
            retries: Extra tries of repeatable requests after a timeout.
            name: Connection name shown by the NATS server's monitoring.
            nkey_seed: An nkey seed file, instead of `creds`.
            user: A NATS user, with `password_file`.
            password_file: A file holding the user's password (a password in the URL works too, but
                shows in process listings and shell history).
            tls_ca: CA bundle of the server's certificate; setting it (or a `tls://` URL) turns TLS on,
                and the server is always verified.
            tls_cert: Client certificate for mutual TLS.
            tls_key: Key of `tls_cert`.
            tls_hostname: Name to verify in the server's certificate when it differs from the URL's host.

        Raises:
            NatsUnreachable: no connection within `connect_timeout`, or the server refused it (a server
                certificate that does not verify says `CERTIFICATE_VERIFY_FAILED`).
            TlsConfigError: a credentials or TLS file is unusable (a `ValueError`), before connecting.
            ValueError: `prefix` is not a subject token.
        """
        settings = NatsAccess(
            url=nats_url,
            creds=creds,
            nkey_seed=nkey_seed,
            user=user,
            password_file=password_file,
            tls_ca=tls_ca,
            tls_cert=tls_cert,
            tls_key=tls_key,
            tls_hostname=tls_hostname,
        )
        return cls.from_settings(
            settings, prefix=prefix, timeout=timeout, connect_timeout=connect_timeout, retries=retries, name=name
        )

    @classmethod
    def from_settings(
        cls,
        settings: NatsSettings,
        *,
        prefix: str = DEFAULT_PREFIX,
        timeout: float = DEFAULT_TIMEOUT_S,
        connect_timeout: float | None = None,
        retries: int = 2,
        name: str = "devsched-client",
    ) -> Connecting[Self]:
        """`connect()` with the NATS settings as every devsched program reads them (`DEVSCHED_NATS_*`).

        Raises:
            TlsConfigError: a credentials or TLS file is unusable (a `ValueError`), before connecting.
            ValueError: `prefix` is not a subject token.
        """
        Subjects(prefix)  # fail on a bad prefix before connecting
        settings.check()  # bad files fail here, before anything is sent
        return Connecting(
            cls._open(
                settings, prefix=prefix, timeout=timeout, connect_timeout=connect_timeout, retries=retries, name=name
            )
        )

    @classmethod
    async def _open(
        cls,
        settings: NatsSettings,
        *,
        prefix: str,
        timeout: float,  # noqa: ASYNC109 - per request, handed to nats-py
        connect_timeout: float | None,
        retries: int,
        name: str,
    ) -> Self:
        shown = _without_secrets(settings.nats_url)
        deadline = connect_timeout if connect_timeout is not None else timeout
        last_error: list[str] = []

        async def remember(exc: Exception) -> None:
            last_error[:] = [f"{type(exc).__name__}: {exc}".strip(": ")]

        nc = NatsClient()
        try:
            async with asyncio.timeout(deadline):
                await connect(
                    nc,
                    settings,
                    name=name,
                    drain_timeout_s=2.0,
                    connect_timeout_s=min(2.0, deadline),
                    error_cb=remember,
                )
        except TimeoutError:
            await _close_quietly(nc)
            why = f" ({last_error[0]})" if last_error else ""
            raise NatsUnreachable(f"cannot connect to NATS at {shown} within {deadline:g} s{why}", url=shown) from None
        except (nats.errors.Error, OSError, ValueError) as exc:
            await _close_quietly(nc)
            raise NatsUnreachable(f"cannot connect to NATS at {shown}: {exc}", url=shown) from None
        return cls(nc, prefix=prefix, timeout=timeout, retries=retries, owns_connection=True)

    async def close(self) -> None:
        """Close the connection if this client made it; idempotent."""
        if self._owns_connection:
            await _close_quietly(self.nc)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        await self.close()

    @property
    def prefix(self) -> str:
        """The deployment's subject prefix."""
        return self.subjects.prefix

    async def _call(self, endpoint: Endpoint[R, M], payload: R, *, repeatable: bool = True) -> M:
        subject = self.subjects.endpoint(endpoint)
        try:
            return await request(
                self.nc,
                subject,
                payload,
                endpoint.reply,
                timeout=self.timeout,
                retries=self.retries if repeatable else 0,
            )
        except DevschedError:
            raise
        except (nats.errors.Error, OSError) as exc:
            raise NatsUnreachable(f"request to {subject} failed: {type(exc).__name__}: {exc}") from None

    # -- tasks -------------------------------------------------------------------------------------------

    async def submit(
        self,
        plan_or_request: SubmitRequest | Plan | Mapping[str, Any],
        *,
        name: str | None = None,
        selector: Selector | Mapping[str, str] | None = None,
        device_id: str | None = None,
        priority: int | None = None,
        max_attempts: int | None = None,
        lease_ttl_s: int | None = None,
        idempotency_key: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> SubmitReply:
        """Submit a task (`P.api.tasks.submit`).

        Args:
            plan_or_request: A `SubmitRequest`, a `Plan`, or a mapping holding a plan (`{"steps": [...]}`)
                or a whole submit request (`{"plan": ..., "selector": ...}`).
            name: The task's name.
            selector: A `Selector` (replaces the request's), or a mapping of labels the device must
                have (merged into the request's labels).
            device_id: Run only on this device.
            priority: -1000..1000, higher first (default 0).
            max_attempts: Leases the task may use before a lease expiry fails it, 1..100 (default 3).
            lease_ttl_s: Lease length in whole seconds, 1..3600 (default 30).
            idempotency_key: A repeated key returns the existing task (`created` false). Without one the
                client makes one (`auto-<uuid>`), so a submit is always retried safely after a timeout.
            metadata: Free-form JSON kept with the task (merged into the request's).

        Raises:
            InvalidRequest: the request fails the schema (checked locally first, with the server's paths).
            NoReply: no scheduler answered.
        """
        body = build_request(
            plan_or_request,
            name=name,
            selector=selector,
            device_id=device_id,
            priority=priority,
            max_attempts=max_attempts,
            lease_ttl_s=lease_ttl_s,
            idempotency_key=idempotency_key,
            metadata=metadata,
        )
        return await self._submit(body)

    async def submit_file(self, path: Path | str, **overrides: Any) -> SubmitReply:
        """Submit the plan file at `path` (YAML or JSON; a bare plan or a whole submit request).

        `overrides` are `submit`'s keyword arguments and win over the file.

        Raises:
            PlanFileError: the file cannot be read or parsed.
            InvalidRequest: its content fails the schema.
        """
        return await self._submit(load_request(path, **overrides))

    async def _submit(self, body: SubmitRequest) -> SubmitReply:
        """Send a submit that is always safe to repeat.

        Without a key of the caller's, the client makes one (`auto-<uuid>`) so that a retry after a timeout
        or an ambiguous `unavailable` (a commit whose outcome is unknown) finds the task the first try
        created instead of making a second one. Nobody else knows that key, so a repeat answered
        `created: false` can only be our own earlier try, and the reply says `created: true`.
        """
        generated = body.idempotency_key is None
        if generated:
            body = body.model_copy(update={"idempotency_key": f"{AUTO_KEY_PREFIX}{uuid.uuid4()}"})
        reply = await self._call(endpoints.TASKS_SUBMIT, body)
        if generated and not reply.created:
            reply = reply.model_copy(update={"created": True})
        return reply

    async def resubmit(self, task_id: TaskId) -> SubmitReply:
        """Submit a new task with task `task_id`'s plan, selector and options (`devsched.client.resubmit`).

        Raises:
            NotFound: no such task.
            InvalidRequest: `task_id` is not a UUID, or the task is a health check.
        """
        return await resubmit_task(self, task_uuid(task_id), datetime.now(UTC))

    async def get(self, task_id: TaskId, *, full: Sequence[TrimmedField | str] | None = None) -> TaskView:
        """The task with all its attempts (`P.api.tasks.get`).

        A view too large for one NATS message comes trimmed, its `truncated` naming the fields cut; `full`
        asks for those fields whole (the others are cut first to make room).

        Raises:
            NotFound: no such task.
            InvalidRequest: `task_id` is not a UUID, or `full` names another field.
            ReplyTooLarge: even so the view does not fit one message.
        """
        body = _build(GetTaskRequest, task_id=task_uuid(task_id), full=list(full) if full else None)
        return await self._call(endpoints.TASKS_GET, body)

    async def list_page(
        self,
        *,
        status: TaskStatus | str | None = None,
        limit: int = LIST_LIMIT_DEFAULT,
        after: str | None = None,
        kind: TaskKind | str | None = None,
        device_id: str | None = None,
        id_prefix: str | None = None,
    ) -> ListTasksReply:
        """One page of tasks, newest first (`P.api.tasks.list`); pass the reply's `next` as `after`.

        `kind`: only `user` tasks, or only `health` tasks (issue 13); both by default.
        `device_id`: only tasks that had an attempt on that device, its history (issue 15).
        `id_prefix`: only tasks whose id starts with it (`resolve` turns a short id into the one task's).
        """
        body = _build(
            ListTasksRequest,
            status=status,
            limit=limit,
            after=after,
            kind=kind,
            device_id=device_id,
            id_prefix=id_prefix,
        )
        return await self._call(endpoints.TASKS_LIST, body)

    async def resolve(self, task_id: TaskId) -> uuid.UUID:
        """The id of the one task `task_id` names: a whole id, or its first 8 or more hex digits (`3af5939c`).

        Raises:
            InvalidRequest: neither an id nor such a prefix (before anything is sent).
            NotFound: no task id starts with the prefix.
            AmbiguousTaskId: several do (an `InvalidRequest` naming them): give more digits.
        """
        return await resolve_task_id(self, task_id)

    async def pages(
        self, *, status: TaskStatus | str | None = None, page_size: int = LIST_LIMIT_DEFAULT, after: str | None = None
    ) -> AsyncIterator[ListTasksReply]:
        """Every page of tasks, newest first, fetched one at a time as the iteration goes on."""
        cursor = after
        while True:
            page = await self.list_page(status=status, limit=page_size, after=cursor)
            yield page
            if page.next is None or not page.tasks:
                return
            cursor = page.next

    async def cancel(self, task_id: TaskId, reason: str | None = None) -> CancelReply:
        """Cancel a task (`P.api.tasks.cancel`); harmless to repeat.

        A queued task is cancelled at once; a running one gets a durable cancellation request that its
        host sees at its next renewal (the reply's `cancel_requested`); a terminal one is left as is.

        Raises:
            NotFound: no such task.
        """
        return await self._call(endpoints.TASKS_CANCEL, CancelRequest(task_id=task_uuid(task_id), reason=reason))

    async def wait(self, task_id: TaskId, *, timeout: float | None = None) -> TaskView:  # noqa: ASYNC109
        """Follow a task until it ends and return its final view.

        Raises:
            TimeoutError: still not terminal after `timeout` seconds.
            NotFound: no such task.
        """
        async with asyncio.timeout(timeout):
            async with self.watch(task_id) as events:
                async for _ in events:
                    pass
            view = await self.get(task_id)
            while view.status not in TERMINAL:  # the watch ended on a quiet stream; the row decides
                await asyncio.sleep(0.2)
                view = await self.get(task_id)
            return view

    def watch(self, task_id: TaskId, *, idle_check_s: float = DEFAULT_IDLE_CHECK_S) -> TaskWatch:
        """The task's events from the start, ending after the first terminal one.

        Use `async with client.watch(id) as events: async for event in events: ...`. Events come once
        each (deduplicated by `seq`); see `devsched.client.watch`.

        Raises:
            InvalidRequest: `task_id` is not a UUID (at once).
            NotFound: no such task (when the iteration starts).
        """
        tid = task_uuid(task_id)

        async def probe() -> TaskStatus:
            return TaskStatus((await self.get(tid)).status)

        return TaskWatch(self.nc.jetstream(), self.subjects, tid, probe, idle_check_s=idle_check_s)

    def logs(
        self, task_id: TaskId, *, attempt: int | None = None, step: str | None = None, follow: bool = False
    ) -> LogReader:
        """The task's step output, as `LogRecord`s in order (from the `<PU>_LOGS` stream).

        Use `async with client.logs(id) as records: async for record in records: ...`; `record.content()`
        gives an `output` record's bytes (`collect_output` joins them). The latest attempt's by default, or
        attempt `attempt`; only step `step`'s records (and the attempt's `end`) when given. Without
        `follow`, what is stored now; with it, on while the attempt runs, to its `end` record (and, for the
        latest attempt, through the attempts that follow until the task ends). See `devsched.client.logs`.

        Raises:
            InvalidRequest: `task_id` is not a UUID (at once).
            NotFound: no such task, or no such attempt (when the iteration starts).
            Unavailable: the logs stream does not exist.
        """
        tid = task_uuid(task_id)
        if attempt is not None and attempt < 1:
            raise invalid("attempt", "must be 1 or more")

        async def probe() -> TaskView:
            return await self.get(tid)

        return LogReader(
            self.nc.jetstream(),
            self.subjects,
            tid,
            probe,
            attempt=attempt,
            step=step,
            follow=follow,
            read_timeout_s=self.timeout,
        )

    # -- hosts and devices ---------------------------------------------------------------------------------

    # -- artifacts (issue 12) ------------------------------------------------------------------------------

    async def artifacts(self, task_id: TaskId, *, attempt: int | None = None) -> ListArtifactsReply:
        """The task's stored artifacts (of one attempt, or all), by attempt then name, and their bucket."""
        body = ListArtifactsRequest(task_id=task_uuid(task_id), attempt=attempt)
        listing = await self._call(endpoints.TASKS_ARTIFACTS, body)
        found = list(listing.artifacts)
        while listing.next is not None and listing.artifacts:  # the rest, when one reply could not hold them
            body = body.model_copy(update={"after": listing.next})
            listing = await self._call(endpoints.TASKS_ARTIFACTS, body)
            found += listing.artifacts
        return listing.model_copy(update={"artifacts": found, "next": None})

    async def artifact_bytes(self, task_id: TaskId, name: str, *, attempt: int | None = None) -> bytes:
        """One artifact's bytes (of `attempt`, or the newest attempt's), checked against its SHA-256."""
        listing = await self.artifacts(task_id, attempt=attempt)
        sink = io.BytesIO()
        await artifacts_io.read_into(
            self.nc.jetstream(), listing.bucket, artifacts_io.pick(listing.artifacts, name, attempt), sink
        )
        return sink.getvalue()

    async def download_artifact(
        self, task_id: TaskId, name: str, path: Path | str, *, attempt: int | None = None, force: bool = False
    ) -> Path:
        """Write one artifact to `path` atomically (refused if it exists, unless `force`); the path."""
        listing = await self.artifacts(task_id, attempt=attempt)
        chosen = artifacts_io.pick(listing.artifacts, name, attempt)
        return await artifacts_io.download(self.nc.jetstream(), listing.bucket, chosen, Path(path), force=force)

    async def hosts(self) -> builtins.list[HostView]:
        """Every registered host with its devices and their states (`P.api.hosts.list`)."""
        reply = await self._call(endpoints.HOSTS_LIST, HostsListRequest())
        hosts = list(reply.hosts)
        while reply.next is not None and reply.hosts:  # the rest, when one reply could not hold them
            reply = await self._call(endpoints.HOSTS_LIST, HostsListRequest(after=reply.next))
            hosts += reply.hosts
        return hosts

    async def drain(self, device_id: str, *, drained: bool = True, reason: str | None = None) -> DeviceDrainView:
        """Take a device out of service (`drained=False`: put it back) (`P.api.devices.drain`).

        A running attempt on it goes on to its end; no new work goes to it.

        Raises:
            NotFound: no such device.
        """
        body = _build(DrainRequest, device_id=device_id, drained=drained, reason=reason)
        return await self._call(endpoints.DEVICES_DRAIN, body)

    async def forget_device(self, device_id: str, *, reason: str) -> DeviceForgottenView:
        """Free a device from the host that registered it (`P.api.devices.forget`); what was freed.

        The next host that registers it owns it. The act is kept in the scheduler's audit records.

        Raises:
            NotFound: no such device.
            Conflict: it runs an attempt (or is in its grace after an expired one).
        """
        body = _build(ForgetDeviceRequest, device_id=device_id, reason=reason)
        return await self._call(endpoints.DEVICES_FORGET, body)

    async def label_device(
        self, device_id: str, labels: Mapping[str, str] | None = None, *, unset: builtins.list[str] | None = None
    ) -> DeviceDrainView:
        """Pin operator labels on a device, or unpin keys (`P.api.devices.label`); the device after it.

        Pinned labels win over its host's: the host's registration can neither override nor remove them.

        Raises:
            NotFound: no such device.
        """
        body = _build(LabelDeviceRequest, device_id=device_id, labels=dict(labels or {}), unset=list(unset or []))
        return await self._call(endpoints.DEVICES_LABEL, body)

    async def drain_host(self, host_id: str, *, drained: bool = True, reason: str | None = None) -> HostView:
        """Drain every device of a host and tell its agent to finish (`P.api.hosts.drain`); the host after it.

        The agent finishes its running attempts, takes no more work and exits 0 once idle; the devices stay
        drained across its restart until `drained=False` returns them all to service.

        Raises:
            NotFound: no such host.
        """
        body = _build(HostDrainRequest, host_id=host_id, drained=drained, reason=reason)
        return await self._call(endpoints.HOSTS_DRAIN, body)

    async def health_set(
        self,
        name: str,
        plan: Plan | Mapping[str, Any],
        *,
        labels: Mapping[str, str] | None = None,
        interval_s: float | None = None,
    ) -> HealthCheckView:
        """Create or replace the health check `name` for the devices whose labels contain `labels`.

        `P.api.health.set` (operators only); `interval_s` defaults to a day.
        """
        fields: dict[str, Any] = {"name": name, "selector": {"labels": dict(labels or {})}}
        fields["plan"] = plan.model_dump(mode="json") if isinstance(plan, Plan) else dict(plan)
        if interval_s is not None:
            fields["interval_s"] = interval_s
        return await self._call(endpoints.HEALTH_SET, _build(HealthCheckSetRequest, **fields))

    async def health_checks(self) -> builtins.list[HealthCheckView]:
        """The health checks in force, by name (`P.api.health.list`)."""
        reply = await self._call(endpoints.HEALTH_LIST, HealthCheckListRequest())
        checks = list(reply.checks)
        while reply.next is not None and reply.checks:  # the rest, when one reply could not hold them
            body = HealthCheckListRequest(after=reply.next)
            reply = await self._call(endpoints.HEALTH_LIST, body)
            checks += reply.checks
        return checks

    async def health_delete(self, name: str) -> HealthCheckView:
        """Remove the health check `name` (`P.api.health.delete`); the check removed.

        Raises:
            NotFound: no check of that name.
        """
        body = _build(HealthCheckDeleteRequest, name=name)
        return await self._call(endpoints.HEALTH_DELETE, body)

    async def list(
        self, *, status: TaskStatus | str | None = None, limit: int | None = None, page_size: int = LIST_LIMIT_DEFAULT
    ) -> AsyncIterator[TaskSummary]:
        """Tasks, newest first, across pages (fetched lazily); at most `limit` when given.

        (Defined last in the class: inside it, the name `list` is this method.)
        """
        if limit is not None and limit <= 0:
            return
        count = 0
        size = page_size if limit is None else max(1, min(page_size, limit))
        async for page in self.pages(status=status, page_size=size):
            for task in page.tasks:
                yield task
                count += 1
                if limit is not None and count >= limit:
                    return


class Connecting(Generic[C]):
    """What `Client.connect` returns: await it for the client, or `async with` it (closed on exit)."""

    def __init__(self, opening: Awaitable[C]) -> None:
        self._opening = opening
        self._client: C | None = None

    def __await__(self) -> Generator[Any, None, C]:
        return self._opening.__await__()

    async def __aenter__(self) -> C:
        self._client = await self._opening
        return self._client

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if self._client is not None:
            await self._client.close()


async def _close_quietly(nc: NatsClient) -> None:
    if nc.is_closed:
        return
    with contextlib.suppress(Exception):
        await nc.close()


async def wait_for_scheduler(client: Client, *, timeout: float = 30.0) -> None:  # noqa: ASYNC109
    """Return once a scheduler answers requests of `client`'s prefix (polls `hosts`).

    Raises:
        NoReply: none answered within `timeout` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            await client.hosts()
            return
        except DevschedError as exc:
            if not exc.retryable or time.monotonic() >= deadline:
                raise
        await asyncio.sleep(0.2)


__all__ = [
    "DEFAULT_NATS_URL",
    "DEFAULT_TIMEOUT_S",
    "Client",
    "Connecting",
    "LogReader",
    "TaskEvent",
    "task_uuid",
    "wait_for_scheduler",
]
