"""Output rate per host: a host writing records as fast as NATS takes them has its logs stream closed.

Two real scheduler processes (replicas) run the output rate warden with a small share: 100 records (and
1 MiB) a second, averaged over 2 s, a 3 s cool-down, streams read every 0.25 s. Host A publishes small
well-formed records into its own log subject as fast as it can (64 in flight, from a process of its own)
for 7 s; meanwhile host B renews its lease every 0.1 s and writes 256 KiB of output. A's stream is closed
within a bounded time, its publishes then refused by JetStream (503, "maximum messages exceeded"); B's output
reads back in full, B's renewals keep their p99 under a third of the ttl, B's stream is never closed; after the
cool-down A writes again, and once A is quiet its stream stays open (the replicas do not close it again for
what was paid for). `hosts.list` shows A's logs closed while they are, and never B's. Run with the warden
off (`host_log_rate_interval_s` 0), the test fails: nothing refuses A.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from nats.aio.client import Client as NatsClient

from devsched.client.logs import LogReader, collect_output
from devsched.protocol import messages as m
from devsched.protocol.codec import decode
from devsched.protocol.subjects import MSG_ID_HEADER, Subjects, log_msg_id
from devsched.scheduler.jetstream import CLOSED_UNTIL
from support.log_flood import output_record
from support.polling import eventually
from support.scheduler_harness import (
    TestHost,
    api,
    call,
    delete_streams,
    get_task,
    scheduler_process,
    service_env,
    submit,
)

pytestmark = [pytest.mark.security, pytest.mark.e2e]

TESTS = Path(__file__).resolve().parents[1]

KiB = 1024
MiB = 1024 * KiB
WINDOW_S = 2.0
COOLDOWN_S = 3.0
INTERVAL_S = 0.25
RECORDS_PER_S = 100
RATE: dict[str, object] = {
    "host_log_records_per_s": RECORDS_PER_S,
    "host_log_bytes_per_s": MiB,
    "host_log_rate_window_s": WINDOW_S,
    "host_log_cooldown_s": COOLDOWN_S,
    "host_log_rate_interval_s": INTERVAL_S,
    "max_hosts": 4,
    "logs_max_bytes": 4 * 4 * MiB,
    "uploads_max_bytes": 4 * MiB,
    "artifact_max_file_bytes": 512 * KiB,
    "events_max_bytes": 16 * MiB,
    "artifacts_max_bytes": 16 * MiB,
}
FLOOD_S = 7.0
IN_FLIGHT = 64
TTL_S = 3
RENEW_EVERY_S = 0.1
#: A's records (small: the cost the bound is about is a stored message, whatever its size) and B's.
FLOOD_RECORD = 512
HONEST_RECORD = 4 * KiB
#: How soon after the flooder goes past its share its stream must refuse it: a few readings of the warden.
CLOSED_WITHIN_S = 1.5


async def claimed_lease(operator: NatsClient, prefix: str, host: TestHost) -> dict[str, Any]:
    await host.register(f"{host.host_id}-d1")
    await submit(operator, prefix, selector={"device_id": f"{host.host_id}-d1"}, lease_ttl_s=TTL_S * 20)
    assigned = await host.next_assignment(timeout=20)
    await host.claim(assigned)
    return dict(assigned.lease)


async def flood_process(nats_url: str, host: TestHost, lease: dict[str, Any], seconds: float) -> dict[str, Any]:
    """Host A's flood, run as a process of its own (`support.log_flood`): when each publish was stored or refused."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "support.log_flood",
        *("--nats-url", nats_url, "--prefix", host.prefix, "--host-id", host.host_id),
        *("--task-id", lease["task_id"], "--lease-id", lease["lease_id"], "--seconds", str(seconds)),
        *("--in-flight", str(IN_FLIGHT), "--record-bytes", str(FLOOD_RECORD)),
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])},
    )
    try:
        out, _ = await asyncio.wait_for(process.communicate(), timeout=seconds + 30)
    finally:
        if process.returncode is None:
            process.kill()
    assert process.returncode == 0, f"the flood process exited {process.returncode}"
    result: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    assert result["other_errors"] == [], "the flood's publishes were stored or refused at the stream's limit"
    return result


