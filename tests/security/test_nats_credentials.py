"""NATS credentials come from files: a password never sits in the agent's URL, environment or logs.

A nats-server with password and nkey users runs on loopback. The real scheduler, sweeper and agent read
their user and password file from `DEVSCHED_NATS_USER` / `DEVSCHED_NATS_PASSWORD_FILE` (as the DaemonSet
gives them) and run a task whose step prints its whole environment; then the password is looked for in
that output, in the agent's `/proc/<pid>/environ` and command line, and in every log. A URL with
credentials is refused by the agent at start, from its file or from the environment.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import nkeys
import pytest

from devsched.agent.config import URL_CREDENTIALS_REFUSED
from devsched.client import Client
from devsched.client.errors import NatsUnreachable
from devsched.protocol.tls import NatsAccess, TlsConfigError, url_has_credentials
from devsched.service.flags import CommandLine
from devsched.service.settings import ServiceSettings, SettingsError
from support.scheduler_harness import ServiceProcess, service_env
from support.secured_nats import configured_nats

pytestmark = [pytest.mark.security, pytest.mark.e2e]

PREFIX = "devsched"
#: Distinctive, so that finding it anywhere is a finding.
PASSWORDS = {"scheduler": "sched-Zq81-secret", "sweeper": "sweep-Kk27-secret", "host-cred-1": "host-Xy93-secret"}


@dataclass(frozen=True)
class Secrets:
    """The server's address, a directory of password files, and an nkey user's seed file."""

    address: str
    files: Path
    nkey_seed: Path

    def password_file(self, user: str) -> Path:
        return self.files / f"{user}.password"


@pytest.fixture(scope="module")
def secured_nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secrets]:
    root = tmp_path_factory.mktemp("creds-nats")
    files = root / "secrets"
    files.mkdir(mode=0o700)
    for user, password in PASSWORDS.items():
        (files / f"{user}.password").write_text(password + "\n")  # a trailing newline, as `echo` writes
        (files / f"{user}.password").chmod(0o400)
    seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
    public = nkeys.from_seed(bytearray(seed)).public_key.decode()
    (files / "nkey.seed").write_bytes(seed + b"\n")
    users = ",\n".join(f'    {{"user": "{u}", "password": "{p}"}}' for u, p in PASSWORDS.items())
    auth = f'  "authorization": {{"users": [\n{users},\n    {{"nkey": "{public}"}}\n  ]}}'
    with configured_nats(root / "server", auth) as address:
        yield Secrets(address, files, files / "nkey.seed")


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("DEVSCHED_")}


def _file_env(secrets: Secrets, user: str) -> dict[str, str]:
    return {"DEVSCHED_NATS_USER": user, "DEVSCHED_NATS_PASSWORD_FILE": str(secrets.password_file(user))}


async def test_the_agent_connects_with_a_password_file_and_the_password_is_nowhere_else(
    secured_nats: Secrets, database_url: str, tmp_path: Path
) -> None:
    url = f"nats://{secured_nats.address}"  # no credentials in any URL
    scheduler = ServiceProcess(
        "devsched.scheduler",
        {**service_env(database_url, url, PREFIX, heartbeat_interval_s=1.0), **_file_env(secured_nats, "scheduler")},
        tmp_path / "scheduler.log",
    )
    sweeper = ServiceProcess(
        "devsched.sweeper",
        {**service_env(database_url, url, PREFIX), **_file_env(secured_nats, "sweeper")},
        tmp_path / "sweeper.log",
    )
    (tmp_path / "agent.toml").write_text(
        f'host_id = "cred-1"\nspool_dir = "{tmp_path / "spool"}"\n'
        '[[devices]]\ndevice_id = "cred-dev"\nlabels = { platform = "cred-sim" }\n'
    )
    # As the DaemonSet's start script does: the URL and the file's path in the environment, never the password.
    agent_env = {**_clean_env(), "DEVSCHED_NATS_URL": url, **_file_env(secured_nats, "host-cred-1")}
    agent = ServiceProcess(
        "devsched.agent.main", agent_env, tmp_path / "agent.log", "--config", str(tmp_path / "agent.toml")
    )
    processes = [scheduler, sweeper, agent]
    try:
        scheduler.start()
        sweeper.start()
        await scheduler.wait_logged("serving")
        await sweeper.wait_logged("sweeping")
        agent.start()
        await agent.wait_logged("bound to the assignments consumer")

        environ = await asyncio.to_thread(Path(f"/proc/{agent.pid}/environ").read_bytes)
        cmdline = await asyncio.to_thread(Path(f"/proc/{agent.pid}/cmdline").read_bytes)
        assert b"DEVSCHED_NATS_PASSWORD_FILE=" in environ  # the path is there, so the check is looking
        for password in PASSWORDS.values():
            assert password.encode() not in environ
            assert password.encode() not in cmdline

        operator = secured_nats.password_file("scheduler")
        async with Client.connect(url, prefix=PREFIX, user="scheduler", password_file=operator) as client:
            submitted = await client.submit(
                {"steps": [{"name": "show-env", "action": "shell", "args": {"command": "env; echo END-OF-ENV"}}]},
                selector={"platform": "cred-sim"},
            )
            view = await asyncio.wait_for(client.wait(submitted.task_id), timeout=60)
        assert view.status.value == "done", view
        output = str(view.result)
        assert "END-OF-ENV" in output  # the step's output did come back
        assert "DEVSCHED_TASK_ID" in output
        for password in PASSWORDS.values():
            assert password not in output, "a step saw a NATS password"
    finally:
        for p in processes:
            p.stop()
    for p in processes:
        log = p.log_path.read_text()
        assert "nats connected" in log
        for password in PASSWORDS.values():
            assert password not in log, f"{p.module} logged a password"


def _run_agent(config: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "devsched.agent.main", "--config", str(config)],
        env={**_clean_env(), **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("in_file", "in_env"),
    [
        ("nats://host-cred-1:host-Xy93-secret@127.0.0.1:4222", None),
        (None, "nats://host-cred-1:host-Xy93-secret@127.0.0.1:4222"),
        (None, "nats://127.0.0.1:4222,nats://host-cred-1:host-Xy93-secret@127.0.0.2:4222"),
        ("tls://a-token-Xy93@127.0.0.1:4222", None),  # a lone user name is a token to nats-py
    ],
    ids=["url-in-agent.toml", "url-in-environment", "second-url-of-a-cluster", "token-in-url"],
)
def test_a_password_in_the_agents_url_is_refused_with_one_line(
    in_file: str | None, in_env: str | None, tmp_path: Path
) -> None:
    config = tmp_path / "agent.toml"
    line = f'nats_url = "{in_file}"\n' if in_file else ""
    config.write_text(f'host_id = "h1"\nspool_dir = "{tmp_path / "spool"}"\n{line}')
    result = _run_agent(config, {"DEVSCHED_NATS_URL": in_env} if in_env else {})
    assert result.returncode == 2, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert URL_CREDENTIALS_REFUSED in lines[0]
    assert "nats_password_file" in lines[0]
    assert "Xy93" not in result.stderr, "the refusal repeated the secret"
    assert not (tmp_path / "spool").exists(), "a refused configuration changed something"


def test_the_agent_with_an_unreadable_password_file_exits_2_with_one_line(tmp_path: Path) -> None:
    config = tmp_path / "agent.toml"
    config.write_text(
        f'host_id = "h1"\nspool_dir = "{tmp_path / "spool"}"\nnats_user = "host-h1"\n'
        f'nats_password_file = "{tmp_path / "missing.password"}"\n'
    )
    result = _run_agent(config, {})
    assert result.returncode == 2, result
    errors = [line for line in result.stderr.splitlines() if '"level": "error"' in line]
    assert len(errors) == 1, result.stderr
    assert "missing.password" in errors[0]
    assert "Traceback" not in result.stderr


def test_an_agent_user_without_a_password_file_is_refused_at_load(tmp_path: Path) -> None:
    config = tmp_path / "agent.toml"
    config.write_text(f'host_id = "h1"\nspool_dir = "{tmp_path / "spool"}"\n')
    result = _run_agent(config, {"DEVSCHED_NATS_USER": "host-h1"})
    assert result.returncode == 2, result
    assert "without a password file" in result.stderr


async def test_the_agent_connects_with_an_nkey_seed_file(secured_nats: Secrets, tmp_path: Path) -> None:
    config = tmp_path / "agent.toml"
    config.write_text(
        f'host_id = "nkey-1"\nspool_dir = "{tmp_path / "spool"}"\nnats_url = "nats://{secured_nats.address}"\n'
        f'nats_nkey_seed = "{secured_nats.nkey_seed}"\n'
    )
    agent = ServiceProcess("devsched.agent.main", _clean_env(), tmp_path / "agent.log", "--config", str(config))
    agent.start()
    try:
        await agent.wait_logged("nats connected")
        assert "Authorization" not in agent.log_path.read_text()
    finally:
        agent.stop()
    seed = secured_nats.nkey_seed.read_text().strip()
    assert seed not in agent.log_path.read_text()


async def test_the_client_reads_its_password_file_and_the_server_checks_it(
    secured_nats: Secrets, tmp_path: Path
) -> None:
    url = f"nats://{secured_nats.address}"
    async with Client.connect(url, user="scheduler", password_file=secured_nats.password_file("scheduler")):
        pass
    wrong = tmp_path / "wrong.password"
    wrong.write_text("not-the-password\n")
    with pytest.raises(NatsUnreachable, match="cannot connect") as info:  # the server refused it
        await Client.connect(url, user="scheduler", password_file=wrong, timeout=2)
    assert "not-the-password" not in str(info.value)


def test_the_password_file_is_read_again_at_each_connection(tmp_path: Path) -> None:
    path = tmp_path / "password"
    path.write_text("first\n")
    options = NatsAccess(user="u", password_file=path).connect_options()
    callback = options["password"]
    assert callback() == "first"
    path.write_text("rotated\n")
    assert callback() == "rotated"
    path.unlink()  # a Secret mid-rotation: the last good value stays
    assert callback() == "rotated"
    assert "rotated" not in repr(options)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"nats_user": "u"}, "without a password file"),
        ({"nats_password_file": "/etc/hostname"}, "without a user"),
        ({"nats_user": "u", "nats_password_file": "/nonexistent/password"}, "cannot read the NATS password file"),
        ({"nats_creds": "/etc/hostname", "nats_nkey_seed": "/etc/hostname"}, "not creds and nkey seed"),
        ({"nats_tls_key": "/etc/hostname"}, "needs its certificate"),
    ],
)
def test_service_settings_that_do_not_fit_together_exit_with_one_line(fields: dict[str, str], message: str) -> None:
    command = CommandLine(ServiceSettings, prog="svc", description="test")
    argv = [arg for name, value in fields.items() for arg in ("--" + name.replace("_", "-"), value)]
    with pytest.raises(SettingsError, match=message) as info:
        command.settings(command.parser.parse_args(argv))
    assert len(str(info.value).splitlines()) == 2  # "invalid configuration:" and the one reason


def test_the_cli_refuses_a_user_without_a_password_file_with_one_line(secured_nats: Secrets) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "devsched.client",
            "--nats-url",
            f"nats://{secured_nats.address}",
            "--user",
            "u",
            "hosts",
        ],
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: "), result.stderr
    assert "password file" in lines[0]


def test_url_credentials_are_detected_in_every_form() -> None:
    assert url_has_credentials("nats://u:p@h:4222")
    assert url_has_credentials("tls://token@h:4222")
    assert url_has_credentials("h1:4222, nats://u:p@h2:4222")
    assert url_has_credentials("u:p@h:4222")  # no scheme
    assert not url_has_credentials("nats://h1:4222,tls://h2:4222")
    with pytest.raises(TlsConfigError):
        NatsAccess(creds=Path("/etc/hostname"), password_file=Path("/etc/hostname"), user="u").check()
