"""Every scenario of spec/host-agent.md, with the real `devsched-agent` process against the real control plane.

The agent, the scheduler and the sweeper run as processes over a real NATS and Postgres. Where a scenario
is about the control plane's answer (stale or foreign renewals, stale reports, repeated reports), the
situation is produced by the real agent and faults done to real processes (SIGSTOP/SIGCONT by pid), and
the answer is read from the task view, the events stream and the processes' logs.
"""

from __future__ import annotations

import time
import uuid

import pytest

from support.agent_e2e import (
    AgentLab,
    at,
    identity,
    noop,
    shell,
    step_statuses,
    touch,
    wait_expired,
)
from support.polling import eventually
from support.scheduler_harness import ErrorReply, TestHost

pytestmark = pytest.mark.e2e

#: The lease of most tests: renewals every ~1 s.
TTL_S = 3


@pytest.fixture
def plane_settings() -> dict[str, float]:
    """The tests with a control plane of their own expire leases: a short device grace lets a retry start soon."""
    return {"device_grace_s": 0.5}


def _attempt_1_holds_then_attempt_2_waits(lab: AgentLab, gate_name: str) -> str:
    """A command: attempt 1 sleeps (interruptibly) until stopped; later attempts wait for the gate."""
    gate = lab.gate(gate_name)
    return f'if [ "$DEVSCHED_ATTEMPT" = 1 ]; then {touch(lab.path("started-1"))}; exec sleep 600; fi; {gate.wait}'


# -- Requirement: Active execution renews its lease ---------------------------------------------------


async def test_lease_renewal_succeeds_with_the_real_agent(lab: AgentLab) -> None:
    await lab.agent("d1").ready()
    gate = lab.gate("hold")
    task_id = await lab.submit([shell("hold", gate.wait), noop("after")], lease_ttl_s=TTL_S)
    view = await lab.wait_status(task_id, "dispatched")
    first = view["attempts"][0]
    dispatched = time.monotonic()
    expiries = [first["expires_at"]]

    async def outlived_one_ttl() -> bool:
        view = await lab.task(task_id)
        (attempt,) = view["attempts"]
        assert (view["status"], view["attempt_count"], attempt["status"]) == ("dispatched", 1, "active")
        assert identity(attempt) == identity(first)  # renewals change neither the attempt nor the device
        if attempt["expires_at"] != expiries[-1]:
            expiries.append(attempt["expires_at"])
        return time.monotonic() - dispatched > TTL_S + 1

    await eventually(outlived_one_ttl, timeout=TTL_S + 10, interval=0.1, message="attempt outlives its first ttl")
    assert (await lab.task(task_id))["attempts"][0]["progress"] == {"step": "hold", "index": 0, "of": 2}
    assert len(expiries) >= 3, expiries  # renewed at about a third of the ttl
    assert [at(e) for e in expiries] == sorted(at(e) for e in expiries)  # each renewal extended it
    gate.open()
    done = await lab.wait_status(task_id, "done")
    assert (done["attempt_count"], done["attempts"][0]["end_reason"]) == (1, "done")
    assert identity(done["attempts"][0]) == identity(first)
    events = await lab.wait_events(task_id, "done")
    assert "requeued" not in [e["event"] for e in events]
    # Renewals at step boundaries carry progress: one `progress` event per step.
    assert [e["progress"]["step"] for e in events if e["event"] == "progress"] == ["hold", "after"]


