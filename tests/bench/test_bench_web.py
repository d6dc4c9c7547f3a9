"""Benchmark of devsched-web's page render time with 1,000 devices and 10,000 tasks in the lab.

Run on demand: `./dev test tests/bench/test_bench_web.py -m bench -s`. The real scheduler (with the test
stack's agent) gets 50 protocol-only hosts of 20 devices each (registered, then heartbeating) and 10,000
submitted tasks (about 1,000 of them assigned to those devices, the rest queued); the dashboard runs as a
process. Each page is fetched repeatedly over loopback HTTP and the median and p95 of the whole request
are printed (and written to `web-bench.json` in the test's directory). It asserts nothing about speed:
numbers from a shared machine are for reading, not for gating.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import nats
import pytest

from devsched.client import Client, Unavailable
from support.devsched_stack import Stack
from support.polling import eventually
from support.scheduler_harness import TestHost
from support.web_harness import Web, web_process

pytestmark = [pytest.mark.bench, pytest.mark.timeout(1200)]  # seeding 10,000 tasks takes minutes on a loaded machine

HOSTS, DEVICES_PER_HOST, TASKS = 50, 20, 10_000
ROUNDS = 20


@pytest.fixture(scope="module")
def web(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Web]:
    with web_process(stack, tmp_path_factory.mktemp("web-bench"), web_refresh_s="2") as w:
        yield w


async def test_page_render_time_with_1000_devices_and_10000_tasks(web: Web, stack: Stack, tmp_path: Path) -> None:
    nc = await nats.connect(stack.nats_url)
    hosts = [TestHost(nc, stack.prefix, f"bench-{i:02d}") for i in range(HOSTS)]
    for host in hosts:
        await host.register(*((f"{host.host_id}-d{j:02d}", {"platform": "bench", "rack": host.host_id[-1]})
                              for j in range(DEVICES_PER_HOST)), bind=False)  # fmt: skip

    async def heartbeats() -> None:
        while True:
            await asyncio.gather(*(h.request("heartbeat") for h in hosts))
            await asyncio.sleep(1.0)

    beating = asyncio.create_task(heartbeats())
    try:
        async with Client.connect(stack.nats_url, prefix=stack.prefix, timeout=30) as client:
            gate = asyncio.Semaphore(8)

            async def submit(i: int) -> str:
                async with gate:
                    while True:
                        try:
                            reply = await client.submit(
                                {"steps": [{"name": "run", "action": "noop"}]}, name=f"bench-{i}",
                                selector={"platform": "bench"}, priority=i % 7, idempotency_key=f"bench-{i}",
                            )  # fmt: skip
                            return str(reply.task_id)
                        except Unavailable:  # the test database's small pool under a burst: try again
                            await asyncio.sleep(0.05)

            started = time.monotonic()
            task_ids = await asyncio.gather(*(submit(i) for i in range(TASKS)))
            print(f"\nseeded {TASKS} tasks in {time.monotonic() - started:.1f} s")
            total = sum(len(h.devices) for h in await client.hosts())
            assert total >= HOSTS * DEVICES_PER_HOST

        results: dict[str, dict[str, float]] = {}
        async with httpx.AsyncClient(base_url=web.url, timeout=60) as http:

            async def sampled() -> bool:
                html = (await http.get("/queue")).text
                return "queued <strong" in html and f">{TASKS}<" not in html  # some assigned by now

            await eventually(sampled, timeout=120, interval=1.0, message="the dashboard sampled the seeded lab")
            pages = {
                "lab": "/lab",
                "lab filtered": "/lab?label=rack=3",
                "queue": "/queue",
                "charts": "/charts",
                "task": f"/tasks/{task_ids[0]}",
                "device": f"/devices/{hosts[0].host_id}-d00",
            }
            for name, path in pages.items():
                times = []
                size = 0
                for _ in range(ROUNDS):
                    t0 = time.perf_counter()
                    reply = await http.get(path)
                    times.append((time.perf_counter() - t0) * 1000)
                    assert reply.status_code == 200, (path, reply.text[:300])
                    size = len(reply.content)
                times.sort()
                results[name] = {
                    "median_ms": round(statistics.median(times), 1),
                    "p95_ms": round(times[int(0.95 * (len(times) - 1))], 1),
                    "max_ms": round(times[-1], 1),
                    "bytes": size,
                }
        print(json.dumps(results, indent=2))
        (tmp_path / "web-bench.json").write_text(json.dumps(results, indent=2))
    finally:
        beating.cancel()
        await nc.close()
