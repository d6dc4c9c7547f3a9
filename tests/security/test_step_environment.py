"""A step cannot act as its host: it sees a clean environment and, as `step_user`, none of the agent's secrets.

The real agent runs tasks through the real scheduler and sweeper. It is started with secrets in its own
environment (a NATS URL with a password, a sentinel variable, an unrelated variable) and a NATS
credentials file holding a known secret. Steps dump their environment and try to read the credentials
file, the spool and `/proc/<agent pid>/environ`; the test reads the steps' output tails in the task's
result. Output tails are 4 KiB, so each probe prints little.
"""

from __future__ import annotations

import asyncio
import json
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client as NatsClient

from devsched.agent.workspace import workspace_name
from support.agent_e2e import (
    AgentLab,
    AgentProcess,
    Plane,
    ensure_step_user,
    shell,
    step_statuses,
    step_user_dir,
)
from support.polling import eventually

pytestmark = [pytest.mark.security, pytest.mark.e2e]

TTL_S = 5
IDENTITY_VARS = {"DEVSCHED_TASK_ID", "DEVSCHED_ATTEMPT", "DEVSCHED_LEASE_ID", "DEVSCHED_DEVICE_ID"}
#: What `/bin/sh` adds to the environment it was given (dash: PWD; bash would add SHLVL and _).
SHELL_VARS = {"PWD", "SHLVL", "_", "OLDPWD"}


@pytest.fixture
async def lab(agent_plane: Plane, nc: NatsClient, tmp_path: Path) -> AsyncIterator[AgentLab]:
    """This test's corner of the module's control plane; its agents are stopped after the test."""
    lab = AgentLab(nc, agent_plane, tmp_path)
    yield lab
    await asyncio.to_thread(lab.stop)


class Secrets:
    """What the agent knows and no step may learn."""

    def __init__(self, workdir: Path, nats_url: str) -> None:
        tag = uuid.uuid4().hex
        #: In the agent's environment only.
        self.sentinel = f"s3cr3t-env-{tag}"
        #: A password in a URL in the agent's environment (the agent itself refuses credentials in its own
        #: DEVSCHED_NATS_URL, so this stands for whatever else an agent's environment may carry).
        self.password = f"s3cr3t-pw-{tag}"
        #: In the credentials file only.
        self.creds_secret = f"s3cr3t-creds-{tag}"
        self.unrelated = f"UNRELATED_{tag[:8].upper()}"
        host_port = nats_url.split("://", 1)[1]
        self.env = {
            "DEVSCHED_NATS_PASSWORD_SENTINEL": self.sentinel,
            "DEVSCHED_NATS_URL": f"nats://{host_port}",
            "NATS_URL": f"nats://host:{self.password}@{host_port}",
            self.unrelated: "agent-only",
            "LANG": "C.UTF-8",
            "LC_MESSAGES": "C",
        }
        self.creds = workdir / "agent.creds"
        workdir.mkdir(parents=True, exist_ok=True)
        # The shape of a NATS creds file: the test server ignores it, the agent reads and sends it.
        self.creds.write_text(
            "-----BEGIN NATS USER JWT-----\n"
            f"eyJ0eXAiOiJKV1QifQ.{self.creds_secret}\n"
            "------END NATS USER JWT------\n\n"
            "-----BEGIN USER NKEY SEED-----\n"
            f"SU{self.creds_secret}\n"
            "------END USER NKEY SEED------\n"
        )
        os.chmod(self.creds, 0o600)

    @property
    def values(self) -> list[str]:
        """Every secret, to look for in output."""
        return [self.sentinel, self.password, self.creds_secret, self.unrelated]


def env_lines(output: str, prefix: str = "env:") -> dict[str, str]:
    """`NAME=VALUE` lines of a step's output that start with `prefix`."""
    found = {}
    for line in output.splitlines():
        if line.startswith(prefix) and "=" in line:
            name, value = line[len(prefix) :].split("=", 1)
            found[name] = value
    return found


