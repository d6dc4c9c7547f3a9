"""Replies that fit NATS's `max_payload`, over real NATS and Postgres: pages cut by bytes and followed to the
end, large fields cut with a flag, and a view too large for one reply trimmed, or shown whole field by field."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from nats.aio.client import Client as NatsClient

from devsched.client import Client
from devsched.scheduler.app import Scheduler
from support.scheduler_harness import TestHost, api, call, submit

pytestmark = pytest.mark.integration

KiB = 1024


def shell_plan(command_kib: int) -> dict[str, Any]:
    return {"steps": [{"name": "run", "action": "shell", "args": {"command": "echo " + "x" * command_kib * KiB}}]}


async def listed(nc: NatsClient, prefix: str, **request: Any) -> tuple[list[dict[str, Any]], list[int]]:
    """Every task, following `next`; and each page's size in bytes."""
    tasks: list[dict[str, Any]] = []
    sizes: list[int] = []
    after = None
    for _ in range(100):  # bounded
        msg = await nc.request(api(prefix, "tasks.list"), json.dumps({**request, "after": after}).encode(), timeout=10)
        assert not (msg.headers or {}).get("Nats-Service-Error-Code"), msg.data[:300]
        page = json.loads(msg.data)
        sizes.append(len(msg.data))
        tasks += page["tasks"]
        after = page["next"]
        if after is None:
            return tasks, sizes
    raise AssertionError("the pages never ended")


async def test_a_list_of_large_plans_is_paged_by_bytes(
    scheduler: Scheduler, nc: NatsClient, subject_prefix: str
) -> None:
    ids = [await submit(nc, subject_prefix, plan=shell_plan(300), selector={"labels": {"none": "x"}}) for _ in range(7)]
    tasks, sizes = await listed(nc, subject_prefix, limit=100)
    assert [t["task_id"] for t in tasks] == ids[::-1], "every task once, newest first"
    assert len(sizes) >= 3, f"7 plans of 300 KiB need 3 pages at least: {sizes}"
    assert max(sizes) <= nc.max_payload - 8 * KiB
    assert all("truncated" not in t for t in tasks), "a plan is never cut"


async def test_large_metadata_is_cut_in_a_list_and_whole_in_the_view(
    scheduler: Scheduler, nc: NatsClient, subject_prefix: str
) -> None:
    metadata = {"blob": "m" * 60 * KiB}  # near the bound of a request's metadata (64 KiB), far above a list's 4
    ids = [await submit(nc, subject_prefix, metadata=metadata, selector={"labels": {"none": "x"}}) for _ in range(3)]
    small = await submit(nc, subject_prefix, metadata={"ci": "run-1"}, selector={"labels": {"none": "x"}})
    tasks, sizes = await listed(nc, subject_prefix, limit=100)
    assert len(sizes) == 1, "cut metadata leaves the page small"
    by_id = {t["task_id"]: t for t in tasks}
    for task_id in ids:
        assert by_id[task_id]["metadata"] == {}
        assert by_id[task_id]["truncated"] == ["metadata"]
    assert by_id[small]["metadata"] == {"ci": "run-1"}
    assert "truncated" not in by_id[small]
    view = await call(nc, api(subject_prefix, "tasks.get"), {"task_id": ids[0]})
    assert view["metadata"] == metadata, "a view that fits is shown whole"
    assert "truncated" not in view


async def test_a_view_above_max_payload_is_trimmed_and_each_field_can_be_had_whole(
    scheduler: Scheduler, nc: NatsClient, subject_prefix: str, make_host: Callable[..., TestHost]
) -> None:
    host = make_host()
    await host.register("d1")
    metadata = {"blob": "m" * 60 * KiB}
    task_id = await submit(nc, subject_prefix, metadata=metadata, plan=shell_plan(300))
    assigned = await host.next_assignment()
    await host.claim(assigned)
    tail = "\x01" * 64 * KiB  # the longest tail, of a control character: 6 bytes in JSON (\u0001), 384 KiB
    result = {"steps": [{"name": "run", "status": "done", "exit_code": 0, "output_tail": tail}]}
    await host.report(assigned, result=result)

    msg = await nc.request(api(subject_prefix, "tasks.get"), json.dumps({"task_id": task_id}).encode(), timeout=10)
    assert not (msg.headers or {}).get("Nats-Service-Error-Code"), msg.data[:300]
    view = json.loads(msg.data)
    assert len(msg.data) <= nc.max_payload - 8 * KiB
    assert view["status"] == "done"
    assert view["truncated"], "something was cut, and said so"

    for field in view["truncated"]:
        whole = await call(nc, api(subject_prefix, "tasks.get"), {"task_id": task_id, "full": [field]})
        assert field not in whole.get("truncated", [])
        if field == "metadata":
            assert whole["metadata"] == metadata
        if field == "result":
            assert whole["result"]["steps"][0]["output_tail"] == tail

    client = Client(nc, prefix=subject_prefix)
    trimmed = await client.get(task_id)
    assert trimmed.truncated == view["truncated"]
    shown = await client.get(task_id, full=["result"])
    assert shown.result is not None
    assert shown.result.steps[0].output_tail == tail


async def test_hosts_list_is_paged_by_bytes(
    scheduler: Scheduler, nc: NatsClient, subject_prefix: str, make_host: Callable[..., TestHost]
) -> None:
    labels = {f"label-{i}": "v" * 240 for i in range(100)}  # the most labels a device has, about 25 KiB
    hosts = [make_host() for _ in range(4)]
    for n, host in enumerate(hosts):  # about 375 KiB of labels a host
        await host.register(*((f"big-{n}-{d}", labels) for d in range(15)), bind=False)
    seen: list[str] = []
    after = None
    pages = 0
    while pages < 20:
        reply = await call(nc, api(subject_prefix, "hosts.list"), {} if after is None else {"after": after})
        pages += 1
        seen += [h["host_id"] for h in reply["hosts"]]
        after = reply["next"]
        if after is None:
            break
    assert sorted(seen) == sorted(h.host_id for h in hosts)
    assert len(seen) == len(set(seen))
    assert pages >= 2
    listed = await Client(nc, prefix=subject_prefix).hosts()
    assert sorted(h.host_id for h in listed) == sorted(seen), "the client follows next"
