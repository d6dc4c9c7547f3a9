"""The `devsched` CLI as a process against the real services: every command, `--json`, exit codes, errors."""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
import uuid
from pathlib import Path
from typing import Any

import nats
import pytest

from support.databases import create_test_database, drop_database, execute
from support.devsched_stack import Devsched, Stack, clean_env, run_devsched
from support.scheduler_harness import call
from support.servers import PostgresHandle

pytestmark = pytest.mark.e2e

NOOP_PLAN = "steps:\n  - name: hello\n    action: shell\n    args: {command: echo hello from $DEVSCHED_DEVICE_ID}\n"


def ok(result: subprocess.CompletedProcess[str], code: int = 0) -> subprocess.CompletedProcess[str]:
    assert result.returncode == code, f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    return result


def doc(result: subprocess.CompletedProcess[str]) -> Any:
    """The one JSON document a `--json` command printed."""
    return json.loads(ok(result).stdout)


def one_line_error(result: subprocess.CompletedProcess[str], code: int) -> str:
    """The command failed with `code` and said so on exactly one stderr line, without a traceback."""
    assert result.returncode == code, f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    assert "Traceback" not in result.stderr + result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    return lines[0]


def plan_file(tmp_path: Path, text: str, name: str = "plan.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def wait_until_running(devsched: Devsched, task_id: str, timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        view = doc(devsched("get", task_id, "--json"))
        if view["status"] == "dispatched" and view["attempts"] and view["attempts"][-1]["progress"]:
            return dict(view)
        assert time.monotonic() < deadline, f"task {task_id} not running: {view}"
        time.sleep(0.2)


def test_submit_watch_get_and_ls(devsched: Devsched, tmp_path: Path) -> None:
    path = plan_file(tmp_path, NOOP_PLAN)
    submitted = doc(devsched("submit", path, "--selector", "platform=sim", "--name", "cli-hello", "--priority", "3",
                             "--max-attempts", "2", "--lease-ttl", "20", "--json"))  # fmt: skip
    assert submitted["created"] is True
    task_id = submitted["task_id"]

    watched = ok(devsched("watch", task_id, "--json"))
    events = [json.loads(line) for line in watched.stdout.splitlines()]
    assert events[0]["event"] == "submitted"
    assert events[-1]["event"] == "done"
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))

    view = doc(devsched("get", task_id, "--json"))
    assert (view["status"], view["name"], view["priority"], view["max_attempts"], view["lease_ttl_s"]) == (
        "done", "cli-hello", 3, 2, 20,
    )  # fmt: skip
    assert view["selector"]["labels"] == {"platform": "sim"}
    assert "hello from" in view["result"]["steps"][0]["output_tail"]

    listed = doc(devsched("ls", "--status", "done", "--json"))
    assert task_id in [t["task_id"] for t in listed["tasks"]]
    assert all(t["status"] == "done" and "attempts" not in t for t in listed["tasks"])

    table = ok(devsched("ls")).stdout
    assert task_id in table
    assert "cli-hello" in table
    detail = ok(devsched("get", task_id)).stdout
    assert "done" in detail
    assert "hello" in detail


def test_ls_pages_with_limit_and_cursor(devsched: Devsched, tmp_path: Path) -> None:
    path = plan_file(tmp_path, "steps: [{name: a, action: noop}]\n")
    tag = uuid.uuid4().hex[:8]
    ids = [doc(devsched("submit", path, "--selector", f"platform={tag}", "--json"))["task_id"] for _ in range(3)]

    first = doc(devsched("ls", "--status", "queued", "--limit", "2", "--json"))
    assert len(first["tasks"]) == 2
    assert first["next"] is not None
    rest = doc(devsched("ls", "--status", "queued", "--after", first["next"], "--all", "--json"))
    listed = [t["task_id"] for t in first["tasks"] + rest["tasks"]]
    assert [i for i in listed if i in ids] == list(reversed(ids))
    assert rest["next"] is None
    for task_id in ids:
        ok(devsched("cancel", task_id))


def test_submit_wait_exit_codes(devsched: Devsched, tmp_path: Path) -> None:
    good = plan_file(tmp_path, NOOP_PLAN, "good.yaml")
    bad = plan_file(tmp_path, json.dumps({"steps": [{"name": "t", "action": "shell", "args": {"command": "exit 3"}}]}),
                    "bad.json")  # fmt: skip

    done = ok(devsched("submit", good, "-s", "platform=sim", "--wait"))
    assert "done" in done.stdout
    failed = ok(devsched("submit", bad, "-s", "platform=sim", "--wait"), code=1)
    assert "failed" in failed.stdout
    assert "exit code 3" in failed.stdout

    final = json.loads(ok(devsched("submit", good, "-s", "platform=sim", "--wait", "--json")).stdout)
    assert final["status"] == "done"
    assert final["attempts"][0]["status"] == "done"