def expected_names(agent_env: dict[str, str], *extra: str) -> set[str]:
    """The variables a step may see: PATH, HOME, LANG, LC_* of the agent, TMPDIR, the identity, the artifacts
    directory, `extra`."""
    passed = {n for n in agent_env if n in ("PATH", "HOME", "LANG") or n.startswith("LC_")}
    return passed | {"PATH", "HOME", "TMPDIR", "DEVSCHED_ARTIFACTS_DIR"} | IDENTITY_VARS | set(extra)


def agent_environment(secrets: Secrets) -> dict[str, str]:
    """The environment the agent process gets (what `AgentProcess.start` builds)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEVSCHED_")}
    return {**env, "PYTHONUNBUFFERED": "1", **secrets.env}


def host_dir(work_dir: Path, agent: AgentProcess) -> Path:
    """The agent's own directory under `work_dir`, which holds its attempts' directories."""
    return work_dir / workspace_name(agent.host_id, agent.spool_dir)


def present(path: str | Path) -> bool:
    """Whether anything (even a dangling symlink) is at `path`."""
    return os.path.lexists(path)


def steps_output(view: dict[str, Any]) -> str:
    """Every step's output tail, joined."""
    return "\n".join(s["output_tail"] for s in view["result"]["steps"])


ENV_DUMP = 'env | LC_ALL=C sort | sed "s/^/env:/"'
TMPDIR_PROBE = 'stat -c "tmpdir:mode=%a uid=%u" "$TMPDIR"; echo "tmpdir:path=$TMPDIR"; echo "cwd=$(pwd)"'


async def test_a_step_sees_exactly_the_allowed_variables_and_a_tmpdir_of_its_attempt(
    lab: AgentLab, tmp_path: Path
) -> None:
    secrets = Secrets(tmp_path / "secrets", lab.plane.nats_url)
    work_dir = tmp_path / "work"
    agent = await lab.agent(
        "d1",
        env={"DEVICE_VAR": "from-device"},
        agent_env=secrets.env,
        nats_creds=secrets.creds,
        work_dir=work_dir,
    ).ready()
    dump = shell("dump", f'{ENV_DUMP}; {TMPDIR_PROBE}; echo kept > "$TMPDIR/kept"')
    dump["args"]["env"] = {"STEP_VAR": "from-step"}
    task_id = await lab.submit(
        [dump, shell("second", 'cat "$TMPDIR/kept"; echo "tmpdir:second=$TMPDIR"')], lease_ttl_s=TTL_S
    )
    view = await lab.wait_status(task_id, "done", "failed")
    assert view["status"] == "done", view["result"]
    output = steps_output(view)
    for secret in secrets.values:
        assert secret not in output, f"the agent's secret {secret!r} reached a step"

    env = env_lines(output)
    shell_added = set(env) & SHELL_VARS
    assert set(env) - shell_added == expected_names(agent_environment(secrets), "DEVICE_VAR", "STEP_VAR")
    assert (env["DEVICE_VAR"], env["STEP_VAR"]) == ("from-device", "from-step")
    assert env["DEVSCHED_TASK_ID"] == task_id
    assert env["DEVSCHED_DEVICE_ID"] == lab.device("d1")
    assert (env["LANG"], env["LC_MESSAGES"]) == ("C.UTF-8", "C")

    # TMPDIR: the attempt's own directory under work_dir, 0700, shared by the attempt's steps, gone after.
    tmpdir = Path(env["TMPDIR"])
    assert tmpdir == host_dir(work_dir, agent) / f"{task_id}.1"
    probe = env_lines(output, "tmpdir:")
    assert probe["mode"] == f"700 uid={os.geteuid()}"
    assert probe["second"] == str(tmpdir)
    assert "kept" in view["result"]["steps"][1]["output_tail"]  # one directory for the whole attempt
    assert f"cwd={tmpdir}" in output  # the default working directory
    assert env["DEVSCHED_ARTIFACTS_DIR"] == str(tmpdir / "artifacts")
    assert not present(tmpdir)  # removed before the report was sent
    assert [p.name for p in host_dir(work_dir, agent).iterdir()] == [".lock"]


