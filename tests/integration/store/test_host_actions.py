"""Plug-in actions in the store: a host's advertised actions, its devices' derived labels, and the wait.

A task whose plan uses a plug-in carries the action's reserved label in its selector (the scheduler adds
it at submit, `devsched.core.actions`); here the selector is built the same way, and the store is shown to
place it only on a device whose host advertised the action, to say why it waits, and to keep the derived
labels out of every view.
"""

from __future__ import annotations

import pytest
from sqlalchemy import text

from devsched.core.actions import action_labels
from devsched.core.status import TaskStatus
from devsched.core.views import ActionInfo
from devsched.store import ActionSpec, DeviceSpec
from support.store_lab import Lab

pytestmark = pytest.mark.integration

ADB_SCHEMA = {"type": "object", "required": ["runner"]}
BUILTINS = [ActionSpec("noop"), ActionSpec("shell"), ActionSpec("sleep")]
PLUGIN_PLAN = {"steps": [{"name": "tests", "action": "adb-instrument", "args": {"runner": "a/b"}}]}


async def test_a_plugin_task_waits_for_a_host_with_the_action_and_says_why(lab: Lab) -> None:
    await lab.store.register_host("plain", [DeviceSpec("d-plain", {"platform": "android"})], "1.0", BUILTINS)
    task = await lab.submit(plan=PLUGIN_PLAN, labels={"platform": "android", **action_labels(["adb-instrument"])})
    assert await lab.store.assign() == []
    view = await lab.store.get_task(task)
    assert view.status is TaskStatus.QUEUED
    assert view.pending_reason == "no_host_with_action: no host with a matching device offers adb-instrument"
    assert view.selector.labels == {"platform": "android"}  # the derived label stays out of the view

    offered = [*BUILTINS, ActionSpec("adb-instrument", "0.1.0", ADB_SCHEMA)]
    await lab.store.register_host("adb", [DeviceSpec("d-adb", {"platform": "android"})], "1.0", offered)
    (assigned,) = await lab.store.assign()
    assert (assigned.task_id, assigned.device_id) == (task, "d-adb")


async def test_a_host_lists_its_actions_and_its_devices_only_their_own_labels(lab: Lab) -> None:
    offered = [*BUILTINS, ActionSpec("adb-instrument", "0.1.0", ADB_SCHEMA)]
    await lab.store.register_host("adb", [DeviceSpec("d1", {"platform": "android"})], "1.0", offered)
    (host,) = await lab.store.list_hosts()
    assert host.actions == (
        ActionInfo("noop", None), ActionInfo("shell", None), ActionInfo("sleep", None),
        ActionInfo("adb-instrument", "0.1.0"),
    )  # fmt: skip
    assert host.devices[0].labels == {"platform": "android"}
    stored = await lab.store.engine.connect()
    try:
        labels = (await stored.execute(text("SELECT labels FROM devices WHERE device_id = 'd1'"))).scalar_one()
    finally:
        await stored.close()
    assert labels == {"platform": "android", "devsched.action.adb-instrument": "true"}

    # registering again without the plug-in takes its label away: no more plug-in work comes here
    await lab.store.register_host("adb", [DeviceSpec("d1", {"platform": "android"})], "1.0", BUILTINS)
    task = await lab.submit(plan=PLUGIN_PLAN, labels=action_labels(["adb-instrument"]))
    assert await lab.store.assign() == []
    assert (await lab.store.get_task(task)).pending_reason is not None


async def test_an_agent_from_before_plugins_offers_none_and_runs_builtins(lab: Lab) -> None:
    await lab.store.register_host("old", [DeviceSpec("d1", {"platform": "android"})], "0.0.9")
    (host,) = await lab.store.list_hosts()
    assert host.actions == ()
    plain = await lab.submit(labels={"platform": "android"})
    assert [m.task_id for m in await lab.store.assign()] == [plain]


async def test_each_actions_schemas_come_newest_first_without_repeats(lab: Lab) -> None:
    v1 = {"type": "object"}
    v2 = {"type": "object", "required": ["runner"]}
    await lab.store.register_host("a", [DeviceSpec("da")], None, [ActionSpec("adb-instrument", "1", v1)])
    lab.clock.advance(1)
    await lab.store.register_host("b", [DeviceSpec("db")], None, [ActionSpec("adb-instrument", "2", v2)])
    lab.clock.advance(1)
    await lab.store.register_host("c", [DeviceSpec("dc")], None, [ActionSpec("adb-instrument", "2", v2)])
    lab.clock.advance(1)
    await lab.store.register_host("d", [DeviceSpec("dd")], None, [ActionSpec("flash", None, None)])
    schemas = await lab.store.action_schemas(["adb-instrument", "flash", "missing"])
    assert schemas == {"adb-instrument": [v2, v1], "flash": [None]}