def test_cancel_a_running_task_and_watch_it_end(devsched: Devsched, tmp_path: Path) -> None:
    path = plan_file(tmp_path, "steps:\n  - {name: soak, action: sleep, args: {seconds: 120}, interruptible: true}\n")
    task_id = doc(devsched("submit", path, "-s", "platform=sim", "--json"))["task_id"]
    wait_until_running(devsched, task_id)

    reply = doc(devsched("cancel", task_id, "--reason", "enough", "--json"))
    assert (reply["task_id"], reply["cancel_requested"]) == (task_id, True)

    watched = ok(devsched("watch", task_id, "--json"), code=3)  # 3: the task ended cancelled
    events = [json.loads(line) for line in watched.stdout.splitlines()]
    assert events[-1]["event"] == "cancelled"
    assert any(e["event"] == "cancel_requested" and e["reason"] == "enough" for e in events)
    human = ok(devsched("watch", task_id), code=3)
    assert "cancelled" in human.stdout

    again = ok(devsched("cancel", task_id))
    assert "cancelled" in again.stdout


def test_wait_timeout_leaves_the_task_and_exits_7(devsched: Devsched, tmp_path: Path) -> None:
    path = plan_file(tmp_path, "steps: [{name: a, action: noop}]\n")
    result = devsched("submit", path, "-s", "platform=nowhere", "--wait", "--wait-timeout", "1")
    line = one_line_error(result, 7)
    assert "still queued" in line
    task_id = line.split("task ")[1].split()[0]
    assert doc(devsched("cancel", task_id, "--json"))["status"] == "cancelled"


def test_hosts_and_drain(devsched: Devsched, stack: Stack) -> None:
    hosts = doc(devsched("hosts", "--json"))["hosts"]
    mine = next(h for h in hosts if h["host_id"] == stack.host_id)
    assert mine["online"] is True
    assert sorted(d["device_id"] for d in mine["devices"]) == sorted(stack.device_ids)
    assert stack.host_id in ok(devsched("hosts")).stdout

    device = stack.device_ids[-1]
    drained = doc(devsched("drain", device, "--reason", "flaky USB hub", "--json"))
    assert (drained["drained"], drained["state"], drained["drain_reason"]) == (True, "drained", "flaky USB hub")
    back = doc(devsched("drain", device, "--undo", "--json"))
    assert back["drained"] is False
    assert "back in service" in ok(devsched("drain", device, "--undo")).stdout


def _register_spare(stack: Stack, host_id: str, device_id: str) -> None:
    """Register another host with one device of its own (the stack's agent's devices stay untouched)."""

    async def register() -> None:
        nc = await nats.connect(stack.nats_url, inbox_prefix=f"_INBOX.{host_id}")
        try:
            body = {"devices": [{"device_id": device_id, "labels": {"pool": "ci", "os": "14"}}]}
            await call(nc, f"{stack.prefix}.host.{host_id}.register", body)
        finally:
            await nc.close()

    asyncio.run(register())


def test_devices_label_and_forget(devsched: Devsched, stack: Stack) -> None:
    host_id, device = f"cli-spare-{uuid.uuid4().hex[:6]}", f"spare-{uuid.uuid4().hex[:6]}"
    _register_spare(stack, host_id, device)
    pinned = doc(devsched("devices", "label", device, "pool=release", "rack=2", "--json"))
    assert pinned["labels"] == {"pool": "release", "os": "14", "rack": "2"}
    assert pinned["operator_labels"] == {"pool": "release", "rack": "2"}
    line = ok(devsched("devices", "label", device, "--unset", "pool")).stdout
    assert f"device {device} on {host_id}: labels os=14,pool=ci,rack=2 (pinned: rack)" in line
    mine = next(h for h in doc(devsched("hosts", "--json"))["hosts"] if h["host_id"] == host_id)
    assert mine["devices"][0]["operator_labels"] == {"rack": "2"}
    assert "os=14,pool=ci,rack=2 (pinned: rack)" in ok(devsched("hosts")).stdout
    assert one_line_error(devsched("devices", "label", device, "a=1", "--unset", "a"), 2).startswith(
        "error: invalid_request: unset: "
    )

    assert devsched("devices", "forget", device).returncode == 2, "a reason is required"
    freed = ok(devsched("devices", "forget", device, "--reason", "moved to bench-08")).stdout
    assert f"device {device} freed from host {host_id}" in freed
    assert "by operator-api (audit record " in freed
    assert freed.strip().endswith(": moved to bench-08")
    again = doc(devsched("devices", "forget", device, "--reason", "again", "--json"))
    assert (again["host_id"], again["reason"]) == (host_id, "moved to bench-08"), "the first act is answered"
    assert one_line_error(devsched("devices", "forget", "no-such-device", "--reason", "r"), 4).startswith(
        "error: not_found: "
    )