async def test_the_attempt_directory_is_removed_when_a_step_is_cancelled(lab: AgentLab, tmp_path: Path) -> None:
    work_dir = tmp_path / "work"
    agent = await lab.agent("d1", work_dir=work_dir).ready()
    started = lab.path("started")
    task_id = await lab.submit(
        [shell("long", f'echo "$TMPDIR" > {started}; exec sleep 600', interruptible=True)], lease_ttl_s=30
    )
    await eventually(lambda: started.exists() and started.read_text().strip(), timeout=20, message="step started")
    tmpdir = Path(started.read_text().strip())
    assert present(tmpdir)
    await lab.cancel(task_id)
    view = await lab.wait_status(task_id, "cancelled", within=15)
    assert step_statuses(view) == [("long", "interrupted")]
    assert not present(tmpdir)
    assert [p.name for p in host_dir(work_dir, agent).iterdir()] == [".lock"]


async def _held_attempt_dir(lab: AgentLab, marker: Path) -> Path:
    """Wait until a step has written `$$ $TMPDIR` to `marker`; its TMPDIR (which must exist)."""

    def written() -> list[str] | None:
        words = marker.read_text().split() if marker.exists() else []
        return words if len(words) == 2 else None

    words = await eventually(written, timeout=20, message=f"{marker} written")
    assert words is not None
    tmpdir = Path(words[1])
    assert present(tmpdir)
    return tmpdir


async def test_the_attempt_directory_is_removed_after_a_step_timeout(lab: AgentLab, tmp_path: Path) -> None:
    agent = await lab.agent("d1", work_dir=tmp_path / "work").ready()
    marker = lab.path("held")
    task_id = await lab.submit(
        [shell("hang", f'echo "$$ $TMPDIR" > {marker}; exec sleep 600', timeout_s=1)], lease_ttl_s=TTL_S
    )
    tmpdir = await _held_attempt_dir(lab, marker)
    view = await lab.wait_status(task_id, "failed")
    assert step_statuses(view) == [("hang", "timed_out")]
    assert not present(tmpdir)
    assert [p.name for p in host_dir(tmp_path / "work", agent).iterdir()] == [".lock"]


async def test_the_attempt_directory_is_removed_when_the_lease_is_lost(lab: AgentLab, tmp_path: Path) -> None:
    agent = await lab.agent("d1", work_dir=tmp_path / "work").ready()
    marker = lab.path("held")
    await lab.submit(
        [shell("wait", f'echo "$$ $TMPDIR" > {marker}; exec sleep 600', interruptible=True)], lease_ttl_s=3
    )
    tmpdir = await _held_attempt_dir(lab, marker)
    # No renewal succeeds while the scheduler is stopped: the agent stops the step at its local deadline.
    with lab.plane.scheduler.paused():
        await eventually(lambda: not present(tmpdir), timeout=15, message="attempt directory removed")
    # the directory goes before the attempt's end is logged
    await eventually(lambda: agent.lines("attempt ended", outcome="failed"), timeout=15, message="attempt ended failed")


async def test_the_attempt_directory_is_removed_when_the_agent_shuts_down(lab: AgentLab, tmp_path: Path) -> None:
    agent = await lab.agent("d1", work_dir=tmp_path / "work").ready()
    marker = lab.path("held")
    # Not interruptible: only the shutdown's kill, after shutdown_grace_s and stop_grace_s, stops it.
    await lab.submit([shell("long", f'echo "$$ $TMPDIR" > {marker}; exec sleep 600')], lease_ttl_s=TTL_S)
    tmpdir = await _held_attempt_dir(lab, marker)
    assert await asyncio.to_thread(agent.stop) == [0]  # SIGTERM, and a clean exit
    assert not present(tmpdir)
    assert [p.name for p in host_dir(tmp_path / "work", agent).iterdir()] == [".lock"]


