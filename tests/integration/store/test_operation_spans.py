"""Each Store operation is one span, named for the operation, inside recorded work only.

The store's tracer is replaced by one of the test's own provider (the process-wide provider is left alone).
"""

from __future__ import annotations

import uuid

import pytest

from devsched.core.errors import NotFound
from devsched.store import Store, transaction
from support.spans import MemorySpans
from support.store_lab import Lab

pytestmark = pytest.mark.integration


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> MemorySpans:
    memory = MemorySpans()
    monkeypatch.setattr(transaction, "_TRACER", memory.tracer("devsched.store"))
    return memory


async def test_an_operation_in_a_recorded_span_is_a_child_span_named_for_it(spans: MemorySpans, lab: Lab) -> None:
    await lab.host("h1", "d1")
    with spans.tracer().start_as_current_span("process devsched.api.tasks.submit") as parent:
        task_id = await lab.submit()  # one statement
        await lab.store.get_task(task_id)  # one transaction
    submit, get = spans.named("submit")[0], spans.named("get_task")[0]
    for span in (submit, get):
        assert span.parent is not None
        assert span.parent.span_id == parent.get_span_context().span_id
        assert span.context.trace_id == parent.get_span_context().trace_id
        assert span.attributes is not None
        assert span.attributes["db.system.name"] == "postgresql"
        assert span.attributes["db.operation.name"] == span.name
        assert span.status.is_ok


async def test_a_refusal_is_noted_on_its_span_and_is_no_error(spans: MemorySpans, store: Store) -> None:
    with spans.tracer().start_as_current_span("process x"), pytest.raises(NotFound):
        await store.get_task(uuid.uuid4())
    (span,) = spans.named("get_task")
    assert span.attributes is not None
    assert span.attributes["error.type"] == "not_found"
    assert span.status.is_unset


async def test_outside_recorded_work_an_operation_makes_no_span(spans: MemorySpans, lab: Lab) -> None:
    await lab.host("h1", "d1")
    await lab.submit()
    assert spans.finished() == ()
