"""The JSON shape of the domain events: written and read back by field name, renamed keys, old and new rows."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime, timedelta, timezone

import pytest

from devsched.core.eventjson import Shape, shape
from devsched.core.events import AttemptAssigned, DeviceEvent, StepProgress, TaskEvent
from devsched.core.status import EventKind, TaskStatus

pytestmark = pytest.mark.unit

AT = datetime(2026, 12, 1, 10, 0, 0, 1, tzinfo=UTC)
EVENT = TaskEvent(
    event=EventKind.PROGRESS, task_id=uuid.UUID(int=7), seq=4, status=TaskStatus.DISPATCHED, at=AT, attempt=1,
    host_id="h1", device_id="h1-d1", progress=StepProgress(step="flash", index=0, of=2),
)  # fmt: skip


def iso(value: datetime) -> str:
    return value.isoformat()


def test_an_event_is_its_fields_by_name_with_times_as_the_writer_formats_them() -> None:
    data = shape(TaskEvent).write(EVENT, iso)
    assert list(data) == [f.name for f in dataclasses.fields(TaskEvent)]
    assert (data["event"], data["task_id"], data["status"], data["reason"]) == (
        "progress", str(uuid.UUID(int=7)), "dispatched", None
    )  # fmt: skip
    assert (data["at"], data["progress"]) == (
        "2026-12-01T10:00:00.000001+00:00",
        {"step": "flash", "index": 0, "of": 2},
    )
    assert shape(TaskEvent).write(EVENT, lambda t: "T")["at"] == "T"


@pytest.mark.parametrize("cls", [TaskEvent, AttemptAssigned, DeviceEvent, StepProgress])
def test_a_shape_names_every_field_of_its_dataclass_in_order(cls: type[object]) -> None:
    assert [f.name for f in shape(cls).fields] == [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]


def test_what_is_written_reads_back_as_the_same_value_whatever_the_offset() -> None:
    other = dataclasses.replace(EVENT, at=datetime(2026, 12, 1, 11, 0, tzinfo=timezone(timedelta(hours=1))))
    for event in (EVENT, other, dataclasses.replace(EVENT, event=EventKind.DONE, progress=None, reason="ok")):
        assert shape(TaskEvent).read(shape(TaskEvent).write(event, iso)) == event


def test_a_renamed_key_is_written_and_read_under_its_new_name_only() -> None:
    stored = shape(TaskEvent).renamed(event="kind")
    data = stored.write(EVENT, iso)
    assert (data["kind"], "event" in data) == ("progress", False)
    assert stored.read(data) == EVENT
    assert stored.field("event").key == "kind"
    with pytest.raises(ValueError, match="no fields"):
        shape(TaskEvent).renamed(kind="event")


def test_unknown_keys_are_ignored_and_absent_optional_fields_read_as_their_defaults() -> None:
    data = shape(TaskEvent).write(EVENT, iso)
    assert shape(TaskEvent).read({**data, "added_later": 1}) == EVENT
    sparse = {k: v for k, v in data.items() if k not in {"attempt", "host_id", "device_id", "reason"}}
    assert shape(TaskEvent).read(sparse) == dataclasses.replace(EVENT, attempt=None, host_id=None, device_id=None)
    with pytest.raises(KeyError):
        shape(TaskEvent).read({k: v for k, v in data.items() if k != "seq"})
    with pytest.raises(ValueError, match="sleeping"):
        shape(TaskEvent).read({**data, "status": "sleeping"})


def test_a_field_without_a_json_shape_is_refused_when_the_shape_is_made() -> None:
    @dataclasses.dataclass(frozen=True)
    class Odd:
        when: timedelta

    with pytest.raises(TypeError, match="no JSON shape"):
        Shape(Odd)
    with pytest.raises(ValueError, match="no field 'nope'"):
        shape(TaskEvent).field("nope")
