"""Plug-in actions with the real agent (issue 13 item 5): the example `adb-instrument` against a stand-in adb.

The agent process loads the plug-in from its entry point (the workspace installs `devsched-action-adb`),
advertises it with its args schema, and runs it; the scheduler checks a plug-in step's args at submit and
places the task only on a host that offers the action, and a plan needing an action no host has waits with
its reason.
"""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from support.agent_e2e import AgentLab
from support.polling import eventually
from support.scheduler_harness import ErrorReply, api, call

pytestmark = pytest.mark.e2e

TTL_S = 5
RUNNER = "com.example.app.test/androidx.test.runner.AndroidJUnitRunner"

#: A stand-in for adb: logs each call with the serial it was given, answers installs, and prints the raw
#: output of an instrumentation run that passes, or fails when `FAKE_ADB_RESULT=fail`.
STAND_IN = """#!/bin/sh
echo "serial=$ANDROID_SERIAL $*" >> {calls}
case "$1" in
  install) echo "Performing Streamed Install"; echo "Success" ;;
  shell)
    echo "INSTRUMENTATION_STATUS: test=testBoots"
    if [ "$FAKE_ADB_RESULT" = fail ]; then
      echo "INSTRUMENTATION_STATUS_CODE: -2"
      echo "INSTRUMENTATION_RESULT: stream="
      echo "FAILURES!!!"
      echo "Tests run: 1,  Failures: 1"
    else
      echo "INSTRUMENTATION_STATUS_CODE: 0"
      echo "INSTRUMENTATION_RESULT: stream="
      echo "OK (1 test)"
    fi
    echo "INSTRUMENTATION_CODE: -1" ;;
  *) echo "unexpected: $*" >&2; exit 2 ;;
esac
"""


def stand_in_adb(lab: AgentLab) -> tuple[Path, Path]:
    """(the stand-in adb, the file of its calls)."""
    adb, calls = lab.path("adb"), lab.path("adb-calls.txt")
    adb.write_text(STAND_IN.format(calls=calls))
    adb.chmod(adb.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    calls.touch()
    calls.chmod(0o666)
    return adb, calls


def instrument(**args: object) -> dict[str, object]:
    return {"name": "instrument", "action": "adb-instrument", "args": {"runner": RUNNER, **args}}


async def test_a_plugin_action_runs_on_a_host_that_offers_it(lab: AgentLab) -> None:
    adb, calls = stand_in_adb(lab)
    agent = await lab.agent("phone", env={"ADB": str(adb), "ANDROID_SERIAL": "emulator-5554"}).ready()
    task_id = await lab.submit(
        [
            instrument(
                apk="/srv/app.apk", test_apk="/srv/app-test.apk", instrument_args={"class": "com.example.BootTest"}
            )
        ],
        lease_ttl_s=TTL_S,
    )
    view = await lab.wait_status(task_id, "done", "failed")
    assert (view["status"], view["reason"]) == ("done", None)
    assert calls.read_text().splitlines() == [
        "serial=emulator-5554 install -r -t -g /srv/app.apk",
        "serial=emulator-5554 install -r -t -g /srv/app-test.apk",
        f"serial=emulator-5554 shell am instrument -w -r -e class com.example.BootTest {RUNNER}",
    ]
    assert "OK (1 test)" in view["result"]["steps"][0]["output_tail"]
    assert agent.lines("plug-in action loaded", action="adb-instrument", version="0.1.0")

    # the host advertises it; its devices show only their own labels
    listed = await call(lab.nc, api(lab.prefix, "hosts.list"), {})
    (host,) = [h for h in listed["hosts"] if h["host_id"] == agent.host_id]
    assert {"name": "adb-instrument", "version": "0.1.0"} in host["actions"]
    assert {a["name"] for a in host["actions"]} == {"adb-instrument", "noop", "shell", "sleep"}
    assert host["devices"][0]["labels"] == lab.label


async def test_failing_instrumentation_fails_the_step(lab: AgentLab) -> None:
    adb, _ = stand_in_adb(lab)
    await lab.agent("phone", env={"ADB": str(adb), "FAKE_ADB_RESULT": "fail"}).ready()
    view = await lab.wait_status(await lab.submit([instrument()], lease_ttl_s=TTL_S), "done", "failed")
    assert view["status"] == "failed"
    step = view["result"]["steps"][0]
    assert step["status"] == "failed"
    assert "adb-instrument: tests failed" in step["output_tail"]


async def test_a_plan_needing_an_action_no_host_has_waits_with_its_reason(lab: AgentLab) -> None:
    await lab.agent("phone").ready()
    task_id = await lab.submit([{"name": "flash", "action": "flash-firmware", "args": {"image": "x.img"}}])

    async def waiting() -> str | None:
        reason = (await lab.task(task_id)).get("pending_reason")
        return reason if reason and reason.startswith("no_host_with_action") else None

    reason = await eventually(waiting, timeout=10, message="the task waits for a host with the action")
    assert reason == "no_host_with_action: no host with a matching device offers flash-firmware"
    view = await lab.task(task_id)
    assert view["status"] == "queued"
    assert view["selector"]["labels"] == lab.label
    await lab.cancel(task_id)


async def test_plugin_args_are_checked_at_submit_against_the_advertised_schema(lab: AgentLab) -> None:
    await lab.agent("phone").ready()
    with pytest.raises(ErrorReply) as caught:
        await lab.submit([{"name": "t", "action": "adb-instrument", "args": {"runer": RUNNER}}])
    assert (caught.value.status, caught.value.code) == (400, "invalid_request")
    errors = caught.value.details["errors"]
    assert {e["path"] for e in errors} == {"plan.steps.0.args"}
    messages = sorted(e["message"] for e in errors)
    assert messages == [
        "invalid adb-instrument args: 'runner' is a required property",
        "invalid adb-instrument args: Additional properties are not allowed ('runer' was unexpected)",
    ]
