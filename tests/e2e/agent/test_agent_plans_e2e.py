"""How the real agent runs plans against the real control plane: failures, timeouts, cancellation, devices.

Marker files prove what ran: a step that must never run would create one.
"""

from __future__ import annotations

import itertools
import os
import time
from collections import defaultdict
from typing import Any

import pytest

from support.agent_e2e import AgentLab, at, noop, shell, step_statuses, touch
from support.polling import eventually

pytestmark = pytest.mark.e2e

TTL_S = 3


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_a_failing_shell_step_fails_the_task_with_its_exit_code_and_output(lab: AgentLab) -> None:
    await lab.agent("d1").ready()
    later, collected = lab.path("later-ran"), lab.path("collected")
    task_id = await lab.submit(
        [
            shell("flash", "echo flashing; echo 'no device' >&2; exit 3"),
            shell("test", touch(later)),
            shell("collect", f"{touch(collected)}; echo collected", always=True),
        ],
        lease_ttl_s=TTL_S,
    )
    view = await lab.wait_status(task_id, "failed")
    assert view["reason"] == "step 'flash' failed with exit code 3"
    assert (view["attempt_count"], view["attempts"][0]["end_reason"]) == (1, "failed")  # a report is not retried
    flash, test, collect = view["result"]["steps"]
    assert (flash["status"], flash["exit_code"]) == ("failed", 3)
    assert flash["output_tail"] == "flashing\nno device\n"
    assert (test["status"], test["output_tail"]) == ("skipped", "skipped: an earlier step failed")
    assert (collect["status"], collect["output_tail"]) == ("done", "collected\n")
    assert not later.exists()
    assert collected.exists()  # teardown runs after a failed step


async def test_a_step_timeout_gives_timed_out_and_fails_the_task(lab: AgentLab) -> None:
    await lab.agent("d1").ready()
    pid_file, collected = lab.path("pid"), lab.path("collected")
    submitted = time.monotonic()
    task_id = await lab.submit(
        [
            shell("hang", f"echo $$ > {pid_file}; echo hanging; exec sleep 600", timeout_s=0.5),
            noop("after"),
            shell("logs", touch(collected), always=True),
        ],
        lease_ttl_s=TTL_S,
    )
    view = await lab.wait_status(task_id, "failed")
    assert time.monotonic() - submitted < 10
    assert view["reason"] == "step 'hang' timed out after 0.5 s"
    assert step_statuses(view) == [("hang", "timed_out"), ("after", "skipped"), ("logs", "done")]
    hang = view["result"]["steps"][0]
    assert hang["output_tail"] == "hanging\n"
    assert at(hang["finished_at"]) > at(hang["started_at"])
    assert not _alive(int(pid_file.read_text()))  # the step's process was stopped
    assert collected.exists()


async def test_cancelling_a_long_interruptible_step_ends_cancelled_quickly_and_runs_only_teardown(
    lab: AgentLab, record_property: Any
) -> None:
    agent = await lab.agent("d1").ready()
    started, pid_file = lab.path("started"), lab.path("pid")
    later, teardown = lab.path("later-ran"), lab.path("teardown-ran")
    task_id = await lab.submit(
        [
            shell("long", f"echo $$ > {pid_file}; {touch(started)}; exec sleep 600", interruptible=True),
            shell("later", touch(later)),
            shell("teardown", touch(teardown), always=True),
        ],
        # Periodic renewals every 10 s: a quick stop must come from the nudge that the cancel sends.
        lease_ttl_s=30,
    )
    await eventually(started.exists, timeout=20, message="long step started")
    cancelled_at = time.monotonic()
    await lab.cancel(task_id)
    view = await lab.wait_status(task_id, "cancelled", within=15)
    latency = time.monotonic() - cancelled_at
    record_property("cancel_latency_s", round(latency, 3))
    print(f"cancellation latency: {latency:.3f} s")
    assert latency < 10
    assert agent.lines("nudged: renewing now", task_id=task_id)
    assert step_statuses(view) == [("long", "interrupted"), ("later", "skipped"), ("teardown", "done")]
    assert not later.exists()  # no later planned step ran
    assert teardown.exists()  # the `always` teardown ran after the cancellation stop
    assert not _alive(int(pid_file.read_text()))  # its process group was stopped


async def test_never_two_attempts_on_one_device(lab: AgentLab) -> None:
    await lab.agent("d1", "d2").ready()
    locks = lab.path("locks")
    locks.mkdir()
    # A second attempt on a busy device would find the lock taken and fail its task.
    exclusive = f'mkdir "{locks}/$DEVSCHED_DEVICE_ID" || exit 99; sleep 0.2; rmdir "{locks}/$DEVSCHED_DEVICE_ID"'
    ids = [await lab.submit([shell("exclusive", exclusive)], lease_ttl_s=TTL_S) for _ in range(8)]
    views = [await lab.wait_status(task_id, "done", "failed", within=30) for task_id in ids]
    assert [v["status"] for v in views] == ["done"] * len(ids), [v["result"] for v in views]

    by_device: dict[str, list[tuple[Any, ...]]] = defaultdict(list)
    for view in views:
        for attempt in view["attempts"]:
            step = view["result"]["steps"][0]
            by_device[attempt["device_id"]].append(
                (
                    at(attempt["assigned_at"]),
                    at(attempt["ended_at"]),
                    at(step["started_at"]),
                    at(step["finished_at"]),
                )
            )
    assert set(by_device) == {lab.device("d1"), lab.device("d2")}  # both devices worked, in parallel
    for device, spans in by_device.items():
        spans.sort()
        for earlier, later in itertools.pairwise(spans):
            assert earlier[1] <= later[0], f"attempts overlap on {device} (control plane): {earlier} {later}"
            assert earlier[3] <= later[2], f"steps overlap on {device} (agent): {earlier} {later}"
