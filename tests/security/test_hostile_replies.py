"""A submitter's huge tasks cannot make the listings go silent for everyone else.

The real scheduler process, behind a nats-server with the deploy accounts (deploy/nats/accounts.conf): the
submitter is the operator user, the host reports through its own account, and the listings are read as the
dashboard (the `web` user) and the CLI (the `operator` user) read them. A submitter's 400 KiB of metadata is
refused (a request's metadata is bounded); it makes three tasks with 60 KiB of metadata each, five with
300 KiB plans, and one whose host reports a 384 KiB output tail on top of a 300 KiB plan and 60 KiB of
metadata: before replies were bounded, the page holding them was larger than NATS's 1 MiB `max_payload`, no
reply went out, and every `tasks.list` (the CLI's `ls`, the dashboard) timed out; the big task could not be
read at all. Each reader, on a connection of its own, lists every task (paged by bytes, the large metadata
cut and flagged, each page under `max_payload`), reads the big task (trimmed, with `truncated` naming what
was cut), and reads the cut field whole when it asks for it. Meanwhile another host renews its lease (none
lost, p99 under a third of its ttl).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client as NatsClient

from support.deploy_lab import DeployLab, deploy_lab
from support.scheduler_harness import api, submit
from support.secured_nats import SecuredNats, secured_nats
from support.steady_renewals import renew_until

pytestmark = [pytest.mark.security, pytest.mark.e2e]

KiB = 1024
REPLY_LIMIT_SLACK = 8 * KiB
TTL_S = 3


async def ask(nc: NatsClient, subject: str, body: dict[str, Any]) -> tuple[dict[str, Any], int, float]:
    """The reply (an error reply fails the test), its size, and how long it took."""
    started = time.monotonic()
    msg = await nc.request(subject, json.dumps(body).encode(), timeout=5)
    elapsed = time.monotonic() - started
    assert not (msg.headers or {}).get("Nats-Service-Error-Code"), msg.data[:300]
    return json.loads(msg.data), len(msg.data), elapsed


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[SecuredNats]:
    with secured_nats(tmp_path / "nats", hosts=("reporter", "steady")) as server:
        yield server


async def read_everything(
    reader: NatsClient, prefix: str, tasks: list[str], heavy: list[str], big: str, tail: str
) -> str:
    """As one reader: every task listed once, in pages under `max_payload`; the big task read, trimmed, and
    its cut fields whole. A summary line."""
    limit = reader.max_payload - REPLY_LIMIT_SLACK
    seen: list[dict[str, Any]] = []
    sizes: list[int] = []
    after = None
    for _ in range(50):
        page, size, elapsed = await ask(reader, api(prefix, "tasks.list"), {"limit": 100, "after": after})
        assert elapsed < 3, f"a page took {elapsed:.1f} s"
        seen += page["tasks"]
        sizes.append(size)
        after = page["next"]
        if after is None:
            break
    ids = [t["task_id"] for t in seen]
    assert sorted(ids) == sorted(tasks), "every task, once"
    assert len(ids) == len(set(ids))
    assert max(sizes) <= limit, sizes
    assert len(sizes) >= 2, f"5 plans of 300 KiB do not fit one page: {sizes}"
    by_id = {t["task_id"]: t for t in seen}
    for task_id in [*heavy, big]:
        assert by_id[task_id]["metadata"] == {}
        assert "metadata" in by_id[task_id]["truncated"]
    assert "result" in by_id[big]["truncated"]

    view, size, _ = await ask(reader, api(prefix, "tasks.get"), {"task_id": big})
    assert size <= limit
    assert view["status"] == "done"
    assert view["truncated"], "the view says what it cut"
    for field in view["truncated"]:
        whole, size, _ = await ask(reader, api(prefix, "tasks.get"), {"task_id": big, "full": [field]})
        assert size <= limit
        assert field not in whole.get("truncated", [])
    whole, _, _ = await ask(reader, api(prefix, "tasks.get"), {"task_id": big, "full": ["result"]})
    assert [s["output_tail"] for s in whole["result"]["steps"]] == [tail] * len(whole["result"]["steps"])
    return f"{len(seen)} tasks in {len(sizes)} pages of {[s // KiB for s in sizes]} KiB"


async def make_huge_tasks(lab: DeployLab, tail: str) -> tuple[list[str], list[str], str]:
    """The submitter's tasks (as the operator user) and the big one's report (through the host's account):
    every task, the three with large metadata, and the big one."""
    nc, prefix = lab.operator, lab.prefix
    nowhere = {"labels": {"nowhere": "x"}}
    refused = await nc.request(
        api(prefix, "tasks.submit"),
        json.dumps({"plan": {"steps": [{"name": "a", "action": "sleep", "args": {"seconds": 1}}]},
                    "metadata": {"blob": "m" * 400 * KiB}}).encode(),
        timeout=5,
    )  # fmt: skip
    assert (refused.headers or {}).get("Nats-Service-Error-Code") == "400", "400 KiB of metadata is refused"
    assert json.loads(refused.data)["error"]["details"]["errors"][0]["path"] == "metadata"
    big_metadata = {"blob": "m" * 60 * KiB}  # the most a request may bring is 64 KiB
    heavy = [await submit(nc, prefix, metadata=big_metadata, selector=nowhere) for _ in range(3)]
    plan = {"steps": [{"name": "run", "action": "shell", "args": {"command": "echo " + "p" * 300 * KiB}}]}
    planned = [await submit(nc, prefix, plan=plan, selector=nowhere) for _ in range(5)]

    host = await lab.host("reporter")
    await host.register("reporter-d1")
    metadata = {"blob": "n" * 60 * KiB}
    big = await submit(nc, prefix, metadata=metadata, plan=plan, selector={"device_id": "reporter-d1"})
    assigned = await host.next_assignment(timeout=20)
    await host.claim(assigned)
    result = {
        "steps": [{"name": s["name"], "status": "done", "output_tail": tail} for s in assigned.body["plan"]["steps"]]
    }
    await host.report(assigned, result=result)
    return [*heavy, *planned, big], heavy, big


async def test_huge_tasks_leave_every_listing_answered(secured: SecuredNats, database_url: str, tmp_path: Path) -> None:
    async with deploy_lab(secured, database_url, tmp_path / "scheduler.log") as lab:
        steady = await lab.host("steady")
        await steady.register("steady-d1")
        steady_task = await submit(lab.operator, lab.prefix, selector={"device_id": "steady-d1"}, lease_ttl_s=TTL_S)
        steady_assigned = await steady.next_assignment(timeout=20)
        await steady.claim(steady_assigned)
        done = asyncio.Event()
        renewing = asyncio.create_task(renew_until(steady, steady_assigned.lease, TTL_S, done.is_set))
        try:
            tail = "\x01" * 64 * KiB  # the longest tail: 384 KiB in JSON
            tasks, heavy, big = await make_huge_tasks(lab, tail)
            tasks.append(steady_task)
            for role in ("web", "operator"):  # the dashboard's user, the CLI's
                reader = await lab.connect(role)
                print(f"\ntasks.list as {role}:", await read_everything(reader, lab.prefix, tasks, heavy, big, tail))
        finally:
            done.set()
        print((await renewing).assert_unaffected("steady host"))
        for host_id in ("reporter", "steady"):
            assert lab.violations(host_id) == [], f"{host_id} sent only what its account allows"
