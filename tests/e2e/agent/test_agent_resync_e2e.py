"""The real agent across a restart: a copy of an assignment it took before the restart is dropped after it.

The scheduler's resync publishes an unclaimed attempt's assignment again, and JetStream redelivers what was not
acked; a repeated claim of the same lease succeeds, so the agent's memory of the attempts it took, kept in its
spool (`taken/`), is what keeps such a copy from running.
"""

from __future__ import annotations

import pytest
from nats.aio.msg import Msg

from support.agent_e2e import AgentLab, noop
from support.polling import eventually

pytestmark = pytest.mark.e2e


async def test_a_copy_of_an_assignment_taken_before_a_restart_is_dropped_after_it(lab: AgentLab) -> None:
    agent = await lab.agent("d1").ready()
    subject = f"{lab.prefix}.assign.{agent.host_id}"
    published: list[Msg] = []

    async def seen(msg: Msg) -> None:
        published.append(msg)

    sub = await lab.nc.subscribe(subject, cb=seen)  # a plain subscriber sees each publication too
    try:
        task_id = await lab.submit([noop("only")])
        await lab.wait_status(task_id, "done")
        (first,) = await eventually(lambda: published, message="the assignment as published")
    finally:
        await sub.unsubscribe()
    assert (agent.spool_dir / "taken" / f"{task_id}.1.json").exists()

    assert await agent.terminate() == 0
    restarted = await agent.start().ready()
    remembered = await restarted.wait_line("remembering the attempts taken before this start")
    assert remembered["attempts"] >= 1

    # The same assignment again, under another message id (as the resync publishes it): not stored as a duplicate.
    headers = {**(first.headers or {}), "Nats-Msg-Id": f"{task_id}.1.resync.1"}
    ack = await lab.nc.jetstream().publish(subject, first.data, headers=headers)
    assert not ack.duplicate
    dropped = await restarted.wait_line("duplicate assignment delivery dropped", task_id=task_id, timeout=20)
    assert dropped["attempt"] == 1
    current = restarted.process
    assert [line for line in current.log_lines() if line.get("task_id") == task_id] == [dropped], (
        "the restarted agent neither claimed nor ran the copy"
    )
    view = await lab.task(task_id)
    assert (view["status"], view["attempt_count"]) == ("done", 1)
