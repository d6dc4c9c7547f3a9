"""The attempts a host took, kept in its spool across restarts: moved there from `held/`, the newest kept."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from devsched.agent.held import HeldAttempt, HeldAttempts
from devsched.agent.spool import Spool, report_key
from devsched.agent.taken import TakenAttempts, attempt_key, remembered

pytestmark = pytest.mark.unit


def _age(path: Path, seconds_ago: float) -> None:
    when = path.stat().st_mtime - seconds_ago
    os.utime(path, (when, when))


def test_a_report_key_names_its_attempt() -> None:
    assert attempt_key(report_key("6003a64b-1520-4775-94e1-a53e195a7110", 12)) == (
        "6003a64b-1520-4775-94e1-a53e195a7110",
        12,
    )
    assert attempt_key("task.1.release") is None
    assert attempt_key("no-attempt") is None
    assert attempt_key(".3") is None


def test_remembered_attempts_are_the_taken_then_the_spooled_once_each() -> None:
    got = remembered([("t1", 1), ("t2", 1)], ["t3.2", "broken"], ["t1.1", "t4.1"])
    assert got == [("t1", 1), ("t2", 1), ("t3", 2), ("t4", 1)]


def test_a_move_keeps_the_body_and_the_time_and_a_missing_record_is_no_error(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    held, taken = spool.records("held"), spool.records("taken")
    path = held.put("t.1", b"{}")
    _age(path, 100)
    written = path.stat().st_mtime_ns
    held.move("t.1", taken)
    held.move("t.1", taken)  # gone already
    assert held.items() == []
    assert taken.items() == [("t.1", b"{}")]
    assert (tmp_path / "taken" / "t.1.json").stat().st_mtime_ns == written


def test_load_keeps_the_newest_records_and_returns_them_oldest_first(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    records = spool.records("taken")
    for n in range(5):
        _age(records.put(report_key(f"t{n}", 1), b"{}"), 100 - n)  # t0 oldest
    assert TakenAttempts.in_spool(spool, keep=3).load() == [("t2", 1), ("t3", 1), ("t4", 1)]
    assert sorted(p.name for p in (tmp_path / "taken").iterdir()) == ["t2.1.json", "t3.1.json", "t4.1.json"]


async def test_attempts_forgotten_while_running_are_pruned_now_and_then(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    taken = TakenAttempts.in_spool(spool, keep=4)
    attempts = HeldAttempts(spool.records("held"), taken)
    for n in range(6):
        attempt = HeldAttempt(f"t{n}", 1, f"l{n}", "d")
        await attempts.hold(attempt)
        _age(tmp_path / "held" / f"{attempt.key}.json", 100 - n)
        await attempts.forget(attempt)
    # a prune once every keep // 4 additions: never more than `keep` left after one
    assert len(list((tmp_path / "taken").iterdir())) == 4
    assert taken.load() == [("t2", 1), ("t3", 1), ("t4", 1), ("t5", 1)]