# -- errors: one line, the right exit code, never a traceback ---------------------------------------------


def test_a_plan_file_that_does_not_parse(devsched: Devsched, tmp_path: Path) -> None:
    line = one_line_error(devsched("submit", plan_file(tmp_path, "steps: [\n  - name: a\n")), 2)
    assert line.startswith("error: invalid_request: ")
    assert "not valid YAML" in line


def test_a_plan_that_fails_the_schema_names_the_field(devsched: Devsched, tmp_path: Path) -> None:
    path = plan_file(tmp_path, "steps:\n  - name: a\n    args: {command: hi}\n")
    assert one_line_error(devsched("submit", path), 2) == "error: invalid_request: plan.steps.0.action: Field required"
    line = one_line_error(devsched("submit", plan_file(tmp_path, NOOP_PLAN, "ok.yaml"), "--priority", "5000"), 2)
    assert line.startswith("error: invalid_request: priority: ")


def test_a_missing_plan_file(devsched: Devsched, tmp_path: Path) -> None:
    line = one_line_error(devsched("submit", str(tmp_path / "nope.yaml")), 2)
    assert "cannot read" in line


def test_not_found_and_malformed_ids(devsched: Devsched) -> None:
    missing = str(uuid.uuid4())
    assert one_line_error(devsched("get", missing), 4).startswith("error: not_found: ")
    assert one_line_error(devsched("cancel", missing), 4).startswith("error: not_found: ")
    assert one_line_error(devsched("watch", missing), 4).startswith("error: not_found: ")
    assert one_line_error(devsched("drain", "no-such-device"), 4).startswith("error: not_found: ")
    assert one_line_error(devsched("get", "xyz"), 2).startswith("error: invalid_request: task_id: ")


def test_the_servers_400_is_shown_with_its_path(devsched: Devsched) -> None:
    assert one_line_error(devsched("ls", "--after", "bogus"), 2).startswith("error: invalid_request: after: ")


def test_unreachable_nats_and_nobody_serving(devsched: Devsched, stack: Stack) -> None:
    line = one_line_error(devsched("--nats-url", "nats://127.0.0.1:1", "--timeout", "1", "hosts"), 5)
    assert line.startswith("error: nats_unreachable: ")
    line = one_line_error(devsched("--prefix", f"{stack.prefix}-nobody", "--timeout", "0.3", "hosts"), 5)
    assert line.startswith("error: no_reply: ")


def test_usage_errors_exit_2(devsched: Devsched) -> None:
    result = devsched("submit")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert devsched("ls", "--status", "sleeping").returncode == 2


def test_migrate_is_idempotent(postgres_server: PostgresHandle, database_template: str) -> None:
    name = f"cli_migrate_{uuid.uuid4().hex[:8]}"
    execute(postgres_server.dsn(), f'CREATE DATABASE "{name}"')
    try:
        for _ in range(2):
            result = ok(run_devsched("migrate", "--database-url", postgres_server.url(name)))
            assert "latest schema" in result.stdout
    finally:
        drop_database(postgres_server.dsn(), name)
    clone = create_test_database(postgres_server.dsn(), database_template)  # already migrated: nothing to do
    try:
        ok(run_devsched("migrate", env=clean_env(DEVSCHED_DATABASE_URL=postgres_server.url(clone))))
    finally:
        drop_database(postgres_server.dsn(), clone)


def test_migrate_an_unreachable_database() -> None:
    result = run_devsched("migrate", "--database-url", "postgresql+asyncpg://postgres@127.0.0.1:1/devsched")
    assert one_line_error(result, 5).startswith("error: unavailable: ")


