from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path

import pytest

from devsched.agent.spool import Spool, SpoolLocked, SpoolUnsafe, report_key

pytestmark = pytest.mark.unit


def test_put_then_pending_returns_the_identical_bytes(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool")
    body = b'{"task_id": "t", "attempt": 1, "outcome": "done"}'
    path = spool.put(report_key("t", 1), body)
    assert path == tmp_path / "spool" / "t.1.json"
    [pending] = spool.pending()
    assert (pending.key, pending.body, pending.path) == ("t.1", body, path)
    assert spool.get("t.1") == body
    assert spool.get("t.2") is None


def test_reports_survive_reopening_oldest_first(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    spool.put("b.1", b"first")
    os.utime(tmp_path / "b.1.json", ns=(1_000_000_000, 1_000_000_000))
    spool.put("a.1", b"second")
    reopened = Spool(tmp_path)
    assert [(p.key, p.body) for p in reopened.pending()] == [("b.1", b"first"), ("a.1", b"second")]


def test_remove_forgets_a_report_and_is_idempotent(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    spool.put("t.1", b"x")
    spool.remove("t.1")
    spool.remove("t.1")
    assert spool.pending() == []
    assert Spool(tmp_path).pending() == []


def test_put_replaces_atomically_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    spool.put("t.1", b"old")
    spool.put("t.1", b"new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.1.json"]
    assert spool.get("t.1") == b"new"


def test_a_crash_before_the_rename_leaves_the_old_report_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spool = Spool(tmp_path)
    spool.put("t.1", b"old")

    def crash(src: object, dst: object) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="disk gone"):
        spool.put("t.1", b"new")
    monkeypatch.undo()
    assert spool.get("t.1") == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.1.json"]


def test_leftover_temporary_files_are_ignored_and_cleared_by_the_owner(tmp_path: Path) -> None:
    (tmp_path / ".t.1.json.abc.tmp").write_bytes(b"half a rep")
    (tmp_path / "notes.txt").write_text("not a report")
    spool = Spool(tmp_path)
    assert spool.pending() == []
    assert (tmp_path / ".t.1.json.abc.tmp").exists()  # a reader leaves a writer's file alone
    spool.lock()
    assert not (tmp_path / ".t.1.json.abc.tmp").exists()
    spool.unlock()


def test_one_process_owns_a_spool(tmp_path: Path) -> None:
    owner = Spool(tmp_path)
    owner.lock()
    with pytest.raises(SpoolLocked, match="in use by another process"):
        Spool(tmp_path).lock()
    owner.unlock()
    again = Spool(tmp_path)
    again.lock()
    again.unlock()


def test_a_report_that_can_never_be_accepted_is_kept_aside(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    spool.put("t.1", b"bad")
    moved = spool.reject("t.1", "invalid_request: result.steps.0.status")
    assert moved == tmp_path / "rejected" / "t.1.json"
    assert moved.read_bytes() == b"bad"
    assert (tmp_path / "rejected" / "t.1.reason.txt").read_text() == "invalid_request: result.steps.0.status"
    assert spool.pending() == []
    assert spool.reject("t.1", "again") is None


@pytest.mark.parametrize("key", ["", "../escape", "a/b", ".hidden", "x" * 201])
def test_keys_cannot_escape_the_directory(tmp_path: Path, key: str) -> None:
    with pytest.raises(ValueError, match="invalid spool key"):
        Spool(tmp_path).put(key, b"x")


def test_the_directory_is_created(tmp_path: Path) -> None:
    Spool(tmp_path / "a" / "b")
    assert (tmp_path / "a" / "b").is_dir()


def test_the_spool_is_private_to_the_agent(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool")
    spool.lock()
    try:
        spool.put("t.1", b"x")
        spool.reject("t.1", "why")
        assert stat.S_IMODE(os.stat(tmp_path / "spool").st_mode) == 0o700
        assert stat.S_IMODE(os.stat(tmp_path / "spool" / "rejected").st_mode) == 0o700
        for path in [tmp_path / "spool" / ".lock", *(tmp_path / "spool" / "rejected").iterdir()]:
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o600, path
    finally:
        spool.unlock()


def test_lock_tightens_a_spool_left_open_by_an_older_agent(tmp_path: Path) -> None:
    directory = tmp_path / "spool"
    (directory / "rejected").mkdir(parents=True)
    (directory / "t.1.json").write_text("{}")
    (directory / "rejected" / "t.0.json").write_text("{}")
    os.chmod(directory, 0o755)
    os.chmod(directory / "rejected", 0o777)
    os.chmod(directory / "t.1.json", 0o644)
    os.chmod(directory / "rejected" / "t.0.json", 0o666)
    spool = Spool(directory)
    spool.lock()
    spool.unlock()
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(directory / "rejected").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(directory / "t.1.json").st_mode) == 0o600
    assert stat.S_IMODE(os.stat(directory / "rejected" / "t.0.json").st_mode) == 0o600
    assert [p.body for p in spool.pending()] == [b"{}"]  # nothing lost


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_a_spool_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    directory = tmp_path / "spool"
    directory.mkdir()
    nobody = pwd.getpwnam("nobody")
    os.chown(directory, nobody.pw_uid, nobody.pw_gid)
    with pytest.raises(SpoolUnsafe, match="is not a directory owned by the agent's user"):
        Spool(directory).lock()


# -- records beside the reports ------------------------------------------------------------------------


def test_records_live_in_a_directory_of_their_own_and_are_no_reports(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    records = spool.records("held")
    records.put("b.1", b"second")
    records.put("a.1", b"first")
    records.put("a.1", b"first, replaced")
    assert records.items() == [("a.1", b"first, replaced"), ("b.1", b"second")]
    assert sorted(p.name for p in (tmp_path / "held").iterdir()) == ["a.1.json", "b.1.json"]
    assert spool.pending() == []
    assert Spool(tmp_path).records("held").items() == records.items()  # survive reopening
    records.remove("a.1")
    records.remove("a.1")
    assert records.items() == [("b.1", b"second")]


@pytest.mark.parametrize("kind", ["rejected", "", "a.1", "../up", "Held"])
def test_a_kind_of_records_is_never_a_report_nor_outside_the_spool(tmp_path: Path, kind: str) -> None:
    with pytest.raises(ValueError, match="invalid kind of spool records"):
        Spool(tmp_path).records(kind)


def test_lock_tightens_records_and_clears_their_half_written_files(tmp_path: Path) -> None:
    directory = tmp_path / "spool"
    (directory / "groups").mkdir(parents=True)
    (directory / "groups" / "1.2.json").write_text("{}")
    (directory / "groups" / ".1.2.json.abc.tmp").write_text("{")
    os.chmod(directory / "groups", 0o755)
    os.chmod(directory / "groups" / "1.2.json", 0o644)
    spool = Spool(directory)
    spool.lock()
    spool.unlock()
    assert stat.S_IMODE(os.stat(directory / "groups").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(directory / "groups" / "1.2.json").st_mode) == 0o600
    assert sorted(p.name for p in (directory / "groups").iterdir()) == ["1.2.json"]


def test_remove_all_forgets_the_reports_named_and_skips_those_gone(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    for key in ("a.1", "b.1", "c.1"):
        spool.put(key, b"{}")
    spool.remove_all(["a.1", "c.1", "gone.1"])
    assert [r.key for r in spool.pending()] == ["b.1"]
    spool.remove_all([])
    assert [r.key for r in spool.pending()] == ["b.1"]
