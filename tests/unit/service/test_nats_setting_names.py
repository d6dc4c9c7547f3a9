"""The names users give the NATS settings: environment variables, service flags, agent keys, CLI flags.

Every program reads the same `DEVSCHED_NATS_*` variables; a rename would silently drop a deployment's
credentials or TLS, so each name is pinned here, for each program that reads it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import typer

from devsched.agent.config import load_config
from devsched.client.cli.main import app
from devsched.scheduler.settings import SchedulerSettings
from devsched.service.flags import CommandLine
from devsched.service.settings import ServiceSettings
from devsched.sweeper.app import SweeperSettings
from devsched.web.settings import WebSettings

#: setting -> (environment variable, flag of the services, flag of the CLI)
NAMES = {
    "nats_url": ("DEVSCHED_NATS_URL", "--nats-url", "--nats-url"),
    "nats_creds": ("DEVSCHED_NATS_CREDS", "--nats-creds", "--creds"),
    "nats_nkey_seed": ("DEVSCHED_NATS_NKEY_SEED", "--nats-nkey-seed", "--nkey-seed"),
    "nats_user": ("DEVSCHED_NATS_USER", "--nats-user", "--user"),
    "nats_password_file": ("DEVSCHED_NATS_PASSWORD_FILE", "--nats-password-file", "--password-file"),
    "nats_tls_ca": ("DEVSCHED_NATS_TLS_CA", "--nats-tls-ca", "--tls-ca"),
    "nats_tls_cert": ("DEVSCHED_NATS_TLS_CERT", "--nats-tls-cert", "--tls-cert"),
    "nats_tls_key": ("DEVSCHED_NATS_TLS_KEY", "--nats-tls-key", "--tls-key"),
    "nats_tls_hostname": ("DEVSCHED_NATS_TLS_HOSTNAME", "--nats-tls-hostname", "--tls-hostname"),
}
#: Values that fit together, one group at a time (one kind of credentials per connection).
GROUPS = [
    {
        "nats_url": "tls://nats.example:4222",
        "nats_creds": Path("/run/nats/user.creds"),
        "nats_tls_ca": Path("/run/tls/ca.crt"),
        "nats_tls_cert": Path("/run/tls/tls.crt"),
        "nats_tls_key": Path("/run/tls/tls.key"),
        "nats_tls_hostname": "nats.internal",
    },
    {"nats_nkey_seed": Path("/run/nats/seed.nk")},
    {"nats_user": "bench-07", "nats_password_file": Path("/run/nats/password")},
]
SERVICES = [ServiceSettings, SchedulerSettings, SweeperSettings, WebSettings]


def _set_env(monkeypatch: pytest.MonkeyPatch, group: dict[str, object], *, lower: bool = False) -> None:
    for name, value in group.items():
        env = NAMES[name][0]
        monkeypatch.setenv(env.lower() if lower else env, str(value))


@pytest.mark.parametrize("settings_type", SERVICES, ids=lambda t: t.__name__)
@pytest.mark.parametrize("group", GROUPS, ids=["url-creds-tls", "nkey", "password"])
def test_every_service_reads_the_nats_variables(
    settings_type: type[ServiceSettings], group: dict[str, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    _set_env(monkeypatch, group)
    settings = settings_type()
    for name, value in group.items():
        assert getattr(settings, name) == value, name


def test_variable_names_are_read_whatever_their_case(monkeypatch: pytest.MonkeyPatch) -> None:
    _set_env(monkeypatch, GROUPS[0], lower=True)
    assert SchedulerSettings().nats_tls_hostname == "nats.internal"


@pytest.mark.parametrize("settings_type", SERVICES, ids=lambda t: t.__name__)
def test_every_service_has_a_flag_per_nats_setting(settings_type: type[ServiceSettings]) -> None:
    parser = CommandLine(settings_type, prog="svc", description="test").parser
    flags = {flag for action in parser._actions for flag in action.option_strings}
    for _, flag, _ in NAMES.values():
        assert flag in flags


@pytest.mark.parametrize("group", GROUPS, ids=["url-creds-tls", "nkey", "password"])
def test_the_agent_reads_the_nats_keys_and_the_same_variables(
    group: dict[str, object], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    head = f'host_id = "bench-07"\nspool_dir = "{tmp_path / "spool"}"\n'
    keys = "".join(f'{name} = "{value}"\n' for name, value in group.items())
    config = tmp_path / "agent.toml"
    config.write_text(head + keys)
    from_file = load_config(config, environ=False)
    for name, value in group.items():
        assert getattr(from_file, name) == value, name
    config.write_text(head)
    _set_env(monkeypatch, group)
    from_env = load_config(config)
    for name, value in group.items():
        assert getattr(from_env, name) == value, name


def test_the_cli_flags_and_their_variables() -> None:
    params = {param.name: param for param in typer.main.get_command(app).params}
    options = {opt: param for param in params.values() for opt in param.opts}
    for env, _, flag in NAMES.values():
        assert flag in options, flag
        assert options[flag].envvar == env, flag


def test_the_dashboard_ignores_database_and_unknown_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEVSCHED_DATABASE_URL", "postgresql+asyncpg://web@db/devsched")
    monkeypatch.setenv("DEVSCHED_DATABASE_SSL_ROOT_CERT", "/run/pg/ca.crt")
    monkeypatch.setenv("DEVSCHED_NOT_A_SETTING", "x")
    monkeypatch.setenv("DEVSCHED_NATS_URL", "nats://nats:4222")
    assert WebSettings().nats_url == "nats://nats:4222"


def test_the_dashboard_has_no_database_settings() -> None:
    assert not [name for name in WebSettings.model_fields if name.startswith(("database", "db_"))]
