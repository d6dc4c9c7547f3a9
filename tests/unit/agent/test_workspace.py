"""Per-attempt directories, the step user and the checks at start (`workspace`), and their config keys."""

from __future__ import annotations

import fcntl
import os
import pwd
import stat
from pathlib import Path
from typing import Any

import pytest

from devsched.agent.config import AgentConfig, ConfigError, default_work_dir, parse_config
from devsched.agent.steps import StepUser
from devsched.agent.workspace import (
    ARTIFACTS,
    CAP_CHOWN,
    CAP_DAC_OVERRIDE,
    CAP_KILL,
    CAP_SETGID,
    CAP_SETUID,
    LOCK_FILE,
    Workspace,
    WorkspaceLocked,
    artifacts_dir,
    can_pass,
    check_secret_files,
    effective_capabilities,
    missing_capabilities,
    resolve_step_user,
    workspace_name,
)

pytestmark = pytest.mark.unit

ALL_NEEDED = sum(1 << cap for cap in (CAP_CHOWN, CAP_DAC_OVERRIDE, CAP_KILL, CAP_SETGID, CAP_SETUID))
ALL_NAMES = ["CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_KILL", "CAP_SETGID", "CAP_SETUID"]
#: A user that exists on every Debian-like system and is neither root nor (in CI) the agent.
NOBODY = pwd.getpwnam("nobody")


def config(tmp_path: Path, **keys: Any) -> AgentConfig:
    return parse_config({"host_id": "h1", "spool_dir": str(tmp_path / "spool"), **keys})


def user_of(entry: pwd.struct_passwd, home: str | None = None) -> StepUser:
    return StepUser(entry.pw_name, entry.pw_uid, entry.pw_gid, home)


# -- config keys -----------------------------------------------------------------------------------------


def test_work_dir_defaults_under_the_system_temp_dir_and_step_user_to_none(tmp_path: Path) -> None:
    loaded = config(tmp_path)
    assert loaded.work_dir == default_work_dir()
    assert loaded.work_dir.name == "devsched-agent"
    assert loaded.step_user is None


@pytest.mark.parametrize(
    ("spool", "work"), [("s", "s"), ("s", "s/work"), ("s/../s", "s/w"), ("w/spool", "w"), ("./s", "s")]
)
def test_work_dir_and_spool_dir_may_not_contain_each_other(tmp_path: Path, spool: str, work: str) -> None:
    with pytest.raises(ConfigError, match=r"work_dir .* and spool_dir .* must not contain each other"):
        parse_config({"host_id": "h1", "spool_dir": str(tmp_path / spool), "work_dir": str(tmp_path / work)})


def test_siblings_are_fine(tmp_path: Path) -> None:
    loaded = config(tmp_path, work_dir=str(tmp_path / "spool-work"))
    assert loaded.work_dir == tmp_path / "spool-work"


@pytest.mark.parametrize("name", ["", "1abc", "a b", "a/b", "x" * 33, "$(id)"])
def test_step_user_must_look_like_a_user_name(tmp_path: Path, name: str) -> None:
    with pytest.raises(ConfigError, match=r"step_user: String should match pattern"):
        config(tmp_path, step_user=name)


# -- the step user ---------------------------------------------------------------------------------------


def test_capabilities_are_read_from_the_status_file() -> None:
    assert effective_capabilities("Name:\tx\nCapEff:\t00000000000000e0\n") == 0xE0
    assert effective_capabilities("Name:\tx\n") is None
    assert effective_capabilities() is not None  # this machine has /proc


def test_missing_capabilities_are_named() -> None:
    assert missing_capabilities(ALL_NEEDED, euid=1000) == []
    some = 1 << CAP_SETUID | 1 << CAP_CHOWN
    assert missing_capabilities(some, euid=0) == ["CAP_DAC_OVERRIDE", "CAP_KILL", "CAP_SETGID"]
    assert missing_capabilities(None, euid=0) == []
    assert missing_capabilities(None, euid=1000) == ALL_NAMES


def test_a_step_user_resolves_to_its_ids_and_existing_home() -> None:
    user = resolve_step_user("nobody", euid=0, capabilities=ALL_NEEDED)
    assert (user.name, user.uid, user.gid) == ("nobody", NOBODY.pw_uid, NOBODY.pw_gid)
    assert user.home == (NOBODY.pw_dir if os.path.isdir(NOBODY.pw_dir) else None)  # /nonexistent: None


