"""Nothing lost through rollouts, restarts and faults (issue 11), with the real agent, scheduler and sweeper.

An agent that stops (SIGTERM), is drained (SIGUSR1, `devsched drain --host`) or was killed gives its
attempts back (`P.host.<host_id>.release`) instead of failing them: the task is queued again at once, the
device free at once, and no attempt is spent, so tasks with `max_attempts` 1 survive a rolling restart.
"""

from __future__ import annotations

import json
import signal
import uuid
from typing import Any

import pytest

from support.agent_e2e import AgentLab, AgentProcess, at, noop, shell, touch
from support.polling import eventually
from support.scheduler_harness import ErrorReply, request_with_reply

pytestmark = pytest.mark.e2e

TERMINAL = ("done", "failed", "cancelled")


def multi_step(lab: AgentLab, name: str, *, steps: int = 4, seconds: float = 0.6) -> list[dict[str, Any]]:
    """Interruptible steps of `seconds` each, then a teardown step that leaves a marker per attempt."""
    marker = lab.path(f"teardown-{name}")
    work = [shell(f"step-{i}", f"sleep {seconds}", interruptible=True) for i in range(steps)]
    return [*work, shell("teardown", f"echo $DEVSCHED_ATTEMPT >> '{marker}'", always=True)]


def attempts_without_gaps(view: dict[str, Any]) -> None:
    """Attempts 1, 2, 3, ...; every one but the last released; the count as the view says."""
    numbers = [a["attempt"] for a in view["attempts"]]
    assert numbers == list(range(1, len(numbers) + 1)), numbers
    assert view["attempt_count"] == len(numbers)
    assert all(a["status"] == "released" and a["end_reason"] == "released" for a in view["attempts"][:-1]), view
    assert view["releases"] == len(numbers) - 1


async def running_on(lab: AgentLab, agent: AgentProcess, tasks: list[str]) -> None:
    """Wait until a device of `agent` runs (has claimed) an attempt of one of `tasks`, in its first steps.

    A reserved device is not enough: a report hands its device to the next task in its own transaction,
    and an agent stopped before that assignment reached it has nothing to give back; nor is an attempt in
    its last steps, which may end within the agent's shutdown grace.
    """
    names = {d["device_id"] for d in agent.devices}

    def early(view: dict[str, Any]) -> bool:
        attempt = view["attempts"][-1] if view["attempts"] else None
        if view["status"] != "dispatched" or attempt is None or attempt["device_id"] not in names:
            return False
        progress = attempt["progress"]
        return progress is None or int(progress["index"]) <= 2

    async def busy() -> bool:
        for task_id in tasks:
            if early(await lab.task(task_id)):
                return True
        return False

    await eventually(busy, timeout=60, message=f"an attempt runs on {agent.host_id}")


async def host_release(lab: AgentLab, host_id: str, body: dict[str, Any]) -> dict[str, Any]:
    """A release sent in `host_id`'s name from its own inbox, as its agent would; errors raise `ErrorReply`."""
    subject = f"{lab.prefix}.host.{host_id}.release"
    msg = await request_with_reply(
        lab.nc, subject, json.dumps(body).encode(), f"_INBOX.{host_id}.{uuid.uuid4().hex}", timeout=10
    )
    data = json.loads(msg.data)
    if msg.headers and "Nats-Service-Error-Code" in msg.headers:
        raise ErrorReply(int(msg.headers["Nats-Service-Error-Code"]), data, msg.headers)
    assert isinstance(data, dict)
    return data


async def test_a_rolling_restart_of_every_agent_ends_every_task_done(lab: AgentLab) -> None:
    agents = [lab.agent(f"d{i}") for i in range(3)]
    for agent in agents:
        await agent.ready()
    # enough work that every agent runs an attempt when its turn comes
    plan = multi_step(lab, "t", steps=5, seconds=0.8)
    tasks = [await lab.submit(plan, max_attempts=1, lease_ttl_s=10) for _ in range(15)]
    for agent in agents:  # one at a time, as a DaemonSet rollout does, each while it runs an attempt
        await running_on(lab, agent, tasks)
        assert await agent.terminate() == 0
        await agent.start().ready()
    views = [await lab.wait_status(t, *TERMINAL, within=180) for t in tasks]
    assert [v["status"] for v in views] == ["done"] * len(tasks), [(v["status"], v["reason"]) for v in views]
    for view in views:
        assert view["max_attempts"] == 1
        attempts_without_gaps(view)
    released = [a for v in views for a in v["attempts"] if a["status"] == "released"]
    assert len(released) >= len(agents), "every restart gave back the attempt it ran"
    for attempt in released:
        assert attempt["report_reason"].startswith("shutdown"), attempt
        # stopped at a step boundary after the grace: the steps so far, then teardown (the lease was held)
        statuses = [s["status"] for s in attempt["result"]["steps"]]
        assert statuses[-1] == "done", statuses
        assert "interrupted" in statuses or "skipped" in statuses
    for agent in agents:
        assert agent.lines("release recorded"), f"{agent.host_id} released what it ran"
        assert not agent.spooled()


