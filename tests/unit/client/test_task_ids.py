"""Short task ids: which texts name a task or a prefix, and which of the scheduler's candidates is the one."""

from __future__ import annotations

import uuid

import pytest
from pydantic import ValidationError

from devsched.client.cli.common import ExitCode, exit_code_of
from devsched.client.errors import InvalidRequest, NotFound, describe
from devsched.client.task_ids import SHOWN_CANDIDATES, AmbiguousTaskId, one_task, task_ref
from devsched.protocol.messages import ListTasksRequest

pytestmark = pytest.mark.unit

TASK = uuid.UUID("3af5939c-1b2d-4e5f-8a9b-0c1d2e3f4a5b")


@pytest.mark.parametrize(
    ("text", "ref"),
    [
        (str(TASK), TASK),
        (str(TASK).upper(), TASK),
        (TASK.hex, TASK),  # the whole id without its hyphens
        (f"  {TASK}\n", TASK),
        (TASK, TASK),
        ("3af5939c", "3af5939c"),
        ("3AF5939C", "3af5939c"),
        ("3af5939c-1b", "3af5939c-1b"),
        ("3af5939c1b", "3af5939c-1b"),  # hyphens put where the id has them
        ("3af5939c-", "3af5939c-"),
        ("3af5939c1b2d4e", "3af5939c-1b2d-4e"),
        ("3af5-939c-1b", "3af5939c-1b"),  # hyphens where the id has none: the digits count
        (TASK.hex[:31], str(TASK)[:35]),
    ],
)
def test_a_whole_id_or_eight_hex_digits_name_a_task(text: str | uuid.UUID, ref: str | uuid.UUID) -> None:
    assert task_ref(text) == ref


@pytest.mark.parametrize("text", ["", "3af5939", "3af593", "3af5939g", "task-1", "3af5939c 1b", "--help", "x" * 300])
def test_anything_else_is_a_usage_error_before_anything_is_sent(text: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        task_ref(text)
    head = "invalid_request: task_id: not a task id: give the whole id or its first 8"
    assert describe(caught.value).startswith(head)
    assert exit_code_of(caught.value) is ExitCode.USAGE


def test_a_prefix_names_the_one_task_that_starts_with_it() -> None:
    assert one_task("3af5939c", [TASK]) == TASK


def test_no_task_starting_with_the_prefix_is_not_found() -> None:
    with pytest.raises(NotFound) as caught:
        one_task("3af5939c", [])
    assert describe(caught.value) == "not_found: no task id starts with 3af5939c"
    assert exit_code_of(caught.value) is ExitCode.NOT_FOUND


def test_several_tasks_starting_with_the_prefix_are_named_and_none_is_chosen() -> None:
    other = uuid.UUID("3af5939c-ffff-4e5f-8a9b-0c1d2e3f4a5b")
    with pytest.raises(AmbiguousTaskId) as caught:
        one_task("3af5939c", [other, TASK])
    line = describe(caught.value)
    named = f"2 task ids start with 3af5939c: {other}, {TASK}"
    assert line == f"invalid_request: task_id: ambiguous: {named}; give more digits"
    assert caught.value.details["candidates"] == [str(other), str(TASK)]
    assert exit_code_of(caught.value) is ExitCode.USAGE


def test_more_candidates_than_shown_are_counted_not_listed() -> None:
    many = [uuid.UUID(f"3af5939c-0000-4000-8000-{i:012x}") for i in range(SHOWN_CANDIDATES)]
    with pytest.raises(AmbiguousTaskId) as caught:
        one_task("3af5939c", many, more=True)
    assert caught.value.details["candidates"] == [str(c) for c in many]
    assert "10+ task ids start with 3af5939c" in describe(caught.value)
    assert describe(caught.value).endswith("and more; give more digits")
    with pytest.raises(AmbiguousTaskId):  # one shown but the scheduler has more: still not the one
        one_task("3af5939c", many[:1], more=True)


@pytest.mark.parametrize("prefix", ["3af5939c", "3af5939c-", "3af5939c-1b2d-4", str(TASK)])
def test_the_wire_takes_a_prefix_as_written(prefix: str) -> None:
    assert ListTasksRequest(id_prefix=prefix).id_prefix == prefix
    assert "id_prefix" not in ListTasksRequest().model_dump(mode="json")  # left out when not used


@pytest.mark.parametrize("prefix", ["3af5939", "3AF5939C", "3af5939c1b", "3af5939c--", f"{TASK}0", "3af5939c-1b2d4"])
def test_the_wire_refuses_any_other_prefix(prefix: str) -> None:
    with pytest.raises(ValidationError):
        ListTasksRequest(id_prefix=prefix)
