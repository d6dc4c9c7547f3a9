"""Clock skew changes nothing: the agent's wall clock an hour ahead, the control plane's ten minutes behind.

Leases are measured by the database's clock only, and the agent schedules renewals from each reply's `ttl_s`
with its monotonic clock (ARCHITECTURE invariant 9), so skewed wall clocks must not move an expiry, a renewal
or a timestamp. The skew comes from libfaketime preloaded into the real processes (`support.faketime`).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from support.agent_e2e import AgentProcess, at
from support.faketime import skewed
from support.fault_lab import FaultLab, MakeLab
from support.polling import eventually
from support.scheduler_harness import ServiceProcess

pytestmark = [pytest.mark.chaos, pytest.mark.e2e]

#: How far a log line's timestamp may be from the skew it shows (a loaded machine, the line's age).
NEAR = timedelta(seconds=10)
#: How far a timestamp the system recorded during this test may be from now: the test's length, far below a skew.
RECENT = timedelta(minutes=2)


def _logged_offset(process: ServiceProcess) -> timedelta:
    """How far the process's clock is from ours, by the timestamp of its last log line."""
    line = process.log_lines()[-1]
    return datetime.fromisoformat(line["ts"].replace("Z", "+00:00")) - datetime.now(UTC)


def _near_now(timestamp: str | None) -> bool:
    return timestamp is not None and abs(at(timestamp) - datetime.now(UTC)) < RECENT


async def test_an_agent_an_hour_ahead_and_a_control_plane_ten_minutes_behind_change_nothing(
    make_lab: MakeLab,
) -> None:
    lab: FaultLab = await make_lab(env=skewed("-10m"))
    agent: AgentProcess = await lab.agent("d1", "d2", agent_env=skewed("+1h")).ready()
    # the skew is real: each process stamps its logs with its own clock
    assert abs(_logged_offset(lab.plane.scheduler) + timedelta(minutes=10)) < NEAR
    assert abs(_logged_offset(agent.process) - timedelta(hours=1)) < NEAR

    async with lab.inv.watch():
        renewed = await lab.submit(lab.journal.plan(*[0.5] * 5), lease_ttl_s=2)  # outlives its lease: renewals
        cancelled = await lab.submit(lab.journal.plan(*[0.5] * 10), lease_ttl_s=10)
        await eventually(lambda: lab.journal.starts_of(cancelled).get(1), timeout=20, message="running")
        await lab.cancel(cancelled)
        views = await lab.run_all([renewed, cancelled], within=30)

        # A hung host: its lease runs out by the database's clock, one ttl after its last renewal at most.
        ttl = 3
        expiring = await lab.submit(lab.journal.plan(*[0.3] * 8), lease_ttl_s=ttl)
        await eventually(lambda: lab.journal.starts_of(expiring).get(1), timeout=20, message="running")
        agent.process.pause()
        paused_at = await lab.inv.db_now()
        try:
            expired = await lab.wait_view(
                expiring, lambda v: v["attempts"][0]["status"] == "expired", within=ttl + 5, what="lease expired"
            )
        finally:
            agent.process.resume()
        done = await lab.wait_status(expiring, "done", within=30)

    assert [(v["status"], v["attempt_count"]) for v in views.values()] == [("done", 1), ("cancelled", 1)]
    first: dict[str, Any] = expired["attempts"][0]
    ended, expires = at(first["ended_at"]), at(first["expires_at"])
    # renewed before the pause (a renewal already on its way may land just after it), never later
    assert paused_at < expires <= paused_at + timedelta(seconds=ttl + 1)
    assert expires <= ended < expires + timedelta(seconds=5)  # swept promptly, by the database's clock
    assert [a["status"] for a in done["attempts"]] == ["expired", "done"]
    # every time the system recorded is the true time, whatever the services' clocks say
    stamps = [v[k] for v in (*views.values(), done) for k in ("created_at", "updated_at")] + [
        a[k] for v in (*views.values(), done) for a in v["attempts"] for k in ("assigned_at", "ended_at")
    ]
    assert all(_near_now(s) for s in stamps), stamps
    events = await lab.events(renewed)
    assert all(_near_now(e["at"]) for e in events)
    await lab.inv.check()
