"""The output rate warden: a host writing records into its logs stream faster than its share has it closed.

Every `host_log_rate_interval_s` each replica reads the state of every host's logs stream in one JetStream
request (`STREAM.LIST` filtered to the hosts' log subjects: no work per record), keeps each host's readings
over `host_log_rate_window_s`, and closes the stream of a host that wrote past its share in that window
(`devsched.core.outputrate`): JetStream then refuses the host's publishes until `host_log_cooldown_s` has
passed, and the first replica to see that time pass opens it again. Only that host's own stream changes:
no other host's record is refused or dropped.

Several replicas agree without talking: whether a stream is closed, and until when, is in the stream itself
(its metadata, `CLOSED_UNTIL`), so closing and opening are idempotent updates that any replica may make,
and a replica forgets a host's readings while its stream is closed. Since the cool-down is at least the
window, a reopened stream's window holds nothing of the flood that closed it: no replica closes it again
for what was already paid for.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable

from nats.js import JetStreamContext
from nats.js.api import StreamInfo
from nats.js.errors import NotFoundError

from devsched.core.outputrate import OutputShare, RateWindow, Reading
from devsched.protocol.subjects import Subjects
from devsched.scheduler.jetstream import closed_logs_config, closed_until, open_logs_config
from devsched.scheduler.metrics import LOG_CLOSINGS

log = logging.getLogger("devsched.scheduler.warden")

#: Stream infos JetStream lists in one page.
_PAGE = 256


class OutputWarden:
    """Holds each host's log writes to its rate share (see the module docstring). `step` is one pass."""

    def __init__(
        self,
        js: JetStreamContext,
        subjects: Subjects,
        share: OutputShare,
        *,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._js = js
        self._subjects = subjects
        self._share = share
        self._clock = clock
        self._monotonic = monotonic
        self._windows: dict[str, RateWindow] = {}
        #: Hosts whose logs stream this replica saw closed at its last pass, and until when (Unix seconds).
        self.closed: dict[str, float] = {}

    async def step(self) -> bool:
        """Read every host's logs stream once; close those past their share, open those whose time is up.

        Raises:
            nats.errors.Error: JetStream is unreachable or refused (the loop retries).
        """
        streams = await self._host_log_streams()
        now, at = self._clock(), self._monotonic()
        seen: set[str] = set()
        closed: dict[str, float] = {}
        for info in streams:
            host_id = self._host_of(info)
            if host_id is None:
                continue
            seen.add(host_id)
            until = closed_until(info.config)
            if until is not None:
                self._windows.pop(host_id, None)  # what it wrote before is paid for
                if now >= until:
                    await self._open(info, host_id)
                else:
                    closed[host_id] = until
                continue
            window = self._windows.get(host_id)
            if window is None:
                window = self._windows[host_id] = RateWindow(self._share)
            state = info.state
            over = window.add(Reading(at=at, last_seq=state.last_seq, messages=state.messages, bytes=state.bytes))
            if over is not None:
                until = now + self._share.cooldown_s
                await self._close(info, host_id, until, over.records, over.bytes)
                self._windows.pop(host_id, None)
                closed[host_id] = until
        for gone in self._windows.keys() - seen:
            del self._windows[gone]
        self.closed = closed
        return False

    async def _close(self, info: StreamInfo, host_id: str, until: float, records: int, size: int) -> None:
        await self._js.update_stream(closed_logs_config(info.config, info.state.messages, until))
        LOG_CLOSINGS.labels(host_id).inc()
        log.warning(
            "host's log output over its rate share: its logs stream refuses new records for the cool-down",
            extra={
                "host_id": host_id,
                "records": records,
                "bytes": size,
                "window_s": self._share.window_s,
                "cooldown_s": self._share.cooldown_s,
            },
        )

    async def _open(self, info: StreamInfo, host_id: str) -> None:
        try:
            current = await self._js.stream_info(self._subjects.host_logs_stream(host_id))
        except NotFoundError:
            return
        if closed_until(current.config) is None:
            return  # another replica opened it already
        await self._js.update_stream(open_logs_config(current.config))
        log.info("host's logs stream open again after its cool-down", extra={"host_id": host_id})

    def _host_of(self, info: StreamInfo) -> str | None:
        """The host whose log subjects the stream takes (`P.host.<id>.log.>`), if it is a host's logs stream."""
        head, tail = f"{self._subjects.prefix}.host.", ".log.>"
        for subject in info.config.subjects or ():
            if subject.startswith(head) and subject.endswith(tail):
                host_id = subject[len(head) : -len(tail)]
                if host_id and "." not in host_id and info.config.name == self._subjects.host_logs_stream(host_id):
                    return host_id
        return None

    async def _host_log_streams(self) -> list[StreamInfo]:
        """Every stream that takes hosts' log subjects, with its state: one request a page of 256."""
        infos: list[StreamInfo] = []
        while True:
            reply = await self._js._api_request(
                f"{self._js._prefix}.STREAM.LIST",
                json.dumps({"subject": self._subjects.host_log_all, "offset": len(infos)}).encode(),
                timeout=self._js._timeout,
            )
            page = reply.get("streams") or []
            infos += [StreamInfo.from_response(item) for item in page]
            total = reply.get("total", 0)
            if not page or len(page) < _PAGE or not isinstance(total, int) or len(infos) >= total:
                return infos
