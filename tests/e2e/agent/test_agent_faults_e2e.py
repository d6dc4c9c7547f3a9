"""The real agent through faults of real processes: killed with a report in its spool, NATS restarted mid-run.

The lease-loss fault (the scheduler paused past the ttl) is `test_stop_triggered_by_lease_loss_with_the_real_agent`.
"""

from __future__ import annotations

import json
import time

import pytest

from support.agent_e2e import AgentLab, matching, noop, shell, touch, wait_expired, wait_line
from support.polling import eventually
from support.servers import NatsHandle

pytestmark = [pytest.mark.e2e, pytest.mark.chaos]


async def _report_stuck_in_the_spool(lab: AgentLab, *, lease_ttl_s: int, max_attempts: int) -> tuple[str, bytes]:
    """Run a task whose report is due while no scheduler runs, then SIGKILL the agent; the task and the spooled bytes.

    Killing the scheduler (rather than pausing it) makes sure no copy of the report waits in NATS to be
    answered later: after this, the report exists only in the spool.
    """
    # A long request timeout: the restarted agent's first try is answered even on a loaded machine.
    agent = await lab.agent("d1", request_timeout_s=5).ready()
    gate, started = lab.gate("hold"), lab.path("started")
    task_id = await lab.submit(
        [shell("hold", f"{touch(started)}; {gate.wait}; echo from-attempt-$DEVSCHED_ATTEMPT")],
        lease_ttl_s=lease_ttl_s,
        max_attempts=max_attempts,
    )
    await eventually(started.exists, timeout=20, message="step started")
    lab.plane.scheduler.kill()
    gate.open()
    await agent.wait_line("report not answered, will retry", spool_key=f"{task_id}.1", timeout=10)
    agent.process.kill()
    (spooled,) = agent.spooled()
    assert spooled.name == f"{task_id}.1.json"
    return task_id, spooled.read_bytes()


async def test_a_killed_agent_delivers_its_spooled_report_after_restart(own_lab: AgentLab) -> None:
    lab, plane = own_lab, own_lab.plane
    task_id, body = await _report_stuck_in_the_spool(lab, lease_ttl_s=15, max_attempts=1)
    (agent,) = lab.agents
    await plane.start_scheduler().wait_logged("serving")
    agent.start()
    restarted = agent.process
    await wait_line(restarted, "resending spooled reports", count=1, timeout=20)
    recorded = await wait_line(restarted, "report recorded", spool_key=f"{task_id}.1", timeout=20)
    assert (recorded["status"], recorded["duplicate"]) == ("done", False)  # accepted, and only now
    view = await lab.wait_status(task_id, "done")
    assert view["result"]["steps"][0]["output_tail"] == "from-attempt-1\n"
    assert (view["attempt_count"], view["attempts"][0]["end_reason"]) == (1, "done")
    assert [line["duplicate"] for line in plane.scheduler_lines("reported", task_id=task_id)] == [False]
    assert json.loads(body)["outcome"] == "done"
    assert not agent.spooled()
    assert not agent.rejected()


async def test_a_killed_agent_restarted_after_its_lease_expired_has_its_stale_report_answered(
    own_lab: AgentLab,
) -> None:
    lab, plane = own_lab, own_lab.plane
    task_id, _ = await _report_stuck_in_the_spool(lab, lease_ttl_s=3, max_attempts=1)
    (agent,) = lab.agents
    await wait_expired(plane.sweeper, task_id, timeout=15)
    await plane.start_scheduler().wait_logged("serving")
    failed = await lab.wait_status(task_id, "failed")
    assert failed["reason"] == "lease_expired"
    agent.start()
    restarted = agent.process
    await wait_line(restarted, "resending spooled reports", count=1, timeout=20)
    # Not lost silently: the scheduler answered it (409), and the agent says so where operators look.
    moot = await wait_line(restarted, "report is moot", spool_key=f"{task_id}.1", timeout=20)
    assert moot["level"] == "warning"
    assert moot["code"] == "task_terminal"  # PROTOCOL.md precedence: task_terminal before lease_expired
    assert not matching(restarted.log_lines(), "report recorded")
    refused = [line for line in plane.scheduler.log_lines() if line.get("endpoint") == "host-report"]
    assert [line.get("error") for line in refused] == [moot["code"]]
    view = await lab.task(task_id)
    assert (view["status"], view["reason"], view["result"]) == ("failed", "lease_expired", None)
    assert not agent.spooled()  # answered (409 makes it moot): out of the pending spool, as issue 4 item 5 says


