"""The production NATS permissions (deploy/nats/accounts.conf), proven with the real services.

A nats-server runs with the committed accounts file (plain-text passwords put in for the placeholders),
and the scheduler, sweeper and a host agent connect as their own users: a task runs end to end, so the
permissions are enough; and another host is refused its neighbour's subjects and inbox.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest

from devsched.client import Client, collect_output
from support.polling import eventually
from support.scheduler_harness import ServiceProcess, service_env
from support.secured_nats import AGENT_TOML, SCHEDULER_SETTINGS, SecuredNats, secured_nats

pytestmark = pytest.mark.e2e


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[SecuredNats]:
    """A nats-server with the deploy permissions on a free port."""
    with secured_nats(tmp_path / "nats") as server:
        yield server


async def test_the_deploy_permissions_run_a_task_and_keep_hosts_apart(
    secured: SecuredNats, database_url: str, tmp_path: Path
) -> None:
    def url(user: str, password: str) -> str:
        return f"nats://{user}:{password}@{secured.address}"

    # the permissions are written for the default prefix
    scheduler = ServiceProcess(
        "devsched.scheduler",
        service_env(
            database_url, url("scheduler", "schedpw"), "devsched", heartbeat_interval_s=1.0, **SCHEDULER_SETTINGS
        ),
        tmp_path / "scheduler.log",
    )
    sweeper = ServiceProcess(
        "devsched.sweeper", service_env(database_url, url("sweeper", "sweeppw"), "devsched"), tmp_path / "sweeper.log"
    )
    spool = tmp_path / "spool"
    # The agent refuses credentials in its URL: its password comes from a file, as the DaemonSet gives it.
    (tmp_path / "host.password").write_text("h07pw\n")
    (tmp_path / "agent.toml").write_text(
        f'host_id = "bench-07"\nspool_dir = "{spool}"\nnats_url = "nats://{secured.address}"\n'
        f'nats_user = "host-bench-07"\nnats_password_file = "{tmp_path / "host.password"}"\n'
        f"{AGENT_TOML}"
        '[[devices]]\ndevice_id = "sim-7"\nlabels = { platform = "sim" }\n'
    )
    agent_env = {k: v for k, v in os.environ.items() if not k.startswith("DEVSCHED_")}
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

        async with await Client.connect(url("operator", "oppw"), timeout=5) as client:
            submitted = await client.submit(
                {
                    "steps": [
                        {"name": "hello", "action": "shell", "args": {"command": "echo hi from $DEVSCHED_DEVICE_ID"}},
                        # issue 12: an artifact goes through the host's upload subject and the scheduler
                        {
                            "name": "art",
                            "action": "shell",
                            "args": {"command": "echo art > $DEVSCHED_ARTIFACTS_DIR/a.txt"},
                        },
                    ]
                },
                selector={"platform": "sim"},
            )
            view = await asyncio.wait_for(client.wait(submitted.task_id), timeout=60)
            assert view.status.value == "done", view
            assert "hi from sim-7" in str(view.result)
            # the agent streamed the step's output into DEVSCHED_LOGS, and the operator reads it
            assert await collect_output(client.logs(submitted.task_id)) == b"hi from sim-7\n"
            # the scheduler moved the host's upload into the bucket, and the operator reads it from there
            assert [a.name for a in view.artifacts] == ["a.txt"]
            assert await client.artifact_bytes(submitted.task_id, "a.txt") == b"art\n"

        # Another host: its own subjects only. Violations arrive as asynchronous errors.
        violations: list[str] = []

        async def on_error(exc: Exception) -> None:
            violations.append(str(exc))

        neighbour = await nats.connect(url("host-bench-08", "h08pw"), error_cb=on_error, allow_reconnect=False)
        try:
            await neighbour.subscribe("_INBOX.bench-07.>")
            await neighbour.publish("devsched.host.bench-07.claim", b"{}")
            await neighbour.flush()
            await eventually(lambda: len(violations) >= 2, message="both refused by the server")
        finally:
            await neighbour.close()
        refused = [v.lower() for v in violations]  # nats-py lower-cases the server's message
        assert any("subscription" in v and "_inbox.bench-07.>" in v for v in refused), violations
        assert any("publish" in v and "devsched.host.bench-07.claim" in v for v in refused), violations
        for p in processes:
            log = p.log_path.read_text()
            assert "permissions violation" not in log.lower(), f"{p.module} hit a permission it lacks"
            assert "pw@" not in log, f"{p.module} logged a NATS password"
    finally:
        for p in reversed(processes):
            p.stop()
