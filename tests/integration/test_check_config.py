"""`--check-config` against a real nats-server and Postgres: one line per check, exit 0 or 1, nothing started."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def script(name: str) -> str:
    return str(Path(sys.executable).parent / name)


def run(argv: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DEVSCHED_")}
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False, env={**clean, **env})


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def agent_config(tmp_path: Path, nats_url: str, *extra: str) -> Path:
    path = tmp_path / "agent.toml"
    lines = [
        'host_id = "check-h1"',
        f'spool_dir = "{tmp_path / "spool"}"',
        f'work_dir = "{tmp_path / "work"}"',
        f'nats_url = "{nats_url}"',
        *extra,
        "[[devices]]",
        'device_id = "check-d1"',
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_the_agent_checks_out_against_a_real_server(nats_url: str, tmp_path: Path) -> None:
    result = run([script("devsched-agent"), "--config", str(agent_config(tmp_path, nats_url)), "--check-config"])
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    lines = result.stdout.splitlines()
    assert [line.split(":", 1)[0] for line in lines] == [
        "ok config",
        "ok step_user",
        "ok spool_dir",
        "ok work_dir",
        "ok NATS",
    ]
    assert "host check-h1, 1 device(s)" in lines[0]
    assert "connected to" in lines[-1]
    assert "nats-server" in lines[-1]
    assert not (tmp_path / "spool").exists()
    assert not (tmp_path / "work").exists()


def test_each_problem_is_one_line_and_the_exit_code_says_so(tmp_path: Path) -> None:
    url = f"nats://127.0.0.1:{closed_port()}"
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where a directory should be\n")
    config = agent_config(tmp_path, url, f'nats_creds = "{tmp_path / "missing.creds"}"', f'spool_dir = "{blocked}"')
    config.write_text(config.read_text().replace(f'spool_dir = "{tmp_path / "spool"}"\n', ""))
    started = time.monotonic()
    result = run([script("devsched-agent"), "--config", str(config), "--check-config"])
    assert time.monotonic() - started < 30  # bounded: a server that never answers is a line, not a hang
    assert result.returncode == 1
    problems = result.stderr.splitlines()
    assert [line.split(":", 2)[1].strip() for line in problems] == ["spool_dir", "NATS"]
    assert all(line.startswith("devsched-agent: ") for line in problems)
    assert f"{blocked} is not a directory" in problems[0]
    assert "cannot read the NATS creds file" in problems[1]
    assert "missing.creds" in problems[1]


def test_a_server_that_does_not_answer_is_reported_within_the_bound(tmp_path: Path) -> None:
    url = f"nats://127.0.0.1:{closed_port()}"
    started = time.monotonic()
    result = run([script("devsched-agent"), "--config", str(agent_config(tmp_path, url)), "--check-config"])
    elapsed = time.monotonic() - started
    assert result.returncode == 1
    (problem,) = result.stderr.splitlines()
    assert problem.startswith(f"devsched-agent: NATS: no connection to {url} within 5 s")
    assert elapsed < 30


def test_an_invalid_agent_config_exits_2_before_any_check(tmp_path: Path) -> None:
    config = agent_config(tmp_path, "nats://127.0.0.1:4222", "no_such_key = 1")
    result = run([script("devsched-agent"), "--config", str(config), "--check-config"])
    assert result.returncode == 2
    assert "no_such_key: unknown key" in result.stderr
    assert result.stdout == ""


def test_the_scheduler_checks_nats_and_its_migrated_database(nats_url: str, database_url: str) -> None:
    result = run(
        [script("devsched-scheduler"), "--check-config"], DEVSCHED_NATS_URL=nats_url, DEVSCHED_DATABASE_URL=database_url
    )
    assert result.returncode == 0, result.stderr
    assert [line.split(":", 1)[0] for line in result.stdout.splitlines()] == ["ok settings", "ok NATS", "ok database"]


def test_the_sweeper_names_a_database_it_cannot_use(nats_url: str, database_url: str) -> None:
    missing = database_url.rsplit("/", 1)[0] + "/no_such_database"
    result = run([script("devsched-sweeper"), "--check-config", "--database-url", missing], DEVSCHED_NATS_URL=nats_url)
    assert result.returncode == 1
    (problem,) = result.stderr.splitlines()
    assert problem.startswith("devsched-sweeper: database: ")
    assert "no_such_database" in problem
    assert "ok NATS" in result.stdout


def test_the_dashboard_checks_nats_only(nats_url: str) -> None:
    result = run([script("devsched-web"), "--check-config", "--nats-url", nats_url])
    assert result.returncode == 0, result.stderr
    assert [line.split(":", 1)[0] for line in result.stdout.splitlines()] == ["ok settings", "ok NATS"]
