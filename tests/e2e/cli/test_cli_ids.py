"""Task ids in a terminal, against the real services: short ids taken everywhere, ids never cut over lines.

The terminal tests run `devsched ls` in tmux panes 80 and 120 columns wide and read back what tmux shows.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support.databases import execute
from support.devsched_stack import Devsched, Stack, run_devsched
from support.invariants import plain_dsn

pytestmark = pytest.mark.e2e

#: A selector no device of the stack has: the task stays queued, and `cancel` ends it at once.
NOWHERE = "board=no-board-in-this-lab"
LONG_NAME = "a-rather-long-task-name-for-a-narrow-terminal"
#: What a table's rules are drawn with, in any of rich's boxes.
BOX_DRAWING = set("─│┃━┏┓┗┛┡┩└┘┌┐├┤┬┴┼╭╮╯╰═║")


def ok(result: subprocess.CompletedProcess[str], code: int = 0) -> subprocess.CompletedProcess[str]:
    assert result.returncode == code, f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return result


def doc(result: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(ok(result).stdout)


def error_line(result: subprocess.CompletedProcess[str], code: int) -> str:
    """The command failed with `code`, said so in one stderr line, and printed nothing on stdout."""
    ok(result, code)
    assert result.stdout == ""
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: "), line
    return line


def queued_task(devsched: Devsched, tmp_path: Path, name: str = "short-ids") -> str:
    path = tmp_path / "plan.yaml"
    path.write_text("steps: [{name: a, action: noop}]\n")
    return str(doc(devsched("submit", str(path), "--selector", NOWHERE, "--name", name, "--json"))["task_id"])


def status_of(devsched: Devsched, task_id: str) -> str:
    return str(doc(devsched("get", task_id, "--json"))["status"])


def test_a_short_id_names_the_task_for_every_command(devsched: Devsched, tmp_path: Path) -> None:
    task_id = queued_task(devsched, tmp_path)
    short = task_id[:8]
    assert doc(devsched("get", short, "--json"))["task_id"] == task_id
    assert doc(devsched("get", task_id.replace("-", "")[:14].upper(), "--json"))["task_id"] == task_id
    assert doc(devsched("artifacts", short, "--json"))["artifacts"] == []
    logs = ok(devsched("logs", short))
    assert f"task {task_id} has no attempt yet" in logs.stderr

    cancelled = doc(devsched("cancel", short, "--json"))
    assert (cancelled["task_id"], cancelled["status"]) == (task_id, "cancelled")
    watched = ok(devsched("watch", short, "--json"), 3)  # 3: it ended cancelled
    assert {json.loads(line)["task_id"] for line in watched.stdout.splitlines()} == {task_id}


def test_an_ambiguous_prefix_names_the_candidates_and_changes_nothing(
    devsched: Devsched, stack: Stack, tmp_path: Path
) -> None:
    task_id = queued_task(devsched, tmp_path)
    # A second task whose id shares the first 12 digits: a copy of the row (4 billion tasks make one by chance).
    other = next(h for h in (uuid.uuid4().hex[:4] for _ in range(9)) if h != task_id[14:18])
    twin = f"{task_id[:14]}{other}{task_id[18:]}"
    execute(
        plain_dsn(stack.database_url),
        "INSERT INTO tasks SELECT (jsonb_populate_record(NULL::tasks, to_jsonb(t) || "
        f"jsonb_build_object('task_id', '{twin}', 'idempotency_key', NULL))).* FROM tasks t "
        f"WHERE task_id = '{task_id}'",
    )
    for command in ("get", "cancel", "watch", "logs", "artifacts"):
        line = error_line(devsched(command, task_id[:8]), 2)
        head = f"error: invalid_request: task_id: ambiguous: 2 task ids start with {task_id[:8]}: "
        assert line.startswith(head), line
        assert task_id in line, line
        assert twin in line, line
        assert line.endswith("give more digits"), line
    assert status_of(devsched, task_id) == status_of(devsched, twin) == "queued"  # the cancel changed nothing

    assert doc(devsched("cancel", task_id[:18], "--json"))["task_id"] == task_id  # where they differ
    assert (status_of(devsched, task_id), status_of(devsched, twin)) == ("cancelled", "queued")
    ok(devsched("cancel", twin))


def test_an_unknown_or_short_prefix_is_a_clear_error(devsched: Devsched, tmp_path: Path) -> None:
    queued_task(devsched, tmp_path)
    unknown = uuid.uuid4().hex[:10]
    listed = doc(devsched("ls", "--all", "--json"))["tasks"]
    assert not any(t["task_id"].replace("-", "").startswith(unknown) for t in listed)
    written = f"{unknown[:8]}-{unknown[8:]}"
    assert error_line(devsched("get", unknown), 4) == f"error: not_found: no task id starts with {written}"
    assert error_line(devsched("cancel", unknown), 4).startswith("error: not_found: ")
    line = error_line(devsched("get", "3af593"), 2)
    assert line.startswith("error: invalid_request: task_id: not a task id: give the whole id or its first 8"), line


def test_ls_quiet_prints_whole_ids_only(devsched: Devsched, tmp_path: Path) -> None:
    ids = [queued_task(devsched, tmp_path, name=f"quiet-{i}") for i in range(3)]
    quiet = ok(devsched("ls", "-q", "--status", "queued", "--all")).stdout
    lines = quiet.splitlines()
    assert quiet.endswith("\n")
    assert all(str(uuid.UUID(line)) == line for line in lines), quiet  # nothing but whole ids
    assert [i for i in lines if i in ids] == list(reversed(ids))  # newest first, as `ls`
    assert ok(devsched("ls", "-q", "--limit", "1")).stdout.count("\n") == 1
    refused = error_line(devsched("ls", "-q", "--json"), 2)
    assert refused == "error: usage: --quiet and --json are two outputs: choose one"
    for task_id in ids:
        ok(devsched("cancel", task_id))


def test_ls_into_a_pipe_is_plain_columns_with_whole_ids(devsched: Devsched, stack: Stack, tmp_path: Path) -> None:
    task_id = queued_task(devsched, tmp_path, name=LONG_NAME)
    for columns in ("80", "120"):
        shown = ok(run_devsched("ls", env={**stack.cli_env(), "COLUMNS": columns})).stdout
        assert not BOX_DRAWING & set(shown), shown
        header, *rows = [line for line in shown.splitlines() if line.strip()]
        assert header.split() == ["TASK", "NAME", "STATUS", "PRI", "ATTEMPTS", "CREATED", "NOTE"], shown
        row = next(line for line in rows if line.startswith(task_id))
        assert row.split()[:3] == [task_id, LONG_NAME, "queued"], row
    ok(devsched("cancel", task_id))


# -- tmux: what a terminal 80 and 120 columns wide shows ----------------------------------------------------


@pytest.fixture
def tmux(tmp_path: Path) -> Iterator[str]:
    """A tmux server of this test's own (its own socket), killed afterwards."""
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed")
    socket = str(tmp_path / "tmux.sock")
    yield socket
    subprocess.run(["tmux", "-S", socket, "kill-server"], capture_output=True, timeout=10, check=False)