async def honest_output(host: TestHost, lease: dict[str, Any], total: int, acks: list[float]) -> bytes:
    """`total` bytes of B's output, acked one record at a time, paced over about 3 s; each ack's time in `acks`."""
    task_id = uuid.UUID(lease["task_id"])
    subject = Subjects(host.prefix).host_log(host.host_id, task_id, 1)
    written = []
    for seq in range(1, total // HONEST_RECORD + 1):
        data = f"b{seq:07d}".ljust(HONEST_RECORD - 1, "b") + "\n"
        headers = {MSG_ID_HEADER: log_msg_id(lease["lease_id"], seq)}
        started = time.monotonic()
        await host.js.publish(subject, output_record(task_id, seq, data), headers=headers)
        acks.append(time.monotonic() - started)
        written.append(data.encode())
        await asyncio.sleep(0.05)
    return b"".join(written)


async def renewals_during(host: TestHost, lease: dict[str, Any], busy: asyncio.Future[Any]) -> list[float]:
    latencies: list[float] = []
    while not busy.done() or len(latencies) < 10:
        started = time.monotonic()
        await call(host.nc, host.subject("renew"), lease, timeout=TTL_S)
        latencies.append(time.monotonic() - started)
        await asyncio.sleep(max(0.0, RENEW_EVERY_S - (time.monotonic() - started)))
    return latencies


async def closed_hosts_seen(nc: NatsClient, prefix: str, busy: asyncio.Future[Any]) -> set[str]:
    """The hosts `hosts.list` showed with their logs closed, at any moment while `busy` runs."""
    seen: set[str] = set()
    while not busy.done():
        listed = await call(nc, api(prefix, "hosts.list"), {})
        seen |= {h["host_id"] for h in listed["hosts"] if h.get("logs_closed_until") is not None}
        await asyncio.sleep(INTERVAL_S)
    return seen


async def test_a_host_writing_records_past_its_rate_share_is_refused_and_costs_another_host_nothing(
    database_url: str, nats_url: str, subject_prefix: str, nc: NatsClient, tmp_path: Path
) -> None:
    env = service_env(database_url, nats_url, subject_prefix, **RATE)
    replicas = [scheduler_process(env, tmp_path / f"scheduler-{n}.log").start() for n in (1, 2)]
    subjects = Subjects(subject_prefix)
    js = nc.jetstream()
    flooder, honest = TestHost(nc, subject_prefix, "flooder"), TestHost(nc, subject_prefix, "honest")
    try:
        for replica in replicas:
            await replica.wait_logged("serving")
        flood_lease = await claimed_lease(nc, subject_prefix, flooder)
        lease = await claimed_lease(nc, subject_prefix, honest)

        flooding = asyncio.ensure_future(flood_process(nats_url, flooder, flood_lease, FLOOD_S))
        acks: list[float] = []
        output = asyncio.ensure_future(honest_output(honest, lease, 256 * KiB, acks))
        busy = asyncio.gather(flooding, output)
        listing = asyncio.ensure_future(closed_hosts_seen(nc, subject_prefix, busy))
        latencies = await renewals_during(honest, lease, busy)
        assert await listing == {flooder.host_id}, "hosts.list shows the flooder's logs closed, and only its"
        expected = await output
        flood = await flooding
        started, stored, refused = flood["started"], flood["stored"], flood["refused"]

        # A: refused within a bounded time, and written again after the cool-down
        assert refused, "the flooder's publishes were never refused"
        closed_after = refused[0] - started
        # bounded from the moment it went past its share (however fast this machine let it write)
        over_at = sorted(stored)[int(RECORDS_PER_S * WINDOW_S)]
        late = refused[0] - over_at
        assert late < CLOSED_WITHIN_S, f"refused only {late:.2f} s after it went past its share"
        assert any(t > refused[0] + COOLDOWN_S - 0.5 for t in stored), "stored again after the cool-down"
        before = sum(1 for t in stored if t < refused[0])

        # B: its output in full, its renewals fast, its stream never closed
        p99 = statistics.quantiles(latencies, n=100)[98]
        assert p99 < TTL_S / 3, f"the honest host's renewal p99 {p99:.3f} s during the flood"

        async def probe() -> m.TaskView:
            return decode(m.TaskView, json.dumps(await get_task(nc, subject_prefix, lease["task_id"])).encode())

        reader = LogReader(js, subjects, uuid.UUID(lease["task_id"]), probe, attempt=1)
        assert await collect_output(reader) == expected, "the honest host's 256 KiB read back in full"
        lines = [line for replica in replicas for line in replica.log_lines()]
        closings = [line for line in lines if "over its rate share" in str(line.get("msg"))]
        assert closings, "a replica logged the closing"
        assert {line.get("host_id") for line in closings} == {flooder.host_id}, "only the flooder's stream"
        assert all("aaaa" not in json.dumps(line) for line in closings), "no record content in a log line"

        # Once A is quiet, its stream opens after the cool-down and stays open: no replica closes it again.
        stream = subjects.host_logs_stream(flooder.host_id)

        async def open_again() -> bool:
            return CLOSED_UNTIL not in ((await js.stream_info(stream)).config.metadata or {})

        await eventually(open_again, timeout=COOLDOWN_S + 5, message="the flooder's stream opens after its cool-down")
        last = await flood_process(nats_url, flooder, flood_lease, 0.05)
        assert last["stored"], "the flooder writes again"
        quiet_until = time.monotonic() + 2 * WINDOW_S
        while time.monotonic() < quiet_until:
            assert await open_again(), "a quiet host's stream stays open"
            await asyncio.sleep(INTERVAL_S)
        print(
            f"\nrate flood: {len(stored) + len(refused)} publishes in {FLOOD_S:.0f} s, "
            f"{len(stored)} stored ({before} before the first refusal, "
            f"{before / closed_after:.0f}/s), {len(refused)} refused; refused {closed_after:.2f} s into the flood, "
            f"{late:.2f} s after it went past its share; "
            f"{len(closings)} closing log line(s) over 2 replicas; honest host: {len(latencies)} renewals, "
            f"p50 {statistics.median(latencies) * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms; its log records' acks "
            f"p50 {statistics.median(acks) * 1000:.1f} ms, p99 {statistics.quantiles(acks, n=100)[98] * 1000:.1f} ms"
        )
    finally:
        for host in (flooder, honest):
            await host.close()
        for replica in replicas:
            replica.kill()
        await delete_streams(nc, subject_prefix)
