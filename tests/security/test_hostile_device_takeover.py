"""A host cannot take another host's device, nor out-label an operator, against the real scheduler process.

Host A registers its device and goes idle the ways an agent does: it withdraws its devices (a drain or a
shutdown), its device is drained by an operator, it comes back (a restart). Each time host B registers
A's device id: refused 409 `device_conflict` naming the device, nothing of B's registration is kept, and
A registers it again. A task pinned to the device goes to A only. Then B asserts the labels an operator
pinned elsewhere, on its own device whose key the operator pinned too: the operator's value stays, and a
selector of the pinned value never reaches B.

The takeover of an idle device is tried again with the deploy accounts (deploy/nats/accounts.conf), each host
speaking through its own account: the refusal is the scheduler's 409, not a dropped message.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client as NatsClient

from support.scheduler_harness import (
    ErrorReply,
    TestHost,
    api,
    call,
    delete_streams,
    scheduler_process,
    service_env,
    submit,
)
from support.secured_nats import PREFIX, SCHEDULER_SETTINGS, SecuredNats, account_host, secured_nats

pytestmark = [pytest.mark.security, pytest.mark.e2e]


async def _devices(nc: NatsClient, prefix: str) -> dict[str, tuple[str, dict[str, Any]]]:
    """Every listed device: its host and its view."""
    hosts = (await call(nc, api(prefix, "hosts.list")))["hosts"]
    return {d["device_id"]: (h["host_id"], d) for h in hosts for d in h["devices"]}


async def _refused(thief: TestHost, *devices: str | tuple[str, dict[str, str]]) -> ErrorReply:
    with pytest.raises(ErrorReply) as err:
        await thief.register(*devices, bind=False)
    return err.value


async def test_a_host_cannot_take_an_idle_device_of_another_host(
    database_url: str, nats_url: str, subject_prefix: str, nc: NatsClient, tmp_path: Path
) -> None:
    scheduler = scheduler_process(service_env(database_url, nats_url, subject_prefix), tmp_path / "sched.log").start()
    owner, thief = TestHost(nc, subject_prefix, "owner"), TestHost(nc, subject_prefix, "thief")
    p = subject_prefix
    try:
        await scheduler.wait_logged("serving")
        await owner.register(("lab-7", {"platform": "android"}))
        await thief.register("thief-1")

        async def attempt_takeover(when: str) -> None:
            err = await _refused(thief, "thief-1", ("lab-7", {"platform": "android", "pool": "release"}))
            assert (err.status, err.code) == (409, "device_conflict"), when
            assert "lab-7" in err.message, when
            listed = await _devices(nc, p)
            assert listed["thief-1"][0] == "thief", f"{when}: the thief's registration changed nothing"
            assert listed.get("lab-7", ("owner",))[0] == "owner", when

        await owner.register(bind=False)  # withdrawn: the agent drains or stops, the device is idle
        await attempt_takeover("after the owner withdrew")
        await call(nc, api(p, "devices.drain"), {"device_id": "lab-7", "reason": "maintenance"})
        await attempt_takeover("while an operator drains it")
        await owner.register(("lab-7", {"platform": "android"}))  # the owner's agent starts again
        await attempt_takeover("after the owner restarted")
        await call(nc, api(p, "devices.drain"), {"device_id": "lab-7", "drained": False})

        pinned = await submit(nc, p, selector={"device_id": "lab-7"})
        got = await owner.next_assignment(timeout=20)
        assert got.task_id == pinned, "the task pinned to the device goes to its owner"
        assert await thief.no_assignment(wait=1.0), "and never to the thief"
        await owner.claim(got)
        await owner.report(got)

        # Operator labels win: pinned on the owner's device, and on the thief's own device.
        await call(nc, api(p, "devices.label"), {"device_id": "lab-7", "labels": {"pool": "release"}})
        await call(nc, api(p, "devices.label"), {"device_id": "thief-1", "labels": {"pool": "ci"}})
        await thief.register(("thief-1", {"pool": "release", "platform": "android"}))  # asserts the pinned value
        thief_view = (await _devices(nc, p))["thief-1"][1]
        assert thief_view["labels"] == {"pool": "ci", "platform": "android"}
        assert thief_view["operator_labels"] == {"pool": "ci"}
        for _ in range(3):
            task = await submit(nc, p, selector={"labels": {"pool": "release"}})
            got = await owner.next_assignment(timeout=20)
            assert got.task_id == task
            await owner.claim(got)
            await owner.report(got)
        assert await thief.no_assignment(wait=1.0), "a selector the operator pinned never reaches the thief"

        # Only an operator frees a device; then it is the next registrant's.
        await owner.register(("other", {}), bind=False)
        freed = await call(nc, api(p, "devices.forget"), {"device_id": "lab-7", "reason": "moved to the thief"})
        assert (freed["host_id"], freed["actor"]) == ("owner", "operator-api")
        await thief.register("thief-1", "lab-7")
        assert (await _devices(nc, p))["lab-7"][0] == "thief"
        await scheduler.wait_logged("device forgotten: the next host that registers it owns it", timeout=5)
    finally:
        for host in (owner, thief):
            await host.close()
        scheduler.kill()
        await delete_streams(nc, subject_prefix)


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[SecuredNats]:
    with secured_nats(tmp_path / "nats") as server:
        yield server


async def test_a_host_cannot_take_an_idle_device_of_another_host_with_the_deploy_accounts(
    secured: SecuredNats, database_url: str, tmp_path: Path
) -> None:
    env = service_env(database_url, secured.url("scheduler"), PREFIX, **SCHEDULER_SETTINGS)
    scheduler = scheduler_process(env, tmp_path / "sched.log").start()
    connections: list[NatsClient] = []
    try:
        await scheduler.wait_logged("serving")
        operator = await nats.connect(secured.url("operator"))
        connections.append(operator)
        owner, owner_connection = await account_host(secured, "bench-07")
        thief, thief_connection = await account_host(secured, "bench-08")
        connections += [owner.nc, thief.nc]
        await owner.register(("lab-7", {"platform": "android"}))
        await thief.register("bench-08-d1")

        await owner.register(bind=False)  # withdrawn: the agent drains or stops, the device is idle
        err = await _refused(thief, "bench-08-d1", ("lab-7", {"platform": "android"}))
        assert (err.status, err.code) == (409, "device_conflict")
        assert "lab-7" in err.message
        listed = await _devices(operator, PREFIX)
        assert listed["bench-08-d1"][0] == "bench-08", "the thief's registration changed nothing"
        assert listed.get("lab-7", ("bench-07",))[0] == "bench-07"

        await owner.register(("lab-7", {"platform": "android"}))  # the owner's agent starts again
        assert (await _devices(operator, PREFIX))["lab-7"][0] == "bench-07"
        pinned = await submit(operator, PREFIX, selector={"device_id": "lab-7"})
        got = await owner.next_assignment(timeout=20)
        assert got.task_id == pinned, "the task pinned to the device goes to its owner"
        assert await thief.no_assignment(wait=1.0), "and never to the thief"
        await owner.claim(got)
        assert owner_connection.violations == [], "the owner used only its own subjects"
        assert thief_connection.violations == [], "the thief was refused by the scheduler, not by NATS"
    finally:
        for nc in connections:
            await nc.close()
        scheduler.kill()
