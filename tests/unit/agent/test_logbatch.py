"""The batching of step output into log records: record size and order, the cap, the bounded buffer."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from devsched.agent.logbatch import LogBatcher, LogLimits, Pending, utf8_cut
from devsched.core.status import Outcome
from devsched.protocol.codec import decode
from devsched.protocol.logs import DataEncoding, LogKind, LogRecord, OutputStream
from devsched.protocol.plans import StepStatus

pytestmark = pytest.mark.unit

TASK = uuid.UUID("00000000-0000-4000-8000-000000000001")
OUT, ERR = OutputStream.STDOUT, OutputStream.STDERR


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def batcher(clock: Clock | None = None, **limits: Any) -> LogBatcher:
    return LogBatcher(
        TASK,
        2,
        LogLimits(**limits),
        clock=lambda: datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
        monotonic=clock or Clock(),
    )


def drain(b: LogBatcher, *, ack: bool = True) -> list[LogRecord]:
    """Take every queued record (acknowledging it unless `ack` is false), decoded."""
    records = []
    while (pending := b.take()) is not None:
        records.append(decode(LogRecord, pending.payload))
        if ack:
            b.acked(pending)
    return records


def output_of(records: list[LogRecord]) -> bytes:
    return b"".join(r.content() for r in records if r.kind is LogKind.OUTPUT)


def test_a_run_of_one_stream_is_one_record_closed_at_the_step_end() -> None:
    b = batcher()
    b.output("build", 0, OUT, b"hello ")
    b.output("build", 0, OUT, b"world\n")
    assert b.take() is None, "a record that is not full waits for more"
    b.step_end("build", 0, StepStatus.DONE, 0)
    records = drain(b)
    assert [r.kind for r in records] == [LogKind.OUTPUT, LogKind.STEP_END]
    first = records[0]
    assert (first.seq, first.step, first.index, first.stream, first.offset) == (1, "build", 0, OUT, 0)
    assert (first.encoding, first.data) == (DataEncoding.UTF8, "hello world\n")
    assert (records[1].seq, records[1].status, records[1].exit_code, records[1].offset) == (2, "done", 0, 12)


def test_records_follow_the_order_of_arrival_across_streams_and_steps() -> None:
    b = batcher()
    b.output("a", 0, OUT, b"1")
    b.output("a", 0, ERR, b"2")
    b.output("a", 0, OUT, b"3")
    b.step_end("a", 0, StepStatus.FAILED, 1)
    b.output("b", 1, OUT, b"4")
    b.end(Outcome.FAILED, released=False, lease_lost=False, reason="step 'a' failed")
    records = drain(b)
    assert [(r.kind, r.stream, r.data, r.offset) for r in records] == [
        (LogKind.OUTPUT, OUT, "1", 0),
        (LogKind.OUTPUT, ERR, "2", 1),
        (LogKind.OUTPUT, OUT, "3", 2),
        (LogKind.STEP_END, None, None, 3),
        (LogKind.OUTPUT, OUT, "4", 3),
        (LogKind.END, None, None, 4),
    ]
    assert [r.seq for r in records] == [1, 2, 3, 4, 5, 6]
    end = records[-1]
    assert (end.outcome, end.lease_lost, end.output_bytes, end.sent_bytes, end.dropped_bytes) == (
        "failed",
        False,
        4,
        4,
        0,
    )
    assert b.done


def test_a_record_waits_at_most_the_linger_time() -> None:
    clock = Clock()
    b = batcher(clock, linger_s=0.1)
    assert b.linger_due() is None
    b.output("s", 0, OUT, b"line\n")
    assert b.linger_due() == pytest.approx(0.1)
    clock.now += 0.05
    b.close_lingering()
    assert b.take() is None
    clock.now += 0.06
    assert b.linger_due() == 0.0
    b.close_lingering()
    assert [r.data for r in drain(b)] == ["line\n"]


def test_full_records_are_cut_at_record_bytes_after_a_whole_character() -> None:
    b = batcher(record_bytes=1024)
    text = ("é" * 1500).encode()  # two bytes each
    b.output("s", 0, OUT, b"x" + text)  # shifted by one: a cut at 1024 would split a character
    records = drain(b)
    assert [len(r.content()) for r in records] == [1023, 1024]  # whole characters; the rest stays open
    b.step_end("s", 0, StepStatus.DONE, 0)
    records += drain(b)
    assert all(r.encoding is DataEncoding.UTF8 for r in records if r.kind is LogKind.OUTPUT)
    assert output_of(records) == b"x" + text
    offsets = [r.offset for r in records if r.kind is LogKind.OUTPUT]
    assert offsets == [0, 1023, 2047]


def test_bytes_that_are_not_utf8_travel_as_base64_exactly() -> None:
    b = batcher()
    data = bytes(range(256)) * 3
    b.output("s", 0, ERR, data)
    b.step_end("s", 0, StepStatus.DONE, 0)
    records = drain(b)
    assert records[0].encoding is DataEncoding.BASE64
    assert records[0].content() == data


def test_text_that_json_would_blow_up_travels_as_base64() -> None:
    b = batcher()
    data = b"\x01\x02" * 1000  # valid UTF-8, but six bytes each as JSON escapes
    b.output("s", 0, OUT, data)
    b.step_end("s", 0, StepStatus.DONE, 0)
    pending = b.take()
    assert pending is not None
    record = decode(LogRecord, pending.payload)
    assert (record.encoding, record.content()) == (DataEncoding.BASE64, data)
    assert len(pending.payload) < len(data) * 4 // 3 + 1024


def test_no_record_is_encoded_above_max_payload() -> None:
    # base64 is 4/3 of the bytes: a record of max_payload's size is split until each half fits
    b = batcher(record_bytes=64 * 1024, max_payload=64 * 1024 + 4096 + 1)
    data = b"\x01" * 60000
    b.output("s", 0, OUT, data)
    b.step_end("s", 0, StepStatus.DONE, 0)
    pending: list[Pending] = []
    while (p := b.take()) is not None:
        pending.append(p)
    assert all(len(p.payload) <= b.limits.max_payload for p in pending)
    records = [decode(LogRecord, p.payload) for p in pending]
    assert len(records) > 2
    assert [r.seq for r in records] == list(range(1, len(records) + 1))
    assert output_of(records) == data


def test_the_cap_truncates_with_a_marker_and_the_rest_is_only_counted() -> None:
    b = batcher(max_bytes=10, record_bytes=4096)
    b.output("s", 0, OUT, b"0123456")
    b.output("s", 0, OUT, b"789abc")
    b.output("s", 0, ERR, b"more")
    b.step_end("s", 0, StepStatus.DONE, 0)
    b.output("t", 1, OUT, b"later")
    b.end(Outcome.DONE, released=False, lease_lost=False, reason=None)
    records = drain(b)
    assert [r.kind for r in records] == [LogKind.OUTPUT, LogKind.TRUNCATED, LogKind.STEP_END, LogKind.END]
    assert output_of(records) == b"0123456789"
    marker = records[1]
    assert (marker.offset, marker.cap_bytes, marker.step) == (10, 10, "s")
    end = records[-1]
    assert (end.output_bytes, end.sent_bytes, end.dropped_bytes) == (22, 10, 0)
    assert b.truncated


def test_a_full_buffer_drops_and_counts_then_says_so_once_there_is_room() -> None:
    b = batcher(buffer_bytes=10, record_bytes=4)
    b.output("s", 0, OUT, b"abcdefgh")  # two full records, unacknowledged: 8 bytes held
    held = [b.take(), b.take()]
    assert b.buffered == 8
    b.output("s", 0, OUT, b"ijklmn")  # 2 fit, 4 dropped
    b.output("s", 0, ERR, b"opq")  # dropped: nothing was acknowledged
    assert (b.buffered, b.dropped_bytes) == (10, 7)
    for pending in held:
        assert pending is not None
        b.acked(pending)  # NATS is back
    b.output("s", 0, OUT, b"rs")
    b.step_end("s", 0, StepStatus.DONE, 0)
    records = [decode(LogRecord, p.payload) for p in held if p is not None] + drain(b)
    kinds = [(r.kind, r.offset, r.content() or r.dropped_bytes) for r in records]
    assert kinds == [
        (LogKind.OUTPUT, 0, b"abcd"),
        (LogKind.OUTPUT, 4, b"efgh"),
        (LogKind.OUTPUT, 8, b"ij"),
        (LogKind.DROPPED, 10, 7),
        (LogKind.OUTPUT, 17, b"rs"),
        (LogKind.STEP_END, 19, None),
    ]
    assert [r.seq for r in records] == list(range(1, 7))


def test_drops_still_pending_at_the_step_end_are_reported_before_it() -> None:
    b = batcher(buffer_bytes=4, record_bytes=4)
    b.output("s", 0, OUT, b"abcdef")
    b.step_end("s", 0, StepStatus.DONE, 0)
    b.end(Outcome.DONE, released=False, lease_lost=True, reason=None)
    records = drain(b)
    assert [r.kind for r in records] == [LogKind.OUTPUT, LogKind.DROPPED, LogKind.STEP_END, LogKind.END]
    assert records[1].dropped_bytes == 2
    assert (records[-1].lease_lost, records[-1].dropped_bytes) == (True, 2)


def test_nothing_is_taken_after_the_end() -> None:
    b = batcher()
    b.end(Outcome.CANCELLED, released=False, lease_lost=False, reason="cancelled")
    b.output("s", 0, OUT, b"late")
    b.step_end("s", 0, StepStatus.DONE, 0)
    records = drain(b)
    assert [r.kind for r in records] == [LogKind.END]
    assert b.done
    assert json.loads(LogRecord.model_dump_json(records[0]))["outcome"] == "cancelled"


def test_utf8_cut() -> None:
    euro = "€".encode()  # three bytes
    data = b"ab" + euro + b"c"
    assert [utf8_cut(data, n) for n in range(1, 7)] == [1, 2, 2, 2, 5, 6]
    assert utf8_cut(b"\xff\xfe\xfd", 2) == 2  # not UTF-8: cut anywhere
    assert utf8_cut(euro, 2) == 2  # the character starts the data: nothing better than the limit


chunks = st.lists(st.tuples(st.sampled_from([OUT, ERR]), st.binary(min_size=1, max_size=300)), min_size=1, max_size=40)


@given(chunks=chunks, record_bytes=st.integers(1024, 2048), acks=st.booleans())
def test_output_is_kept_or_accounted_for_byte_for_byte(
    chunks: list[tuple[OutputStream, bytes]], record_bytes: int, acks: bool
) -> None:
    b = batcher(record_bytes=record_bytes, buffer_bytes=2048, max_bytes=4000)
    records: list[LogRecord] = []
    for stream, data in chunks:
        b.output("s", 0, stream, data)
        records += drain(b, ack=acks)
    b.end(Outcome.DONE, released=False, lease_lost=False, reason=None)
    records += drain(b, ack=acks)
    assert [r.seq for r in records] == list(range(1, len(records) + 1))
    sent = output_of(records)
    everything = b"".join(data for _, data in chunks)
    end = records[-1]
    assert end.output_bytes == len(everything)
    assert end.sent_bytes == len(sent) <= 4000
    dropped = sum(r.dropped_bytes or 0 for r in records if r.kind is LogKind.DROPPED)
    assert end.dropped_bytes == dropped
    # every byte is sent, dropped or cut, at its offset
    for record in records:
        if record.kind is LogKind.OUTPUT:
            assert everything[record.offset : record.offset + len(record.content())] == record.content()
    cut = len(everything) - len(sent) - dropped
    assert cut == 0 or any(r.kind is LogKind.TRUNCATED for r in records)
    if acks:
        assert not dropped, "acknowledged records free the buffer at once"
