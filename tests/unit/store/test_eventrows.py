"""The outbox's row layout: kinds, the stored name of an event's kind, and the SQL that fills fields in."""

from __future__ import annotations

import pytest

from devsched.core.events import AttemptAssigned, TaskEvent
from devsched.store.eventrows import KINDS, event_of, filled, iso_time

pytestmark = pytest.mark.unit


def test_the_sql_fills_fields_by_their_core_names_under_their_row_keys_with_times_as_rows_hold_them() -> None:
    assert filled(TaskEvent, event="u.kind", seq="e.seq", at="moved.now") == (
        f"'kind', u.kind, 'seq', e.seq, 'at', {iso_time('moved.now')}"
    )
    assert (
        filled(AttemptAssigned, expires_at="x.e", lease_id="x.l") == f"'expires_at', {iso_time('x.e')}, 'lease_id', x.l"
    )


def test_a_field_the_event_does_not_have_is_refused() -> None:
    with pytest.raises(ValueError, match="no field 'kind'"):
        filled(TaskEvent, kind="u.kind")


def test_a_kind_this_release_does_not_know_is_refused() -> None:
    assert KINDS == ("task_event", "assignment", "device_event")
    with pytest.raises(ValueError, match="unknown outbox kind"):
        event_of("later_kind", {})