async def test_a_release_with_a_cancellation_pending_ends_cancelled(lab: AgentLab) -> None:
    agent = await lab.agent("d1", stop_grace_s=5.0).ready()
    gate = lab.gate("flash")
    plan = [
        shell("flash", f"touch '{lab.path('flashing')}'; {gate.wait}"),  # not interruptible
        noop("test"),
        shell("teardown", touch(lab.path("teardown")), always=True),
    ]
    task_id = await lab.submit(plan, max_attempts=1)
    await eventually(lab.path("flashing").exists, timeout=30, message="flash started")
    agent.process.signal(signal.SIGTERM)
    await agent.wait_line("shutdown grace over: stopping attempts at their next step boundary", timeout=20)
    assert (await lab.cancel(task_id))["cancel_requested"] is True
    gate.open()
    assert await agent.process.wait_exit(30) == 0
    view = await lab.wait_status(task_id, *TERMINAL)
    assert (view["status"], view["reason"], view["releases"]) == ("cancelled", "cancelled_after_release", 1)
    (attempt,) = view["attempts"]
    assert (attempt["status"], attempt["cancel_requested"]) == ("released", True)
    assert [s["status"] for s in attempt["result"]["steps"]] == ["done", "skipped", "done"]
    assert lab.path("teardown").exists()


@pytest.mark.parametrize("plane_settings", [{"max_releases": 1}])
async def test_a_task_released_over_and_over_ends_failed(own_lab: AgentLab) -> None:
    agent = await own_lab.agent("d1").ready()
    task_id = await own_lab.submit([shell("long", "sleep 300", interruptible=True)], max_attempts=1)
    for n in (1, 2):
        await own_lab.wait_view(task_id, lambda v, n=n: v["status"] == "dispatched" and v["attempt_count"] == n)
        assert await agent.terminate() == 0
        if n == 1:
            await agent.start().ready()
    view = await own_lab.wait_status(task_id, *TERMINAL)
    assert (view["status"], view["reason"], view["attempt_count"], view["releases"]) == (
        "failed",
        "released_too_often",
        2,
        2,
    )
    attempts_without_gaps({**view, "releases": 1})  # the last release failed the task rather than requeued it
    events = await own_lab.wait_events(task_id, "failed")
    assert [(e["event"], e["reason"]) for e in events if e["event"] in ("requeued", "failed")] == [
        ("requeued", "released"),
        ("failed", "released_too_often"),
    ]


async def test_an_identical_repeat_is_a_duplicate_and_a_stale_or_foreign_release_changes_nothing(
    own_lab: AgentLab,
) -> None:
    # The scheduler hangs while the agent shuts down: the release is sent, handled only later, and stays
    # in the spool; the next start sends the identical bytes again and is answered with a duplicate.
    agent = await own_lab.agent("d1").ready()
    other = await own_lab.agent("d2").ready()
    await own_lab.drain("d2")  # the task runs on d1
    task_id = await own_lab.submit([shell("long", "sleep 300", interruptible=True)], max_attempts=1)
    await own_lab.wait_status(task_id, "dispatched")
    with own_lab.plane.scheduler.paused():
        assert await agent.terminate() == 0
        assert len(agent.spooled_releases()) == 1, "the release waits in the spool"
    view = await own_lab.wait_view(task_id, lambda v: v["releases"] == 1, what="released")
    first = view["attempts"][0]
    assert (first["status"], first["host_id"]) == ("released", agent.host_id)
    await agent.start().ready()
    line = await agent.wait_line("release recorded", duplicate=True)
    assert line["spool_key"] == f"{task_id}.1.release"
    assert not agent.spooled()
    again = await own_lab.task(task_id)
    assert again["releases"] == 1
    assert again["attempts"][0] == first, "the repeat changed nothing"

    # A release of that lease with other ids, or from another host, is refused and changes nothing (checked
    # once the task runs again on d1, so nothing else moves it meanwhile).
    lease = {"task_id": task_id, "attempt": 1, "lease_id": first["lease_id"]}
    before = await own_lab.wait_view(
        task_id, lambda v: v["status"] == "dispatched" and v["attempt_count"] == 2, what="running again"
    )
    for host_id, body, code in [
        (agent.host_id, {**lease, "lease_id": str(uuid.uuid4())}, "lease_superseded"),
        (agent.host_id, {**lease, "attempt": 7}, "lease_superseded"),
        (other.host_id, lease, "lease_foreign"),
    ]:
        with pytest.raises(ErrorReply) as refused:
            await host_release(own_lab, host_id, body)
        assert (refused.value.status, refused.value.code) == (409, code), (host_id, body)
    after = await own_lab.task(task_id)
    assert after["attempts"][0] == before["attempts"][0]
    assert (after["releases"], after["attempt_count"], after["status"]) == (1, 2, "dispatched")
    assert after["attempts"][1]["lease_id"] == before["attempts"][1]["lease_id"]
    assert after["attempts"][1]["status"] == "active"


