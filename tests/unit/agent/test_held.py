from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest

from devsched.agent.held import RESTART_REASON, HeldAttempt, HeldAttempts
from devsched.agent.spool import Spool, report_key
from devsched.protocol import messages as wire

pytestmark = pytest.mark.unit


def held(n: int) -> HeldAttempt:
    return HeldAttempt(task_id=f"task-{n}", attempt=n, lease_id=f"lease-{n}", device_id=f"dev-{n}")


async def test_an_attempt_is_recorded_with_its_ids_until_forgotten_then_counts_as_taken(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    attempts = HeldAttempts.in_spool(spool)
    await attempts.hold(held(1))
    await attempts.hold(held(2))
    body = json.loads((tmp_path / "held" / "task-1.1.json").read_bytes())
    assert body == {"task_id": "task-1", "attempt": 1, "lease_id": "lease-1", "device_id": "dev-1"}
    await attempts.forget(held(1))
    assert sorted(p.name for p in (tmp_path / "held").iterdir()) == ["task-2.2.json"]
    assert sorted(p.name for p in (tmp_path / "taken").iterdir()) == ["task-1.1.json"]
    assert attempts.taken.load() == [("task-1", 1)]


async def test_the_next_start_takes_what_was_left_held_once(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    for n in (1, 2, 3):
        await HeldAttempts.in_spool(spool).hold(held(n))
    (tmp_path / "held" / "broken.json").write_bytes(b"{")
    # Attempt 2's report made it to the spool before the agent died: the report speaks for it.
    reported = {report_key("task-2", 2)}
    again = HeldAttempts.in_spool(Spool(tmp_path))
    taken = again.take_left(reported)
    assert taken == [held(1), held(3)]
    assert list((tmp_path / "held").iterdir()) == []
    # every attempt it held was taken, released or reported: a copy of its assignment is dropped after this start
    assert sorted(again.taken.load()) == [("task-1", 1), ("task-2", 2), ("task-3", 3)]
    assert HeldAttempts.in_spool(Spool(tmp_path)).take_left(set()) == []


def test_an_assignment_names_its_attempt() -> None:
    task_id, lease_id = uuid.uuid4(), uuid.uuid4()
    assignment = wire.Assignment(
        task_id=task_id,
        attempt=3,
        lease_id=lease_id,
        device_id="pixel-7",
        plan=wire.Plan(steps=[wire.Step(name="s", action="noop")]),
        ttl_s=30,
        expires_at=datetime.now(UTC),
    )
    attempt = HeldAttempt.of(assignment)
    assert attempt == HeldAttempt(str(task_id), 3, str(lease_id), "pixel-7")
    assert attempt.key == f"{task_id}.3"
    ids = {"task_id": str(task_id), "attempt": 3, "lease_id": str(lease_id), "device_id": "pixel-7"}
    assert attempt.log_fields() == ids


async def test_each_attempt_left_is_handed_over_before_its_record_goes(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    for n in (1, 2, 3):
        await HeldAttempts.in_spool(spool).hold(held(n))
    handed: list[HeldAttempt] = []

    def hand_over(attempt: HeldAttempt) -> None:
        assert (tmp_path / "held" / f"{attempt.key}.json").exists(), "the record is still there while handed over"
        if attempt.attempt == 2:
            raise OSError("disk full")
        handed.append(attempt)

    taken = HeldAttempts.in_spool(spool).take_left(set(), hand_over)
    assert taken == [held(1), held(2), held(3)]
    assert handed == [held(1), held(3)]
    # the one that could not be handed over stays for the next start
    assert [p.name for p in (tmp_path / "held").iterdir()] == ["task-2.2.json"]
    assert sorted(p.name for p in (tmp_path / "taken").iterdir()) == ["task-1.1.json", "task-3.3.json"]


def test_a_held_attempt_is_given_back_by_a_release_of_its_lease() -> None:
    task_id, lease_id = uuid.uuid4(), uuid.uuid4()
    attempt = HeldAttempt(str(task_id), 4, str(lease_id), "pixel-7")
    assert attempt.release() == wire.ReleaseRequest(
        task_id=task_id, attempt=4, lease_id=lease_id, reason=RESTART_REASON, result=None
    )
