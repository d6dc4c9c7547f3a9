"""A host cannot take another host's device, nor out-label an operator, against the real scheduler process.

Behind a nats-server with the deploy accounts (deploy/nats/accounts.conf): each host speaks through its own
account, the operator through the operator user. Host A registers its device and goes idle the ways an agent
does: it withdraws its devices (a drain or a shutdown), its device is drained by an operator, it comes back
(a restart). Each time host B registers A's device id: refused by the scheduler, 409 `device_conflict`
naming the device (not a dropped message), nothing of B's registration is kept, and A registers it again.
What the scheduler cannot tell apart, B cannot send: a registration in A's name (withdrawing A's devices) and
the operator's device acts (forget, label) are refused by NATS, a permissions violation on B's connection,
and change nothing. A task pinned to the device goes to A only. Then B asserts the labels an operator pinned
elsewhere, on its own device whose key the operator pinned too: the operator's value stays, and a selector of
the pinned value never reaches B. Only the operator frees A's device; then B may register it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client as NatsClient

from support.deploy_lab import deploy_lab
from support.scheduler_harness import ErrorReply, TestHost, api, call, submit
from support.secured_nats import SecuredNats, secured_nats

pytestmark = [pytest.mark.security, pytest.mark.e2e]

OWNER, THIEF = "bench-07", "bench-08"


async def _devices(nc: NatsClient, prefix: str) -> dict[str, tuple[str, dict[str, Any]]]:
    """Every listed device: its host and its view."""
    hosts = (await call(nc, api(prefix, "hosts.list")))["hosts"]
    return {d["device_id"]: (h["host_id"], d) for h in hosts for d in h["devices"]}


async def _refused(thief: TestHost, *devices: str | tuple[str, dict[str, str]]) -> ErrorReply:
    with pytest.raises(ErrorReply) as err:
        await thief.register(*devices, bind=False)
    return err.value


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[SecuredNats]:
    with secured_nats(tmp_path / "nats") as server:
        yield server


async def test_a_host_cannot_take_an_idle_device_of_another_host(
    secured: SecuredNats, database_url: str, tmp_path: Path
) -> None:
    async with deploy_lab(secured, database_url, tmp_path / "sched.log") as lab:
        nc, p = lab.operator, lab.prefix
        owner, thief = await lab.host(OWNER), await lab.host(THIEF)
        thief_device = f"{THIEF}-d1"
        await owner.register(("lab-7", {"platform": "android"}))
        await thief.register(thief_device)

        async def attempt_takeover(when: str) -> None:
            err = await _refused(thief, thief_device, ("lab-7", {"platform": "android", "pool": "release"}))
            assert (err.status, err.code) == (409, "device_conflict"), when
            assert "lab-7" in err.message, when
            listed = await _devices(nc, p)
            assert listed[thief_device][0] == THIEF, f"{when}: the thief's registration changed nothing"
            assert listed.get("lab-7", (OWNER,))[0] == OWNER, when

        # What only the owner or an operator may send: NATS refuses it from the thief, and nothing changes.
        before = await _devices(nc, p)
        await lab.connections[THIEF].refused_publish(owner.subject("register"), b'{"devices": []}')
        for act in ("devices.forget", "devices.label", "devices.drain"):
            await lab.connections[THIEF].refused_publish(api(p, act), b'{"device_id": "lab-7"}')
        assert await _devices(nc, p) == before, "nothing the thief sent in another's name reached the scheduler"

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
        await call(nc, api(p, "devices.label"), {"device_id": thief_device, "labels": {"pool": "ci"}})
        await thief.register((thief_device, {"pool": "release", "platform": "android"}))  # asserts the pinned value
        thief_view = (await _devices(nc, p))[thief_device][1]
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
        assert (freed["host_id"], freed["actor"]) == (OWNER, "operator-api")
        await thief.register(thief_device, "lab-7")
        assert (await _devices(nc, p))["lab-7"][0] == THIEF
        await lab.scheduler.wait_logged("device forgotten: the next host that registers it owns it", timeout=5)
        assert lab.violations(OWNER) == [], "the owner used only its own subjects"
