"""A submitter's huge tasks cannot make the listings go silent for everyone else.

The real scheduler process. A submitter's 400 KiB of metadata is refused (a request's metadata is bounded);
it makes three tasks with 60 KiB of metadata each, five with 300 KiB plans, and one whose host reports a
384 KiB output tail on top of a 300 KiB plan and 60 KiB of metadata: before replies were
bounded, the page holding them was larger than NATS's 1 MiB `max_payload`, no reply went out, and every
`tasks.list` (the CLI's `ls`, the dashboard) timed out; the big task could not be read at all. Another
client, on a connection of its own, lists every task (paged by bytes, the large metadata cut and flagged,
each page under `max_payload`), reads the big task (trimmed, with `truncated` naming what was cut), and
reads the cut field whole when it asks for it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client as NatsClient

from support.scheduler_harness import TestHost, api, delete_streams, scheduler_process, service_env, submit

pytestmark = [pytest.mark.security, pytest.mark.e2e]

KiB = 1024
REPLY_LIMIT_SLACK = 8 * KiB


async def ask(nc: NatsClient, subject: str, body: dict[str, Any]) -> tuple[dict[str, Any], int, float]:
    """The reply (an error reply fails the test), its size, and how long it took."""
    started = time.monotonic()
    msg = await nc.request(subject, json.dumps(body).encode(), timeout=5)
    elapsed = time.monotonic() - started
    assert not (msg.headers or {}).get("Nats-Service-Error-Code"), msg.data[:300]
    return json.loads(msg.data), len(msg.data), elapsed


async def test_huge_tasks_leave_every_listing_answered(
    database_url: str, nats_url: str, subject_prefix: str, nc: NatsClient, tmp_path: Path
) -> None:
    env = service_env(database_url, nats_url, subject_prefix)
    scheduler = scheduler_process(env, tmp_path / "scheduler.log").start()
    reader: NatsClient | None = None
    host: TestHost | None = None
    try:
        await scheduler.wait_logged("serving")
        nowhere = {"labels": {"nowhere": "x"}}
        refused = await nc.request(
            api(subject_prefix, "tasks.submit"),
            json.dumps({"plan": {"steps": [{"name": "a", "action": "sleep", "args": {"seconds": 1}}]},
                        "metadata": {"blob": "m" * 400 * KiB}}).encode(),
            timeout=5,
        )  # fmt: skip
        assert (refused.headers or {}).get("Nats-Service-Error-Code") == "400", "400 KiB of metadata is refused"
        assert json.loads(refused.data)["error"]["details"]["errors"][0]["path"] == "metadata"
        big_metadata = {"blob": "m" * 60 * KiB}  # the most a request may bring is 64 KiB
        heavy = [await submit(nc, subject_prefix, metadata=big_metadata, selector=nowhere) for _ in range(3)]
        plan = {"steps": [{"name": "run", "action": "shell", "args": {"command": "echo " + "p" * 300 * KiB}}]}
        planned = [await submit(nc, subject_prefix, plan=plan, selector=nowhere) for _ in range(5)]

        host = TestHost(nc, subject_prefix, "reporter")
        await host.register("reporter-d1")
        metadata = {"blob": "n" * 60 * KiB}
        big = await submit(nc, subject_prefix, metadata=metadata, plan=plan, selector={"device_id": "reporter-d1"})
        assigned = await host.next_assignment(timeout=20)
        await host.claim(assigned)
        tail = "\x01" * 64 * KiB  # the longest tail: 384 KiB in JSON
        result = {
            "steps": [
                {"name": s["name"], "status": "done", "output_tail": tail} for s in assigned.body["plan"]["steps"]
            ]
        }
        await host.report(assigned, result=result)

        # Another client, its own connection.
        reader = await nats.connect(nats_url, connect_timeout=2)
        limit = reader.max_payload - REPLY_LIMIT_SLACK
        seen: list[dict[str, Any]] = []
        sizes: list[int] = []
        after = None
        for _ in range(50):
            page, size, elapsed = await ask(reader, api(subject_prefix, "tasks.list"), {"limit": 100, "after": after})
            assert elapsed < 3, f"a page took {elapsed:.1f} s"
            seen += page["tasks"]
            sizes.append(size)
            after = page["next"]
            if after is None:
                break
        ids = [t["task_id"] for t in seen]
        assert sorted(ids) == sorted([*heavy, *planned, big]), "every task, once"
        assert len(ids) == len(set(ids))
        assert max(sizes) <= limit, sizes
        assert len(sizes) >= 2, f"5 plans of 300 KiB do not fit one page: {sizes}"
        by_id = {t["task_id"]: t for t in seen}
        for task_id in [*heavy, big]:
            assert by_id[task_id]["metadata"] == {}
            assert "metadata" in by_id[task_id]["truncated"]
        assert "result" in by_id[big]["truncated"]

        view, size, _ = await ask(reader, api(subject_prefix, "tasks.get"), {"task_id": big})
        assert size <= limit
        assert view["status"] == "done"
        assert view["truncated"], "the view says what it cut"
        for field in view["truncated"]:
            whole, size, _ = await ask(reader, api(subject_prefix, "tasks.get"), {"task_id": big, "full": [field]})
            assert size <= limit
            assert field not in whole.get("truncated", [])
        whole, _, _ = await ask(reader, api(subject_prefix, "tasks.get"), {"task_id": big, "full": ["result"]})
        assert [s["output_tail"] for s in whole["result"]["steps"]] == [tail] * len(result["steps"])
        print(f"\ntasks.list: {len(seen)} tasks in {len(sizes)} pages of {[s // KiB for s in sizes]} KiB")
    finally:
        if reader is not None:
            await reader.close()
        if host is not None:
            await host.close()
        scheduler.kill()
        await delete_streams(nc, subject_prefix)
