"""The `ls` table as rich renders it at a fixed width: ids whole on one line, plain columns into a pipe."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from io import StringIO

import pytest
from rich.console import Console

from devsched.client.cli.render import print_table, short_id_chars, tasks_table
from devsched.core.status import TaskStatus
from devsched.protocol.messages import TaskSummary

pytestmark = pytest.mark.unit

LONG_NAME = "a-rather-long-task-name-for-a-narrow-terminal"
REASON = "no_online_device: 3 devices match board=rpi4,usb=hub-7 but their hosts are offline (last seen 4m ago)"


def summary(task_id: uuid.UUID, name: str = LONG_NAME) -> TaskSummary:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    return TaskSummary.model_validate(
        {"task_id": task_id, "name": name, "status": TaskStatus.QUEUED, "priority": 100, "max_attempts": 3,
         "attempt_count": 0, "cancel_requested": False, "selector": {"labels": {"board": "rpi4"}},
         "plan": {"steps": [{"name": "a", "action": "noop"}]}, "created_at": now, "updated_at": now,
         "pending_reason": REASON}
    )  # fmt: skip


def test_short_ids_take_whole_groups_more_where_two_look_alike() -> None:
    a = "3af5939c-1b2d-4e5f-8a9b-0c1d2e3f4a5b"
    assert short_id_chars([a, "4af5939c-1b2d-4e5f-8a9b-0c1d2e3f4a5b"]) == 8
    assert short_id_chars([a, "3af5939c-1b2e-4e5f-8a9b-0c1d2e3f4a5b"]) == 13
    assert short_id_chars([a, "3af5939c-1b2d-4e5e-8a9b-0c1d2e3f4a5b"]) == 18
    assert short_id_chars([a, "3af5939c-1b2d-4e5f-8a9c-0c1d2e3f4a5b"]) == 23
    assert short_id_chars([a, "3af5939c-1b2d-4e5f-8a9b-0c1d2e3f4a5c"]) == 36
    assert short_id_chars([a, a]) == 8  # the same task twice is one id
    assert short_id_chars([]) == 8


def shown(width: int, terminal: bool, tasks: list[TaskSummary], *, wide: bool = False) -> list[str]:
    buffer = StringIO()
    console = Console(file=buffer, width=width, force_terminal=terminal, color_system=None, highlight=False)
    print_table(console, lambda compact: tasks_table(tasks, compact=compact, short_ids=compact and not wide))
    return buffer.getvalue().splitlines()


@pytest.mark.parametrize("width", [80, 120])
def test_a_terminal_shows_each_id_on_one_line(width: int) -> None:
    twin = uuid.UUID("3af5939c-1b2d-4e5f-8a9b-0c1d2e3f4a5b")
    tasks = [summary(uuid.uuid4()), summary(twin), summary(uuid.UUID("3af5939c-ffff-4e5f-8a9b-0c1d2e3f4a5b"))]
    lines = shown(width, True, tasks)
    assert all(len(line) <= width for line in lines), lines
    starts = [line.split()[0] for line in lines[2:] if line and not line[0].isspace()]
    assert starts == [str(tasks[0].task_id)[:13], "3af5939c-1b2d", "3af5939c-ffff"], lines
    wide = shown(width, True, tasks, wide=True)
    assert all(len(line) <= width for line in wide), wide
    assert all(sum(str(t.task_id) in line for line in wide) == 1 for t in tasks), wide


def test_a_pipe_gets_plain_columns_with_whole_ids() -> None:
    tasks = [summary(uuid.uuid4()) for _ in range(2)]
    lines = shown(80, False, tasks)
    assert not set("".join(lines)) & set("─│┃━┏┓┗┛┡┩└┘┌┐├┤┬┴┼╭╮╯╰═║"), lines
    assert lines[0].split() == ["TASK", "NAME", "STATUS", "PRI", "ATTEMPTS", "CREATED", "NOTE"]
    for task, line in zip(tasks, lines[1:], strict=True):
        assert line.split()[:3] == [str(task.task_id), LONG_NAME, "queued"], line
        assert line.rstrip().endswith(REASON), line
