"""The rule of what a step's environment holds (`step_env.step_environment`), as a pure function."""

from __future__ import annotations

import pytest

from devsched.agent.step_env import DEFAULT_PATH, StepEnvError, passed_through, step_environment

from .helpers import IDENTITY

pytestmark = pytest.mark.unit

AGENT_ENV = {
    "PATH": "/opt/tools/bin:/usr/bin",
    "HOME": "/home/agent",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "LC_TIME": "en_GB.UTF-8",
    "DEVSCHED_NATS_URL": "nats://host-1:s3cr3t@nats:4222",
    "DEVSCHED_NATS_CREDS": "/etc/devsched/agent.creds",
    "NATS_CREDENTIALS": "host-1:s3cr3t",
    "AWS_SECRET_ACCESS_KEY": "k",
    "TMPDIR": "/var/tmp/agent",
    "LD_PRELOAD": "/agent/lib.so",
    "PYTHONPATH": "/agent",
}


def test_only_path_home_locale_tmpdir_and_identity_pass_from_the_agent() -> None:
    env = step_environment(AGENT_ENV, tmpdir="/w/t.1", identity_env=IDENTITY.env())
    assert env == {
        "PATH": "/opt/tools/bin:/usr/bin",
        "HOME": "/home/agent",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "LC_TIME": "en_GB.UTF-8",
        "TMPDIR": "/w/t.1",
        **IDENTITY.env(),
    }


def test_the_artifacts_directory_is_given_and_cannot_be_forged() -> None:
    forged = {"DEVSCHED_ARTIFACTS_DIR": "/etc"}
    env = step_environment(AGENT_ENV, tmpdir="/w/t.1", device_env=forged, step_env=forged, artifacts_dir="/w/t.1/a")
    assert env["DEVSCHED_ARTIFACTS_DIR"] == "/w/t.1/a"
    assert "DEVSCHED_ARTIFACTS_DIR" not in step_environment(AGENT_ENV, tmpdir="/w/t.1")  # outside an attempt


def test_nothing_secret_of_the_agent_survives() -> None:
    env = step_environment(AGENT_ENV, tmpdir="/w/t.1")
    assert not any("s3cr3t" in value for value in env.values())
    assert not [name for name in env if name.startswith("DEVSCHED_")]


def test_identity_wins_over_step_env_over_device_env_over_the_agent() -> None:
    env = step_environment(
        AGENT_ENV,
        tmpdir="/w/t.1",
        device_env={"SHARED": "device", "ANDROID_SERIAL": "33ab12", "PATH": "/device/bin", "DEVSCHED_TASK_ID": "x"},
        step_env={"SHARED": "step", "LANG": "fr_FR.UTF-8", "DEVSCHED_LEASE_ID": "forged"},
        identity_env=IDENTITY.env(),
    )
    assert env["SHARED"] == "step"
    assert env["ANDROID_SERIAL"] == "33ab12"
    assert env["PATH"] == "/device/bin"  # the device's env over what is passed through
    assert env["LANG"] == "fr_FR.UTF-8"
    assert env["DEVSCHED_TASK_ID"] == IDENTITY.task_id  # neither a device nor a plan forges the identity
    assert env["DEVSCHED_LEASE_ID"] == IDENTITY.lease_id


def test_a_step_may_choose_its_own_tmpdir() -> None:
    assert step_environment({}, tmpdir="/w/t.1", step_env={"TMPDIR": "/mine"})["TMPDIR"] == "/mine"


def test_an_agent_without_path_or_home_gives_sane_defaults() -> None:
    env = step_environment({}, tmpdir="/w/t.1")
    assert env == {"PATH": DEFAULT_PATH, "HOME": "/w/t.1", "TMPDIR": "/w/t.1"}
    assert step_environment({"PATH": "", "HOME": ""}, tmpdir="/w/t.1") == env


def test_the_step_users_home_replaces_the_agents() -> None:
    assert step_environment(AGENT_ENV, tmpdir="/w/t.1", home="/home/steps")["HOME"] == "/home/steps"


def test_the_inputs_are_not_changed() -> None:
    base, device, step = dict(AGENT_ENV), {"A": "1"}, {"B": "2"}
    step_environment(base, tmpdir="/w", device_env=device, step_env=step, identity_env=IDENTITY.env())
    assert (base, device, step) == (AGENT_ENV, {"A": "1"}, {"B": "2"})


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"": "x"}, "invalid variable name ''"),
        ({"A=B": "x"}, "invalid variable name 'A=B'"),
        ({"A\0": "x"}, "invalid variable name"),
        ({"A": "x\0y"}, "variable 'A' contains a NUL byte"),
    ],
)
def test_a_variable_that_cannot_be_in_an_environment_is_refused_by_name(env: dict[str, str], message: str) -> None:
    with pytest.raises(StepEnvError, match=r"^step env: ") as info:
        step_environment({}, tmpdir="/w", step_env=env)
    assert message in str(info.value)
    with pytest.raises(StepEnvError, match=r"^device env: "):
        step_environment({}, tmpdir="/w", device_env=env)


@pytest.mark.parametrize(
    ("name", "passes"),
    [
        ("PATH", True),
        ("HOME", True),
        ("LANG", True),
        ("LC_CTYPE", True),
        ("LANGUAGE", False),
        ("TMPDIR", False),
        ("USER", False),
        ("DEVSCHED_NATS_URL", False),
        ("path", False),
    ],
)
def test_passed_through(name: str, passes: bool) -> None:
    assert passed_through(name) is passes