@pytest.mark.chaos
async def test_lease_is_stale_or_foreign_with_the_real_agent(own_lab: AgentLab) -> None:
    lab, plane = own_lab, own_lab.plane
    # lease by lease: the scheduler logs each refused `renew` (a batch's refusals are answers in its reply)
    agent = await lab.agent("d1", batch_renewals=False).ready()
    stranger = TestHost(lab.nc, lab.prefix)
    await stranger.register()  # a registered host without devices: its renewals are foreign
    task_id = await lab.submit(
        [shell("work", _attempt_1_holds_then_attempt_2_waits(lab, "second"), interruptible=True)],
        lease_ttl_s=TTL_S,
        max_attempts=3,
    )
    await eventually(lab.path("started-1").exists, timeout=20, message="attempt 1 running")
    first = (await lab.task(task_id))["attempts"][0]
    lease_1 = {"task_id": task_id, "attempt": 1, "lease_id": first["lease_id"]}

    async def refused(host: TestHost, lease: dict[str, object], code: str) -> None:
        with pytest.raises(ErrorReply) as caught:
            await host.request("renew", lease)
        assert (caught.value.status, caught.value.code) == (409, code)

    # Differently owned: refused, and the owner's attempt goes on unaltered.
    await refused(stranger, lease_1, "lease_foreign")
    after_foreign = await lab.task(task_id)
    assert identity(after_foreign["attempts"][0]) == identity(first)
    assert (after_foreign["status"], after_foreign["attempts"][0]["status"]) == ("dispatched", "active")

    logged = len(plane.scheduler.log_lines())
    # Expired: with the scheduler paused the agent's renewals wait in NATS; the sweeper expires the lease
    # meanwhile, and the scheduler answers those renewals only after that.
    with plane.scheduler.paused():
        await agent.wait_line("lease lost", task_id=task_id, timeout=TTL_S + 10)
        await wait_expired(plane.sweeper, task_id, attempt=1, timeout=TTL_S + 10)

    # This plane serves only this test, whose one agent has one attempt: every refused renewal is its.
    def late_renewals() -> list[dict[str, object]]:
        lines = plane.scheduler.log_lines()[logged:]
        return [line for line in lines if line.get("endpoint") == "host-renew" and line.get("error")]

    late = await eventually(late_renewals, timeout=10, message="the agent's late renewals answered")
    # Expired; or replaced, when the scheduler has already assigned attempt 2 by the time it answers one.
    assert {line["error"] for line in late} <= {"lease_expired", "lease_superseded"}

    # The expired attempt was not revived: the task went on with a new attempt.
    view = await lab.wait_view(task_id, lambda v: len(v["attempts"]) == 2 and v["status"] == "dispatched")
    expired, second = view["attempts"]
    assert (expired["status"], expired["end_reason"]) == ("expired", "lease_expired")
    lease_2 = {"task_id": task_id, "attempt": 2, "lease_id": second["lease_id"]}

    # Replaced: the agent's own host renewing attempt 1, or attempt 2 with a lease id that is not its own.
    owner = TestHost(lab.nc, lab.prefix, agent.host_id)  # not registered again: only sends as that host
    await refused(owner, lease_1, "lease_superseded")
    await refused(owner, {**lease_2, "lease_id": str(uuid.uuid4())}, "lease_superseded")
    # Differently owned: the current attempt, renewed by another host.
    await refused(stranger, lease_2, "lease_foreign")

    now = await lab.task(task_id)
    assert now["attempts"][0] == {**expired}  # the expired attempt stays as it ended
    assert identity(now["attempts"][1]) == identity(second)
    assert (now["status"], now["attempts"][1]["status"], now["attempt_count"]) == ("dispatched", "active", 2)
    lab.gate("second").open()
    done = await lab.wait_status(task_id, "done")
    assert [a["status"] for a in done["attempts"]] == ["expired", "done"]
    await stranger.close()


async def test_renewal_response_signals_a_pending_cancellation_with_the_real_agent(lab: AgentLab) -> None:
    agent = await lab.agent("d1").ready()
    gate, started, later = lab.gate("busy"), lab.path("started"), lab.path("later-ran")
    task_id = await lab.submit(
        [
            shell("busy", f"{touch(started)}; {gate.wait}"),  # not interruptible: it finishes first
            shell("later", touch(later)),
        ],
        lease_ttl_s=TTL_S,
    )
    await eventually(started.exists, timeout=20, message="busy step started")
    await lab.cancel(task_id)
    await agent.wait_line("cancellation requested", task_id=task_id, timeout=10)  # seen in a renewal reply
    view = await lab.task(task_id)
    assert (view["status"], view["attempts"][0]["status"]) == ("dispatched", "active")  # the step goes on
    gate.open()
    view = await lab.wait_status(task_id, "cancelled")
    assert step_statuses(view) == [("busy", "done"), ("later", "skipped")]
    assert view["result"]["steps"][1]["output_tail"] == "skipped: cancelled"
    assert not later.exists()  # stopped at the next step boundary: no further planned step


async def test_stop_triggered_by_cancellation_with_the_real_agent(lab: AgentLab) -> None:
    agent = await lab.agent("d1").ready()
    started = lab.path("started")
    task_id = await lab.submit(
        [shell("long", f"{touch(started)}; exec sleep 600", interruptible=True), noop("after")],
        lease_ttl_s=TTL_S,
    )
    await eventually(started.exists, timeout=20, message="long step started")
    await lab.cancel(task_id, reason="operator")
    view = await lab.wait_status(task_id, "cancelled", within=10)
    ended = await agent.wait_line("attempt ended", task_id=task_id)
    assert ended["outcome"] == "cancelled"
    assert view["attempts"][0]["end_reason"] == "cancelled"
    assert view["reason"] == "cancelled: cancellation requested"
    assert step_statuses(view) == [("long", "interrupted"), ("after", "skipped")]


