"""The dashboard token `devsched up` keeps in the state directory: private, reused, rotated on demand."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from devsched.devstack.tokens import TOKEN_FILE, TokenStoreError, kept_token, state_dir


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_state_dir_follows_xdg_state_home(tmp_path: Path) -> None:
    assert state_dir({"XDG_STATE_HOME": str(tmp_path)}) == tmp_path / "devsched"
    assert state_dir({"XDG_STATE_HOME": "relative/dir"}) == Path.home() / ".local" / "state" / "devsched"
    assert state_dir({}) == Path.home() / ".local" / "state" / "devsched"


def test_a_new_token_is_private_and_the_next_run_reuses_it(tmp_path: Path) -> None:
    directory = tmp_path / "state" / "devsched"
    first = kept_token(directory)
    assert first.new_because == "there was none"
    assert first.path == directory / TOKEN_FILE
    assert (mode(directory), mode(first.path)) == (0o700, 0o600)
    assert first.path.read_text() == first.token + "\n"
    assert len(first.token) >= 32

    again = kept_token(directory)
    assert (again.token, again.new_because) == (first.token, None)

    rotated = kept_token(directory, rotate=True)
    assert rotated.new_because == "--rotate-web-token"
    assert rotated.token != first.token
    assert first.path.read_text() == rotated.token + "\n"
    assert mode(first.path) == 0o600
    assert [p.name for p in directory.iterdir()] == [TOKEN_FILE]  # no partial file left


def test_a_token_others_could_read_is_replaced(tmp_path: Path) -> None:
    first = kept_token(tmp_path)
    first.path.chmod(0o644)
    replaced = kept_token(tmp_path)
    assert replaced.new_because == "the kept one was readable by others (mode 0644)"
    assert replaced.token != first.token
    assert mode(replaced.path) == 0o600


def test_a_directory_others_could_read_is_closed(tmp_path: Path) -> None:
    first = kept_token(tmp_path / "d")
    (tmp_path / "d").chmod(0o755)
    again = kept_token(tmp_path / "d")
    assert again.token == first.token  # the file itself was private
    assert again.tightened == f"{tmp_path / 'd'} was open to others (mode 0755): now 0700"
    assert mode(tmp_path / "d") == 0o700


@pytest.mark.parametrize("where", ["directory", "file"])
def test_a_place_others_could_write_is_refused_and_left_alone(tmp_path: Path, where: str) -> None:
    first = kept_token(tmp_path / "d")
    target = tmp_path / "d" if where == "directory" else first.path
    target.chmod(0o777 if where == "directory" else 0o622)
    with pytest.raises(TokenStoreError, match="writable by others"):
        kept_token(tmp_path / "d")
    assert first.path.read_text() == first.token + "\n"
    assert mode(target) == (0o777 if where == "directory" else 0o622)


def test_a_link_in_place_of_the_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir(mode=0o700)
    (tmp_path / "elsewhere").write_text("x" * 40)
    (tmp_path / "d" / TOKEN_FILE).symlink_to(tmp_path / "elsewhere")
    with pytest.raises(TokenStoreError, match="not a regular file"):
        kept_token(tmp_path / "d")
    assert (tmp_path / "elsewhere").read_text() == "x" * 40
