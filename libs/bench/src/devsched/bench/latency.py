"""Single no-op task latency on an idle system: from the submit's reply to the arrival of its `done` event.

One agent with one device; tasks one at a time, a short pause between them. Each event's arrival is
kept too (assigned, dispatched, done), so the figure comes with where the time goes.
"""

from __future__ import annotations

import asyncio
import time

from devsched.bench.context import NOOP_PLAN, Context
from devsched.bench.figures import Figure, value_at_most
from devsched.bench.probes import Distribution

#: Tasks run before the measured ones (first connections, first plans).
WARMUP_TASKS = 2
#: Pause between two tasks: each finds the system idle.
PAUSE_S = 0.2


async def latency_phase(ctx: Context) -> None:
    """Adds the single-task latency figure."""
    host_id, labels = "bench-latency", {"bench": "latency"}
    count = ctx.sizes.latency_tasks
    ctx.say(f"latency: {count} single no-op tasks on an idle system, one at a time")
    ctx.stack.start_agent(host_id, 1, labels)
    stages: dict[str, list[float]] = {"assigned": [], "dispatched": [], "done": []}
    totals: list[float] = []
    try:
        await ctx.wait_host(host_id, 1)
        for i in range(WARMUP_TASKS + count):
            await asyncio.sleep(PAUSE_S)
            watch = ctx.events.watch()
            reply = await ctx.client.submit(NOOP_PLAN, selector=labels)
            replied = time.perf_counter()
            task_id = str(reply.task_id)
            watch.add([task_id])
            await watch.wait(30, "single task")
            ctx.events.forget(watch)
            arrived = watch.arrived.get(task_id, {})
            if i < WARMUP_TASKS:
                continue
            totals.append((arrived[str(watch.final[task_id]["event"])] - replied) * 1000)
            for stage, values in stages.items():
                if stage in arrived:
                    values.append((arrived[stage] - replied) * 1000)
    finally:
        ctx.stack.stop_agent(host_id)
    dist = Distribution.of(totals)
    ctx.samples["single task: submit reply to done"] = totals
    ctx.details["latency"] = {
        "tasks": count,
        "submit_reply_to_done": dist.as_dict(),
        "event_arrival_after_submit_reply_p50_ms": {
            stage: round(Distribution.of(values).p50_ms, 3) for stage, values in stages.items()
        },
    }
    ctx.figures.append(
        Figure("latency.single_task_p50_ms", "single task, submit reply to done, p50", "ms", dist.p50_ms,
               goal=value_at_most(20.0), note=f"p90 {dist.p90_ms:.1f} ms, max {dist.max_ms:.1f} ms"),
    )  # fmt: skip
    ctx.say(f"  p50 {dist.p50_ms:.1f} ms, p90 {dist.p90_ms:.1f} ms")
