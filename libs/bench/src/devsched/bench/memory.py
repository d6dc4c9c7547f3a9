"""The scheduler's memory with a shallow and with a deep queue, and its API's latency at both depths.

A fresh scheduler process (so that the earlier phases' allocations do not count); queued tasks that match
one drained device (every device busy: the common state of a deep queue); at each depth the scheduler
is woken a few times (assignment passes) and asked to list, get and submit, then its RSS and peak RSS
(VmHWM) are read from /proc.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from devsched.bench.context import NOOP_PLAN, Context
from devsched.bench.figures import Figure, at_most, value_at_most
from devsched.bench.hosts import BenchHost
from devsched.bench.probes import memory_kib
from devsched.bench.seeding import copy_task
from devsched.bench.servers import DATABASE, PREFIX
from devsched.protocol.codec import encode
from devsched.protocol.wake import Wake

#: RSS a scheduler may use at any depth (MB), and how much more at the deep queue than at the shallow one.
RSS_LIMIT_MB = 150.0
FLAT = 1.2


async def _timed(calls: int, call: Callable[[], Awaitable[object]]) -> float:
    """Median milliseconds of `calls` calls."""
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        await call()
        times.append((time.perf_counter() - started) * 1000)
    return statistics.median(times)


async def _exercise(ctx: Context, task_id: str, labels: dict[str, str]) -> dict[str, float]:
    client = ctx.client
    for _ in range(3):  # assignment passes over the queue
        await ctx.nc.publish(ctx.subjects.internal_wake, encode(Wake(released=0)))
        await asyncio.sleep(0.3)
    return {
        "list_100_queued_ms": await _timed(5, lambda: client.list_page(status="queued", limit=100)),
        "get_queued_ms": await _timed(5, lambda: client.get(task_id)),
        "submit_ms": await _timed(10, lambda: client.submit(NOOP_PLAN, selector=labels)),
        "hosts_ms": await _timed(3, client.hosts),
    }


async def memory_phase(ctx: Context) -> None:
    """Adds the memory figures."""
    shallow, deep = ctx.sizes.queued
    ctx.say(f"memory: a fresh scheduler with {shallow} and then {deep} queued tasks")
    stack = ctx.stack
    stack.start_scheduler()
    await ctx.wait_scheduler()
    labels = {"bench": "memory"}
    host = BenchHost(stack.nats_url, PREFIX, "bench-m")
    await host.connect()
    readings: dict[int, dict[str, Any]] = {}
    try:
        await host.register([("bench-m-d1", labels)])
        await ctx.client.drain("bench-m-d1", reason="bench: every device busy")
        template = str((await ctx.client.submit(NOOP_PLAN, selector=labels)).task_id)
        queued, last = 1, template
        for depth in (shallow, deep):
            copies = await copy_task(stack.admin_dsn(DATABASE), template, depth - queued)
            queued, last = depth, (copies[-1] if copies else last)
            timings = await _exercise(ctx, last, labels)
            await asyncio.sleep(1.0)
            pid = stack.pids()["scheduler"]
            assert pid is not None
            kib = memory_kib(pid)
            readings[depth] = {"rss_mb": kib["VmRSS"] / 1024, "peak_mb": kib["VmHWM"] / 1024, **timings}
            ctx.say(f"  {depth} queued: RSS {kib['VmRSS'] / 1024:.0f} MB (peak {kib['VmHWM'] / 1024:.0f} MB)")
    finally:
        await host.register([])
        await host.close()
    small, large = readings[shallow], readings[deep]
    ctx.details["memory"] = {str(depth): {k: round(v, 3) for k, v in r.items()} for depth, r in readings.items()}
    at = f"at {shallow} queued"
    ctx.figures += [
        Figure("memory.rss_mb_shallow", f"scheduler RSS, {shallow} queued", "MB", small["rss_mb"],
               goal=value_at_most(RSS_LIMIT_MB), note=f"peak {small['peak_mb']:.0f} MB"),
        Figure("memory.rss_mb_deep", f"scheduler RSS, {deep} queued", "MB", large["rss_mb"],
               goal=value_at_most(RSS_LIMIT_MB), note=f"peak {large['peak_mb']:.0f} MB"),
        Figure("memory.rss_growth", f"scheduler RSS, {deep} beside {shallow} queued (flat)", "MB",
               large["rss_mb"], small["rss_mb"], f"RSS {at}", at_most(FLAT)),
        Figure("memory.get_ms", f"tasks.get of a queued task, {deep} queued", "ms", large["get_queued_ms"],
               small["get_queued_ms"], f"the same {at}"),
        Figure("memory.list_ms", f"tasks.list of 100 queued, {deep} queued", "ms", large["list_100_queued_ms"],
               small["list_100_queued_ms"], f"the same {at}"),
        Figure("memory.submit_ms", f"submit, {deep} queued", "ms", large["submit_ms"], small["submit_ms"],
               f"the same {at}"),
    ]  # fmt: skip