async def test_drain_via_the_cli_finishes_running_work_takes_no_more_and_exits_0(lab: AgentLab) -> None:
    agent = await lab.agent("d1", "d2").ready()
    gate = lab.gate("running")
    running = await lab.submit([shell("work", f"touch '{lab.path('started')}'; {gate.wait}")], max_attempts=1)
    await eventually(lab.path("started").exists, timeout=30, message="the running task started")

    drained = await lab.cli("drain", "--host", agent.host_id, "--reason", "kernel update", "--json")
    assert drained.returncode == 0, drained.stderr
    host = json.loads(drained.stdout)
    assert {d["device_id"]: d["state"] for d in host["devices"]} == {
        lab.device("d1"): "drained",
        lab.device("d2"): "drained",
    }
    await agent.wait_line("draining: finishing running work, taking no more", source="scheduler")
    queued = await lab.submit([noop("later")], max_attempts=1)
    gate.open()
    assert await agent.process.wait_exit(30) == 0, "exits 0 once idle"
    assert agent.lines("drained: nothing runs here any more; exiting")
    view = await lab.wait_status(running, *TERMINAL)
    assert (view["status"], view["releases"]) == ("done", 0), "running work finishes (reported, not released)"
    waiting = await lab.task(queued)
    assert (waiting["status"], waiting["attempt_count"]) == ("queued", 0), "no new work was taken"
    assert waiting["pending_reason"].split(":")[0] in ("devices_drained", "no_online_device")

    # back in service: the devices stay drained when the agent starts again, until returned
    await agent.start().ready()
    assert (await lab.task(queued))["status"] == "queued"
    undone = await lab.cli("drain", "--host", agent.host_id, "--undo")
    assert undone.returncode == 0, undone.stderr
    assert "back in service" in undone.stdout
    assert (await lab.wait_status(queued, *TERMINAL))["status"] == "done"


async def test_drain_by_signal_finishes_running_work_takes_no_more_and_exits_0(lab: AgentLab) -> None:
    agent = await lab.agent("d1", "d2").ready()
    gate = lab.gate("running")
    running = await lab.submit([shell("work", f"touch '{lab.path('started')}'; {gate.wait}")], max_attempts=1)
    await eventually(lab.path("started").exists, timeout=30, message="the running task started")
    agent.process.signal(signal.SIGUSR1)  # what the DaemonSet's preStop hook sends
    await agent.wait_line("devices withdrawn: no new work comes to this host")
    queued = await lab.submit([noop("later")], max_attempts=1)
    gate.open()
    assert await agent.process.wait_exit(30) == 0
    assert (await lab.wait_status(running, *TERMINAL))["status"] == "done"
    assert (await lab.task(queued))["attempt_count"] == 0, "no new work was taken"
    await agent.start().ready()  # the next start offers the devices again
    assert (await lab.wait_status(queued, *TERMINAL))["status"] == "done"


async def test_a_killed_agent_releases_what_it_held_at_its_next_start(lab: AgentLab) -> None:
    agent = await lab.agent("d1").ready()
    once = lab.path("ran-once")
    # the first attempt holds the device; the second (after the restart) finishes at once
    command = f"if [ -e '{once}' ]; then exit 0; fi; touch '{once}'; exec sleep 300"
    task_id = await lab.submit([shell("hold", command)], max_attempts=1, lease_ttl_s=120)
    await eventually(once.exists, timeout=30, message="first attempt runs")
    agent.process.kill()
    agent.start()
    view = await lab.wait_status(task_id, *TERMINAL, within=60)
    assert view["status"] == "done"
    attempts_without_gaps(view)
    first, second = view["attempts"]
    assert (first["end_reason"], first["device_id"], second["device_id"]) == (
        "released",
        lab.device("d1"),
        lab.device("d1"),
    )
    # released at the restart, not at the lease's expiry (two minutes on) plus a grace
    assert at(first["ended_at"]) < at(first["expires_at"])
    assert at(second["assigned_at"]) < at(first["expires_at"])
    line = await agent.wait_line("attempt held by an earlier agent", task_id=task_id)
    assert line["action"] == "release"
    assert not list((agent.spool_dir / "held").glob(f"{task_id}.1.json"))
