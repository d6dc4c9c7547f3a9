"""Each program's command line: the flags of its own settings only, `--version`, `--check-config`, precedence.

The programs run as their installed console scripts (the entry points of services/*/pyproject.toml).
"""

from __future__ import annotations

import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
from pydantic_settings import BaseSettings

from devsched.scheduler.settings import SchedulerSettings
from devsched.service.flags import CommandLine, flag_of
from devsched.service.settings import ENV_PREFIX
from devsched.sweeper.app import SweeperSettings
from devsched.web.settings import WebSettings

pytestmark = pytest.mark.unit

#: program -> (its settings type, the flags it has that are not settings)
PROGRAMS: dict[str, tuple[type[BaseSettings] | None, set[str]]] = {
    "devsched-scheduler": (SchedulerSettings, {"--migrate"}),
    "devsched-sweeper": (SweeperSettings, set()),
    "devsched-web": (WebSettings, set()),
    "devsched-agent": (None, {"--config", "--log-level"}),  # its settings are agent.toml's keys
}
#: What every program has.
COMMON = {"--help", "--version", "--check-config"}


def script(name: str) -> str:
    path = Path(sys.executable).parent / name
    assert path.exists(), f"{name} is not installed next to {sys.executable}"
    return str(path)


def expected_flags(settings_type: type[BaseSettings] | None) -> set[str]:
    if settings_type is None:
        return set()
    flags = {flag_of(name) for name in settings_type.model_fields}
    flags |= {flag_of(f"no_{name}") for name, field in settings_type.model_fields.items() if field.annotation is bool}
    return flags


@pytest.mark.parametrize("program", sorted(PROGRAMS))
def test_help_lists_the_programs_own_settings_and_nothing_else(program: str) -> None:
    settings_type, extra = PROGRAMS[program]
    result = subprocess.run([script(program), "--help"], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    usage = result.stdout.split("\n\n", 1)[0]  # the usage block names each flag once
    offered = set(re.findall(r"\[(--[a-z0-9-]+)", usage)) | set(re.findall(r"\| (--[a-z0-9-]+)", usage))
    offered |= {"--help"} if "[-h]" in usage else set()
    offered |= set(re.findall(r" (--config) ", usage))  # the agent's one required flag
    assert offered == expected_flags(settings_type) | extra | COMMON
    if settings_type is not None:  # each setting's help names its variable
        for name in settings_type.model_fields:
            assert f"{ENV_PREFIX}{name.upper()}" in result.stdout, name


def test_the_dashboard_offers_no_database_sweep_or_payload_flag() -> None:
    parser = CommandLine(WebSettings, prog="devsched-web", description="").parser
    flags = {flag for action in parser._actions for flag in action.option_strings}
    assert "--nats-url" in flags
    assert not {f for f in flags if f.startswith(("--database", "--db-", "--sweep", "--max-payload", "--drain"))}


@pytest.mark.parametrize("program", sorted(PROGRAMS))
def test_version_prints_the_installed_release(program: str) -> None:
    result = subprocess.run([script(program), "--version"], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"{program} {version(program)}"
    assert version(program) == version("devsched-core")  # one version for the workspace


def test_a_flag_wins_over_its_variable_which_wins_over_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEVSCHED_WEB_PORT", "8181")
    monkeypatch.setenv("DEVSCHED_WEB_REFRESH_S", "3")
    command = CommandLine(WebSettings, prog="devsched-web", description="")
    settings = command.settings(command.parser.parse_args(["--web-port", "9191", "--web-secure-cookies"]))
    assert (settings.web_port, settings.web_refresh_s, settings.web_queue_max) == (9191, 3.0, 10000)
    assert settings.web_secure_cookies is True
    # a boolean's variable is overridden by its `--no-` flag
    monkeypatch.setenv("DEVSCHED_CREATE_STREAMS", "true")
    scheduler = CommandLine(SchedulerSettings, prog="devsched-scheduler", description="")
    assert scheduler.settings(scheduler.parser.parse_args(["--no-create-streams"])).create_streams is False


def test_comma_separated_prefixes_on_the_command_line(monkeypatch: pytest.MonkeyPatch) -> None:
    command = CommandLine(SchedulerSettings, prog="devsched-scheduler", description="")
    options = command.parser.parse_args(["--host-inbox-prefixes", "_R_.,hosts.{host_id}."])
    assert command.settings(options).host_inbox_prefixes == ("_R_.", "hosts.{host_id}.")


def test_an_invalid_value_exits_2_with_one_line_naming_the_variable_and_the_flag() -> None:
    result = subprocess.run(
        [script("devsched-web"), "--web-port", "eighty"], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 2
    assert result.stdout == ""
    named = [line for line in result.stderr.splitlines() if "DEVSCHED_WEB_PORT / --web-port" in line]
    assert len(named) == 1, result.stderr
    assert "integer" in named[0]


def test_a_setting_of_another_service_is_no_flag_here() -> None:
    result = subprocess.run(
        [script("devsched-web"), "--database-url", "postgresql+asyncpg://x@db/x"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "unrecognized arguments: --database-url" in result.stderr
