"""Fair share per host: a host that floods the scheduler cannot cost another host its lease.

The real scheduler process runs with its default per-host bounds. Host A, in a process of its own, floods
renewals of its (real, claimed) lease as fast as it can send them, bounded in count and time, never waiting
for answers. Meanwhile host B renews its own lease the ordinary way. B loses no renewal and its p99 stays
under a third of its ttl (the margin an agent keeps: it renews at ttl/3); A is answered 429
`too_many_requests` with `details.retry_after_s`.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
from nats.aio.client import Client as NatsClient

from support.scheduler_harness import TestHost, call, delete_streams, scheduler_process, service_env, submit

pytestmark = [pytest.mark.security, pytest.mark.e2e]

#: Host B's lease: renewed every RENEW_EVERY_S, so it may wait at most TTL_S / 3 for an answer.
TTL_S = 3
RENEW_EVERY_S = 0.1
#: The flood: FLOOD_RATE renewals a second for FLOOD_S seconds, open loop (never waiting for an answer):
#: several times what the scheduler can renew on this machine, and 20 times a host's default share (200/s).
FLOOD_S = 5.0
FLOOD_RATE = 4_000

#: Empty: the scheduler's defaults are what is tested. (Set huge bounds here to watch the test fail.)
SHARE_OVERRIDES: dict[str, object] = {}

_FLOOD = """
import asyncio, json, sys, time, nats
url, subject, body, host, seconds, rate = sys.argv[1:7]
seconds, rate = float(seconds), int(rate)
async def main():
    nc = await nats.connect(url, inbox_prefix="_INBOX." + host, pending_size=64 * 1024 * 1024)
    counts = {"ok": 0, "too_many_requests": 0, "other": 0}
    retry_after = []
    async def on_reply(msg):
        code = (msg.headers or {}).get("Nats-Service-Error-Code")
        if code is None:
            counts["ok"] += 1
        elif code == "429":
            counts["too_many_requests"] += 1
            retry_after.append(json.loads(msg.data)["error"]["details"]["retry_after_s"])
        else:
            counts["other"] += 1
    await nc.subscribe("_INBOX." + host + ".flood.>", cb=on_reply)
    await nc.flush(); await nc.flush()
    print("ready", flush=True)
    sys.stdin.readline()
    payload = body.encode()
    sent, started = 0, time.monotonic()
    while (elapsed := time.monotonic() - started) < seconds:
        while sent < rate * elapsed:
            await nc.publish(subject, payload, reply=f"_INBOX.{host}.flood.{sent}")
            sent += 1
        await asyncio.sleep(0.005)  # let the client write; the flood never waits for answers
    await nc.flush()
    await asyncio.sleep(1.0)  # answers still on their way
    print(json.dumps({"sent": sent, "seconds": time.monotonic() - started, "counts": counts,
                      "retry_after_s": sorted(retry_after)[:1] + sorted(retry_after)[-1:]}), flush=True)
    await nc.close()
asyncio.run(main())
"""


def _start_flood(nats_url: str, flooder: TestHost, lease: str) -> subprocess.Popen[str]:
    args = [nats_url, flooder.subject("renew"), lease, flooder.host_id, str(FLOOD_S), str(FLOOD_RATE)]
    return subprocess.Popen(
        [sys.executable, "-c", _FLOOD, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


async def claimed_lease(nc: NatsClient, prefix: str, host: TestHost, ttl_s: int) -> dict[str, object]:
    await host.register(f"{host.host_id}-d1")
    await submit(nc, prefix, selector={"device_id": f"{host.host_id}-d1"}, lease_ttl_s=ttl_s)
    assigned = await host.next_assignment(timeout=20)
    await host.claim(assigned)
    return assigned.lease


async def test_a_flooding_host_costs_another_host_no_lease(
    database_url: str, nats_url: str, subject_prefix: str, nc: NatsClient, tmp_path: Path
) -> None:
    env = service_env(database_url, nats_url, subject_prefix, db_pool_size=10, **SHARE_OVERRIDES)
    scheduler = scheduler_process(env, tmp_path / "scheduler.log").start()
    flood: subprocess.Popen[str] | None = None
    hosts: list[TestHost] = []
    try:
        await scheduler.wait_logged("serving")
        flooder, steady = TestHost(nc, subject_prefix, "flooder"), TestHost(nc, subject_prefix, "steady")
        hosts += [flooder, steady]
        flood_lease = await claimed_lease(nc, subject_prefix, flooder, ttl_s=3600)
        lease = await claimed_lease(nc, subject_prefix, steady, ttl_s=TTL_S)

        flood = _start_flood(nats_url, flooder, json.dumps(flood_lease))
        assert flood.stdin is not None
        assert flood.stdout is not None
        assert (await asyncio.to_thread(flood.stdout.readline)).strip() == "ready"
        flood.stdin.write("go\n")
        flood.stdin.flush()

        latencies: list[float] = []
        failures: list[str] = []
        deadline = time.monotonic() + FLOOD_S
        while time.monotonic() < deadline:
            started = time.monotonic()
            try:
                await call(nc, steady.subject("renew"), lease, timeout=TTL_S)
            except Exception as exc:  # a 409, a 429 or no answer within the ttl: the lease is at risk
                failures.append(repr(exc))
            latencies.append(time.monotonic() - started)
            await asyncio.sleep(max(0.0, RENEW_EVERY_S - (time.monotonic() - started)))

        summary = json.loads(await asyncio.wait_for(asyncio.to_thread(flood.stdout.readline), timeout=30))
        assert failures == [], f"{failures[:5]}... flood {summary}"
        p99 = statistics.quantiles(latencies, n=100)[98]
        assert p99 < TTL_S / 3, f"steady host's renewal p99 {p99:.3f} s, flood {summary}"
        assert summary["sent"] >= FLOOD_RATE * FLOOD_S * 0.9, f"the flood was no flood: {summary}"
        counts = summary["counts"]
        assert counts["too_many_requests"] > 0, summary
        assert counts["other"] == 0, summary
        low, high = summary["retry_after_s"]
        assert 0 < low <= high <= 5, summary
        # `nats micro stats` counts every 429 as an error of the endpoint (issue 14)
        reply = await nc.request(f"$SRV.STATS.{subject_prefix}-scheduler", b"", timeout=5)
        renew = next(e for e in json.loads(reply.data)["endpoints"] if e["name"] == "host-renew")
        assert renew["num_errors"] >= counts["too_many_requests"], (renew, counts)
        assert renew["last_error"].startswith("429:too_many_requests "), renew
        print(
            f"\nflood: {summary['sent']} renewals in {summary['seconds']:.1f} s, answers {counts}; "
            f"steady host: {len(latencies)} renewals, p50 {statistics.median(latencies) * 1000:.1f} ms, "
            f"p99 {p99 * 1000:.1f} ms, max {max(latencies) * 1000:.1f} ms"
        )
    finally:
        if flood is not None and flood.poll() is None:
            flood.kill()
        if flood is not None:
            flood.wait(timeout=10)
            for pipe in (flood.stdin, flood.stdout):
                if pipe is not None:
                    pipe.close()
        for host in hosts:
            await host.close()
        scheduler.kill()
        await delete_streams(nc, subject_prefix)
