"""The agent's side of artifacts (issue 12): what the walk finds and refuses, and the caps it checks first."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from devsched.agent.uploads import Found, UploadLimits, is_empty, scan

pytestmark = pytest.mark.unit


def test_the_walk_lists_files_without_following_links(tmp_path: Path) -> None:
    (tmp_path / "sub" / "deeper").mkdir(parents=True)
    (tmp_path / "a.txt").write_text("a")
    (tmp_path / "sub" / "deeper" / "b.bin").write_bytes(b"bb")
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir()
    (outside / "secret").write_text("s")
    os.symlink(outside, tmp_path / "linked-dir")
    os.symlink(outside / "secret", tmp_path / "linked-file")
    os.mkfifo(tmp_path / "pipe")
    found = {f.name: f for f in scan(tmp_path)}
    assert set(found) == {"a.txt", "sub/deeper/b.bin", "linked-dir", "linked-file", "pipe"}
    assert found["a.txt"].refused is None
    assert found["sub/deeper/b.bin"].stamp[0] == 2
    assert "symbolic link" in (found["linked-dir"].refused or "")
    assert "symbolic link" in (found["linked-file"].refused or "")
    assert found["pipe"].refused == "not a regular file"
    assert not any("secret" in name for name in found), "nothing beyond a link is listed"


def test_a_changed_file_has_another_stamp(tmp_path: Path) -> None:
    path = tmp_path / "a"
    path.write_text("one")
    before = scan(tmp_path)[0].stamp
    path.write_text("three")
    assert scan(tmp_path)[0].stamp != before


def test_caps_are_checked_before_sending(tmp_path: Path) -> None:
    from devsched.agent.uploads import AttemptUploads

    uploads = AttemptUploads.__new__(AttemptUploads)
    uploads._limits = UploadLimits(max_file_bytes=10, max_attempt_bytes=15)
    uploads._sizes = {"old": 8}
    assert uploads._over_cap(Found("big", (11, 0, 0))) is not None
    assert "per-file cap" in (uploads._over_cap(Found("big", (11, 0, 0))) or "")
    assert "per-attempt cap" in (uploads._over_cap(Found("new", (8, 0, 0))) or "")
    assert uploads._over_cap(Found("old", (10, 0, 0))) is None, "a replaced file counts once"
    assert uploads._over_cap(Found("new", (7, 0, 0))) is None


def test_an_empty_directory_needs_no_walk(tmp_path: Path) -> None:
    assert is_empty(tmp_path)
    (tmp_path / "sub").mkdir()
    assert not is_empty(tmp_path), "a subdirectory may hold files: the walk looks"
    assert not is_empty(tmp_path / "missing"), "an unreadable directory is left to the walk, which says why"
