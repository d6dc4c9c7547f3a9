"""Domain events: a task event carries progress exactly when it is a progress event, and counts from 1."""

from __future__ import annotations

import uuid

import pytest

from devsched.core.events import StepProgress, TaskEvent
from devsched.core.status import EventKind, TaskStatus

from .factories import T0

pytestmark = pytest.mark.unit

STEP = StepProgress(step="flash", index=0, of=2)


@pytest.mark.parametrize("kind", list(EventKind))
def test_progress_is_set_exactly_on_progress_events(kind: EventKind) -> None:
    def make(progress: StepProgress | None) -> TaskEvent:
        return TaskEvent(
            event=kind, task_id=uuid.uuid4(), seq=1, status=TaskStatus.DISPATCHED, at=T0, progress=progress
        )

    right, wrong = (STEP, None) if kind is EventKind.PROGRESS else (None, STEP)
    assert make(right).progress == right
    with pytest.raises(ValueError, match="progress"):
        make(wrong)


def test_seq_counts_from_one() -> None:
    with pytest.raises(ValueError, match="seq"):
        TaskEvent(event=EventKind.SUBMITTED, task_id=uuid.uuid4(), seq=0, status=TaskStatus.QUEUED, at=T0)
