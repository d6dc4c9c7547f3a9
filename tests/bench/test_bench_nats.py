"""Benchmark (not CI): lease renewals per second over NATS with 64 concurrent requesters, p50/p99 latency,
beside a bare nats-py request/reply echo measured in the same run.

    uv run pytest tests/bench/test_bench_nats.py -m bench -s

The scheduler and the echo responder each run in a process of their own, so neither shares an event loop
with the load generator. Renewals are real: 64 claimed leases, each renewed in a loop by its requester.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client as NatsClient

from support.scheduler_harness import (
    TestHost,
    call,
    check,
    delete_streams,
    scheduler_process,
    service_env,
    submit,
)

pytestmark = pytest.mark.bench

REQUESTERS = 64
WARMUP_S = 1.0
MEASURE_S = float(os.environ.get("DEVSCHED_BENCH_SECONDS", "5"))

_ECHO = """
import asyncio, sys, nats
async def main():
    nc = await nats.connect(sys.argv[1])
    async def echo(msg):
        await msg.respond(msg.data)
    await nc.subscribe(sys.argv[2], queue="echo", cb=echo)
    await nc.flush(); await nc.flush()
    print("ready", flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
"""


async def _load(one: Callable[[int], Awaitable[None]]) -> tuple[float, list[float]]:
    """Run `one(i)` in a loop in each of REQUESTERS tasks; returns (requests per second, latencies in ms)."""
    latencies: list[float] = []
    measuring = False
    stop_at = 0.0

    async def requester(i: int) -> None:
        while True:
            started = time.perf_counter()
            if measuring and started >= stop_at:
                return
            await one(i)
            if measuring:
                latencies.append((time.perf_counter() - started) * 1000)

    tasks = [asyncio.create_task(requester(i)) for i in range(REQUESTERS)]
    await asyncio.sleep(WARMUP_S)
    begun = time.perf_counter()
    stop_at = begun + MEASURE_S
    measuring = True
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - begun
    return len(latencies) / elapsed, latencies


def _summary(name: str, rps: float, latencies: list[float]) -> dict[str, float | str]:
    cuts = statistics.quantiles(latencies, n=100)
    return {"name": name, "rps": round(rps), "p50_ms": round(cuts[49], 3), "p99_ms": round(cuts[98], 3)}


async def test_renewal_round_trips_beside_a_bare_echo(
    database_url: str, nats_url: str, subject_prefix: str, nc: NatsClient, tmp_path: Path
) -> None:
    # The fair share's checks run on every request, but its bounds are lifted: 8 requesters per host on a
    # fast machine pass the default 200 requests a second per host, and a 429 is not a renewal.
    env = service_env(
        database_url,
        nats_url,
        subject_prefix,
        log_level="WARNING",
        db_pool_size=20,
        max_concurrency=128,
        host_rate_per_s=1_000_000,
        host_burst=100_000,
    )
    scheduler = scheduler_process(env, tmp_path / "scheduler.log").start()
    echo_subject = f"{subject_prefix}.bench.echo"
    echo = _start_echo(nats_url, echo_subject)
    try:
        await _wait_serving(nc, subject_prefix)  # logs are at WARNING here: no "serving" line
        assert echo.stdout is not None
        assert (await asyncio.to_thread(echo.stdout.readline)).strip() == "ready"

        hosts = [TestHost(nc, subject_prefix, f"bench-{h}") for h in range(8)]
        leases: list[dict[str, object]] = []
        for h, host in enumerate(hosts):
            await host.register(*(f"bench-{h}-d{d}" for d in range(REQUESTERS // len(hosts))))
        for _ in range(REQUESTERS):
            await submit(nc, subject_prefix, lease_ttl_s=3600)
        for host in hosts:
            for a in await host.assignments(REQUESTERS // len(hosts), timeout=30):
                await host.claim(a)
                leases.append({"host": host, "lease": a.lease})

        # One connection per host with the host's inbox prefix, as the agent has: its requests share one
        # reply subscription, and the scheduler answers them in the host's own inbox.
        host_connections = {
            host.host_id: await nats.connect(nats_url, inbox_prefix=f"_INBOX.{host.host_id}") for host in hosts
        }
        bodies = [json.dumps(lease["lease"]).encode() for lease in leases]

        async def renew(i: int) -> None:
            host = leases[i]["host"]
            assert isinstance(host, TestHost)
            check(await host_connections[host.host_id].request(host.subject("renew"), bodies[i], timeout=10))

        payload = json.dumps(leases[0]["lease"]).encode()

        async def echo_once(i: int) -> None:
            await nc.request(echo_subject, payload, timeout=10)

        echo_rps, echo_lat = await _load(echo_once)
        renew_rps, renew_lat = await _load(renew)
        results = [_summary("nats echo", echo_rps, echo_lat), _summary("renew", renew_rps, renew_lat)]
        ratio = {
            "throughput_ratio": round(echo_rps / renew_rps, 1),
            "p50_ratio": round(float(results[1]["p50_ms"]) / float(results[0]["p50_ms"]), 1),
        }
        print(f"\n{REQUESTERS} concurrent requesters, {MEASURE_S:.0f} s each after {WARMUP_S:.0f} s warm-up")
        for row in results:
            print(f"  {row['name']:<10} {row['rps']:>8} req/s   p50 {row['p50_ms']:>8} ms   p99 {row['p99_ms']:>8} ms")
        print(f"  echo/renew throughput x{ratio['throughput_ratio']}, renew/echo p50 x{ratio['p50_ratio']}")
        assert renew_rps > 0
        for host in hosts:
            await host.close()
        for connection in host_connections.values():
            await connection.close()
    finally:
        echo.kill()
        echo.wait(timeout=10)
        if echo.stdout is not None:
            echo.stdout.close()
        scheduler.kill()
        await delete_streams(nc, subject_prefix)


def _start_echo(url: str, subject: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", _ECHO, url, subject], stdout=subprocess.PIPE, text=True, start_new_session=True
    )


async def _wait_serving(nc: NatsClient, prefix: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            await call(nc, f"{prefix}.api.hosts.list", {}, timeout=1)
            return
        except Exception:
            await asyncio.sleep(0.1)
    raise AssertionError(f"no scheduler serves {prefix} after 30 s")