def in_tmux(socket: str, env: dict[str, str], args: list[str], columns: int, timeout: float = 60) -> list[str]:
    """`devsched ARGS...` in a tmux pane `columns` wide; the lines it showed (scrolled off too) once it ended."""
    name = f"w{columns}-{uuid.uuid4().hex[:6]}"
    done = f"__done_{uuid.uuid4().hex}__"
    command = f"{shlex.join([sys.executable, '-m', 'devsched.client', *args])}; echo {done}; sleep 600"
    settings = [f"-e{key}={value}" for key, value in env.items() if key not in ("COLUMNS", "LINES")]
    subprocess.run(
        ["tmux", "-S", socket, "new-session", "-d", "-s", name, "-x", str(columns), "-y", "60", *settings,
         "env", "-u", "COLUMNS", "-u", "LINES", "TERM=screen-256color", "sh", "-c", command],
        check=True, timeout=10, env={**env, "TERM": "xterm"},
    )  # fmt: skip
    deadline = time.monotonic() + timeout
    while True:
        shown = subprocess.run(
            ["tmux", "-S", socket, "capture-pane", "-p", "-S", "-", "-t", name],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout
        if done in shown.split():
            break
        assert time.monotonic() < deadline, f"devsched {' '.join(args)} did not end in tmux:\n{shown}"
        time.sleep(0.2)
    subprocess.run(["tmux", "-S", socket, "kill-session", "-t", name], capture_output=True, timeout=10, check=False)
    lines = shown.splitlines()
    return [line.rstrip() for line in lines[: lines.index(next(line for line in lines if done in line))]]


def _starts(task_id: str) -> list[str]:
    """The starts of an id that `ls` may show: its first 8 digits, or up to a further hyphen."""
    return [task_id[:n] for n in (8, 13, 18, 23)]


@pytest.mark.parametrize("columns", [80, 120])
def test_ls_in_a_terminal_never_cuts_an_id(
    devsched: Devsched, stack: Stack, tmp_path: Path, tmux: str, columns: int
) -> None:
    ids = [queued_task(devsched, tmp_path, name=LONG_NAME) for _ in range(2)]
    shown = in_tmux(tmux, stack.cli_env(), ["ls", "--limit", "20"], columns)
    assert all(len(line) <= columns for line in shown), shown
    assert any(line.split()[:1] == ["TASK"] for line in shown), shown
    listed = doc(devsched("ls", "--limit", "20", "--json"))["tasks"]
    starts = [line.split()[0] for line in shown if line.split()]
    for task in listed:  # each id whole on one line, or its start (8 digits or more) where the table is too wide
        whole = task["task_id"]
        rows = [line for line in shown if whole in line or any(line.startswith(f"{s} ") for s in _starts(whole))]
        assert len(rows) == 1, (task, shown)
        assert not any(line.endswith(whole[:n]) for line in shown for n in range(9, 36)), shown  # no cut id
    shown_ids = [s for s in starts if re.fullmatch(r"[0-9a-f]{8}(-[0-9a-f-]+)?", s)]
    assert len(shown_ids) == len(set(shown_ids)) == len(listed), shown  # no two alike (a twin shows more digits)

    wide = in_tmux(tmux, stack.cli_env(), ["ls", "--limit", "20", "--wide"], columns)
    assert all(len(line) <= columns for line in wide), wide
    for task in listed:
        assert sum(1 for line in wide if task["task_id"] in line) == 1, (task, wide)
    for task_id in ids:
        ok(devsched("cancel", task_id))