@pytest.mark.chaos
async def test_stop_triggered_by_lease_loss_with_the_real_agent(own_lab: AgentLab) -> None:
    lab, plane = own_lab, own_lab.plane
    agent = await lab.agent("d1").ready()
    work = f'{touch(lab.path("started"))}-$DEVSCHED_ATTEMPT; [ "$DEVSCHED_ATTEMPT" != 1 ] || exec sleep 600'
    task_id = await lab.submit(
        [
            shell("work", work, interruptible=True),
            shell("after", f"touch {lab.path('after')}-$DEVSCHED_ATTEMPT"),
            shell("teardown", f"touch {lab.path('teardown')}-$DEVSCHED_ATTEMPT", always=True),
        ],
        lease_ttl_s=4,
        max_attempts=3,
    )
    await eventually(lab.path("started-1").exists, timeout=20, message="attempt 1 running")

    # The scheduler is paused past the ttl: the agent cannot renew, its own deadline passes, the sweeper
    # requeues. The report waits in the spool meanwhile: read what the agent reports.
    with plane.scheduler.paused():
        await agent.wait_line("lease lost", task_id=task_id, timeout=15)
        report = await eventually(lambda: agent.spooled_report(task_id, 1), timeout=10, message="report spooled")
        await wait_expired(plane.sweeper, task_id, attempt=1, timeout=15)
    assert report is not None
    assert report["outcome"] == "failed"
    assert report["reason"].startswith("lease_lost")
    assert [(s["name"], s["status"]) for s in report["result"]["steps"]] == [
        ("work", "interrupted"),
        ("after", "skipped"),
        ("teardown", "skipped"),  # no `always` step after a lease loss
    ]

    view = await lab.wait_status(task_id, "done", within=30)
    first = view["attempts"][0]
    assert (first["attempt"], first["status"], first["end_reason"]) == (1, "expired", "lease_expired")
    assert view["attempts"][-1]["status"] == "done"
    assert not lab.path("after-1").exists()
    assert not lab.path("teardown-1").exists()
    last = view["attempt_count"]
    assert lab.path(f"teardown-{last}").exists()
    events = await lab.wait_events(task_id, "done")
    assert "cancelled" not in [e["event"] for e in events]
    assert "cancelled" not in [e["status"] for e in events]
    await eventually(lambda: not agent.spooled(), message="the moot report left the spool")
    assert not agent.rejected()


# -- Requirement: Terminal result reporting is idempotent ----------------------------------------------


async def test_report_a_successful_result_with_the_real_agent(lab: AgentLab) -> None:
    agent = await lab.agent("d1", env={"SERIAL": "serial-d1"}).ready()
    say = 'echo "$DEVSCHED_TASK_ID $DEVSCHED_ATTEMPT $DEVSCHED_LEASE_ID $DEVSCHED_DEVICE_ID $SERIAL"'
    task_id = await lab.submit([shell("identify", say), noop("rest")], lease_ttl_s=TTL_S)
    view = await lab.wait_status(task_id, "done")
    (attempt,) = view["attempts"]
    assert (attempt["status"], attempt["end_reason"], view["reason"]) == ("done", "done", None)
    identify, rest = view["result"]["steps"]
    expected = f"{task_id} 1 {attempt['lease_id']} {lab.device('d1')} serial-d1\n"
    assert (identify["status"], identify["exit_code"], identify["output_tail"]) == ("done", 0, expected)
    assert at(identify["started_at"]) <= at(identify["finished_at"]) <= at(rest["started_at"])
    assert rest["status"] == "done"
    # The reservation is released: the device is available, and the next task runs on it at once.
    assert await lab.device_state("d1") == "available"
    next_id = await lab.submit([noop("next")], lease_ttl_s=TTL_S)
    assert (await lab.wait_status(next_id, "done", within=10))["attempts"][0]["device_id"] == lab.device("d1")
    assert not agent.spooled()


async def test_report_a_cancelled_result_with_the_real_agent(lab: AgentLab) -> None:
    await lab.agent("d1").ready()
    started = lab.path("started")
    task_id = await lab.submit(
        [shell("wait", f"{touch(started)}; echo waiting; exec sleep 600", interruptible=True), noop("rest")],
        lease_ttl_s=TTL_S,
    )
    await eventually(started.exists, timeout=20, message="step started")
    await lab.cancel(task_id)
    view = await lab.wait_status(task_id, "cancelled", within=10)
    assert (view["attempts"][0]["status"], view["attempts"][0]["end_reason"]) == ("cancelled", "cancelled")
    assert view["cancel_requested"] is False  # the request was answered
    wait_step, rest = view["result"]["steps"]  # the result metadata is recorded
    assert (wait_step["status"], wait_step["output_tail"]) == ("interrupted", "waiting\n")
    assert at(wait_step["started_at"]) <= at(wait_step["finished_at"])
    assert rest == {**rest, "status": "skipped", "started_at": None}
    assert await lab.device_state("d1") == "available"  # reservation released
    next_id = await lab.submit([noop("next")], lease_ttl_s=TTL_S)
    await lab.wait_status(next_id, "done", within=10)


