"""No orphans, with the real agent: a SIGKILLed agent's step dies at once, what the step started dies at
the agent's next start, and the next start names the attempt the killed agent held.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from devsched.agent.procfs import read_stat
from support.agent_e2e import AgentLab, shell
from support.polling import eventually

pytestmark = [pytest.mark.e2e, pytest.mark.chaos]


class Proc:
    """A process named by its pid and start time, so a reused pid is never taken for it."""

    def __init__(self, pid: int) -> None:
        stat = read_stat(pid)
        assert stat is not None, f"process {pid} is gone already"
        self.pid, self.start_time, self.pgid = pid, stat.start_time, stat.pgid

    def running(self) -> bool:
        stat = read_stat(self.pid)
        return stat is not None and stat.alive and stat.start_time == self.start_time

    def kill(self) -> None:
        if self.running():
            os.kill(self.pid, signal.SIGKILL)


def pid_in(path: Path) -> int | None:
    """The pid a step wrote to `path`, once it is there in full."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    return int(text) if text.endswith("\n") else None


async def test_step_processes_do_not_outlive_a_killed_agent(lab: AgentLab) -> None:
    agent = await lab.agent("d1").ready()
    leader_file, child_file = lab.path("leader.pid"), lab.path("child.pid")
    # A step with a child of its own: the parent-death signal reaches the step's shell, not its child.
    command = f"sleep 300 & echo $! > {child_file}; echo $$ > {leader_file}; wait"
    task_id = await lab.submit([shell("hold", command)], lease_ttl_s=30, max_attempts=1)
    leader_pid = await eventually(lambda: pid_in(leader_file), timeout=20, message="step started")
    child_pid = await eventually(lambda: pid_in(child_file), timeout=20, message="step's child started")
    leader, child = Proc(leader_pid), Proc(child_pid)
    try:
        assert child.pgid == leader.pid == leader.pgid  # one group, led by the step's shell
        [attempt] = (await lab.task(task_id))["attempts"]

        agent.process.kill()
        await eventually(lambda: not leader.running(), timeout=5, message="the step's shell died with the agent")
        assert child.running()  # out of the parent-death signal's reach
        # What the killed agent left in its spool: its step's group and its attempt, recorded before they ran.
        [group_record] = [json.loads(p.read_bytes()) for p in (agent.spool_dir / "groups").glob("*.json")]
        assert (group_record["pgid"], group_record["start_time"]) == (leader.pid, leader.start_time)
        assert (group_record["task_id"], group_record["attempt"]) == (task_id, 1)
        [held_record] = [json.loads(p.read_bytes()) for p in (agent.spool_dir / "held").glob("*.json")]
        assert held_record == {
            "task_id": task_id,
            "attempt": 1,
            "lease_id": attempt["lease_id"],
            "device_id": lab.device("d1"),
        }

        agent.start()
        swept = await agent.wait_line("killed step processes left by an earlier agent", task_id=task_id)
        assert (swept["attempt"], swept["pgid"], swept["lease_id"]) == (1, leader.pid, attempt["lease_id"])
        await eventually(lambda: not child.running(), timeout=10, message="the step's child killed at start")
        left = await agent.wait_line("attempt held by an earlier agent", task_id=task_id)
        assert (left["attempt"], left["lease_id"], left["device_id"]) == (1, attempt["lease_id"], lab.device("d1"))
        await agent.ready()
        assert not (agent.spool_dir / "groups" / f"{leader.pid}.{leader.start_time}.json").exists()
        # attempt 1's record is gone (it was released at the start); the task may be running attempt 2 by now
        assert not (agent.spool_dir / "held" / f"{task_id}.1.json").exists()
    finally:
        child.kill()
        leader.kill()
