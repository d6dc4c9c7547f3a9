"""Hostile text from a host or a submitter cannot break or take over an operator's `devsched` terminal.

Against the real services as processes (scheduler, sweeper, an honest agent): a host registers a device whose
label is Rich markup and terminal control sequences, and reports a task (named the same way by its
submitter) failed with such a reason and output; a step of the honest agent prints escape sequences. Then
`devsched hosts`, `ls`, `get` and `logs` run as processes, into a pipe and into a terminal (a pty): they exit
0, show the text as written (markup literal, controls as visible escapes such as `\\x1b`), no control byte
of the data reaches the terminal, and the honest host and its task are shown as before.
"""

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

from support.devsched_stack import Stack
from support.scheduler_harness import TestHost, submit

pytestmark = [pytest.mark.security, pytest.mark.e2e]

#: Markup that fails rich (`[/x]`), hides a link, restyles; an emoji code; a screen clear, a carriage return,
#: a bell, a right-to-left override, a one-character CSI (U+009B), a backspace.
HOSTILE = "[/x] [link=http://evil]y[/link] [bold red]loud :warning: \x1b[2J\r\x07\u202e\x9b\x08end"
#: How an operator must see it.
SHOWN = r"[/x] [link=http://evil]y[/link] [bold red]loud :warning: \x1b[2J\r\x07\u202e\x9b\x08end"
#: What the data must never put on the terminal (rich's own colours aside: `terminal_text` strips those).
RAW = ("\x1b", "\r", "\x07", "\u202e", "\x9b", "\x08", "⚠")
#: Rich's colour sequences (SGR), the only escapes the CLI itself writes.
SGR = re.compile(r"\x1b\[[0-9;]*m")
#: What the honest agent's step prints: a screen clear, a window title, a CR overwrite, a bidi override.
NOISY_OUTPUT = b"\x1b[2J\x1b]0;pwned\x07\rfake prompt \xe2\x80\xaeevil\n"


def piped(stack: Stack, *args: str, code: int | None = 0) -> subprocess.CompletedProcess[bytes]:
    """`devsched ARGS...` into a pipe, its output as bytes (text mode would turn a stray CR into a newline)."""
    result = subprocess.run(
        [sys.executable, "-m", "devsched.client", *args],
        env=stack.cli_env(), stdin=subprocess.DEVNULL, capture_output=True, timeout=60, check=False,
    )  # fmt: skip
    if code is not None:
        assert result.returncode == code, f"exit {result.returncode}\n{result.stdout!r}\n{result.stderr!r}"
    return result


def ok(stack: Stack, *args: str) -> str:
    """What `devsched ARGS...` printed into a pipe; it must exit 0."""
    return piped(stack, *args).stdout.decode()


def assert_literal(text: str, times: int = 1) -> None:
    assert text.count(SHOWN) >= times, text
    assert not [c for c in RAW if c in text], text


