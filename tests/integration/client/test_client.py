"""`devsched.client.Client` against the real scheduler, sweeper and agent (as processes)."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from devsched.client import (
    Client,
    InvalidRequest,
    NatsUnreachable,
    NoReply,
    NotFound,
    PlanFileError,
    TaskStatus,
    TooLarge,
    describe,
    field_errors,
)
from devsched.client.client import AUTO_KEY_PREFIX
from devsched.client.watch import collect
from devsched.core.status import EventKind
from support.devsched_stack import Stack
from support.polling import eventually

pytestmark = pytest.mark.integration

SIM = {"platform": "sim"}


def shell(name: str, command: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "action": "shell", "args": {"command": command}, **extra}


def sleep(name: str, seconds: float, **extra: Any) -> dict[str, Any]:
    return {"name": name, "action": "sleep", "args": {"seconds": seconds}, **extra}


async def test_submit_watch_and_get_a_task_that_succeeds(client: Client) -> None:
    reply = await client.submit(
        {"steps": [shell("hello", "echo hello from $DEVSCHED_DEVICE_ID"), {"name": "end", "action": "noop"}]},
        selector=SIM,
        name="hello",
        priority=7,
    )
    assert reply.created
    assert reply.status is TaskStatus.QUEUED

    events = await collect(client.watch(reply.task_id))

    kinds = [e.event for e in events]
    assert kinds[0] is EventKind.SUBMITTED
    assert kinds[-1] is EventKind.DONE
    assert EventKind.DISPATCHED in kinds
    seqs = [e.seq for e in events]
    assert len(set(seqs)) == len(seqs)
    assert sorted(seqs) == list(range(1, len(seqs) + 1))  # nothing missing from the stream
    progress = [e.progress.step for e in events if e.progress is not None]
    assert progress == ["hello", "end"]

    view = await client.get(str(reply.task_id))
    assert view.status is TaskStatus.DONE
    assert view.name == "hello"
    assert view.priority == 7
    assert view.selector.labels == SIM
    assert [a.status for a in view.attempts] == ["done"]
    assert view.result is not None
    assert "hello from" in (view.result.steps[0].output_tail or "")


async def test_wait_returns_the_final_view_of_a_failing_task(client: Client) -> None:
    reply = await client.submit(
        {"steps": [shell("test", "echo boom >&2; exit 3"), shell("never", "true"), shell("logs", "true", always=True)]},
        selector=SIM,
    )

    view = await client.wait(reply.task_id, timeout=60)

    assert view.status is TaskStatus.FAILED
    assert view.result is not None
    assert [(s.name, s.status) for s in view.result.steps] == [
        ("test", "failed"),
        ("never", "skipped"),
        ("logs", "done"),
    ]
    assert view.result.steps[0].exit_code == 3


async def test_submit_file_reads_a_bare_yaml_plan_and_a_whole_json_request(client: Client, tmp_path: Path) -> None:
    bare = tmp_path / "plan.yaml"
    bare.write_text("steps:\n  - name: one\n    action: noop\n")
    whole = tmp_path / "request.json"
    whole.write_text(json.dumps({"name": "from-json", "priority": 3, "selector": {"labels": SIM},
                                 "plan": {"steps": [{"name": "one", "action": "noop"}]}}))  # fmt: skip

    from_yaml = await client.submit_file(bare, selector=SIM, max_attempts=2, lease_ttl_s=10)
    from_json = await client.submit_file(whole, priority=4)

    yaml_view = await client.get(from_yaml.task_id)
    assert (yaml_view.max_attempts, yaml_view.lease_ttl_s, yaml_view.selector.labels) == (2, 10, SIM)
    json_view = await client.get(from_json.task_id)
    assert (json_view.name, json_view.priority) == ("from-json", 4)  # the override wins over the file
    for task_id in (from_yaml.task_id, from_json.task_id):
        assert (await client.wait(task_id, timeout=60)).status is TaskStatus.DONE


async def test_a_repeated_idempotency_key_returns_the_existing_task(client: Client) -> None:
    key = f"ci-{uuid.uuid4()}"
    first = await client.submit({"steps": [{"name": "a", "action": "noop"}]}, selector=SIM, idempotency_key=key)
    again = await client.submit({"steps": [{"name": "a", "action": "noop"}]}, selector=SIM, idempotency_key=key)
    assert first.created
    assert not again.created
    assert again.task_id == first.task_id


async def test_list_iterates_pages_newest_first(client: Client) -> None:
    tag = uuid.uuid4().hex
    # Queued forever (no device matches), so they stay put while the listing runs.
    submitted = [
        (await client.submit({"steps": [{"name": "a", "action": "noop"}]}, selector={"platform": tag})).task_id
        for _ in range(5)
    ]

    pages = [page async for page in client.pages(status="queued", page_size=2)]
    listed = [t.task_id for page in pages for t in page.tasks]
    mine = [task_id for task_id in listed if task_id in submitted]
    assert mine == list(reversed(submitted))
    assert len(pages) >= 3
    assert pages[-1].next is None

    limited = [t async for t in client.list(status=TaskStatus.QUEUED, limit=3, page_size=2)]
    assert len(limited) == 3
    for task_id in submitted:
        await client.cancel(task_id)


async def test_cancel_a_running_task_ends_its_watch_cancelled(client: Client) -> None:
    reply = await client.submit(
        {"steps": [sleep("soak", 120, interruptible=True), shell("teardown", "echo teardown", always=True)]},
        selector=SIM,
    )

    async def running() -> bool:
        view = await client.get(reply.task_id)
        return view.status is TaskStatus.DISPATCHED and bool(view.attempts) and view.attempts[-1].progress is not None

    await eventually(running, timeout=30, message="the task runs")
    cancelled = await client.cancel(reply.task_id, "enough")
    assert cancelled.cancel_requested

    async with client.watch(reply.task_id) as events:
        seen = [event async for event in events]
    assert seen[-1].event is EventKind.CANCELLED
    assert any(e.event is EventKind.CANCEL_REQUESTED and e.reason == "enough" for e in seen)
    view = await client.get(reply.task_id)
    assert view.status is TaskStatus.CANCELLED
    assert view.result is not None
    assert [s.status for s in view.result.steps] == ["interrupted", "done"]

    again = await client.cancel(reply.task_id)  # harmless to repeat on a terminal task
    assert (again.status, again.cancel_requested) == (TaskStatus.CANCELLED, False)


async def test_cancel_a_queued_task_ends_it_at_once(client: Client) -> None:
    reply = await client.submit({"steps": [{"name": "a", "action": "noop"}]}, selector={"platform": "none-such"})
    queued = await client.get(reply.task_id)
    assert queued.status is TaskStatus.QUEUED

    cancelled = await client.cancel(reply.task_id)

    assert (cancelled.status, cancelled.cancel_requested) == (TaskStatus.CANCELLED, False)
    assert (await client.get(reply.task_id)).reason == "cancelled_while_queued"


async def test_watch_of_an_ended_task_replays_its_events_once_each(client: Client) -> None:
    reply = await client.submit({"steps": [{"name": "a", "action": "noop"}]}, selector=SIM)
    first = await collect(client.watch(reply.task_id))
    assert first[-1].event is EventKind.DONE
    # A second relay publishing the same event again (another message id) must not show twice.
    js = client.nc.jetstream()
    await js.publish(client.subjects.task_events(reply.task_id), first[0].model_dump_json().encode(),
                     headers={"Nats-Msg-Id": f"dup-{uuid.uuid4()}"})  # fmt: skip

    again = await collect(client.watch(reply.task_id))

    assert [e.seq for e in again] == [e.seq for e in first]


async def test_hosts_and_drain(client: Client, stack: Stack) -> None:
    hosts = {h.host_id: h for h in await client.hosts()}
    host = hosts[stack.host_id]
    assert host.online
    assert sorted(d.device_id for d in host.devices) == sorted(stack.device_ids)

    device = stack.device_ids[-1]
    drained = await client.drain(device, reason="flaky USB hub")
    assert (drained.drained, drained.state, drained.drain_reason) == (True, "drained", "flaky USB hub")
    states = {d.device_id: d.state for h in await client.hosts() for d in h.devices}
    assert states[device] == "drained"

    back = await client.drain(device, drained=False)
    assert not back.drained
    assert back.state != "drained"


# -- typed errors ---------------------------------------------------------------------------------------


async def test_unknown_task_is_not_found_for_get_cancel_and_watch(client: Client) -> None:
    missing = uuid.uuid4()
    with pytest.raises(NotFound) as get_error:
        await client.get(missing)
    assert (get_error.value.code, get_error.value.status) == ("not_found", 404)
    with pytest.raises(NotFound):
        await client.cancel(missing)
    with pytest.raises(NotFound):
        await collect(client.watch(missing))
    with pytest.raises(NotFound):
        await client.drain("no-such-device")


async def test_a_malformed_task_id_is_rejected_before_sending(client: Client) -> None:
    with pytest.raises(InvalidRequest) as caught:
        await client.get("not-a-uuid")
    assert field_errors(caught.value) == [("task_id", "not a task id (a UUID): 'not-a-uuid'")]


async def test_an_invalid_plan_carries_the_servers_field_paths(client: Client) -> None:
    with pytest.raises(InvalidRequest) as caught:
        await client.submit({"steps": [{"name": "a", "action": "sleep", "args": {"seconds": -1}}, {"name": "b"}]},
                            priority=5000)  # fmt: skip
    paths = [path for path, _ in field_errors(caught.value)]
    assert paths == ["plan.steps.0.args.seconds", "plan.steps.1.action", "priority"]
    assert caught.value.code == "invalid_request"
    assert describe(caught.value).startswith("invalid_request: plan.steps.0.args.seconds: invalid sleep args: ")


async def test_the_servers_own_400_comes_back_typed_with_its_path(client: Client) -> None:
    with pytest.raises(InvalidRequest) as caught:
        await client.list_page(after="not-a-cursor")
    assert caught.value.status == 400
    assert [path for path, _ in field_errors(caught.value)] == ["after"]


async def test_a_payload_above_the_limit_is_too_large(client: Client) -> None:
    steps = [shell(f"s{i}", "echo " + "x" * 6000) for i in range(100)]  # ~600 KB, above the 512 KiB limit
    with pytest.raises(TooLarge) as caught:
        await client.submit({"steps": steps}, selector=SIM)
    assert (caught.value.code, caught.value.status) == ("too_large", 413)
    assert caught.value.details["limit"] == 512 * 1024


async def test_a_plan_file_that_does_not_parse(client: Client, tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("steps: [\n")
    with pytest.raises(PlanFileError) as caught:
        await client.submit_file(broken)
    assert caught.value.code == "invalid_request"
    assert "not valid YAML" in caught.value.message


async def test_nobody_serving_the_prefix_is_no_reply(stack: Stack) -> None:
    async with await Client.connect(stack.nats_url, prefix=f"{stack.prefix}-nobody", timeout=0.5, retries=0) as c:
        with pytest.raises(NoReply) as caught:
            await c.hosts()
    assert (caught.value.code, caught.value.retryable) == ("no_reply", True)


async def test_an_unreachable_server_is_nats_unreachable() -> None:
    with pytest.raises(NatsUnreachable) as caught:
        await Client.connect("nats://127.0.0.1:1", connect_timeout=0.5)
    assert caught.value.code == "nats_unreachable"
    assert "127.0.0.1:1" in caught.value.message


async def test_a_submit_retried_after_a_lost_reply_creates_one_task(stack: Stack) -> None:
    # The scheduler is frozen while the client's first tries time out; once it thaws it answers every try it
    # got. Without a key of the caller's, the client's own key makes the tries one task, and says it created it.
    scheduler = next(p for p in stack.procs if p.name == "scheduler")
    name = f"retried-{uuid.uuid4().hex[:8]}"
    async with await Client.connect(stack.nats_url, prefix=stack.prefix, timeout=0.5, retries=8) as c:
        scheduler.pause()
        try:
            submitting = asyncio.create_task(
                c.submit({"steps": [{"name": "a", "action": "noop"}]}, selector=SIM, name=name)
            )
            await asyncio.sleep(1.2)  # at least two tries time out while it is frozen
            assert not submitting.done()
        finally:
            scheduler.resume()
        reply = await asyncio.wait_for(submitting, timeout=30)
        assert reply.created
        view = await c.get(reply.task_id)
        assert view.idempotency_key is not None
        assert view.idempotency_key.startswith(AUTO_KEY_PREFIX)
        tasks = [t async for t in c.list()]
    assert [t.task_id for t in tasks if t.name == name] == [reply.task_id]
