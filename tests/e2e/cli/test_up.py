"""`devsched up --demo --exit-when-done`: the whole system from scratch, its demo, and a clean stop."""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import socket
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from devsched.embedded.postgres_server import relocated_data_dir
from support.databases import create_test_database, drop_database, in_thread
from support.devsched_stack import clean_env, delete_streams, run_devsched, up_process
from support.servers import NatsHandle, PostgresHandle

pytestmark = pytest.mark.e2e


def alive(pid: int) -> bool:
    """Whether `pid` is a live process (zombies count as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def logs(data: Path) -> str:
    """The tails of `up`'s service logs, for failure messages."""
    out = []
    for path in sorted((data / "logs").glob("*.log")):
        out.append(f"--- {path.name}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-15:]))
    return "\n".join(out)


def accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def child_pids(output: str) -> list[int]:
    return [int(pid) for pid in re.findall(r"\(pid (\d+)\)", output)]


@pytest.fixture
def relocated_data(tmp_path: Path) -> Iterator[None]:
    """Remove the Postgres data that `up` keeps outside tmp_path (private to root: see `PostgresServer`)."""
    yield
    if os.geteuid() == 0:
        shutil.rmtree(relocated_data_dir(tmp_path / ".devsched" / "postgres"), ignore_errors=True)


@pytest.mark.usefixtures("relocated_data")
def test_up_runs_the_demo_to_its_expected_end_and_a_second_up_reuses_the_data(tmp_path: Path) -> None:
    data = tmp_path / ".devsched"
    argv = ("up", "--exit-when-done", "--nats-port", "0", "--hosts", "2", "--devices-per-host", "2",
            "--demo-timeout", "90", "--no-live", "--web-port", "0")  # fmt: skip

    started = time.monotonic()
    env = clean_env(COLUMNS="200", XDG_STATE_HOME=str(tmp_path / "state"))
    first = run_devsched(*argv, cwd=tmp_path, env=env, timeout=150)
    took = time.monotonic() - started

    assert first.returncode == 0, f"stdout:\n{first.stdout}\nstderr:\n{first.stderr}\n{logs(data)}"
    assert "Traceback" not in first.stdout + first.stderr
    assert "first run: initdb" in first.stdout
    assert "devsched is up." in first.stdout
    assert "demo finished as expected" in first.stdout
    assert "killed the agent of sim-2" in first.stdout  # the host-crash story really happened
    assert took < 100, f"devsched up took {took:.0f}s"
    assert re.search(r"web +http://127\.0\.0\.1:\d+/", first.stdout), first.stdout  # the dashboard's URL
    for name in ("scheduler.log", "sweeper.log", "agent-sim-1.log", "agent-sim-2.log", "web.log"):
        assert (data / "logs" / name).stat().st_size > 0
    assert "DEVSCHED_NATS_URL=nats://127.0.0.1:" in (data / "env").read_text()
    assert (data / "agents" / "sim-1.toml").exists()
    pids = child_pids(first.stdout)
    assert len(pids) >= 5  # scheduler, sweeper, two agents, the restarted agent
    assert not [pid for pid in pids if alive(pid)], "a child of `devsched up` outlived it"
    for port in re.findall(r"127\.0\.0\.1:(\d+)", first.stdout.split("devsched is up.")[1].split("In another")[0]):
        assert not accepts(int(port)), f"port {port} still open: an embedded server outlived `devsched up`"

    second = run_devsched(*argv, "--no-demo", cwd=tmp_path, env=env, timeout=150)

    assert second.returncode == 0, f"stdout:\n{second.stdout}\nstderr:\n{second.stderr}\n{logs(data)}"
    assert "first run: initdb" not in second.stdout  # the cluster was reused
    assert "devsched is up." in second.stdout
    assert not [pid for pid in child_pids(second.stdout) if alive(pid)]


def server_options(data: Path) -> tuple[str, str]:
    """How `up` last started its servers: Postgres's command line (postmaster.opts) and the NATS config."""
    pg_dirs = [data / "postgres"]
    if os.geteuid() == 0:
        pg_dirs.append(relocated_data_dir(data / "postgres"))
    opts = [p for d in pg_dirs if d.exists() for p in d.rglob("postmaster.opts")]
    assert len(opts) == 1, opts
    return opts[0].read_text(), (data / "nats" / "nats.conf").read_text()


@pytest.mark.usefixtures("relocated_data")
def test_up_keeps_acknowledged_work_durable_unless_fast(tmp_path: Path) -> None:
    # An acknowledged task must survive a crash of the machine: every commit and every JetStream write is
    # synced before it is acknowledged. `--fast` is the throwaway mode that gives that up, and says so.
    data = tmp_path / ".devsched"
    argv = ("up", "--exit-when-done", "--no-demo", "--nats-port", "0", "--hosts", "1", "--no-live", "--no-web")

    durable = run_devsched(*argv, cwd=tmp_path, env=clean_env(COLUMNS="200"), timeout=150)
    assert durable.returncode == 0, f"stdout:\n{durable.stdout}\nstderr:\n{durable.stderr}\n{logs(data)}"
    assert "(fsync on)" in durable.stdout
    postgres, nats = server_options(data)
    assert '"fsync=on"' in postgres
    assert '"synchronous_commit=on"' in postgres
    assert "sync_interval: always" in nats

    fast = run_devsched(*argv, "--fast", cwd=tmp_path, env=clean_env(COLUMNS="200"), timeout=150)
    assert fast.returncode == 0, f"stdout:\n{fast.stdout}\nstderr:\n{fast.stderr}\n{logs(data)}"
    assert "fsync off: --fast" in fast.stdout
    postgres, nats = server_options(data)
    assert '"fsync=off"' in postgres
    assert "sync_interval" not in nats


def test_a_second_up_on_a_running_data_dir_refuses(tmp_path: Path) -> None:
    data = tmp_path / ".devsched"
    data.mkdir()
    with (data / "up.lock").open("a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        held.write(f"{os.getpid()}\n")
        held.flush()
        env = clean_env(COLUMNS="200", XDG_STATE_HOME=str(tmp_path / "state"))
        result = run_devsched("up", "--exit-when-done", "--nats-port", "0", cwd=tmp_path, env=env, timeout=60)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"error: another `devsched up` (pid {os.getpid()}) is running on {data}"
    ]


def test_up_on_given_servers_serves_until_sigterm_then_stops_its_children(
    tmp_path: Path, nats_server: NatsHandle, postgres_server: PostgresHandle, database_template: str
) -> None:
    database = create_test_database(postgres_server.dsn(), database_template)
    prefix = f"u{uuid.uuid4().hex[:8]}"
    out_path = tmp_path / "up.out"
    argv = [sys.executable, "-m", "devsched.client", "--prefix", prefix, "up", "--no-demo", "--no-live",
            "--nats-url", nats_server.url, "--database-url", postgres_server.url(database), "--hosts", "1",
            "--web-port", "0"]  # fmt: skip
    try:
        up = up_process(argv, tmp_path, out_path)
        try:
            deadline = time.monotonic() + 60
            while "devsched is up." not in out_path.read_text():
                assert up.running, out_path.read_text()
                assert time.monotonic() < deadline, out_path.read_text()
                time.sleep(0.1)
            assert "(embedded)" not in out_path.read_text()
            env = clean_env(DEVSCHED_NATS_URL=nats_server.url, DEVSCHED_SUBJECT_PREFIX=prefix)
            hosts = json.loads(run_devsched("hosts", "--json", env=env).stdout)["hosts"]
            assert [(h["host_id"], h["online"]) for h in hosts] == [("sim-1", True)]
            # the dashboard, read-only without its token: the lab shows the host
            found = re.search(r"web +(http://127\.0\.0\.1:\d+/)", out_path.read_text())
            assert found, out_path.read_text()
            html = ""
            deadline = time.monotonic() + 30
            while "sim-1" not in html:  # the dashboard's first sample of the lab may still be on its way
                assert time.monotonic() < deadline, html
                time.sleep(0.2)
                with urllib.request.urlopen(found.group(1) + "lab", timeout=10) as page:
                    html = page.read().decode()
            assert "Log in" in html

            assert up.stop(timeout=60) == 0, out_path.read_text()  # SIGTERM, SIGKILL after 60 s
        finally:
            up.kill()
        output = out_path.read_text()
        assert "Traceback" not in output
        pids = child_pids(output)
        assert len(pids) == 4  # scheduler, sweeper, one agent, the web dashboard
        assert not [pid for pid in pids if alive(pid)], "a child of `devsched up` outlived it"
    finally:
        in_thread(lambda: delete_streams(nats_server.url, prefix))
        drop_database(postgres_server.dsn(), database)
