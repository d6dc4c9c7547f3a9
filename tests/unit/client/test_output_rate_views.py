"""What an operator sees of a host over its output rate share: `devsched hosts` and `devsched logs`."""

from __future__ import annotations

import io
import uuid
from datetime import UTC, datetime

import pytest
from rich.console import Console

from devsched.client.cli import render
from devsched.client.cli.logs import note_of
from devsched.core.status import DeviceState
from devsched.protocol import messages as m
from devsched.protocol.codec import decode, encode
from devsched.protocol.logs import LogKind, LogRecord

pytestmark = pytest.mark.unit

T0 = datetime(2025, 3, 4, 5, 6, 7, tzinfo=UTC)


def shown(hosts: list[m.HostView]) -> str:
    file = io.StringIO()
    Console(file=file, width=200, color_system=None).print(render.hosts_table(hosts))
    return file.getvalue()


def test_hosts_shows_a_host_whose_logs_are_closed() -> None:
    device = m.DeviceView(device_id="d1", labels={}, state=DeviceState.AVAILABLE)
    closed = m.HostView(host_id="loud", online=True, last_seen_at=T0, devices=[device], logs_closed_until=T0)
    calm = m.HostView(host_id="calm", online=True, last_seen_at=T0, devices=[device])
    text = shown([closed, calm]).splitlines()
    lines = {name: next(line for line in text if f" {name} " in line) for name in ("loud", "calm")}
    assert "(logs closed)" in lines["loud"]
    assert "(logs closed)" not in lines["calm"]


def test_a_refused_record_reads_as_how_much_was_refused_and_why() -> None:
    record = LogRecord(
        task_id=uuid.uuid4(),
        attempt=2,
        seq=7,
        kind=LogKind.REFUSED,
        at=T0,
        offset=4096,
        refused_records=566,
        dropped_bytes=4364,
    )
    again = decode(LogRecord, encode(record))
    assert again == record
    assert note_of(again) == (
        "attempt 2: 566 records (4364 bytes of output) refused by the logs stream: "
        "this host's output rate was over its share"
    )