def test_bench_is_the_end_to_end_benchmark_and_names_the_micro_benchmarks(tmp_path: Path) -> None:
    result = run_devsched("bench", "--help", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    assert "./dev test -m bench tests/bench" in text  # the pytest micro-benchmarks of a source checkout
    for option in ("--json", "--plot", "--quick", "--only", "--concurrency", "--tasks", "--profile"):
        assert option in text


def test_bench_refuses_an_unknown_phase_before_starting_anything(tmp_path: Path) -> None:
    result = run_devsched("bench", "--only", "lifecycle,warp", "--data-dir", str(tmp_path / "data"), cwd=tmp_path)
    assert result.returncode == 2
    assert "unknown phase(s) warp" in result.stderr
    assert not (tmp_path / "data").exists()


# -- tables at 80 columns and in a pipe: no column is dropped ---------------------------------------------

TASK_HEADERS = ("TASK", "NAME", "STATUS", "PRI", "ATTEMPTS", "CREATED", "NOTE")
HOST_HEADERS = ("HOST", "ONLINE", "LAST SEEN", "DEVICE", "STATE", "LABELS")
LONG_NAME = "a-rather-long-task-name-for-a-narrow-terminal"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")


def a_task_with_a_long_note(devsched: Devsched, tmp_path: Path) -> tuple[str, str]:
    """A task with a long name and a NOTE; its id and that note as `ls --json` has it.

    The note is the reason of a cancelled queued task (a queued one's note, its pending_reason, is checked by
    `test_cli_pending`); a long pending_reason is shown by `test_a_long_pending_reason_is_whole_at_80_columns`.
    """
    path = plan_file(tmp_path, NOOP_PLAN)
    selector = "board=a-board-that-no-device-in-this-lab-has-ever-had"
    task_id = doc(devsched("submit", path, "--name", LONG_NAME, "--selector", selector, "--json"))["task_id"]
    ok(devsched("cancel", task_id))
    tasks = doc(devsched("ls", "--json"))["tasks"]
    note = next(t for t in tasks if t["task_id"] == task_id)["reason"]
    assert note, tasks
    return task_id, str(note)


def in_a_terminal(env: dict[str, str], *args: str, columns: int = 80, timeout: float = 60) -> str:
    """`devsched ARGS...` with its stdout a terminal (a pty) `columns` wide; the text it showed, without colours."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    proc = subprocess.Popen(
        [sys.executable, "-m", "devsched.client", *args],
        env={**env, "COLUMNS": str(columns), "TERM": "xterm"}, stdin=subprocess.DEVNULL, stdout=slave,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if not ready:
                if proc.poll() is not None:
                    break
                continue
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            chunks.append(chunk)
        assert proc.wait(max(0.1, deadline - time.monotonic())) == 0, proc.stderr.read() if proc.stderr else ""
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr:
            proc.stderr.close()
    return ANSI.sub("", b"".join(chunks).decode()).replace("\r\n", "\n")


def column(text: str, header: str, headers: tuple[str, ...]) -> str:
    """What a table's column holds, its cells' lines joined without spaces (to compare with folded values)."""
    lines = text.splitlines()
    top = next(i for i, line in enumerate(lines) if all(h in line for h in headers))
    start = lines[top].index(header)
    later = [h for h in headers if lines[top].index(h) > start]
    end = min((lines[top].index(h) for h in later), default=None)
    return "".join(line[start:end] for line in lines[top + 1 :]).replace(" ", "")


def test_ls_and_hosts_fit_80_columns(devsched: Devsched, stack: Stack, tmp_path: Path) -> None:
    task_id, note = a_task_with_a_long_note(devsched, tmp_path)
    shown = in_a_terminal(stack.cli_env(), "ls")
    assert all(len(line) <= 80 for line in shown.splitlines()), shown
    assert all(h in shown for h in TASK_HEADERS), shown
    assert any(line.startswith(task_id[:8] + " ") for line in shown.splitlines()), shown  # its short id, whole
    assert LONG_NAME in column(shown, "NAME", TASK_HEADERS), shown
    assert note.replace(" ", "") in column(shown, "NOTE", TASK_HEADERS), shown

    shown = in_a_terminal(stack.cli_env(), "hosts")
    assert all(len(line) <= 80 for line in shown.splitlines()), shown
    assert all(h in shown for h in HOST_HEADERS), shown
    assert stack.host_id in column(shown, "HOST", HOST_HEADERS), shown
    assert all(d in column(shown, "DEVICE", HOST_HEADERS) for d in stack.device_ids), shown


def test_ls_and_hosts_in_a_pipe_keep_every_column_whole(devsched: Devsched, stack: Stack, tmp_path: Path) -> None:
    task_id, note = a_task_with_a_long_note(devsched, tmp_path)
    at_80 = stack.cli_env()
    at_80["COLUMNS"] = "80"
    unset = {k: v for k, v in stack.cli_env().items() if k != "COLUMNS"}  # rich's own default for a pipe: 80
    for env in (at_80, unset):
        lines = ok(run_devsched("ls", env=env)).stdout.splitlines()
        assert any(all(h in line for h in TASK_HEADERS) for line in lines), lines
        row = next(line for line in lines if task_id in line)  # one line per task, every value whole
        assert all(part in row for part in (LONG_NAME, note, "cancelled")), row
        assert "\x1b[" not in "".join(lines)

        lines = ok(run_devsched("hosts", env=env)).stdout.splitlines()
        assert any(all(h in line for h in HOST_HEADERS) for line in lines), lines
        assert any(stack.host_id in line for line in lines), lines
        assert all(any(d in line for line in lines) for d in stack.device_ids), lines


def test_a_long_pending_reason_is_whole_at_80_columns() -> None:
    """The `ls` table printed by the CLI's own printer, to an 80-column terminal and to a pipe."""
    from io import StringIO

    from rich.console import Console

    from devsched.client.cli.render import print_table, tasks_table
    from devsched.protocol.messages import TaskSummary

    reason = "no_online_device: 3 devices match board=rpi4,usb=hub-7 but their hosts are offline (last seen 4m ago)"
    task = TaskSummary.model_validate_json(json.dumps(
        {"task_id": str(uuid.uuid4()), "name": LONG_NAME, "status": "queued", "priority": 100, "max_attempts": 3,
         "attempt_count": 0, "cancel_requested": False, "selector": {"labels": {"board": "rpi4"}},
         "plan": {"steps": [{"name": "a", "action": "shell", "args": {"command": "true"}}]},
         "created_at": "2026-01-01T00:00:00Z", "updated_at": "2026-01-01T00:00:00Z", "pending_reason": reason}
    ))  # fmt: skip
    for terminal in (True, False):
        buffer = StringIO()
        console = Console(file=buffer, width=80, force_terminal=terminal, color_system=None, highlight=False)
        print_table(console, lambda compact: tasks_table([task], compact=compact, short_ids=compact))
        shown = buffer.getvalue()
        assert all(h in shown for h in TASK_HEADERS), shown
        if terminal:
            assert all(len(line) <= 80 for line in shown.splitlines()), shown
            assert str(task.task_id)[:8] in column(shown, "TASK", TASK_HEADERS), shown
            assert LONG_NAME in column(shown, "NAME", TASK_HEADERS), shown
            assert reason.replace(" ", "") in column(shown, "NOTE", TASK_HEADERS), shown
        else:
            row = next(line for line in shown.splitlines() if str(task.task_id) in line)
            assert all(part in row for part in (LONG_NAME, reason, "100")), shown


# -- what a new user meets: the version, shell completion, the agent's help -------------------------------


def test_version_prints_the_client_package_version() -> None:
    from importlib.metadata import version

    result = ok(run_devsched("--version"))
    assert result.stdout == f"devsched {version('devsched-client')}\n"
    assert ok(run_devsched("--version", "ls")).stdout == result.stdout  # eager: no command runs, nothing connects


def test_bash_completion_script_and_completions() -> None:
    script = ok(run_devsched("--show-completion", "bash")).stdout
    assert "_DEVSCHED_COMPLETE=complete_bash" in script
    assert "complete -o default -F _devsched_completion devsched" in script

    def complete(words: str, cword: int) -> list[str]:
        env = clean_env(_DEVSCHED_COMPLETE="complete_bash", COMP_WORDS=words, COMP_CWORD=str(cword))
        return ok(run_devsched(env=env)).stdout.split()

    assert complete("devsched l", 1) == ["ls", "logs"]
    assert complete("devsched ls --st", 2) == ["--status"]
    assert "--install-completion" in ok(run_devsched("--help")).stdout


def test_install_completion_for_bash_writes_only_below_home(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    ok(run_devsched("--install-completion", "bash", env=clean_env(HOME=str(home))))
    script = home / ".bash_completions" / "devsched.sh"
    assert "complete -o default -F _devsched_completion devsched" in script.read_text()
    assert f"source '{script}'" in (home / ".bashrc").read_text()


def test_agent_help_points_at_the_readme() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "devsched.agent.main", "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())
    assert "ARCHITECTURE.md" not in text
    assert "README.md, section Configuration" in text
    readme = (Path(__file__).resolve().parents[3] / "README.md").read_text()
    assert "## Configuration" in readme
    assert "The agent reads a TOML file" in readme.split("## Configuration", 1)[1]