async def test_directories_a_killed_agent_left_are_removed_at_its_next_start(lab: AgentLab, tmp_path: Path) -> None:
    work_dir = tmp_path / "work"
    agent = await lab.agent("d1", work_dir=work_dir).ready()
    started, gate = lab.path("started"), lab.gate("never")
    task_id = await lab.submit(
        [shell("held", f'echo "$$ $TMPDIR" > {started}; echo junk > "$TMPDIR/junk"; {gate.wait}')],
        lease_ttl_s=TTL_S,
        max_attempts=1,
    )
    await eventually(lambda: started.exists() and len(started.read_text().split()) == 2, timeout=20, message="held")
    pid, tmpdir = started.read_text().split()
    await asyncio.to_thread(agent.process.kill)  # SIGKILL, a crash: nothing of the agent's cleans up
    os.killpg(int(pid), signal.SIGKILL)  # the orphaned step, which no agent supervises any more
    assert present(Path(tmpdir, "junk"))

    agent.start()
    await agent.ready()
    line = await agent.wait_line("removed attempt directories left by an earlier agent")
    assert line["removed"] == f"{task_id}.1"
    assert not present(tmpdir)


# -- as step_user --------------------------------------------------------------------------------------


@pytest.fixture
def step_user() -> pwd.struct_passwd:
    """The dedicated unprivileged user (skips unless root)."""
    return ensure_step_user()


@pytest.fixture
def reachable(step_user: pwd.struct_passwd) -> Iterator[Path]:
    """A directory the step user can reach: `work/` for the agent's work_dir, `marks/` for its markers."""
    with step_user_dir(step_user) as path:
        yield path


PROBES = (
    'echo "uid=$(id -u) gid=$(id -g) groups=$(id -G)"; echo "ppid=$PPID"; echo "home=$HOME"; '
    "cat {creds} >/dev/null 2>&1 && echo creds:READ || echo creds:denied; cat {creds} 2>&1 | head -c 200; "
    "ls -a {spool} 2>&1 | head -c 200; echo; "
    "ls {spool} >/dev/null 2>&1 && echo spool:LISTED || echo spool:denied; "
    "cat {spool}/.lock >/dev/null 2>&1 && echo lock:READ || echo lock:denied; "
    "touch {spool}/planted.json 2>/dev/null && echo spool:WRITTEN || echo spool:unwritable; "
    "cat /proc/$PPID/environ >/dev/null 2>&1 && echo environ:READ || echo environ:denied; "
    "tr '\\0' '\\n' < /proc/$PPID/environ 2>&1 | head -c 200; echo; "
    "kill -0 $PPID 2>/dev/null && echo agent:SIGNALLABLE || echo agent:unsignallable; "
    f"{TMPDIR_PROBE}"
)


async def test_a_step_user_cannot_read_the_credentials_the_spool_or_the_agents_environ(
    lab: AgentLab, tmp_path: Path, step_user: pwd.struct_passwd, reachable: Path
) -> None:
    secrets = Secrets(tmp_path / "secrets", lab.plane.nats_url)
    work_dir = reachable / "work"
    agent = await lab.agent(
        "d1", agent_env=secrets.env, nats_creds=secrets.creds, work_dir=work_dir, step_user=step_user.pw_name
    ).ready()
    agent_pid = agent.process.pid
    assert agent_pid is not None
    probes = PROBES.format(creds=secrets.creds, spool=agent.spool_dir)
    task_id = await lab.submit([shell("dump", ENV_DUMP), shell("probe", probes)], lease_ttl_s=TTL_S)
    view = await lab.wait_status(task_id, "done", "failed")
    assert view["status"] == "done", view["result"]
    output = steps_output(view)
    for secret in secrets.values:
        assert secret not in output, f"the agent's secret {secret!r} reached a step"

    assert f"uid={step_user.pw_uid} gid={step_user.pw_gid} groups={step_user.pw_gid}\n" in output
    assert f"ppid={agent_pid}\n" in output  # the probes read the real agent's /proc entry
    for verdict in ("creds:denied", "spool:denied", "lock:denied", "spool:unwritable", "environ:denied"):
        assert verdict in output, output
    assert "agent:unsignallable" in output
    assert output.count("Permission denied") >= 3  # cat of the creds, ls of the spool, the environ
    assert not (agent.spool_dir / "planted.json").exists()

    env = env_lines(output)
    tmpdir = Path(env["TMPDIR"])
    assert set(env) - SHELL_VARS == expected_names(agent_environment(secrets))
    # --no-create-home: no home directory, so HOME is the attempt's own directory.
    assert env["HOME"] == str(tmpdir)
    assert env_lines(output, "tmpdir:")["mode"] == f"700 uid={step_user.pw_uid}"
    assert not present(tmpdir)

    # The agent's own files stay closed: the spool 0700, its reports and lock 0600.
    assert stat.S_IMODE(agent.spool_dir.stat().st_mode) == 0o700
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in agent.spool_dir.iterdir() if p.is_file())