@pytest.mark.parametrize(
    ("name", "euid", "caps", "message"),
    [
        ("no-such-user-x", 0, ALL_NEEDED, "step_user 'no-such-user-x': no such user on this host"),
        ("root", 0, ALL_NEEDED, "step_user 'root' is root: steps must run as an unprivileged user"),
        ("nobody", NOBODY.pw_uid, ALL_NEEDED, "step_user 'nobody' is the agent's own user"),
        ("nobody", 10001, 0, f"without {', '.join(ALL_NAMES)} (run it as root, or grant"),
        ("nobody", 0, ALL_NEEDED & ~(1 << CAP_KILL), "without CAP_KILL (run it"),  # root in a container
    ],
)
def test_a_step_user_the_agent_cannot_use_is_one_clear_error(name: str, euid: int, caps: int, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        resolve_step_user(name, euid=euid, capabilities=caps)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_can_pass_follows_owner_then_group_then_others(tmp_path: Path) -> None:
    user = user_of(NOBODY)
    directory = tmp_path / "d"
    directory.mkdir()
    for mode, passes in [(0o700, False), (0o711, True), (0o701, True), (0o710, False)]:
        os.chmod(directory, mode)
        assert can_pass(os.stat(directory), user) is passes, oct(mode)


# -- secret files ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", [0o644, 0o604, 0o640, 0o660])
def test_a_credentials_file_open_to_others_is_refused_with_a_step_user(tmp_path: Path, mode: int) -> None:
    creds = tmp_path / "agent.creds"
    creds.write_text("secret")
    os.chmod(creds, mode)
    if mode & 0o007 == 0:
        if os.geteuid() != 0:
            pytest.skip("giving the file the step user's group needs root")
        os.chown(creds, -1, NOBODY.pw_gid)  # group-readable, and the group is the step user's
    with pytest.raises(ConfigError, match=rf"nats_creds {creds} is readable by step_user 'nobody' \(mode 0{mode:o}"):
        check_secret_files(config(tmp_path, nats_creds=str(creds)), user_of(NOBODY))


@pytest.mark.parametrize("field", ["nats_password_file", "nats_nkey_seed", "nats_tls_key"])
def test_every_secret_file_is_checked(tmp_path: Path, field: str) -> None:
    secret = tmp_path / "secret"
    secret.write_text("secret")
    os.chmod(secret, 0o644)
    extra: dict[str, str] = {field: str(secret)}
    if field == "nats_password_file":
        extra["nats_user"] = "host-1"
    if field == "nats_tls_key":
        extra["nats_tls_cert"] = str(secret)
    with pytest.raises(ConfigError, match=rf"{field} {secret} is readable by step_user 'nobody'"):
        check_secret_files(config(tmp_path, **extra), user_of(NOBODY))


def test_a_secret_readable_by_the_agents_group_only_is_closed_to_the_step_user(tmp_path: Path) -> None:
    # a Secret mounted with fsGroup: mode 0440, the agent's group; the step user runs with its own group only
    creds = tmp_path / "agent.creds"
    creds.write_text("secret")
    os.chmod(creds, 0o440)
    if os.stat(creds).st_gid == NOBODY.pw_gid:
        pytest.skip("this test's files already have the step user's group")
    check_secret_files(config(tmp_path, nats_creds=str(creds)), user_of(NOBODY))


def test_a_credentials_file_open_to_others_is_a_warning_without_a_step_user(tmp_path: Path) -> None:
    creds = tmp_path / "agent.creds"
    creds.write_text("secret")
    os.chmod(creds, 0o644)
    [warning] = check_secret_files(config(tmp_path, nats_creds=str(creds)), None)
    assert warning.startswith(f"nats_creds {creds} has mode 0644: group and others can read")


def test_a_closed_credentials_file_passes(tmp_path: Path) -> None:
    creds = tmp_path / "agent.creds"
    creds.write_text("secret")
    for mode in (0o600, 0o400):
        os.chmod(creds, mode)
        assert check_secret_files(config(tmp_path, nats_creds=str(creds)), user_of(NOBODY)) == []
    assert check_secret_files(config(tmp_path), user_of(NOBODY)) == []  # none configured


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_a_credentials_file_owned_by_the_step_user_is_refused(tmp_path: Path) -> None:
    creds = tmp_path / "agent.creds"
    creds.write_text("secret")
    os.chmod(creds, 0o600)
    os.chown(creds, NOBODY.pw_uid, NOBODY.pw_gid)
    with pytest.raises(ConfigError, match="is readable by step_user 'nobody'"):
        check_secret_files(config(tmp_path, nats_creds=str(creds)), user_of(NOBODY))


# -- the work directory ----------------------------------------------------------------------------------


def test_the_host_directory_is_named_after_the_host_and_its_spool(tmp_path: Path) -> None:
    name = workspace_name("bench-07", tmp_path / "spool")
    assert name.startswith("bench-07-")
    assert name == workspace_name("bench-07", tmp_path / "x" / ".." / "spool")  # the same spool
    assert name != workspace_name("bench-07", tmp_path / "other-spool")  # another agent of the same host id
    assert name != workspace_name("bench-08", tmp_path / "spool")


def test_open_creates_a_private_host_directory_and_locks_it(tmp_path: Path) -> None:
    workspace = Workspace(tmp_path / "work", "h1")
    assert workspace.open() == []
    try:
        assert stat.S_IMODE(os.stat(tmp_path / "work" / "h1").st_mode) == 0o700
        assert stat.S_IMODE(os.stat(tmp_path / "work" / "h1" / LOCK_FILE).st_mode) == 0o600
        with pytest.raises(WorkspaceLocked, match="is in use by another process"):
            Workspace(tmp_path / "work", "h1").open()
        other = Workspace(tmp_path / "work", "h2")  # another host beside it is fine
        other.open()
        other.close()
    finally:
        workspace.close()
    second = Workspace(tmp_path / "work", "h1")
    second.open()  # released by close
    second.close()


def test_open_removes_what_an_earlier_agent_left(tmp_path: Path) -> None:
    host_dir = tmp_path / "work" / "h1"
    (host_dir / "t.1" / "deep").mkdir(parents=True)
    (host_dir / "t.1" / "deep" / "f").write_text("x")
    (host_dir / "stray-file").write_text("x")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("x")
    (host_dir / "t.2").symlink_to(outside)  # a step's symlink: removed, never followed
    workspace = Workspace(tmp_path / "work", "h1")
    try:
        assert workspace.open() == ["stray-file", "t.1", "t.2"]
        assert list(workspace.leftovers()) == []
        assert (outside / "keep").exists()
    finally:
        workspace.close()


def test_attempt_directories_are_private_and_removed(tmp_path: Path) -> None:
    workspace = Workspace(tmp_path / "work", "h1")
    workspace.open()
    try:
        path = workspace.create("task-1", 2)
        assert path == tmp_path / "work" / "h1" / "task-1.2"
        st = os.stat(path)
        assert (stat.S_IMODE(st.st_mode), st.st_uid) == (0o700, os.geteuid())
        (path / "sub").mkdir()
        (path / "sub" / "f").write_text("x")
        (path / ARTIFACTS / "old.xml").write_text("x")
        assert workspace.create("task-1", 2) == path  # a redelivered attempt starts empty
        assert list(path.iterdir()) == [artifacts_dir(path)]  # but for its empty artifacts directory
        assert list(artifacts_dir(path).iterdir()) == []
        st = os.stat(artifacts_dir(path))
        assert (stat.S_IMODE(st.st_mode), st.st_uid) == (0o700, os.geteuid())
        assert workspace.remove(path) is True
        assert not path.exists()
        assert workspace.remove(path) is True  # gone already: fine
    finally:
        workspace.close()


@pytest.mark.parametrize("task_id", ["../x", "a/b", ".hidden", ""])
def test_attempt_directory_names_cannot_escape(tmp_path: Path, task_id: str) -> None:
    with pytest.raises(ValueError, match="invalid attempt directory name"):
        Workspace(tmp_path, "h1").attempt_dir(task_id, 1)


def test_a_work_dir_others_may_write_without_the_sticky_bit_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "work"
    root.mkdir()
    os.chmod(root, 0o777)
    with pytest.raises(ConfigError, match=r"is writable by others without the sticky bit \(mode 0777\)"):
        Workspace(root, "h1").open()
    os.chmod(root, 0o1777)  # like /tmp: others cannot rename what is ours
    workspace = Workspace(root, "h1")
    workspace.open()
    workspace.close()


def test_a_host_directory_left_too_open_is_tightened(tmp_path: Path) -> None:
    (tmp_path / "work" / "h1").mkdir(parents=True)
    os.chmod(tmp_path / "work" / "h1", 0o777)
    workspace = Workspace(tmp_path / "work", "h1")
    workspace.open()
    workspace.close()
    assert stat.S_IMODE(os.stat(tmp_path / "work" / "h1").st_mode) == 0o700


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_a_host_directory_of_another_user_is_refused(tmp_path: Path) -> None:
    (tmp_path / "work" / "h1").mkdir(parents=True)
    os.chown(tmp_path / "work" / "h1", NOBODY.pw_uid, NOBODY.pw_gid)
    with pytest.raises(ConfigError, match="is not a directory owned by the agent's user"):
        Workspace(tmp_path / "work", "h1").open()


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_with_a_step_user_the_host_directory_is_passable_and_attempt_dirs_are_its_own(passable: Path) -> None:
    base = passable
    workspace = Workspace(base / "work", "h1", user_of(NOBODY))
    workspace.open()
    try:
        assert stat.S_IMODE(os.stat(base / "work" / "h1").st_mode) == 0o711  # pass, not list
        path = workspace.create("t", 1)
        for directory in (path, artifacts_dir(path)):
            st = os.stat(directory)
            assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o700, NOBODY.pw_uid, NOBODY.pw_gid)
    finally:
        workspace.close()


def test_a_work_dir_the_step_user_cannot_reach_is_refused(tmp_path: Path) -> None:
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    os.chmod(closed, 0o700)
    with pytest.raises(ConfigError, match=rf"step_user 'nobody' cannot pass through {closed}"):
        Workspace(closed / "work", "h1", user_of(NOBODY)).open()


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_a_work_dir_inside_the_step_users_own_directory_is_refused(passable: Path) -> None:
    theirs = passable / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, NOBODY.pw_uid, NOBODY.pw_gid)
    with pytest.raises(ConfigError, match=rf"{theirs} belongs to step_user 'nobody'"):
        Workspace(theirs / "work", "h1", user_of(NOBODY)).open()


def test_the_lock_is_a_real_flock(tmp_path: Path) -> None:
    workspace = Workspace(tmp_path / "work", "h1")
    workspace.open()
    try:
        fd = os.open(tmp_path / "work" / "h1" / LOCK_FILE, os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
    finally:
        workspace.close()