async def test_nats_restarted_mid_run_the_agent_reconnects_keeps_renewing_and_finishes(
    own_lab: AgentLab, nats_server: NatsHandle
) -> None:
    lab, plane = own_lab, own_lab.plane
    agent = await lab.agent("d1").ready()
    ttl = 4
    gate, started = lab.gate("hold"), lab.path("started")
    task_id = await lab.submit([shell("hold", f"{touch(started)}; {gate.wait}"), noop("after")], lease_ttl_s=ttl)
    await eventually(started.exists, timeout=20, message="step started")
    before = (await lab.task(task_id))["attempts"][0]

    down = time.monotonic()
    nats_server.restart()
    await agent.wait_line("nats reconnected", timeout=20)
    await wait_line(plane.scheduler, "nats reconnected", timeout=20)
    reconnected = (await lab.task(task_id))["attempts"][0]["expires_at"]

    async def renewed_after_the_restart() -> bool:
        (attempt,) = (await lab.task(task_id))["attempts"]
        assert (attempt["lease_id"], attempt["status"]) == (before["lease_id"], "active")
        return bool(attempt["expires_at"] > reconnected) and time.monotonic() - down > ttl + 1

    await eventually(renewed_after_the_restart, timeout=ttl + 20, interval=0.1, message="renewals after the restart")
    gate.open()
    view = await lab.wait_status(task_id, "done", within=20)
    assert (view["attempt_count"], view["attempts"][0]["lease_id"]) == (1, before["lease_id"])
    assert not agent.lines("lease lost")
    # New work still reaches the agent: its consumer binding works again.
    later = await lab.submit([noop("next")], lease_ttl_s=ttl)
    await lab.wait_status(later, "done", within=20)


async def test_a_report_retried_through_a_long_outage_does_not_keep_the_device_from_its_next_attempt(
    own_lab: AgentLab,
) -> None:
    lab, plane = own_lab, own_lab.plane
    agent = await lab.agent("d1", request_timeout_s=0.3).ready()
    work = f'if [ "$DEVSCHED_ATTEMPT" = 1 ]; then {touch(lab.path("started-1"))}; exec sleep 600; fi; echo ok'
    task_id = await lab.submit([shell("work", work, interruptible=True)], lease_ttl_s=2, max_attempts=2)
    await eventually(lab.path("started-1").exists, timeout=20, message="attempt 1 running")
    with plane.scheduler.paused():
        await agent.wait_line("lease lost", task_id=task_id, timeout=10)
        await wait_expired(plane.sweeper, task_id, attempt=1, timeout=10)
        # The outage lasts until the agent's report of attempt 1 has backed off past a lease: after the
        # 6th failure it waits 3.2-6.4 s before trying again.
        await agent.wait_line("report not answered, will retry", spool_key=f"{task_id}.1", failures=6, timeout=30)
    resumed = time.monotonic()
    # Back: device d1 is free (no grace) and attempt 2 is assigned to it at once. Its run ends the task.
    view = await lab.wait_status(task_id, "done", "failed", within=20)
    still_spooled = [p.name for p in agent.spooled()]
    attempts = [(a["attempt"], a["status"], a["end_reason"], a["dispatched_at"]) for a in view["attempts"]]
    assert view["status"] == "done", (
        f"{view['status']} ({view['reason']}) {time.monotonic() - resumed:.1f} s after the scheduler came back; "
        f"attempts (attempt, status, end_reason, dispatched_at): {attempts}; attempt 2 was never claimed while "
        f"the agent's device worker retried the moot report of attempt 1, still pending: {still_spooled}"
    )
