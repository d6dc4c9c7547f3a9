"""Step output, streamed live by the real agent and read with the real `devsched logs` and `watch --logs`.

The agent, scheduler and sweeper are processes; the CLI runs as a process whose stdout and stderr go to
files, so its bytes are compared exactly.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from typing import Any

import pytest

from devsched.client import Client, collect_output
from devsched.embedded.supervisor import popen
from support.agent_e2e import AgentLab, shell
from support.polling import eventually

pytestmark = pytest.mark.e2e

TTL_S = 3
MiB = 1024 * 1024


class Cli:
    """`devsched ARGS...` aimed at the lab's control plane, as a process writing to files (bytes kept)."""

    def __init__(self, lab: AgentLab, name: str, *args: str) -> None:
        self.out_path, self.err_path = lab.path(f"{name}.out"), lab.path(f"{name}.err")
        env = {k: v for k, v in os.environ.items() if not k.startswith("DEVSCHED_")}
        env.update(DEVSCHED_NATS_URL=lab.plane.nats_url, DEVSCHED_SUBJECT_PREFIX=lab.prefix, COLUMNS="200")
        with self.out_path.open("wb") as out, self.err_path.open("wb") as err:
            self.process = popen(
                [sys.executable, "-m", "devsched.client", *args], env=env, stdout=out, stderr=err,
                stdin=subprocess.DEVNULL,
            )  # fmt: skip

    @property
    def stdout(self) -> bytes:
        return self.out_path.read_bytes()

    @property
    def stderr(self) -> str:
        return self.err_path.read_text()

    async def wait(self, timeout: float = 60.0) -> int:  # noqa: ASYNC109
        try:
            return await asyncio.to_thread(self.process.wait, timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(f"devsched still ran after {timeout} s; stderr:\n{self.stderr}") from None

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()


@pytest.fixture
async def client(lab: AgentLab) -> AsyncIterator[Client]:
    async with Client.connect(lab.plane.nats_url, prefix=lab.prefix) as c:
        yield c


async def run_cli(lab: AgentLab, name: str, *args: str, timeout: float = 60.0) -> Cli:  # noqa: ASYNC109
    cli = Cli(lab, name, *args)
    code = await cli.wait(timeout)
    assert code == 0, cli.stderr
    return cli


def assert_same(got: bytes, expected: bytes, what: str) -> None:
    """`got == expected`, failing with where they part (not a diff of megabytes of random bytes)."""
    if got == expected:
        return
    at = next((i for i, (a, b) in enumerate(zip(got, expected, strict=False)) if a != b), min(len(got), len(expected)))
    raise AssertionError(f"{what}: {len(got)} bytes, expected {len(expected)}; they differ from offset {at}")


def records(cli: Cli) -> list[dict[str, Any]]:
    return [json.loads(line) for line in cli.stdout.splitlines()]


async def test_a_step_that_prints_10_mib_is_retrieved_byte_for_byte(lab: AgentLab, client: Client) -> None:
    # The whole output fits the agent's buffer: this is about retrieval. With the default 8 MiB a machine
    # whose stream stores slower than the step prints drops the excess, by design (counted, `dropped`).
    await lab.agent("d1", log_buffer_bytes=32 * MiB).ready()
    printed = lab.path("printed")
    task_id = await lab.submit(
        [shell("print", f"head -c {10 * MiB} /dev/urandom | tee '{printed}'"), shell("bye", "echo bye >&2")],
        lease_ttl_s=TTL_S,
    )
    view = await lab.wait_status(task_id, "done", within=60)
    expected = printed.read_bytes() + b"bye\n"
    assert len(expected) == 10 * MiB + 4

    cli = await run_cli(lab, "logs", "logs", task_id)
    assert_same(cli.stdout, expected, "devsched logs prints the steps' bytes exactly")
    assert cli.stderr == ""
    assert_same(await collect_output(client.logs(task_id)), expected, "and the Python client reads them too")
    only = await run_cli(lab, "stdout", "logs", task_id, "--stream", "stdout")
    assert_same(only.stdout, printed.read_bytes(), "--stream stdout")
    step = await run_cli(lab, "step", "logs", task_id, "--step", "bye", "--attempt", "1")
    assert step.stdout == b"bye\n"
    # the report keeps its tail: the summary
    assert view["result"]["steps"][1]["output_tail"] == "bye\n"


async def test_follow_shows_lines_while_the_step_still_runs(lab: AgentLab) -> None:
    await lab.agent("d1").ready()
    gate = lab.gate("more")
    task_id = await lab.submit(
        [shell("talk", f"echo first line; {gate.wait}; echo second line >&2"), shell("last", "printf 'no newline'")],
        lease_ttl_s=TTL_S,
    )
    cli = Cli(lab, "follow", "logs", "--follow", task_id)
    watch = Cli(lab, "watch", "watch", "--logs", task_id)
    try:
        await eventually(lambda: cli.stdout == b"first line\n", timeout=20, message="the first line, live")
        assert cli.process.poll() is None, "it goes on while the step runs"
        assert (await lab.task(task_id))["status"] == "dispatched"
        await eventually(lambda: b"first line" in watch.stdout, timeout=20, message="watch --logs shows it too")
        gate.open()
        assert await cli.wait(30) == 0, cli.stderr
        assert cli.stdout == b"first line\nsecond line\nno newline"
        assert await watch.wait(30) == 0, watch.stderr
    finally:
        cli.stop()
        watch.stop()
    shown = watch.stdout.decode()
    assert "│ talk │ first line" in shown
    assert "│ talk │ second line" in shown
    assert "│ last │ no newline" in shown, "a partial line shows at its step's end"
    assert shown.index("first line") < shown.index("done"), "output among the events"


async def test_an_agent_killed_mid_step_keeps_what_it_had_sent(lab: AgentLab, client: Client) -> None:
    agent = await lab.agent("d1").ready()
    task_id = await lab.submit(
        [shell("long", "echo before the kill; echo on stderr too >&2; sleep 600")], lease_ttl_s=TTL_S, max_attempts=1
    )

    async def sent() -> bool:
        return await collect_output(client.logs(task_id)) == b"before the kill\non stderr too\n"

    await eventually(sent, timeout=20, message="the output stored while the step runs")
    following = Cli(lab, "follow", "logs", "-f", "--attempt", "1", task_id)
    try:
        await eventually(lambda: following.stdout.endswith(b"too\n"), timeout=20, message="follow caught up")
        agent.process.kill()
        await lab.wait_status(task_id, "failed", within=30)  # its lease expired at the attempt limit
        assert await following.wait(30) == 0, "a follow ends once the attempt is over, without an end record"
    finally:
        following.stop()
    assert following.stdout == b"before the kill\non stderr too\n"
    kept = await run_cli(lab, "kept", "logs", "--json", task_id)
    kinds = [r["kind"] for r in records(kept)]
    assert kinds == ["output", "output"], "no end record: the agent died"
    assert [r["stream"] for r in records(kept)] == ["stdout", "stderr"]


async def test_a_step_over_the_cap_is_truncated_with_the_marker_and_the_task_ends_by_its_own_outcome(
    lab: AgentLab,
) -> None:
    await lab.agent("d1", log_max_bytes=100_000).ready()
    task_id = await lab.submit(
        [shell("flood", "head -c 1000000 /dev/zero | tr '\\0' z; echo done >&2"), shell("after", "echo after")],
        lease_ttl_s=TTL_S,
    )
    view = await lab.wait_status(task_id, "done", within=60)
    assert view["reason"] is None
    cli = await run_cli(lab, "logs", "logs", task_id)
    assert cli.stdout == b"z" * 100_000, "the first 100 000 bytes, then nothing of this attempt"
    assert "devsched: attempt 1: output cut at the attempt's cap of 100000 bytes" in cli.stderr
    assert "devsched: attempt 1: 900011 bytes of output past the cap not stored" in cli.stderr
    listed = records(await run_cli(lab, "json", "logs", "--json", task_id))
    kinds = [r["kind"] for r in listed]
    assert kinds[-4:] == ["truncated", "step_end", "step_end", "end"]
    truncated, end = listed[-4], listed[-1]
    assert (truncated["offset"], truncated["cap_bytes"], truncated["step"]) == (100_000, 100_000, "flood")
    assert (end["outcome"], end["sent_bytes"], end["output_bytes"]) == ("done", 100_000, 1_000_000 + 5 + 6)
    assert [(r["step"], r["status"]) for r in listed if r["kind"] == "step_end"] == [
        ("flood", "done"),
        ("after", "done"),
    ]


async def test_logs_of_a_task_without_an_attempt_say_so(lab: AgentLab) -> None:
    task_id = await lab.submit([shell("s", "echo never")], lease_ttl_s=TTL_S)  # no agent: it stays queued
    cli = await run_cli(lab, "none", "logs", task_id)
    assert cli.stdout == b""
    assert "has no attempt yet" in cli.stderr
    missing = Cli(lab, "missing", "logs", "--attempt", "2", task_id)
    assert await missing.wait() == 4, missing.stderr  # not found