def in_a_terminal(stack: Stack, *args: str, columns: int = 400, timeout: float = 60) -> bytes:
    """`devsched ARGS...` with stdout a terminal (a pty); the bytes it wrote there. It must exit 0."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    env = {**stack.cli_env(), "COLUMNS": str(columns), "TERM": "xterm"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "devsched.client", *args],
        env=env, stdin=subprocess.DEVNULL, stdout=slave, stderr=subprocess.PIPE,
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
        code = proc.wait(max(0.1, deadline - time.monotonic()))
        assert code == 0, (code, proc.stderr.read() if proc.stderr else b"")
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stderr:
            proc.stderr.close()
    return b"".join(chunks)


def terminal_text(data: bytes) -> str:
    """What a terminal was sent, without rich's colour sequences and the pty's CR before each newline."""
    return SGR.sub("", data.decode()).replace("\r\n", "\n")


async def hostile_host_and_task(stack: Stack) -> tuple[str, str]:
    """A host with a hostile label that runs a hostile-named task and reports it failed with hostile text."""
    tag = f"hostile-{uuid.uuid4().hex[:8]}"
    nc = await nats.connect(stack.nats_url, connect_timeout=2)
    host = TestHost(nc, stack.prefix, host_id=tag)
    try:
        await host.register((f"{tag}-d1", {"platform": tag, "note": HOSTILE}))
        plan = {"steps": [{"name": HOSTILE, "action": "noop", "args": {}}]}
        task_id = await submit(nc, stack.prefix, name=HOSTILE, selector={"labels": {"platform": tag}}, plan=plan)
        assigned = await host.next_assignment(timeout=30)
        assert assigned.task_id == task_id
        await host.claim(assigned)
        await host.renew(assigned, progress={"step": HOSTILE, "index": 0, "of": 1})
        result = {"steps": [{"name": HOSTILE, "status": "failed", "exit_code": 1, "output_tail": HOSTILE}]}
        await host.report(assigned, "failed", reason=HOSTILE, result=result)
    finally:
        await host.close()
        await nc.close()
    return tag, task_id


@pytest.fixture(scope="module")
def hostile(stack: Stack) -> tuple[str, str]:
    """(the hostile host's id, its task's id), once per module."""
    return asyncio.run(hostile_host_and_task(stack))


def test_hosts_ls_get_show_hostile_text_literally(stack: Stack, hostile: tuple[str, str]) -> None:
    host_id, task_id = hostile
    hosts = ok(stack, "hosts")  # into a pipe: the full table, through a console of its own
    assert_literal(hosts)
    assert host_id in hosts
    assert stack.host_id in hosts  # the honest host, as before
    assert all(d in hosts for d in stack.device_ids)

    hosts = terminal_text(in_a_terminal(stack, "hosts"))
    assert_literal(hosts)
    assert stack.host_id in hosts

    listed = terminal_text(in_a_terminal(stack, "ls", "--all"))
    assert_literal(listed, times=2)  # its name and its reason
    assert task_id in listed

    detail = terminal_text(in_a_terminal(stack, "get", task_id))
    assert_literal(detail, times=4)  # name, reason, step, output tail (and more)


def test_errors_name_hostile_values_literally(stack: Stack) -> None:
    result = piped(stack, "health", "rm", HOSTILE, code=None)
    said = (result.stdout + result.stderr).decode()
    assert result.returncode != 0
    assert "Traceback" not in said
    assert len(said.strip().split("\n")) == 1, said
    assert said.startswith("error: ")
    assert not [c for c in RAW if c in said], said


def noisy_task(stack: Stack, tmp_path: Path) -> str:
    command = "printf '" + "".join(f"\\{b:03o}" for b in NOISY_OUTPUT) + "'"
    plan = tmp_path / "noisy.json"
    plan.write_text(json.dumps({"steps": [{"name": "noisy", "action": "shell", "args": {"command": command}}]}))
    submitted = json.loads(ok(stack, "submit", str(plan), "-s", "platform=sim", "--wait", "--json"))
    assert submitted["status"] == "done", submitted
    return str(submitted["task_id"])


def test_logs_shows_step_output_visibly_on_a_terminal(stack: Stack, tmp_path: Path) -> None:
    task_id = noisy_task(stack, tmp_path)

    shown = terminal_text(in_a_terminal(stack, "logs", task_id))
    assert r"\x1b[2J\x1b]0;pwned\x07\rfake prompt \u202eevil" in shown, shown
    assert not [c for c in RAW if c in shown], shown

    assert piped(stack, "logs", task_id).stdout == NOISY_OUTPUT  # a pipe gets the bytes unchanged

    raw = in_a_terminal(stack, "logs", "--raw", task_id)  # asked for: the bytes reach the terminal
    assert NOISY_OUTPUT.replace(b"\n", b"\r\n") in raw


def strings(value: Any) -> list[str]:
    """Every string in a JSON document, keys too."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (k, *strings(v))]
    if isinstance(value, list):
        return [s for v in value for s in strings(v)]
    return []


def test_json_output_escapes_every_control(stack: Stack, hostile: tuple[str, str]) -> None:
    _, task_id = hostile
    for args in (("hosts", "--json"), ("get", task_id, "--json")):
        out = ok(stack, *args)
        assert not [c for c in RAW if c in out], out
        assert HOSTILE in strings(json.loads(out))  # the value itself, once decoded
