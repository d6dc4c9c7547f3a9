"""deploy/systemd: units that start real entry points, drain on reload and outlast the programs' own shutdown."""

from __future__ import annotations

import importlib
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from devsched.agent.agent import DRAIN_SIGNAL
from devsched.agent.config import AgentConfig
from devsched.agent.main import parse_args
from devsched.scheduler.settings import SchedulerSettings
from devsched.sweeper.app import SweeperSettings

from .manifests import agent_shutdown_s

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[3]
SYSTEMD = ROOT / "deploy" / "systemd"
UNITS = sorted(path.name for path in SYSTEMD.glob("*.service"))

Unit = dict[str, dict[str, list[str]]]


def parse_unit(path: Path) -> Unit:
    """Sections of a unit file, each key with its values in order (systemd allows a key more than once)."""
    unit: Unit = {}
    section: dict[str, list[str]] | None = None
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = unit.setdefault(line[1:-1], {})
            continue
        assert section is not None, f"{path.name}: {line!r} before any section"
        key, sep, value = line.partition("=")
        assert sep, f"{path.name}: {line!r} is not key=value"
        section.setdefault(key.strip(), []).append(value.strip())
    return unit


def one(unit: Unit, section: str, key: str) -> str:
    values = unit.get(section, {}).get(key, [])
    assert len(values) == 1, f"[{section}] {key}: {values}"
    return values[0]


def seconds(value: str) -> float:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(s|sec|min)?", value)
    assert match, f"not a plain duration: {value}"
    return float(match[1]) * (60 if match[2] == "min" else 1)


def console_scripts() -> dict[str, str]:
    """Every console script of the services: name -> `module:function`."""
    scripts: dict[str, str] = {}
    for pyproject in (ROOT / "services").glob("*/pyproject.toml"):
        scripts |= tomllib.loads(pyproject.read_text())["project"].get("scripts", {})
    return scripts


def test_there_is_a_unit_for_the_agent_and_the_database_services() -> None:
    assert UNITS == ["devsched-agent.service", "devsched-scheduler.service", "devsched-sweeper.service"]


@pytest.mark.parametrize("name", UNITS)
def test_exec_start_names_a_real_entry_point(name: str) -> None:
    unit = parse_unit(SYSTEMD / name)
    program, *args = shlex.split(one(unit, "Service", "ExecStart"))
    script = Path(program).name
    assert script == name.removesuffix(".service")
    target = console_scripts()[script]
    module, function = target.split(":")
    assert callable(getattr(importlib.import_module(module), function))
    if script == "devsched-agent":
        assert parse_args(args).config == Path("/etc/devsched/agent.toml")
    else:
        assert args == []  # settings come from the EnvironmentFile


@pytest.mark.parametrize("name", UNITS)
def test_units_run_as_a_dedicated_user_and_restart_but_not_on_a_refused_configuration(name: str) -> None:
    unit = parse_unit(SYSTEMD / name)
    assert one(unit, "Service", "User") not in {"root", "0"}
    assert one(unit, "Service", "EnvironmentFile").lstrip("-").startswith("/etc/devsched/")
    assert one(unit, "Service", "RestartPreventExitStatus") == "2"  # exit 2: invalid configuration
    assert one(unit, "Service", "NoNewPrivileges") == "yes"
    assert one(unit, "Install", "WantedBy") == "multi-user.target"


def test_the_agent_unit_drains_on_reload_and_outlasts_its_shutdown() -> None:
    unit = parse_unit(SYSTEMD / "devsched-agent.service")
    assert shlex.split(one(unit, "Service", "ExecReload")) == [
        "/bin/kill",
        f"-{signal.Signals(DRAIN_SIGNAL).name.removeprefix('SIG')}",
        "$MAINPID",
    ]
    # a drain exits 0: `always` starts it again (reload = drain, then start)
    assert one(unit, "Service", "Restart") == "always"
    # SIGTERM to the agent alone: it stops its steps itself after the shutdown grace
    assert one(unit, "Service", "KillMode") == "mixed"
    defaults = AgentConfig(host_id="h", spool_dir=Path("/var/lib/devsched-agent/spool"))
    assert defaults.shutdown_grace_s == AgentConfig.model_fields["shutdown_grace_s"].default
    assert seconds(one(unit, "Service", "TimeoutStopSec")) > agent_shutdown_s(defaults, 0) + 10
    # device access: nothing that hides /dev
    service = unit["Service"]
    assert "PrivateDevices" not in service
    assert "DevicePolicy" not in service
    assert "DeviceAllow" not in service


@pytest.mark.parametrize(
    ("name", "shutdown_s"),
    [
        (
            "devsched-scheduler.service",
            SchedulerSettings.model_fields["shutdown_grace_s"].default
            + SchedulerSettings.model_fields["drain_timeout_s"].default,
        ),
        ("devsched-sweeper.service", SweeperSettings.model_fields["drain_timeout_s"].default),
    ],
)
def test_the_service_units_outlast_their_shutdown(name: str, shutdown_s: float) -> None:
    unit = parse_unit(SYSTEMD / name)
    assert seconds(one(unit, "Service", "TimeoutStopSec")) >= shutdown_s + 10
    assert one(unit, "Service", "Restart") == "on-failure"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
@pytest.mark.parametrize("name", UNITS)
def test_systemd_analyze_verify_accepts_the_unit(name: str, tmp_path: Path) -> None:
    unit = SYSTEMD / name
    program = shlex.split(one(parse_unit(unit), "Service", "ExecStart"))[0]
    installed = Path(sys.executable).parent / Path(program).name  # the same script, where it is installed here
    assert installed.exists()
    copy = tmp_path / name
    copy.write_text(unit.read_text().replace(program, str(installed)))
    result = subprocess.run(
        ["systemd-analyze", "verify", str(copy)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    # unknown keys and bad values are only warned about: none may be
    assert [line for line in result.stderr.splitlines() if name in line] == []
