"""The agent as a host installs it: its wheel in a fresh virtualenv, registering with a running stack.

The devsched wheels are built from this checkout; their third-party dependencies come from uv.lock, out of
uv's cache (`--offline`: no index is asked). The venv's `devsched-agent` then serves a scheduler and a sweeper
of this workspace and runs the example plan of `devsched up` to its end.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from devsched.devstack.layout import EXAMPLE_PLAN
from support.devsched_stack import Stack, run_devsched, stack_for_tests
from support.servers import NatsHandle, PostgresHandle
from support.workspace import ROOT, members, uv_binary

pytestmark = [pytest.mark.release, pytest.mark.e2e]

VERSION = members()[0].project["version"]


def _isolated_env(**extra: str) -> dict[str, str]:
    """This environment without what would point a process at the workspace (its venv, PYTHONPATH, DEVSCHED_*)."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "UV_PROJECT_ENVIRONMENT"}
        and not key.startswith("DEVSCHED_")
    }
    env.update(extra)
    return env


def _run(argv: list[str], *, env: dict[str, str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`argv` to its end (at most two minutes), which must succeed; its output as text."""
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False, env=env, cwd=cwd)
    assert result.returncode == 0, f"{argv} exited {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result


@dataclass(frozen=True)
class Venv:
    """A virtualenv holding the agent's wheel and nothing of the workspace."""

    root: Path

    def bin(self, name: str) -> Path:
        """An executable of the venv."""
        return self.root / "bin" / name


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Venv:
    """The agent's wheel and its siblings', built now, in a fresh venv; the rest pinned by uv.lock, offline."""
    work = tmp_path_factory.mktemp("agent-wheel")
    dist, root = work / "dist", work / "venv"
    uv = uv_binary()
    _run([uv, "build", "--all-packages", "--wheel", "--quiet", "--out-dir", str(dist)], env=_isolated_env(), cwd=ROOT)
    # The lock's third-party pins, from the cache (a fresh resolution would want newer, uncached releases).
    _run(
        [uv, "sync", "--quiet", "--frozen", "--offline", "--package", "devsched-agent", "--no-default-groups",
         "--no-install-workspace", "--python", sys.executable],
        cwd=ROOT, env=_isolated_env(UV_PROJECT_ENVIRONMENT=str(root)),
    )  # fmt: skip
    # The devsched distributions from the built wheels only: what the agent's wheel requires, resolved.
    _run(
        [uv, "pip", "install", "--quiet", "--offline", "--python", str(root / "bin" / "python"),
         "--find-links", str(dist), f"devsched-agent=={VERSION}"],
        cwd=work, env=_isolated_env(),
    )  # fmt: skip
    return Venv(root)


@pytest.fixture(scope="module")
def wheel_stack(
    venv: Venv,
    nats_server: NatsHandle,
    postgres_server: PostgresHandle,
    database_template: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Stack]:
    """The workspace's scheduler and sweeper, and the venv's `devsched-agent` (ready: bound to its assignments)."""
    work_dir = tmp_path_factory.mktemp("wheel-stack")
    with stack_for_tests(
        nats_server, postgres_server, database_template, work_dir, agent_command=[str(venv.bin("devsched-agent"))]
    ) as stack:
        yield stack


def test_the_venv_holds_the_wheels_not_the_workspace(venv: Venv) -> None:
    script = "import devsched.agent, devsched.service; print(devsched.agent.__file__); print(devsched.service.__file__)"
    files = _run([str(venv.bin("python")), "-c", script], env=_isolated_env(), cwd=venv.root).stdout.split()
    assert len(files) == 2
    assert all(Path(file).is_relative_to(venv.root) for file in files), files
    version = _run([str(venv.bin("devsched-agent")), "--version"], env=_isolated_env()).stdout
    assert version.strip() == f"devsched-agent {VERSION}"


def test_the_installed_agent_checks_its_config_against_the_stack(venv: Venv, wheel_stack: Stack) -> None:
    config = wheel_stack.work_dir / f"{wheel_stack.host_id}.toml"
    result = _run([str(venv.bin("devsched-agent")), "--config", str(config), "--check-config"], env=_isolated_env())
    lines = result.stdout.splitlines()
    assert lines, result.stderr
    assert all(line.startswith("ok ") for line in lines), result.stdout
    assert any(line.startswith("ok NATS: connected") for line in lines), result.stdout


def test_the_installed_agent_runs_the_example_plan(wheel_stack: Stack, tmp_path: Path) -> None:
    plan = tmp_path / "hello.yaml"
    plan.write_text(EXAMPLE_PLAN)
    result = run_devsched(
        "submit", str(plan), "--selector", "platform=sim", "--wait", "--json", env=wheel_stack.cli_env(), timeout=90
    )
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}\n{wheel_stack.logs()}"
    task = json.loads(result.stdout)
    assert task["status"] == "done"
    assert task["attempts"][0]["host_id"] == wheel_stack.host_id
    logs = run_devsched("logs", task["task_id"], env=wheel_stack.cli_env())
    assert logs.returncode == 0, logs.stderr
    assert f"hello from {task['attempts'][0]['device_id']}" in logs.stdout
    assert "collecting logs" in logs.stdout