@pytest.mark.chaos
async def test_retry_a_result_after_response_loss_with_the_real_agent(own_lab: AgentLab) -> None:
    lab, plane = own_lab, own_lab.plane
    agent = await lab.agent("d1").ready()
    gate, started = lab.gate("hold"), lab.path("started")
    task_id = await lab.submit([shell("hold", f"{touch(started)}; {gate.wait}; echo finished")], lease_ttl_s=5)
    await eventually(started.exists, timeout=20, message="step started")
    # The scheduler is paused while the report is sent: the agent hears no answer and sends it again;
    # on resuming, the scheduler records the first copy and answers the repeats.
    with plane.scheduler.paused():
        gate.open()
        await agent.wait_line("report not answered, will retry", spool_key=f"{task_id}.1", timeout=10)
        spooled = agent.spooled_report(task_id, 1)
    assert spooled is not None
    assert spooled["outcome"] == "done"
    recorded = await agent.wait_line("report recorded", spool_key=f"{task_id}.1", timeout=15)
    assert recorded["duplicate"] is True  # the answer the agent finally got: the recorded result
    answers = await eventually(
        lambda: plane.scheduler_lines("reported", task_id=task_id),
        message="the scheduler's answers",
    )
    # The first copy to arrive was recorded; every other copy got the recorded result back.
    assert sorted(line["duplicate"] for line in answers) == [False] + [True] * (len(answers) - 1)
    assert len(answers) >= 2
    refusals = [line for line in plane.scheduler.log_lines() if line.get("error")]
    assert not [line for line in refusals if line.get("endpoint") == "host-report"]  # no error for a repeat
    view = await lab.task(task_id)
    assert (view["status"], view["attempt_count"], len(view["attempts"])) == ("done", 1, 1)

    def essence(steps: list[dict[str, object]]) -> list[tuple[object, ...]]:
        return [(s["name"], s["status"], s["exit_code"], s["output_tail"]) for s in steps]

    assert essence(view["result"]["steps"]) == essence(spooled["result"]["steps"])
    assert essence(view["result"]["steps"]) == [("hold", "done", 0, "finished\n")]
    events = await lab.wait_events(task_id, "done")
    assert [e["event"] for e in events].count("done") == 1
    assert not agent.spooled()


@pytest.mark.chaos
async def test_stale_attempt_reports_after_requeue_with_the_real_agent(lab: AgentLab) -> None:
    first_host = await lab.agent("a1").ready()
    second_host = await lab.agent("b1").ready()
    await lab.drain("b1")  # attempt 1 goes to a1
    task_id = await lab.submit(
        [shell("work", _attempt_1_holds_then_attempt_2_waits(lab, "second"), interruptible=True)],
        lease_ttl_s=TTL_S,
        max_attempts=2,
    )
    await eventually(lab.path("started-1").exists, timeout=20, message="attempt 1 running on a1")
    await lab.drain("a1")
    await lab.drain("b1", drained=False)
    # The first host freezes past its lease: the sweeper requeues and the second host takes attempt 2.
    with first_host.process.paused():
        view = await lab.wait_view(
            task_id,
            lambda v: v["status"] == "dispatched" and len(v["attempts"]) == 2,
            within=TTL_S + 15,
            what="attempt 2 dispatched",
        )
        second = view["attempts"][1]
        assert (second["host_id"], second["device_id"]) == (second_host.host_id, lab.device("b1"))
    # Thawed, the first host finds its lease lost and reports; the report is stale.
    moot = await first_host.wait_line("report is moot", spool_key=f"{task_id}.1", timeout=15)
    assert moot["code"] == "lease_superseded"
    ended = first_host.lines("attempt ended", task_id=task_id)
    assert [(line["attempt"], line["outcome"]) for line in ended] == [(1, "failed")]
    now = await lab.task(task_id)
    assert now["status"] == "dispatched"
    assert (now["attempts"][0]["status"], now["attempts"][0]["end_reason"]) == ("expired", "lease_expired")
    assert identity(now["attempts"][1]) == identity(second)
    assert now["attempts"][1]["status"] == "active"
    lab.gate("second").open()
    done = await lab.wait_status(task_id, "done")
    assert [a["status"] for a in done["attempts"]] == ["expired", "done"]
    assert done["result"]["steps"][0]["status"] == "done"  # attempt 2's report stands
    assert not first_host.spooled()
    assert not first_host.rejected()


# -- Requirement: Host distinguishes cancellation stop from lease-loss stop ------------------------------
# `test_stop_triggered_by_cancellation_with_the_real_agent` and `test_stop_triggered_by_lease_loss_with_the_real_agent`
# are above, next to the renewal scenarios that trigger them.