async def test_cancelling_a_step_user_step_stops_its_process_group(
    lab: AgentLab, step_user: pwd.struct_passwd, reachable: Path
) -> None:
    agent = await lab.agent("d1", work_dir=reachable / "work", step_user=step_user.pw_name).ready()
    marks = reachable / "marks"
    started, pid_file, teardown = marks / "started", marks / "pid", marks / "teardown"
    # A background child too: the whole group must go, not only the shell.
    long = f"sleep 600 & echo $$ > {pid_file}; touch {started}; wait"
    task_id = await lab.submit(
        [shell("long", long, interruptible=True), shell("teardown", f"touch {teardown}", always=True)],
        lease_ttl_s=30,
    )
    await eventually(started.exists, timeout=20, message="long step started")
    pgid = int(pid_file.read_text())
    assert os.stat(f"/proc/{pgid}").st_uid == step_user.pw_uid
    await lab.cancel(task_id)
    view = await lab.wait_status(task_id, "cancelled", within=15)
    assert step_statuses(view) == [("long", "interrupted"), ("teardown", "done")]
    assert agent.lines("nudged: renewing now", task_id=task_id)
    assert os.stat(teardown).st_uid == step_user.pw_uid  # the `always` step ran, as the step user

    def group_gone() -> bool:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        return False

    await eventually(group_gone, timeout=10, message=f"process group {pgid} of the step user stopped")


async def _refused(agent: AgentProcess) -> tuple[int, list[dict[str, Any]]]:
    code = await agent.process.wait_exit(30)
    return code, agent.lines("invalid agent config")


async def test_an_agent_refuses_a_step_user_that_could_read_its_credentials(
    lab: AgentLab, tmp_path: Path, step_user: pwd.struct_passwd, reachable: Path
) -> None:
    secrets = Secrets(tmp_path / "secrets", lab.plane.nats_url)
    os.chmod(secrets.creds, 0o644)
    agent = lab.agent("d1", nats_creds=secrets.creds, work_dir=reachable / "work", step_user=step_user.pw_name)
    code, lines = await _refused(agent)
    assert code == 2
    assert [line["error"] for line in lines] == [
        f"nats_creds {secrets.creds} is readable by step_user {step_user.pw_name!r} (mode 0644, uid 0): "
        "make it owned by the agent with mode 0600 or 0400"
    ]


async def test_an_agent_refuses_a_step_user_that_does_not_exist(lab: AgentLab, tmp_path: Path) -> None:
    agent = lab.agent("d1", work_dir=tmp_path / "work", step_user="no-such-user-devsched")
    code, lines = await _refused(agent)
    assert code == 2
    assert [line["error"] for line in lines] == ["step_user 'no-such-user-devsched': no such user on this host"]


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux) to drop a capability")
async def test_an_agent_without_cap_kill_refuses_a_step_user(
    lab: AgentLab, step_user: pwd.struct_passwd, reachable: Path
) -> None:
    # Root, but like a container that dropped CAP_KILL: it could start steps as the user, never stop them.
    agent = AgentProcess(
        lab.workdir / "nocap",
        host_id=f"nocap-{lab.tag}",
        devices=[],
        nats_url=lab.plane.nats_url,
        prefix=lab.prefix,
        work_dir=reachable / "work",
        step_user=step_user.pw_name,
    )
    command = ["setpriv", "--bounding-set", "-kill", "--", sys.executable, "-m", "devsched.agent.main"]
    done = await asyncio.to_thread(
        subprocess.run, [*command, "--config", str(agent.config_path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done.stderr
    errors = [json.loads(line) for line in done.stderr.splitlines() if '"invalid agent config"' in line]
    assert [e["error"] for e in errors] == [
        f"step_user {step_user.pw_name!r}: the agent cannot run steps as another user without CAP_KILL "
        "(run it as root, or grant those capabilities)"
    ]
